internal import Dispatch
internal import Foundation
public import HeraldNet
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

/// The send-time resolver of Web Push (SPEC.md Revision 2, "Delivery
/// semantics"): another resolver's blocking lookups, made asynchronous,
/// bounded in time and number, coalesced and remembered.
///
/// - An answer is reused for `ttl` (30 s), so a fan-out to many subscriptions
///   on one push service resolves its name once rather than once per push.
/// - A failure (no such name, SERVFAIL, no answer in time) is remembered for
///   `negativeTTL` (30 s): a name server that never answers is asked once per
///   name per 30 s, not once per delivery or retry.
/// - Lookups run on threads of their own (never on a sender's worker): at
///   most `concurrency` at a time, each given `timeout` (2 s). One that passes
///   it ends as a failure for every caller waiting on it. `getaddrinfo` cannot
///   be cancelled, so its thread runs on until the C library gives up
///   (`timeout` × `attempts` of resolv.conf) and no longer counts against
///   `concurrency`; the threads alive at once are capped at `maxThreads`, and
///   the names under one parent domain at `maxThreadsPerDomain`, so one slow
///   name server (however many names it serves) cannot take every thread.
/// - Callers asking for a name already being looked up wait on that lookup.
/// - Both caches are LRU with `capacity` (4,096) entries each.
///
/// The send-time check stays sound: the guard still vets every address it is
/// given and the connection is pinned to a vetted one, so a name that turns
/// private is refused once its entry expires, and never reached before.
/// Registration checks use one that remembers nothing (both TTLs zero): still
/// coalesced, bounded and given up after the timeout.
public final class CachingResolver: AsyncHostResolver {
    public let base: any HostResolver
    /// How long an answer is reused, in milliseconds.
    public let ttlMs: Int64
    /// How long a failure is remembered, in milliseconds.
    public let negativeTTLMs: Int64
    /// How long a caller waits for a lookup, in milliseconds.
    public let timeoutMs: Int64
    /// The most names remembered per cache; the least recently used go first.
    public let capacity: Int
    /// Lookups running and not yet past their timeout.
    public let concurrency: Int
    /// Lookup threads alive, hung ones included.
    public let maxThreads: Int
    /// Lookup threads alive for names under one parent domain (its last two labels).
    public let maxThreadsPerDomain: Int
    /// The most names waiting for a lookup at once; past it a lookup fails at once.
    public let maxPending: Int

    private struct Key: Hashable {
        let host: String
        let port: Int
        /// The last two labels: names one zone's name servers probably answer.
        var domain: Substring {
            var dots = 0
            var index = host.endIndex
            while index > host.startIndex {
                let before = host.index(before: index)
                if host[before] == "." {
                    dots += 1
                    if dots == 2 { return host[index...] }
                }
                index = before
            }
            return host[...]
        }
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
        var waiters: [Waiter]
        var running = false
    }

    private struct State {
        var answers: LRUCache<Key, Answer>
        var failures: LRUCache<Key, Failure>
        var pending: [Key: Pending] = [:]
        /// Names waiting for a thread, oldest first (entries whose pending is gone are skipped).
        var queue: [(key: Key, id: UInt64)] = []
        var queueHead = 0
        var nextID: UInt64 = 0
        var active = 0
        var threads = 0
        var threadsPerDomain: [Substring: Int] = [:]
        var lookups = 0
        var timeouts = 0
    }

    private let state: Locked<State>
    private let timers = DispatchQueue(label: "herald.webpush.resolver.timeouts")

    public init(
        _ base: any HostResolver, ttl: Duration = .seconds(30), negativeTTL: Duration = .seconds(30),
        timeout: Duration = .seconds(2), capacity: Int = 4096, concurrency: Int = 32, maxThreads: Int = 128,
        maxThreadsPerDomain: Int = 8, maxPending: Int = 4096
    ) {
        self.base = base
        self.ttlMs = ttl.wholeMilliseconds
        self.negativeTTLMs = negativeTTL.wholeMilliseconds
        self.timeoutMs = max(1, timeout.wholeMilliseconds)
        self.capacity = max(1, capacity)
        self.concurrency = max(1, concurrency)
        self.maxThreads = max(self.concurrency, maxThreads)
        self.maxThreadsPerDomain = max(1, maxThreadsPerDomain)
        self.maxPending = max(1, maxPending)
        state = Locked(State(answers: LRUCache(capacity: self.capacity), failures: LRUCache(capacity: self.capacity)))
    }

    /// Lookups passed to the base resolver (cache misses, coalesced).
    public var baseLookups: Int { state.withLock { $0.lookups } }
    /// Lookups that passed the timeout.
    public var timedOut: Int { state.withLock { $0.timeouts } }
    /// Names whose answer, and names whose failure, are remembered.
    public var cachedCounts: (answers: Int, failures: Int) { state.withLock { ($0.answers.count, $0.failures.count) } }
    /// Lookup threads alive (those past their timeout included).
    public var lookupThreads: Int { state.withLock { $0.threads } }

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
        let now = monotonicMilliseconds()
        enum Step {
            case known(Result<[IPAddress], ResolverError>)
            case wait
            case start(UInt64)
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
            guard s.pending.count < maxPending else {
                return .known(.failure(.failed(host: host, reason: "too many lookups in progress")))
            }
            s.nextID &+= 1
            s.pending[key] = Pending(id: s.nextID, waiters: [completion])
            s.queue.append((key, s.nextID))
            return .start(s.nextID)
        }
        switch step {
        case .known(let result): return result
        case .wait: return nil
        case .start(let id):
            timers.asyncAfter(deadline: .now() + .milliseconds(Int(timeoutMs))) { [self] in timeOut(key, id: id) }
            startQueued()
            return nil
        }
    }

    /// Starts queued lookups while the limits allow.
    private func startQueued() {
        let starts = state.withLock { s -> [(Key, UInt64)] in
            var out: [(Key, UInt64)] = []
            var skipped: [(key: Key, id: UInt64)] = []
            while s.queueHead < s.queue.count, s.active < concurrency, s.threads < maxThreads {
                let item = s.queue[s.queueHead]
                s.queueHead += 1
                guard let p = s.pending[item.key], p.id == item.id, !p.running else { continue }
                let domain = item.key.domain
                if s.threadsPerDomain[domain, default: 0] >= maxThreadsPerDomain {
                    skipped.append(item)
                    continue
                }
                s.pending[item.key]!.running = true
                s.active += 1
                s.threads += 1
                s.threadsPerDomain[domain, default: 0] += 1
                s.lookups += 1
                out.append((item.key, item.id))
            }
            // Names held back by their domain's cap keep their place at the front.
            if !skipped.isEmpty {
                s.queue.replaceSubrange(0..<s.queueHead, with: skipped)
                s.queueHead = 0
            } else if s.queueHead > 0 && (s.queueHead == s.queue.count || s.queueHead >= 256) {
                s.queue.removeFirst(s.queueHead)
                s.queueHead = 0
            }
            return out
        }
        for (key, id) in starts {
            let thread = Thread { [self] in lookup(key, id: id) }
            thread.name = "herald-dns"
            thread.start()
        }
    }

    private func lookup(_ key: Key, id: UInt64) {
        let result: Result<[IPAddress], ResolverError>
        do {
            let addresses = try base.resolve(host: key.host, port: key.port)
            result = addresses.isEmpty ? .failure(.notFound(host: key.host)) : .success(addresses)
        } catch let error as ResolverError {
            result = .failure(error)
        } catch {
            result = .failure(.failed(host: key.host, reason: String(describing: error)))
        }
        let now = monotonicMilliseconds()
        let waiters = state.withLock { s -> [Waiter] in
            s.threads -= 1
            let domain = key.domain
            s.threadsPerDomain[domain, default: 1] -= 1
            if s.threadsPerDomain[domain] == 0 { s.threadsPerDomain[domain] = nil }
            let current = s.pending[key]?.id == id
            switch result {
            case .success(let addresses):
                // Also after a timeout: a late answer serves the next callers.
                s.answers.set(key, Answer(addresses: addresses, storedAt: now))
                s.failures.remove(key)
            case .failure(let error):
                if current { s.failures.set(key, Failure(error: error, storedAt: now)) }
            }
            guard current else { return [] }
            s.active -= 1
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
            if p.running { s.active -= 1 }
            s.timeouts += 1
            s.failures.set(key, Failure(error: error, storedAt: now))
            return p.waiters
        }
        guard !waiters.isEmpty else { return }
        startQueued()
        for waiter in waiters { waiter(.failure(error)) }
    }
}
