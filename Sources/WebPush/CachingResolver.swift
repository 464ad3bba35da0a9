import HeraldCore
import HeraldIO

/// Remembers another resolver's answers for a short time, so a fan-out to
/// many subscriptions on one push service resolves its name once rather than
/// once per push. Failures are not remembered.
///
/// The send-time check stays sound: the guard still vets every address it is
/// given and the connection is pinned to a vetted one, so a name that turns
/// private is refused once its entry expires, and never reached before.
/// Registration checks use an uncached resolver.
public final class CachingResolver: HostResolver {
    public let base: any HostResolver
    /// How long an answer is reused, in milliseconds.
    public let ttlMs: Int64
    /// The most names remembered; the oldest entries go first.
    public let capacity: Int

    private struct Key: Hashable {
        let host: String
        let port: Int
    }

    private struct Entry {
        let addresses: [IPAddress]
        let storedAt: Int64
    }

    private let entries = Locked<[Key: Entry]>([:])
    private let lookups = Locked(0)

    public init(_ base: any HostResolver, ttl: Duration = .seconds(30), capacity: Int = 4096) {
        self.base = base
        self.ttlMs = ttl.wholeMilliseconds
        self.capacity = max(1, capacity)
    }

    /// Lookups passed to the base resolver (cache misses).
    public var baseLookups: Int { lookups.withLock { $0 } }

    public func resolve(host: String, port: Int) throws -> [IPAddress] {
        let key = Key(host: host.lowercased(), port: port)
        let now = monotonicMilliseconds()
        if let hit = entries.withLock({ $0[key] }), now - hit.storedAt < ttlMs { return hit.addresses }
        lookups.withLock { $0 += 1 }
        let addresses = try base.resolve(host: host, port: port)
        entries.withLock { table in
            if table.count >= capacity {
                table = table.filter { now - $0.value.storedAt < ttlMs }
                while table.count >= capacity, let oldest = table.min(by: { $0.value.storedAt < $1.value.storedAt }) {
                    table[oldest.key] = nil
                }
            }
            table[key] = Entry(addresses: addresses, storedAt: now)
        }
        return addresses
    }
}
