import Foundation
import HeraldCore
import HeraldCrypto
import Testing
import WebPush

/// A clock that stands still.
private struct FixedClock: WallClock {
    let now: Int64
    func nowMilliseconds() -> Int64 { now }
}

@Suite("VAPIDTokenCache with a previous key (rotation)")
struct VAPIDKeyCacheTests {
    @Test("one token per key for one app and origin: each signed with its key, kept and dropped on its own")
    func tokenPerKey() throws {
        let cache = VAPIDTokenCache(clock: FixedClock(now: 1_700_000_000_000))
        let current = try P256PrivateKey.generate()
        let previous = try P256PrivateKey.generate()
        let origin = "https://push.example"
        func token(_ key: P256PrivateKey, keyID: String? = nil) throws -> String {
            try cache.authorization(app: "x", origin: origin, key: key, keyID: keyID, subject: "mailto:a@b.c")
        }
        let a = try token(current, keyID: current.publicKeyBase64URL)
        let b = try token(previous, keyID: previous.publicKeyBase64URL)
        #expect(a != b)
        #expect(a.hasSuffix(", k=\(current.publicKeyBase64URL)"), "\(a)")
        #expect(b.hasSuffix(", k=\(previous.publicKeyBase64URL)"), "\(b)")
        #expect(cache.count == 2)
        #expect(try token(current) == a, "a key named by its own public key is the same entry")
        #expect(try token(previous) == b)

        cache.remove(app: "x", origin: origin, keyID: previous.publicKeyBase64URL)
        #expect(cache.count == 1)
        #expect(cache.expiry(app: "x", origin: origin, keyID: previous.publicKeyBase64URL) == nil)
        #expect(cache.expiry(app: "x", origin: origin, keyID: current.publicKeyBase64URL) != nil)
        #expect(try token(current) == a, "the current key's token is untouched")
        #expect(try token(previous) != b, "a fresh one for the previous key")

        cache.remove(app: "x", origin: origin)
        #expect(cache.count == 0, "without a key: every key's token for the origin")
    }
}
