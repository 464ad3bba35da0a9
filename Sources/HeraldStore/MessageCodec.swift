import HeraldCore
import HeraldCrypto
import HeraldJSON

/// The stored form of a `PushMessage`: compact JSON in `messages.payload`.
/// Only the store reads and writes it; version 1 is
/// `{"v":1,"kind","data":{…},"alert"?,"badge"?,"badges"?,"collapse_key"?,"collapse_id"?,"priority","ttl"}`
/// (`collapse_id`: the message's own collapse id, written since Revision 2;
/// a message stored before has none and gets one from its message id),
/// then, when the message has them, `"interruption_level"`, `"relevance_score"`,
/// `"thread_id"`, `"category"`, `"android_channel_id"`, `"topics"`,
/// `"not_before"` (milliseconds), `"at_local"` (a minute of the day) and
/// `"quiet_bypass"`: optional members of version 1, so a message stored
/// before them reads as one without them.
/// A message with `web_payload` adds `"web"`: the payload sealed with the
/// store key (bound to the message id, like a device's token to its row),
/// base64url, so the database never holds the content in the clear; and
/// `"shrink"`: its steps, `[{"drop":[…]}|{"shorten":"…"}|{"keep":[…]}]`
/// (field names only, no content).
/// A Live Activity message adds `"activity"`: its event, ids and content
/// (``LiveActivity``) as JSON, sealed the same way (bound to
/// `activity:<message id>`).
enum MessageCodec {
    /// The stored form; `web_payload` and a Live Activity's content sealed
    /// with `key` for `messageID`.
    static func encode(_ m: PushMessage, messageID: String, key: StoreKey) throws(CryptoError) -> String {
        var sealed: String?
        if let web = m.webContent {
            sealed = Base64URL.encode(
                try key.seal(Array(web.payload.utf8), context: Identity.webPayloadContext(messageID)))
        }
        var activity: String?
        if let a = m.liveActivity {
            activity = Base64URL.encode(
                try key.seal(Self.activityJSON(a), context: Array("activity:\(messageID)".utf8)))
        }
        return encode(m, sealedWebPayload: sealed, sealedActivity: activity)
    }

    /// A Live Activity's event, ids and content, as compact JSON.
    static func activityJSON(_ a: LiveActivity) -> [UInt8] {
        var o: JSONObject = ["event": .string(a.event.rawValue), "timestamp": .int(a.timestamp)]
        if let v = a.activityID { o.append("activity_id", .string(v)) }
        if let v = a.attributesType { o.append("attributes_type", .string(v)) }
        if let v = a.attributes { o.append("attributes", .string(v)) }
        if let v = a.contentState { o.append("content_state", .string(v)) }
        if let v = a.staleDate { o.append("stale_date", .int(v)) }
        if let v = a.dismissalDate { o.append("dismissal_date", .int(v)) }
        if let v = a.relevanceScore { o.append("relevance_score", .double(v)) }
        if a.priorityLowered { o.append("priority_lowered", true) }
        return JSON.object(o).serialized()
    }

    static func activity(_ bytes: [UInt8]) -> LiveActivity? {
        guard let json = try? JSONParser.parse(bytes),
            let event = json["event"]?.stringValue.flatMap(ActivityEvent.init(rawValue:)),
            let timestamp = json["timestamp"]?.numberValue?.int64
        else { return nil }
        var a = LiveActivity(
            event: event, activityID: json["activity_id"]?.stringValue,
            attributesType: json["attributes_type"]?.stringValue, attributes: json["attributes"]?.stringValue,
            contentState: json["content_state"]?.stringValue, timestamp: timestamp,
            staleDate: json["stale_date"]?.numberValue?.int64,
            dismissalDate: json["dismissal_date"]?.numberValue?.int64,
            relevanceScore: json["relevance_score"]?.numberValue?.double)
        a.priorityLowered = json["priority_lowered"]?.boolValue ?? false
        return a
    }

    /// The stored form, its `web_payload` and Live Activity opened with
    /// `key`; nil when the text is not a message this version wrote or
    /// what was sealed does not open.
    static func decode(_ text: String, messageID: String, key: StoreKey) -> PushMessage? {
        guard var m = decode(text) else { return nil }
        guard let json = try? JSONParser.parse(Array(text.utf8)) else { return m }
        if let sealed = json["activity"]?.stringValue {
            guard let bytes = try? Base64URL.decode(sealed),
                let opened = try? key.open(bytes, context: Array("activity:\(messageID)".utf8)),
                let activity = Self.activity(opened)
            else { return nil }
            m.liveActivity = activity
        }
        guard let sealed = json["web"]?.stringValue else { return m }
        guard let bytes = try? Base64URL.decode(sealed),
            let payload = try? key.open(bytes, context: Identity.webPayloadContext(messageID))
        else { return nil }
        var steps: [ShrinkStep] = []
        for step in json["shrink"]?.arrayValue ?? [] {
            if let ptrs = step["drop"]?.arrayValue {
                steps.append(.drop(ptrs.compactMap(\.stringValue)))
            } else if let ptr = step["shorten"]?.stringValue {
                steps.append(.shorten(ptr))
            } else if let ptrs = step["keep"]?.arrayValue {
                steps.append(.keep(ptrs.compactMap(\.stringValue)))
            } else {
                return nil
            }
        }
        m.webContent = WebContent(payload: String(decoding: payload, as: UTF8.self), shrink: steps)
        return m
    }

    private static func encode(_ m: PushMessage, sealedWebPayload: String?, sealedActivity: String?) -> String {
        var o: JSONObject = ["v": 1, "kind": .string(m.kind.rawValue)]
        var data = JSONObject()
        for (key, value) in m.data { data.append(key, .string(value)) }
        o.append("data", .object(data))
        if let a = m.alert {
            var alert = JSONObject()
            if let v = a.locKey { alert.append("loc_key", .string(v)) }
            if let v = a.locArgs { alert.append("loc_args", .array(v.map(JSON.string))) }
            if let v = a.titleLocKey { alert.append("title_loc_key", .string(v)) }
            if let v = a.bodyLocKey { alert.append("body_loc_key", .string(v)) }
            o.append("alert", .object(alert))
        }
        if let b = m.badge { o.append("badge", .int(b)) }
        if !m.badgePerUser.isEmpty {
            var badges = JSONObject()
            for (user, n) in m.badgePerUser.sorted(by: { $0.key < $1.key }) { badges.append(user, .int(n)) }
            o.append("badges", .object(badges))
        }
        if let c = m.collapseKey { o.append("collapse_key", .string(c)) }
        if let c = m.collapseID { o.append("collapse_id", .string(c)) }
        o.append("priority", .string(m.priority.rawValue))
        o.append("ttl", .int(m.ttlSeconds))
        if let v = m.interruptionLevel { o.append("interruption_level", .string(v.rawValue)) }
        if let v = m.relevanceScore { o.append("relevance_score", .double(v)) }
        if let v = m.threadID { o.append("thread_id", .string(v)) }
        if let v = m.category { o.append("category", .string(v)) }
        if let v = m.androidChannelID { o.append("android_channel_id", .string(v)) }
        if let v = m.topics { o.append("topics", .array(v.map(JSON.string))) }
        switch m.sendTime {
        case .notBefore(let at)?: o.append("not_before", .int(at))
        case .atLocal(let minutes)?: o.append("at_local", .int(minutes))
        case nil: break
        }
        if let v = m.quietBypass { o.append("quiet_bypass", .string(v)) }
        if let sealedActivity { o.append("activity", .string(sealedActivity)) }
        if let sealedWebPayload, let web = m.webContent {
            o.append("web", .string(sealedWebPayload))
            o.append(
                "shrink",
                .array(
                    web.shrink.map { step -> JSON in
                        switch step {
                        case .drop(let p): ["drop": .array(p.map(JSON.string))]
                        case .shorten(let p): ["shorten": .string(p)]
                        case .keep(let p): ["keep": .array(p.map(JSON.string))]
                        }
                    }))
        }
        return String(decoding: JSON.object(o).serialized(), as: UTF8.self)
    }

    /// Nil when the text is not a message this version wrote (its
    /// `web_payload`, if any, is left out: see the keyed form).
    private static func decode(_ text: String) -> PushMessage? {
        guard let json = try? JSONParser.parse(Array(text.utf8)), json["v"]?.numberValue?.int64 == 1,
            let kind = json["kind"]?.stringValue.flatMap(PushKind.init(rawValue:)),
            let priority = json["priority"]?.stringValue.flatMap(PushPriority.init(rawValue:)),
            let ttl = json["ttl"]?.numberValue?.int64
        else { return nil }
        let data = (json["data"]?.objectValue ?? JSONObject()).compactMap { member in
            member.value.stringValue.map { (key: member.key, value: $0) }
        }
        var alert: PushAlert?
        if let a = json["alert"]?.objectValue {
            alert = PushAlert(
                locKey: a["loc_key"]?.stringValue, locArgs: a["loc_args"]?.arrayValue?.compactMap(\.stringValue),
                titleLocKey: a["title_loc_key"]?.stringValue, bodyLocKey: a["body_loc_key"]?.stringValue)
        }
        var badges: [String: Int] = [:]
        for member in json["badges"]?.objectValue ?? JSONObject() {
            if let n = member.value.numberValue?.int64 { badges[member.key] = Int(n) }
        }
        var message = PushMessage(
            kind: kind, data: data, alert: alert, badge: json["badge"]?.numberValue?.int64.map { Int($0) },
            badgePerUser: badges, collapseKey: json["collapse_key"]?.stringValue, priority: priority,
            ttlSeconds: Int(ttl))
        message.collapseID = json["collapse_id"]?.stringValue
        message.interruptionLevel = json["interruption_level"]?.stringValue.flatMap(InterruptionLevel.init(rawValue:))
        message.relevanceScore = json["relevance_score"]?.numberValue?.double
        message.threadID = json["thread_id"]?.stringValue
        message.category = json["category"]?.stringValue
        message.androidChannelID = json["android_channel_id"]?.stringValue
        message.topics = json["topics"]?.arrayValue?.compactMap(\.stringValue)
        if let at = json["not_before"]?.numberValue?.int64 {
            message.sendTime = .notBefore(at)
        } else if let minutes = json["at_local"]?.numberValue?.int64 {
            message.sendTime = .atLocal(Int(minutes))
        }
        message.quietBypass = json["quiet_bypass"]?.stringValue
        return message
    }
}
