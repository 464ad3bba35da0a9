/// The `Retry-After` response header (RFC 9110 §10.2.3).
public enum RetryAfter {
    /// Longest delay a header can ask for; larger values are clamped so that
    /// millisecond arithmetic on the result cannot overflow.
    public static let maximum = Duration.seconds(100 * 365 * 86_400)

    /// The delay `header` asks for, measured from `now` (ms since the epoch):
    /// delta-seconds, or an HTTP-date in IMF-fixdate, obsolete RFC 850 or asctime
    /// form. A date in the past gives zero. Nil when the header is neither.
    public static func parse(_ header: String, now: Int64) -> Duration? {
        let text = header.trimmingASCIISpace()
        guard !text.isEmpty else { return nil }
        if text.utf8.allSatisfy(ASCII.isDigit) {
            let maxSeconds = maximum.components.seconds
            var seconds: Int64 = 0
            for byte in text.utf8 {
                seconds = seconds * 10 + Int64(byte - ASCII.zero)
                if seconds > maxSeconds { return maximum }
            }
            return .seconds(seconds)
        }
        guard let dateSeconds = HTTPDate.parse(text, now: now) else { return nil }
        let (dateMs, overflow) = dateSeconds.multipliedReportingOverflow(by: 1000)
        guard !overflow else { return nil }
        let delta = dateMs.subtractingReportingOverflow(now)
        guard !delta.overflow else { return nil }
        return min(maximum, .milliseconds(max(0, delta.partialValue)))
    }
}

/// HTTP-date parsing (RFC 9110 §5.6.7). Month and weekday names are matched
/// case-insensitively and runs of spaces are tolerated; the weekday must be a
/// real name but is not checked against the date.
enum HTTPDate {
    /// Seconds since the Unix epoch, or nil when `text` is not an HTTP-date.
    /// `now` (ms) resolves the two-digit year of the RFC 850 form.
    static func parse(_ text: String, now: Int64) -> Int64? {
        let fields = text.split(separator: " ", omittingEmptySubsequences: true).map(String.init)
        if fields.count == 6, fields[0].hasSuffix(","), shortDays.contains(fields[0].dropLast().lowercased()),
            fields[5] == "GMT"
        {
            // IMF-fixdate: Sun, 06 Nov 1994 08:49:37 GMT
            guard let day = number(fields[1], digits: 1...2), let month = month(fields[2]),
                let year = number(fields[3], digits: 4...4)
            else { return nil }
            return timestamp(year: year, month: month, day: day, time: fields[4])
        }
        if fields.count == 4, fields[0].hasSuffix(","), longDays.contains(fields[0].dropLast().lowercased()),
            fields[3] == "GMT"
        {
            // RFC 850: Sunday, 06-Nov-94 08:49:37 GMT
            let parts = fields[1].split(separator: "-", omittingEmptySubsequences: false).map(String.init)
            guard parts.count == 3, let day = number(parts[0], digits: 1...2), let month = month(parts[1]),
                let yy = number(parts[2], digits: 2...2)
            else { return nil }
            return timestamp(year: fullYear(twoDigit: yy, now: now), month: month, day: day, time: fields[2])
        }
        if fields.count == 5, shortDays.contains(fields[0].lowercased()) {
            // asctime: Sun Nov  6 08:49:37 1994
            guard let month = month(fields[1]), let day = number(fields[2], digits: 1...2),
                let year = number(fields[4], digits: 4...4)
            else { return nil }
            return timestamp(year: year, month: month, day: day, time: fields[3])
        }
        return nil
    }

    private static let shortDays: Set<String> = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
    private static let longDays: Set<String> = [
        "monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday",
    ]
    private static let months = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]

    private static func month(_ text: String) -> Int? {
        months.firstIndex(of: text.lowercased()).map { $0 + 1 }
    }

    private static func number(_ text: String, digits: ClosedRange<Int>) -> Int? {
        guard digits.contains(text.utf8.count), text.utf8.allSatisfy(ASCII.isDigit) else { return nil }
        return Int(text)
    }

    /// RFC 9110: a two-digit year more than 50 years in the future is the most
    /// recent past year with the same last two digits.
    private static func fullYear(twoDigit yy: Int, now: Int64) -> Int {
        let currentYear = civil(days: Int(now.floorDiv(86_400_000))).year
        var year = currentYear - currentYear % 100 + yy
        if year > currentYear + 50 { year -= 100 }
        return year
    }

    private static func timestamp(year: Int, month: Int, day: Int, time: String) -> Int64? {
        let hms = time.split(separator: ":", omittingEmptySubsequences: false).map(String.init)
        guard hms.count == 3, let h = number(hms[0], digits: 2...2), let m = number(hms[1], digits: 2...2),
            let s = number(hms[2], digits: 2...2), h < 24, m < 60, s <= 60,
            day >= 1, day <= daysIn(month: month, year: year)
        else { return nil }
        let days = Int64(daysFromCivil(year: year, month: month, day: day))
        return days * 86_400 + Int64(h * 3600 + m * 60 + s)
    }

    private static func isLeap(_ year: Int) -> Bool { year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) }

    private static func daysIn(month: Int, year: Int) -> Int {
        switch month {
        case 2: isLeap(year) ? 29 : 28
        case 4, 6, 9, 11: 30
        default: 31
        }
    }

    /// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
    static func daysFromCivil(year: Int, month: Int, day: Int) -> Int {
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let mp = (month + 9) % 12
        let doy = (153 * mp + 2) / 5 + day - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        return era * 146_097 + doe - 719_468
    }

    /// The date `days` after 1970-01-01.
    static func civil(days: Int) -> (year: Int, month: Int, day: Int) {
        let z = days + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let doe = z - era * 146_097
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let day = doy - (153 * mp + 2) / 5 + 1
        let month = mp < 10 ? mp + 3 : mp - 9
        return (yoe + era * 400 + (month <= 2 ? 1 : 0), month, day)
    }
}

private enum ASCII {
    static let zero = UInt8(ascii: "0")
    static func isDigit(_ byte: UInt8) -> Bool { (0x30...0x39).contains(byte) }
}

extension String {
    /// Without leading and trailing spaces and tabs (HTTP's OWS).
    fileprivate func trimmingASCIISpace() -> String {
        let bytes = Array(utf8)
        let isSpace: (UInt8) -> Bool = { $0 == 0x20 || $0 == 0x09 }
        guard let first = bytes.firstIndex(where: { !isSpace($0) }),
            let last = bytes.lastIndex(where: { !isSpace($0) })
        else { return "" }
        return String(decoding: bytes[first...last], as: UTF8.self)
    }
}

extension Int64 {
    /// Division rounding toward negative infinity.
    fileprivate func floorDiv(_ divisor: Int64) -> Int64 {
        let q = self / divisor
        return (self % divisor != 0 && (self < 0) != (divisor < 0)) ? q - 1 : q
    }
}
