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

    @Test("a pacer lets its burst through, then gives each call its turn, and refuses past the longest wait")
    func pacer() {
        let pacer = Pacer<Int>(perSecond: 100, burst: 5, maxDelayMs: 1000)
        for _ in 0..<5 { #expect(pacer.turn(1, now: 0) == 0) }
        #expect(pacer.turn(1, now: 0) == 10, "one every 10 ms at 100 a second")
        #expect(pacer.turn(1, now: 0) == 20)
        #expect(pacer.turn(2, now: 0) == 0, "another key is unaffected")
        // Turns up to a second away are given; the next is refused and takes nothing.
        var last: Int64 = 0
        while let turn = pacer.turn(1, now: 0) { last = turn }
        #expect(last <= 1000 && last > 980)
        #expect(pacer.turn(1, now: 0) == nil)
        #expect(pacer.turn(1, now: 100) != nil, "100 ms on, there is room again")
        pacer.expireIdle(now: 5000)
        #expect(pacer.count == 0)
    }

    @Test("a pacer tracks at most `capacity` keys: keys whose turn has passed go first, then new ones untracked")
    func pacerBounded() {
        let pacer = Pacer<Int>(perSecond: 10, burst: 1, maxDelayMs: 1000, capacity: 3)
        for k in 0..<3 { #expect(pacer.turn(k, now: 0) == 0) }
        #expect(pacer.count == 3)
        // Full, every turn still ahead: a fourth key is answered but not kept.
        #expect(pacer.turn(99, now: 0) == 0)
        #expect(pacer.count == 3)
        // Past their turns (100 ms on), the old keys are dropped to make room.
        #expect(pacer.turn(100, now: 500) == 0)
        #expect(pacer.count == 1)
    }

    @Test("system.* calls: paced at a thirtieth of the minute's a second, refused past the minute's")
    func systemCalls() {
        let limiter = SystemCallLimiter(perMinute: 6000)
        #expect(limiter.pace == 200)
        // Twenty at once, then one every 5 ms.
        for _ in 0..<20 { #expect(limiter.take(7, now: 0) == .now) }
        #expect(limiter.take(7, now: 0) == .after(5))
        #expect(limiter.take(8, now: 0) == .now, "another uid is unaffected")
        // A loop that waits for each answer gets 200 a second; after 60 s its
        // 6,000 and the minute's refill are spent, and it is refused.
        var answered = 21
        var refused = 0
        var now: Int64 = 0
        while now < 120_000 {
            switch limiter.take(7, now: now) {
            case .now: answered += 1
            case .after(let ms):
                answered += 1
                now += ms
            case .refused:
                refused += 1
                now += 250
            }
        }
        #expect(refused > 0)
        #expect(answered <= 6000 + 120 * 100 + 1, "\(answered)")
        // Small allowances: five a minute, five answered (a tenth of a second apart), then refused.
        let small = SystemCallLimiter(perMinute: 5)
        var t: Int64 = 0
        for _ in 0..<5 {
            let turn = small.take(1, now: t)
            #expect(turn != .refused(retryAfterMs: 0))
            if case .after(let ms) = turn { t += ms }
            if case .refused = turn { Issue.record("refused within five a minute") }
        }
        if case .refused = small.take(1, now: t) {} else { Issue.record("a sixth was not refused") }
        // system.health has its own allowance, fifty times larger: still answered.
        for _ in 0..<100 {
            if case .refused = small.take(1, now: t, health: true) { Issue.record("health refused") }
            t += 100
        }
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
