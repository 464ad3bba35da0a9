/// A map that holds at most `capacity` entries and, when full, forgets the
/// one used least recently (SPEC.md Revision 2: the VAPID token cache, the
/// resolver caches and per-origin state hold 4,096 entries each).
///
/// A value type without locking: its owner keeps it under a `Locked`.
/// `get` and `set` count as a use; `peek` does not. Every operation is O(1)
/// except `removeAll(where:)`.
package struct LRUCache<Key: Hashable, Value> {
    /// The default bound of every per-origin or per-host map in Web Push.
    package static var defaultCapacity: Int { 4096 }

    package let capacity: Int

    private struct Node {
        var key: Key
        var value: Value
        var older: Int  // -1: none
        var newer: Int  // -1: none
    }

    private var index: [Key: Int] = [:]
    private var nodes: [Node] = []
    private var free: [Int] = []
    private var newest = -1
    private var oldest = -1

    package init(capacity: Int = LRUCache.defaultCapacity) {
        self.capacity = max(1, capacity)
    }

    package var count: Int { index.count }
    package var isEmpty: Bool { index.isEmpty }

    /// The value for `key`, which becomes the most recently used.
    package mutating func get(_ key: Key) -> Value? {
        guard let slot = index[key] else { return nil }
        touch(slot)
        return nodes[slot].value
    }

    /// The value for `key`, leaving the order as it is.
    package func peek(_ key: Key) -> Value? {
        index[key].map { nodes[$0].value }
    }

    /// Stores `value` as the most recently used; returns the entry evicted to make room, if any.
    @discardableResult
    package mutating func set(_ key: Key, _ value: Value) -> (key: Key, value: Value)? {
        if let slot = index[key] {
            nodes[slot].value = value
            touch(slot)
            return nil
        }
        var evicted: (key: Key, value: Value)?
        if index.count >= capacity, oldest >= 0 {
            let victim = nodes[oldest]
            evicted = (victim.key, victim.value)
            remove(victim.key)
        }
        let node = Node(key: key, value: value, older: newest, newer: -1)
        let slot: Int
        if let reused = free.popLast() {
            nodes[reused] = node
            slot = reused
        } else {
            nodes.append(node)
            slot = nodes.count - 1
        }
        if newest >= 0 { nodes[newest].newer = slot }
        newest = slot
        if oldest < 0 { oldest = slot }
        index[key] = slot
        return evicted
    }

    /// Forgets `key`; returns its value.
    @discardableResult
    package mutating func remove(_ key: Key) -> Value? {
        guard let slot = index.removeValue(forKey: key) else { return nil }
        unlink(slot)
        free.append(slot)
        let value = nodes[slot].value
        if index.isEmpty {
            nodes.removeAll(keepingCapacity: false)
            free.removeAll(keepingCapacity: false)
        }
        return value
    }

    /// Forgets every entry `predicate` accepts.
    package mutating func removeAll(where predicate: (Key, Value) -> Bool) {
        let doomed = index.compactMap { key, slot in predicate(key, nodes[slot].value) ? key : nil }
        for key in doomed { remove(key) }
    }

    package mutating func removeAll() {
        self = LRUCache(capacity: capacity)
    }

    /// The keys from least to most recently used.
    package var keysOldestFirst: [Key] {
        var out: [Key] = []
        out.reserveCapacity(count)
        var slot = oldest
        while slot >= 0 {
            out.append(nodes[slot].key)
            slot = nodes[slot].newer
        }
        return out
    }

    private mutating func touch(_ slot: Int) {
        guard slot != newest else { return }
        unlink(slot)
        nodes[slot].older = newest
        nodes[slot].newer = -1
        if newest >= 0 { nodes[newest].newer = slot }
        newest = slot
        if oldest < 0 { oldest = slot }
    }

    private mutating func unlink(_ slot: Int) {
        let older = nodes[slot].older
        let newer = nodes[slot].newer
        if older >= 0 { nodes[older].newer = newer } else { oldest = newer }
        if newer >= 0 { nodes[newer].older = older } else { newest = older }
        nodes[slot].older = -1
        nodes[slot].newer = -1
    }
}
