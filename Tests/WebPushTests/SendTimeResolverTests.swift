import Foundation
import HeraldCore
@testable import HeraldNet
import HeraldTestSupport
import Testing
@testable import WebPush

/// A resolver whose names under `hangSuffix` are answered only at `release()`
/// (a name server that never answers), `fail…` names fail, `nx…` names do not
/// exist, and others answer at once. Nothing blocks: like c-ares, a hung
/// lookup is an entry in a table.
final class ScriptedResolver: NonBlockingResolver, @unchecked Sendable {
    let hangSuffix: String
    let answer: [IPAddress]
    private let lock = NSLock()
    private var released = false
    private var alsoHanging: Set<String> = []
    private var calls: [String: Int] = [:]
    private var hung: [(host: String, completion: @Sendable (Result<[IPAddress], ResolverError>) -> Void)] = []

    init(hangSuffix: String = ".hang.example", answer: [IPAddress] = [ip("93.184.215.14")]) {
        self.hangSuffix = hangSuffix
        self.answer = answer
    }

    func lookup(
        host: String, port: Int, completion: @escaping @Sendable (Result<[IPAddress], ResolverError>) -> Void
    ) {
        let hangs = lock.withLock { () -> Bool in
            calls[host, default: 0] += 1
            guard host.hasSuffix(hangSuffix) || alsoHanging.contains(host), !released else { return false }
            hung.append((host, completion))
            return true
        }
        if hangs { return }
        if host.hasSuffix(hangSuffix) { return completion(.failure(.failed(host: host, reason: "released"))) }
        if host.hasPrefix("fail") { return completion(.failure(.failed(host: host, reason: "SERVFAIL"))) }
        if host.hasPrefix("nx") { return completion(.failure(.notFound(host: host))) }
        completion(.success(answer))
    }

    /// From now on `host` hangs too.
    func hang(_ host: String) { lock.withLock { _ = alsoHanging.insert(host) } }

    func calls(_ host: String) -> Int { lock.withLock { calls[host, default: 0] } }
    var totalCalls: Int { lock.withLock { calls.values.reduce(0, +) } }
    /// Lookups asked and not answered.
    var inProgress: Int { lock.withLock { hung.count } }
    /// The names asked and not answered.
    var hungNames: Set<String> { lock.withLock { Set(hung.map(\.host)) } }

    /// Ends the hung lookups of `host` (all of them when nil) with a failure.
    func release(_ host: String? = nil) {
        let ending = lock.withLock {
            () -> [(host: String, completion: @Sendable (Result<[IPAddress], ResolverError>) -> Void)] in
            if host == nil { released = true }
            let out = hung.filter { host == nil || $0.host == host }
            hung.removeAll { host == nil || $0.host == host }
            return out
        }
        for (name, completion) in ending { completion(.failure(.failed(host: name, reason: "released"))) }
    }
}

private func isSuccess(_ r: Result<[IPAddress], ResolverError>?) -> Bool {
    if case .success = r { return true }
    return false
}

/// Polls `condition` for up to 10 s.
private func eventually(_ condition: () -> Bool) -> Bool {
    let deadline = Date().addingTimeInterval(10)
    while !condition() {
        if Date() > deadline { return false }
        Thread.sleep(forTimeInterval: 0.01)
    }
    return true
}

@Suite("CachingResolver at send time", .serialized)
struct SendTimeResolverTests {
    @Test(
        "defaults are SPEC.md's: 2 s timeout, 30 s for answers and failures, 4,096 entries; 64 lookups, 16 kept, 4 a domain"
    )
    func defaults() {
        let r = CachingResolver(ScriptedResolver())
        #expect(r.timeoutMs == 2000)
        #expect(r.ttlMs == 30_000)
        #expect(r.negativeTTLMs == 30_000)
        #expect(r.capacity == 4096)
        #expect(r.maxOutstanding == 64)
        #expect(r.reservedForKnown == 16)
        #expect(r.maxPerDomain == 4)
        #expect(r.maxQueued == 1024)
        #expect(VAPIDTokenCache().capacity == 4096)
        #expect(WebPushSender.maxRememberedHTTP1Origins == 4096)
    }

    @Test("a failure is remembered for the negative TTL: one lookup per name, whatever the callers")
    func negativeCache() throws {
        let base = ScriptedResolver()
        let r = CachingResolver(base, negativeTTL: .milliseconds(400))
        for _ in 0..<20 {
            #expect(throws: ResolverError.failed(host: "fail.example", reason: "SERVFAIL")) {
                try r.resolve(host: "fail.example", port: 443)
            }
            #expect(throws: ResolverError.notFound(host: "nx.example")) { try r.resolve(host: "nx.example", port: 443) }
        }
        #expect(base.calls("fail.example") == 1)
        #expect(base.calls("nx.example") == 1)
        // The asynchronous form answers a remembered failure at once.
        let now = r.resolve(host: "FAIL.example", port: 443) { _ in Issue.record("answered later") }
        #expect(now == .failure(.failed(host: "fail.example", reason: "SERVFAIL")))
        #expect(r.cachedCounts.failures == 2)
        Thread.sleep(forTimeInterval: 0.5)
        _ = try? r.resolve(host: "fail.example", port: 443)
        #expect(base.calls("fail.example") == 2, "asked again once the entry expired")
    }

    @Test("concurrent lookups of one name are one lookup")
    func coalescing() {
        let base = ScriptedResolver()
        let r = CachingResolver(base, timeout: .seconds(30))
        let answers = Answers()
        for i in 0..<25 {
            #expect(r.resolve(host: "a.hang.example", port: 443, completion: answers.record("c\(i)")) == nil)
        }
        #expect(base.calls("a.hang.example") == 1)
        base.release()
        #expect(answers.wait(for: 25))
        #expect(base.calls("a.hang.example") == 1, "25 callers, one lookup")
        #expect(r.baseLookups == 1)
        for i in 0..<25 {
            #expect(answers["c\(i)"] == .failure(.failed(host: "a.hang.example", reason: "released")))
        }
    }

    @Test("a lookup that passes the timeout fails for its callers, is remembered, and holds its slot until it ends")
    func timeout() throws {
        let base = ScriptedResolver()
        defer { base.release() }
        let r = CachingResolver(base, timeout: .milliseconds(300))
        let answers = Answers()
        let start = Date()
        #expect(r.resolve(host: "x.hang.example", port: 443, completion: answers.record("hung")) == nil)
        #expect(answers.wait(for: 1))
        #expect(Date().timeIntervalSince(start) >= 0.29)
        #expect(answers["hung"] == .failure(.failed(host: "x.hang.example", reason: "no answer within 300 ms")))
        #expect(r.timedOut == 1)
        #expect(r.stats.timeouts == 1)
        // Remembered: asked again, it fails at once, without a second lookup.
        #expect(r.resolve(host: "x.hang.example", port: 443) { _ in } != nil)
        #expect(base.calls("x.hang.example") == 1)
        #expect(r.stats.outstanding == 1, "the hung query is still out")
        base.release("x.hang.example")
        #expect(r.stats.outstanding == 0)
        // Through the guard: a DNS failure.
        #expect(throws: EndpointError.resolutionFailed(host: "x.hang.example", reason: "no answer within 300 ms")) {
            try EndpointGuard(resolver: r).check("https://x.hang.example/push")
        }
    }

    @Test("names under one registrable domain (Public Suffix List) share 4 slots; other domains under co.uk do not")
    func perRegistrableDomain() {
        let base = ScriptedResolver(hangSuffix: ".slow.co.uk")
        defer { base.release() }
        let suffixes = PublicSuffixList(parsing: "uk\nco.uk\n")
        let r = CachingResolver(base, timeout: .seconds(20), suffixes: suffixes)
        let answers = Answers()
        for i in 0..<12 {
            _ = r.resolve(host: "n\(i).slow.co.uk", port: 443, completion: answers.record("hung\(i)"))
        }
        #expect(base.inProgress == 4, "four asked, eight wait")
        #expect(r.stats.queued == 8)
        // Another registrable domain under co.uk is not held back.
        for i in 0..<6 {
            #expect(r.resolve(host: "push\(i).fast.co.uk", port: 443, completion: answers.record("ok\(i)")) == nil)
        }
        #expect(answers.wait(for: 6, seconds: 10))
        #expect(answers.arrivalOrder.allSatisfy { $0.hasPrefix("ok") }, "no hung name has answered yet")
        // One hung lookup ends: the next waiting name of its domain is asked.
        base.release("n0.slow.co.uk")
        #expect(eventually { base.inProgress == 4 })
        #expect(base.calls("n4.slow.co.uk") == 1)
    }

    @Test("without the list, the last two labels are the domain: co.uk names share one domain's slots")
    func lastTwoLabelsFallback() {
        let base = ScriptedResolver(hangSuffix: ".co.uk")
        defer { base.release() }
        let r = CachingResolver(base, timeout: .seconds(20))
        for i in 0..<6 { _ = r.resolve(host: "n.site\(i).co.uk", port: 443) { _ in } }
        #expect(base.inProgress == 4)
        #expect(PublicSuffixList.lastTwoLabels.registrableDomain(of: "a.b.example.co.uk") == "co.uk")
    }

    @Test("lookups outstanding are capped, and names that resolved before keep slots new names cannot take")
    func reservedForKnownNames() throws {
        let base = ScriptedResolver()
        defer { base.release() }
        // Nothing remembered, so a known name needs a lookup every time.
        let r = CachingResolver(
            base, ttl: .zero, negativeTTL: .zero, timeout: .seconds(20), maxOutstanding: 6, reservedForKnown: 2,
            maxPerDomain: 100)
        #expect(try r.resolve(host: "good.example.org", port: 443) == [ip("93.184.215.14")])
        let answers = Answers()
        for i in 0..<10 { _ = r.resolve(host: "h\(i).hang.example", port: 443, completion: answers.record("h\(i)")) }
        #expect(base.inProgress == 4, "new names take 6 - 2 slots")
        #expect(r.stats.outstanding == 4)
        #expect(r.stats.queued == 6)
        // The name that resolved before is asked at once, past the waiting new names.
        #expect(try r.resolve(host: "good.example.org", port: 443) == [ip("93.184.215.14")])
        #expect(base.calls("good.example.org") == 2)
        // Two known names that hang take the two kept slots; then the cap holds for everyone.
        let known = ScriptedResolver(hangSuffix: ".later.example")
        defer { known.release() }
        let k = CachingResolver(
            known, ttl: .zero, negativeTTL: .zero, timeout: .seconds(20), maxOutstanding: 3, reservedForKnown: 1,
            maxPerDomain: 100)
        _ = try k.resolve(host: "a.example", port: 443)
        for i in 0..<2 { _ = k.resolve(host: "n\(i).later.example", port: 443) { _ in } }
        #expect(known.inProgress == 2)
        _ = k.resolve(host: "n2.later.example", port: 443) { _ in }
        #expect(known.inProgress == 2, "the third slot is kept")
        #expect(try k.resolve(host: "a.example", port: 443) == [ip("93.184.215.14")], "and a known name gets it")
    }

    @Test("a name that resolved before loses its place when it times out")
    func knownMarkLost() throws {
        let base = ScriptedResolver()
        defer { base.release() }
        let r = CachingResolver(
            base, ttl: .zero, negativeTTL: .zero, timeout: .milliseconds(200), maxOutstanding: 2,
            reservedForKnown: 1, maxPerDomain: 100)
        _ = try r.resolve(host: "flaky.example", port: 443)
        base.hang("flaky.example")
        // A new name takes the one unreserved slot; the known name, the kept one, and times out.
        #expect(r.resolve(host: "a.hang.example", port: 443) { _ in } == nil)
        let answers = Answers()
        #expect(r.resolve(host: "flaky.example", port: 443, completion: answers.record("known")) == nil)
        #expect(base.inProgress == 2)
        #expect(answers.wait(for: 1))
        base.release("flaky.example")
        #expect(r.stats.outstanding == 1)
        // No longer known: it waits for the unreserved slot (still hung) and is dropped unasked.
        #expect(r.resolve(host: "flaky.example", port: 443, completion: answers.record("new")) == nil)
        #expect(answers.wait(for: 2))
        #expect(answers["new"] == .failure(.failed(host: "flaky.example", reason: "no answer within 200 ms")))
        #expect(base.calls("flaky.example") == 2)
        #expect(r.stats.dropped == 1)
    }

    @Test("after a lookup in a domain times out, its other known names wait with the new ones for 30 s")
    func suspectDomain() throws {
        let base = ScriptedResolver()
        defer { base.release() }
        let r = CachingResolver(
            base, ttl: .zero, negativeTTL: .zero, timeout: .milliseconds(200), maxOutstanding: 2,
            reservedForKnown: 1, maxPerDomain: 100, suffixes: PublicSuffixList(parsing: "example\n"))
        #expect(CachingResolver.suspectMs == 30_000)
        for name in ["a.evil.example", "b.evil.example", "good.other.example"] {
            _ = try r.resolve(host: name, port: 443)
        }
        // a resolved once and now hangs: it times out and keeps its slot (the unreserved one).
        base.hang("a.evil.example")
        #expect(throws: ResolverError.failed(host: "a.evil.example", reason: "no answer within 200 ms")) {
            try r.resolve(host: "a.evil.example", port: 443)
        }
        #expect(r.stats.outstanding == 1)
        // b resolved before too, but its domain is suspect: no kept slot, dropped unasked.
        let answers = Answers()
        #expect(r.resolve(host: "b.evil.example", port: 443, completion: answers.record("b")) == nil)
        #expect(answers.wait(for: 1))
        #expect(answers["b"] == .failure(.failed(host: "b.evil.example", reason: "no answer within 200 ms")))
        #expect(base.calls("b.evil.example") == 1)
        // A known name of another domain still gets the kept slot.
        #expect(try r.resolve(host: "good.other.example", port: 443) == [ip("93.184.215.14")])
    }

    @Test("names waiting past their deadline are dropped unasked; past 1,024 waiting a new name fails at once")
    func waitQueueBounds() {
        let base = ScriptedResolver()
        defer { base.release() }
        let r = CachingResolver(base, timeout: .milliseconds(300), maxOutstanding: 1, reservedForKnown: 0)
        #expect(r.maxQueued == 1024)
        for i in 0..<1025 { #expect(r.resolve(host: "p\(i).hang.example", port: 443) { _ in } == nil) }
        #expect(base.inProgress == 1)
        #expect(r.stats.queued == 1024)
        let now = r.resolve(host: "one-more.example", port: 443) { _ in Issue.record("answered later") }
        #expect(now == .failure(.failed(host: "one-more.example", reason: "too many lookups waiting")))
        #expect(r.stats.refused == 1)
        // A name already waiting still just waits.
        #expect(r.resolve(host: "p7.hang.example", port: 443) { _ in } == nil)
        // At the deadline every waiting name is dropped, none of them asked.
        #expect(eventually { r.stats.queued == 0 })
        #expect(r.stats.dropped == 1024)
        #expect(base.totalCalls == 1)
        // The queue has room again.
        #expect(r.resolve(host: "p2000.hang.example", port: 443) { _ in } == nil)
    }

    @Test("the answer and failure caches hold 4,096 names, least recently used out first")
    func lruBounds() throws {
        let base = ScriptedResolver()
        let r = CachingResolver(base)
        for i in 0..<4100 { _ = try r.resolve(host: "h\(i).example", port: 443) }
        #expect(r.cachedCounts.answers == 4096)
        // h0..h3 went first; h4 is still there (no new lookup).
        _ = try r.resolve(host: "h4.example", port: 443)
        #expect(base.calls("h4.example") == 1)
        _ = try r.resolve(host: "h0.example", port: 443)
        #expect(base.calls("h0.example") == 2)
        for i in 0..<4100 { _ = try? r.resolve(host: "fail\(i).example", port: 443) }
        #expect(r.cachedCounts.failures == 4096)
        #expect(r.cachedCounts.answers == 4096)
    }
}

@Suite("LRUCache")
struct LRUCacheTests {
    @Test("evicts the least recently used; get refreshes, peek does not")
    func order() {
        var c = LRUCache<String, Int>(capacity: 3)
        c.set("a", 1)
        c.set("b", 2)
        c.set("c", 3)
        #expect(c.get("a") == 1)  // a is now the newest
        #expect(c.peek("b") == 2)  // b stays the oldest
        let evicted = c.set("d", 4)
        #expect(evicted?.key == "b")
        #expect(c.keysOldestFirst == ["c", "a", "d"])
        #expect(c.remove("a") == 1)
        c.set("e", 5)
        c.set("f", 6)
        #expect(c.keysOldestFirst == ["d", "e", "f"])
        #expect(c.count == 3)
        c.removeAll { key, _ in key != "e" }
        #expect(c.keysOldestFirst == ["e"])
    }

    @Test("4,097 distinct keys leave 4,096")
    func bound() {
        var c = LRUCache<Int, Int>()
        for i in 0...4096 { c.set(i, i) }
        #expect(c.count == 4096)
        #expect(c.peek(0) == nil)
        #expect(c.peek(4096) == 4096)
    }
}

@Suite("Trailing-dot hosts")
struct TrailingDotTests {
    @Test("push.example.net. and push.example.net are one endpoint")
    func normalised() throws {
        let dotted = try strictGuard.check("https://Push.Example.NET./send/1")
        let plain = try strictGuard.check("https://push.example.net/send/1")
        #expect(dotted == plain)
        #expect(dotted.host == "push.example.net")
        #expect(dotted.origin == "https://push.example.net")
        #expect(try strictGuard.normalize("https://push.example.net.:443/send/1") == "https://push.example.net/send/1")
        #expect(try strictGuard.normalize("https://localhost./x") == "https://localhost/x")
        #expect(throws: EndpointError.self) { try strictGuard.normalize("https://push.example.net../x") }
        #expect(throws: EndpointError.self) { try strictGuard.normalize("https://./x") }
    }
}
