import Testing

@testable import HeraldStore

@Suite("PostgreSQL: the devices whose last success an instance wrote lately")
struct RecentSuccessesTests {
    @Test("a device is due again once the resolution has passed, and each device is named once")
    func dueAfterResolution() {
        let recent = RecentSuccesses(capacity: 8)
        #expect(recent.due(["a", "b", "a"], now: 0, within: 60_000) == ["a", "b"])
        recent.wrote(["a", "b"], at: 0)
        #expect(recent.due(["a", "b", "c"], now: 59_999, within: 60_000) == ["c"])
        #expect(recent.due(["a", "b"], now: 60_000, within: 60_000) == ["a", "b"])
    }

    @Test("it holds at most twice its capacity whatever the traffic; a device pushed out is only due sooner")
    func bounded() {
        let recent = RecentSuccesses(capacity: 100)
        for i in 0..<10_000 {
            recent.wrote(["d\(i)"], at: Int64(i))
            #expect(recent.count <= 200)
        }
        // The newest are still known; the oldest were dropped and are due again.
        #expect(recent.due(["d9999"], now: 10_000, within: 60_000).isEmpty)
        #expect(recent.due(["d0"], now: 10_000, within: 60_000) == ["d0"])
    }
}
