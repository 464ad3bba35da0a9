/// Admits at most `limit` events in any window of `window` ms, exactly.
///
/// Keeps the times of the admitted events still inside the window in a ring
/// that grows on demand up to `limit` entries, so memory never exceeds `limit`
/// timestamps however many events are offered. Time never runs backwards
/// here: a `now` earlier than one already seen counts as that later time.
struct SlidingWindowLog: Sendable {
    let limit: Int
    let window: Int64
    private var ring: [Int64] = []
    private var head = 0
    private(set) var count = 0
    private var latest = Int64.min

    init(limit: Int, window: Int64) {
        self.limit = Swift.max(0, limit)
        self.window = window
    }

    /// Storage held, in timestamps (≤ `limit`).
    var storage: Int { ring.count }

    /// Admits one event at `now` if the window has room.
    mutating func admit(now: Int64) -> Bool {
        let now = advance(to: now)
        guard count < limit else { return false }
        if count == ring.count { grow() }
        ring[(head + count) % ring.count] = now
        count += 1
        return true
    }

    /// Events admitted in the window ending at `now`.
    mutating func occupancy(now: Int64) -> Int {
        _ = advance(to: now)
        return count
    }

    private mutating func advance(to time: Int64) -> Int64 {
        latest = Swift.max(latest, time)
        let (cutoff, overflow) = latest.subtractingReportingOverflow(window)
        while count > 0, !overflow, ring[head] <= cutoff {
            head = (head + 1) % ring.count
            count -= 1
        }
        if count == 0 { head = 0 }
        return latest
    }

    private mutating func grow() {
        let capacity = Swift.min(limit, Swift.max(16, ring.count * 2))
        var bigger = [Int64](repeating: 0, count: capacity)
        for i in 0..<count { bigger[i] = ring[(head + i) % ring.count] }
        ring = bigger
        head = 0
    }
}
