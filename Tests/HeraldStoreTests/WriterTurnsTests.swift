import Testing

@testable import HeraldStore

@Suite("The writer's turns")
struct WriterTurnsTests {
    /// "a": an acceptance, "b": bulk work.
    func turns(_ queue: [String], max: Int = 512) -> [[String]] {
        var q = queue.enumerated().map { "\($0.element)\($0.offset)" }
        var turns = WriterTurns()
        var out: [[String]] = []
        while !q.isEmpty { out.append(turns.next(from: &q, max: max) { $0.hasPrefix("a") }) }
        return out
    }

    @Test func acceptancesBehindBulkWorkGoFirstAlone() {
        #expect(turns(["b", "b", "a", "b", "a"]) == [["a2", "a4"], ["b0", "b1", "b3"]])
    }

    @Test func inOrderWhenNothingIsBehindBulkWork() {
        #expect(turns(["a", "a", "b", "b"]) == [["a0", "a1", "b2", "b3"]])
        #expect(turns(["b", "b"]) == [["b0", "b1"]])
        #expect(turns(["a", "a"]) == [["a0", "a1"]])
    }

    @Test func bulkWorkNeverWaitsMoreThanOneTurn() {
        var turns = WriterTurns()
        var q = ["b0", "a1"]
        #expect(turns.next(from: &q, max: 512) { $0.hasPrefix("a") } == ["a1"])
        // More acceptances arrived behind the bulk job meanwhile: it goes now, with them.
        q += ["a2", "b3", "a4"]
        #expect(turns.next(from: &q, max: 512) { $0.hasPrefix("a") } == ["b0", "a2", "b3", "a4"])
    }

    @Test func theBatchBoundHoldsForAcceptancesTaken() {
        let out = turns(["b", "a", "a", "a", "b"], max: 2)
        #expect(out == [["a1", "a2"], ["b0", "a3"], ["b4"]])
    }
}
