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

/// Application error codes of the interface (SPEC "Errors").
enum AppError {
    static func notPubliclyRoutable(_ address: String) -> RPCError {
        .application(
            code: 1001, reason: "not_publicly_routable",
            message: "endpoint resolves to an address that is not publicly routable",
            extra: [("field", "token"), ("address", .string(address))])
    }

    static func rateLimited(retryAfterMs: Int64) -> RPCError {
        .application(
            code: 1002, reason: "rate_limited", message: "rate limit reached",
            extra: [("retry_after_ms", .int(retryAfterMs))])
    }

    static func unknownApp(_ app: String) -> RPCError {
        .application(code: 1004, reason: "unknown_app", message: "no such app: \(app)", extra: [("app", .string(app))])
    }

    static func forbidden(_ app: String) -> RPCError {
        .application(code: 1006, reason: "forbidden", message: "this peer may not call app \(app)")
    }

    static func conflict(_ c: RegistrationConflict) -> RPCError {
        .application(
            code: 1008, reason: "conflict", message: c.reason, extra: [("version", .int(c.storedVersion))])
    }
}

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
final class HeraldService: RequestHandler, @unchecked Sendable {
    /// Replaced as a whole by a reload (loop thread only).
    private(set) var apps: [String: AppRuntime]
    let store: any DeliveryStore
    private let endpointGuard: EndpointGuard
    private let clock: any WallClock
    /// This instance's name (`[server] instance_id` or the host name).
    let instance: String
    let log: Logger
    /// Set before the server starts.
    var delivery: DeliveryWiring?
    private let resolverQueue = DispatchQueue(label: "herald.resolver", attributes: .concurrent)
    private let discoverDocument: JSON
    // Loop thread only:
    private let registerLimiter = RateLimiter<AppUser>(perMinute: 20)
    private let unregisterLimiter = RateLimiter<AppUser>(perMinute: 40)
    /// Calls refused with rate_limited, here or (shared store) by the
    /// store's bucket, whose answer arrives on a store thread.
    private let rateLimitedCount = Atomic<Int>(0)
    var rateLimited: Int { rateLimitedCount.load(ordering: .relaxed) }
    /// The store's backend, for `system.stats` (set before the server starts).
    var storeSummary = StoreSummary.sqlite
    /// Latest store probe, for `system.health` (loop thread only).
    var storeHealth = "ok"
    /// Configuration reloads that took effect and that were refused (loop thread only).
    var reloads = (applied: 0, refused: 0)
    /// Serving and not stopping, for `/readyz` and `herald_ready` (loop thread only).
    var serving = false
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
        discoverDocument = (try? JSONParser.parse(Array(OpenRPC.document.utf8))) ?? .null
    }

    typealias Reply = @Sendable (Result<JSON, RPCError>) -> Void
    typealias Method = @Sendable (HeraldService, inout ParamReader, CallContext, @escaping Reply) throws(RPCError) -> Void

    /// Every method the daemon serves; `rpc.discover` must document exactly these.
    private static let table: [String: Method] = [
        "device.register": { s, p, c, r throws(RPCError) in try s.register(&p, c, r) },
        "device.unregister": { s, p, c, r throws(RPCError) in try s.unregister(&p, c, r) },
        "device.list": { s, p, c, r throws(RPCError) in try s.list(&p, c, r) },
        "session.end": { s, p, c, r throws(RPCError) in try s.endSession(&p, c, r) },
        "push.send": { s, p, c, r throws(RPCError) in try s.pushSend(&p, c, r) },
        "push.status": { s, p, c, r throws(RPCError) in try s.pushStatus(&p, c, r) },
        "push.cancel": { s, p, c, r throws(RPCError) in try s.pushCancel(&p, c, r) },
        "user.forget": { s, p, c, r throws(RPCError) in try s.forget(&p, c, r) },
        "system.health": { s, p, c, r throws(RPCError) in r(.success(try s.health(&p, c))) },
        "system.stats": { s, p, c, r throws(RPCError) in try s.stats(&p, c, r) },
        "system.metrics": { s, p, c, r throws(RPCError) in
            _ = try s.app(&p, c)
            try p.finish()
            s.metrics(only: s.visibleApps(c)) { result in
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
    private func runtime(named name: String, _ context: CallContext) throws(RPCError) -> AppRuntime {
        guard let runtime = apps[name] else { throw AppError.unknownApp(name) }
        guard runtime.config.allows(uid: context.uid, gid: context.gid, groups: context.groups) else { throw AppError.forbidden(name) }
        return runtime
    }

    private func user(_ p: inout ParamReader) throws(RPCError) -> String {
        try p.string("user", required: true, maxBytes: 256)!
    }

    private func limit(_ limiter: RateLimiter<AppUser>, app: String, user: String) throws(RPCError) {
        if let wait = limiter.take(AppUser(app: app, user: user), now: monotonicMilliseconds()) {
            rateLimitedCount.add(1, ordering: .relaxed)
            throw AppError.rateLimited(retryAfterMs: wait)
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
    private func sharedLimit(
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
                reply(.failure(AppError.rateLimited(retryAfterMs: max(1, wait))))
            case .failure(let error):
                log.error("store_failed", ["error": String(describing: error)])
                reply(.failure(.storeUnavailable))
            }
        }
    }

    /// Completes a store job on its thread, mapping errors to JSON-RPC.
    private func finish<T>(_ reply: @escaping Reply, _ body: @escaping @Sendable (T) -> JSON)
        -> @Sendable (Result<T, any Error>) -> Void
    {
        { [log] result in
            switch result {
            case .success(let value): reply(.success(body(value)))
            case .failure(let error as RegistrationConflict): reply(.failure(AppError.conflict(error)))
            case .failure(let error):
                log.error("store_failed", ["error": String(describing: error)])
                reply(.failure(.storeUnavailable))
            }
        }
    }

    // MARK: device.register

    private func register(_ p: inout ParamReader, _ context: CallContext, _ reply: @escaping Reply) throws(RPCError) {
        let runtime = try app(&p, context)
        let user = try user(&p)
        let platform = Platform(rawValue: try p.enumeration("platform", required: true, allowed: Platform.allCases.map(\.rawValue))!)!
        var token = try p.string("token", required: true, maxBytes: 4096)!
        var environment: APNsEnvironment?
        if let env = try p.enumeration("environment", allowed: APNsEnvironment.allCases.map(\.rawValue)) {
            guard platform.hasEnvironment else { throw p.invalid("environment", "is only for apns and apns_voip") }
            environment = APNsEnvironment(rawValue: env)
        } else if platform.hasEnvironment {
            environment = .production
        }
        var keys: WebPushKeys?
        let keysReader = try p.object("keys")
        switch platform {
        case .apns, .apnsVoIP:
            token = try Self.apnsToken(token, p)
            if keysReader != nil { throw p.invalid("keys", "is only for web") }
        case .fcm:
            if token.utf8.contains(where: { $0 <= 0x20 || $0 == 0x7f }) {
                throw p.invalid("token", "must not contain whitespace or control characters")
            }
            if keysReader != nil { throw p.invalid("keys", "is only for web") }
        case .web:
            guard var k = keysReader else { throw p.invalid("keys", "is required for web") }
            keys = try Self.webKeys(&k)
            try k.finish()
            if token.utf8.count > EndpointGuard.maximumLength {
                throw p.invalid("token", "must be at most \(EndpointGuard.maximumLength) bytes")
            }
        }
        let name = try p.string("name", maxBytes: 256, allowEmpty: true)
        let appVersion = try p.string("app_version", maxBytes: 64, allowEmpty: true)
        let session = try p.string("session", maxBytes: 512)
        let registrationID = try p.string("registration_id", maxBytes: 128)
        let version = try p.int("version", range: 0...(1 << 53))
        if version != nil && registrationID == nil {
            throw p.invalid("version", "requires registration_id")
        }
        if registrationID != nil && version == nil {
            throw p.invalid("version", "is required with registration_id")
        }
        try p.finish()
        try limit(registerLimiter, app: runtime.config.name, user: user)

        let registration = Registration(
            app: runtime.config.name, user: user, platform: platform, environment: environment, token: token,
            keys: keys, name: name, appVersion: appVersion, session: session, registrationID: registrationID,
            version: version.map(Int64.init))
        let cap = runtime.config.deviceCap
        let store = self.store
        let done = finish(reply) { (o: RegistrationOutcome) -> JSON in
            [
                "device_id": .string(o.deviceID), "token_hash": .string(o.tokenHash), "created": .bool(o.created),
                "reclaimed": .bool(o.reclaimed), "evicted": .array(o.evicted.map { .string($0) }),
            ]
        }
        guard platform == .web else {
            sharedLimit(.register, app: runtime.config.name, user: user, reply) {
                store.register(registration, deviceCap: cap, completion: done)
            }
            return
        }
        // The endpoint is resolved off the loop (on the guard's lookup threads, for at most
        // 2 s, when its resolver is asynchronous), then on to the store.
        let endpointGuard = self.endpointGuard
        let checked: @Sendable (Result<CheckedEndpoint, EndpointError>) -> Void = { result in
            switch result {
            case .success(let endpoint):
                // The binding uses the normalised URL, so spellings of one endpoint are one device.
                var normalized = registration
                normalized.token = endpoint.url
                store.register(normalized, deviceCap: cap, completion: done)
            case .failure(let error):
                reply(.failure(Self.endpointError(error)))
            }
        }
        let resolverQueue = self.resolverQueue
        sharedLimit(.register, app: runtime.config.name, user: user, reply) {
            resolverQueue.async {
                if let now = endpointGuard.check(registration.token, completion: checked) { checked(now) }
            }
        }
    }

    static func endpointError(_ error: EndpointError) -> RPCError {
        switch error {
        case .notPubliclyRoutable(let address): AppError.notPubliclyRoutable(address)
        case .unresolvable: .invalidParams(field: "token", reason: "host does not resolve")
        case .malformed, .resolutionFailed: .invalidParams(field: "token", reason: error.description)
        }
    }

    /// APNs tokens are hex; stored lowercase so that case never splits a binding.
    private static func apnsToken(_ token: String, _ p: ParamReader) throws(RPCError) -> String {
        let bytes = token.utf8
        guard bytes.count >= 16, bytes.count <= 512, bytes.count % 2 == 0,
            bytes.allSatisfy({ ($0 >= 48 && $0 <= 57) || ($0 >= 65 && $0 <= 70) || ($0 >= 97 && $0 <= 102) })
        else {
            throw p.invalid("token", "must be an even number (16 to 512) of hex digits")
        }
        return token.lowercased()
    }

    private static func webKeys(_ k: inout ParamReader) throws(RPCError) -> WebPushKeys {
        let p256dhText = try k.string("p256dh", required: true, maxBytes: 128)!
        let authText = try k.string("auth", required: true, maxBytes: 64)!
        let p256dh: [UInt8]
        do {
            p256dh = try Base64URL.decode(p256dhText)
            try P256.checkPublicKey(p256dh)
        } catch {
            throw k.invalid("p256dh", Self.keyReason(error))
        }
        let auth: [UInt8]
        do {
            auth = try Base64URL.decode(authText)
        } catch {
            throw k.invalid("auth", Self.keyReason(error))
        }
        guard auth.count == 16 else { throw k.invalid("auth", "must be 16 bytes") }
        return WebPushKeys(p256dh: p256dh, auth: auth)
    }

    private static func keyReason(_ error: CryptoError) -> String {
        switch error {
        case .malformedBase64: "must be base64url"
        case .publicKeyLength: "must be a 65-byte uncompressed P-256 point"
        case .publicKeyFormat: "must be an uncompressed point (0x04 prefix)"
        case .publicKeyNotOnCurve: "is not a point on P-256"
        default: error.description
        }
    }

    // MARK: device.unregister, device.list, session.end, user.forget

    private func unregister(_ p: inout ParamReader, _ context: CallContext, _ reply: @escaping Reply) throws(RPCError) {
        let runtime = try app(&p, context)
        let user = try user(&p)
        let deviceID = try p.string("device_id", maxBytes: 32)
        let platformName = try p.enumeration("platform", allowed: Platform.allCases.map(\.rawValue))
        let token = try p.string("token", maxBytes: 4096)
        let envName = try p.enumeration("environment", allowed: APNsEnvironment.allCases.map(\.rawValue))
        let registrationID = try p.string("registration_id", maxBytes: 128)
        let version = try p.int("version", range: 0...(1 << 53))
        try p.finish()
        let selector: UnregisterSelector
        let forms = [deviceID != nil, platformName != nil || token != nil, registrationID != nil || version != nil]
        guard forms.filter({ $0 }).count == 1 else {
            throw p.invalid("device_id", "give exactly one of: device_id; platform and token; registration_id and version")
        }
        if version != nil && registrationID == nil { throw p.invalid("version", "requires registration_id") }
        if let deviceID {
            guard deviceID.utf8.count == 32, deviceID.utf8.allSatisfy({ ($0 >= 48 && $0 <= 57) || ($0 >= 97 && $0 <= 102) })
            else { throw p.invalid("device_id", "must be 32 lowercase hex characters") }
            if envName != nil { throw p.invalid("environment", "goes with platform and token") }
            selector = .deviceID(deviceID)
        } else if let registrationID {
            guard let version else { throw p.invalid("version", "is required with registration_id") }
            if envName != nil { throw p.invalid("environment", "goes with platform and token") }
            selector = .registration(id: registrationID, version: Int64(version))
        } else {
            guard let platformName, let platform = Platform(rawValue: platformName) else {
                throw p.invalid("platform", "is required with token")
            }
            guard var token else { throw p.invalid("token", "is required with platform") }
            var environment: APNsEnvironment?
            if platform.hasEnvironment {
                token = try Self.apnsToken(token, p)
                environment = envName.flatMap(APNsEnvironment.init(rawValue:)) ?? .production
            } else if envName != nil {
                throw p.invalid("environment", "is only for apns and apns_voip")
            }
            if platform == .web, let normalized = try? endpointGuard.normalize(token) { token = normalized }
            selector = .binding(platform: platform, environment: environment, token: token)
        }
        try limit(unregisterLimiter, app: runtime.config.name, user: user)
        let store = self.store
        let app = runtime.config.name
        let done = finish(reply) { (n: Int) -> JSON in ["removed": .int(n)] }
        sharedLimit(.unregister, app: app, user: user, reply) {
            store.unregister(app: app, user: user, selector, completion: done)
        }
    }

    private func list(_ p: inout ParamReader, _ context: CallContext, _ reply: @escaping Reply) throws(RPCError) {
        let runtime = try app(&p, context)
        let user = try user(&p)
        try p.finish()
        store.list(app: runtime.config.name, user: user, completion: finish(reply) { devices in
            ["devices": .array(devices.map(Self.deviceJSON))]
        })
    }

    static func deviceJSON(_ d: DeviceSummary) -> JSON {
        [
            "device_id": .string(d.deviceID), "platform": .string(d.platform.rawValue),
            "environment": d.environment.map { .string($0.rawValue) } ?? .null,
            "name": d.name.map { .string($0) } ?? .null, "app_version": d.appVersion.map { .string($0) } ?? .null,
            "token_hash": .string(d.tokenHash), "created_at": .string(Timestamp.rfc3339(d.createdAt)),
            "registered_at": .string(Timestamp.rfc3339(d.registeredAt)),
            "last_success_at": d.lastSuccessAt.map { .string(Timestamp.rfc3339($0)) } ?? .null,
            "last_failure_at": d.lastFailureAt.map { .string(Timestamp.rfc3339($0)) } ?? .null,
            "last_failure_reason": d.lastFailureReason.map { .string($0) } ?? .null,
        ]
    }

    private func endSession(_ p: inout ParamReader, _ context: CallContext, _ reply: @escaping Reply) throws(RPCError) {
        let runtime = try app(&p, context)
        let user = try user(&p)
        let session = try p.string("session", required: true, maxBytes: 512)!
        try p.finish()
        store.endSession(app: runtime.config.name, user: user, session: session, completion: finish(reply) {
            ["removed": .int($0)]
        })
    }

    private func forget(_ p: inout ParamReader, _ context: CallContext, _ reply: @escaping Reply) throws(RPCError) {
        let runtime = try app(&p, context)
        let user = try user(&p)
        try p.finish()
        store.forget(app: runtime.config.name, user: user, completion: finish(reply) { ["removed": .int($0)] })
    }

    // MARK: system.*, vapid.public_key

    /// `ready`, `disabled:<why>` or `degraded:<why>` for one transport of an app.
    func transportState(_ runtime: AppRuntime, _ platforms: [Platform], degraded: [QueueLane: String]) -> String {
        if let why = platforms.compactMap({ runtime.disabled[$0] }).first { return "disabled:\(why)" }
        if let why = platforms.compactMap({ degraded[QueueLane(app: runtime.config.name, platform: $0)] }).first {
            return "degraded:\(why)"
        }
        return "ready"
    }

    private func health(_ p: inout ParamReader, _ context: CallContext) throws(RPCError) -> JSON {
        // With `app`, that app (checked like any call); without, every app this peer may call.
        let only = try p.string("app", maxBytes: 64).map { name throws(RPCError) in
            try runtime(named: name, context).config.name
        }
        try p.finish()
        let degraded = delivery?.scheduler.degradedLanes ?? [:]
        var transports = JSONObject()
        var anyDegraded = false
        for name in apps.keys.sorted()
        where (only == nil || only == name) && apps[name]!.config.allows(uid: context.uid, gid: context.gid, groups: context.groups) {
            let runtime = apps[name]!
            var states = JSONObject()
            for (transport, platforms) in [("apns", [Platform.apns, .apnsVoIP]), ("fcm", [.fcm]), ("web", [.web])] {
                let state = transportState(runtime, platforms, degraded: degraded)
                if state.hasPrefix("degraded:") { anyDegraded = true }
                states.append(transport, .string(state))
            }
            transports.append(name, .object(states))
        }
        let status = storeHealth == "ok" && !anyDegraded ? "ok" : "degraded"
        return ["status": .string(status), "store": .string(storeHealth), "transports": .object(transports)]
    }

    /// The apps this peer may call, or nil when it may call every app (it sees all figures then).
    func visibleApps(_ context: CallContext) -> Set<String>? {
        let allowed = apps.filter { $0.value.config.allows(uid: context.uid, gid: context.gid, groups: context.groups) }
        return allowed.count == apps.count ? nil : Set(allowed.keys)
    }

    private func stats(_ p: inout ParamReader, _ context: CallContext, _ reply: @escaping Reply) throws(RPCError) {
        _ = try app(&p, context)
        try p.finish()
        let only = visibleApps(context)
        let server = serverStats()
        let uptime = (monotonicMilliseconds() - startedAt) / 1000
        let rateLimited = self.rateLimited
        let scheduler = delivery?.scheduler.stats
        let apns = delivery?.providers.apns?.stats
        let summary = storeSummary
        storeFigures(for: "stats", only: only, failure: { reply(.failure($0)) }) { depth, counts in
            var devices = JSONObject()
            for platform in Platform.allCases { devices.append(platform.rawValue, .int(counts[platform] ?? 0)) }
            var transports = JSONObject()
            for platform in Platform.allCases {
                let c = scheduler?.platforms[platform] ?? PlatformCounters()
                transports.append(
                    platform.rawValue,
                    [
                        "sent": .int(c.sent), "delivered": .int(c.delivered), "failed": .int(c.failed),
                        "retried": .int(c.retried), "expired": .int(c.expired),
                        "auth_rejected": .int(c.authRejected), "removed_stale": .int(c.removedStale),
                        "stale_refused": .int(c.staleRefused), "breaker_trips": .int(c.breakerTrips),
                    ])
            }
            // A peer limited to some apps sees figures over those only: the
            // send counters and provider connections, kept for the daemon as
            // a whole, are left out for it.
            var result: JSONObject = [
                "version": .string(Self.version), "instance": .string(self.instance), "uptime_s": .int(uptime),
                "connections": [
                    "open": .int(server.open), "accepted": .int(server.counters.accepted),
                    "refused": .int(server.counters.refused),
                ],
                "requests": [
                    "total": .int(server.counters.requests), "errors": .int(server.counters.errors),
                    "rate_limited": .int(rateLimited),
                ],
                "devices": .object(devices),
                "queue": [
                    "depth": .int(depth.waiting), "in_flight": .int(depth.inFlight),
                    "stale_held": .int(only == nil ? scheduler?.staleHeld ?? 0 : 0),
                ],
                "store": .object(Self.storeJSON(summary, heldResults: only == nil ? scheduler?.heldResults ?? 0 : 0)),
            ]
            if let only {
                result.append("apps", .array(only.sorted().map { .string($0) }))
                reply(.success(.object(result)))
                return
            }
            result.append("transports", .object(transports))
            if let apns {
                result.append(
                    "apns",
                    [
                        "connections": .int(apns.connectionsOpen), "connections_opened": .int(apns.connectionsOpened),
                        "connect_failures": .int(apns.connectFailures), "goaways": .int(apns.goaways),
                        "last_goaway_reason": apns.lastGoAwayReason.map { .string($0) } ?? .null,
                        "tokens_signed": .int(apns.tokensMinted), "timeouts": .int(apns.timeouts),
                    ])
            }
            reply(.success(.object(result)))
        }
    }

    /// `system.stats` `store`: the backend, for PostgreSQL its pool size and
    /// lease, and the results held in memory until the store takes them.
    static func storeJSON(_ summary: StoreSummary, heldResults: Int) -> JSONObject {
        var object: JSONObject = ["backend": .string(summary.backend)]
        if let poolSize = summary.poolSize { object.append("pool_size", .int(poolSize)) }
        if let leaseMs = summary.leaseMs { object.append("lease_ms", .int(Int(leaseMs))) }
        object.append("held_results", .int(heldResults))
        return object
    }

    /// The queue depth and the device counts per platform, read from the
    /// store one after the other (for `system.stats` and the metrics); a
    /// store failure is logged (naming `what`) and given to `failure` as -32603.
    /// With `only`, the figures are totals over those apps.
    func storeFigures(
        for what: String, only: Set<String>? = nil, failure: @escaping @Sendable (RPCError) -> Void,
        _ body: @escaping @Sendable ((waiting: Int, inFlight: Int), [Platform: Int]) -> Void
    ) {
        let store = self.store
        let log = self.log
        @Sendable func failed() {
            log.error("store_failed", ["error": what])
            failure(.storeUnavailable)
        }
        guard let only else {
            store.queueDepth { depthResult in
                store.deviceCounts { countsResult in
                    guard case .success(let depth) = depthResult, case .success(let counts) = countsResult else {
                        return failed()
                    }
                    body((depth.waiting, depth.inFlight), counts)
                }
            }
            return
        }
        store.queueDepthByApp { depthResult in
            store.deviceCountsByApp { countsResult in
                guard case .success(let depths) = depthResult, case .success(let byApp) = countsResult else {
                    return failed()
                }
                var depth = (waiting: 0, inFlight: 0)
                var counts: [Platform: Int] = [:]
                for app in only {
                    depth.waiting += depths[app]?.waiting ?? 0
                    depth.inFlight += depths[app]?.inFlight ?? 0
                    for (platform, n) in byApp[app] ?? [:] { counts[platform, default: 0] += n }
                }
                body(depth, counts)
            }
        }
    }

    private func vapidPublicKey(_ p: inout ParamReader, _ context: CallContext) throws(RPCError) -> JSON {
        let runtime = try app(&p, context)
        try p.finish()
        guard let vapid = runtime.credentials.webPush.value else {
            throw RPCError.invalidParams(field: "app", reason: "web push is disabled for this app (no vapid_key)")
        }
        return ["public_key": .string(vapid.key.publicKeyBase64URL)]
    }

    /// Takes a reloaded configuration's apps (on the loop thread): calls from
    /// now on see the new limits, peers and credentials.
    func replaceApps(_ new: [String: AppRuntime]) {
        apps = new
    }

    /// Forgets idle rate-limit entries (called from a loop timer).
    func expireLimiters() {
        let now = monotonicMilliseconds()
        registerLimiter.expireIdle(now: now)
        unregisterLimiter.expireIdle(now: now)
    }
}

extension RPCError {
    /// A call the store could not serve (a write or read that failed: the
    /// database locked past its busy timeout, full, or unreachable): -32603
    /// with `data.reason` `store_unavailable`. Nothing of the call is kept;
    /// the client may try again. The cause is logged, never sent.
    static let storeUnavailable = RPCError.internalError("store_unavailable")
}
