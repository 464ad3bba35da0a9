/// Proleptic Gregorian calendar arithmetic on days since 1970-01-01 (Howard
/// Hinnant's civil-date algorithms), exact for every `Int` day count in use.
public enum CivilCalendar {
    static let secondsPerDay = 86_400

    /// `a / b` rounded towards negative infinity (`b > 0`).
    static func floorDiv(_ a: Int, _ b: Int) -> Int {
        let q = a / b
        return a % b < 0 ? q - 1 : q
    }

    /// `a mod b` in `0..<b` (`b > 0`).
    static func floorMod(_ a: Int, _ b: Int) -> Int {
        let r = a % b
        return r < 0 ? r + b : r
    }

    /// Days since 1970-01-01 of a date with `month` in 1...12 and `day` in 1...31.
    public static func days(year: Int, month: Int, day: Int) -> Int {
        let y = month <= 2 ? year - 1 : year
        let era = floorDiv(y, 400)
        let yearOfEra = y - era * 400
        let monthFromMarch = (month + 9) % 12
        let dayOfYear = (153 * monthFromMarch + 2) / 5 + day - 1
        let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
        return era * 146_097 + dayOfEra - 719_468
    }

    /// The date `days` after 1970-01-01.
    static func date(days: Int) -> (year: Int, month: Int, day: Int) {
        let z = days + 719_468
        let era = floorDiv(z, 146_097)
        let dayOfEra = z - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let monthFromMarch = (5 * dayOfYear + 2) / 153
        let day = dayOfYear - (153 * monthFromMarch + 2) / 5 + 1
        let month = monthFromMarch < 10 ? monthFromMarch + 3 : monthFromMarch - 9
        return (yearOfEra + era * 400 + (month <= 2 ? 1 : 0), month, day)
    }

    /// Days since 1970-01-01 of a date whose month and day may lie outside
    /// their ranges: month 13 is January of the next year, day 0 the last day
    /// of the previous month (as `mktime` normalizes).
    static func normalizedDays(year: Int, month: Int, day: Int) -> Int {
        let monthIndex = month - 1
        let y = year + floorDiv(monthIndex, 12)
        return days(year: y, month: floorMod(monthIndex, 12) + 1, day: 1) + (day - 1)
    }

    static func isLeapYear(_ year: Int) -> Bool {
        year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
    }

    public static func daysInMonth(year: Int, month: Int) -> Int {
        switch month {
        case 2: return isLeapYear(year) ? 29 : 28
        case 4, 6, 9, 11: return 30
        default: return 31
        }
    }

    /// The year of the date `seconds` after 1970-01-01T00:00:00 (of any clock).
    static func year(ofSeconds seconds: Int) -> Int {
        date(days: floorDiv(seconds, secondsPerDay)).year
    }

    /// Day of the week of a day count, Sunday 0 to Saturday 6 (1970-01-01 was a Thursday).
    static func sundayBasedWeekday(days: Int) -> Int {
        floorMod(days + 4, 7)
    }
}
