public import HeraldCore
public import HeraldCrypto
import HeraldIO

/// Caches the VAPID `Authorization` header value (`vapid t=<jwt>, k=<key>`),
/// one per (app, origin), so a push service sees the same token for many sends
/// (RFC 8292 §2; webpush.md §3.4 item 2).
///
/// A token is minted with `exp = now + lifetime` (12 h by default, half the 24 h
/// maximum a push service accepts) and renewed by the first request that finds
/// less than `renewBefore` (1 h) left. Time comes from the injected clock.
/// Each app has one VAPID key and subject: the cache assumes that the key and
/// subject given for an app do not change while entries for it live (call
/// `removeAll(app:)` after a key rotation).
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
    /// `https://host[:port]`, which becomes the `aud` claim): the cached one
    /// while more than `renewBeforeSeconds` remain, else a fresh one.
    public func authorization(
        app: String, origin: String, key: P256PrivateKey, subject: String
    ) throws(CryptoError) -> String {
        let nowSeconds = clock.nowMilliseconds() / 1000
        let cacheKey = Key(app: app, origin: origin)
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

    /// The `exp` (seconds since the epoch) of the cached token, if any.
    public func expiry(app: String, origin: String) -> Int64? {
        entries.withLock { $0.peek(Key(app: app, origin: origin))?.expiresAt }
    }

    /// Forgets the token for one origin (e.g. after a 401/403 from it).
    public func remove(app: String, origin: String) {
        _ = entries.withLock { $0.remove(Key(app: app, origin: origin)) }
    }

    /// Forgets every token of `app` (after a VAPID key rotation).
    public func removeAll(app: String) {
        entries.withLock { entries in entries.removeAll { key, _ in key.app == app } }
    }

    /// How many tokens are cached.
    public var count: Int { entries.withLock { $0.count } }
}
