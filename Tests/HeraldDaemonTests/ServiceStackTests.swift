import Testing
@testable import HeraldDaemon

@Suite("the daemon's parts stop in reverse order, once, on every path")
struct ServiceStackTests {
    final class Record {
        var stopped: [String] = []
    }

    @Test("newest first; a part handed over stops with its new owner only; a second stop does nothing")
    func order() {
        let record = Record()
        let stack = ServiceStack()
        stack.started("store") { record.stopped.append("store") }
        stack.started("listener") { record.stopped.append("listener") }
        stack.started("delivery") { record.stopped.append("delivery") }
        stack.handedOver("listener")
        stack.started("server") { record.stopped.append("server+listener") }
        #expect(stack.names == ["store", "delivery", "server"])
        stack.stopAll()
        #expect(record.stopped == ["server+listener", "delivery", "store"])
        stack.stopAll()
        #expect(record.stopped.count == 3)
    }

    @Test("a start that fails half way stops what had started, and nothing else")
    func failedStart() {
        let record = Record()
        func start(failAt step: Int) -> Int32 {
            let stack = ServiceStack()
            defer { stack.stopAll() }
            for (i, name) in ["store", "listener", "delivery", "server", "metrics"].enumerated() {
                if i == step { return 1 }
                stack.started(name) { record.stopped.append(name) }
            }
            return 0
        }
        #expect(start(failAt: 2) == 1)
        #expect(record.stopped == ["listener", "store"])
    }
}
