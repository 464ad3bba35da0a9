/// What a Live Activity push does (ActivityKit's `aps.event`).
public enum ActivityEvent: String, Sendable, CaseIterable, Hashable {
    /// Starts an activity on the devices' push-to-start tokens of its type.
    case start
    /// Updates a running activity on its update tokens.
    case update
    /// Ends a running activity; its update tokens are let go once it is sent.
    case end
}

/// Which of a device's Live Activity tokens a row is.
public enum ActivityRole: String, Sendable, CaseIterable, Hashable {
    /// A push-to-start token, one per device and activity type.
    case start
    /// A running activity's update token, one per device and activity id.
    case update
    /// Not a token: a broadcast channel of the app (`activity_id` its channel id).
    case channel
}

/// One `push.send kind: live_activity`: the event, the activity it is
/// about and what ActivityKit shows. JSON members are kept as compact text.
public struct LiveActivity: Sendable, Hashable {
    public var event: ActivityEvent
    /// The app's id of the activity (`ride-123`): the update tokens an
    /// update or an end goes to; for a start, the name the activity takes.
    public var activityID: String?
    /// `attributes-type`: the Swift `ActivityAttributes` type; a start goes
    /// to the push-to-start tokens registered for it.
    public var attributesType: String?
    /// `attributes` (start only): a JSON object.
    public var attributes: String?
    /// `content-state`: a JSON object (required for start and update).
    public var contentState: String?
    /// `timestamp`, Unix seconds: the caller's, or when Herald accepted it.
    public var timestamp: Int64
    /// `stale-date`, Unix seconds.
    public var staleDate: Int64?
    /// `dismissal-date`, Unix seconds (end only).
    public var dismissalDate: Int64?
    /// `relevance-score`: which of the app's activities the Dynamic Island shows first.
    public var relevanceScore: Double?
    /// The call asked for priority 10 past the activity's hourly allowance
    /// (`live_activity_high_per_hour`): it goes at 5 instead.
    public var priorityLowered = false
    /// `push.broadcast`: the channel it goes to, and what the channel stores
    /// (a channel that stores nothing takes `apns-expiration: 0` only).
    public var channelID: String?
    public var channelStoresLatest = false
    /// `push.send` start with `channel_id`: the started activity subscribes
    /// to that channel (`input-push-channel`) instead of asking for an
    /// update token.
    public var inputPushChannel: String?

    public init(
        event: ActivityEvent, activityID: String? = nil, attributesType: String? = nil, attributes: String? = nil,
        contentState: String? = nil, timestamp: Int64, staleDate: Int64? = nil, dismissalDate: Int64? = nil,
        relevanceScore: Double? = nil
    ) {
        self.event = event
        self.activityID = activityID
        self.attributesType = attributesType
        self.attributes = attributes
        self.contentState = contentState
        self.timestamp = timestamp
        self.staleDate = staleDate
        self.dismissalDate = dismissalDate
        self.relevanceScore = relevanceScore
    }

    /// The collapse key that makes a newer update or an end supersede what
    /// waits for the same activity's tokens (never sent as `apns-collapse-id`).
    public var supersedeKey: String? {
        if let channelID { return "herald-channel:" + channelID }
        guard event != .start, let activityID else { return nil }
        return "herald-activity:" + activityID
    }
}
