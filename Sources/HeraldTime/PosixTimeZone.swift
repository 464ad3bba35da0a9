/// The rule of a TZif footer: a POSIX TZ string such as
/// "CET-1CEST,M3.5.0,M10.5.0/3" (POSIX.1-2017 §8.3 with RFC 8536's
/// extensions: hours up to 167 and negative hours in transition times).
/// It gives the offset for every instant after the file's last transition.
struct PosixTimeZone: Sendable, Equatable {
    /// The day a change happens on.
    enum DateRule: Sendable, Equatable {
        /// "Jn": day 1 to 365, February 29 never counted.
        case julian(Int)
        /// "n": day 0 to 365, February 29 counted in leap years.
        case zeroBased(Int)
        /// "Mm.w.d": weekday d (0 Sunday) of week w (5: the last) of month m.
        case monthWeekDay(month: Int, week: Int, weekday: Int)
    }

    /// A change of offset: a day and a local time on the clock in effect before it.
    struct Change: Sendable, Equatable {
        var date: DateRule
        /// Seconds after that day's local midnight; may be negative or pass 24 h.
        var time: Int
    }

    /// Daylight-saving time: its offset and when it starts and ends each year.
    struct Daylight: Sendable, Equatable {
        var offset: Int
        var start: Change
        var end: Change
    }

    /// Seconds east of UTC outside daylight-saving time.
    let standardOffset: Int
    let daylight: Daylight?

    /// Parses a TZ string; nil when it is not one.
    init?(parsing text: String) {
        var parser = Parser(bytes: Array(text.utf8))
        guard parser.name(), let standard = parser.signedTime(maxHours: 24) else { return nil }
        standardOffset = -standard
        if parser.atEnd {
            daylight = nil
            return
        }
        guard parser.name() else { return nil }
        var daylightOffset = standardOffset + 3600
        if !parser.atEnd && !parser.next(",") {
            guard let offset = parser.signedTime(maxHours: 24) else { return nil }
            daylightOffset = -offset
        }
        // POSIX leaves the rule of "EST5EDT" to the implementation; the US rule is tzcode's and glibc's.
        var start = Change(date: .monthWeekDay(month: 3, week: 2, weekday: 0), time: 7200)
        var end = Change(date: .monthWeekDay(month: 11, week: 1, weekday: 0), time: 7200)
        if !parser.atEnd {
            guard parser.take(","), let first = parser.change(), parser.take(","), let second = parser.change()
            else { return nil }
            start = first
            end = second
        }
        guard parser.atEnd else { return nil }
        daylight = Daylight(offset: daylightOffset, start: start, end: end)
    }

    /// The offset in effect at `seconds` since the epoch.
    func offset(atSeconds seconds: Int) -> Int {
        guard let daylight else { return standardOffset }
        let year = CivilCalendar.year(ofSeconds: seconds &+ standardOffset)
        var latest: (at: Int, isDaylight: Bool)?
        for event in events(years: (year - 1)...(year + 1), daylight) where event.at <= seconds {
            // Events are sorted, a start after an end at the same instant (daylight time all year).
            latest = event
        }
        return latest?.isDaylight == true ? daylight.offset : standardOffset
    }

    /// The changes of offset in `(after, through]`, in order, as (instant, new offset);
    /// `current` is the offset at `after`.
    func changes(after: Int, through: Int, current: Int) -> [(at: Int, offset: Int)] {
        guard let daylight, after < through else { return [] }
        let years = (CivilCalendar.year(ofSeconds: after) - 1)...(CivilCalendar.year(ofSeconds: through) + 1)
        let all = events(years: years, daylight)
        var result: [(at: Int, offset: Int)] = []
        var offset = current
        for (index, event) in all.enumerated() where event.at > after && event.at <= through {
            // Of several events at one instant the last one holds.
            if index + 1 < all.count && all[index + 1].at == event.at { continue }
            let next = event.isDaylight ? daylight.offset : standardOffset
            if next != offset {
                result.append((event.at, next))
                offset = next
            }
        }
        return result
    }

    /// Each year's start and end of daylight time as UTC seconds, sorted, an
    /// end before a start at the same instant.
    private func events(years: ClosedRange<Int>, _ daylight: Daylight) -> [(at: Int, isDaylight: Bool)] {
        var result: [(at: Int, isDaylight: Bool)] = []
        for year in years {
            result.append((Self.localSeconds(daylight.start, year: year) - standardOffset, true))
            result.append((Self.localSeconds(daylight.end, year: year) - daylight.offset, false))
        }
        return result.sorted { ($0.at, $0.isDaylight ? 1 : 0) < ($1.at, $1.isDaylight ? 1 : 0) }
    }

    /// Seconds since 1970-01-01T00:00:00 on the local clock at which `change` happens in `year`.
    private static func localSeconds(_ change: Change, year: Int) -> Int {
        let january1 = CivilCalendar.days(year: year, month: 1, day: 1)
        let day: Int
        switch change.date {
        case .julian(let n):
            day = january1 + n - 1 + (CivilCalendar.isLeapYear(year) && n >= 60 ? 1 : 0)
        case .zeroBased(let n):
            day = january1 + n
        case .monthWeekDay(let month, let week, let weekday):
            let first = CivilCalendar.days(year: year, month: month, day: 1)
            var offset = CivilCalendar.floorMod(weekday - CivilCalendar.sundayBasedWeekday(days: first), 7)
            offset += (week - 1) * 7
            let length = CivilCalendar.daysInMonth(year: year, month: month)
            while offset >= length { offset -= 7 }
            day = first + offset
        }
        return day * CivilCalendar.secondsPerDay + change.time
    }
}

/// A cursor over the bytes of a TZ string.
private struct Parser {
    let bytes: [UInt8]
    var index = 0

    var atEnd: Bool { index >= bytes.count }

    func next(_ character: Unicode.Scalar) -> Bool {
        !atEnd && bytes[index] == UInt8(ascii: character)
    }

    mutating func take(_ character: Unicode.Scalar) -> Bool {
        guard next(character) else { return false }
        index += 1
        return true
    }

    /// A zone abbreviation: letters, or "<...>" of letters, digits, '+' and '-'.
    mutating func name() -> Bool {
        if take("<") {
            let start = index
            while !atEnd, Self.isQuotable(bytes[index]) { index += 1 }
            return index > start && take(">")
        }
        let start = index
        while !atEnd, Self.isLetter(bytes[index]) { index += 1 }
        return index > start
    }

    /// "[+-]hh[:mm[:ss]]" as signed seconds, hours at most `maxHours`.
    mutating func signedTime(maxHours: Int) -> Int? {
        var sign = 1
        if take("-") {
            sign = -1
        } else {
            _ = take("+")
        }
        guard let hours = number(maxDigits: 3), hours <= maxHours else { return nil }
        var seconds = hours * 3600
        if take(":") {
            guard let minutes = number(maxDigits: 2), minutes < 60 else { return nil }
            seconds += minutes * 60
            if take(":") {
                guard let extra = number(maxDigits: 2), extra < 60 else { return nil }
                seconds += extra
            }
        }
        return sign * seconds
    }

    /// "Jn", "n" or "Mm.w.d", then an optional "/time" (02:00 when absent).
    mutating func change() -> PosixTimeZone.Change? {
        let date: PosixTimeZone.DateRule
        if take("J") {
            guard let n = number(maxDigits: 3), (1...365).contains(n) else { return nil }
            date = .julian(n)
        } else if take("M") {
            guard let month = number(maxDigits: 2), (1...12).contains(month), take("."),
                let week = number(maxDigits: 1), (1...5).contains(week), take("."),
                let weekday = number(maxDigits: 1), weekday <= 6
            else { return nil }
            date = .monthWeekDay(month: month, week: week, weekday: weekday)
        } else {
            guard let n = number(maxDigits: 3), n <= 365 else { return nil }
            date = .zeroBased(n)
        }
        var time = 7200
        if take("/") {
            guard let given = signedTime(maxHours: 167) else { return nil }
            time = given
        }
        return PosixTimeZone.Change(date: date, time: time)
    }

    /// One to `maxDigits` decimal digits.
    private mutating func number(maxDigits: Int) -> Int? {
        var value = 0
        var count = 0
        while !atEnd, count < maxDigits, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) {
            value = value * 10 + Int(bytes[index] - UInt8(ascii: "0"))
            index += 1
            count += 1
        }
        return count > 0 ? value : nil
    }

    private static func isLetter(_ byte: UInt8) -> Bool {
        (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(byte) || (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte)
    }

    private static func isQuotable(_ byte: UInt8) -> Bool {
        isLetter(byte) || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) || byte == UInt8(ascii: "+")
            || byte == UInt8(ascii: "-")
    }
}
