@testable import HeraldDaemon
import Testing

@Suite("rate limiter")
struct RateLimiterTests {
    @Test("a bucket allows its burst, then says how long to wait, and refills")
    func bucket() {
        let limiter = RateLimiter<String>(perMinute: 20)
        for _ in 0..<20 { #expect(limiter.take("alice", now: 0) == nil) }
        let wait = limiter.take("alice", now: 0)
        #expect(wait == 3000)  // one token every 3 s at 20/min
        #expect(limiter.take("bob", now: 0) == nil, "another key is unaffected")
        #expect(limiter.take("alice", now: 3000) == nil)
        #expect(limiter.take("alice", now: 3000) != nil)
    }

    @Test("a smaller burst: that many at once, then the rate")
    func smallerBurst() {
        let limiter = RateLimiter<String>(perMinute: 6000, burst: 1000)
        for _ in 0..<1000 { #expect(limiter.take("a", now: 0) == nil) }
        #expect(limiter.take("a", now: 0) == 10, "one call every 10 ms at 6000/min")
        #expect(limiter.take("a", now: 10) == nil)
        #expect(limiter.take("a", now: 10) != nil)
        // A long idle spell refills to the burst, not to a minute's calls.
        for _ in 0..<1000 { #expect(limiter.take("a", now: 3_600_000) == nil) }
        #expect(limiter.take("a", now: 3_600_000) != nil)
    }

    @Test("system.* calls burst to ten seconds of the rate, at least ten, at most a minute's")
    func systemBurst() {
        #expect(HeraldService.systemCallBurst(perMinute: 6000) == 1000)
        #expect(HeraldService.systemCallBurst(perMinute: 5) == 5)
        #expect(HeraldService.systemCallBurst(perMinute: 30) == 10)
        #expect(HeraldService.systemCallBurst(perMinute: 1_000_000) == 166_666)
    }

    @Test("memory is bounded: the least recently used key is dropped first")
    func bounded() {
        let limiter = RateLimiter<Int>(perMinute: 1, capacity: 100)
        for k in 0..<100 { #expect(limiter.take(k, now: 0) == nil) }
        #expect(limiter.take(0, now: 1) != nil)  // touch 0: it becomes most recent
        #expect(limiter.take(1000, now: 2) == nil)  // evicts the least recent (1)
        #expect(limiter.count == 100)
        #expect(limiter.take(0, now: 3) != nil, "0 was kept: still limited")
        #expect(limiter.take(1, now: 3) == nil, "1 was dropped: a fresh bucket")
    }

    @Test("entries idle for a whole refill are forgotten")
    func idleExpiry() {
        let limiter = RateLimiter<String>(perMinute: 40)
        _ = limiter.take("a", now: 0)
        _ = limiter.take("b", now: 30_000)
        limiter.expireIdle(now: 60_000)
        #expect(limiter.count == 1)
        limiter.expireIdle(now: 90_000)
        #expect(limiter.count == 0)
    }
}
