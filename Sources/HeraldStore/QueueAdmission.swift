/// `[delivery] max_queued` shared among the apps (SPEC "Shared bounds"): no
/// app can hold all of it while another app may still need room.
///
/// Up to half of the limit every message is admitted. Past half, an app is
/// admitted only while its own deliveries (waiting and in flight) with the
/// message's stay within its share: the limit divided among the apps with
/// work, this one included, and one seat more while some configured app has
/// none (PostgreSQL keeps connections for a role that is not connected yet in
/// the same spirit). An app alone on a daemon configured with one app has
/// the whole limit, as before.
public enum QueueAdmission {
    /// Why a message of `app` adding `adding` deliveries is refused, or nil
    /// when it is admitted. `total`: deliveries waiting and in flight;
    /// `byApp`: the same per app; `apps`: the apps configured.
    public static func refusal(
        app: String, adding: Int, total: Int, byApp: [String: Int], limit: Int, apps: Int
    ) -> EnqueueError? {
        if total + adding > limit { return .queueFull(pending: total, limit: limit) }
        guard apps > 1, total + adding > limit / 2 else { return nil }
        let mine = byApp[app] ?? 0
        let withWork = 1 + byApp.count { $0.key != app && $0.value > 0 }
        let seats = withWork < apps ? withWork + 1 : withWork
        let share = limit / seats
        return mine + adding > share ? .queueFull(pending: mine, limit: share) : nil
    }

    /// Whether `refusal` may refuse with these figures: the per-app ones are
    /// needed only then.
    public static func contended(adding: Int, total: Int, limit: Int, apps: Int) -> Bool {
        total + adding > limit || (apps > 1 && total + adding > limit / 2)
    }
}
