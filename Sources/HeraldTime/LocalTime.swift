/// A minute of the day on a wall clock, 00:00 to 23:59.
public struct LocalTime: Sendable, Hashable, Comparable {
    /// Minutes since midnight, 0 to 1439.
    public let minutes: Int

    /// Parses "HH:MM": exactly two digits each, hours 00–23, minutes 00–59.
    /// "24:00", "7:00", "12:60" and anything with spaces are refused.
    public init?(parsing text: String) {
        let bytes = Array(text.utf8)
        guard bytes.count == 5, bytes[2] == UInt8(ascii: ":") else { return nil }
        func digit(_ byte: UInt8) -> Int? {
            (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) ? Int(byte - UInt8(ascii: "0")) : nil
        }
        guard let h1 = digit(bytes[0]), let h2 = digit(bytes[1]), let m1 = digit(bytes[3]), let m2 = digit(bytes[4])
        else { return nil }
        let hours = h1 * 10 + h2
        let minutes = m1 * 10 + m2
        guard hours < 24, minutes < 60 else { return nil }
        self.minutes = hours * 60 + minutes
    }

    /// The time `minutes` after midnight; nil outside 0..<1440.
    public init?(minutes: Int) {
        guard (0..<1440).contains(minutes) else { return nil }
        self.minutes = minutes
    }

    /// The time as "HH:MM", as `init(parsing:)` reads it.
    public var text: String {
        let hours = minutes / 60
        let minutes = minutes % 60
        return (hours < 10 ? "0" : "") + String(hours) + ":" + (minutes < 10 ? "0" : "") + String(minutes)
    }

    public static func < (lhs: LocalTime, rhs: LocalTime) -> Bool {
        lhs.minutes < rhs.minutes
    }
}

/// A day of the week, numbered as ISO 8601 does (Monday 1 to Sunday 7).
public enum Weekday: Int, Sendable, CaseIterable, Hashable {
    case monday = 1
    case tuesday, wednesday, thursday, friday, saturday, sunday

    /// The day for its three-letter lowercase name: "mon" … "sun".
    public init?(name: String) {
        guard let day = Weekday.allCases.first(where: { $0.name == name }) else { return nil }
        self = day
    }

    /// The three-letter lowercase name: "mon" … "sun".
    public var name: String {
        switch self {
        case .monday: "mon"
        case .tuesday: "tue"
        case .wednesday: "wed"
        case .thursday: "thu"
        case .friday: "fri"
        case .saturday: "sat"
        case .sunday: "sun"
        }
    }

    /// The weekday of a day count since 1970-01-01 (a Thursday).
    init(days: Int) {
        // Monday 0 ... Sunday 6, then 1-based; floorMod keeps it in range.
        let mondayBased = CivilCalendar.floorMod(days + 3, 7)
        self = Weekday(rawValue: mondayBased + 1) ?? .monday
    }
}

/// A wall-clock reading in one zone: the local date, the minute of the day
/// and the second within that minute.
public struct LocalDate: Sendable, Hashable {
    public let year: Int
    /// 1 to 12.
    public let month: Int
    /// 1 to 31.
    public let day: Int
    /// Minute of the day, 0 to 1439.
    public let minutes: Int
    /// 0 to 59.
    public let second: Int
    public let weekday: Weekday

    /// The reading `localSeconds` after 1970-01-01T00:00:00 on the local clock.
    init(localSeconds: Int) {
        let days = CivilCalendar.floorDiv(localSeconds, CivilCalendar.secondsPerDay)
        let secondOfDay = localSeconds - days * CivilCalendar.secondsPerDay
        let date = CivilCalendar.date(days: days)
        year = date.year
        month = date.month
        day = date.day
        minutes = secondOfDay / 60
        second = secondOfDay % 60
        weekday = Weekday(days: days)
    }
}
