import HeraldCore
import HeraldJSON
import Testing

/// The bytes as text (payloads are UTF-8 JSON).
func text(_ bytes: [UInt8]) -> String {
    String(decoding: bytes, as: UTF8.self)
}

/// Parses a payload back with the project's own parser.
func parsed(_ bytes: [UInt8]) throws -> JSON {
    try JSONParser.parse(bytes)
}

/// `value` with every object's members sorted by name, so that two values can be
/// compared where member order is not significant.
func unordered(_ value: JSON) -> JSON {
    switch value {
    case .object(let object):
        let members = object.members.map { ($0.key, unordered($0.value)) }.sorted { $0.0 < $1.0 }
        return .object(JSONObject(members))
    case .array(let elements):
        return .array(elements.map(unordered))
    default:
        return value
    }
}

/// Whether `bytes` parse to `expected`, ignoring member order.
func sameJSON(_ bytes: [UInt8], _ expected: JSON) throws -> Bool {
    unordered(try parsed(bytes)) == unordered(expected)
}

/// Header fields as "name: value" lines, order kept.
func lines(_ fields: [(name: String, value: String)]) -> [String] {
    fields.map { "\($0.name): \($0.value)" }
}

/// Header fields as a map (names are unique in every request built here).
func map(_ fields: [(name: String, value: String)]) -> [String: String] {
    Dictionary(uniqueKeysWithValues: fields.map { ($0.name, $0.value) })
}

enum Fixture {
    static let now: Int64 = 1_700_000_000
    static let alert = PushAlert(locKey: "NEW_MESSAGE", locArgs: ["Alice"], titleLocKey: "NEW_TITLE")
    static let data: [(key: String, value: String)] = [("thread_id", "t1"), ("message_id", "m9")]

    static func notification(
        data: [(key: String, value: String)] = Fixture.data, alert: PushAlert? = Fixture.alert,
        badge: Int? = 3, badgePerUser: [String: Int] = [:], collapseKey: String? = "thread-t1",
        priority: PushPriority? = nil, ttl: Int? = nil
    ) -> PushMessage {
        PushMessage(
            kind: .notification, data: data, alert: alert, badge: badge, badgePerUser: badgePerUser,
            collapseKey: collapseKey, priority: priority, ttlSeconds: ttl)
    }

    static func message(
        _ kind: PushKind, data: [(key: String, value: String)] = [], badge: Int? = nil,
        collapseKey: String? = nil, priority: PushPriority? = nil, ttl: Int? = nil
    ) -> PushMessage {
        PushMessage(
            kind: kind, data: data, badge: badge, collapseKey: collapseKey, priority: priority, ttlSeconds: ttl)
    }

    /// Data that exercises escaping: non-ASCII, an emoji, U+2028/U+2029, a quote,
    /// a backslash and a control character.
    static let awkward = "héllo 👋 \u{2028}line\u{2029} \"q\" \\ \n end"
    static let awkwardEscaped = #"héllo 👋 \u2028line\u2029 \"q\" \\ \n end"#
}

/// True when every character is in `[A-Za-z0-9_-]`.
func isBase64URL(_ text: String) -> Bool {
    text.utf8.allSatisfy {
        (0x41...0x5A).contains($0) || (0x61...0x7A).contains($0) || (0x30...0x39).contains($0) || $0 == 0x2D
            || $0 == 0x5F
    }
}
