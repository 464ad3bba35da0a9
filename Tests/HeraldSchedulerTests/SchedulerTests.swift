import Foundation
import HeraldCore
import HeraldCrypto
import HeraldDelivery
import HeraldScheduler
import HeraldStore
import HeraldStoreTestSupport
import HeraldIO
import HeraldTestSupport
import Testing

/// An in-process transport: answers each send with `answer(job)` after
/// `delayMs`, and records how many of its sends were out at once.
final class ScriptedTransport: PushTransport, @unchecked Sendable {
    let concurrencyLimit: Int
    private let delayMs: Int
    private let answer: @Sendable (DeliveryJob) -> AttemptReport
    private let state = Locked((current: 0, peak: 0, sent: 0))
    private let queue = DispatchQueue(label: "scripted", attributes: .concurrent)

    init(
        limit: Int, delayMs: Int = 5,
        answer: @escaping @Sendable (DeliveryJob) -> AttemptReport = { _ in
            AttemptReport(outcome: .delivered, httpStatus: 200)
        }
    ) {
        self.concurrencyLimit = limit
        self.delayMs = delayMs
        self.answer = answer
    }

    var peak: Int { state.withLock { $0.peak } }
    var sent: Int { state.withLock { $0.sent } }

    /// While closed, answers wait (a provider that does not answer) until `open()`.
    private let gate = Locked((closed: false, held: [@Sendable () -> Void]()))

    func close() { gate.withLock { $0.closed = true } }

    func open() {
        let held = gate.withLock { g -> [@Sendable () -> Void] in
            g.closed = false
            defer { g.held = [] }
            return g.held
        }
        for h in held { h() }
    }

    func send(_ job: DeliveryJob, completion: @escaping @Sendable (AttemptReport) -> Void) {
        state.withLock {
            $0.current += 1
            $0.sent += 1
            $0.peak = max($0.peak, $0.current)
        }
        let finish: @Sendable () -> Void = { [self] in
            state.withLock { $0.current -= 1 }
            completion(answer(job))
        }
        queue.asyncAfter(deadline: .now() + .milliseconds(delayMs)) { [self] in
            let later = gate.withLock { g -> Bool in
                if g.closed { g.held.append(finish) }
                return g.closed
            }
            if !later { finish() }
        }
    }
}

struct Fixture {
    let scratch: StoreScratch
    let store: any DeliveryStore

    init(_ backend: StoreBackend, clock: any WallClock = SystemClock()) throws {
        scratch = try StoreScratch(backend, prefix: "herald-sched")
        store = try scratch.open(key: try StoreKey.generate(), clock: clock, synchronous: .normal)
    }

    func register(_ users: Int, perUser: Int, platform: Platform) throws {
        for u in 0..<users {
            for k in 0..<perUser {
                let token = platform == .fcm ? "fcm-\(u)-\(k)" : String(format: "%064x", u * 100 + k + 1)
                let r = Registration(
                    app: "default", user: "\(platform.rawValue)-\(u)", platform: platform,
                    environment: platform.hasEnvironment ? .production : nil, token: token)
                _ = try store.sync { s, done in s.register(r, deviceCap: 100, completion: done) }
            }
        }
    }

    func send(_ users: [String], message: PushMessage = PushMessage(kind: .notification)) throws -> String {
        let e = Enqueue(app: "default", message: message, recipients: .users(users), idempotencyKey: nil, disabled: [:])
        return try store.sync { s, done in s.enqueue(e, completion: done) }.messageID
    }

    func status(_ id: String) throws -> MessageStatus {
        try store.sync { s, done in s.status(app: "default", messageID: id, detail: false, completion: done) }!
    }

    func waitComplete(_ id: String, timeout: Double = 20) async throws -> MessageStatus {
        let deadline = Date().addingTimeInterval(timeout)
        while true {
            let s = try status(id)
            if s.isComplete || Date() > deadline { return s }
            try await Task.sleep(for: .milliseconds(10))
        }
    }

    func close() {
        store.close()
        scratch.remove()
    }
}

extension Scheduler {
    /// `push.send` of a notification to `users` through the scheduler (the
    /// hand-over path), answered once the commit is durable.
    func accept(_ users: [String]) async throws -> Enqueued {
        let e = Enqueue(
            app: "default", message: PushMessage(kind: .notification), recipients: .users(users), idempotencyKey: nil,
            disabled: [:])
        return try await withCheckedThrowingContinuation { c in enqueue(e) { c.resume(with: $0) } }
    }
}

@Suite("Scheduler")
struct SchedulerTests {
    @Test(
        "a lane never has more sends out than its transport allows; max_inflight bounds them all",
        arguments: StoreBackend.allCases)
    func laneAndGlobalLimits(_ backend: StoreBackend) async throws {
        let f = try Fixture(backend)
        defer { f.close() }
        try f.register(50, perUser: 4, platform: .fcm)
        try f.register(50, perUser: 4, platform: .apns)
        let fcm = ScriptedTransport(limit: 7)
        let apns = ScriptedTransport(limit: 50)
        let scheduler = Scheduler(
            store: f.store,
            transports: [
                QueueLane(app: "default", platform: .fcm): fcm, QueueLane(app: "default", platform: .apns): apns,
            ],
            settings: SchedulerSettings(maxInflight: 30))
        scheduler.start()
        defer { scheduler.stopClaiming() }
        let id = try f.send((0..<50).map { "fcm-\($0)" } + (0..<50).map { "apns-\($0)" })
        scheduler.wake()
        let s = try await f.waitComplete(id)
        #expect(s.counts[.delivered] == 400)
        #expect(fcm.peak <= 7 && fcm.peak >= 2)
        #expect(fcm.peak + apns.peak <= 30 + 7, "sends out at once stay near max_inflight")
        #expect(apns.peak <= 30)
        #expect(scheduler.stats.platforms[.fcm]?.delivered == 200)
    }

    @Test(
        "a message reaching an idle scheduler is handed over at its commit: limits kept, each delivery sent once",
        arguments: StoreBackend.allCases)
    func handOverAtCommit(_ backend: StoreBackend) async throws {
        let f = try Fixture(backend)
        defer { f.close() }
        try f.register(50, perUser: 4, platform: .fcm)
        try f.register(50, perUser: 4, platform: .apns)
        let fcm = ScriptedTransport(limit: 7)
        let apns = ScriptedTransport(limit: 50)
        let scheduler = Scheduler(
            store: f.store,
            transports: [
                QueueLane(app: "default", platform: .fcm): fcm, QueueLane(app: "default", platform: .apns): apns,
            ],
            settings: SchedulerSettings(maxInflight: 30))
        scheduler.start()
        defer { scheduler.stopClaiming() }
        // Idle: the start-up claim found nothing.
        #expect(await eventually { scheduler.isIdle })
        let accepted = try await scheduler.accept((0..<50).map { "fcm-\($0)" } + (0..<50).map { "apns-\($0)" })
        #expect(accepted.devices == 400)
        let s = try await f.waitComplete(accepted.messageID)
        #expect(s.counts[.delivered] == 400)
        #expect(fcm.sent == 200 && apns.sent == 200, "no delivery sent twice")
        #expect(fcm.peak <= 7)
        #expect(fcm.peak + apns.peak <= 30 + 7, "sends out at once stay near max_inflight")
        let handed = scheduler.stats.handedOver
        #expect(handed > 0 && handed <= 30, "the first deliveries went without a claim, within max_inflight")
        // With work in flight the next message is not handed over: it queues and is claimed.
        apns.close()
        let first = try await scheduler.accept((0..<10).map { "apns-\($0)" })
        let second = try await scheduler.accept((0..<10).map { "apns-\($0)" })
        apns.open()
        #expect(try await f.waitComplete(first.messageID).counts[.delivered] == 40)
        #expect(try await f.waitComplete(second.messageID).counts[.delivered] == 40)
        #expect(apns.sent == 280)
    }

    @Test(
        "handed-over deliveries are in flight in the store: a crash before their answers queues them again",
        arguments: StoreBackend.allCases)
    func handOverSurvivesCrash(_ backend: StoreBackend) async throws {
        let scratch = try StoreScratch(backend, prefix: "herald-sched")
        defer { scratch.remove() }
        let key = try StoreKey.generate()
        let store = try scratch.open(key: key, synchronous: .full)
        for u in 0..<5 {
            let r = Registration(app: "default", user: "u\(u)", platform: .fcm, environment: nil, token: "fcm-\(u)")
            _ = try store.sync { s, done in s.register(r, deviceCap: 100, completion: done) }
        }
        let fcm = ScriptedTransport(limit: 100)
        fcm.close()  // the provider never answers before the "crash"
        let scheduler = Scheduler(
            store: store, transports: [QueueLane(app: "default", platform: .fcm): fcm], settings: SchedulerSettings())
        scheduler.start()
        #expect(await eventually { scheduler.isIdle })
        let accepted = try await scheduler.accept((0..<5).map { "u\($0)" })
        let deadline = Date().addingTimeInterval(10)
        while fcm.sent < 5 && Date() < deadline { try await Task.sleep(for: .milliseconds(5)) }
        #expect(fcm.sent == 5 && scheduler.stats.handedOver == 5)
        let status = try #require(
            try store.sync { s, done in
                s.status(app: "default", messageID: accepted.messageID, detail: false, completion: done)
            })
        #expect(status.counts[.inFlight] == 5)
        scheduler.stopClaiming()
        store.close()  // the answers never come: as good as a crash for the store
        let reopened = try scratch.open(key: key, synchronous: .full)
        defer { reopened.close() }
        // PostgreSQL's close hands work in flight back at once (peers need not
        // wait out the lease): queued again, but not found in flight at the reopen.
        #expect(reopened.recoveredDeliveries == (backend == .postgres ? 0 : 5))
        let again = try reopened.sync { s, done in s.claimDue(limit: 10, completion: done) }.jobs
        #expect(again.count == 5 && again.allSatisfy { $0.previousAttempts == 1 && $0.token.hasPrefix("fcm-") })
        // Let the held answers go (to the closed store, which refuses them) so
        // that the transport and the scheduler they hold are released.
        fcm.open()
        let settled = Date().addingTimeInterval(5)
        while scheduler.inFlightCount > 0 && Date() < settled { try await Task.sleep(for: .milliseconds(5)) }
    }

    @Test(
        "a handed-over batch is guarded like a claimed one: a stale storm trips the breaker",
        arguments: StoreBackend.allCases)
    func handOverStaleGuard(_ backend: StoreBackend) async throws {
        let f = try Fixture(backend)
        defer { f.close() }
        try f.register(10, perUser: 10, platform: .fcm)
        let stale = ScriptedTransport(limit: 100) { _ in
            AttemptReport(outcome: .stale(reason: ProviderReason("UNREGISTERED")), httpStatus: 404)
        }
        let scheduler = Scheduler(
            store: f.store, transports: [QueueLane(app: "default", platform: .fcm): stale],
            settings: SchedulerSettings(maxInflight: 1000))
        scheduler.start()
        defer { scheduler.stopClaiming() }
        #expect(await eventually { scheduler.isIdle })
        let accepted = try await scheduler.accept((0..<10).map { "fcm-\($0)" })
        let s = try await f.waitComplete(accepted.messageID, timeout: 10)
        #expect(scheduler.stats.handedOver == 100)
        #expect(s.counts[.failed] == 100, "the breaker refused every deletion")
        #expect(scheduler.stats.platforms[.fcm]?.breakerTrips == 1)
    }

    @Test("a stuck lane does not hold up the others", arguments: StoreBackend.allCases)
    func laneIsolation(_ backend: StoreBackend) async throws {
        let f = try Fixture(backend)
        defer { f.close() }
        try f.register(10, perUser: 1, platform: .fcm)
        try f.register(10, perUser: 1, platform: .apns)
        let slow = ScriptedTransport(limit: 2)
        slow.close()  // the slow provider answers nothing until the end
        let fast = ScriptedTransport(limit: 100)
        let scheduler = Scheduler(
            store: f.store,
            transports: [
                QueueLane(app: "default", platform: .fcm): slow, QueueLane(app: "default", platform: .apns): fast,
            ],
            settings: SchedulerSettings(maxInflight: 10))
        scheduler.start()
        defer { scheduler.stopClaiming() }
        let slowID = try f.send((0..<10).map { "fcm-\($0)" })
        scheduler.wake()
        // The slow lane is stuck: both its sends are out and unanswered.
        #expect(await eventually { slow.sent == 2 })
        let fastID = try f.send((0..<10).map { "apns-\($0)" })
        scheduler.wake()
        let s = try await f.waitComplete(fastID, timeout: 60)
        #expect(s.counts[.delivered] == 10)
        #expect(
            try f.status(slowID).counts[.delivered] ?? 0 == 0, "the fast lane finished while the slow one was stuck")
        #expect(slow.peak <= 2)
        slow.open()
        #expect(try await f.waitComplete(slowID, timeout: 60).counts[.delivered] == 10)
    }

    @Test(
        "stale devices held for their batch's verdict do not starve the claims that settle it",
        arguments: StoreBackend.allCases)
    func heldStaleDoNotStarve(_ backend: StoreBackend) async throws {
        let f = try Fixture(backend)
        defer { f.close() }
        try f.register(10, perUser: 10, platform: .fcm)
        let stale = ScriptedTransport(limit: 100) { _ in
            AttemptReport(outcome: .stale(reason: ProviderReason("UNREGISTERED")), httpStatus: 404)
        }
        let scheduler = Scheduler(
            store: f.store, transports: [QueueLane(app: "default", platform: .fcm): stale],
            settings: SchedulerSettings(maxInflight: 10))
        scheduler.start()
        defer { scheduler.stopClaiming() }
        let id = try f.send((0..<10).map { "fcm-\($0)" })
        scheduler.wake()
        let s = try await f.waitComplete(id, timeout: 10)
        #expect(s.isComplete)
        #expect(s.counts[.failed] == 100, "the breaker refused every deletion")
        #expect(scheduler.stats.platforms[.fcm]?.breakerTrips == 1)
    }

    @Test("retries use the backoff policy and end failed after max_retries", arguments: StoreBackend.allCases)
    func backoff(_ backend: StoreBackend) async throws {
        let f = try Fixture(backend)
        defer { f.close() }
        try f.register(1, perUser: 1, platform: .fcm)
        let failing = ScriptedTransport(limit: 10) { _ in AttemptReport(outcome: .transient(reason: .timeout)) }
        var settings = SchedulerSettings(maxInflight: 10)
        settings.backoff = BackoffPolicy(maxRetries: 2, base: .milliseconds(20), max: .milliseconds(40))
        let scheduler = Scheduler(
            store: f.store, transports: [QueueLane(app: "default", platform: .fcm): failing], settings: settings,
            random: SplitMix64(seed: 7))
        scheduler.start()
        defer { scheduler.stopClaiming() }
        let id = try f.send(["fcm-0"])
        scheduler.wake()
        let s = try await f.waitComplete(id)
        #expect(s.counts[.failed] == 1)
        #expect(failing.sent == 3)
        #expect(scheduler.stats.platforms[.fcm]?.retried == 2)
    }

    @Test(
        "deliveries of a lane that has no transport any more end skipped, not stuck",
        arguments: StoreBackend.allCases)
    func laneWithoutTransport(_ backend: StoreBackend) async throws {
        let f = try Fixture(backend)
        defer { f.close() }
        try f.register(2, perUser: 2, platform: .fcm)
        try f.register(1, perUser: 1, platform: .apns)
        let apns = ScriptedTransport(limit: 10)
        let scheduler = Scheduler(
            store: f.store, transports: [QueueLane(app: "default", platform: .apns): apns],
            settings: SchedulerSettings(maxInflight: 10))
        scheduler.start()
        defer { scheduler.stopClaiming() }
        let id = try f.send(["fcm-0", "fcm-1", "apns-0"])
        scheduler.wake()
        let s = try await f.waitComplete(id)
        #expect(s.counts[.delivered] == 1 && s.counts[.skipped] == 4)
    }
}

/// Passes sends to `inner`; its concurrency limit drops from `from` to `to`
/// at the first send.
final class ShrinkingTransport: PushTransport, @unchecked Sendable {
    private let inner: ScriptedTransport
    private let limit: Locked<Int>
    private let to: Int
    init(_ inner: ScriptedTransport, from: Int, to: Int) {
        self.inner = inner
        self.limit = Locked(from)
        self.to = to
    }
    var concurrencyLimit: Int { limit.withLock { $0 } }
    func send(_ job: DeliveryJob, completion: @escaping @Sendable (AttemptReport) -> Void) {
        limit.withLock { $0 = to }
        inner.send(job, completion: completion)
    }
}

/// A wall clock the test moves by hand (the scheduler and the store share it).
final class HandClock: WallClock, @unchecked Sendable {
    private let lock = NSLock()
    private var now: Int64 = 1_800_000_000_000
    func nowMilliseconds() -> Int64 { lock.withLock { now } }
    func advance(_ ms: Int64) { lock.withLock { now += ms } }
}

/// Waits for `condition` with a generous deadline; false if it never held.
func eventually(_ seconds: Double = 20, _ condition: () throws -> Bool) async rethrows -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if try condition() { return true }
        try? await Task.sleep(for: .milliseconds(10))
    }
    return try condition()
}

@Suite("Scheduler: delivery semantics (SPEC Revision 2)")
struct SchedulerSemanticsTests {
    @Test(
        "a claimed job that waited for its lane's slot past accepted_at + ttl + 2 s ends expired, never handed over",
        arguments: StoreBackend.allCases)
    func heldJobExpiresBeforeItsSlot(_ backend: StoreBackend) async throws {
        let clock = HandClock()
        let f = try Fixture(backend, clock: clock)
        defer { f.close() }
        try f.register(12, perUser: 1, platform: .fcm)
        let fcm = ScriptedTransport(limit: 12)
        fcm.close()
        // The provider allows 12 sends when the claim is made, then only one
        // (as an HTTP/2 server lowering its stream limit): 11 claimed jobs wait.
        let shrinking = ShrinkingTransport(fcm, from: 12, to: 1)
        // No floor: the lane's first claim is its whole room, all 12 (with a
        // floor the first claim also looks for other lanes' deliveries in the
        // shared part, and the lane's second claim comes after the shrink).
        var settings = SchedulerSettings(maxInflight: 12)
        settings.laneFloor = 0
        let scheduler = Scheduler(
            store: f.store, transports: [QueueLane(app: "default", platform: .fcm): shrinking],
            settings: settings, clock: clock)
        scheduler.start()
        defer { scheduler.stopClaiming() }
        let id = try f.send((0..<12).map { "fcm-\($0)" }, message: PushMessage(kind: .notification, ttlSeconds: 2))
        scheduler.wake()
        // All 12 claimed: one out at the provider (which holds its answer), 11 waiting for the slot.
        #expect(await eventually { scheduler.inFlightCount == 12 && fcm.sent == 1 })
        clock.advance(4_001)
        fcm.open()
        let s = try await f.waitComplete(id)
        #expect(fcm.sent == 1, "nothing handed over past the deadline")
        #expect(s.counts[.delivered] == 1 && s.counts[.expired] == 11)
        #expect(scheduler.stats.platforms[.fcm]?.expired == 11)
    }

    @Test(
        "a credential rejection does not use up max_retries: the delivery waits, without spinning, until a reload",
        arguments: StoreBackend.allCases)
    func credentialWaitUntilReload(_ backend: StoreBackend) async throws {
        let clock = HandClock()
        let f = try Fixture(backend, clock: clock)
        defer { f.close() }
        try f.register(3, perUser: 1, platform: .apns)
        let accept = Locked(false)
        let apns = ScriptedTransport(limit: 10) { _ in
            accept.withLock { $0 }
                ? AttemptReport(outcome: .delivered, httpStatus: 200)
                : AttemptReport(outcome: .authRejected(reason: ProviderReason("InvalidProviderToken")), httpStatus: 403)
        }
        var settings = SchedulerSettings(maxInflight: 10)
        settings.backoff = BackoffPolicy(maxRetries: 0, base: .milliseconds(10), max: .milliseconds(10))
        settings.credentialRetry = .seconds(600)
        let lane = QueueLane(app: "default", platform: .apns)
        let scheduler = Scheduler(store: f.store, transports: [lane: apns], settings: settings, clock: clock)
        scheduler.start()
        defer { scheduler.stopClaiming() }
        let id = try f.send((0..<3).map { "apns-\($0)" })
        scheduler.wake()
        let detail = {
            try f.store.sync { s, done in s.status(app: "default", messageID: id, detail: true, completion: done) }!
        }
        #expect(try await eventually { try detail().counts[.retrying] == 3 })
        let waiting = try #require(try detail().devices)
        #expect(waiting.allSatisfy { $0.reason == "credential_rejected" && $0.attempts == 0 && $0.httpStatus == 403 })
        #expect(scheduler.degradedLanes[lane] == "InvalidProviderToken")
        // No spinning: the claim loop comes to rest with nothing more sent
        // while the credential is unchanged (a wait that spun would claim the
        // deliveries again at once and never rest).
        #expect(await eventually { scheduler.isIdle })
        #expect(apns.sent == 3)
        // A reload (new credentials): due at once, and delivered.
        accept.withLock { $0 = true }
        scheduler.replaceTransports([lane: apns])
        let s = try await f.waitComplete(id)
        #expect(s.counts[.delivered] == 3)
        #expect(apns.sent == 6)
    }

    @Test(
        "a lane's first credential rejection is tried again soon, and the lane's first success releases the rest",
        arguments: StoreBackend.allCases)
    func credentialFirstRejectionAndRecovery(_ backend: StoreBackend) async throws {
        let clock = HandClock()
        let f = try Fixture(backend, clock: clock)
        defer { f.close() }
        try f.register(3, perUser: 1, platform: .fcm)
        // The provider refuses the first three attempts (a stale access token), then takes them.
        let refusals = Locked(3)
        let fcm = ScriptedTransport(limit: 10) { _ in
            let refuse = refusals.withLock { n -> Bool in
                defer { n = max(0, n - 1) }
                return n > 0
            }
            return refuse
                ? AttemptReport(
                    outcome: .authRejected(reason: ProviderReason("THIRD_PARTY_AUTH_ERROR")), httpStatus: 401)
                : AttemptReport(outcome: .delivered, httpStatus: 200)
        }
        var settings = SchedulerSettings(maxInflight: 10)
        settings.credentialRetry = .seconds(600)
        settings.credentialFirstRetry = .seconds(1)
        let scheduler = Scheduler(
            store: f.store, transports: [QueueLane(app: "default", platform: .fcm): fcm], settings: settings,
            clock: clock)
        scheduler.start()
        defer { scheduler.stopClaiming() }
        let id = try f.send(["fcm-0", "fcm-1", "fcm-2"], message: PushMessage(kind: .notification, ttlSeconds: 3600))
        scheduler.wake()
        #expect(await eventually { fcm.sent == 3 && (try? f.status(id).counts[.retrying]) == 3 })
        // One of them (the lane's first refusal) is due after 1 s, the others after 600 s.
        clock.advance(1_000)
        scheduler.wake()
        // Its success clears the lane and releases the two others at once: no 600 s wait.
        let s = try await f.waitComplete(id)
        #expect(s.counts[.delivered] == 3)
        #expect(fcm.sent == 6)
        #expect(scheduler.degradedLanes.isEmpty)
    }

    @Test(
        "a delivery waiting for a credential at a slow cadence is retried uncounted, and ends expired at its TTL",
        arguments: StoreBackend.allCases)
    func credentialWaitCadenceAndTTL(_ backend: StoreBackend) async throws {
        let clock = HandClock()
        let f = try Fixture(backend, clock: clock)
        defer { f.close() }
        try f.register(1, perUser: 1, platform: .fcm)
        let fcm = ScriptedTransport(limit: 10) { _ in
            AttemptReport(outcome: .authRejected(reason: ProviderReason("THIRD_PARTY_AUTH_ERROR")), httpStatus: 401)
        }
        var settings = SchedulerSettings(maxInflight: 10)
        settings.backoff = BackoffPolicy(maxRetries: 1, base: .milliseconds(10), max: .milliseconds(10))
        settings.credentialRetry = .seconds(30)
        let scheduler = Scheduler(
            store: f.store, transports: [QueueLane(app: "default", platform: .fcm): fcm], settings: settings,
            clock: clock)
        scheduler.start()
        defer { scheduler.stopClaiming() }
        let id = try f.send(["fcm-0"], message: PushMessage(kind: .notification, ttlSeconds: 100))
        scheduler.wake()
        // Rejected at 0, 30, 60 and 90 s: more than max_retries, and never failed.
        for round in 1...4 {
            #expect(await eventually { fcm.sent == round && (try? f.status(id).counts[.retrying]) == 1 })
            clock.advance(30_000)
            scheduler.wake()
        }
        // At 120 s the next wait is cut to the send deadline (102 s): it is past, so expired.
        let s = try await f.waitComplete(id)
        #expect(s.counts[.expired] == 1)
        #expect(fcm.sent == 4)
    }

    @Test(
        "a Web Push 401/403 degrades that origin only, never the lane; at most degradedOriginLimit origins are kept",
        arguments: StoreBackend.allCases)
    func webPushOriginsDegradeAlone(_ backend: StoreBackend) async throws {
        let f = try Fixture(backend)
        defer { f.close() }
        let keys = WebPushKeys(
            p256dh: [0x04] + [UInt8](repeating: 7, count: 64), auth: [UInt8](repeating: 9, count: 16))
        for i in 0..<5 {
            let r = Registration(
                app: "default", user: "w\(i)", platform: .web, environment: nil,
                token: "https://Push\(i).Example:8443/sub/\(i)", keys: keys)
            _ = try f.store.sync { s, done in s.register(r, deviceCap: 10, completion: done) }
        }
        let accept = Locked(false)
        let web = ScriptedTransport(limit: 10) { _ in
            accept.withLock { $0 }
                ? AttemptReport(outcome: .delivered, httpStatus: 201)
                : AttemptReport(outcome: .authRejected(reason: .httpStatus(403)), httpStatus: 403)
        }
        var settings = SchedulerSettings(maxInflight: 10)
        settings.backoff = BackoffPolicy(maxRetries: 0)
        settings.degradedOriginLimit = 3
        let lane = QueueLane(app: "default", platform: .web)
        let scheduler = Scheduler(store: f.store, transports: [lane: web], settings: settings)
        scheduler.start()
        defer { scheduler.stopClaiming() }
        // One at a time, so that the order of the origins is known.
        for i in 0..<5 {
            let id = try f.send(["w\(i)"])
            scheduler.wake()
            let s = try await f.waitComplete(id)
            #expect(s.counts[.failed] == 1, "counted toward max_retries (0 here): failed at once")
        }
        #expect(scheduler.degradedLanes.isEmpty, "the app's Web Push is never degraded by a push service")
        #expect(
            scheduler.degradedOrigins[lane]
                == [
                    "https://push2.example:8443": "http_403", "https://push3.example:8443": "http_403",
                    "https://push4.example:8443": "http_403",
                ],
            "the oldest origins are forgotten past the limit")
        accept.withLock { $0 = true }
        let ok = try f.send(["w3"])
        scheduler.wake()
        #expect(try await f.waitComplete(ok).counts[.delivered] == 1)
        #expect(
            scheduler.degradedOrigins[lane]?.keys.sorted() == [
                "https://push2.example:8443", "https://push4.example:8443",
            ])
    }
}
