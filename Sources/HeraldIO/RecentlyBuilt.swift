/// What was built for the last few keys: a provider request made once per
/// message and handed to each of its devices, not made again per device.
///
/// A fan-out sends one message's deliveries one after another, so a handful
/// of entries (the most recent first) catch nearly every push; a retry or an
/// interleaved message that misses simply builds again. Bounded by `capacity`.
public final class RecentlyBuilt<Key: Hashable & Sendable, Value: Sendable>: Sendable {
    private let entries: Locked<[(key: Key, value: Value)]>
    private let capacity: Int

    public init(capacity: Int = 8) {
        precondition(capacity > 0)
        self.capacity = capacity
        entries = Locked([])
    }

    /// The value built for `key`, building it (outside the lock) when none
    /// is held. Two threads may both build for a new key: the value must
    /// depend on the key alone.
    public func value(for key: Key, build: () -> Value) -> Value {
        if let hit = entries.withLock({ e in e.first { $0.key == key }?.value }) { return hit }
        let value = build()
        entries.withLock { e in
            if e.count >= capacity { e.removeLast() }
            e.insert((key, value), at: 0)
        }
        return value
    }

    /// How many values are held.
    public var count: Int { entries.withLock { $0.count } }
}
