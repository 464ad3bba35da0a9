import Testing

@testable import WebPush

/// The sizes in which a sender's workers take its backlog (WebPushSender.drain).
@Suite("WebPushSender worker chunks")
struct WorkerChunkTests {
    /// Plays a burst of `burst` sends through `workers` workers taking turns,
    /// each with its own doubling limit, as drain() does; returns each take.
    private func play(burst: Int, workers: Int) -> [[Int]] {
        var left = burst
        var limits = Array(repeating: WebPushSender.firstChunk, count: workers)
        var takes = Array(repeating: [Int](), count: workers)
        var w = 0
        while left > 0 {
            let take = WebPushSender.take(left: left, workers: workers, limit: limits[w])
            takes[w].append(take)
            left -= take
            limits[w] = min(WebPushSender.chunk, limits[w] * 2)
            w = (w + 1) % workers
        }
        return takes
    }

    @Test("a worker's first chunk is at most two sends; then each may double up to sixteen")
    func firstChunkIsSmall() {
        #expect(WebPushSender.firstChunk == 2)
        #expect(WebPushSender.chunk == 16)
        for workers in 1...4 {
            let takes = play(burst: 500, workers: workers)
            #expect(takes.flatMap { $0 }.reduce(0, +) == 500)
            for run in takes where !run.isEmpty {
                #expect(run[0] <= 2)
                #expect(run.allSatisfy { $0 >= 1 && $0 <= 16 })
                for (a, b) in zip(run, run.dropFirst()) { #expect(b <= max(2 * a, 1)) }
            }
            // Past the first few, a long burst goes in full chunks: one hand-over per 16 seals.
            #expect(takes[0].dropFirst(4).dropLast(4).allSatisfy { $0 == 16 })
        }
    }

    @Test("a small backlog is shared between the workers, not taken whole by one")
    func smallBacklogShared() {
        #expect(WebPushSender.take(left: 6, workers: 2, limit: 16) == 3)
        #expect(WebPushSender.take(left: 1, workers: 4, limit: 16) == 1)
        #expect(WebPushSender.take(left: 100, workers: 2, limit: 2) == 2)
        #expect(WebPushSender.take(left: 0, workers: 0, limit: 2) == 1)
    }
}
