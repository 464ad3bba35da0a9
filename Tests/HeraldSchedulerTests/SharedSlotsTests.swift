import Foundation
import HeraldCore
import HeraldDelivery
import HeraldScheduler
import HeraldStore
import HeraldStoreTestSupport
import HeraldIO
import HeraldTestSupport
import Testing

/// SPEC "Shared bounds": no origin, lane or app can hold all of `max_inflight`.
@Suite("Scheduler: send slots shared fairly")
struct SharedSlotsTests {
    static let keys = WebPushKeys(
        p256dh: [0x04] + [UInt8](repeating: 7, count: 64), auth: [UInt8](repeating: 9, count: 16))

    /// Web Push subscriptions of `app`, one user each (`prefix0`, `prefix1`…), at `endpoint(i)`.
    static func registerWeb(
        _ f: Fixture, app: String = "default", prefix: String, count: Int, endpoint: (Int) -> String
    ) throws {
        for i in 0..<count {
            let r = Registration(
                app: app, user: "\(prefix)\(i)", platform: .web, environment: nil, token: endpoint(i), keys: keys)
            _ = try f.store.sync { s, done in s.register(r, deviceCap: 10, completion: done) }
        }
    }

    static func send(_ f: Fixture, app: String, users: [String]) throws -> String {
        let e = Enqueue(
            app: app, message: PushMessage(kind: .notification), recipients: .users(users), idempotencyKey: nil,
            disabled: [:])
        return try f.store.sync { s, done in s.enqueue(e, completion: done) }.messageID
    }

    static func status(_ f: Fixture, app: String, _ id: String) throws -> MessageStatus {
        try f.store.sync { s, done in s.status(app: app, messageID: id, detail: true, completion: done) }!
    }

    @Test(
        "a lane whose sends hang cannot take another app's floor: that app's APNs message goes out at once",
        arguments: StoreBackend.allCases)
    func floorKeptForAnotherApp(_ backend: StoreBackend) async throws {
        let f = try Fixture(backend)
        defer { f.close() }
        try Self.registerWeb(f, prefix: "w", count: 30) { "https://push\($0).example/sub/\($0)" }
        for i in 0..<5 {
            let r = Registration(
                app: "other", user: "a\(i)", platform: .apns, environment: .production,
                token: String(format: "%064x", i + 1))
            _ = try f.store.sync { s, done in s.register(r, deviceCap: 10, completion: done) }
        }
        let web = ScriptedTransport(limit: 20)
        web.close()
        defer { web.open() }
        let apns = ScriptedTransport(limit: 20)
        let scheduler = Scheduler(
            store: f.store,
            transports: [
                QueueLane(app: "default", platform: .web): web, QueueLane(app: "other", platform: .apns): apns,
            ],
            settings: SchedulerSettings(maxInflight: 20))
        scheduler.start()
        defer { scheduler.stopClaiming() }
        _ = try Self.send(f, app: "default", users: (0..<30).map { "w\($0)" })
        scheduler.wake()
        // Floors of 20 / (2 × 2) = 5: the hanging lane gets all but the other lane's 5.
        #expect(await eventually { web.sent == 15 })
        try await Task.sleep(for: .milliseconds(100))
        #expect(web.sent == 15 && scheduler.inFlightCount == 15)
        #expect(scheduler.stats.laneFloor == 5)
        let id = try Self.send(f, app: "other", users: (0..<5).map { "a\($0)" })
        scheduler.wake()
        let s = try await f.waitComplete(id, timeout: 5, app: "other")
        #expect(s.counts[.delivered] == 5, "delivered while the other lane's sends still hang")
    }

    @Test(
        "a Web Push origin has at most originInflight sends out; the rest wait for it, other origins go on",
        arguments: StoreBackend.allCases)
    func originCap(_ backend: StoreBackend) async throws {
        let f = try Fixture(backend)
        defer { f.close() }
        try Self.registerWeb(f, prefix: "slow", count: 10) { "https://tarpit.example/sub/\($0)" }
        try Self.registerWeb(f, prefix: "fast", count: 2) { "https://ok\($0).example/sub/\($0)" }
        let web = ScriptedTransport(limit: 50)
        web.close()
        var settings = SchedulerSettings(maxInflight: 100)
        settings.originInflight = 3
        let scheduler = Scheduler(
            store: f.store, transports: [QueueLane(app: "default", platform: .web): web], settings: settings)
        scheduler.start()
        defer { scheduler.stopClaiming() }
        let id = try Self.send(f, app: "default", users: (0..<10).map { "slow\($0)" } + ["fast0", "fast1"])
        scheduler.wake()
        #expect(await eventually { web.sent == 5 && scheduler.stats.originWaiting == 7 })
        try await Task.sleep(for: .milliseconds(100))
        #expect(web.sent == 5, "3 to the tarpit, 1 to each other origin")
        web.open()
        let s = try await f.waitComplete(id)
        #expect(s.counts[.delivered] == 12)
        #expect(web.peak <= 5, "never more than 3 of the tarpit's out at once")
        #expect(scheduler.stats.originWaiting == 0)
    }

    @Test(
        "an origin that times out originTimeoutLimit times in a row is unresponsive: one probe at a time, the rest wait uncounted in the store; an answer ends it",
        arguments: StoreBackend.allCases)
    func unresponsiveOrigin(_ backend: StoreBackend) async throws {
        let f = try Fixture(backend)
        defer { f.close() }
        try Self.registerWeb(f, prefix: "t", count: 10) { "https://tarpit.example/sub/\($0)" }
        let answers = Locked(true)
        let web = ScriptedTransport(limit: 50) { _ in
            answers.withLock { $0 }
                ? AttemptReport(outcome: .transient(reason: .timeout))
                : AttemptReport(outcome: .delivered, httpStatus: 201)
        }
        var settings = SchedulerSettings(maxInflight: 100)
        settings.originInflight = 4
        settings.originTimeoutLimit = 3
        settings.originRetry = .seconds(120)
        settings.backoff = BackoffPolicy(maxRetries: 5, base: .milliseconds(20), max: .milliseconds(50))
        let lane = QueueLane(app: "default", platform: .web)
        let scheduler = Scheduler(store: f.store, transports: [lane: web], settings: settings)
        scheduler.start()
        defer { scheduler.stopClaiming() }
        let id = try Self.send(f, app: "default", users: (0..<10).map { "t\($0)" })
        scheduler.wake()
        #expect(await eventually { scheduler.stats.originsUnresponsive == 1 })
        #expect(scheduler.degradedOrigins[lane] == ["https://tarpit.example": "timeout"])
        // Everything ends waiting in the store: what waited for the origin put
        // back at once, the timed-out ones (and probes) at the origin's cadence.
        #expect(await eventually { scheduler.inFlightCount == 0 })
        // Past the backoff (50 ms at most) of the first timeouts: their probes are out and back.
        try await Task.sleep(for: .milliseconds(300))
        #expect(await eventually { scheduler.inFlightCount == 0 })
        let sent = web.sent
        try await Task.sleep(for: .milliseconds(300))
        #expect(web.sent == sent, "nothing more goes to the origin before originRetry")
        // The first 4, one in the slot of each of the first 2 timeouts, and
        // at most one probe each for those 2 when their backoff ends.
        #expect(sent <= 4 + 2 + 2, "sent \(sent)")
        let s = try Self.status(f, app: "default", id)
        #expect(s.counts[.retrying] == 10)
        let waiting = s.devices?.filter { $0.reason == DeliveryReason.originUnresponsive } ?? []
        #expect(waiting.count >= 2 && scheduler.stats.originDeferred >= waiting.count)
        #expect(waiting.allSatisfy { $0.attempts <= 1 }, "waiting for the origin is not an attempt")

        // A new push to the origin is its probe; answered, the origin is responsive again.
        answers.withLock { $0 = false }
        try Self.registerWeb(f, prefix: "n", count: 1) { "https://tarpit.example/new/\($0)" }
        let probe = try Self.send(f, app: "default", users: ["n0"])
        scheduler.wake()
        let p = try await f.waitComplete(probe, timeout: 5)
        let detail = try Self.status(f, app: "default", probe).devices ?? []
        #expect(
            p.counts[.delivered] == 1,
            "\(detail) sent \(web.sent) \(scheduler.stats.originDeferred) \(scheduler.inFlightCount)")
        #expect(scheduler.stats.originsUnresponsive == 0 && scheduler.degradedOrigins[lane] == nil)
    }
}

extension Fixture {
    func waitComplete(_ id: String, timeout: Double, app: String) async throws -> MessageStatus {
        let deadline = Date().addingTimeInterval(timeout)
        while true {
            let s = try store.sync { s, done in s.status(app: app, messageID: id, detail: false, completion: done) }!
            if s.isComplete || Date() > deadline { return s }
            try await Task.sleep(for: .milliseconds(10))
        }
    }
}
