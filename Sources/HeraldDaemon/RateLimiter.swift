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
