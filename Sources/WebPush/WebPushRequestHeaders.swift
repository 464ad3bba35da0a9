public import HeraldCore
internal import HeraldCrypto

/// RFC 8030 `Urgency` values.
public enum WebPushUrgency: String, Sendable, Hashable, CaseIterable {
    case veryLow = "very-low"
    case low
    case normal
    case high

    /// `high` → `high`, `normal` → `normal`, `low` → `low`.
    ///
    /// `very-low` is never used: it asks the user agent to wait for power and
    /// Wi-Fi, which suits bulk prefetching, not a push a user acts on. Herald's
    /// lowest priority is a `clear`, which should still land soon enough to
    /// dismiss a shown notification, so `low` is as far down as it goes.
    public init(_ priority: PushPriority) {
        switch priority {
        case .high: self = .high
        case .normal: self = .normal
        case .low: self = .low
        }
    }
}

/// The Web Push request headers Herald derives from a message, minus
/// `Authorization` (the sender adds `vapid t=…, k=…` per endpoint origin) and
/// `Content-Length` (the HTTP layer's).
///
/// `TTL`, `Urgency`, `Topic` (a collapse key's, or the message's own id),
/// `Content-Encoding: aes128gcm`, `Content-Type: application/octet-stream`, in
/// that order. No `Encryption` or `Crypto-Key` header: aes128gcm carries salt
/// and key in the body, and push services refuse the old headers with it.
public struct WebPushHeaders: Sendable, Hashable {
    /// TTLs are clamped to four weeks, the most FCM's Web Push endpoint accepts
    /// (other services clamp silently).
    public static let maximumTTLSeconds = 2_419_200

    /// The `Topic` for a collapse key: base64url of the first 24 bytes of
    /// SHA-256(collapse key), exactly 32 characters of `[A-Za-z0-9_-]` — the
    /// most RFC 8030 allows. Nil for no key (or ""). The header is neither
    /// encrypted nor authenticated, so the key itself never appears on the wire;
    /// the same key always gives the same Topic, so a retry replaces rather than
    /// duplicates a pending push.
    public static func topic(for collapseKey: String?) -> String? {
        guard let collapseKey, !collapseKey.isEmpty else { return nil }
        return Base64URL.encode(SHA256.hash(Array(collapseKey.utf8)).prefix(24))
    }

    /// `TTL` in seconds, clamped to 0…2419200.
    public let ttlSeconds: Int
    public let urgency: WebPushUrgency
    public private(set) var topic: String?

    public init(ttl: Int, priority: PushPriority, collapseKey: String?) {
        self.ttlSeconds = min(max(ttl, 0), Self.maximumTTLSeconds)
        self.urgency = WebPushUrgency(priority)
        self.topic = Self.topic(for: collapseKey)
    }

    /// The headers for a message: its TTL, priority and collapse key; without
    /// a collapse key, its own collapse id (``PushMessage/collapseID``, already
    /// 32 base64url characters) is the `Topic`, so a resend replaces the
    /// first push.
    public init(message: PushMessage) {
        self.init(
            ttl: message.ttlSeconds, priority: message.silent ? .low : message.priority,
            collapseKey: message.collapseKey)
        if topic == nil { topic = message.ownCollapseID }
    }

    /// The header fields in order.
    public var fields: [(name: String, value: String)] {
        var fields: [(name: String, value: String)] = [
            ("TTL", String(ttlSeconds)),
            ("Urgency", urgency.rawValue),
        ]
        if let topic { fields.append(("Topic", topic)) }
        fields.append(("Content-Encoding", "aes128gcm"))
        fields.append(("Content-Type", "application/octet-stream"))
        return fields
    }

    /// The value of header `name` (case-insensitive), or nil.
    public func field(_ name: String) -> String? {
        let wanted = name.lowercased()
        return fields.first { $0.name.lowercased() == wanted }?.value
    }
}
