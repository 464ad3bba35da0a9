import HeraldTime
import Testing

/// Quiet periods and daily times. Paris is at +02:00 (CEST) in June 2026;
/// 2026-06-10 is a Wednesday, 06-12 a Friday. Expected instants by hand,
/// through `utc` (Foundation's Gregorian calendar).
@Suite("Quiet periods and the next occurrence of a time of day")
struct QuietHoursTests {
    private func time(_ text: String) throws -> LocalTime {
        try #require(LocalTime(parsing: text), "\(text)")
    }

    private func quiet(_ start: String, _ end: String, _ days: Set<Weekday>? = nil) throws -> QuietHours {
        try #require(QuietHours(start: time(start), end: time(end), days: days))
    }

    @Test("a period whose start equals its end is refused")
    func equalStartAndEndAreRefused() throws {
        #expect(QuietHours(start: try time("22:00"), end: try time("22:00"), days: nil) == nil)
        #expect(QuietHours(start: try time("22:00"), end: try time("22:01"), days: []) != nil)
    }

    @Test("a period across midnight runs from its start up to, not including, its end")
    func periodSpanningMidnight() throws {
        let paris = try systemZone("Europe/Paris")
        let night = try quiet("22:00", "07:00")
        let end = utc(2026, 6, 11, 5)  // Thursday 07:00 CEST
        #expect(night.periodEnd(containing: utc(2026, 6, 10, 20) - 1, in: paris) == nil)
        #expect(night.periodEnd(containing: utc(2026, 6, 10, 20), in: paris) == end, "exactly at the start")
        #expect(night.periodEnd(containing: utc(2026, 6, 10, 21, 30), in: paris) == end)
        #expect(night.periodEnd(containing: utc(2026, 6, 11, 1), in: paris) == end, "after midnight")
        #expect(night.periodEnd(containing: end - 1, in: paris) == end)
        #expect(night.periodEnd(containing: end, in: paris) == nil, "exactly at the end")
        #expect(night.periodEnd(containing: utc(2026, 6, 11, 12), in: paris) == nil)
    }

    @Test("a period within one day runs from its start up to, not including, its end")
    func periodWithinOneDay() throws {
        let paris = try systemZone("Europe/Paris")
        let lunch = try quiet("12:00", "13:30")
        #expect(lunch.periodEnd(containing: utc(2026, 6, 10, 10), in: paris) == utc(2026, 6, 10, 11, 30))
        #expect(lunch.periodEnd(containing: utc(2026, 6, 10, 11, 30), in: paris) == nil)
        #expect(lunch.periodEnd(containing: utc(2026, 6, 10, 9, 59), in: paris) == nil)
    }

    @Test("the days name the day a period starts on")
    func days() throws {
        let paris = try systemZone("Europe/Paris")
        let weekend = try quiet("22:00", "07:00", [.friday, .saturday])
        #expect(weekend.periodEnd(containing: utc(2026, 6, 11, 21), in: paris) == nil, "Thursday 23:00")
        #expect(weekend.periodEnd(containing: utc(2026, 6, 12, 21), in: paris) == utc(2026, 6, 13, 5), "Friday 23:00")
        #expect(
            weekend.periodEnd(containing: utc(2026, 6, 13, 1), in: paris) == utc(2026, 6, 13, 5),
            "Saturday 03:00 belongs to Friday's period")
        #expect(weekend.periodEnd(containing: utc(2026, 6, 13, 21), in: paris) == utc(2026, 6, 14, 5), "Saturday 23:00")
        #expect(
            weekend.periodEnd(containing: utc(2026, 6, 14, 1), in: paris) == utc(2026, 6, 14, 5),
            "Sunday 03:00 belongs to Saturday's period")
        #expect(weekend.periodEnd(containing: utc(2026, 6, 14, 21), in: paris) == nil, "Sunday 23:00")
        #expect(weekend.periodEnd(containing: utc(2026, 6, 15, 1), in: paris) == nil, "Monday 03:00")
        #expect(try quiet("22:00", "07:00", []).periodEnd(containing: utc(2026, 6, 12, 21), in: paris) == nil)
    }

    /// 01:00–04:00 on 2026-03-29 in Paris: 01:00 CET (00:00Z) to 04:00 CEST (02:00Z), 2 real hours.
    @Test("a period over the skipped hour lasts two real hours (Paris, spring forward)")
    func periodOverTheSkippedHour() throws {
        let paris = try systemZone("Europe/Paris")
        let night = try quiet("01:00", "04:00")
        let start = utc(2026, 3, 29, 0)
        let end = utc(2026, 3, 29, 2)
        #expect(end - start == 2 * hour)
        #expect(night.periodEnd(containing: start - 1, in: paris) == nil)
        #expect(night.periodEnd(containing: start, in: paris) == end)
        #expect(night.periodEnd(containing: utc(2026, 3, 29, 1), in: paris) == end, "03:00 CEST")
        #expect(night.periodEnd(containing: end - 1, in: paris) == end)
        #expect(night.periodEnd(containing: end, in: paris) == nil)
    }

    /// 01:00–04:00 on 2026-10-25 in Paris: 01:00 CEST (10-24T23:00Z) to 04:00 CET (03:00Z), 4 real hours.
    @Test("a period over the repeated hour lasts four real hours (Paris, fall back)")
    func periodOverTheRepeatedHour() throws {
        let paris = try systemZone("Europe/Paris")
        let night = try quiet("01:00", "04:00")
        let start = utc(2026, 10, 24, 23)
        let end = utc(2026, 10, 25, 3)
        #expect(end - start == 4 * hour)
        #expect(night.periodEnd(containing: start - 1, in: paris) == nil)
        #expect(night.periodEnd(containing: start, in: paris) == end)
        #expect(night.periodEnd(containing: utc(2026, 10, 25, 0, 30), in: paris) == end, "02:30 CEST")
        #expect(night.periodEnd(containing: utc(2026, 10, 25, 1, 30), in: paris) == end, "02:30 CET")
        #expect(night.periodEnd(containing: end, in: paris) == nil)
    }

    /// A period starting at 02:30 on 2026-03-29 starts when 02:30 resolves: 03:30 CEST, 01:30Z.
    @Test("a period starting or ending in the skipped hour starts or ends when that time resolves")
    func periodStartingInTheSkippedHour() throws {
        let paris = try systemZone("Europe/Paris")
        let early = try quiet("02:30", "06:00")
        #expect(early.periodEnd(containing: utc(2026, 3, 29, 1, 15), in: paris) == nil, "03:15 CEST")
        #expect(early.periodEnd(containing: utc(2026, 3, 29, 1, 30), in: paris) == utc(2026, 3, 29, 4))
        #expect(early.periodEnd(containing: utc(2026, 3, 29, 4), in: paris) == nil)
        // Spanning midnight into the change: Saturday 23:00 CET to Sunday 02:30, that is 03:30 CEST.
        let late = try quiet("23:00", "02:30")
        #expect(late.periodEnd(containing: utc(2026, 3, 29, 1, 15), in: paris) == utc(2026, 3, 29, 1, 30))
        #expect(late.periodEnd(containing: utc(2026, 3, 29, 1, 30), in: paris) == nil)
    }

    /// New York's night of 2026-10-31: 22:00 EDT (11-01T02:00Z) to 07:00 EST (12:00Z), 10 real hours.
    @Test("New York's Saturday night across the fall back lasts ten real hours")
    func nightAcrossFallBackInNewYork() throws {
        let newYork = try systemZone("America/New_York")
        let night = try quiet("22:00", "07:00", [.saturday])
        #expect(night.periodEnd(containing: utc(2026, 11, 1, 2), in: newYork) == utc(2026, 11, 1, 12))
        #expect(night.periodEnd(containing: utc(2026, 11, 1, 11, 59), in: newYork) == utc(2026, 11, 1, 12))
        #expect(night.periodEnd(containing: utc(2026, 11, 1, 12), in: newYork) == nil)
        #expect(night.periodEnd(containing: utc(2026, 11, 1, 2) - 1, in: newYork) == nil)
    }

    @Test("the next occurrence of a time of day is today until it passes, then tomorrow")
    func nextOccurrenceTodayOrTomorrow() throws {
        let paris = try systemZone("Europe/Paris")
        let nine = try time("09:00")
        #expect(
            nextOccurrence(of: nine, atOrAfter: utc(2026, 6, 10, 6), in: paris) == utc(2026, 6, 10, 7), "later today")
        #expect(
            nextOccurrence(of: nine, atOrAfter: utc(2026, 6, 10, 7), in: paris) == utc(2026, 6, 10, 7), "exactly now")
        #expect(
            nextOccurrence(of: nine, atOrAfter: utc(2026, 6, 10, 7) + 1, in: paris) == utc(2026, 6, 11, 7),
            "a millisecond late: tomorrow")
        #expect(
            nextOccurrence(of: try time("07:00"), atOrAfter: utc(2026, 6, 10, 6), in: paris) == utc(2026, 6, 11, 5),
            "passed: tomorrow")
        #expect(
            nextOccurrence(of: try time("00:00"), atOrAfter: utc(2026, 6, 10, 6), in: paris) == utc(2026, 6, 10, 22),
            "midnight")
    }

    @Test("the next occurrence across clock changes: 23- and 25-hour days, skipped and repeated times")
    func nextOccurrenceAcrossChanges() throws {
        let paris = try systemZone("Europe/Paris")
        let nine = try time("09:00")
        // Saturday 09:00 CET to Sunday 09:00 CEST, the day of the spring-forward: 23 hours.
        let saturday = utc(2026, 3, 28, 8)
        let sunday = nextOccurrence(of: nine, atOrAfter: saturday + 1, in: paris)
        #expect(sunday == utc(2026, 3, 29, 7))
        #expect(sunday - saturday == 23 * hour)
        // Over the fall-back: 25 hours.
        let before = utc(2026, 10, 24, 7)
        #expect(nextOccurrence(of: nine, atOrAfter: before + 1, in: paris) - before == 25 * hour)

        // A skipped time resolves as Zone.instant does, if still ahead.
        let skipped = try time("02:30")
        #expect(nextOccurrence(of: skipped, atOrAfter: utc(2026, 3, 29, 0, 30), in: paris) == utc(2026, 3, 29, 1, 30))
        #expect(nextOccurrence(of: skipped, atOrAfter: utc(2026, 3, 29, 1, 15), in: paris) == utc(2026, 3, 29, 1, 30))
        #expect(
            nextOccurrence(of: skipped, atOrAfter: utc(2026, 3, 29, 1, 45), in: paris) == utc(2026, 3, 30, 0, 30),
            "03:45 CEST: the next day's 02:30 CEST")
        // A repeated time counts once a day, at its earlier instant.
        #expect(nextOccurrence(of: skipped, atOrAfter: utc(2026, 10, 24, 23), in: paris) == utc(2026, 10, 25, 0, 30))
        #expect(
            nextOccurrence(of: skipped, atOrAfter: utc(2026, 10, 25, 0, 30) + 1, in: paris) == utc(2026, 10, 26, 1, 30))
    }

    @Test("the next occurrence in a half-hour zone (Kolkata)")
    func nextOccurrenceInKolkata() throws {
        let kolkata = try systemZone("Asia/Kolkata")
        let now = utc(2026, 6, 10, 20)  // 01:30 IST on 06-11
        #expect(nextOccurrence(of: try time("09:00"), atOrAfter: now, in: kolkata) == utc(2026, 6, 11, 3, 30))
        #expect(nextOccurrence(of: try time("01:00"), atOrAfter: now, in: kolkata) == utc(2026, 6, 11, 19, 30))
        #expect(nextOccurrence(of: try time("01:30"), atOrAfter: now, in: kolkata) == now)
    }

    @Test("extreme instants do not trap")
    func extremesDoNotTrap() throws {
        let paris = try systemZone("Europe/Paris")
        let night = try quiet("22:00", "07:00")
        for instant in [Int64.min, Int64.max, Int64.max - 1] {
            _ = night.periodEnd(containing: instant, in: paris)
            _ = nextOccurrence(of: try time("23:59"), atOrAfter: instant, in: paris)
        }
    }
}
