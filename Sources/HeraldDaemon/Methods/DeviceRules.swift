import HeraldCore
import HeraldJSON
import HeraldTime
import JSONRPC

/// Limits of the device preferences and of a message's topics and send time.
enum PreferenceLimits {
    /// Topics one device may want.
    static let maxDeviceTopics = 64
    /// Topics one message may carry.
    static let maxMessageTopics = 16
    /// Bytes of one topic (`mention`, `mailbox:inbox`).
    static let maxTopicBytes = 64
    /// Bytes of a time zone's name (IANA names are at most 30 or so).
    static let maxTimeZoneBytes = 64
    /// How far ahead `not_before` may be: the longest TTL there is
    /// (2,419,200 s, 28 days).
    static let maxNotBeforeAheadMs: Int64 = 2_419_200_000
}

// The params of each device's own rules (`device.register`,
// `device.update`) and of a message's topics and send time (`push.send`).
extension HeraldService {
    /// `time_zone`, `quiet_hours` (with `during` inside it, or beside it)
    /// and `topics`: absent keeps the stored value, `null` clears it.
    static func preferenceChanges(_ p: inout ParamReader) throws(RPCError) -> PreferenceChanges {
        var changes = PreferenceChanges()
        switch p.value("time_zone") {
        case nil: break
        case .null?: changes.timeZone = .clear
        case .string(let name)?: changes.timeZone = .set(try timeZone(name, p))
        default: throw p.invalid("time_zone", "must be a string (an IANA time zone such as Europe/Paris) or null")
        }
        let outerDuring = try p.enumeration("during", allowed: QuietMode.allCases.map(\.rawValue))
        switch p.value("quiet_hours") {
        case nil:
            if outerDuring != nil { throw p.invalid("during", "requires quiet_hours") }
        case .null?:
            if outerDuring != nil { throw p.invalid("during", "requires quiet_hours") }
            changes.quietHours = .clear
        case .object?:
            guard var q = try p.object("quiet_hours") else { break }
            changes.quietHours = .set(try quietHours(&q, outerDuring: outerDuring, p))
            try q.finish()
        default:
            throw p.invalid("quiet_hours", "must be an object {start, end, days?, during?} or null")
        }
        switch p.value("topics") {
        case nil: break
        case .null?: changes.topics = .clear
        default:
            changes.topics = .set(try topics(&p, "topics", maxCount: PreferenceLimits.maxDeviceTopics) ?? [])
        }
        return changes
    }

    /// A time zone of the system's tz database, by its IANA name.
    static func timeZone(_ name: String, _ p: ParamReader) throws(RPCError) -> String {
        if name.utf8.count > PreferenceLimits.maxTimeZoneBytes {
            throw p.invalid("time_zone", "must be at most \(PreferenceLimits.maxTimeZoneBytes) bytes")
        }
        // Files of the database that are not zones of their own: the host's
        // own zone (`localtime`), the rules' template, the placeholder, and the
        // `posix/` and `right/` copies (the latter counting leap seconds).
        let notZones = ["localtime", "posixrules", "Factory"]
        if notZones.contains(name) || name.hasPrefix("posix/") || name.hasPrefix("right/") {
            throw p.invalid("time_zone", "is not an IANA time zone (such as Europe/Paris or America/New_York)")
        }
        do {
            _ = try TimeZoneDatabase.shared.zone(name)
        } catch {
            throw p.invalid(
                "time_zone",
                "is not a time zone of the system's tz database (an IANA name such as Europe/Paris or America/New_York)"
            )
        }
        return name
    }

    private static func quietHours(
        _ q: inout ParamReader, outerDuring: String?, _ p: ParamReader
    ) throws(RPCError) -> QuietHoursRule {
        func clock(_ name: String) throws(RPCError) -> Int {
            guard let text = try q.string(name, required: true, maxBytes: 16, allowEmpty: true, content: .text),
                let minutes = QuietHoursRule.minutes(text)
            else { throw q.invalid(name, "must be a time of day \"HH:MM\", 00:00 to 23:59") }
            return minutes
        }
        let start = try clock("start")
        let end = try clock("end")
        if start == end { throw q.invalid("end", "must differ from start (a quiet period of no length or all day)") }
        var days: [Int]?
        if let names = try q.stringArray("days", minCount: 1, maxCount: 7, maxBytes: 8, allowEmpty: true) {
            var seen = Set<Int>()
            for (i, name) in names.enumerated() {
                guard let index = QuietHoursRule.dayNames.firstIndex(of: name) else {
                    throw .invalidParams(
                        field: q.path("days") + "[\(i)]", reason: "must be one of mon, tue, wed, thu, fri, sat, sun")
                }
                guard seen.insert(index + 1).inserted else {
                    throw .invalidParams(field: q.path("days") + "[\(i)]", reason: "is listed twice")
                }
            }
            days = seen.sorted()
        }
        let innerDuring = try q.enumeration("during", allowed: QuietMode.allCases.map(\.rawValue))
        if innerDuring != nil && outerDuring != nil {
            throw p.invalid("during", "give during once, inside quiet_hours or beside it")
        }
        let during = QuietMode(rawValue: innerDuring ?? outerDuring ?? QuietMode.hold.rawValue) ?? .hold
        return QuietHoursRule(start: start, end: end, days: days, during: during)
    }

    /// A list of topics: each 1 to 64 bytes of printable characters, no
    /// spaces; each once.
    static func topics(
        _ p: inout ParamReader, _ name: String, minCount: Int = 0, maxCount: Int
    ) throws(RPCError) -> [String]? {
        guard
            let list = try p.stringArray(
                name, minCount: minCount, maxCount: maxCount, maxBytes: PreferenceLimits.maxTopicBytes,
                allowEmpty: true, content: .text)
        else { return nil }
        var seen = Set<String>()
        for (i, topic) in list.enumerated() {
            let field = p.path(name) + "[\(i)]"
            if topic.isEmpty { throw .invalidParams(field: field, reason: "must not be empty") }
            if topic.unicodeScalars.contains(where: {
                $0.value <= 0x20 || (0x7F...0x9F).contains($0.value) || $0.properties.isWhitespace
            }) {
                throw .invalidParams(field: field, reason: "must not contain spaces or control characters")
            }
            if !seen.insert(topic).inserted { throw .invalidParams(field: field, reason: "is listed twice") }
        }
        return list
    }

    /// `not_before` (an RFC 3339 instant, at most 28 days ahead; one past
    /// is at once) or `at_local` (`"HH:MM"` on each device's own clock).
    static func sendTime(_ p: inout ParamReader, kind: PushKind, now: Int64) throws(RPCError) -> SendTime? {
        let notBefore = try p.string("not_before", maxBytes: 64, allowEmpty: true, content: .text)
        let atLocal = try p.string("at_local", maxBytes: 16, allowEmpty: true, content: .text)
        if notBefore != nil && atLocal != nil { throw p.invalid("at_local", "give not_before or at_local, not both") }
        if kind == .callRing && (notBefore != nil || atLocal != nil) {
            throw p.invalid(notBefore != nil ? "not_before" : "at_local", "is not for call_ring (a call rings now)")
        }
        if let text = notBefore {
            guard let at = Timestamp.parse(text) else {
                throw p.invalid(
                    "not_before", "must be an RFC 3339 date-time with Z or an offset (2026-12-24T09:00:00+01:00)")
            }
            if at - now > PreferenceLimits.maxNotBeforeAheadMs {
                throw p.invalid("not_before", "must be at most 28 days ahead (the longest TTL)")
            }
            return .notBefore(at)
        }
        if let text = atLocal {
            guard let minutes = QuietHoursRule.minutes(text) else {
                throw p.invalid("at_local", "must be a time of day \"HH:MM\", 00:00 to 23:59")
            }
            return .atLocal(minutes)
        }
        return nil
    }

    /// A device's preferences as `device.list` shows them.
    static func preferencesJSON(_ d: DevicePreferences, into o: inout JSONObject) {
        o.append("time_zone", d.timeZone.map { .string($0) } ?? .null)
        if let q = d.quietHours {
            var quiet: JSONObject = [
                "start": .string(QuietHoursRule.clock(q.start)), "end": .string(QuietHoursRule.clock(q.end)),
            ]
            quiet.append("days", q.days.map { .array($0.map { .string(QuietHoursRule.dayNames[$0 - 1]) }) } ?? .null)
            quiet.append("during", .string(q.during.rawValue))
            o.append("quiet_hours", .object(quiet))
        } else {
            o.append("quiet_hours", .null)
        }
        o.append("topics", d.topics.map { .array($0.map(JSON.string)) } ?? .null)
    }
}
