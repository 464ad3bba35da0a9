public import HeraldCore
internal import HeraldJSON

/// What an app section says about APNs.
public struct APNsAppSettings: Sendable, Hashable {
    /// `apns_topic`: the app's bundle id. VoIP requests add `.voip` to it.
    public var topic: String
    /// `alert_loc_key`: the alert's `loc-key` when the message names none.
    public var defaultAlertLocKey: String?

    public init(topic: String, defaultAlertLocKey: String? = nil) {
        self.topic = topic
        self.defaultAlertLocKey = defaultAlertLocKey
    }
}

/// The `apns-push-type` header; it must match the payload.
public enum APNsPushType: String, Sendable, Hashable, CaseIterable {
    /// A visible notification (`kind: notification`).
    case alert
    /// A `content-available` push with no alert (`kind: clear`); always priority 5.
    case background
    /// A PushKit push to an `apns_voip` token (`kind: call_ring`).
    case voip
    /// A widget reload to an `apns_widgets` token (`kind: widgets`).
    case widgets
    /// A location query to an `apns_location` token (`kind: location`).
    case location
    /// A PushToTalk push to an `apns_pushtotalk` token (`kind: pushtotalk`):
    /// always priority 10 and `apns-expiration` 0.
    case pushToTalk = "pushtotalk"
    /// A Live Activity start, update or end to an `apns_liveactivity` token.
    case liveActivity = "liveactivity"
}

/// One APNs request for one device: the `apns-*` headers and the JSON body.
///
/// Pure: no clock, no I/O. The sender adds `authorization` (the provider JWT of
/// its connection), may add `apns-id`, and posts `payload` to `/3/device/<token>`.
///
/// What each kind becomes:
///
/// | kind | platform | push type | body |
/// |---|---|---|---|
/// | `notification` | `apns` | `alert` | `{"aps":{"alert":{"loc-key","loc-args","title-loc-key"},"badge","mutable-content":1,"sound":"default","interruption-level","relevance-score","thread-id","category"},…data}` |
/// | `clear` | `apns` | `background` | `{"aps":{"content-available":1,"badge"},…data}` |
/// | `call_ring` | `apns_voip` | `voip` | `{"aps":{},…data}` |
/// | `widgets` | `apns_widgets` | `widgets` | `{"aps":{"content-changed":true}}` (nothing else) |
/// | `location` | `apns_location` | `location` | `{"aps":{},…data}` |
/// | `pushtotalk` | `apns_pushtotalk` | `pushtotalk` | `{"aps":{},…data}`, priority 10, expiration 0 |
/// | `live_activity` | `apns_liveactivity` | `liveactivity` | `{"aps":{"timestamp","event","content-state","stale-date","dismissal-date","relevance-score","alert":{"title","body","sound"},"attributes-type","attributes","input-push-token"}}` |
///
/// A Live Activity push carries no data and no `apns-collapse-id` (a newer
/// update supersedes an older one in Herald's queue instead); its alert is
/// localised (`{"loc-key","loc-args"}` for `title` and `body`); a start asks
/// for the activity's update token (`input-push-token: 1`).
///
/// Each platform's `apns-topic` is the bundle id with its suffix (`.voip`,
/// `.push-type.widgets`, `.location-query`, `.voip-ptt`).
///
/// Members that have no value are left out (no `badge` without a badge, no
/// `alert` when neither the message nor the app names a loc key, none of the
/// four presentation members the message does not set). The presentation
/// members are for visible notifications only: `push.send` refuses them on
/// the other kinds, and a background or VoIP push leaves them out. Data members
/// follow `aps` at the top level in the caller's order. VoIP pushes carry data
/// only: PushKit hands the dictionary to the app, which must report a call to
/// CallKit, and iOS shows nothing from `aps`, so a badge or alert there would be
/// dead weight. Any other pairing of kind and platform is refused
/// (`PushKind.reaches`).
public struct APNsRequest: Sendable, Hashable {
    /// The largest body APNs accepts for a regular push, in bytes.
    public static let payloadLimit = 4096
    /// The largest body APNs accepts for a VoIP push, in bytes.
    public static let voipPayloadLimit = 5120
    /// `apns-collapse-id` "should not exceed 64 bytes" (longer: 400 `BadCollapseId`).
    public static let maximumCollapseIDBytes = 64
    /// TTLs are clamped to 28 days, the longest any of Herald's providers keeps a
    /// push; APNs itself stores for "30 days or less".
    public static let maximumTTLSeconds = 2_419_200

    /// The body limit for `platform`: 5120 for `apns_voip` and for a
    /// broadcast (`apns_channel`), else 4096.
    public static func payloadLimit(for platform: Platform) -> Int {
        platform == .apnsVoIP || platform == .apnsChannel ? voipPayloadLimit : payloadLimit
    }

    /// Whether `key` may not appear in `data` because the body uses it: `aps`.
    public static func isReservedDataKey(_ key: String) -> Bool {
        key == "aps"
    }

    /// The `apns-collapse-id` for a message's `collapse_key`; nil for none (or "").
    ///
    /// A key of at most 64 bytes of printable ASCII (0x20–0x7E, no leading or
    /// trailing space) is used as it is. Any other key (longer, or with bytes an
    /// HTTP/2 header value should not carry) becomes the 32-character base64url
    /// of the first 24 bytes of its SHA-256, which is also its Web Push `Topic`.
    /// The mapping is stable, so a retried send collapses onto the same
    /// notification.
    public static func collapseID(for collapseKey: String?) -> String? {
        guard let collapseKey, !collapseKey.isEmpty else { return nil }
        let bytes = Array(collapseKey.utf8)
        let plain =
            bytes.count <= maximumCollapseIDBytes && bytes.allSatisfy { (0x20...0x7E).contains($0) }
            && bytes.first != 0x20 && bytes.last != 0x20
        return plain ? collapseKey : CollapseDigest.shortForm(collapseKey)
    }

    /// `apns` or `apns_voip`.
    public let platform: Platform
    public let pushType: APNsPushType
    /// `apns-topic`: the device's bundle id (else the app's default), with
    /// `.voip` for VoIP.
    public let topic: String
    /// `apns-priority`: 10 for `high`, 5 for `normal` and `low`, and 5 for every
    /// background push whatever the message asked (APNs refuses 10 there).
    public let priority: Int
    /// `apns-expiration` in Unix seconds: `now + ttl`, or 0 when the TTL is 0
    /// (APNs then tries once and never stores the push).
    public let expiration: Int64
    /// `apns-collapse-id`: from the collapse key, else the message's own
    /// collapse id (``PushMessage/collapseID``); absent when it has neither.
    public let collapseID: String?
    /// The JSON body, compact, U+2028/U+2029 escaped.
    public let payload: [UInt8]

    /// Builds the request for one device.
    ///
    /// - Parameters:
    ///   - message: the message as `push.send` accepted it.
    ///   - platform: the device's platform, `apns` or `apns_voip`.
    ///   - user: the device's user, for a per-user badge.
    ///   - settings: the app's topic and default loc key.
    ///   - now: Unix seconds the TTL counts from. Pass the time the message was
    ///     accepted, not the time of a retry, so that retries never stretch the
    ///     push's life past its TTL.
    ///   - bundleID: the device's bundle id (the base id for VoIP too); nil
    ///     for the app's default topic.
    public init(
        message: PushMessage, platform: Platform, user: String, settings: APNsAppSettings, now: Int64,
        bundleID: String? = nil
    ) throws(APNsRequestError) {
        guard let suffix = platform.apnsTopicSuffix else { throw .notAPNs(platform) }
        guard message.kind.reaches(platform) else {
            throw .kindNotRouted(kind: message.kind, platform: platform)
        }
        var seen = Set<String>()
        for (key, _) in message.data {
            if Self.isReservedDataKey(key) { throw .reservedDataKey(key) }
            if !seen.insert(key).inserted { throw .duplicateDataKey(key) }
        }

        let badge = message.badge(for: user)
        var aps = JSONObject()
        switch message.kind {
        case .notification:
            pushType = .alert
            var alert = JSONObject()
            let locKey = message.alert?.locKey ?? message.alert?.bodyLocKey ?? settings.defaultAlertLocKey
            if let locKey { alert["loc-key"] = .string(locKey) }
            if let args = message.alert?.locArgs { alert["loc-args"] = .array(args.map(JSON.string)) }
            if let titleLocKey = message.alert?.titleLocKey { alert["title-loc-key"] = .string(titleLocKey) }
            if !alert.isEmpty { aps["alert"] = .object(alert) }
            if let badge { aps["badge"] = .int(badge) }
            aps["mutable-content"] = 1
            if message.silent {
                // The device's quiet hours: listed, without sound or a lit screen.
                aps["interruption-level"] = .string(InterruptionLevel.passive.rawValue)
            } else {
                aps["sound"] = "default"
                if let level = message.interruptionLevel { aps["interruption-level"] = .string(level.rawValue) }
            }
            if let score = message.relevanceScore { aps["relevance-score"] = .double(score) }
            if let threadID = message.threadID { aps["thread-id"] = .string(threadID) }
            if let category = message.category { aps["category"] = .string(category) }
        case .clear:
            pushType = .background
            aps["content-available"] = 1
            if let badge { aps["badge"] = .int(badge) }
        case .callRing:
            pushType = .voip
        case .widgets:
            // WidgetKit wants exactly this: push.send refuses data and a badge.
            pushType = .widgets
            aps["content-changed"] = true
        case .location:
            pushType = .location
        case .pushToTalk:
            pushType = .pushToTalk
        case .liveActivity:
            pushType = .liveActivity
            guard let activity = message.liveActivity else {
                throw .kindNotRouted(kind: message.kind, platform: platform)
            }
            Self.liveActivity(activity, alert: message.alert, silent: message.silent, into: &aps)
        }
        var body = JSONObject()
        body.append("aps", .object(aps))
        if pushType != .widgets && pushType != .liveActivity {
            for (key, value) in message.data { body.append(key, .string(value)) }
        }
        let payload = JSON.object(body).serialized()
        let limit = Self.payloadLimit(for: platform)
        guard payload.count <= limit else {
            throw .payloadTooLarge(PayloadTooLarge(platform: platform, limit: limit, size: payload.count))
        }

        let ttl = min(max(message.ttlSeconds, 0), Self.maximumTTLSeconds)
        self.platform = platform
        let base = bundleID ?? settings.topic
        self.topic = base + suffix
        self.priority =
            switch pushType {
            case .background: 5
            case .pushToTalk: 10
            default: message.priority == .high ? 10 : 5
            }
        // A channel that stores nothing takes 0 only (else BadExpirationDate).
        let storesNothing = platform == .apnsChannel && message.liveActivity?.channelStoresLatest != true
        self.expiration = ttl == 0 || pushType == .pushToTalk || storesNothing ? 0 : now + Int64(ttl)
        // Without a collapse key, the message's own id: a resend of it
        // replaces the first notification instead of showing a second. A
        // Live Activity orders its pushes by their timestamp instead.
        self.collapseID =
            pushType == .liveActivity ? nil : Self.collapseID(for: message.collapseKey) ?? message.ownCollapseID
        self.payload = payload
    }

    /// The `aps` members of a Live Activity push (ActivityKit), in Apple's order.
    static func liveActivity(
        _ a: LiveActivity, alert: PushAlert?, silent: Bool, into aps: inout JSONObject
    ) {
        func object(_ text: String?) -> JSON? {
            text.flatMap { try? JSONParser.parse(Array($0.utf8)) }
        }
        aps["timestamp"] = .int(a.timestamp)
        aps["event"] = .string(a.event.rawValue)
        if let state = object(a.contentState) { aps["content-state"] = state }
        if let stale = a.staleDate { aps["stale-date"] = .int(stale) }
        if let dismissal = a.dismissalDate { aps["dismissal-date"] = .int(dismissal) }
        if let score = a.relevanceScore { aps["relevance-score"] = .double(score) }
        if let alert {
            var shown = JSONObject()
            if let title = alert.titleLocKey { shown["title"] = ["loc-key": .string(title)] }
            if let key = alert.locKey ?? alert.bodyLocKey {
                var body: JSONObject = ["loc-key": .string(key)]
                if let args = alert.locArgs { body["loc-args"] = .array(args.map(JSON.string)) }
                shown["body"] = .object(body)
            }
            if !silent { shown["sound"] = "default" }
            aps["alert"] = .object(shown)
        }
        if a.event == .start {
            if let type = a.attributesType { aps["attributes-type"] = .string(type) }
            aps["attributes"] = object(a.attributes) ?? .object(JSONObject())
            if let channel = a.inputPushChannel {
                aps["input-push-channel"] = .string(channel)
            } else {
                aps["input-push-token"] = 1
            }
        }
    }

    /// The request headers, lowercase as HTTP/2 wants them, in a fixed order:
    /// `apns-push-type`, `apns-topic`, `apns-priority`, `apns-expiration`, and
    /// `apns-collapse-id` when there is one.
    public var headers: [(name: String, value: String)] {
        // A broadcast names its bundle in the path: no apns-topic.
        var fields: [(name: String, value: String)] = [("apns-push-type", pushType.rawValue)]
        if platform != .apnsChannel { fields.append(("apns-topic", topic)) }
        fields += [("apns-priority", String(priority)), ("apns-expiration", String(expiration))]
        if let collapseID { fields.append(("apns-collapse-id", collapseID)) }
        return fields
    }

    /// The value of header `name` (case-insensitive), or nil.
    public func header(_ name: String) -> String? {
        let wanted = name.lowercased()
        return headers.first { $0.name == wanted }?.value
    }
}
