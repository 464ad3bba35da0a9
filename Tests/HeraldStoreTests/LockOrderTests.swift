import Testing

@testable import HeraldStore

@Suite("PostgreSQL: the order a batch's jobs take their locks in")
struct LockOrderTests {
    @Test("by fence, those without one last; each fence's jobs, and those without, in the order asked")
    func byFenceStable() {
        let batch: [(fence: String?, n: Int)] = [
            ("app\u{1F}zoe", 0), (nil, 1), ("app\u{1F}ann", 2), ("app\u{1F}zoe", 3), (nil, 4), ("app\u{1F}ann", 5),
            ("app\u{1F}bob", 6),
        ]
        let ordered = PostgresStore.lockOrder(batch, fence: { $0.fence }).map(\.n)
        #expect(ordered == [2, 5, 6, 0, 3, 1, 4])
        // Two batches of the same fences in opposite orders take them in one order.
        let reversed = PostgresStore.lockOrder(Array(batch.reversed()), fence: { $0.fence }).map(\.fence)
        #expect(reversed == PostgresStore.lockOrder(batch, fence: { $0.fence }).map(\.fence))
    }
}
