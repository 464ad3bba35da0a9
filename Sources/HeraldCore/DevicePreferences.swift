/// What a device does with a push that comes during its quiet hours.
public enum QuietMode: String, Sendable, CaseIterable, Hashable {
    /// Held until the quiet period ends (if the TTL still allows); a newer
    /// message with the same collapse key replaces the held one.
    case hold
    /// Delivered at once without sound or banner where the platform allows.
    case silent
    /// Not delivered: `skipped` with reason `quiet_hours`.
    case drop
}

/// One device's quiet hours, in its own time zone: a period each listed day
/// (every day when `days` is nil) from `start` to `end` (minutes of the
/// day), spanning midnight when `start > end`. `days` (1 = Monday … 7 =
/// Sunday) name the day a period starts on.
public struct QuietHoursRule: Sendable, Hashable {
    public let start: Int
    public let end: Int
    public let days: [Int]?
    public let during: QuietMode

    public init(start: Int, end: Int, days: [Int]?, during: QuietMode) {
        self.start = start
        self.end = end
        self.days = days.map { Array(Set($0)).sorted() }
        self.during = during
    }

    /// The day names `days` uses, Monday first.
    public static let dayNames = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]

    /// "HH:MM" for a minute of the day.
    public static func clock(_ minutes: Int) -> String {
        let h = minutes / 60, m = minutes % 60
        return (h < 10 ? "0" : "") + String(h) + ":" + (m < 10 ? "0" : "") + String(m)
    }

    /// The minute of the day "HH:MM" names (two digits each, 00–23 and
    /// 00–59), or nil.
    public static func minutes(_ text: String) -> Int? {
        let b = Array(text.utf8)
        guard b.count == 5, b[2] == UInt8(ascii: ":"),
            b.enumerated().allSatisfy({ i, c in i == 2 || (0x30...0x39).contains(c) })
        else { return nil }
        let h = Int(b[0] - 0x30) * 10 + Int(b[1] - 0x30)
        let m = Int(b[3] - 0x30) * 10 + Int(b[4] - 0x30)
        guard h < 24, m < 60 else { return nil }
        return h * 60 + m
    }

    /// The stored form: `"22:00 07:00 hold"`, then the days when listed
    /// (`" fri,sat"`).
    public var stored: String {
        var s = Self.clock(start) + " " + Self.clock(end) + " " + during.rawValue
        if let days { s += " " + days.map { Self.dayNames[$0 - 1] }.joined(separator: ",") }
        return s
    }

    /// Reads ``stored``; nil when the text is not one.
    public init?(stored text: String) {
        let parts = text.split(separator: " ", omittingEmptySubsequences: false).map(String.init)
        guard parts.count == 3 || parts.count == 4, let start = Self.minutes(parts[0]),
            let end = Self.minutes(parts[1]), let during = QuietMode(rawValue: parts[2])
        else { return nil }
        var days: [Int]?
        if parts.count == 4 {
            var list: [Int] = []
            for name in parts[3].split(separator: ",") {
                guard let i = Self.dayNames.firstIndex(of: String(name)) else { return nil }
                list.append(i + 1)
            }
            days = list
        }
        self.init(start: start, end: end, days: days, during: during)
    }
}

/// A device's own rules for what it hears and when.
public struct DevicePreferences: Sendable, Hashable {
    /// An IANA time zone name (checked against the system's tz database).
    public var timeZone: String?
    public var quietHours: QuietHoursRule?
    /// The message topics the device wants; nil: every message.
    public var topics: [String]?

    public init(timeZone: String? = nil, quietHours: QuietHoursRule? = nil, topics: [String]? = nil) {
        self.timeZone = timeZone
        self.quietHours = quietHours
        self.topics = topics
    }

    public static let none = DevicePreferences()
}

/// One preference as a `device.register` or `device.update` call gives it:
/// absent (kept as stored), `null` (cleared), or a value.
public enum PreferenceChange<Value: Sendable & Hashable>: Sendable, Hashable {
    case keep
    case clear
    case set(Value)

    /// The value this change leaves, given the stored one.
    public func applied(to stored: Value?) -> Value? {
        switch self {
        case .keep: stored
        case .clear: nil
        case .set(let v): v
        }
    }

    public var isKeep: Bool {
        if case .keep = self { return true }
        return false
    }
}

/// The preferences a call changes; what it does not name stays as stored.
public struct PreferenceChanges: Sendable, Hashable {
    public var timeZone: PreferenceChange<String> = .keep
    public var quietHours: PreferenceChange<QuietHoursRule> = .keep
    public var topics: PreferenceChange<[String]> = .keep

    public init(
        timeZone: PreferenceChange<String> = .keep, quietHours: PreferenceChange<QuietHoursRule> = .keep,
        topics: PreferenceChange<[String]> = .keep
    ) {
        self.timeZone = timeZone
        self.quietHours = quietHours
        self.topics = topics
    }

    public var isEmpty: Bool { timeZone.isKeep && quietHours.isKeep && topics.isKeep }

    /// The preferences these changes leave on a device that stored `p`.
    public func applied(to p: DevicePreferences) -> DevicePreferences {
        DevicePreferences(
            timeZone: timeZone.applied(to: p.timeZone), quietHours: quietHours.applied(to: p.quietHours),
            topics: topics.applied(to: p.topics))
    }
}

/// A device whose preferences would have quiet hours and no time zone to
/// read them in: refused, nothing stored.
public struct PreferenceConflict: Error, Sendable, Equatable {
    public let field: String
    public let reason: String

    public init(field: String, reason: String) {
        self.field = field
        self.reason = reason
    }
}

/// When a message is to be sent, beside at once.
public enum SendTime: Sendable, Hashable {
    /// Not before this instant (milliseconds since the Unix epoch).
    case notBefore(Int64)
    /// At the next time each device's own clock reads this minute of the
    /// day (in its `time_zone`); a device without one is sent at once.
    case atLocal(Int)
}

/// Notes a delivery's timing carries in `push.status` (`timing`) and in
/// its events: why it waited, or why it did not.
public enum TimingNote {
    /// Held until `not_before`.
    public static let notBefore = "not_before"
    /// Held until the device's local `at_local` time.
    public static let atLocal = "at_local"
    /// `at_local` for a device without a time zone: sent at once.
    public static let atLocalNoTimeZone = "at_local:no_time_zone"
    /// `at_local` for a device whose time zone the system's tz database no
    /// longer has: sent at once.
    public static let atLocalUnknownTimeZone = "at_local:unknown_time_zone"
    /// Quiet hours stored with a time zone the system's tz database no
    /// longer has: not applied.
    public static let quietUnknownTimeZone = "quiet_hours:unknown_time_zone"
    /// Held to the end of the device's quiet period.
    public static let quietHold = "quiet_hours:hold"
    /// Sent during the quiet period without sound or banner.
    public static let quietSilent = "quiet_hours:silent"
    /// Dropped: the delivery is `skipped`, reason `quiet_hours`.
    public static let quietDrop = "quiet_hours:drop"
    /// Sent during the quiet period: the message breaks through (the rest
    /// says why: `call_ring`, `critical`, `time-sensitive`, `topic:<name>`).
    public static let quietBypassedPrefix = "quiet_hours:bypassed:"
}
