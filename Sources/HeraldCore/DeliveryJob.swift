/// One delivery as the queue hands it out to be sent: the device's unsealed
/// token (and Web Push keys) and the message as `push.send` accepted it.
/// It lives only in memory, for the duration of one attempt.
public struct DeliveryJob: Sendable {
    public let deliveryID: Int64
    public let messageID: String
    public let app: String
    public let deviceID: String
    public let user: String
    public let platform: Platform
    public let environment: APNsEnvironment?
    public let token: String
    public let keys: WebPushKeys?
    /// The token hash the device held when the job was claimed.
    public let tokenHash: String
    /// When the device last registered, ms since the epoch.
    public let registeredAt: Int64
    public let message: PushMessage
    /// When the message was accepted, ms since the epoch: TTLs count from here.
    public let acceptedAt: Int64
    /// The end of the message's TTL, ms since the epoch: `acceptedAt + ttl`.
    public let expiresAt: Int64
    /// Attempts made before this one (0 for the first send).
    public let previousAttempts: Int
    /// The device's bundle id (APNs devices only; nil: the app's default
    /// topic). A VoIP device's is the base id, without `.voip`.
    public let bundleID: String?
    /// Web Push: the VAPID public key (base64url) the subscription was made
    /// with, as `device.register` recorded it; nil: the app's current key.
    public let serverKey: String?
    /// Sent without sound or banner where the platform allows (the device's
    /// quiet hours, `during: silent`): APNs `interruption-level: passive`,
    /// FCM minimum notification priority, Web Push `Urgency: low` and a
    /// `silent` member in the record.
    public var silent = false

    public init(
        deliveryID: Int64, messageID: String, app: String, deviceID: String, user: String, platform: Platform,
        environment: APNsEnvironment?, token: String, keys: WebPushKeys?, tokenHash: String, registeredAt: Int64,
        message: PushMessage, acceptedAt: Int64, expiresAt: Int64, previousAttempts: Int, bundleID: String? = nil,
        serverKey: String? = nil
    ) {
        self.deliveryID = deliveryID
        self.messageID = messageID
        self.app = app
        self.deviceID = deviceID
        self.user = user
        self.platform = platform
        self.environment = environment
        self.token = token
        self.keys = keys
        self.tokenHash = tokenHash
        self.registeredAt = registeredAt
        self.message = message
        self.acceptedAt = acceptedAt
        self.expiresAt = expiresAt
        self.previousAttempts = previousAttempts
        self.bundleID = bundleID
        self.serverKey = serverKey
    }
}

extension DeliveryJob {
    /// How long after the end of its TTL a delivery may still be handed to a
    /// provider (SPEC Revision 2, "Delivery semantics"): the 2 s let a TTL-0
    /// call ring have its one attempt.
    public static let ttlGraceMilliseconds: Int64 = 2000

    /// The last moment (ms since the epoch) this delivery may be handed to a
    /// provider: `acceptedAt + ttl + 2 s`. Past it the delivery ends
    /// `expired`, whether or not it was ever attempted.
    public var sendDeadline: Int64 { Self.sendDeadline(expiresAt: expiresAt) }

    /// `expiresAt + 2 s`: the send deadline of a message that expires at `expiresAt`.
    public static func sendDeadline(expiresAt: Int64) -> Int64 {
        expiresAt > Int64.max - ttlGraceMilliseconds ? Int64.max : expiresAt + ttlGraceMilliseconds
    }
}

extension DeliveryJob {
    /// The message as it goes out at `now` (ms): its TTL cut to what is left
    /// of it, so a retry never asks a provider to keep it past the deadline.
    /// A TTL-0 message stays 0 (now or never).
    public func message(sentAt now: Int64) -> PushMessage {
        var m = message
        let left = expiresAt - now
        m.ttlSeconds = left <= 0 ? 0 : min(m.ttlSeconds, Int((left + 999) / 1000))
        m.silent = silent
        return m
    }
}
