/// Token buckets per key with bounded memory: at most `capacity` keys are
/// tracked, the least recently used is dropped first, and a key idle long
/// enough to have refilled completely is forgotten. Not thread-safe: the
/// event loop owns it.
final class RateLimiter<Key: Hashable> {
    let burst: Double
    let perMillisecond: Double
    let capacity: Int

    private final class Node {
        let key: Key
        var tokens: Double
        var updated: Int64
        var prev: Node?
        var next: Node?

        init(key: Key, tokens: Double, updated: Int64) {
            self.key = key
            self.tokens = tokens
            self.updated = updated
        }
    }

    private var nodes: [Key: Node] = [:]
    private var head: Node?  // most recent
    private var tail: Node?  // least recent

    /// `perMinute` tokens a minute, bursting to `burst` (by default the
    /// same number).
    init(perMinute: Int, burst: Int? = nil, capacity: Int = 100_000) {
        self.burst = Double(burst ?? perMinute)
        perMillisecond = Double(perMinute) / 60_000
        self.capacity = capacity
    }

    var count: Int { nodes.count }

    /// Takes `cost` tokens (one by default): nil when allowed, else
    /// milliseconds until they are available.
    func take(_ key: Key, now: Int64, cost: Double = 1) -> Int64? {
        let node: Node
        if let existing = nodes[key] {
            node = existing
            let refill = Double(max(0, now - node.updated)) * perMillisecond
            node.tokens = min(burst, node.tokens + refill)
            node.updated = now
            unlink(node)
        } else {
            node = Node(key: key, tokens: burst, updated: now)
            nodes[key] = node
            if nodes.count > capacity, let oldest = tail {
                unlink(oldest)
                nodes[oldest.key] = nil
            }
        }
        pushFront(node)
        if node.tokens >= cost {
            node.tokens -= cost
            return nil
        }
        return max(1, Int64(((cost - node.tokens) / perMillisecond).rounded(.up)))
    }

    /// Forgets keys whose buckets are full again (idle for a whole refill).
    func expireIdle(now: Int64) {
        let idle = Int64(burst / perMillisecond)
        while let oldest = tail, now - oldest.updated >= idle {
            unlink(oldest)
            nodes[oldest.key] = nil
        }
    }

    private func unlink(_ node: Node) {
        node.prev?.next = node.next
        node.next?.prev = node.prev
        if head === node { head = node.next }
        if tail === node { tail = node.prev }
        node.prev = nil
        node.next = nil
    }

    private func pushFront(_ node: Node) {
        node.next = head
        head?.prev = node
        head = node
        if tail == nil { tail = node }
    }
}

/// Paces calls per key: `perSecond` at most, `burst` at once; a call over
/// the pace is answered later, in its turn (as nginx's limit_req delays
/// requests past its rate instead of refusing them), and refused only when
/// its turn is more than `maxDelayMs` away. The generic cell rate
/// algorithm: one time per key, forgotten once it has passed. Not
/// thread-safe: the event loop owns it.
final class Pacer<Key: Hashable> {
    let intervalMs: Double
    let toleranceMs: Double
    let maxDelayMs: Double
    let capacity: Int
    /// When each key's next call is due at the pace, ms.
    private var due: [Key: Double] = [:]

    init(perSecond: Int, burst: Int, maxDelayMs: Int64, capacity: Int = 100_000) {
        intervalMs = 1000 / Double(max(1, perSecond))
        toleranceMs = Double(max(0, burst - 1)) * intervalMs
        self.maxDelayMs = Double(maxDelayMs)
        self.capacity = capacity
    }

    var count: Int { due.count }

    /// Milliseconds the call waits for its turn (0: none), taking it; nil
    /// when it would wait past `maxDelayMs` (nothing taken).
    func turn(_ key: Key, now: Int64, cost: Double = 1) -> Int64? {
        let t = Double(now)
        let tat = max(due[key] ?? t, t)
        let delay = max(0, tat - toleranceMs - t)
        if delay > maxDelayMs { return nil }
        if due[key] == nil && due.count >= capacity { expireIdle(now: now) }
        if due[key] != nil || due.count < capacity { due[key] = tat + intervalMs * cost }
        return Int64(delay.rounded(.up))
    }

    /// Forgets keys whose due time has passed (their next call is on time).
    func expireIdle(now: Int64) {
        let t = Double(now)
        due = due.filter { $0.value > t }
    }
}

/// What ``SystemCallLimiter`` says of a call.
enum SystemCallTurn: Equatable {
    /// Run it now.
    case now
    /// Run it after this many milliseconds: its turn at the pace.
    case after(Int64)
    /// Refuse it: the minute's allowance is spent until this many milliseconds.
    case refused(retryAfterMs: Int64)
}

/// `system.*` calls per peer uid: `perMinute` a minute, as many at once (a
/// client checking after each of thousands of calls that nothing changed
/// may), refused past that; and paced at a thirtieth of them a second (at
/// least ten; 200 at 6,000 a minute), a tenth of that at once: a client
/// calling in a loop as fast as it can is answered at that pace, its calls
/// waiting their turn (never more than a second), instead of taking the
/// loop from everyone else. `system.health` (no store, a small answer) has
/// an allowance of its own, fifty times larger, so that a monitor's probes
/// are answered whatever the same uid's figures calls did. Not thread-safe:
/// the event loop owns it.
final class SystemCallLimiter {
    private struct Allowance {
        let minute: RateLimiter<UInt32>
        let pacer: Pacer<UInt32>
        /// Calls a second at most.
        let pace: Int

        init(perMinute: Int) {
            minute = RateLimiter(perMinute: perMinute)
            pace = max(10, perMinute / 30)
            pacer = Pacer(perSecond: pace, burst: max(1, pace / 10), maxDelayMs: 1000)
        }

        func take(_ uid: UInt32, now: Int64) -> SystemCallTurn {
            if let wait = minute.take(uid, now: now) { return .refused(retryAfterMs: wait) }
            guard let delay = pacer.turn(uid, now: now) else {
                // A second's calls already wait: refused as past the allowance.
                return .refused(retryAfterMs: Int64(pacer.maxDelayMs))
            }
            return delay > 0 ? .after(delay) : .now
        }
    }

    private let figures: Allowance
    private let health: Allowance
    /// Figures calls a second at most.
    var pace: Int { figures.pace }
    /// How many `system.health` calls count as one figures call.
    static let healthPerCall = 50

    init(perMinute: Int) {
        figures = Allowance(perMinute: perMinute)
        health = Allowance(perMinute: perMinute * Self.healthPerCall)
    }

    func take(_ uid: UInt32, now: Int64, health isHealth: Bool = false) -> SystemCallTurn {
        (isHealth ? health : figures).take(uid, now: now)
    }

    func expireIdle(now: Int64) {
        for a in [figures, health] {
            a.minute.expireIdle(now: now)
            a.pacer.expireIdle(now: now)
        }
    }
}
