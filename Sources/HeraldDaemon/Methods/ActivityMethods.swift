import HeraldCore
import HeraldJSON
import HeraldStore
import JSONRPC

/// Limits of the Live Activity params.
enum ActivityParamLimits {
    /// `activity_type`: a Swift type name (`DeliveryAttributes`).
    static let maxTypeBytes = 128
    /// `activity_id`: the app's id of the activity.
    static let maxIDBytes = 128
    /// `content_state` and `attributes`: compact JSON, within APNs' 4 KB body.
    static let maxObjectBytes = 3072
    static let maxObjectDepth = 16
}

extension HeraldService {
    // MARK: activity.register, activity.unregister, activity.list

    /// `activity.register {user, device_id, push_to_start_token, activity_type}`
    /// or `{user, device_id, update_token, activity_id, activity_type?}`.
    func registerActivity(_ p: inout ParamReader, _ context: CallContext, _ reply: @escaping Reply) throws(RPCError) {
        let runtime = try app(&p, context)
        let user = try user(&p)
        let deviceID = try Self.deviceIDParam(&p, "device_id", required: true)!
        let startToken = try p.string("push_to_start_token", maxBytes: 512, content: .text)
        let updateToken = try p.string("update_token", maxBytes: 512, content: .text)
        let activityType = try Self.activityType(&p, required: false)
        let activityID = try Self.activityID(&p, required: false)
        try p.finish()
        let role: ActivityRole
        let raw: String
        switch (startToken, updateToken) {
        case (let token?, nil):
            guard activityType != nil else {
                throw p.invalid("activity_type", "is required with push_to_start_token (the activity it starts)")
            }
            if activityID != nil { throw p.invalid("activity_id", "goes with update_token") }
            (role, raw) = (.start, token)
        case (nil, let token?):
            guard activityID != nil else {
                throw p.invalid("activity_id", "is required with update_token (the running activity it updates)")
            }
            (role, raw) = (.update, token)
        default:
            throw p.invalid("push_to_start_token", "give exactly one of push_to_start_token and update_token")
        }
        let field = role == .start ? "push_to_start_token" : "update_token"
        let token: String
        do throws(RPCError) {
            token = try Self.apnsToken(raw, p)
        } catch {
            throw p.invalid(field, "must be an even-length hex string of 16 to 512 chars (ActivityKit's token)")
        }
        try limit(registerLimiter, app: runtime.config.name, user: user)
        let registration = ActivityRegistration(
            app: runtime.config.name, user: user, deviceID: deviceID, role: role, activityType: activityType,
            activityID: activityID, token: token)
        let store = self.store
        let log = self.log
        sharedLimit(.register, app: runtime.config.name, user: user, reply) {
            store.registerActivity(registration) { result in
                switch result {
                case .success(let o):
                    reply(
                        .success([
                            "token_id": .string(o.tokenID), "token_hash": .string(o.tokenHash),
                            "created": .bool(o.created), "evicted": .array(o.evicted.map(JSON.string)),
                        ]))
                case .failure(let refused as ActivityDeviceRefused):
                    reply(.failure(.invalidParams(field: "device_id", reason: refused.reason)))
                case .failure(let error):
                    log.error("store_failed", ["error": String(describing: error)])
                    reply(.failure(.storeUnavailable))
                }
            }
        }
    }

    /// `activity.unregister {user, activity_id}` (the activity's update
    /// tokens) or `{user, device_id, activity_type}` (a push-to-start token).
    func unregisterActivity(
        _ p: inout ParamReader, _ context: CallContext, _ reply: @escaping Reply
    ) throws(RPCError) {
        let runtime = try app(&p, context)
        let user = try user(&p)
        let activityID = try Self.activityID(&p, required: false)
        let deviceID = try Self.deviceIDParam(&p, "device_id", required: false)
        let activityType = try Self.activityType(&p, required: false)
        try p.finish()
        let selector: ActivitySelector
        switch (activityID, deviceID, activityType) {
        case (let id?, nil, nil): selector = .activity(id)
        case (nil, let device?, let type?): selector = .pushToStart(deviceID: device, activityType: type)
        default:
            throw p.invalid("activity_id", "give activity_id, or device_id and activity_type")
        }
        store.unregisterActivity(
            app: runtime.config.name, user: user, selector, completion: finish(reply) { ["removed": .int($0)] })
    }

    /// `activity.list {user}`: the user's Live Activity tokens (never the tokens themselves).
    func listActivities(_ p: inout ParamReader, _ context: CallContext, _ reply: @escaping Reply) throws(RPCError) {
        let runtime = try app(&p, context)
        let user = try user(&p)
        try p.finish()
        store.listActivities(
            app: runtime.config.name, user: user,
            completion: finish(reply) { tokens in
                [
                    "activities": .array(
                        tokens.map { t in
                            [
                                "token_id": .string(t.tokenID), "device_id": .string(t.deviceID),
                                "role": .string(t.role == .start ? "push_to_start" : "update"),
                                "activity_type": t.activityType.map(JSON.string) ?? .null,
                                "activity_id": t.activityID.map(JSON.string) ?? .null,
                                "token_hash": .string(t.tokenHash),
                                "environment": t.environment.map { .string($0.rawValue) } ?? .null,
                                "registered_at": .string(Timestamp.rfc3339(t.registeredAt)),
                            ]
                        })
                ]
            })
    }

    // MARK: Params

    static func deviceIDParam(_ p: inout ParamReader, _ name: String, required: Bool) throws(RPCError) -> String? {
        guard let id = try p.string(name, required: required, maxBytes: 32, content: .text) else { return nil }
        guard isDeviceID(id) else { throw p.invalid(name, "must be 32 lowercase hex characters") }
        return id
    }

    /// `activity_type`: the `ActivityAttributes` type name, letters, digits, `_` and `.`.
    static func activityType(_ p: inout ParamReader, required: Bool) throws(RPCError) -> String? {
        let type = try typeName(&p, "activity_type")
        if required && type == nil { throw p.invalid("activity_type", "is required") }
        return type
    }

    /// `activity_id`: the app's id of the activity, 1–128 bytes without control characters.
    static func activityID(_ p: inout ParamReader, required: Bool) throws(RPCError) -> String? {
        guard
            let id = try p.string(
                "activity_id", required: required, maxBytes: ActivityParamLimits.maxIDBytes, content: .text)
        else { return nil }
        if id.unicodeScalars.contains(where: { $0.value < 0x20 || (0x7F...0x9F).contains($0.value) }) {
            throw p.invalid("activity_id", "must not contain control characters")
        }
        return id
    }
}

extension HeraldService {
    // MARK: push.send kind: live_activity

    /// The Live Activity params of `push.send`: read whatever the kind (so
    /// that they are refused, named, on any other), checked against what
    /// ActivityKit needs for each event. nil for another kind.
    static func liveActivity(
        _ p: inout ParamReader, kind: PushKind, alert: PushAlert?, nowSeconds: Int64
    ) throws(RPCError) -> LiveActivity? {
        let event = try p.enumeration("event", allowed: ActivityEvent.allCases.map(\.rawValue))
            .flatMap(ActivityEvent.init(rawValue:))
        let activityID = try Self.activityID(&p, required: false)
        let attributesType = try Self.typeName(&p, "attributes_type")
        let attributes = try Self.jsonObjectText(&p, "attributes")
        let contentState = try Self.jsonObjectText(&p, "content_state")
        let timestamp = try Self.unixSeconds(&p, "timestamp")
        let staleDate = try Self.unixSeconds(&p, "stale_date")
        let dismissalDate = try Self.unixSeconds(&p, "dismissal_date")
        let channel: String? = p.params["channel_id"] == nil ? nil : try Self.channelIDParam(&p)
        guard kind == .liveActivity else {
            let given: [(String, Bool)] = [
                ("event", event != nil), ("activity_id", activityID != nil),
                ("attributes_type", attributesType != nil), ("attributes", attributes != nil),
                ("content_state", contentState != nil), ("timestamp", timestamp != nil),
                ("stale_date", staleDate != nil), ("dismissal_date", dismissalDate != nil),
                ("channel_id", channel != nil),
            ]
            if let first = given.first(where: { $0.1 }) {
                throw p.invalid(first.0, "is only for kind live_activity")
            }
            return nil
        }
        guard let event else { throw p.invalid("event", "is required for kind live_activity: start, update or end") }
        switch event {
        case .start:
            if attributesType == nil {
                throw p.invalid(
                    "attributes_type", "is required to start an activity (the push-to-start tokens of that type get it)"
                )
            }
            if attributes == nil { throw p.invalid("attributes", "is required to start an activity ({} for none)") }
            if contentState == nil { throw p.invalid("content_state", "is required to start an activity") }
            if alert == nil {
                throw p.invalid("alert", "is required to start an activity (Apple shows it as the activity starts)")
            }
        case .update, .end:
            if activityID == nil {
                throw p.invalid(
                    "activity_id", "is required for event \(event.rawValue) (the activity's update tokens get it)")
            }
            if attributesType != nil { throw p.invalid("attributes_type", "is only for event start") }
            if attributes != nil { throw p.invalid("attributes", "is only for event start") }
            if event == .update && contentState == nil {
                throw p.invalid("content_state", "is required for event update")
            }
        }
        if dismissalDate != nil && event != .end { throw p.invalid("dismissal_date", "is only for event end") }
        if channel != nil && event != .start {
            throw p.invalid("channel_id", "is only for event start (the activity subscribes to the channel)")
        }
        var activity = LiveActivity(
            event: event, activityID: activityID, attributesType: attributesType, attributes: attributes,
            contentState: contentState, timestamp: timestamp ?? nowSeconds, staleDate: staleDate,
            dismissalDate: dismissalDate)
        activity.inputPushChannel = channel
        return activity
    }

    /// A Swift type name param (letters, digits, `_`, `.`).
    static func typeName(_ p: inout ParamReader, _ name: String) throws(RPCError) -> String? {
        guard let type = try p.string(name, maxBytes: ActivityParamLimits.maxTypeBytes, content: .text) else {
            return nil
        }
        guard
            type.utf8.allSatisfy({
                ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x41 && $0 <= 0x5A) || ($0 >= 0x61 && $0 <= 0x7A) || $0 == 0x5F
                    || $0 == 0x2E
            })
        else { throw p.invalid(name, "must be a Swift type name: letters, digits, _ and . only") }
        return type
    }

    /// A JSON object param, as compact text (nil when absent).
    static func jsonObjectText(_ p: inout ParamReader, _ name: String) throws(RPCError) -> String? {
        switch p.value(name) {
        case nil, .null?: return nil
        case .object(let o)?:
            if let duplicate = o.firstDuplicateKey { throw p.invalid(name + "." + duplicate, "duplicate key") }
            func depth(_ v: JSON) -> Int {
                switch v {
                case .object(let o): 1 + (o.members.map { depth($0.value) }.max() ?? 0)
                case .array(let a): 1 + (a.map(depth).max() ?? 0)
                default: 0
                }
            }
            if depth(.object(o)) > ActivityParamLimits.maxObjectDepth {
                throw p.invalid(name, "must be nested at most \(ActivityParamLimits.maxObjectDepth) deep")
            }
            let text = String(decoding: JSON.object(o).serialized(), as: UTF8.self)
            if text.utf8.count > ActivityParamLimits.maxObjectBytes {
                throw p.invalid(name, "must be at most \(ActivityParamLimits.maxObjectBytes) bytes as compact JSON")
            }
            return text
        default: throw p.invalid(name, "must be an object")
        }
    }

    /// A time param: Unix seconds, or an RFC 3339 date-time.
    static func unixSeconds(_ p: inout ParamReader, _ name: String) throws(RPCError) -> Int64? {
        let reason = "must be Unix seconds (an integer) or an RFC 3339 date-time with Z or an offset"
        switch p.value(name) {
        case nil, .null?: return nil
        case .number(let n)?:
            guard n.isIntegerLiteral, let v = n.int64, (0...99_999_999_999).contains(v) else {
                throw p.invalid(name, reason + " (seconds, not milliseconds)")
            }
            return v
        case .string(let s)?:
            guard let ms = Timestamp.parse(s), ms >= 0 else { throw p.invalid(name, reason) }
            return ms / 1000
        default: throw p.invalid(name, reason)
        }
    }
}
