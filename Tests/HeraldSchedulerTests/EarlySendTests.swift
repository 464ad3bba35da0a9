import Foundation
import HeraldCore
import HeraldCrypto
import HeraldScheduler
import HeraldStore
import HeraldStoreTestSupport
import HeraldIO
import Testing

/// A message reaching an idle scheduler is sent while its commit is under
/// way (on PostgreSQL too: the ids are taken ahead from the sequence); its
/// results are written only once the commit is known.
@Suite("Scheduler: sends that start before the commit")
struct EarlySendTests {
    static let lane = QueueLane(app: "default", platform: .fcm)

    /// A store whose hand-over commits are held, a transport, a started and idle scheduler.
    struct Setup {
        let fixture: Fixture
        let store: OutageStore
        let transport: ScriptedTransport
        let scheduler: Scheduler

        init(_ backend: StoreBackend, devices: Int = 20) async throws {
            fixture = try Fixture(backend)
            try fixture.register(devices, perUser: 1, platform: .fcm)
            store = OutageStore(fixture.store)
            transport = ScriptedTransport(limit: 100, delayMs: 1)
            scheduler = Scheduler(
                store: store, transports: [EarlySendTests.lane: transport],
                settings: SchedulerSettings(maxInflight: 100))
            scheduler.start()
            #expect(await eventually { scheduler.isIdle })
        }

        /// Enqueues to `users`; the answer lands in the returned box.
        func send(_ users: Int) -> Locked<Result<Enqueued, any Error>?> {
            let answer = Locked<Result<Enqueued, any Error>?>(nil)
            let e = Enqueue(
                app: "default", message: PushMessage(kind: .notification),
                recipients: .users((0..<users).map { "fcm-\($0)" }), idempotencyKey: nil, disabled: [:])
            scheduler.enqueue(e) { result in answer.withLock { $0 = result } }
            return answer
        }

        func close() {
            scheduler.stopClaiming()
            fixture.close()
        }
    }

    @Test(
        "every delivery is out before the commit returns (in two parts); no result is written until it does",
        arguments: StoreBackend.allCases)
    func sentBeforeCommit(_ backend: StoreBackend) async throws {
        let s = try await Setup(backend, devices: 100)
        defer { s.close() }
        s.store.holdingCommits = true
        let answer = s.send(100)
        #expect(await eventually { s.transport.sent == 100 }, "sent while the commit is held")
        #expect(s.store.earlyCalls == 2, "the first 32 as soon as they are ready, then the rest")
        #expect(await eventually { s.scheduler.inFlightCount == 0 }, "every answer came back")
        try await Task.sleep(for: .milliseconds(100))
        #expect(answer.withLock { $0 } == nil, "the caller is not answered before the commit")
        #expect(s.store.writtenIDs.isEmpty, "no result is written before the commit is known")
        #expect(s.store.heldCommits == 1)

        s.store.releaseCommits()
        #expect(await eventually { answer.withLock { $0 } != nil })
        let accepted = try #require(try answer.withLock { $0 }?.get())
        let status = try await s.fixture.waitComplete(accepted.messageID)
        #expect(status.counts[.delivered] == 100)
        #expect(Set(s.store.writtenIDs).count == 100, "each result written once, after the commit")
        #expect(s.transport.sent == 100, "none sent twice")
        #expect(s.scheduler.stats.handedOver == 100)
    }

    @Test(
        "a commit that fails drops the results of what was sent, those back before it and those after",
        arguments: StoreBackend.allCases)
    func failedCommitDropsResults(_ backend: StoreBackend) async throws {
        let s = try await Setup(backend)
        defer { s.close() }
        s.store.holdingCommits = true
        s.transport.close()  // half of the answers come after the failed commit
        let answer = s.send(20)
        #expect(await eventually { s.transport.sent == 20 })
        #expect(await eventually { s.store.heldCommits == 1 }, "the commit's answer is held")
        s.store.releaseCommits(failing: true)
        #expect(await eventually { answer.withLock { $0 } != nil })
        #expect(
            answer.withLock { r in if case .failure = r { true } else { false } }, "the caller hears of the failure")
        s.transport.open()
        #expect(await eventually { s.scheduler.inFlightCount == 0 })
        try await Task.sleep(for: .milliseconds(100))
        #expect(s.store.writtenIDs.isEmpty, "nothing is written for a message that did not commit")

        // The scheduler goes on: the next message is sent, committed and recorded.
        let next = s.send(5)
        #expect(await eventually { next.withLock { $0 } != nil })
        let accepted = try #require(try next.withLock { $0 }?.get())
        #expect(try await s.fixture.waitComplete(accepted.messageID).counts[.delivered] == 5)
    }
}
