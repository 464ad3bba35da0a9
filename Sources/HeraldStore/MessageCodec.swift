import HeraldCore
import HeraldJSON

/// The stored form of a `PushMessage`: compact JSON in `messages.payload`.
/// Only the store reads and writes it; version 1 is
/// `{"v":1,"kind","data":{…},"alert"?,"badge"?,"badges"?,"collapse_key"?,"collapse_id"?,"priority","ttl"}`
/// (`collapse_id`: the message's own collapse id, written since Revision 2;
/// a message stored before has none and gets one from its message id),
/// then, when the message has them, `"interruption_level"`, `"relevance_score"`,
/// `"thread_id"`, `"category"` and `"android_channel_id"`: optional members
/// of version 1, so a message stored before them reads as one without them.
enum MessageCodec {
    static func encode(_ m: PushMessage) -> String {
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
        return String(decoding: JSON.object(o).serialized(), as: UTF8.self)
    }

    /// Nil when the text is not a message this version wrote.
    static func decode(_ text: String) -> PushMessage? {
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
        return message
    }
}
