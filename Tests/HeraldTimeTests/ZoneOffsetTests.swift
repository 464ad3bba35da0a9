import Foundation
import HeraldTime
import Testing

/// Offsets and wall clocks. Expected instants were computed by hand from the
/// rules (EU: last Sunday of March/October at 01:00 UTC; US: second Sunday of
/// March, first of November at 02:00 local; New South Wales: first Sunday of
/// October and April at 02:00/03:00 local) and checked with GNU
/// `date -u -d ... +%s` and `zdump -v`.
@Suite("Offsets and wall clocks")
struct ZoneOffsetTests {
    /// Checks the offset one millisecond before and at a transition.
    private func expectTransition(
        _ zone: Zone, at instant: Int64, from before: Int, to after: Int,
        sourceLocation: SourceLocation = #_sourceLocation
    ) {
        #expect(zone.offsetSeconds(at: instant - 1) == before, "before", sourceLocation: sourceLocation)
        #expect(zone.offsetSeconds(at: instant) == after, "at", sourceLocation: sourceLocation)
    }

    @Test("Paris changes at 01:00 UTC on the last Sundays of March and October")
    func paris() throws {
        let paris = try systemZone("Europe/Paris")
        #expect(paris.name == "Europe/Paris")
        expectTransition(paris, at: 1_774_746_000_000, from: 3600, to: 7200)  // 2026-03-29T01:00Z
        expectTransition(paris, at: 1_792_890_000_000, from: 7200, to: 3600)  // 2026-10-25T01:00Z
        #expect(1_774_746_000_000 == utc(2026, 3, 29, 1))
    }

    @Test("New York changes at 02:00 local on the second Sunday of March and the first of November")
    func newYork() throws {
        let newYork = try systemZone("America/New_York")
        expectTransition(newYork, at: 1_772_953_200_000, from: -18000, to: -14400)  // 2026-03-08T07:00Z
        expectTransition(newYork, at: 1_793_512_800_000, from: -14400, to: -18000)  // 2026-11-01T06:00Z
    }

    @Test("Sydney has daylight time in the southern summer")
    func sydneyHasDaylightTimeInTheSouthernSummer() throws {
        let sydney = try systemZone("Australia/Sydney")
        #expect(sydney.offsetSeconds(at: utc(2026, 1, 15)) == 39600)
        #expect(sydney.offsetSeconds(at: utc(2026, 7, 15)) == 36000)
        expectTransition(sydney, at: 1_775_318_400_000, from: 39600, to: 36000)  // 2026-04-04T16:00Z
        expectTransition(sydney, at: 1_791_043_200_000, from: 36000, to: 39600)  // 2026-10-03T16:00Z
    }

    @Test(
        "Kolkata is at +05:30 all year, with no daylight time",
        arguments: [utc(2026, 1, 1), utc(2026, 7, 1), utc(2090, 3, 26, 1), utc(2200, 12, 31)])
    func kolkataHasAHalfHourOffsetAndNoDaylightTime(_ instant: Int64) throws {
        let kolkata = try systemZone("Asia/Kolkata")
        #expect(kolkata.offsetSeconds(at: instant) == 19800)
    }

    @Test("Kolkata's wall clock is 5 h 30 ahead, into the next day")
    func kolkataLocalTime() throws {
        let kolkata = try systemZone("Asia/Kolkata")
        let local = kolkata.local(at: utc(2026, 6, 10, 20))
        #expect([local.year, local.month, local.day, local.minutes] == [2026, 6, 11, 90] as [Int])
    }

    /// 2090 lies past the last transition even of a "fat" file (2037): only the footer's TZ string knows it.
    @Test("the far future's changes come from the footer")
    func farFutureUsesTheFooter() throws {
        let paris = try systemZone("Europe/Paris")
        expectTransition(paris, at: utc(2090, 3, 26, 1), from: 3600, to: 7200)
        expectTransition(paris, at: utc(2090, 10, 29, 1), from: 7200, to: 3600)
        let newYork = try systemZone("America/New_York")
        expectTransition(newYork, at: utc(2090, 3, 12, 7), from: -18000, to: -14400)
        expectTransition(newYork, at: utc(2090, 11, 5, 6), from: -14400, to: -18000)
        let sydney = try systemZone("Australia/Sydney")
        expectTransition(sydney, at: utc(2090, 4, 1, 16), from: 39600, to: 36000)
        expectTransition(sydney, at: utc(2090, 9, 30, 16), from: 36000, to: 39600)
    }

    @Test("the local date, time and weekday around a change, before 1970 and on a leap day")
    func localDate() throws {
        let paris = try systemZone("Europe/Paris")
        let beforeChange = paris.local(at: 1_774_746_000_000 - 1)
        #expect(
            [beforeChange.year, beforeChange.month, beforeChange.day, beforeChange.minutes, beforeChange.second]
                == [2026, 3, 29, 119, 59] as [Int])
        #expect(beforeChange.weekday == .sunday)
        let afterChange = paris.local(at: 1_774_746_000_000)
        #expect([afterChange.day, afterChange.minutes, afterChange.second] == [29, 180, 0] as [Int])

        let utcZone = try systemZone("UTC")
        let lastMillisecondOf1969 = utcZone.local(at: -1)
        #expect(
            [lastMillisecondOf1969.year, lastMillisecondOf1969.month, lastMillisecondOf1969.day] == [1969, 12, 31]
                as [Int])
        #expect([lastMillisecondOf1969.minutes, lastMillisecondOf1969.second] == [1439, 59] as [Int])
        #expect(lastMillisecondOf1969.weekday == .wednesday)
        let leapDay = utcZone.local(at: utc(2028, 2, 29, 12))
        #expect([leapDay.month, leapDay.day] == [2, 29] as [Int])
        #expect(leapDay.weekday == .tuesday)
    }

    @Test("extreme instants do not trap")
    func extremeInstantsDoNotTrap() throws {
        for name in ["Europe/Paris", "Australia/Sydney", "UTC"] {
            let zone = try systemZone(name)
            for instant in [Int64.min, Int64.min + 1, -1, 0, Int64.max - 1, Int64.max] {
                _ = zone.offsetSeconds(at: instant)
                _ = zone.local(at: instant)
            }
        }
    }

    static let sweepZones = [
        "Europe/Paris", "America/New_York", "Australia/Sydney", "Asia/Kolkata", "Europe/London", "Europe/Dublin",
        "Australia/Lord_Howe", "Pacific/Auckland", "Pacific/Chatham", "America/Los_Angeles", "America/Sao_Paulo",
        "Asia/Tokyo", "UTC",
    ]

    /// Every 6 hours over 2024–2027, 2040 and 2090 against Foundation's
    /// TimeZone (ICU's own copy of the tz data, an independent reading).
    /// Europe/Dublin's footer has negative daylight time, Lord Howe's a
    /// 30-minute shift, Chatham's a +12:45 offset.
    @Test("every 6 hours of 2024–2027, 2040 and 2090 agree with Foundation's TimeZone", arguments: sweepZones)
    func sweepAgainstFoundation(_ name: String) throws {
        var ranges = [(utc(2024, 1, 1), utc(2028, 1, 1)), (utc(2040, 1, 1), utc(2041, 1, 1))]
        ranges.append((utc(2090, 1, 1), utc(2091, 1, 1)))
        let zone = try systemZone(name)
        let oracle = try #require(TimeZone(identifier: name), "\(name)")
        var mismatches = 0
        for (from, to) in ranges {
            for instant in stride(from: from, to: to, by: Int(6 * hour)) {
                let expected = oracle.secondsFromGMT(for: Date(timeIntervalSince1970: Double(instant) / 1000))
                if zone.offsetSeconds(at: instant) != expected && mismatches < 5 {
                    mismatches += 1
                    Issue.record("\(name) at \(instant): \(zone.offsetSeconds(at: instant)), Foundation \(expected)")
                }
            }
        }
    }

    /// Every transition `zdump -v` lists for 2024–2028 and 2089–2091, to the second.
    @Test(
        "every transition zdump lists agrees, to the second", .enabled(if: zdumpPath != nil, "zdump is not installed"),
        arguments: sweepZones)
    func transitionsAgainstZdump(_ name: String) throws {
        let zone = try systemZone(name)
        for (from, to) in [(2024, 2028), (2089, 2091)] {
            let listed = try #require(
                try zdumpOffsets(zone: name, fromYear: from, toYear: to), "zdump is not installed")
            for (instant, offset) in listed {
                #expect(zone.offsetSeconds(at: instant) == offset, "\(name) at \(instant)")
                #expect(zone.offsetSeconds(at: instant + 999) == offset, "\(name) at \(instant)+999 ms")
            }
            if name != "Asia/Kolkata" && name != "Asia/Tokyo" && name != "UTC" && name != "America/Sao_Paulo" {
                #expect(listed.count > 4, "\(name): zdump listed no transitions")
            }
        }
    }
}
