internal import Dispatch
internal import Foundation
import HeraldCore
import HeraldIO

/// A resolver that can answer without blocking its caller: from memory at
/// once, or later through `completion`.
public protocol AsyncHostResolver: HostResolver {
    /// The answer for `host` if it is known now (`completion` is then never
    /// called); otherwise nil, and `completion` is called once, on another
    /// thread, when the answer comes or the lookup gives up.
    func resolve(
        host: String, port: Int, completion: @escaping @Sendable (Result<[IPAddress], ResolverError>) -> Void
    ) -> Result<[IPAddress], ResolverError>?
}

/// Figures of a ``CachingResolver``, for the metrics.
public struct ResolverStats: Sendable, Equatable {
    /// Lookups handed to the base resolver (cache misses, coalesced).
    public var lookups = 0
    /// Lookups that passed the timeout while asking a name server.
    public var timeouts = 0
    /// Names that passed the timeout while waiting for a slot, never asked.
    public var dropped = 0
    /// Names refused at once: the wait queue was full.
    public var refused = 0
    /// Lookups started and not yet ended by the base resolver (hung ones included).
    public var outstanding = 0
    /// Names waiting for a slot.
    public var queued = 0

    public init() {}
}

/// The resolver of Web Push endpoints and provider hosts (SPEC.md Revision 3,
/// "Shared bounds": name lookups never hold a thread per hung query): a
/// ``NonBlockingResolver``'s lookups, bounded in time and number, coalesced,
/// remembered, and shared out so that hung name servers cannot starve the
/// names that work.
///
/// - An answer is reused for `ttl` (30 s); a failure (no such name, SERVFAIL,
///   no answer in time) is remembered for `negativeTTL` (30 s), so a name
///   server that never answers is asked once per name per 30 s.
/// - Callers asking for a name already being looked up wait on that lookup.
/// - Each caller waits at most `timeout` (2 s), queued or asked; a name still
///   waiting for a slot then is dropped from the queue, never asked.
/// - At most `maxOutstanding` (64) lookups are outstanding at once, counted
///   until the base resolver ends them (a hung query holds a slot past the
///   callers' timeout, until its own), and at most `maxPerDomain` (4) per
///   registrable domain by the Public Suffix List: one name server, however
///   many names it serves, has 4 slots.
/// - `reservedForKnown` (16) of the slots are only for names that resolved
///   before (the last 4,096 such names; one that then fails or times out
///   loses the mark, and for 30 s every name of its domain waits with the new
///   ones), and those names wait in a queue of their own that is served
///   first: new names on hung name servers cannot take them.
/// - At most `maxQueued` (1,024) names wait in each queue; past it a name
///   fails at once.
/// - Both caches are LRU with `capacity` (4,096) entries each.
///
/// The send-time check stays sound: the guard still vets every address it is
/// given and the connection is pinned to a vetted one. Registration checks
/// use one that remembers no answer or failure (both TTLs zero).
public final class CachingResolver: AsyncHostResolver {
    public let base: any NonBlockingResolver
    /// How long an answer is reused, in milliseconds.
    public let ttlMs: Int64
    /// How long a failure is remembered, in milliseconds.
    public let negativeTTLMs: Int64
    /// How long a caller waits for a lookup, in milliseconds.
    public let timeoutMs: Int64
    /// The most names remembered per cache; the least recently used go first.
    public let capacity: Int
    /// Lookups outstanding at once, hung ones included.
    public let maxOutstanding: Int
    /// Of `maxOutstanding`, the slots only names that resolved before may take.
    public let reservedForKnown: Int
    /// Lookups outstanding at once for names under one registrable domain.
    public let maxPerDomain: Int
    /// Names waiting for a slot in each queue (new names, names seen before).
    public let maxQueued: Int
    /// Where registrable domains end.
    public let suffixes: PublicSuffixList

    private struct Key: Hashable {
        let host: String
        let port: Int
    }

    private struct Answer {
        let addresses: [IPAddress]
        let storedAt: Int64
    }

    private struct Failure {
        let error: ResolverError
        let storedAt: Int64
    }

    private typealias Waiter = @Sendable (Result<[IPAddress], ResolverError>) -> Void

    private struct Pending {
        let id: UInt64
        let domain: String
        let known: Bool
        var waiters: [Waiter]
        var running = false
    }

    /// Names waiting for a slot, oldest first; entries whose pending is gone or started are skipped.
    private struct WaitQueue {
        var items: [(key: Key, id: UInt64)] = []
        var count = 0
    }

    private struct State {
        var answers: LRUCache<Key, Answer>
        var failures: LRUCache<Key, Failure>
        /// Names that resolved before and have not failed since.
        var known: LRUCache<Key, Bool>
        /// Domains with a lookup that passed the timeout, and when: for
        /// `suspectMs` their names wait with the new ones.
        var suspect: LRUCache<String, Int64>
        var pending: [Key: Pending] = [:]
        var newNames = WaitQueue()
        var knownNames = WaitQueue()
        var nextID: UInt64 = 0
        var perDomain: [String: Int] = [:]
        var stats = ResolverStats()
    }

    private let state: Locked<State>
    private let timers = DispatchQueue(label: "herald.resolver.timeouts")

    public init(
        _ base: any NonBlockingResolver, ttl: Duration = .seconds(30), negativeTTL: Duration = .seconds(30),
        timeout: Duration = .seconds(2), capacity: Int = 4096, maxOutstanding: Int = 64, reservedForKnown: Int = 16,
        maxPerDomain: Int = 4, maxQueued: Int = 1024, suffixes: PublicSuffixList = .lastTwoLabels
    ) {
        self.base = base
        self.ttlMs = ttl.wholeMilliseconds
        self.negativeTTLMs = negativeTTL.wholeMilliseconds
        self.timeoutMs = max(1, timeout.wholeMilliseconds)
        self.capacity = max(1, capacity)
        self.maxOutstanding = max(1, maxOutstanding)
        self.reservedForKnown = min(max(0, reservedForKnown), self.maxOutstanding - 1)
        self.maxPerDomain = max(1, maxPerDomain)
        self.maxQueued = max(1, maxQueued)
        self.suffixes = suffixes
        state = Locked(
            State(
                answers: LRUCache(capacity: self.capacity), failures: LRUCache(capacity: self.capacity),
                known: LRUCache(capacity: self.capacity), suspect: LRUCache(capacity: self.capacity)))
    }

    /// How long a domain whose lookup timed out loses the kept slots for all
    /// its names: a name server that answers once and then hangs cannot turn
    /// fresh names of its own into names that "resolved before".
    public static let suspectMs: Int64 = 30_000

    /// Lookups passed to the base resolver (cache misses, coalesced).
    public var baseLookups: Int { state.withLock { $0.stats.lookups } }
    /// Lookups that passed the timeout, asked or still queued.
    public var timedOut: Int { state.withLock { $0.stats.timeouts + $0.stats.dropped } }
    /// Names whose answer, and names whose failure, are remembered.
    public var cachedCounts: (answers: Int, failures: Int) { state.withLock { ($0.answers.count, $0.failures.count) } }
    /// The counters and gauges now.
    public var stats: ResolverStats {
        state.withLock { s in
            var out = s.stats
            out.queued = s.newNames.count + s.knownNames.count
            return out
        }
    }

    /// Blocks until the answer comes or the timeout passes (for callers that
    /// may block; the sender uses the asynchronous form).
    public func resolve(host: String, port: Int) throws -> [IPAddress] {
        let box = Locked<Result<[IPAddress], ResolverError>?>(nil)
        let done = DispatchSemaphore(value: 0)
        let now = resolve(host: host, port: port) { result in
            box.withLock { $0 = result }
            done.signal()
        }
        if let now { return try now.get() }
        done.wait()
        return try box.withLock { $0! }.get()
    }

    public func resolve(
        host: String, port: Int, completion: @escaping @Sendable (Result<[IPAddress], ResolverError>) -> Void
    ) -> Result<[IPAddress], ResolverError>? {
        let key = Key(host: host.lowercased(), port: port)
        let domain = suffixes.registrableDomain(of: key.host)
        let now = monotonicMilliseconds()
        enum Step {
            case known(Result<[IPAddress], ResolverError>)
            case wait
            case queued(UInt64)
        }
        let step = state.withLock { s -> Step in
            if let hit = s.answers.get(key) {
                if now - hit.storedAt < ttlMs { return .known(.success(hit.addresses)) }
                s.answers.remove(key)
            }
            if let miss = s.failures.get(key) {
                if now - miss.storedAt < negativeTTLMs { return .known(.failure(miss.error)) }
                s.failures.remove(key)
            }
            if s.pending[key] != nil {
                s.pending[key]!.waiters.append(completion)
                return .wait
            }
            var known = s.known.get(key) != nil
            if known, let since = s.suspect.get(domain) {
                if now - since < Self.suspectMs { known = false } else { s.suspect.remove(domain) }
            }
            guard (known ? s.knownNames.count : s.newNames.count) < maxQueued else {
                s.stats.refused += 1
                return .known(.failure(.failed(host: key.host, reason: "too many lookups waiting")))
            }
            s.nextID &+= 1
            s.pending[key] = Pending(id: s.nextID, domain: domain, known: known, waiters: [completion])
            if known {
                s.knownNames.items.append((key, s.nextID))
                s.knownNames.count += 1
            } else {
                s.newNames.items.append((key, s.nextID))
                s.newNames.count += 1
            }
            return .queued(s.nextID)
        }
        switch step {
        case .known(let result): return result
        case .wait: return nil
        case .queued(let id):
            timers.asyncAfter(deadline: .now() + .milliseconds(Int(timeoutMs))) { [self] in timeOut(key, id: id) }
            startQueued()
            return nil
        }
    }

    /// Starts queued lookups while the limits allow: names seen before first,
    /// up to every slot; new names up to the slots not reserved.
    private func startQueued() {
        let starts = state.withLock { s -> [(Key, UInt64, String)] in
            var out: [(Key, UInt64, String)] = []
            var queue = s.knownNames
            s.knownNames = WaitQueue()
            take(from: &queue, limit: maxOutstanding, state: &s, into: &out)
            s.knownNames = queue
            queue = s.newNames
            s.newNames = WaitQueue()
            take(from: &queue, limit: maxOutstanding - reservedForKnown, state: &s, into: &out)
            s.newNames = queue
            return out
        }
        for (key, id, domain) in starts {
            base.lookup(host: key.host, port: key.port) { [self] result in ended(key, id: id, domain: domain, result) }
        }
    }

    private func take(
        from queue: inout WaitQueue, limit: Int, state s: inout State, into out: inout [(Key, UInt64, String)]
    ) {
        guard s.stats.outstanding < limit, queue.count > 0 else {
            compact(&queue, state: s)
            return
        }
        var kept: [(key: Key, id: UInt64)] = []
        var index = 0
        while index < queue.items.count {
            let item = queue.items[index]
            index += 1
            guard let p = s.pending[item.key], p.id == item.id, !p.running else { continue }
            guard s.stats.outstanding < limit else {
                kept.append(item)
                break
            }
            // Held back by its domain's share: it keeps its place.
            if s.perDomain[p.domain, default: 0] >= maxPerDomain {
                kept.append(item)
                continue
            }
            s.pending[item.key]!.running = true
            queue.count -= 1
            s.stats.outstanding += 1
            s.perDomain[p.domain, default: 0] += 1
            s.stats.lookups += 1
            out.append((item.key, item.id, p.domain))
        }
        kept.append(contentsOf: queue.items[index...])
        queue.items = kept
    }

    /// Drops the entries that no longer wait (started, timed out, answered) once they are most of the queue.
    private func compact(_ queue: inout WaitQueue, state s: State) {
        guard queue.items.count > 2 * queue.count + 64 else { return }
        queue.items.removeAll { item in
            guard let p = s.pending[item.key], p.id == item.id else { return true }
            return p.running
        }
    }

    /// The base resolver ended a lookup (perhaps after its callers timed out).
    private func ended(_ key: Key, id: UInt64, domain: String, _ result: Result<[IPAddress], ResolverError>) {
        let now = monotonicMilliseconds()
        let waiters = state.withLock { s -> [Waiter] in
            s.stats.outstanding -= 1
            s.perDomain[domain, default: 1] -= 1
            if s.perDomain[domain] == 0 { s.perDomain[domain] = nil }
            let current = s.pending[key]?.id == id
            switch result {
            case .success(let addresses):
                // Also after a timeout: a late answer serves the next callers.
                if ttlMs > 0 { s.answers.set(key, Answer(addresses: addresses, storedAt: now)) }
                s.failures.remove(key)
                s.known.set(key, true)
            case .failure(let error):
                s.known.remove(key)
                if case .failed = error { s.suspect.set(domain, now) }
                if current && negativeTTLMs > 0 { s.failures.set(key, Failure(error: error, storedAt: now)) }
            }
            guard current else { return [] }
            return s.pending.removeValue(forKey: key)?.waiters ?? []
        }
        startQueued()
        for waiter in waiters { waiter(result) }
    }

    private func timeOut(_ key: Key, id: UInt64) {
        let error = ResolverError.failed(host: key.host, reason: "no answer within \(timeoutMs) ms")
        let now = monotonicMilliseconds()
        let waiters = state.withLock { s -> [Waiter] in
            guard let p = s.pending[key], p.id == id else { return [] }
            s.pending[key] = nil
            if p.running {
                s.stats.timeouts += 1
                s.known.remove(key)
                s.suspect.set(p.domain, now)
            } else {
                // Never asked: dropped from its queue (the entry is skipped there).
                s.stats.dropped += 1
                if p.known { s.knownNames.count -= 1 } else { s.newNames.count -= 1 }
            }
            if negativeTTLMs > 0 { s.failures.set(key, Failure(error: error, storedAt: now)) }
            return p.waiters
        }
        for waiter in waiters { waiter(.failure(error)) }
    }
}
