/// A lane: one app's deliveries on one platform. The queue claims, and the
/// scheduler sends, lane by lane.
public struct QueueLane: Hashable, Sendable {
    public let app: String
    public let platform: Platform

    public init(app: String, platform: Platform) {
        self.app = app
        self.platform = platform
    }
}

/// One message's deliveries on one platform: the batch the stale guards judge.
public struct BatchKey: Hashable, Sendable {
    public let messageID: String
    public let platform: Platform

    public init(messageID: String, platform: Platform) {
        self.messageID = messageID
        self.platform = platform
    }
}

extension DeliveryJob {
    /// The batch this delivery belongs to.
    public var batch: BatchKey { BatchKey(messageID: messageID, platform: platform) }
}
