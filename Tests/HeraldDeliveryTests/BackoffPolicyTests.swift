import HeraldDelivery
import HeraldTestSupport
import Testing

private let now: Int64 = 1_700_000_000_000
private let farFuture: Int64 = now + 86_400_000

@Suite("backoff")
struct BackoffPolicyTests {
    let policy = BackoffPolicy(maxRetries: 5, base: .milliseconds(1000), max: .milliseconds(300_000))

    private func delay(_ decision: BackoffPolicy.Decision, from start: Int64 = now) -> Int64? {
        if case .retry(let at) = decision { return at - start }
        return nil
    }

    @Test("the jitter cap doubles from base up to max, without overflow")
    func caps() {
        #expect(
            (0..<10).map { policy.cap(attempt: $0) }
                == [1000, 2000, 4000, 8000, 16_000, 32_000, 64_000, 128_000, 256_000, 300_000])
        #expect(policy.cap(attempt: 62) == 300_000)
        #expect(policy.cap(attempt: 63) == 300_000)
        #expect(policy.cap(attempt: .max) == 300_000)
        #expect(policy.cap(attempt: -3) == 1000)
    }

    @Test("full jitter: every delay lies in [0, cap] and the whole range is used")
    func fullJitter() {
        var random = SplitMix64(seed: 42)
        let wide = BackoffPolicy(maxRetries: 20, base: .milliseconds(1000), max: .milliseconds(300_000))
        for attempt in 0..<12 {
            let cap = wide.cap(attempt: attempt)
            var delays: [Int64] = []
            for _ in 0..<2000 {
                let d = delay(
                    wide.next(attempt: attempt, retryAfter: nil, now: now, deadline: farFuture, random: &random))
                #expect(d != nil)
                delays.append(d ?? -1)
            }
            #expect(delays.allSatisfy { (0...cap).contains($0) }, "attempt \(attempt)")
            #expect(delays.min()! < cap / 20, "full jitter reaches near zero (attempt \(attempt))")
            #expect(delays.max()! > cap - cap / 20, "and near the cap (attempt \(attempt))")
        }
    }

    @Test("delays grow with the attempt until the cap reaches max")
    func growth() {
        var random = SplitMix64(seed: 7)
        let wide = BackoffPolicy(maxRetries: 20, base: .milliseconds(1000), max: .milliseconds(300_000))
        let means = (0..<9).map { attempt in
            (0..<4000).reduce(Int64(0)) { sum, _ in
                sum + delay(
                    wide.next(attempt: attempt, retryAfter: nil, now: now, deadline: farFuture, random: &random))!
            } / 4000
        }
        for (a, b) in zip(means, means.dropFirst()) { #expect(b > a + a / 2, "\(means)") }
        // The mean is about half the cap.
        for (attempt, mean) in means.enumerated() {
            let cap = wide.cap(attempt: attempt)
            #expect(abs(mean - cap / 2) < cap / 10, "attempt \(attempt): \(mean) vs cap \(cap)")
        }
    }

    @Test("a seeded generator makes the schedule reproducible")
    func deterministic() {
        func schedule(seed: UInt64) -> [BackoffPolicy.Decision] {
            var random = SplitMix64(seed: seed)
            return (0..<6).map {
                policy.next(attempt: $0, retryAfter: nil, now: now, deadline: farFuture, random: &random)
            }
        }
        #expect(schedule(seed: 1) == schedule(seed: 1))
        #expect(schedule(seed: 1) != schedule(seed: 2))
        #expect(schedule(seed: 1).last == .giveUp(.exhausted))
    }

    @Test("Retry-After is a floor, even above max")
    func retryAfterFloor() {
        var random = SplitMix64(seed: 3)
        #expect(
            policy.next(attempt: 0, retryAfter: .seconds(60), now: now, deadline: farFuture, random: &random)
                == .retry(at: now + 60_000))
        #expect(
            policy.next(attempt: 4, retryAfter: .seconds(600), now: now, deadline: farFuture, random: &random)
                == .retry(at: now + 600_000))
        for _ in 0..<500 {
            let d = delay(
                policy.next(attempt: 0, retryAfter: .milliseconds(500), now: now, deadline: farFuture, random: &random))!
            #expect((500...1000).contains(d))
        }
        // A sub-millisecond remainder rounds up: never earlier than asked.
        #expect(
            policy.next(
                attempt: 0, retryAfter: .microseconds(1_999_500), now: now, deadline: farFuture, random: &random)
                == .retry(at: now + 2000))
        // A zero Retry-After is no floor at all.
        let d = delay(policy.next(attempt: 0, retryAfter: .zero, now: now, deadline: farFuture, random: &random))!
        #expect((0...1000).contains(d))
    }

    @Test("nothing is scheduled at or past the TTL deadline")
    func deadline() {
        var random = SplitMix64(seed: 11)
        // Retry-After beyond the deadline, or exactly at it.
        #expect(
            policy.next(attempt: 0, retryAfter: .seconds(2), now: now, deadline: now + 1000, random: &random)
                == .giveUp(.expired))
        #expect(
            policy.next(attempt: 0, retryAfter: .seconds(1), now: now, deadline: now + 1000, random: &random)
                == .giveUp(.expired))
        // Already at or past the deadline (a TTL 0 call ring).
        #expect(policy.next(attempt: 0, retryAfter: nil, now: now, deadline: now, random: &random) == .giveUp(.expired))
        #expect(
            policy.next(attempt: 0, retryAfter: nil, now: now, deadline: now - 5, random: &random) == .giveUp(.expired))
        // A huge Retry-After cannot overflow into the past.
        #expect(
            policy.next(attempt: 0, retryAfter: .seconds(Int64.max / 2), now: now, deadline: .max, random: &random)
                == .giveUp(.expired))
        // Close to the deadline the draw is confined to the time left.
        for _ in 0..<1000 {
            let d = delay(policy.next(attempt: 4, retryAfter: nil, now: now, deadline: now + 100, random: &random))!
            #expect((0..<100).contains(d))
            let f = delay(
                policy.next(attempt: 4, retryAfter: .milliseconds(60), now: now, deadline: now + 100, random: &random))!
            #expect((60..<100).contains(f))
        }
        #expect(
            policy.next(attempt: 0, retryAfter: nil, now: now, deadline: now + 1, random: &random) == .retry(at: now))
    }

    @Test("at most maxRetries retries, then exhausted (checked before expiry)")
    func exhausted() {
        var random = SplitMix64(seed: 5)
        var clock = now
        var retries = 0
        while case .retry(let at) = policy.next(
            attempt: retries, retryAfter: nil, now: clock, deadline: farFuture, random: &random)
        {
            #expect(at >= clock)
            clock = at
            retries += 1
        }
        #expect(retries == 5)
        #expect(
            policy.next(attempt: 5, retryAfter: nil, now: now, deadline: now, random: &random) == .giveUp(.exhausted))
        let none = BackoffPolicy(maxRetries: 0, base: .seconds(1), max: .seconds(1))
        #expect(
            none.next(attempt: 0, retryAfter: nil, now: now, deadline: farFuture, random: &random)
                == .giveUp(.exhausted))
    }
}
