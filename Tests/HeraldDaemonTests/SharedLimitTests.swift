import Foundation
import HeraldCore
import HeraldCrypto
import HeraldIO
import HeraldStore
import HeraldStoreTestSupport
import HeraldJSON
import HeraldNet
import JSONRPC
import Testing
import WebPush

@testable import HeraldDaemon
@testable import HeraldConfiguration

#if canImport(Glibc)
    import Glibc
#endif

/// A real SQLite store that says it is shared, and whose shared rate buckets
/// answer as the test scripts them (recording what was asked).
final class SharedBucketStore: DeliveryStore, @unchecked Sendable {
    let inner: any DeliveryStore
    let shared: Bool
    private let answer: @Sendable (String, Int) -> Result<Int64?, any Error>
    private let asked = Locked<[(bucket: String, perMinute: Int)]>([])

    init(
        _ inner: any DeliveryStore, shared: Bool = true,
        answer: @escaping @Sendable (String, Int) -> Result<Int64?, any Error>
    ) {
        self.inner = inner
        self.shared = shared
        self.answer = answer
    }

    var buckets: [(bucket: String, perMinute: Int)] { asked.withLock { $0 } }

    var isShared: Bool { shared }
    func takeSharedToken(
        _ bucket: String, perMinute: Int, completion: @escaping @Sendable (Result<Int64?, any Error>) -> Void
    ) {
        asked.withLock { $0.append((bucket, perMinute)) }
        // Answered on another thread, as a store's own thread would.
        let result = answer(bucket, perMinute)
        DispatchQueue.global().async { completion(result) }
    }

    var keyOutcome: StoreKeyOutcome { inner.keyOutcome }
    var recoveredDeliveries: Int { inner.recoveredDeliveries }
    var unfinishedCompleted: Int { inner.unfinishedCompleted }
    func close() { inner.close() }
    func setWorkObserver(_ observer: @escaping @Sendable () -> Void) {}
    func register(
        _ r: Registration, deviceCap: Int,
        completion: @escaping @Sendable (Result<RegistrationOutcome, any Error>) -> Void
    ) { inner.register(r, deviceCap: deviceCap, completion: completion) }
    func unregister(
        app: String, user: String, _ s: UnregisterSelector,
        completion: @escaping @Sendable (Result<Int, any Error>) -> Void
    ) { inner.unregister(app: app, user: user, s, completion: completion) }
    func list(app: String, user: String, completion: @escaping @Sendable (Result<[DeviceSummary], any Error>) -> Void) {
        inner.list(app: app, user: user, completion: completion)
    }
    func endSession(
        app: String, user: String, session: String, completion: @escaping @Sendable (Result<Int, any Error>) -> Void
    ) { inner.endSession(app: app, user: user, session: session, completion: completion) }
    func forget(app: String, user: String, completion: @escaping @Sendable (Result<Int, any Error>) -> Void) {
        inner.forget(app: app, user: user, completion: completion)
    }
    func deviceCounts(completion: @escaping @Sendable (Result<[Platform: Int], any Error>) -> Void) {
        inner.deviceCounts(completion: completion)
    }
    func deviceCountsByApp(completion: @escaping @Sendable (Result<[String: [Platform: Int]], any Error>) -> Void) {
        inner.deviceCountsByApp(completion: completion)
    }
    func webSubscriptionsByKey(completion: @escaping @Sendable (Result<[ServerKeyCount], any Error>) -> Void) {
        inner.webSubscriptionsByKey(completion: completion)
    }
    func recordServerKey(app: String, key: String, completion: @escaping @Sendable (Result<Int, any Error>) -> Void) {
        inner.recordServerKey(app: app, key: key, completion: completion)
    }
    func updateDevice(
        app: String, user: String, deviceID: String, name: String?, enabled: Bool?,
        completion: @escaping @Sendable (Result<DeviceSummary?, any Error>) -> Void
    ) {
        inner.updateDevice(
            app: app, user: user, deviceID: deviceID, name: name, enabled: enabled, completion: completion)
    }
    func deviceOwner(
        app: String, deviceID: String, completion: @escaping @Sendable (Result<String?, any Error>) -> Void
    ) { inner.deviceOwner(app: app, deviceID: deviceID, completion: completion) }
    func enqueue(_ e: Enqueue, completion: @escaping @Sendable (Result<Enqueued, any Error>) -> Void) {
        inner.enqueue(e, completion: completion)
    }
    func enqueue(
        _ e: Enqueue, handoff: [QueueLane: Int], limit: Int, early: (@Sendable (Claim) -> Void)?,
        completion: @escaping @Sendable (Result<(accepted: Enqueued, claim: Claim), any Error>) -> Void
    ) { inner.enqueue(e, handoff: handoff, limit: limit, early: early, completion: completion) }
    func status(
        app: String, messageID: String, detail: Bool,
        completion: @escaping @Sendable (Result<MessageStatus?, any Error>) -> Void
    ) { inner.status(app: app, messageID: messageID, detail: detail, completion: completion) }
    func cancel(app: String, messageID: String, completion: @escaping @Sendable (Result<Int?, any Error>) -> Void) {
        inner.cancel(app: app, messageID: messageID, completion: completion)
    }
    func claimDue(
        lanes: [QueueLane: Int], others: Int, counted: Set<BatchKey>,
        completion: @escaping @Sendable (Result<Claim, any Error>) -> Void
    ) {
        inner.claimDue(lanes: lanes, others: others, counted: counted, completion: completion)
    }
    func record(
        deliveryID: Int64, state: DeliveryState, httpStatus: Int?, reason: RecordedReason?, nextAttemptAt: Int64?,
        completion: @escaping @Sendable (Result<Void, any Error>) -> Void
    ) {
        inner.record(
            deliveryID: deliveryID, state: state, httpStatus: httpStatus, reason: reason, nextAttemptAt: nextAttemptAt,
            completion: completion)
    }
    func record(_ records: [DeliveryRecord], completion: @escaping @Sendable (Result<Void, any Error>) -> Void) {
        inner.record(records, completion: completion)
    }
    func releaseCredentialWaits(lanes: [QueueLane], completion: @escaping @Sendable (Result<Int, any Error>) -> Void) {
        inner.releaseCredentialWaits(lanes: lanes, completion: completion)
    }
    func removeStale(
        deliveryID: Int64, deviceID: String, tokenHash: String, httpStatus: Int?, reason: ProviderReason,
        windowCap: Int,
        completion: @escaping @Sendable (Result<StaleRemoval, any Error>) -> Void
    ) {
        inner.removeStale(
            deliveryID: deliveryID, deviceID: deviceID, tokenHash: tokenHash, httpStatus: httpStatus, reason: reason,
            windowCap: windowCap, completion: completion)
    }
    func purgeMessages(olderThan retention: Duration, completion: @escaping @Sendable (Result<Int, any Error>) -> Void)
    {
        inner.purgeMessages(olderThan: retention, completion: completion)
    }
    func queueDepth(completion: @escaping @Sendable (Result<QueueDepth, any Error>) -> Void) {
        inner.queueDepth(completion: completion)
    }
    func queueDepthByApp(completion: @escaping @Sendable (Result<[String: QueueDepth], any Error>) -> Void) {
        inner.queueDepthByApp(completion: completion)
    }
    func ping(completion: @escaping @Sendable (Result<Void, any Error>) -> Void) { inner.ping(completion: completion) }
}

/// `device.register` and `device.unregister` on a store several instances share.
@Suite("Shared per-user limits")
struct SharedLimitTests {
    struct Outage: Error {}

    /// A service over a fresh SQLite store behind a ``SharedBucketStore``.
    final class Harness: @unchecked Sendable {
        let scratch: StoreScratch
        let inner: any DeliveryStore
        let store: SharedBucketStore
        let service: HeraldService

        init(shared: Bool = true, answer: @escaping @Sendable (String, Int) -> Result<Int64?, any Error>) throws {
            scratch = try StoreScratch(.sqlite, prefix: "herald-shared-limit")
            inner = try scratch.open(key: try StoreKey.generate())
            store = SharedBucketStore(inner, shared: shared, answer: answer)
            let app = AppConfig(name: "default")
            service = HeraldService(
                apps: [
                    "default": AppRuntime(config: app, credentials: try LoadedCredentials(loading: app), disabled: [:])
                ],
                store: store, endpointGuard: EndpointGuard(resolver: StaticResolver([:])), clock: SystemClock(),
                instance: "test", log: Logger(level: .error))
        }

        func call(_ method: String, _ params: JSONObject) async -> Result<JSON, RPCError> {
            await withCheckedContinuation { c in
                service.handle(
                    RPCRequest(method: method, params: params, id: .string("1")),
                    context: CallContext(uid: getuid(), gid: getgid(), pid: getpid())
                ) { c.resume(returning: $0) }
            }
        }

        func devices(_ user: String) throws -> Int {
            try inner.sync { s, done in s.list(app: "default", user: user, completion: done) }.count
        }

        deinit {
            inner.close()
            scratch.remove()
        }
    }

    static let register: JSONObject = ["user": .string("alice"), "platform": .string("fcm"), "token": .string("tok-1")]

    @Test(
        "a shared store's bucket that answers a wait refuses device.register as rate_limited, and nothing is registered"
    )
    func registerRefused() async throws {
        let h = try Harness { _, _ in .success(1234) }
        let result = await h.call("device.register", Self.register)
        guard case .failure(let error) = result else {
            Issue.record("expected rate_limited, got \(result)")
            return
        }
        #expect(error.code == 1002 && error.reason == "rate_limited")
        #expect(error.data?["retry_after_ms"]?.numberValue?.int64 == 1234)
        #expect(try h.devices("alice") == 0)
        #expect(h.service.rateLimited == 1)
        #expect(h.store.buckets.map(\.bucket) == ["register\u{1F}default\u{1F}alice"])
        #expect(h.store.buckets.map(\.perMinute) == [20])
    }

    @Test("a shared bucket that allows lets register and unregister through; unregister asks its own bucket of 40")
    func allowed() async throws {
        let h = try Harness { _, _ in .success(nil) }
        guard case .success(let registered) = await h.call("device.register", Self.register) else {
            Issue.record("register refused")
            return
        }
        #expect(try h.devices("alice") == 1)
        let id = try #require(registered["device_id"]?.stringValue)
        guard
            case .success(let removed) = await h.call(
                "device.unregister", ["user": .string("alice"), "device_id": .string(id)])
        else {
            Issue.record("unregister refused")
            return
        }
        #expect(removed["removed"]?.numberValue?.int64 == 1)
        #expect(
            h.store.buckets.map(\.bucket) == ["register\u{1F}default\u{1F}alice", "unregister\u{1F}default\u{1F}alice"])
        #expect(h.store.buckets.map(\.perMinute) == [20, 40])
        #expect(h.service.rateLimited == 0)
    }

    @Test("a shared bucket that answers a wait refuses device.unregister; the device stays")
    func unregisterRefused() async throws {
        let h = try Harness { bucket, _ in .success(bucket.hasPrefix("unregister") ? 500 : nil) }
        guard case .success(let registered) = await h.call("device.register", Self.register) else {
            Issue.record("register refused")
            return
        }
        let id = try #require(registered["device_id"]?.stringValue)
        let result = await h.call("device.unregister", ["user": .string("alice"), "device_id": .string(id)])
        guard case .failure(let error) = result else {
            Issue.record("expected rate_limited, got \(result)")
            return
        }
        #expect(error.code == 1002 && error.data?["retry_after_ms"]?.numberValue?.int64 == 500)
        #expect(try h.devices("alice") == 1)
    }

    @Test("a store failure in the shared bucket is store_unavailable, never an accept")
    func bucketFailure() async throws {
        let h = try Harness { _, _ in .failure(Outage()) }
        let result = await h.call("device.register", Self.register)
        guard case .failure(let error) = result else {
            Issue.record("expected store_unavailable, got \(result)")
            return
        }
        #expect(error.code == -32603 && error.reason == "store_unavailable")
        #expect(try h.devices("alice") == 0)
    }

    @Test("a store only this instance uses is not asked: the local limiter is the whole truth")
    func notShared() async throws {
        let h = try Harness(shared: false) { _, _ in .success(60_000) }
        guard case .success = await h.call("device.register", Self.register) else {
            Issue.record("register refused")
            return
        }
        #expect(h.store.buckets.isEmpty)
        #expect(try h.devices("alice") == 1)
    }

    @Test("the local limiter still answers first: past 20 a minute the shared bucket is not asked")
    func localFirst() async throws {
        let h = try Harness { _, _ in .success(nil) }
        let started = monotonicMilliseconds()
        for i in 0..<25 {
            let params: JSONObject = [
                "user": .string("alice"), "platform": .string("fcm"), "token": .string("tok-\(i)"),
            ]
            _ = await h.call("device.register", params)
        }
        // The local bucket gives a token back every 3 s (20 a minute): on a
        // machine slow enough to take that long, each 3 s lets one more through.
        let refilled = Int((monotonicMilliseconds() - started) / 3000)
        let asked = h.store.buckets.count
        #expect(asked >= 20 && asked <= 20 + refilled, "\(asked) calls reached the shared bucket")
        #expect(h.service.rateLimited == 25 - asked, "every other call was refused locally")
    }
}
