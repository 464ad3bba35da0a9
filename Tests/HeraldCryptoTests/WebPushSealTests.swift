@_spi(Testing) import HeraldCrypto
import Testing

/// RFC 8291 Appendix A inputs.
enum RFC8291 {
    static let plaintext = Array("When I grow up, I want to be a watermelon".utf8)
    static let asPrivate = b64("yfWPiYE-n46HLnH0KqZOF1fJJU3MYrct3AELtAQ-oRw")
    static let asPublic = b64(
        "BP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27mlmlMoZIIgDll6e3vCYLocInmYWAmS6TlzAC8wEqKK6PBru3jl7A8")
    static let uaPublic = b64(
        "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4")
    static let uaPrivate = b64("q1dXpw3UpT5VOmu_cf_v6ih07Aems3njxI-JWgLcM94")
    static let salt = b64("DGv6ra1nlYgDCS1FRnbzlw")
    static let auth = b64("BTBZMqHH6r4Tts7J_aSIgg")
    static let body = b64(
        "DGv6ra1nlYgDCS1FRnbzlwAAEABBBP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27mlmlMoZIIgDll6e3vCYLocInmYWAmS6TlzAC8wEqKK6PBru3jl7A_yl95bQpu6cVPTpK4Mqgkf1CXztLVBSt2Ks3oZwbuwXPXLWyouBWLVWGNWQexSgSxsj_Qulcy4a-fN"
    )
}

@Suite("Web Push record sealing")
struct WebPushSealTests {
    @Test("RFC 8291 Appendix A is reproduced byte for byte")
    func rfc8291Vector() throws {
        let sub = try WebPushSubscriber(p256dh: RFC8291.uaPublic, auth: RFC8291.auth)
        let body = try WebPushSealer().sealForTesting(
            RFC8291.plaintext, for: sub, ephemeralPrivateKey: RFC8291.asPrivate,
            salt: RFC8291.salt)
        #expect(body.count == 144)
        #expect(body == RFC8291.body)
    }

    @Test("the ECDH secret of Appendix A matches from both sides")
    func ecdhBothSides() throws {
        let server = try P256PrivateKey(raw: SecretBytes(copying: RFC8291.asPrivate))
        let agent = try P256PrivateKey(raw: SecretBytes(copying: RFC8291.uaPrivate))
        #expect(server.publicKey == RFC8291.asPublic)
        let expected = b64("kyrL1jIIOHEzg3sM2ZWRHDRB62YACZhhSlknJ672kSs")
        #expect(try server.sharedSecret(with: RFC8291.uaPublic) == expected)
        #expect(try agent.sharedSecret(with: RFC8291.asPublic) == expected)
    }

    @Test(
        "a sealed body has the fixed size, rs 4096, a 65-byte keyid, and fresh keys",
        arguments: [0, 200, 2816, 4096])
    func sealedShape(bodySize: Int) throws {
        let ua = try P256PrivateKey.generate()
        let sub = try WebPushSubscriber(p256dh: ua.publicKey, auth: SecureRandom.bytes(16))
        let sealer = try WebPushSealer()
        let plaintext = Array("{\"kind\":\"notification\"}".utf8)
        let a = try sealer.seal(plaintext, for: sub, bodySize: bodySize)
        let b = try sealer.seal(plaintext, for: sub, bodySize: bodySize)
        #expect(a.count == (bodySize == 0 ? plaintext.count + 103 : bodySize))
        #expect(Array(a[16..<20]) == [0, 0, 0x10, 0])
        #expect(a[20] == 65)
        #expect(a[21] == 0x04)
        #expect(Array(a[0..<16]) != Array(b[0..<16]), "salt must differ per record")
        #expect(Array(a[21..<86]) != Array(b[21..<86]), "ephemeral key must differ per record")
        #expect(try P256.checkPublicKey(Array(a[21..<86])) == ())
    }

    @Test("the default body is 2816 bytes with room for 2713 bytes of plaintext")
    func defaultSizes() throws {
        #expect(WebPushSealer.defaultBodySize == 2816)
        #expect(WebPushSealer.maximumPlaintext(bodySize: 2816) == 2713)
        #expect(WebPushSealer.maximumPlaintext(bodySize: 0) == 3993)
        let ua = try P256PrivateKey.generate()
        let sub = try WebPushSubscriber(p256dh: ua.publicKey, auth: SecureRandom.bytes(16))
        let sealer = try WebPushSealer()
        #expect(try sealer.seal([UInt8](repeating: 1, count: 2713), for: sub).count == 2816)
        #expect(throws: CryptoError.plaintextTooLarge) {
            try sealer.seal([UInt8](repeating: 1, count: 2714), for: sub)
        }
        #expect(throws: CryptoError.bodySize) { try sealer.seal([1], for: sub, bodySize: 5000) }
        #expect(throws: CryptoError.bodySize) { try sealer.seal([1], for: sub, bodySize: 100) }
    }

    @Test("the record size is the caller's: written into the header, below 18 refused, larger than the record")
    func recordSize() throws {
        #expect(WebPushSealer.defaultRecordSize == 4096)
        let ua = try P256PrivateKey.generate()
        let sub = try WebPushSubscriber(p256dh: ua.publicKey, auth: SecureRandom.bytes(16))
        let body = try WebPushSealer(recordSize: 3000).seal([1, 2, 3], for: sub)
        #expect(Array(body[16..<20]) == [0, 0, 0x0b, 0xb8])
        #expect(throws: CryptoError.recordSize) { try WebPushSealer(recordSize: 17) }
        #expect(throws: CryptoError.recordSize) { try WebPushSealer(recordSize: -1) }
        #expect(throws: CryptoError.recordSize) { try WebPushSealer(recordSize: 1 << 32) }
        // 2816 - 86 = 2730 bytes of record: rs must exceed it.
        #expect(throws: CryptoError.recordSize) { try WebPushSealer(recordSize: 2730).seal([1], for: sub) }
        #expect(try WebPushSealer(recordSize: 2731).seal([1], for: sub).count == 2816)
    }

    @Test("subscriber keys are checked once, each cause with its own error")
    func subscriberErrors() throws {
        var offCurve = RFC8291.uaPublic
        offCurve[64] ^= 1
        var compressed = RFC8291.uaPublic
        compressed[0] = 0x02
        #expect(throws: CryptoError.publicKeyLength) {
            try WebPushSubscriber(p256dh: Array(RFC8291.uaPublic.dropLast()), auth: RFC8291.auth)
        }
        #expect(throws: CryptoError.publicKeyFormat) {
            try WebPushSubscriber(p256dh: compressed, auth: RFC8291.auth)
        }
        #expect(throws: CryptoError.publicKeyNotOnCurve) {
            try WebPushSubscriber(p256dh: offCurve, auth: RFC8291.auth)
        }
        #expect(throws: CryptoError.authLength) {
            try WebPushSubscriber(p256dh: RFC8291.uaPublic, auth: Array(RFC8291.auth.dropLast()))
        }
        #expect(throws: CryptoError.malformedBase64) {
            try WebPushSubscriber(p256dh: "not base64!", auth: "BTBZMqHH6r4Tts7J_aSIgg")
        }
        let ok = try WebPushSubscriber(
            p256dh: Base64URL.encode(RFC8291.uaPublic), auth: Base64URL.encode(RFC8291.auth))
        #expect(ok.publicKey == RFC8291.uaPublic)
    }
}
