import Dispatch
import Foundation
import HeraldCore
@testable import HeraldScheduler
import HeraldStore
import HeraldStoreTestSupport
import HeraldIO
import Testing

/// The hops of one push through the engine (docs/architecture.md, "The path
/// of one push"): the deliveries handed over at a commit go from the store's
/// thread to the engine's queue and from there, on it, to the transport; an
/// answer goes from the transport's thread to the engine's queue and from
/// there, on it, to the store. Each boundary is checked where it is crossed,
/// and the engine's dispatches per delivery are counted: a hop added on
/// either path fails here.
@Suite("Engine hops")
struct HopTests {
    /// Where each traced event ran: on the engine's queue or not, and on which thread.
    final class Trail: @unchecked Sendable {
        private let lock = NSLock()
        private var events: [(name: String, onEngine: Bool, thread: UInt)] = []
        let key = DispatchSpecificKey<Bool>()

        func mark(_ name: String) {
            let onEngine = DispatchQueue.getSpecific(key: key) == true
            let thread = UInt(pthread_self())
            lock.lock()
            events.append((name, onEngine, thread))
            lock.unlock()
        }

        var all: [(name: String, onEngine: Bool, thread: UInt)] {
            lock.lock()
            defer { lock.unlock() }
            return events
        }
    }

    /// A transport that marks where it is called and where it answers: on
    /// a queue of its own, all `batch` answers together once that many sends came.
    final class TracingTransport: PushTransport, @unchecked Sendable {
        let concurrencyLimit = 100
        let trail: Trail
        let batch: Int
        private let queue = DispatchQueue(label: "tracing-transport")
        private let held = Locked([@Sendable (AttemptReport) -> Void]())

        init(_ trail: Trail, batch: Int) {
            self.trail = trail
            self.batch = batch
        }

        func send(_ job: DeliveryJob, completion: @escaping @Sendable (AttemptReport) -> Void) {
            trail.mark("send")
            let ready = held.withLock { h -> [@Sendable (AttemptReport) -> Void] in
                h.append(completion)
                guard h.count == batch else { return [] }
                defer { h = [] }
                return h
            }
            guard !ready.isEmpty else { return }
            queue.async { [trail] in
                for answer in ready {
                    trail.mark("answer")
                    answer(AttemptReport(outcome: .delivered, httpStatus: 200))
                }
            }
        }
    }

    @Test func oneHopEachWayBetweenStoreEngineAndTransport() async throws {
        let f = try Fixture(.sqlite)
        defer { f.close() }
        try f.register(1, perUser: 30, platform: .fcm)
        let trail = Trail()
        let store = OutageStore(f.store)
        store.tracer = { [trail] in trail.mark($0) }
        let lane = QueueLane(app: "default", platform: .fcm)
        let scheduler = Scheduler(
            store: store, transports: [lane: TracingTransport(trail, batch: 30)],
            settings: SchedulerSettings(maxInflight: 100))
        scheduler.owner.queue.setSpecific(key: trail.key, value: true)
        scheduler.start()
        defer { scheduler.stopClaiming() }
        #expect(await eventually { scheduler.isIdle })

        let before = scheduler.owner.dispatches
        let accepted = try await scheduler.accept(["fcm-0"])
        #expect(accepted.devices == 30)
        _ = try await f.waitComplete(accepted.messageID)
        #expect(await eventually { scheduler.inFlightCount == 0 && store.writtenIDs.count == 30 })
        let dispatches = scheduler.owner.dispatches - before

        let events = trail.all
        let commit = try #require(events.first { $0.name == "commit" })
        #expect(!commit.onEngine, "the commit is answered on the store's thread")
        let sends = events.filter { $0.name == "send" }
        let answers = events.filter { $0.name == "answer" }
        let records = events.filter { $0.name == "record" }
        #expect(sends.count == 30 && answers.count == 30 && !records.isEmpty)
        let sentOnEngine = sends.allSatisfy { $0.onEngine }
        let answeredElsewhere = answers.allSatisfy { !$0.onEngine }
        let recordedOnEngine = records.allSatisfy { $0.onEngine }
        #expect(sentOnEngine, "the transport is called on the engine's queue")
        #expect(answeredElsewhere, "the transport answers on its own thread")
        #expect(recordedOnEngine, "results go to the store from the engine's queue")
        // The engine's own dispatches for this 30-device message: the
        // enqueue (it rests), the early sends, the hand-over at the commit,
        // one per take of answers (the 30 come from another thread in one
        // burst: most often one take carries them all, a few when the engine
        // takes while they are posted), the 1 ms gathering of results and
        // the write's return (twice when the first write leaves some
        // behind), and one progress report (or two): 7 most often, about 12
        // on a loaded machine. A hop through the engine's queue added per
        // delivery adds 30.
        #expect(dispatches <= 20, "\(dispatches) dispatches on the engine's queue")
    }

    func eventually(_ condition: () -> Bool) async -> Bool {
        for _ in 0..<500 {
            if condition() { return true }
            try? await Task.sleep(for: .milliseconds(10))
        }
        return condition()
    }
}
