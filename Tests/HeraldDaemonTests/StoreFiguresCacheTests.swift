import Foundation
import HeraldCore
import HeraldCrypto
import HeraldStore
import HeraldStoreTestSupport
import Synchronization
import Testing

@testable import HeraldDaemon

/// The figures of `system.stats` and the metrics are read from the store at
/// most once a second, and callers asking meanwhile share one read.
@Suite struct StoreFiguresCacheTests {
    @Test func callersShareOneReadAndFiguresAreReusedForASecond() async throws {
        let scratch = try StoreScratch(.sqlite, prefix: "herald-figures")
        let store = try scratch.open(key: try StoreKey.generate())
        defer {
            store.close()
            scratch.remove()
        }
        // Long enough that the first read is fresh for every caller, however slow the machine.
        let cache = StoreFiguresCache(store: store, maxAgeMs: 60_000)
        let answered = Mutex(0)
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            for _ in 0..<50 {
                cache.get { result in
                    let n = answered.withLock { n in
                        if case .success = result { n += 1 }
                        return n
                    }
                    if n == 50 { done.resume() }
                }
            }
        }
        let reads = cache.reads
        #expect(reads == 1, "50 callers at once, \(reads) reads")
        let figures = try await Self.figures(cache)
        #expect(cache.reads == 1, "fresh figures are reused")
        let depth = figures.depth(only: nil)
        #expect(depth.waiting == 0 && depth.inFlight == 0 && figures.devices(only: nil).isEmpty)

        let brief = StoreFiguresCache(store: store, maxAgeMs: 200)
        _ = try await Self.figures(brief)
        try await Task.sleep(for: .milliseconds(300))
        _ = try await Self.figures(brief)
        #expect(brief.reads == 2, "figures past their age are read again")
    }

    @Test func totalsAreOverTheAppsAsked() {
        let figures = StoreFigures(
            depthByApp: [
                "a": QueueDepth(waiting: 3, inFlight: 1), "b": QueueDepth(waiting: 5, inFlight: 2),
            ],
            devicesByApp: ["a": [.apns: 2, .web: 1], "b": [.apns: 4]], webSubscriptions: [])
        let all = figures.depth(only: nil)
        let b = figures.depth(only: ["b"])
        #expect(all.waiting == 8 && all.inFlight == 3)
        #expect(b.waiting == 5 && b.inFlight == 2)
        #expect(figures.devices(only: nil) == [.apns: 6, .web: 1])
        #expect(figures.devices(only: ["a"]) == [.apns: 2, .web: 1])
        #expect(figures.devices(only: ["c"]).isEmpty)
    }

    static func figures(_ cache: StoreFiguresCache) async throws -> StoreFigures {
        try await withCheckedThrowingContinuation { done in cache.get { done.resume(with: $0) } }
    }
}
