import HeraldCore
import Testing

@testable import HeraldStore

/// ``TimingRules`` on the system's tz database, at instants chosen around
/// the clock changes of 2027 in both hemispheres (expected instants
/// cross-checked with Python's `zoneinfo` on the same tzdata).
@Suite("Each device's own rules across clock changes")
struct TimingRulesTests {
    private static let hour: Int64 = 3_600_000

    /// Milliseconds of an RFC 3339 UTC time `YYYY-MM-DDTHH:MM` (whole minutes).
    private static func utc(_ text: String) -> Int64 {
        let p = text.split(whereSeparator: { "-T:".contains($0) }).compactMap { Int64($0) }
        // Days from civil (H. Hinnant).
        let (y0, m, d) = (p[0], p[1], p[2])
        let y = m <= 2 ? y0 - 1 : y0
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1
        let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468
        return (days * 86_400 + p[3] * 3600 + p[4] * 60) * 1000
    }

    private static func prefs(
        _ zone: String, quiet: (Int, Int)? = nil, days: [Int]? = nil, during: QuietMode = .hold
    ) -> StoredPreferences {
        StoredPreferences(
            DevicePreferences(
                timeZone: zone,
                quietHours: quiet.map { QuietHoursRule(start: $0.0, end: $0.1, days: days, during: during) }))
    }

    private static let plain = PushMessage(kind: .notification)

    @Test("a quiet period that contains the skipped hour lasts two real hours (Paris, spring forward)")
    func skippedHour() {
        let p = Self.prefs("Europe/Paris", quiet: (60, 240))
        // 01:30 CET, inside 01:00–04:00: held to 04:00 CEST, 02:00Z.
        let t = TimingRules.decide(Self.plain, p, now: Self.utc("2027-03-28T00:30"))
        #expect(t.heldUntil == Self.utc("2027-03-28T02:00") && t.notes == [TimingNote.quietHold])
        // The period began at 01:00 CET (00:00Z): two real hours in all.
        #expect(TimingRules.decide(Self.plain, p, now: Self.utc("2027-03-27T23:59")).heldUntil == nil)
        // A period starting inside the skipped hour (02:30) starts at 03:30 CEST (01:30Z).
        let late = Self.prefs("Europe/Paris", quiet: (150, 300))
        #expect(TimingRules.decide(Self.plain, late, now: Self.utc("2027-03-28T01:15")).heldUntil == nil)
        #expect(
            TimingRules.decide(Self.plain, late, now: Self.utc("2027-03-28T01:45")).heldUntil
                == Self.utc("2027-03-28T03:00"))
    }

    @Test("a quiet period that contains the repeated hour lasts four real hours (Paris, fall back)")
    func repeatedHour() {
        let p = Self.prefs("Europe/Paris", quiet: (60, 240))
        // From 01:00 CEST (23:00Z the day before) to 04:00 CET (03:00Z).
        for now in ["2027-10-30T23:00", "2027-10-31T00:30", "2027-10-31T01:30", "2027-10-31T02:59"] {
            #expect(TimingRules.decide(Self.plain, p, now: Self.utc(now)).heldUntil == Self.utc("2027-10-31T03:00"))
        }
        #expect(TimingRules.decide(Self.plain, p, now: Self.utc("2027-10-31T03:00")).heldUntil == nil)
        #expect(TimingRules.decide(Self.plain, p, now: Self.utc("2027-10-30T22:59")).heldUntil == nil)
    }

    @Test("quiet hours across midnight in the southern hemisphere, at both of Sydney's changes")
    func sydney() {
        let p = Self.prefs("Australia/Sydney", quiet: (22 * 60, 7 * 60))
        // 23:00 AEDT on Saturday 3 April; the clocks go back at 03:00: 07:00 AEST is 21:00Z.
        #expect(
            TimingRules.decide(Self.plain, p, now: Self.utc("2027-04-03T12:00")).heldUntil
                == Self.utc("2027-04-03T21:00"))
        // 23:00 AEST on Saturday 2 October; forward at 02:00: 07:00 AEDT is 20:00Z.
        #expect(
            TimingRules.decide(Self.plain, p, now: Self.utc("2027-10-02T13:00")).heldUntil
                == Self.utc("2027-10-02T20:00"))
    }

    @Test("at_local: the device's next such time, by its own clock (New York across spring forward, Kolkata)")
    func atLocal() {
        var m = Self.plain
        m.sendTime = .atLocal(9 * 60)
        // Saturday 10:00 EST; Sunday 09:00 is EDT: 22 real hours on, not 23.
        let ny = TimingRules.decide(m, Self.prefs("America/New_York"), now: Self.utc("2027-03-13T15:00"))
        #expect(ny.heldUntil == Self.utc("2027-03-14T13:00") && ny.notes == [TimingNote.atLocal])
        // 13:30 IST (+05:30): tomorrow 09:00, 03:30Z.
        let kolkata = TimingRules.decide(m, Self.prefs("Asia/Kolkata"), now: Self.utc("2027-01-15T08:00"))
        #expect(kolkata.heldUntil == Self.utc("2027-01-16T03:30"))
        // No time zone: at once, and said.
        let none = TimingRules.decide(m, StoredPreferences(topics: "[]"), now: Self.utc("2027-01-15T08:00"))
        #expect(none.heldUntil == nil && none.notes == [TimingNote.atLocalNoTimeZone])
        // A zone the database does not have (any more): at once, and said.
        let gone = TimingRules.decide(m, StoredPreferences(timeZone: "Mars/Olympus"), now: Self.utc("2027-01-15T08:00"))
        #expect(gone.heldUntil == nil && gone.notes == [TimingNote.atLocalUnknownTimeZone])
        // An at_local time that falls in the quiet hours waits for their end too.
        let quietMorning = Self.prefs("Asia/Kolkata", quiet: (8 * 60, 10 * 60))
        let both = TimingRules.decide(m, quietMorning, now: Self.utc("2027-01-15T08:00"))
        #expect(both.heldUntil == Self.utc("2027-01-16T04:30"))
        #expect(both.notes == [TimingNote.atLocal, TimingNote.quietHold])
    }

    @Test("days name the day a period starts on; silent and drop; what breaks through")
    func daysModesBypass() {
        // Fridays 22:00–07:00 in Paris. Friday 23:00 CET: until Saturday 07:00 (06:00Z).
        let fri = Self.prefs("Europe/Paris", quiet: (22 * 60, 7 * 60), days: [5])
        #expect(
            TimingRules.decide(Self.plain, fri, now: Self.utc("2027-01-15T22:00")).heldUntil
                == Self.utc("2027-01-16T06:00"))
        // Saturday 06:00 is still Friday's period; Saturday 23:00 starts none.
        #expect(TimingRules.decide(Self.plain, fri, now: Self.utc("2027-01-16T05:00")).heldUntil != nil)
        #expect(TimingRules.decide(Self.plain, fri, now: Self.utc("2027-01-16T22:00")).heldUntil == nil)

        let silent = TimingRules.decide(
            Self.plain, Self.prefs("Europe/Paris", quiet: (22 * 60, 7 * 60), during: .silent),
            now: Self.utc("2027-01-15T22:00"))
        #expect(silent.silent && silent.heldUntil == nil && silent.notes == [TimingNote.quietSilent])
        #expect(TimingRules.isSilent(silent.stored))
        let drop = TimingRules.decide(
            Self.plain, Self.prefs("Europe/Paris", quiet: (22 * 60, 7 * 60), during: .drop),
            now: Self.utc("2027-01-15T22:00"))
        #expect(drop.skip == "quiet_hours")

        var ring = PushMessage(kind: .callRing)
        ring.quietBypass = PushMessage.quietBypass(
            kind: .callRing, interruptionLevel: nil, topics: nil, bypassTopics: [])
        let rang = TimingRules.decide(
            ring, Self.prefs("Europe/Paris", quiet: (22 * 60, 7 * 60)), now: Self.utc("2027-01-15T22:00"))
        #expect(rang.heldUntil == nil && rang.notes == ["quiet_hours:bypassed:call_ring"])
        // Outside the quiet hours nothing is noted, bypass or not.
        let day = TimingRules.decide(
            ring, Self.prefs("Europe/Paris", quiet: (22 * 60, 7 * 60)), now: Self.utc("2027-01-15T12:00"))
        #expect(day == .now)
    }

    @Test("a held row's next attempt is never past its send deadline")
    func deadline() {
        let t = DeliveryTiming(skip: nil, heldUntil: 10 * Self.hour, silent: false, notes: [TimingNote.notBefore])
        #expect(t.nextAttemptAt(acceptedAt: 0, expiresAt: Self.hour) == Self.hour + 2001)
        #expect(t.nextAttemptAt(acceptedAt: 0, expiresAt: 20 * Self.hour) == 10 * Self.hour)
        #expect(DeliveryTiming.now.nextAttemptAt(acceptedAt: 5, expiresAt: 10) == 5)
    }
}
