import HeraldCore
@testable import HeraldDelivery
import HeraldTestSupport
import Testing

private func device(_ n: Int) -> StaleCandidate { StaleCandidate(deviceID: "d\(n)", tokenHash: "h\(n)") }

private extension Array where Element == StaleVerdict {
    var deleted: [StaleCandidate] { filter { $0.disposition == .delete }.map(\.candidate) }
    var held: [StaleCandidate] { filter { $0.disposition == .held }.map(\.candidate) }
    func refused(_ why: StaleRefusal) -> [StaleCandidate] {
        filter { $0.disposition == .refused(why) }.map(\.candidate)
    }
    /// Verdicts other than `held`.
    var final: [StaleVerdict] { filter { $0.disposition != .held } }
}

@Suite("stale guard")
struct StaleGuardTests {
    @Test("a 1,000-device batch that is all stale deletes none and trips once")
    func allStale() {
        var guard_ = StaleGuard(settings: .init(windowCap: 500, batchRatio: 0.5, batchMin: 4))
        let registered = guard_.register(messageID: "m1", platform: .apns, size: 1000)
        #expect(registered)
        var verdicts: [StaleVerdict] = []
        for n in 0..<1000 {
            let step = guard_.reportStale(device(n), messageID: "m1", platform: .apns, now: 1000 + Int64(n))
            #expect(step.contains { $0.candidate == device(n) }, "every report rules on its own candidate")
            verdicts += step
        }
        #expect(verdicts.deleted.isEmpty)
        #expect(verdicts.held.count == 499, "held until the 500th stale trips the breaker")
        #expect(verdicts.refused(.breakerTripped).count == 1000)
        #expect(Set(verdicts.final.map(\.candidate)).count == 1000, "one final verdict per device")
        #expect(guard_.counters(for: .apns) == StaleCounters(staleRemoved: 0, staleRefused: 1000, breakerTrips: 1))
        #expect(guard_.openBatches == 0 && guard_.heldCount == 0)
    }

    @Test("a batch below the ratio deletes every stale device, as soon as that is certain")
    func belowRatio() {
        var guard_ = StaleGuard(settings: .init(windowCap: 500, batchRatio: 0.5, batchMin: 4))
        guard_.register(messageID: "m", platform: .fcm, size: 10)
        var verdicts: [StaleVerdict] = []
        // S S N S N N N S N N: 4 of 10 stale.
        var n = 0
        for isStale in [true, true, false, true, false, false, false, true, false, false] {
            if isStale {
                verdicts += guard_.reportStale(device(n), messageID: "m", platform: .fcm, now: 0)
                n += 1
            } else {
                verdicts += guard_.reportNotStale(messageID: "m", platform: .fcm, now: 0)
            }
            if verdicts.count == 3 {
                #expect(verdicts.held.count == 3, "three stale so far, still undecided")
            }
        }
        #expect(verdicts.deleted == (0..<4).map(device))
        #expect(verdicts.final.count == 4)
        #expect(guard_.counters(for: .fcm) == StaleCounters(staleRemoved: 4, staleRefused: 0, breakerTrips: 0))
        #expect(guard_.openBatches == 0)
    }

    @Test("held devices are released the moment the breaker can no longer trip")
    func earlyRelease() {
        var guard_ = StaleGuard(settings: .init(windowCap: 500, batchRatio: 0.5, batchMin: 4))
        guard_.register(messageID: "m", platform: .web, size: 10)
        #expect(guard_.reportStale(device(0), messageID: "m", platform: .web, now: 0).held == [device(0)])
        for _ in 0..<5 { #expect(guard_.reportNotStale(messageID: "m", platform: .web, now: 0).isEmpty) }
        // Sixth non-stale: at most 1 + 3 = 4 < 5 can be stale now.
        #expect(guard_.reportNotStale(messageID: "m", platform: .web, now: 0).deleted == [device(0)])
        #expect(guard_.heldCount == 0)
        #expect(guard_.reportStale(device(1), messageID: "m", platform: .web, now: 0).deleted == [device(1)])
        #expect(guard_.openBatches == 1, "two devices still unreported")
    }

    @Test("exactly the ratio trips the breaker")
    func exactRatio() {
        var guard_ = StaleGuard(settings: .init(windowCap: 500, batchRatio: 0.5, batchMin: 4))
        guard_.register(messageID: "m", platform: .apns, size: 10)
        var verdicts: [StaleVerdict] = []
        for _ in 0..<5 { verdicts += guard_.reportNotStale(messageID: "m", platform: .apns, now: 0) }
        for n in 0..<5 { verdicts += guard_.reportStale(device(n), messageID: "m", platform: .apns, now: 0) }
        #expect(verdicts.refused(.breakerTripped) == (0..<5).map(device))
        #expect(guard_.counters(for: .apns).breakerTrips == 1)
    }

    @Test("a batch smaller than stale_batch_min is not subject to the breaker")
    func belowBatchMin() {
        var guard_ = StaleGuard(settings: .init(windowCap: 500, batchRatio: 0.5, batchMin: 4))
        guard_.register(messageID: "small", platform: .apns, size: 3)
        for n in 0..<3 {
            #expect(
                guard_.reportStale(device(n), messageID: "small", platform: .apns, now: 0).map(\.disposition) == [
                    .delete
                ])
        }
        #expect(guard_.counters(for: .apns) == StaleCounters(staleRemoved: 3, staleRefused: 0, breakerTrips: 0))
        // At exactly stale_batch_min the breaker applies.
        guard_.register(messageID: "four", platform: .apns, size: 4)
        var verdicts: [StaleVerdict] = []
        for n in 0..<4 { verdicts += guard_.reportStale(device(n), messageID: "four", platform: .apns, now: 0) }
        #expect(verdicts.deleted.isEmpty)
        #expect(guard_.counters(for: .apns).breakerTrips == 1)
    }

    @Test("the window cap spans messages, stops at the cap and resumes as the window slides")
    func windowCap() {
        var guard_ = StaleGuard(settings: .init(windowCap: 5, batchRatio: 0.5, batchMin: 4))
        func send(_ message: String, stale: Int, at now: Int64, first: Int) -> [StaleVerdict] {
            guard_.register(messageID: message, platform: .apns, size: stale)
            return (first..<first + stale).flatMap {
                guard_.reportStale(device($0), messageID: message, platform: .apns, now: now)
            }
        }
        #expect(send("a", stale: 3, at: 0, first: 0).deleted.count == 3)
        let b = send("b", stale: 3, at: 10_000, first: 3)
        #expect(b.deleted == [device(3), device(4)])
        #expect(b.refused(.windowCapReached) == [device(5)])
        #expect(send("c", stale: 2, at: 59_999, first: 6).refused(.windowCapReached).count == 2)
        #expect(guard_.windowOccupancy(platform: .apns, now: 59_999) == 5)
        // At 60 s the three deletions of t=0 leave the window; the two of t=10 s remain.
        let d = send("d", stale: 3, at: 60_000, first: 8)
        #expect(d.deleted.count == 3)
        #expect(send("e", stale: 1, at: 60_000, first: 11).refused(.windowCapReached).count == 1)
        #expect(send("f", stale: 2, at: 70_000, first: 12).deleted.count == 2)
        #expect(guard_.counters(for: .apns) == StaleCounters(staleRemoved: 10, staleRefused: 4, breakerTrips: 0))
    }

    @Test("the window cap is shared among the apps: past half, an app takes only its share")
    func windowCapSharedAmongApps() {
        var guard_ = StaleGuard(settings: .init(windowCap: 10, batchRatio: 0.5, batchMin: 4))
        guard_.apps = 3
        var next = 0
        func send(_ app: String, stale: Int, at now: Int64) -> [StaleVerdict] {
            let message = "\(app)-\(next)"
            guard_.register(messageID: message, platform: .apns, size: stale)
            defer { next += stale }
            return (next..<next + stale).flatMap {
                guard_.reportStale(device($0), messageID: message, platform: .apns, app: app, now: now)
            }
        }
        // One app's mass of stale devices: half the cap, then its share (10 / 2 seats:
        // itself and one for the apps with none yet).
        let a = (0..<4).flatMap { _ in send("a", stale: 3, at: 0) }
        #expect(a.deleted.count == 5)
        #expect(a.refused(.windowCapReached).count == 7)
        // Another app still deletes: its share is 10 / 3 seats (a, b, and c with none).
        let b = (0..<2).flatMap { _ in send("b", stale: 3, at: 1000) }
        #expect(b.deleted.count == 3)
        #expect(b.refused(.windowCapReached).count == 3)
        // The last app: 10 / 3 = 3 each, and the cap itself is never passed.
        let c = (0..<2).flatMap { _ in send("c", stale: 3, at: 2000) }
        #expect(c.deleted.count == 2)
        #expect(guard_.windowOccupancy(platform: .apns, now: 2000) == 10)
        // A minute on, the window is empty again: half the cap for anyone.
        #expect(send("a", stale: 3, at: 62_000).deleted.count == 3)
    }

    @Test("with one app configured, that app may use the whole window cap")
    func windowCapOneApp() {
        var guard_ = StaleGuard(settings: .init(windowCap: 10, batchRatio: 0.5, batchMin: 4))
        var verdicts: [StaleVerdict] = []
        for m in 0..<4 {
            guard_.register(messageID: "m\(m)", platform: .fcm, size: 3)
            for n in 0..<3 {
                verdicts += guard_.reportStale(device(m * 3 + n), messageID: "m\(m)", platform: .fcm, app: "a", now: 0)
            }
        }
        #expect(verdicts.deleted.count == 10)
        #expect(verdicts.refused(.windowCapReached).count == 2)
    }

    @Test("held deletions released together still respect the window cap")
    func releasedBatchMeetsCap() {
        var guard_ = StaleGuard(settings: .init(windowCap: 3, batchRatio: 0.5, batchMin: 4))
        guard_.register(messageID: "m", platform: .fcm, size: 20)
        var verdicts: [StaleVerdict] = []
        for n in 0..<5 { verdicts += guard_.reportStale(device(n), messageID: "m", platform: .fcm, now: 0) }
        for _ in 0..<15 { verdicts += guard_.reportNotStale(messageID: "m", platform: .fcm, now: 1000) }
        #expect(verdicts.deleted == [device(0), device(1), device(2)])
        #expect(verdicts.refused(.windowCapReached) == [device(3), device(4)])
    }

    @Test("no 60 s window ever holds more than the cap (random load)")
    func slidingInvariant() {
        var guard_ = StaleGuard(settings: .init(windowCap: 7, batchRatio: 0.5, batchMin: 4))
        var random = SplitMix64(seed: 99)
        var clock: Int64 = 0
        var deletions: [Int64] = []
        for m in 0..<400 {
            clock += Int64.random(in: 0...6000, using: &random)
            let size = Int.random(in: 1...3, using: &random)
            guard_.register(messageID: "m\(m)", platform: .web, size: size)
            for n in 0..<size {
                let v = guard_.reportStale(device(n), messageID: "m\(m)", platform: .web, now: clock)
                deletions += v.deleted.map { _ in clock }
            }
        }
        for (i, t) in deletions.enumerated() {
            let inWindow = deletions[..<(i + 1)].filter { $0 > t - 60_000 }.count
            #expect(inWindow <= 7)
        }
        #expect(deletions.count > 7 * (Int(clock / 60_000) - 1), "the cap is used, not just respected")
    }

    @Test("platforms are independent")
    func perPlatform() {
        var guard_ = StaleGuard(settings: .init(windowCap: 2, batchRatio: 0.5, batchMin: 4))
        // Same message id on two platforms: two batches.
        guard_.register(messageID: "m", platform: .apns, size: 4)
        guard_.register(messageID: "m", platform: .fcm, size: 4)
        var apns: [StaleVerdict] = []
        for n in 0..<4 { apns += guard_.reportStale(device(n), messageID: "m", platform: .apns, now: 0) }
        var fcm = guard_.reportStale(device(10), messageID: "m", platform: .fcm, now: 0)
        for _ in 0..<3 { fcm += guard_.reportNotStale(messageID: "m", platform: .fcm, now: 0) }
        #expect(apns.deleted.isEmpty)
        #expect(fcm.deleted == [device(10)])
        #expect(guard_.counters(for: .apns) == StaleCounters(staleRemoved: 0, staleRefused: 4, breakerTrips: 1))
        #expect(guard_.counters(for: .fcm) == StaleCounters(staleRemoved: 1, staleRefused: 0, breakerTrips: 0))
        // Window caps: filling web's does not touch apns_voip's.
        for (p, base) in [(Platform.web, 100), (.apnsVoIP, 200)] {
            guard_.register(messageID: "x", platform: p, size: 3)
            let v = (0..<3).flatMap { guard_.reportStale(device(base + $0), messageID: "x", platform: p, now: 5) }
            #expect(v.deleted.count == 2)
            #expect(v.refused(.windowCapReached).count == 1)
        }
        #expect(guard_.counters(for: .web).staleRemoved == 2)
        #expect(guard_.counters(for: .apnsVoIP).staleRemoved == 2)
    }

    @Test("memory is bounded: the window log never exceeds the cap, finished batches are forgotten")
    func boundedMemory() {
        var guard_ = StaleGuard(settings: .init(windowCap: 100, batchRatio: 0.5, batchMin: 4))
        var clock: Int64 = 0
        for m in 0..<20_000 {
            clock += 7
            guard_.register(messageID: "m\(m)", platform: .apns, size: 5)
            for n in 0..<5 {
                if n < 2 {
                    _ = guard_.reportStale(device(n), messageID: "m\(m)", platform: .apns, now: clock)
                } else {
                    _ = guard_.reportNotStale(messageID: "m\(m)", platform: .apns, now: clock)
                }
            }
        }
        #expect(guard_.windowStorage[.apns]! <= 100)
        #expect(guard_.openBatches == 0)
        #expect(guard_.heldCount == 0)
        let counters = guard_.counters(for: .apns)
        #expect(counters.staleRemoved + counters.staleRefused == 40_000)

        var log = SlidingWindowLog(limit: 50, window: 60_000)
        for t in stride(from: Int64(0), to: 10_000_000, by: 100) { _ = log.admit(now: t) }
        #expect(log.storage <= 50)
    }

    @Test("finishing an undecided batch refuses what it holds; unknown batches delete nothing")
    func finishAndUnknown() {
        var guard_ = StaleGuard(settings: .init(windowCap: 500, batchRatio: 0.5, batchMin: 4))
        guard_.register(messageID: "m", platform: .apns, size: 10)
        _ = guard_.reportStale(device(0), messageID: "m", platform: .apns, now: 0)
        _ = guard_.reportStale(device(1), messageID: "m", platform: .apns, now: 0)
        let finished = guard_.finish(messageID: "m", platform: .apns)
        #expect(finished.refused(.batchUnresolved) == [device(0), device(1)])
        #expect(guard_.openBatches == 0)
        #expect(guard_.finish(messageID: "m", platform: .apns).isEmpty)

        let unknown = guard_.reportStale(device(2), messageID: "never", platform: .apns, now: 0)
        #expect(unknown.refused(.unknownBatch) == [device(2)])
        #expect(guard_.reportNotStale(messageID: "never", platform: .apns, now: 0).isEmpty)
        #expect(guard_.counters(for: .apns).staleRefused == 3)
        #expect(guard_.counters(for: .apns).breakerTrips == 0)
    }

    @Test("registering twice or with no devices is refused")
    func register() {
        var guard_ = StaleGuard()
        let first = guard_.register(messageID: "m", platform: .apns, size: 5)
        let again = guard_.register(messageID: "m", platform: .apns, size: 9)
        let empty = guard_.register(messageID: "n", platform: .apns, size: 0)
        #expect(first && !again && !empty)
        #expect(guard_.openBatches == 1)
    }

    @Test("the breaker threshold is the least count reaching the ratio, free of rounding traps")
    func threshold() {
        let half = StaleGuard(settings: .init(batchRatio: 0.5))
        #expect(half.breakerThreshold(batchSize: 4) == 2)
        #expect(half.breakerThreshold(batchSize: 5) == 3)
        #expect(half.breakerThreshold(batchSize: 1000) == 500)
        let tenth = StaleGuard(settings: .init(batchRatio: 0.1))
        #expect(tenth.breakerThreshold(batchSize: 30) == 3, "0.1 × 30 is 3.0000000000000004 in binary")
        #expect(StaleGuard(settings: .init(batchRatio: 0.7)).breakerThreshold(batchSize: 10) == 7)
        #expect(StaleGuard(settings: .init(batchRatio: 1)).breakerThreshold(batchSize: 7) == 7)
        #expect(StaleGuard(settings: .init(batchRatio: 0.001)).breakerThreshold(batchSize: 7) == 1)
    }

    @Test("every stale report gets exactly one final verdict, and deletions match the ratio (random batches)")
    func randomBatches() {
        var guard_ = StaleGuard(settings: .init(windowCap: 1_000_000, batchRatio: 0.5, batchMin: 4))
        var random = SplitMix64(seed: 2024)
        for m in 0..<300 {
            let size = Int.random(in: 1...40, using: &random)
            let staleCount = Int.random(in: 0...size, using: &random)
            var order = Array(repeating: true, count: staleCount) + Array(repeating: false, count: size - staleCount)
            order.shuffle(using: &random)
            guard_.register(messageID: "m\(m)", platform: .fcm, size: size)
            var verdicts: [StaleVerdict] = []
            var n = 0
            for isStale in order {
                if isStale {
                    verdicts += guard_.reportStale(device(n), messageID: "m\(m)", platform: .fcm, now: Int64(m))
                    n += 1
                } else {
                    verdicts += guard_.reportNotStale(messageID: "m\(m)", platform: .fcm, now: Int64(m))
                }
            }
            let final = verdicts.final
            #expect(final.count == staleCount)
            #expect(Set(final.map(\.candidate)).count == staleCount)
            let trips = size >= 4 && staleCount * 2 >= size
            #expect(
                final.allSatisfy { $0.disposition == (trips ? .refused(.breakerTripped) : .delete) },
                "size \(size), stale \(staleCount)")
        }
        #expect(guard_.openBatches == 0)
    }

    @Test("time that runs backwards does not reopen the window")
    func backwardsClock() {
        var log = SlidingWindowLog(limit: 1, window: 60_000)
        let admitted = [100_000, 0, 159_999, 160_000].map { log.admit(now: $0) }
        #expect(admitted == [true, false, false, true], "an earlier time counts as the latest seen")
    }
}
