import HeraldIO
import Testing

@testable import HeraldScheduler

@Suite("Waiting lists and recently built requests")
struct FIFOTests {
    @Test func firstInFirstOutThroughCompactions() {
        var list = FIFO<Int>()
        var expected: [Int] = []
        var next = 0
        // Interleaved appends and takes, past the point where the taken
        // prefix is dropped (64), many times over.
        for round in 0..<50 {
            for _ in 0..<(100 + round) {
                list.append(next)
                expected.append(next)
                next += 1
            }
            for _ in 0..<(90 + round % 7) {
                #expect(list.popFirst() == expected.removeFirst())
            }
            #expect(list.count == expected.count)
            #expect(Array(list.elements) == expected)
        }
        while let x = list.popFirst() { #expect(x == expected.removeFirst()) }
        #expect(list.isEmpty && expected.isEmpty && list.popFirst() == nil)
    }

    @Test func removeAllKeepsTheOrderOfTheRest() {
        var list = FIFO<Int>()
        for i in 0..<200 { list.append(i) }
        for _ in 0..<70 { _ = list.popFirst() }
        list.removeAll { $0 % 3 == 0 }
        #expect(Array(list.elements) == (70..<200).filter { $0 % 3 != 0 })
        #expect(list.popFirst() == 70)
    }

    @Test func recentlyBuiltBuildsOncePerKeyAndHoldsAtMostItsCapacity() {
        let built = RecentlyBuilt<String, Int>(capacity: 4)
        let builds = Locked(0)
        func value(_ key: String) -> Int {
            built.value(for: key) {
                builds.withLock { $0 += 1 }
                return key.count
            }
        }
        // A fan-out: one key for 500 devices builds once.
        for _ in 0..<500 { #expect(value("message-1") == 9) }
        #expect(builds.withLock { $0 } == 1)
        // Past the capacity: the oldest goes, the count stays at 4.
        for k in ["a", "bb", "ccc", "dddd", "eeeee"] { _ = value(k) }
        #expect(built.count == 4)
        #expect(builds.withLock { $0 } == 6)
        _ = value("eeeee")
        #expect(builds.withLock { $0 } == 6, "the most recent is held")
        _ = value("message-1")
        #expect(builds.withLock { $0 } == 7, "the evicted one is built again")
    }
}
