import Foundation
import HeraldCore
import HeraldScheduler
import HeraldStore
import HeraldStoreTestSupport
import Testing

/// A `push.send` with `wait: true` through the scheduler on PostgreSQL: its
/// early sends' answers go to its enqueue, which writes them with the
/// message (see `EarlyResults`).
@Suite("Messages whose caller waits, through the scheduler on PostgreSQL")
struct WaitingSendTests {
    static let lane = QueueLane(app: "default", platform: .fcm)

    private func accept(_ scheduler: Scheduler, users: [String]) async throws -> Enqueued {
        var e = Enqueue(
            app: "default", message: PushMessage(kind: .notification), recipients: .users(users),
            idempotencyKey: nil, disabled: [:])
        e.awaitsResults = true
        return try await withCheckedThrowingContinuation { done in
            scheduler.enqueue(e) { done.resume(with: $0) }
        }
    }

    /// A started scheduler on `f`'s store with one FCM lane answering after
    /// 1 ms, once its first claim found nothing (idle).
    private func idleScheduler(
        _ store: any DeliveryStore, idlePoll: Duration
    ) async throws -> (Scheduler, ScriptedTransport) {
        let fcm = ScriptedTransport(limit: 500, delayMs: 1)
        var settings = SchedulerSettings(maxInflight: 1000)
        settings.idlePoll = idlePoll
        let scheduler = Scheduler(store: store, transports: [Self.lane: fcm], settings: settings)
        scheduler.start()
        try await Task.sleep(for: .milliseconds(300))
        return (scheduler, fcm)
    }

    @Test("every answer of the early sends is written with the message: complete at its commit")
    func completeAtCommit() async throws {
        let f = try Fixture(.postgres)
        defer { f.close() }
        try f.register(50, perUser: 4, platform: .fcm)
        let (scheduler, fcm) = try await idleScheduler(f.store, idlePoll: .seconds(3600))
        defer { scheduler.stopClaiming() }

        let accepted = try await accept(scheduler, users: (0..<50).map { "fcm-\($0)" })
        #expect(accepted.devices == 200 && accepted.delivered == 200, "\(accepted)")
        #expect(fcm.sent == 200)
        let status = try f.status(accepted.messageID)
        #expect(status.counts[.delivered] == 200 && status.isComplete)
        // Nothing left for the scheduler to write or renew.
        #expect(try await eventually { scheduler.inFlightCount == 0 })
        #expect(scheduler.stats.heldResults == 0)
    }

    @Test("a message that comes while the idle timer's claim looks for work is still sent before its commit")
    func handedDuringTheIdleLook() async throws {
        let f = try Fixture(.postgres)
        defer { f.close() }
        try f.register(10, perUser: 2, platform: .fcm)
        // The timer looks every millisecond: most of the time a look is under
        // way, and answers come while it is.
        // Counts the hand-overs made before a commit (`earlyCalls`).
        let store = OutageStore(f.store, shared: true)
        let (scheduler, fcm) = try await idleScheduler(store, idlePoll: .milliseconds(1))
        defer { scheduler.stopClaiming() }

        var late: [Int] = []
        for round in 0..<20 {
            let before = store.earlyCalls
            let accepted = try await accept(scheduler, users: ["fcm-\(round % 10)"])
            // Sent before its commit, not committed and then claimed.
            if store.earlyCalls == before { late.append(round) }
            _ = try await f.waitComplete(accepted.messageID)
        }
        #expect(late.isEmpty, "committed, then claimed: rounds \(late)")
        #expect(fcm.sent == 40)
    }
}
