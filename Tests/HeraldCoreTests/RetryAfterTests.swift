@testable import HeraldCore
import Testing

/// 1994-11-06T08:49:37Z, the RFC 9110 example date, in ms since the epoch.
private let rfcExample: Int64 = 784_111_777_000

@Suite("Retry-After")
struct RetryAfterTests {
    @Test("delta-seconds")
    func deltaSeconds() {
        #expect(RetryAfter.parse("120", now: 0) == .seconds(120))
        #expect(RetryAfter.parse("0", now: 0) == .zero)
        #expect(RetryAfter.parse(" 30\t", now: 0) == .seconds(30))
        #expect(RetryAfter.parse("007", now: 0) == .seconds(7))
        #expect(RetryAfter.parse("99999999999999999999999999", now: 0) == RetryAfter.maximum, "clamped, not overflowed")
    }

    @Test(
        "the three HTTP-date forms",
        arguments: [
            "Sun, 06 Nov 1994 08:49:37 GMT",  // IMF-fixdate
            "Sunday, 06-Nov-94 08:49:37 GMT",  // obsolete RFC 850
            "Sun Nov  6 08:49:37 1994",  // asctime
        ])
    func dateForms(_ header: String) {
        #expect(RetryAfter.parse(header, now: rfcExample - 37_000) == .seconds(37))
        #expect(RetryAfter.parse(header, now: rfcExample - 1_500) == .milliseconds(1_500))
        #expect(RetryAfter.parse(header, now: rfcExample) == .zero)
    }

    @Test("a date in the past gives zero")
    func pastDate() {
        #expect(RetryAfter.parse("Sun, 06 Nov 1994 08:49:37 GMT", now: 1_700_000_000_000) == .zero)
        #expect(RetryAfter.parse("Sun Nov  6 08:49:37 1994", now: rfcExample + 1) == .zero)
    }

    @Test("asctime with a two-digit day, and names in any case")
    func lenientForms() {
        let nov16 = rfcExample + 10 * 86_400_000
        #expect(RetryAfter.parse("Wed Nov 16 08:49:37 1994", now: nov16 - 1000) == .seconds(1))
        #expect(RetryAfter.parse("sun, 06 nov 1994 08:49:37 GMT", now: rfcExample - 1000) == .seconds(1))
    }

    @Test("RFC 850 two-digit years: more than 50 years ahead means the past century")
    func twoDigitYears() {
        // now = 2025-06-01T00:00:00Z
        let now = Int64(HTTPDate.daysFromCivil(year: 2025, month: 6, day: 1)) * 86_400_000
        let jan2026 = Int64(HTTPDate.daysFromCivil(year: 2026, month: 1, day: 1)) * 86_400_000
        #expect(RetryAfter.parse("Thursday, 01-Jan-26 00:00:00 GMT", now: now) == .milliseconds(jan2026 - now))
        // 2080 is 55 years ahead of 2025, so "80" is 1980: in the past.
        #expect(RetryAfter.parse("Tuesday, 01-Jan-80 00:00:00 GMT", now: now) == .zero)
        // 2070 is within 50 years: taken as 2070.
        let y2070 = Int64(HTTPDate.daysFromCivil(year: 2070, month: 1, day: 1)) * 86_400_000
        #expect(RetryAfter.parse("Wednesday, 01-Jan-70 00:00:00 GMT", now: now) == .milliseconds(y2070 - now))
    }

    @Test(
        "garbage is nil",
        arguments: [
            "", "   ", "soon", "-5", "+5", "1.5", "12abc", "1e3", "0x10",
            "Sun, 06 Nov 1994 08:49:37 UTC",  // only GMT
            "Sun, 06 Nov 1994 08:49:37",  // zone missing
            "Sun, 31 Feb 1994 08:49:37 GMT",  // no such day
            "Sun, 29 Feb 1995 08:49:37 GMT",  // not a leap year
            "Sun, 06 Foo 1994 08:49:37 GMT",  // no such month
            "Sun, 06 Nov 1994 24:00:00 GMT",  // hour out of range
            "Sun, 06 Nov 1994 08:60:00 GMT",  // minute out of range
            "Sun, 06 Nov 1994 08:49 GMT",  // seconds missing
            "Sun, 06 Nov 94 08:49:37 GMT",  // IMF needs four digits
            "Xyz, 06 Nov 1994 08:49:37 GMT",  // no such weekday
            "Sun 06 Nov 1994 08:49:37 GMT",  // comma missing
            "Funday, 06-Nov-94 08:49:37 GMT",
            "Sunday, 06-Nov-1994 08:49:37 GMT",  // RFC 850 has two-digit years
            "Sunday, 06/Nov/94 08:49:37 GMT",
            "Sun Nov  6 08:49:37",  // asctime year missing
            "Sun Nov 6 8:49:37 1994",  // two-digit hour required
        ])
    func garbage(_ header: String) {
        #expect(RetryAfter.parse(header, now: 0) == nil)
    }

    @Test("calendar arithmetic round-trips across eras")
    func civil() {
        #expect(HTTPDate.daysFromCivil(year: 1970, month: 1, day: 1) == 0)
        #expect(HTTPDate.daysFromCivil(year: 2000, month: 3, day: 1) == 11_017)
        #expect(HTTPDate.daysFromCivil(year: 1969, month: 12, day: 31) == -1)
        for days in stride(from: -800_000, through: 800_000, by: 997) {
            let date = HTTPDate.civil(days: days)
            #expect(HTTPDate.daysFromCivil(year: date.year, month: date.month, day: date.day) == days)
        }
    }
}
