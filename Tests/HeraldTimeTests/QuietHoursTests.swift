import HeraldTime
import XCTest

/// Quiet periods and daily times. Paris is at +02:00 (CEST) in June 2026;
/// 2026-06-10 is a Wednesday, 06-12 a Friday. Expected instants by hand,
/// through `utc` (Foundation's Gregorian calendar).
final class QuietHoursTests: XCTestCase {
    private func time(_ text: String) throws -> LocalTime {
        try XCTUnwrap(LocalTime(parsing: text), text)
    }

    private func quiet(_ start: String, _ end: String, _ days: Set<Weekday>? = nil) throws -> QuietHours {
        try XCTUnwrap(QuietHours(start: time(start), end: time(end), days: days))
    }

    func testEqualStartAndEndAreRefused() throws {
        XCTAssertNil(QuietHours(start: try time("22:00"), end: try time("22:00"), days: nil))
        XCTAssertNotNil(QuietHours(start: try time("22:00"), end: try time("22:01"), days: []))
    }

    func testPeriodSpanningMidnight() throws {
        let paris = try systemZone("Europe/Paris")
        let night = try quiet("22:00", "07:00")
        let end = utc(2026, 6, 11, 5)  // Thursday 07:00 CEST
        XCTAssertNil(night.periodEnd(containing: utc(2026, 6, 10, 20) - 1, in: paris))
        XCTAssertEqual(night.periodEnd(containing: utc(2026, 6, 10, 20), in: paris), end, "exactly at the start")
        XCTAssertEqual(night.periodEnd(containing: utc(2026, 6, 10, 21, 30), in: paris), end)
        XCTAssertEqual(night.periodEnd(containing: utc(2026, 6, 11, 1), in: paris), end, "after midnight")
        XCTAssertEqual(night.periodEnd(containing: end - 1, in: paris), end)
        XCTAssertNil(night.periodEnd(containing: end, in: paris), "exactly at the end")
        XCTAssertNil(night.periodEnd(containing: utc(2026, 6, 11, 12), in: paris))
    }

    func testPeriodWithinOneDay() throws {
        let paris = try systemZone("Europe/Paris")
        let lunch = try quiet("12:00", "13:30")
        XCTAssertEqual(lunch.periodEnd(containing: utc(2026, 6, 10, 10), in: paris), utc(2026, 6, 10, 11, 30))
        XCTAssertNil(lunch.periodEnd(containing: utc(2026, 6, 10, 11, 30), in: paris))
        XCTAssertNil(lunch.periodEnd(containing: utc(2026, 6, 10, 9, 59), in: paris))
    }

    /// The days name the day a period starts on.
    func testDays() throws {
        let paris = try systemZone("Europe/Paris")
        let weekend = try quiet("22:00", "07:00", [.friday, .saturday])
        XCTAssertNil(weekend.periodEnd(containing: utc(2026, 6, 11, 21), in: paris), "Thursday 23:00")
        XCTAssertEqual(
            weekend.periodEnd(containing: utc(2026, 6, 12, 21), in: paris), utc(2026, 6, 13, 5), "Friday 23:00")
        XCTAssertEqual(
            weekend.periodEnd(containing: utc(2026, 6, 13, 1), in: paris), utc(2026, 6, 13, 5),
            "Saturday 03:00 belongs to Friday's period")
        XCTAssertEqual(
            weekend.periodEnd(containing: utc(2026, 6, 13, 21), in: paris), utc(2026, 6, 14, 5), "Saturday 23:00")
        XCTAssertEqual(
            weekend.periodEnd(containing: utc(2026, 6, 14, 1), in: paris), utc(2026, 6, 14, 5),
            "Sunday 03:00 belongs to Saturday's period")
        XCTAssertNil(weekend.periodEnd(containing: utc(2026, 6, 14, 21), in: paris), "Sunday 23:00")
        XCTAssertNil(weekend.periodEnd(containing: utc(2026, 6, 15, 1), in: paris), "Monday 03:00")
        XCTAssertNil(try quiet("22:00", "07:00", []).periodEnd(containing: utc(2026, 6, 12, 21), in: paris))
    }

    /// 01:00–04:00 on 2026-03-29 in Paris: 01:00 CET (00:00Z) to 04:00 CEST (02:00Z), 2 real hours.
    func testPeriodOverTheSkippedHour() throws {
        let paris = try systemZone("Europe/Paris")
        let night = try quiet("01:00", "04:00")
        let start = utc(2026, 3, 29, 0)
        let end = utc(2026, 3, 29, 2)
        XCTAssertEqual(end - start, 2 * hour)
        XCTAssertNil(night.periodEnd(containing: start - 1, in: paris))
        XCTAssertEqual(night.periodEnd(containing: start, in: paris), end)
        XCTAssertEqual(night.periodEnd(containing: utc(2026, 3, 29, 1), in: paris), end, "03:00 CEST")
        XCTAssertEqual(night.periodEnd(containing: end - 1, in: paris), end)
        XCTAssertNil(night.periodEnd(containing: end, in: paris))
    }

    /// 01:00–04:00 on 2026-10-25 in Paris: 01:00 CEST (10-24T23:00Z) to 04:00 CET (03:00Z), 4 real hours.
    func testPeriodOverTheRepeatedHour() throws {
        let paris = try systemZone("Europe/Paris")
        let night = try quiet("01:00", "04:00")
        let start = utc(2026, 10, 24, 23)
        let end = utc(2026, 10, 25, 3)
        XCTAssertEqual(end - start, 4 * hour)
        XCTAssertNil(night.periodEnd(containing: start - 1, in: paris))
        XCTAssertEqual(night.periodEnd(containing: start, in: paris), end)
        XCTAssertEqual(night.periodEnd(containing: utc(2026, 10, 25, 0, 30), in: paris), end, "02:30 CEST")
        XCTAssertEqual(night.periodEnd(containing: utc(2026, 10, 25, 1, 30), in: paris), end, "02:30 CET")
        XCTAssertNil(night.periodEnd(containing: end, in: paris))
    }

    /// A period starting at 02:30 on 2026-03-29 starts when 02:30 resolves: 03:30 CEST, 01:30Z.
    func testPeriodStartingInTheSkippedHour() throws {
        let paris = try systemZone("Europe/Paris")
        let early = try quiet("02:30", "06:00")
        XCTAssertNil(early.periodEnd(containing: utc(2026, 3, 29, 1, 15), in: paris), "03:15 CEST")
        XCTAssertEqual(early.periodEnd(containing: utc(2026, 3, 29, 1, 30), in: paris), utc(2026, 3, 29, 4))
        XCTAssertNil(early.periodEnd(containing: utc(2026, 3, 29, 4), in: paris))
        // Spanning midnight into the change: Saturday 23:00 CET to Sunday 02:30, that is 03:30 CEST.
        let late = try quiet("23:00", "02:30")
        XCTAssertEqual(late.periodEnd(containing: utc(2026, 3, 29, 1, 15), in: paris), utc(2026, 3, 29, 1, 30))
        XCTAssertNil(late.periodEnd(containing: utc(2026, 3, 29, 1, 30), in: paris))
    }

    /// New York's night of 2026-10-31: 22:00 EDT (11-01T02:00Z) to 07:00 EST (12:00Z), 10 real hours.
    func testNightAcrossFallBackInNewYork() throws {
        let newYork = try systemZone("America/New_York")
        let night = try quiet("22:00", "07:00", [.saturday])
        XCTAssertEqual(night.periodEnd(containing: utc(2026, 11, 1, 2), in: newYork), utc(2026, 11, 1, 12))
        XCTAssertEqual(night.periodEnd(containing: utc(2026, 11, 1, 11, 59), in: newYork), utc(2026, 11, 1, 12))
        XCTAssertNil(night.periodEnd(containing: utc(2026, 11, 1, 12), in: newYork))
        XCTAssertNil(night.periodEnd(containing: utc(2026, 11, 1, 2) - 1, in: newYork))
    }

    func testNextOccurrence() throws {
        let paris = try systemZone("Europe/Paris")
        let nine = try time("09:00")
        XCTAssertEqual(
            nextOccurrence(of: nine, atOrAfter: utc(2026, 6, 10, 6), in: paris), utc(2026, 6, 10, 7), "later today")
        XCTAssertEqual(
            nextOccurrence(of: nine, atOrAfter: utc(2026, 6, 10, 7), in: paris), utc(2026, 6, 10, 7), "exactly now")
        XCTAssertEqual(
            nextOccurrence(of: nine, atOrAfter: utc(2026, 6, 10, 7) + 1, in: paris), utc(2026, 6, 11, 7),
            "a millisecond late: tomorrow")
        XCTAssertEqual(
            nextOccurrence(of: try time("07:00"), atOrAfter: utc(2026, 6, 10, 6), in: paris), utc(2026, 6, 11, 5),
            "passed: tomorrow")
        XCTAssertEqual(
            nextOccurrence(of: try time("00:00"), atOrAfter: utc(2026, 6, 10, 6), in: paris), utc(2026, 6, 10, 22),
            "midnight")
    }

    func testNextOccurrenceAcrossChanges() throws {
        let paris = try systemZone("Europe/Paris")
        let nine = try time("09:00")
        // Saturday 09:00 CET to Sunday 09:00 CEST, the day of the spring-forward: 23 hours.
        let saturday = utc(2026, 3, 28, 8)
        let sunday = nextOccurrence(of: nine, atOrAfter: saturday + 1, in: paris)
        XCTAssertEqual(sunday, utc(2026, 3, 29, 7))
        XCTAssertEqual(sunday - saturday, 23 * hour)
        // Over the fall-back: 25 hours.
        let before = utc(2026, 10, 24, 7)
        XCTAssertEqual(nextOccurrence(of: nine, atOrAfter: before + 1, in: paris) - before, 25 * hour)

        // A skipped time resolves as Zone.instant does, if still ahead.
        let skipped = try time("02:30")
        XCTAssertEqual(
            nextOccurrence(of: skipped, atOrAfter: utc(2026, 3, 29, 0, 30), in: paris), utc(2026, 3, 29, 1, 30))
        XCTAssertEqual(
            nextOccurrence(of: skipped, atOrAfter: utc(2026, 3, 29, 1, 15), in: paris), utc(2026, 3, 29, 1, 30))
        XCTAssertEqual(
            nextOccurrence(of: skipped, atOrAfter: utc(2026, 3, 29, 1, 45), in: paris), utc(2026, 3, 30, 0, 30),
            "03:45 CEST: the next day's 02:30 CEST")
        // A repeated time counts once a day, at its earlier instant.
        XCTAssertEqual(
            nextOccurrence(of: skipped, atOrAfter: utc(2026, 10, 24, 23), in: paris), utc(2026, 10, 25, 0, 30))
        XCTAssertEqual(
            nextOccurrence(of: skipped, atOrAfter: utc(2026, 10, 25, 0, 30) + 1, in: paris), utc(2026, 10, 26, 1, 30))
    }

    func testNextOccurrenceInKolkata() throws {
        let kolkata = try systemZone("Asia/Kolkata")
        let now = utc(2026, 6, 10, 20)  // 01:30 IST on 06-11
        XCTAssertEqual(nextOccurrence(of: try time("09:00"), atOrAfter: now, in: kolkata), utc(2026, 6, 11, 3, 30))
        XCTAssertEqual(nextOccurrence(of: try time("01:00"), atOrAfter: now, in: kolkata), utc(2026, 6, 11, 19, 30))
        XCTAssertEqual(nextOccurrence(of: try time("01:30"), atOrAfter: now, in: kolkata), now)
    }

    func testExtremesDoNotTrap() throws {
        let paris = try systemZone("Europe/Paris")
        let night = try quiet("22:00", "07:00")
        for instant in [Int64.min, Int64.max, Int64.max - 1] {
            _ = night.periodEnd(containing: instant, in: paris)
            _ = nextOccurrence(of: try time("23:59"), atOrAfter: instant, in: paris)
        }
    }
}
