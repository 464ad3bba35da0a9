import Foundation
import HeraldNet
import Testing
@testable import WebPush

/// A resolver whose names under `hangSuffix` block until `release()` (a name
/// server that never answers), `fail…` names fail, and others answer at once.
final class ScriptedResolver: HostResolver, @unchecked Sendable {
    let hangSuffix: String
    let answer: [IPAddress]
    private let lock = NSCondition()
    private var released = false
    private var calls: [String: Int] = [:]
    private var running = 0

    init(hangSuffix: String = ".hang.example", answer: [IPAddress] = [ip("93.184.215.14")]) {
        self.hangSuffix = hangSuffix
        self.answer = answer
    }

    func resolve(host: String, port: Int) throws -> [IPAddress] {
        lock.lock()
        calls[host, default: 0] += 1
        running += 1
        lock.unlock()
        defer {
            lock.lock()
            running -= 1
            lock.broadcast()
            lock.unlock()
        }
        if host.hasSuffix(hangSuffix) {
            lock.lock()
            while !released { lock.wait() }
            lock.unlock()
            throw ResolverError.failed(host: host, reason: "released")
        }
        if host.hasPrefix("fail") { throw ResolverError.failed(host: host, reason: "SERVFAIL") }
        if host.hasPrefix("nx") { throw ResolverError.notFound(host: host) }
        return answer
    }

    func calls(_ host: String) -> Int {
        lock.lock()
        defer { lock.unlock() }
        return calls[host, default: 0]
    }
    var totalCalls: Int {
        lock.lock()
        defer { lock.unlock() }
        return calls.values.reduce(0, +)
    }
    var inProgress: Int {
        lock.lock()
        defer { lock.unlock() }
        return running
    }

    /// Lets every hung lookup return, and waits until they have.
    func release() {
        lock.lock()
        released = true
        lock.broadcast()
        while running > 0 { _ = lock.wait(until: Date().addingTimeInterval(5)) }
        lock.unlock()
    }
}

/// Collects asynchronous answers.
final class Answers: @unchecked Sendable {
    private let lock = NSCondition()
    private var results: [String: Result<[IPAddress], ResolverError>] = [:]
    private var order: [String] = []

    func record(_ name: String) -> @Sendable (Result<[IPAddress], ResolverError>) -> Void {
        { result in
            self.lock.lock()
            self.results[name] = result
            self.order.append(name)
            self.lock.broadcast()
            self.lock.unlock()
        }
    }

    /// Waits (up to `seconds`) until `count` answers came; true if they did.
    func wait(for count: Int, seconds: Double = 10) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        lock.lock()
        defer { lock.unlock() }
        while results.count < count {
            if !lock.wait(until: deadline) { return results.count >= count }
        }
        return true
    }

    subscript(_ name: String) -> Result<[IPAddress], ResolverError>? {
        lock.lock()
        defer { lock.unlock() }
        return results[name]
    }

    var arrivalOrder: [String] {
        lock.lock()
        defer { lock.unlock() }
        return order
    }
}

private func isSuccess(_ r: Result<[IPAddress], ResolverError>?) -> Bool {
    if case .success = r { return true }
    return false
}

@Suite("CachingResolver at send time", .serialized)
struct SendTimeResolverTests {
    @Test("defaults are SPEC.md's: 2 s timeout, 30 s for answers and failures, 4,096 entries")
    func defaults() {
        let r = CachingResolver(ScriptedResolver())
        #expect(r.timeoutMs == 2000)
        #expect(r.ttlMs == 30_000)
        #expect(r.negativeTTLMs == 30_000)
        #expect(r.capacity == 4096)
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
        // Wait until the one lookup is running, then let it answer.
        let deadline = Date().addingTimeInterval(10)
        while base.inProgress == 0 && Date() < deadline { Thread.sleep(forTimeInterval: 0.01) }
        #expect(base.calls("a.hang.example") == 1)
        base.release()
        #expect(answers.wait(for: 25))
        #expect(base.calls("a.hang.example") == 1, "25 callers, one lookup")
        #expect(r.baseLookups == 1)
        for i in 0..<25 {
            #expect(answers["c\(i)"] == .failure(.failed(host: "a.hang.example", reason: "released")))
        }
    }

    @Test("a lookup that passes the timeout fails for its callers, is remembered, and frees its slot")
    func timeout() throws {
        let base = ScriptedResolver()
        defer { base.release() }
        let r = CachingResolver(base, timeout: .milliseconds(300), concurrency: 1, maxThreads: 4)
        let answers = Answers()
        let start = Date()
        #expect(r.resolve(host: "x.hang.example", port: 443, completion: answers.record("hung")) == nil)
        #expect(answers.wait(for: 1))
        #expect(Date().timeIntervalSince(start) >= 0.29)
        guard case .failure(.failed(let host, let reason)) = answers["hung"] else {
            Issue.record("not a failure: \(String(describing: answers["hung"]))")
            return
        }
        #expect(host == "x.hang.example")
        #expect(reason == "no answer within 300 ms")
        #expect(r.timedOut == 1)
        // Remembered: asked again, it fails at once, without a second lookup.
        #expect(r.resolve(host: "x.hang.example", port: 443) { _ in } != nil)
        #expect(base.calls("x.hang.example") == 1)
        // The hung thread no longer counts against the one lookup allowed at a time.
        #expect(try r.resolve(host: "push.example.net", port: 443) == [ip("93.184.215.14")])
        #expect(r.lookupThreads == 1, "the hung lookup keeps its thread")
        // Through the guard: a DNS failure.
        #expect(throws: EndpointError.resolutionFailed(host: "x.hang.example", reason: "no answer within 300 ms")) {
            try EndpointGuard(resolver: r).check("https://x.hang.example/push")
        }
    }

    @Test("names under one slow domain cannot take every lookup thread")
    func hungThreadsDoNotStarveOthers() {
        let base = ScriptedResolver()
        defer { base.release() }
        let r = CachingResolver(
            base, timeout: .seconds(20), concurrency: 4, maxThreads: 8, maxThreadsPerDomain: 2)
        let answers = Answers()
        for i in 0..<12 {
            _ = r.resolve(host: "n\(i).hang.example", port: 443, completion: answers.record("hung\(i)"))
        }
        // Only two of them hold a thread; the rest wait, without blocking other names.
        let deadline = Date().addingTimeInterval(10)
        while base.inProgress < 2 && Date() < deadline { Thread.sleep(forTimeInterval: 0.01) }
        Thread.sleep(forTimeInterval: 0.1)
        #expect(base.inProgress == 2)
        for i in 0..<6 {
            _ = r.resolve(host: "push\(i).other.example", port: 443, completion: answers.record("ok\(i)"))
        }
        #expect(answers.wait(for: 6, seconds: 10), "other names were answered while the slow ones hang")
        for i in 0..<6 { #expect(isSuccess(answers["ok\(i)"])) }
        #expect(answers.arrivalOrder.allSatisfy { $0.hasPrefix("ok") }, "no hung name has answered yet")
    }

    @Test("lookups in flight are bounded: `concurrency` running, `maxThreads` alive with the hung ones")
    func inFlightBounds() {
        let base = ScriptedResolver()
        defer { base.release() }
        let r = CachingResolver(
            base, timeout: .milliseconds(300), concurrency: 3, maxThreads: 5, maxThreadsPerDomain: 100)
        let answers = Answers()
        for i in 0..<6 { _ = r.resolve(host: "a\(i).hang.example", port: 443, completion: answers.record("a\(i)")) }
        // Three start (waited for, however slow the machine), and no fourth.
        var deadline = Date().addingTimeInterval(10)
        while base.inProgress < 3 && Date() < deadline { Thread.sleep(forTimeInterval: 0.01) }
        Thread.sleep(forTimeInterval: 0.05)
        #expect(base.inProgress == 3, "three run, three wait")
        #expect(answers.wait(for: 6), "all six time out")
        // The three hung threads live on; two more may start, not three.
        for i in 0..<6 { _ = r.resolve(host: "b\(i).hang.example", port: 443, completion: answers.record("b\(i)")) }
        deadline = Date().addingTimeInterval(10)
        while base.inProgress < 5 && Date() < deadline { Thread.sleep(forTimeInterval: 0.01) }
        Thread.sleep(forTimeInterval: 0.05)
        #expect(base.inProgress == 5)
        #expect(r.lookupThreads == 5)
        #expect(answers.wait(for: 12))
        #expect(base.inProgress <= 5)
    }

    @Test("past 4,096 names waiting for a lookup, a new name fails at once")
    func pendingBound() {
        let base = ScriptedResolver()
        defer { base.release() }
        let r = CachingResolver(base, timeout: .seconds(60), concurrency: 1, maxThreads: 1)
        #expect(r.maxPending == 4096)
        for i in 0..<4096 {
            #expect(r.resolve(host: "p\(i).hang.example", port: 443) { _ in } == nil)
        }
        let now = r.resolve(host: "one-more.example", port: 443) { _ in Issue.record("answered later") }
        #expect(now == .failure(.failed(host: "one-more.example", reason: "too many lookups in progress")))
        // A name already waiting still just waits.
        #expect(r.resolve(host: "p7.hang.example", port: 443) { _ in } == nil)
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
