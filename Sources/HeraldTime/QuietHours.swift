/// Quiet hours: on each listed day (every day when `days` is nil) one quiet
/// period starts at `start` and ends at `end` the same day, or the next day
/// when `start > end` (it spans midnight). The days name the day a period
/// starts on: with only Friday listed, Saturday 01:00 inside Friday's
/// 22:00–07:00 period is quiet.
public struct QuietHours: Sendable, Hashable {
    public let start: LocalTime
    public let end: LocalTime
    /// The days a period starts on; nil for every day, empty for none.
    public let days: Set<Weekday>?

    /// Quiet hours from `start` to `end`; nil when they are equal.
    public init?(start: LocalTime, end: LocalTime, days: Set<Weekday>?) {
        guard start != end else { return nil }
        self.start = start
        self.end = end
        self.days = days
    }

    /// When `instant` lies in a quiet period (from its start, included, to
    /// its end, excluded, both wall-clock times turned into instants as
    /// `Zone.instant` does), the instant that period ends; else nil.
    ///
    /// A period that starts in a skipped hour starts when `Zone.instant` puts
    /// it; one across a change lasts as long as the clock says (01:00–04:00
    /// over a spring-forward is 2 real hours, over a fall-back 4).
    public func periodEnd(containing instant: Int64, in zone: Zone) -> Int64? {
        let local = zone.local(at: instant)
        let today = CivilCalendar.days(year: local.year, month: local.month, day: local.day)
        let spansMidnight = start > end
        var found: Int64?
        // The period begun yesterday may still run; tomorrow's only matters when a change moves the clock back past midnight.
        for day in (today - 1)...(today + 1) {
            if let days, !days.contains(Weekday(days: day)) { continue }
            let periodStart = zone.instant(days: day, minutes: start.minutes)
            let periodEnd = zone.instant(days: spansMidnight ? day + 1 : day, minutes: end.minutes)
            if periodStart <= instant && instant < periodEnd {
                found = Swift.max(found ?? periodEnd, periodEnd)
            }
        }
        return found
    }
}

/// The first instant at or after `instant` at which the wall clock in `zone`
/// reads `time` (hh:mm:00.000): that day's when it is still ahead or exactly
/// now, else the next day's. A time skipped on that day resolves as
/// `Zone.instant` does (moved forward by the gap), and is taken only when it
/// is still at or after `instant`; a repeated time counts once, at its
/// earlier instant, so a daily time comes once a day.
public func nextOccurrence(of time: LocalTime, atOrAfter instant: Int64, in zone: Zone) -> Int64 {
    let local = zone.local(at: instant)
    let today = CivilCalendar.days(year: local.year, month: local.month, day: local.day)
    // The next day's is always ahead, but for a change moving the clock back over midnight.
    for day in today...(today + 3) {
        let candidate = zone.instant(days: day, minutes: time.minutes)
        if candidate >= instant { return candidate }
    }
    return instant
}
