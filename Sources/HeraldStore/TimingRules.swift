import HeraldCore
import HeraldJSON
import HeraldTime

/// A device's preferences as its row stores them, read only when a message
/// needs them: the time zone's name, the quiet hours' stored form
/// (``QuietHoursRule/stored``) and the topics as a JSON array.
struct StoredPreferences: Sendable, Equatable {
    var timeZone: String?
    var quietHours: String?
    var topics: String?

    static let none = StoredPreferences()

    var isEmpty: Bool { timeZone == nil && quietHours == nil && topics == nil }

    init(timeZone: String? = nil, quietHours: String? = nil, topics: String? = nil) {
        self.timeZone = timeZone
        self.quietHours = quietHours
        self.topics = topics
    }

    init(_ p: DevicePreferences) {
        timeZone = p.timeZone
        quietHours = p.quietHours?.stored
        topics = p.topics.map(Self.topicsText)
    }

    static func topicsText(_ topics: [String]) -> String {
        String(decoding: JSON.array(topics.map(JSON.string)).serialized(), as: UTF8.self)
    }

    var preferences: DevicePreferences {
        DevicePreferences(
            timeZone: timeZone, quietHours: quietHours.flatMap(QuietHoursRule.init(stored:)), topics: topicList)
    }

    /// The stored topics read back (nil: every message).
    var topicList: [String]? {
        topics.flatMap { text in (try? JSONParser.parse(Array(text.utf8)))?.arrayValue?.compactMap(\.stringValue) }
    }
}

/// What a device's own rules make of one delivery when its message is
/// accepted: skipped, held to a due time, sent silently, or sent at once;
/// and the notes `push.status` shows for it.
struct DeliveryTiming: Equatable {
    /// Why it is skipped (`not_subscribed`, `quiet_hours`); nil: it is sent.
    var skip: String?
    /// When a held delivery is due; nil: at once.
    var heldUntil: Int64?
    /// Sent without sound or banner (quiet hours, `silent`).
    var silent = false
    var notes: [String] = []

    static let now = DeliveryTiming()

    /// The stored form of the notes (`deliveries.timing`), comma-separated.
    var stored: String? { notes.isEmpty ? nil : notes.joined(separator: ",") }

    /// The row's `next_attempt_at`: a held delivery's due time, but never
    /// past its send deadline (the claim then finds it `expired`).
    func nextAttemptAt(acceptedAt: Int64, expiresAt: Int64) -> Int64 {
        guard let heldUntil else { return acceptedAt }
        let deadline = DeliveryJob.sendDeadline(expiresAt: expiresAt)
        return min(heldUntil, deadline == .max ? .max : deadline + 1)
    }
}

/// The rules both backends apply to each device when a message is accepted
/// (SPEC Revision 3, "Device preferences"), in this order:
/// 1. topics: a message with topics reaches a device with topics only when
///    they share one (`skipped`, `not_subscribed`); a message or a device
///    without topics meets every one;
/// 2. the send time: `not_before`, or `at_local` in the device's zone (a
///    device without one is sent at once, noted `at_local:no_time_zone`);
/// 3. quiet hours, at the time it would be sent: held to the period's end,
///    sent silently or dropped, unless the message breaks through (noted).
enum TimingRules {
    static func decide(
        _ m: PushMessage, _ p: StoredPreferences, now: Int64, zones: TimeZoneDatabase = .shared
    ) -> DeliveryTiming {
        if m.sendTime == nil && p.isEmpty { return .now }
        var t = DeliveryTiming()
        if let wanted = m.topics, let mine = p.topicList {
            if !wanted.contains(where: mine.contains) {
                t.skip = "not_subscribed"
                return t
            }
        }
        // The zone is read only when a rule needs it (a device may keep a
        // time zone without quiet hours, and most messages are not timed).
        var needsZone = p.quietHours != nil
        if case .atLocal? = m.sendTime { needsZone = true }
        let zone: Zone? = needsZone ? p.timeZone.flatMap { try? zones.zone($0) } : nil
        var due = now
        switch m.sendTime {
        case .notBefore(let at)?:
            if at > now {
                due = at
                t.notes.append(TimingNote.notBefore)
            }
        case .atLocal(let minutes)?:
            if let zone, let time = LocalTime(minutes: minutes) {
                due = nextOccurrence(of: time, atOrAfter: now, in: zone)
                t.notes.append(TimingNote.atLocal)
            } else {
                t.notes.append(p.timeZone == nil ? TimingNote.atLocalNoTimeZone : TimingNote.atLocalUnknownTimeZone)
            }
        case nil:
            break
        }
        if p.quietHours != nil && zone == nil {
            // Stored with a zone the tz database no longer has: not applied, and said.
            t.notes.append(TimingNote.quietUnknownTimeZone)
        }
        if let rule = p.quietHours.flatMap(QuietHoursRule.init(stored:)), let zone,
            let quiet = Self.quietHours(rule), let end = quiet.periodEnd(containing: due, in: zone)
        {
            if let why = m.quietBypass {
                t.notes.append(TimingNote.quietBypassedPrefix + why)
            } else {
                switch rule.during {
                case .hold:
                    due = end
                    t.notes.append(TimingNote.quietHold)
                case .silent:
                    t.silent = true
                    t.notes.append(TimingNote.quietSilent)
                case .drop:
                    t.skip = "quiet_hours"
                    t.notes.append(TimingNote.quietDrop)
                    return t
                }
            }
        }
        if due > now { t.heldUntil = due }
        return t
    }

    static func quietHours(_ rule: QuietHoursRule) -> QuietHours? {
        guard let start = LocalTime(minutes: rule.start), let end = LocalTime(minutes: rule.end) else { return nil }
        return QuietHours(
            start: start, end: end, days: rule.days.map { Set($0.compactMap(Weekday.init(rawValue:))) })
    }

    /// Whether the stored notes ask for a silent send.
    static func isSilent(_ stored: String?) -> Bool {
        guard let stored else { return false }
        return stored.split(separator: ",").contains { $0 == TimingNote.quietSilent }
    }
}
