import HeraldCrypto
import Testing

@Suite("Encoding, hashing and key derivation")
struct PrimitiveTests {
    @Test("base64url round trip and strict decoding")
    func base64url() throws {
        for n in 0..<70 {
            let bytes = (0..<n).map { UInt8(truncatingIfNeeded: $0 &* 37 &+ 11) }
            let text = Base64URL.encode(bytes)
            #expect(!text.contains("=") && !text.contains("+") && !text.contains("/"))
            #expect(try Base64URL.decode(text) == bytes)
        }
        #expect(try Base64URL.decode("AQID") == [1, 2, 3])
        #expect(try Base64URL.decode("AQI=") == [1, 2])
        for bad in ["A", "AQ=", "AQ==x", "AQ+/", "AQ I", "AQI==", "AQ\n", "*"] {
            #expect(throws: CryptoError.malformedBase64, "\(bad)") { try Base64URL.decode(bad) }
        }
    }

    @Test("SHA-256 of the empty string and of 'abc'")
    func sha256() {
        #expect(
            SHA256.hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        #expect(
            SHA256.hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
    }

    @Test("RFC 5869 test case 1 and the output limit")
    func hkdf() throws {
        let ikm = [UInt8](repeating: 0x0b, count: 22)
        let salt: [UInt8] = Array(0x00...0x0c)
        let info: [UInt8] = Array(0xf0...0xf9)
        let okm = try HKDF.derive(salt: salt, ikm: ikm, info: info, length: 42)
        #expect(
            okm.hexString
                == "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"
        )
        #expect(throws: CryptoError.hkdfLength) {
            try HKDF.derive(salt: salt, ikm: ikm, info: info, length: 255 * 32 + 1)
        }
    }

    @Test("the store key seals, opens, and refuses tampering or another context")
    func storeKey() throws {
        let key = try StoreKey.generate()
        let secret = Array("apns-token-0123456789abcdef".utf8)
        let context = Array("device:42".utf8)
        let sealed = try key.seal(secret, context: context)
        #expect(sealed.count == secret.count + 41)
        #expect(sealed[0] == 1)
        #expect(try key.open(sealed, context: context) == secret)
        #expect(try key.seal(secret, context: context) != sealed, "nonce must be fresh")
        var flipped = sealed
        flipped[30] ^= 0x80
        #expect(throws: CryptoError.decrypt) { try key.open(flipped, context: context) }
        #expect(throws: CryptoError.decrypt) { try key.open(sealed, context: Array("device:43".utf8)) }
        #expect(throws: CryptoError.sealedFormat) { try key.open(Array(sealed.prefix(40)), context: context) }
        #expect(throws: CryptoError.decrypt) { try StoreKey.generate().open(sealed, context: context) }
        #expect(try key.open(key.seal([], context: []), context: []) == [])
    }

    @Test("errors carry the core's sentence")
    func errorText() {
        #expect(CryptoError.publicKeyNotOnCurve.description == "public key is not a point on P-256")
        #expect(CryptoError.publicKeyNotOnCurve.code == -9)
        #expect(CryptoError.unknown(-999).description == "unknown error")
    }
}
