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
final class SharedBucketStore: ForwardingStore, @unchecked Sendable {
    let shared: Bool
    private let answer: @Sendable (String, Int) -> Result<Int64?, any Error>
    private let asked = Locked<[(bucket: String, perMinute: Int)]>([])

    init(
        _ inner: any DeliveryStore, shared: Bool = true,
        answer: @escaping @Sendable (String, Int) -> Result<Int64?, any Error>
    ) {
        self.shared = shared
        self.answer = answer
        super.init(inner)
    }

    var buckets: [(bucket: String, perMinute: Int)] { asked.withLock { $0 } }

    override var isShared: Bool { shared }
    override func takeSharedToken(
        _ bucket: String, perMinute: Int, completion: @escaping @Sendable (Result<Int64?, any Error>) -> Void
    ) {
        asked.withLock { $0.append((bucket, perMinute)) }
        // Answered on another thread, as a store's own thread would.
        let result = answer(bucket, perMinute)
        DispatchQueue.global().async { completion(result) }
    }

    /// No other instance tells this one of work.
    override func setWorkObserver(_ observer: @escaping @Sendable () -> Void) {}
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
