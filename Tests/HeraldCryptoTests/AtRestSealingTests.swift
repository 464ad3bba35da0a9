import Foundation
import HeraldCrypto
import HeraldTestSupport
import Testing

/// libsodium's published XChaCha20-Poly1305 (IETF) vector: test/default/aead_xchacha20poly1305.c
/// (function tv) and the first 130 bytes of its expected output, aead_xchacha20poly1305.exp
/// (github.com/jedisct1/libsodium at 7014b204b6fbd448c7b653aa69762581d8c463ab).
enum LibsodiumXChaChaVector {
    static let key: [UInt8] = Array(0x80...0x9f)
    static let nonce: [UInt8] = [0x07, 0x00, 0x00, 0x00] + Array(0x40...0x53)
    static let ad: [UInt8] = [0x50, 0x51, 0x52, 0x53, 0xc0, 0xc1, 0xc2, 0xc3, 0xc4, 0xc5, 0xc6, 0xc7]
    static let message = Array(
        "Ladies and Gentlemen of the class of '99: If I could offer you only one tip for the future, sunscreen would be it."
            .utf8)
    /// ciphertext (114 bytes) || tag (16 bytes)
    static let sealed: [UInt8] = [
        0xf8, 0xeb, 0xea, 0x48, 0x75, 0x04, 0x40, 0x66, 0xfc, 0x16, 0x2a, 0x06, 0x04,
        0xe1, 0x71, 0xfe, 0xec, 0xfb, 0x3d, 0x20, 0x42, 0x52, 0x48, 0x56, 0x3b, 0xcf,
        0xd5, 0xa1, 0x55, 0xdc, 0xc4, 0x7b, 0xbd, 0xa7, 0x0b, 0x86, 0xe5, 0xab, 0x9b,
        0x55, 0x00, 0x2b, 0xd1, 0x27, 0x4c, 0x02, 0xdb, 0x35, 0x32, 0x1a, 0xcd, 0x7a,
        0xf8, 0xb2, 0xe2, 0xd2, 0x50, 0x15, 0xe1, 0x36, 0xb7, 0x67, 0x94, 0x58, 0xe9,
        0xf4, 0x32, 0x43, 0xbf, 0x71, 0x9d, 0x63, 0x9b, 0xad, 0xb5, 0xfe, 0xac, 0x03,
        0xf8, 0x0a, 0x19, 0xa9, 0x6e, 0xf1, 0x0c, 0xb1, 0xd1, 0x53, 0x33, 0xa8, 0x37,
        0xb9, 0x09, 0x46, 0xba, 0x38, 0x54, 0xee, 0x74, 0xda, 0x3f, 0x25, 0x85, 0xef,
        0xc7, 0xe1, 0xe1, 0x70, 0xe1, 0x7e, 0x15, 0xe5, 0x63, 0xe7, 0x76, 0x01, 0xf4,
        0xf8, 0x5c, 0xaf, 0xa8, 0xe5, 0x87, 0x76, 0x14, 0xe1, 0x43, 0xe6, 0x84, 0x20,
    ]
}

/// Herald's at-rest format for device tokens and Web Push keys (StoreKey,
/// hc_secretbox): 0x01 || nonce (24) || XChaCha20-Poly1305 ciphertext || tag (16),
/// the row's context as associated data. Checked byte for byte against libsodium's
/// published vector, not by a round trip through Herald alone.
@Suite("At-rest sealing: libsodium's XChaCha20-Poly1305 vector in Herald's format")
struct AtRestSealingTests {
    typealias V = LibsodiumXChaChaVector

    @Test("the published vector, laid out as 0x01 || nonce || ciphertext || tag, opens to its message")
    func opensTheVector() throws {
        let key = try StoreKey(SecretBytes(copying: V.key))
        let stored = [0x01] + V.nonce + V.sealed
        #expect(try key.open(stored, context: V.ad) == V.message)
        // Each part is read from where the format puts it.
        #expect(throws: CryptoError.sealedFormat) { try key.open([0x02] + V.nonce + V.sealed, context: V.ad) }
        #expect(throws: CryptoError.decrypt) {
            try key.open([0x01] + Array(V.sealed.prefix(24)) + V.sealed, context: V.ad)
        }
        #expect(throws: CryptoError.decrypt) { try key.open(stored, context: V.ad + [0]) }
        var flipped = stored
        flipped[flipped.count - 1] ^= 1
        #expect(throws: CryptoError.decrypt) { try key.open(flipped, context: V.ad) }
    }

    @Test("a seal is exactly 0x01, its nonce, and libsodium's ciphertext and tag for that nonce")
    func sealsTheExactBytes() throws {
        // The reference (libsodium called directly) reproduces the published bytes.
        #expect(
            try Libsodium.xchacha20poly1305Encrypt(message: V.message, ad: V.ad, nonce: V.nonce, key: V.key) == V.sealed
        )
        let key = try StoreKey(SecretBytes(copying: V.key))
        var nonces: Set<[UInt8]> = []
        for plaintext in [V.message, [], Array("f00dfeedcafe0123456789abcdef".utf8)] {
            let sealed = try key.seal(plaintext, context: V.ad)
            try #require(sealed.count == 1 + 24 + plaintext.count + 16, "\(sealed.count) bytes")
            #expect(sealed[0] == 0x01, "version byte")
            let nonce = Array(sealed[1..<25])
            nonces.insert(nonce)
            let reference = try Libsodium.xchacha20poly1305Encrypt(
                message: plaintext, ad: V.ad, nonce: nonce, key: V.key)
            #expect(Array(sealed[25...]) == reference, "ciphertext || tag under the nonce at bytes 1..<25")
        }
        #expect(nonces.count == 3, "every seal draws a fresh nonce")
    }
}
