import HeraldTime
import Testing

/// Wall-clock times turned into instants. Expected values by hand from each
/// zone's rules, cross-checked with GNU `date -u -d ... +%s`: a skipped time
/// moves forward by the gap (RFC 5545, java.time), a repeated one takes its
/// earlier instant.
@Suite("Wall-clock times to instants")
struct ZoneInstantTests {
    @Test("an ordinary wall-clock time is its instant by the zone's offset")
    func ordinaryTimes() throws {
        let paris = try systemZone("Europe/Paris")
        #expect(paris.instant(year: 2026, month: 1, day: 15, minutes: 9 * 60) == utc(2026, 1, 15, 8))
        #expect(paris.instant(year: 2026, month: 7, day: 15, minutes: 9 * 60) == utc(2026, 7, 15, 7))
        let kolkata = try systemZone("Asia/Kolkata")
        #expect(kolkata.instant(year: 2026, month: 6, day: 11, minutes: 9 * 60) == utc(2026, 6, 11, 3, 30))
        let utcZone = try systemZone("UTC")
        #expect(utcZone.instant(year: 1969, month: 12, day: 31, minutes: 1439) == -minute)
    }

    @Test("Paris: a skipped time moves forward by the gap, a repeated one takes its earlier instant")
    func parisSkippedAndRepeatedHours() throws {
        let paris = try systemZone("Europe/Paris")
        // 02:30 does not exist on 2026-03-29: 03:30 CEST, 01:30Z.
        #expect(paris.instant(year: 2026, month: 3, day: 29, minutes: 150) == 1_774_747_800_000)
        #expect(paris.instant(year: 2026, month: 3, day: 29, minutes: 120) == utc(2026, 3, 29, 1))
        #expect(paris.instant(year: 2026, month: 3, day: 29, minutes: 180) == utc(2026, 3, 29, 1))
        #expect(paris.instant(year: 2026, month: 3, day: 29, minutes: 119) == utc(2026, 3, 29, 0, 59))
        // 02:30 comes twice on 2026-10-25: the earlier, CEST, 00:30Z.
        #expect(paris.instant(year: 2026, month: 10, day: 25, minutes: 150) == 1_792_888_200_000)
        #expect(paris.instant(year: 2026, month: 10, day: 25, minutes: 120) == utc(2026, 10, 25, 0))
        #expect(paris.instant(year: 2026, month: 10, day: 25, minutes: 180) == utc(2026, 10, 25, 2))
    }

    @Test("New York: a skipped time moves forward by the gap, a repeated one takes its earlier instant")
    func newYork() throws {
        let newYork = try systemZone("America/New_York")
        // 02:30 skipped on 2026-03-08: 03:30 EDT, 07:30Z.
        #expect(newYork.instant(year: 2026, month: 3, day: 8, minutes: 150) == 1_772_955_000_000)
        // 01:30 twice on 2026-11-01: the earlier, EDT, 05:30Z.
        #expect(newYork.instant(year: 2026, month: 11, day: 1, minutes: 90) == 1_793_511_000_000)
        #expect(newYork.instant(year: 2026, month: 11, day: 1, minutes: 120) == utc(2026, 11, 1, 7))
    }

    @Test("Sydney: a repeated time in April takes its earlier instant, a skipped one in October moves forward")
    func sydney() throws {
        let sydney = try systemZone("Australia/Sydney")
        // 02:30 twice on 2026-04-05: the earlier, AEDT (+11), 2026-04-04T15:30Z.
        #expect(sydney.instant(year: 2026, month: 4, day: 5, minutes: 150) == 1_775_316_600_000)
        // 02:30 skipped on 2026-10-04: 03:30 AEDT, 2026-10-03T16:30Z.
        #expect(sydney.instant(year: 2026, month: 10, day: 4, minutes: 150) == 1_791_045_000_000)
    }

    @Test("skipped and repeated times in 2090, past the file's last transition, follow its footer")
    func farFuture() throws {
        let paris = try systemZone("Europe/Paris")
        #expect(paris.instant(year: 2090, month: 3, day: 26, minutes: 150) == utc(2090, 3, 26, 1, 30))
        #expect(paris.instant(year: 2090, month: 10, day: 29, minutes: 150) == utc(2090, 10, 29, 0, 30))
    }

    @Test(
        "every whole minute of a changeover day reads back as itself, but a skipped one reads later by the gap",
        arguments: [
            ("Europe/Paris", 2026, 3, 29), ("Europe/Paris", 2026, 10, 25), ("Australia/Lord_Howe", 2026, 4, 5),
            ("Australia/Lord_Howe", 2026, 10, 4), ("America/New_York", 2090, 3, 12), ("America/New_York", 2090, 11, 5),
        ])
    func roundTripsThroughLocal(name: String, year: Int, month: Int, day: Int) throws {
        let zone = try systemZone(name)
        for minuteOfDay in 0..<1440 {
            let instant = zone.instant(year: year, month: month, day: day, minutes: minuteOfDay)
            let local = zone.local(at: instant)
            let offset = Int64(zone.offsetSeconds(at: instant) - zone.offsetSeconds(at: instant - hour))
            if [local.year, local.month, local.day, local.minutes] != [year, month, day, minuteOfDay] {
                // Only a skipped time may read differently, and then it reads later by the gap.
                let back = zone.instant(year: local.year, month: local.month, day: local.day, minutes: local.minutes)
                #expect(back == instant, "minute \(minuteOfDay)")
                #expect(offset > 0, "minute \(minuteOfDay)")
            }
            #expect(local.second == 0, "minute \(minuteOfDay)")
        }
    }

    @Test("fields out of range carry over into the next or previous day, month and year")
    func outOfRangeFieldsCarryOver() throws {
        let paris = try systemZone("Europe/Paris")
        let newYear = paris.instant(year: 2027, month: 1, day: 1, minutes: 0)
        #expect(paris.instant(year: 2026, month: 13, day: 1, minutes: 0) == newYear)
        #expect(paris.instant(year: 2026, month: 12, day: 32, minutes: 0) == newYear)
        #expect(paris.instant(year: 2026, month: 12, day: 31, minutes: 1440) == newYear)
        #expect(
            paris.instant(year: 2027, month: 1, day: 0, minutes: 0)
                == paris.instant(year: 2026, month: 12, day: 31, minutes: 0))
        #expect(
            paris.instant(year: 2027, month: 0, day: 1, minutes: 0)
                == paris.instant(year: 2026, month: 12, day: 1, minutes: 0))
        for value in [Int.min, -1, Int.max] {
            _ = paris.instant(year: value, month: value, day: value, minutes: value)
        }
    }
}
