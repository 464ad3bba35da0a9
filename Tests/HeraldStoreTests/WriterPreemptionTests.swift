import Foundation
import HeraldIO
@testable import HeraldStore
import HeraldStoreTestSupport
import Testing

/// A transaction of bulk work alone ends between two of its jobs when an
/// acceptance comes: the acceptance waits for one job, not for the batch.
@Suite("The SQLite writer's bulk transactions give way to acceptances")
struct WriterPreemptionTests {
    @Test func anAcceptanceArrivingDuringABulkBatchIsCommittedBeforeTheBatchsLaterJobs() throws {
        let t = try TestStore(.sqlite)
        defer { t.close() }
        let store = try #require(t.store as? SQLiteStore)
        let order = Locked<[String]>([])
        let gate = DispatchSemaphore(value: 0)
        let done = DispatchSemaphore(value: 0)
        let holding = DispatchSemaphore(value: 0)
        // Holds the writer so that the two bulk jobs queue up together.
        store.submit(
            durable: true,
            { _, _ in
                holding.signal()
                gate.wait()
            }
        ) { _ in order.withLock { $0.append("gate") } }
        holding.wait()
        store.submit(
            durable: false,
            { _, _ in
                // While this bulk job runs, an acceptance comes.
                store.submit(durable: true, { _, _ in }) { _ in
                    order.withLock { $0.append("acceptance") }
                    done.signal()
                }
            }
        ) { _ in order.withLock { $0.append("bulk 1") } }
        store.submit(durable: false, { _, _ in }) { _ in
            order.withLock { $0.append("bulk 2") }
            done.signal()
        }
        gate.signal()
        #expect(done.wait(timeout: .now() + 10) == .success && done.wait(timeout: .now() + 10) == .success)
        #expect(order.withLock { $0 } == ["gate", "bulk 1", "acceptance", "bulk 2"])
    }
}
