import HeraldIO
import Dispatch
import Foundation
import HeraldCore
import HeraldCrypto
import APNs
import HeraldScheduler
import HeraldStore
import HeraldJSON
import JSONRPC
import Synchronization
import WebPush
import HeraldConfiguration

/// Per-app state the methods need: limits, who may call, credentials.
struct AppRuntime: Sendable {
    let config: AppConfig
    let credentials: LoadedCredentials
    /// Platforms whose sends are skipped, with why (no credentials, unusable endpoint).
    let disabled: [Platform: String]
}

/// The delivery side, as the methods see it.
struct DeliveryWiring: Sendable {
    let scheduler: Scheduler
    /// `[delivery] max_queued`.
    let maxQueued: Int
    let waiters: MessageWaiters
    let providers: ProviderClients
    /// Each app's channel management, as the current configuration has it.
    let channelManager: @Sendable (String) -> APNsChannelManager?
}

/// What `system.stats` and the metrics say of the store: its backend and,
/// for PostgreSQL, the pool and the lease. Never the connection string.
struct StoreSummary: Sendable, Equatable {
    /// `sqlite` or `postgres`.
    let backend: String
    let poolSize: Int?
    let leaseMs: Int64?

    static let sqlite = StoreSummary(backend: "sqlite", poolSize: nil, leaseMs: nil)

    init(backend: String, poolSize: Int?, leaseMs: Int64?) {
        self.backend = backend
        self.poolSize = poolSize
        self.leaseMs = leaseMs
    }

    init(_ location: StoreLocation) {
        switch location {
        case .sqlite:
            self = .sqlite
        case .postgres(let options):
            let (seconds, attoseconds) = options.lease.components
            self.init(
                backend: "postgres", poolSize: options.poolSize,
                leaseMs: seconds * 1000 + attoseconds / 1_000_000_000_000_000)
        }
    }
}

/// The Herald methods. `handle` runs on the event loop thread; store and
/// resolver work completes on their own threads and replies from there.
// @unchecked: its mutable state is touched on the event loop's thread only (handle and every method run there; the daemon sets its wiring on that thread before the loop runs); what other threads read is an atomic or a Locked.
final class HeraldService: RequestHandler, @unchecked Sendable {
    /// Replaced as a whole by a reload (loop thread only).
    private(set) var apps: [String: AppRuntime]
    let store: any DeliveryStore
    let endpointGuard: EndpointGuard
    let clock: any WallClock
    /// This instance's name (`[server] instance_id` or the host name).
    let instance: String
    let log: Logger
    /// Set before the server starts.
    var delivery: DeliveryWiring?
    /// `events.subscribe`'s stream (set before the server starts; loop thread only).
    var events: EventStream?
    /// The credential checks' verdicts (set before the loop runs; read under their lock).
    var credentialHealth: CredentialMonitor?
    /// The store's figures, read at most once a second (`system.stats`, the metrics).
    let figures: StoreFiguresCache
    /// Where `system.stats` and the metrics text are made from them, off the loop.
    let figuresQueue = DispatchQueue(label: "herald.figures", qos: .utility)
    let discoverDocument: JSON
    // Loop thread only:
    let registerLimiter = RateLimiter<AppUser>(perMinute: 20)
    let unregisterLimiter = RateLimiter<AppUser>(perMinute: 40)
    /// Calls refused with rate_limited, here or (shared store) by the
    /// store's bucket, whose answer arrives on a store thread.
    private let rateLimitedCount = Atomic<Int>(0)
    var rateLimited: Int { rateLimitedCount.load(ordering: .relaxed) }
    /// The store's backend, for `system.stats` (set before the server starts).
    var storeSummary = StoreSummary.sqlite
    /// Latest store probe, for `system.health` (loop thread only).
    var storeHealth = StoreHealth.ok {
        didSet { publishReadiness() }
    }
    /// Configuration reloads that took effect and that were refused (loop thread only).
    var reloads = (applied: 0, refused: 0)
    /// Serving and not stopping, for `/readyz` and `herald_ready` (loop thread only).
    var serving = false {
        didSet { publishReadiness() }
    }
    /// `serving` and `storeHealth` as `/readyz` says them, readable from any
    /// thread: the probe never waits for the loop.
    private let readinessState = Locked((false, "not serving (starting or stopping)"))
    var readiness: (ready: Bool, why: String) { readinessState.withLock { $0 } }
    /// `system.*` calls per peer uid (`[server] system_calls_per_minute`; loop thread only).
    var systemLimiter = SystemCallLimiter(perMinute: 6000)
    /// Runs work on the event loop (`EventLoop.execute`), for calls that wait their turn.
    var runOnLoop: @Sendable (@escaping @Sendable () -> Void) -> Void = { $0() }
    /// How long a `system.*` call refused for the rate waits for its answer.
    static let refusalDelayMs: Int64 = 250
    /// Provides the server's counters for `system.stats` (loop thread only).
    var serverStats: () -> (open: Int, counters: ServerCounters) = { (0, ServerCounters()) }
    let startedAt = monotonicMilliseconds()
    static let version = "0.1.0"

    struct AppUser: Hashable {
        let app: String
        let user: String
    }

    init(
        apps: [String: AppRuntime], store: any DeliveryStore, endpointGuard: EndpointGuard, clock: any WallClock,
        instance: String, log: Logger
    ) {
        self.apps = apps
        self.store = store
        self.endpointGuard = endpointGuard
        self.clock = clock
        self.instance = instance
        self.log = log
        figures = StoreFiguresCache(store: store)
        discoverDocument = (try? JSONParser.parse(Array(OpenRPC.document.utf8))) ?? .null
    }

    typealias Reply = @Sendable (Result<JSON, RPCError>) -> Void
    typealias Method =
        @Sendable (HeraldService, inout ParamReader, CallContext, @escaping Reply) throws(RPCError) -> Void

    /// Every method the daemon serves; `rpc.discover` must document exactly these.
    private static let table: [String: Method] = [
        "device.register": { s, p, c, r throws(RPCError) in try s.register(&p, c, r) },
        "device.unregister": { s, p, c, r throws(RPCError) in try s.unregister(&p, c, r) },
        "device.list": { s, p, c, r throws(RPCError) in try s.list(&p, c, r) },
        "device.update": { s, p, c, r throws(RPCError) in try s.updateDevice(&p, c, r) },
        "session.end": { s, p, c, r throws(RPCError) in try s.endSession(&p, c, r) },
        "activity.register": { s, p, c, r throws(RPCError) in try s.registerActivity(&p, c, r) },
        "activity.unregister": { s, p, c, r throws(RPCError) in try s.unregisterActivity(&p, c, r) },
        "activity.list": { s, p, c, r throws(RPCError) in try s.listActivities(&p, c, r) },
        "channel.create": { s, p, c, r throws(RPCError) in try s.createChannel(&p, c, r) },
        "channel.list": { s, p, c, r throws(RPCError) in try s.listChannels(&p, c, r) },
        "channel.delete": { s, p, c, r throws(RPCError) in try s.deleteChannel(&p, c, r) },
        "push.broadcast": { s, p, c, r throws(RPCError) in try s.pushBroadcast(&p, c, r) },
        "push.send": { s, p, c, r throws(RPCError) in try s.pushSend(&p, c, r) },
        "push.status": { s, p, c, r throws(RPCError) in try s.pushStatus(&p, c, r) },
        "push.cancel": { s, p, c, r throws(RPCError) in try s.pushCancel(&p, c, r) },
        "user.forget": { s, p, c, r throws(RPCError) in try s.forget(&p, c, r) },
        "events.subscribe": { s, p, c, r throws(RPCError) in try s.subscribe(&p, c, r) },
        "events.unsubscribe": { s, p, c, r throws(RPCError) in try s.unsubscribe(&p, c, r) },
        "system.health": { s, p, c, r throws(RPCError) in r(.success(try s.health(&p, c))) },
        "system.stats": { s, p, c, r throws(RPCError) in try s.stats(&p, c, r) },
        "system.metrics": { s, p, c, r throws(RPCError) in
            _ = try s.app(&p, c)
            try p.finish()
            s.metrics(only: s.visibleApps(c), appFigures: true) { result in
                r(result.map { ["content_type": .string(PrometheusText.contentType), "text": .string($0)] })
            }
        },
        "vapid.public_key": { s, p, c, r throws(RPCError) in r(.success(try s.vapidPublicKey(&p, c))) },
        "rpc.discover": { s, p, c, r throws(RPCError) in
            _ = try s.app(&p, c)
            try p.finish()
            r(.success(s.discoverDocument))
        },
    ]

    static var methods: [String] { table.keys.sorted() }

    func handle(_ request: RPCRequest, context: CallContext, reply: @escaping Reply) {
        guard let method = Self.table[request.method] else {
            reply(.failure(.methodNotFound(request.method)))
            return
        }
        if request.method.hasPrefix("system.") {
            let health = request.method == "system.health"
            switch systemLimiter.take(context.uid, now: monotonicMilliseconds(), health: health) {
            case .now:
                break
            case .after(let ms):
                // Its turn at the pace: run then, on the loop.
                let runOnLoop = self.runOnLoop
                DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(Int(ms))) { [self] in
                    runOnLoop { [self] in run(method, request, context, reply) }
                }
                return
            case .refused(let wait):
                // Answered only after 250 ms, as nginx's limit_req delays
                // excess requests: a connection calling in a loop past its
                // allowance has four refusals a second, not one every few
                // milliseconds taking the loop from everyone else.
                rateLimitedCount.add(1, ordering: .relaxed)
                let delay = Self.refusalDelayMs
                let refusal = RPCError(.rateLimited(retryAfterMs: max(1, wait - delay)))
                DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(Int(delay))) {
                    reply(.failure(refusal))
                }
                return
            }
        }
        run(method, request, context, reply)
    }

    private func run(_ method: Method, _ request: RPCRequest, _ context: CallContext, _ reply: @escaping Reply) {
        var params = ParamReader(request.params)
        do throws(RPCError) {
            try method(self, &params, context, reply)
        } catch {
            reply(.failure(error))
        }
    }

    // MARK: Shared parameter rules

    /// The `app` param (default "default"), checked to exist and to admit the peer.
    func app(_ p: inout ParamReader, _ context: CallContext) throws(RPCError) -> AppRuntime {
        try runtime(named: try p.string("app", maxBytes: 64) ?? "default", context)
    }

    /// The named app, checked to exist and to admit the peer.
    func runtime(named name: String, _ context: CallContext) throws(RPCError) -> AppRuntime {
        guard let runtime = apps[name] else { throw RPCError(.unknownApp(name)) }
        guard runtime.config.allows(uid: context.uid, gid: context.gid, groups: context.groups) else {
            throw RPCError(.forbidden(app: name))
        }
        return runtime
    }

    func user(_ p: inout ParamReader) throws(RPCError) -> String {
        try p.string("user", required: true, maxBytes: 256)!
    }

    func limit(_ limiter: RateLimiter<AppUser>, app: String, user: String) throws(RPCError) {
        if let wait = limiter.take(AppUser(app: app, user: user), now: monotonicMilliseconds()) {
            rateLimitedCount.add(1, ordering: .relaxed)
            throw RPCError(.rateLimited(retryAfterMs: wait))
        }
    }

    /// The per-user limits of `device.register` (20 a minute) and
    /// `device.unregister` (40), as the store's shared buckets name them.
    enum SharedLimit: String {
        case register, unregister

        var perMinute: Int { self == .register ? 20 : 40 }
    }

    /// With a store other instances share, the per-user limit holds across
    /// all of them: after this instance's own limiter allowed the call, the
    /// store's shared bucket must allow it too. `proceed` runs (on a store
    /// thread then) only when both do; otherwise the call is answered
    /// rate_limited, or store_unavailable when the store cannot say.
    func sharedLimit(
        _ limit: SharedLimit, app: String, user: String, _ reply: @escaping Reply,
        then proceed: @escaping @Sendable () -> Void
    ) {
        guard store.isShared else { return proceed() }
        let bucket = limit.rawValue + "\u{1F}" + app + "\u{1F}" + user
        store.takeSharedToken(bucket, perMinute: limit.perMinute) { [self] result in
            switch result {
            case .success(nil):
                proceed()
            case .success(let wait?):
                self.rateLimitedCount.add(1, ordering: .relaxed)
                reply(.failure(RPCError(.rateLimited(retryAfterMs: max(1, wait)))))
            case .failure(let error):
                log.error("store_failed", ["error": String(describing: error)])
                reply(.failure(.storeUnavailable))
            }
        }
    }

    /// Completes a store job on its thread, mapping errors to JSON-RPC.
    func finish<T>(
        _ reply: @escaping Reply, _ body: @escaping @Sendable (T) -> JSON
    )
        -> @Sendable (Result<T, any Error>) -> Void
    {
        { [log] result in
            switch result {
            case .success(let value): reply(.success(body(value)))
            case .failure(let error as RegistrationConflict):
                reply(.failure(RPCError(.conflict(reason: error.reason, storedVersion: error.storedVersion))))
            case .failure(let error as PreferenceConflict):
                reply(.failure(.invalidParams(field: error.field, reason: error.reason)))
            case .failure(let error):
                log.error("store_failed", ["error": String(describing: error)])
                reply(.failure(.storeUnavailable))
            }
        }
    }

    func replaceApps(_ new: [String: AppRuntime]) {
        apps = new
    }

    private func publishReadiness() {
        let state: (Bool, String) =
            !serving
            ? (false, "not serving (starting or stopping)")
            : !storeHealth.isOK ? (false, "store \(storeHealth.wire)") : (true, "ok")
        readinessState.withLock { $0 = state }
    }

    /// Forgets idle rate-limit entries (called from a loop timer).
    func expireLimiters() {
        let now = monotonicMilliseconds()
        registerLimiter.expireIdle(now: now)
        unregisterLimiter.expireIdle(now: now)
        systemLimiter.expireIdle(now: now)
    }
}

extension RPCError {
    /// A call the store could not serve (a write or read that failed: the
    /// database locked past its busy timeout, full, or unreachable): -32603
    /// with `data.reason` `store_unavailable`. Nothing of the call is kept;
    /// the client may try again. The cause is logged, never sent.
    static let storeUnavailable = RPCError.internalError("store_unavailable")
}
