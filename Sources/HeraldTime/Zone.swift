/// One time zone of the tz database, loaded from its TZif file. All instants
/// are milliseconds since the Unix epoch.
public struct Zone: Sendable {
    /// The name it was loaded by, e.g. "Europe/Paris".
    public let name: String
    let rules: TZifRules

    init(name: String, rules: TZifRules) {
        self.name = name
        self.rules = rules
    }

    /// The UTC offset in effect at `instant`, in seconds east of UTC.
    public func offsetSeconds(at instant: Int64) -> Int {
        rules.offset(atSeconds: Self.seconds(instant))
    }

    /// The wall-clock date and time here at `instant`.
    public func local(at instant: Int64) -> LocalDate {
        let seconds = Self.seconds(instant)
        return LocalDate(localSeconds: seconds + rules.offset(atSeconds: seconds))
    }

    /// The instant a wall-clock time on a local date names, at its minute's
    /// start. A time in a skipped interval (spring forward) is moved forward
    /// by the gap's length: 02:30 in a 02:00→03:00 gap is 03:30 new time, as
    /// RFC 5545 and java.time resolve it. A repeated time (fall back) is the
    /// earlier of its two instants.
    ///
    /// A month or day out of range carries over (month 13 is January of the
    /// next year, day 0 the last day of the previous month) and so do minutes
    /// past 1439; values far beyond any calendar are clamped.
    public func instant(year: Int, month: Int, day: Int, minutes: Int) -> Int64 {
        let bound = 1 << 34
        let days = CivilCalendar.normalizedDays(
            year: Swift.min(Swift.max(year, -100_000_000), 100_000_000),
            month: Swift.min(Swift.max(month, -bound), bound), day: Swift.min(Swift.max(day, -bound), bound))
        let minutes = Swift.min(Swift.max(minutes, -bound), bound)
        return Self.milliseconds(utcSeconds(localSeconds: days * CivilCalendar.secondsPerDay + minutes * 60))
    }

    /// The instant a local day count and minute of the day name, resolved as `instant(year:month:day:minutes:)` does.
    func instant(days: Int, minutes: Int) -> Int64 {
        Self.milliseconds(utcSeconds(localSeconds: days * CivilCalendar.secondsPerDay + minutes * 60))
    }

    /// The UTC seconds whose local clock reads `local` (seconds since
    /// 1970-01-01T00:00:00 on that clock): the earliest of them, or in a gap
    /// the reading moved forward by the gap's length.
    func utcSeconds(localSeconds local: Int) -> Int {
        // Offsets stay within ±26 h, so every answer lies in this window.
        let window = 30 * 3600
        let from = local - window
        let changes = rules.changes(after: from, through: local + window)
        // The periods of one offset in order: the first valid reading is the earliest.
        var start = Int.min
        var offset = rules.offset(atSeconds: from)
        for index in 0...changes.count {
            let end = index < changes.count ? changes[index].at : Int.max
            let candidate = local - offset
            if candidate >= start && candidate < end { return candidate }
            if index < changes.count {
                start = changes[index].at
                offset = changes[index].after
            }
        }
        // No instant reads `local`: it lies in the gap a change forward opened.
        for change in changes where change.at + change.before <= local && local < change.at + change.after {
            return local - change.before
        }
        return local - rules.offset(atSeconds: from)
    }

    /// Whole seconds of a millisecond instant, rounded down.
    static func seconds(_ instant: Int64) -> Int {
        CivilCalendar.floorDiv(Int(instant), 1000)
    }

    /// Milliseconds of a seconds count, saturating at the ends of `Int64`.
    static func milliseconds(_ seconds: Int) -> Int64 {
        let (product, overflow) = Int64(seconds).multipliedReportingOverflow(by: 1000)
        guard overflow else { return product }
        return seconds < 0 ? .min : .max
    }
}
