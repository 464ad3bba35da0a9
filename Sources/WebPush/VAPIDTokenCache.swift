public import HeraldCore
public import HeraldCrypto
import HeraldIO

/// Caches the VAPID `Authorization` header value (`vapid t=<jwt>, k=<key>`),
/// one per (app, origin, signing key), so a push service sees the same token
/// for many sends (RFC 8292 §2; webpush.md §3.4 item 2). An app that holds a
/// previous key besides its current one (key rotation) has a token per key
/// for one origin: subscriptions made under the previous key are signed with
/// it, the others with the current key.
///
/// A token is minted with `exp = now + lifetime` (12 h by default, half the 24 h
/// maximum a push service accepts) and renewed by the first request that finds
/// less than `renewBefore` (1 h) left. Time comes from the injected clock.
/// A key is named by its public key (base64url); the cache assumes that the
/// subject given for an app does not change while entries for it live (call
/// `removeAll(app:)` after a change).
///
/// At most `capacity` tokens (4,096) are kept; past that the least recently
/// used goes (SPEC.md Revision 2), so endpoints on ever new origins cannot
/// grow it.
///
/// Thread-safe: every method may be called from any thread. Minting (an ECDSA
/// signature) happens under the lock, which keeps one token per key even when
/// many sends race for a cold entry.
public final class VAPIDTokenCache: Sendable {
    public static let defaultLifetimeSeconds: Int64 = 12 * 3600
    public static let defaultRenewBeforeSeconds: Int64 = 3600

    private struct Key: Hashable {
        let app: String
        let origin: String
        /// The signing key's public key, base64url.
        let keyID: String
    }
    private struct Entry {
        let value: String
        let expiresAt: Int64
    }

    public let clock: any WallClock
    public let lifetimeSeconds: Int64
    public let renewBeforeSeconds: Int64
    /// The most tokens kept.
    public let capacity: Int
    private let entries: Locked<LRUCache<Key, Entry>>

    public init(
        clock: any WallClock = SystemClock(),
        lifetimeSeconds: Int64 = VAPIDTokenCache.defaultLifetimeSeconds,
        renewBeforeSeconds: Int64 = VAPIDTokenCache.defaultRenewBeforeSeconds,
        capacity: Int = 4096
    ) {
        self.capacity = max(1, capacity)
        entries = Locked(LRUCache(capacity: self.capacity))
        self.clock = clock
        self.lifetimeSeconds = lifetimeSeconds
        self.renewBeforeSeconds = renewBeforeSeconds
    }

    /// The `Authorization` value for `app` sending to `origin` (the endpoint's
    /// `https://host[:port]`, which becomes the `aud` claim) signed with
    /// `key`: the cached one while more than `renewBeforeSeconds` remain, else
    /// a fresh one. `keyID` is the key's public key (base64url), which the
    /// caller usually knows already; nil derives it.
    public func authorization(
        app: String, origin: String, key: P256PrivateKey, keyID: String? = nil, subject: String
    ) throws(CryptoError) -> String {
        let nowSeconds = clock.nowMilliseconds() / 1000
        let cacheKey = Key(app: app, origin: origin, keyID: keyID ?? key.publicKeyBase64URL)
        let result: Result<String, CryptoError> = entries.withLock { entries in
            if let entry = entries.get(cacheKey), entry.expiresAt - nowSeconds >= renewBeforeSeconds {
                return .success(entry.value)
            }
            let expiresAt = nowSeconds + lifetimeSeconds
            do throws(CryptoError) {
                let value = try VAPID.authorization(
                    key: key, audience: origin, subject: subject, expiresAt: expiresAt, now: nowSeconds)
                entries.set(cacheKey, Entry(value: value, expiresAt: expiresAt))
                return .success(value)
            } catch {
                return .failure(error)
            }
        }
        return try result.get()
    }

    /// The `exp` (seconds since the epoch) of the cached token of the key
    /// `keyID` (base64url public key), if any; with nil, of the origin's
    /// token used most recently, whichever key signed it.
    public func expiry(app: String, origin: String, keyID: String? = nil) -> Int64? {
        entries.withLock { entries in
            if let keyID { return entries.peek(Key(app: app, origin: origin, keyID: keyID))?.expiresAt }
            let key = entries.keysOldestFirst.last { $0.app == app && $0.origin == origin }
            return key.flatMap { entries.peek($0)?.expiresAt }
        }
    }

    /// Forgets the token of one origin and key (e.g. after a 401/403 from
    /// it); with `keyID` nil, the tokens of every key for the origin.
    public func remove(app: String, origin: String, keyID: String? = nil) {
        entries.withLock { entries in
            if let keyID {
                _ = entries.remove(Key(app: app, origin: origin, keyID: keyID))
            } else {
                entries.removeAll { key, _ in key.app == app && key.origin == origin }
            }
        }
    }

    /// Forgets every token of `app` (after a VAPID key rotation).
    public func removeAll(app: String) {
        entries.withLock { entries in entries.removeAll { key, _ in key.app == app } }
    }

    /// How many tokens are cached.
    public var count: Int { entries.withLock { $0.count } }
}
