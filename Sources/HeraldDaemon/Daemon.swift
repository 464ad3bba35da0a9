import CHeraldSys
import HeraldIO
import Dispatch
import Foundation
import HeraldCore
import HeraldCrypto
import HeraldScheduler
import HeraldStore
import Synchronization
import WebPush
import HeraldConfiguration

#if canImport(Glibc)
    import Glibc
#endif

/// `herald serve`: loads the configuration, opens the store, serves the
/// socket until SIGTERM or SIGINT, then shuts down in reverse order.
public enum Daemon {
    /// How long a stopping daemon waits for requests and sends in flight.
    static let shutdownBudgetMs: Int64 = 10_000
    /// Finished messages (and their delivery records) are kept this long for `push.status`.
    static let messageRetention = Duration.seconds(7 * 24 * 3600)

    /// Runs in the foreground; returns the process exit status.
    public static func run(configPath option: String?) -> Int32 {
        let environment = HeraldConfig.processEnvironment()
        let path = HeraldConfig.path(option: option, environment: environment)
        let bootLog = Logger(level: .info)
        // Signals first: a SIGTERM that arrives while starting up must not be lost.
        let stopper = Shutdown(notifier: SystemdNotifier(environment: environment))
        let hangups = Hangups()
        let signals = installSignals(stopper: stopper, hangups: hangups)
        // Last of all, whichever way `run` returns: the sources' handlers hold
        // the stopper and the reloader, and through them everything else.
        defer {
            for source in signals { source.cancel() }
            stopper.detach()
            hangups.detach()
        }
        let config: HeraldConfig
        let credentials: [String: LoadedCredentials]
        let storeKey: StoreKey?
        let location: StoreLocation
        do {
            config = try HeraldConfig.load(path: path, environment: environment)
            credentials = try LoadedCredentials.load(config)
            location = try config.storeLocation()
            try ensureDirectory(config.server.stateDirectory)
            // Not created here: the store creates one only for an empty database.
            storeKey = try config.store.loadKey()
        } catch {
            bootLog.error("startup_failed", ["error": String(describing: error)])
            return 1
        }
        let log = Logger(level: config.server.logLevel)
        let notifier = SystemdNotifier(environment: environment)
        signal(SIGPIPE, SIG_IGN)
        let openFiles = raiseOpenFileLimit(log: log)
        if config.endpoints.webPushAllowPrivate {
            // A test setting: said at every start, so that it is not left on
            // by mistake in production.
            log.warning(
                "webpush_allow_private",
                [
                    "why":
                        "[endpoints] webpush_allow_private = true: Web Push endpoints may name private, loopback and link-local addresses and any port; for test servers only"
                ])
        }
        // Everything started from here on is stopped through this, newest
        // first, whether the daemon stops or fails to start.
        let services = ServiceStack()
        defer { services.stopAll() }

        let store: any DeliveryStore
        // Names the database in logs: a path, or the connection string (which holds no password).
        let databasePath = location.description
        let storeConfig = config.store
        do {
            store = try location.open(
                keySupply: storeKey.map { .key($0) } ?? .missing(create: { try storeConfig.createKey() }),
                keyFile: storeConfig.key.path, instance: config.server.instanceName)
        } catch let error as StoreKeyError {
            // The key and the database do not belong together: starting
            // would fail every send. Nothing secret is in the message.
            log.error(
                "startup_failed", ["error": error.description, "key_file": error.keyFile, "database": error.database])
            return 1
        } catch let error as ConfigError {
            // Creating the key for an empty database failed: the key file's own error.
            log.error("startup_failed", ["error": String(describing: error)])
            return 1
        } catch {
            log.error("startup_failed", ["error": "store: \(error)", "database": databasePath])
            return 1
        }
        services.started("store") { store.close() }
        switch store.keyOutcome {
        case .verified:
            break
        case .created:
            log.info("store_key_created", ["key_file": storeConfig.key.path, "database": databasePath])
        case .recorded(let sealedRows):
            log.info(
                "store_key_check_recorded",
                ["key_file": storeConfig.key.path, "database": databasePath, "devices": String(sealedRows)])
        }
        // Before the socket exists: a client that can connect finds the daemon
        // about to serve, not still reading the Public Suffix List.
        let resolvers: Resolvers
        do {
            resolvers = try Resolvers.start(log: log)
        } catch {
            log.error("startup_failed", ["error": "resolver: \(error)"])
            return 1
        }
        let listener: Listener
        do {
            listener =
                try Listener.fromSystemd(environment: environment)
                ?? Listener.create(path: config.server.socketPath, mode: config.server.socketMode)
        } catch {
            log.error("startup_failed", ["error": String(describing: error)])
            return 1
        }
        services.started("listener") { listener.close() }

        let loop: EventLoop
        do {
            loop = try EventLoop()
        } catch {
            log.error("startup_failed", ["error": String(describing: error)])
            return 1
        }
        // Stopped after everything started later: its ticks and handlers hold them.
        services.started("loop") { loop.shutdown() }
        let delivery: DeliveryStack
        do {
            delivery = try DeliveryStack(
                config: config, credentials: credentials, store: store, resolvers: resolvers, log: log)
        } catch {
            log.error("startup_failed", ["error": "delivery: \(error)"])
            return 1
        }
        services.started("delivery") {
            // Sends still out after the budget are abandoned: they stay in flight in
            // the store and are queued again at the next start.
            let abandoned = delivery.scheduler.inFlightCount
            if abandoned > 0 { log.info("deliveries_left_in_flight", ["count": String(abandoned)]) }
            delivery.shutdownTransports()
            delivery.scheduler.drain()
        }
        var apps: [String: AppRuntime] = [:]
        for (name, app) in config.apps {
            apps[name] = AppRuntime(
                config: app, credentials: credentials[name]!, disabled: delivery.initialDisabled[name] ?? [:])
        }
        let service = HeraldService(
            apps: apps, store: store,
            // Registrations resolve afresh (nothing remembered), bounded, for at most 2 s.
            endpointGuard: EndpointGuard(
                allowPrivate: config.endpoints.webPushAllowPrivate, resolver: resolvers.registration),
            clock: SystemClock(), instance: config.server.instanceName, log: log)
        service.storeSummary = StoreSummary(location)
        service.systemLimiter = SystemCallLimiter(perMinute: config.server.systemCallsPerMinute)
        service.runOnLoop = { [loop] work in loop.execute(work) }
        let waiters = MessageWaiters(store: store, log: log)
        Task { await waiters.startTicking() }
        service.delivery = DeliveryWiring(
            scheduler: delivery.scheduler, maxQueued: config.delivery.maxQueued, waiters: waiters,
            providers: delivery.providers, channelManager: { [delivery] in delivery.channelManager($0) })
        delivery.scheduler.onProgress = { finals in waiters.recorded(finals) }
        let server = RPCServer(
            loop: loop, listener: listener, handler: service, log: log, limits: ServerLimits(config.server))
        let events = EventStream(
            store: store, sink: server, loop: loop, log: log, bufferBytes: config.server.eventBufferBytes)
        server.streamDrained = { [unowned events] in events.drained($0) }
        server.streamClosed = { [unowned events] in events.remove($0) }
        service.events = events
        events.start()
        // The server owns the listener from here: its connections close first, then the socket.
        services.handedOver("listener")
        services.started("server") {
            server.closeAll()
            listener.close()
        }
        let heartbeat = Heartbeat()
        loop.every(milliseconds: 1000) { heartbeat.beat() }
        var metricsListener: MetricsListener?
        if let address = config.metrics.listen {
            do {
                let token = try config.metrics.loadBearerToken()
                metricsListener = try MetricsListener(
                    address: address, token: token,
                    source: metricsSource(
                        loop: loop, service: service, heartbeat: heartbeat, appFigures: config.metrics.appFigures))
                log.info(
                    "metrics_listening",
                    ["address": ListenAddress(host: address.host, port: metricsListener!.port).description])
            } catch {
                log.error("startup_failed", ["error": String(describing: error)])
                return 1
            }
            services.started("metrics") { metricsListener?.stop() }
        }
        service.serverStats = { [unowned server] in
            var counters = server.counters
            counters.heldBytes = server.heldBytes
            return (server.openConnections, counters)
        }
        do {
            try server.start()
        } catch {
            log.error("startup_failed", ["error": String(describing: error)])
            return 1
        }
        if let interval = SystemdNotifier.watchdogInterval(environment: environment) {
            // From the main loop: a wedged loop stops the pings and systemd restarts the daemon.
            loop.every(milliseconds: max(1, interval / 1000)) { notifier.notify("WATCHDOG=1") }
        }
        // The STATUS= line counts the queue: only when systemd listens (the
        // count reads every waiting row, held ones too, and is wasted otherwise).
        if notifier.path != nil {
            loop.every(milliseconds: 5000) {
                let clients = server.openConnections
                store.queueDepth { result in
                    guard case .success(let depth) = result else { return }
                    notifier.notify(
                        "STATUS=serving: queue=\(depth.waiting) in_flight=\(depth.inFlight) clients=\(clients)")
                }
            }
        }
        // Every 2 s: a store whose calls are stuck is reported within seconds
        // (the ping has its own deadline), in system.health, /readyz and STATUS=.
        loop.every(milliseconds: 2000) {
            store.ping { result in
                let state: StoreHealth
                switch result {
                case .success: state = .ok
                case .failure(let error): state = .degraded("\(error)")
                }
                loop.execute {
                    let was = service.storeHealth
                    service.storeHealth = state
                    if case .degraded(let why) = state, was.isOK {
                        log.warning("store_degraded", ["why": why])
                        notifier.notify("STATUS=store degraded: \(why)")
                    } else if state.isOK, !was.isOK {
                        log.info("store_ready", [:])
                    }
                }
            }
        }
        loop.every(milliseconds: 60_000) { service.expireLimiters() }
        let eventRetention = config.delivery.eventRetention
        loop.every(milliseconds: 600_000) {
            store.purgeEvents(olderThan: eventRetention) { result in
                if case .success(let n) = result, n > 0 { log.info("events_purged", ["count": String(n)]) }
            }
        }
        loop.every(milliseconds: 3_600_000) {
            store.purgeMessages(olderThan: Daemon.messageRetention) { result in
                if case .success(let n) = result, n > 0 { log.info("messages_purged", ["count": String(n)]) }
            }
        }
        if store.recoveredDeliveries > 0 {
            log.info("deliveries_recovered", ["count": String(store.recoveredDeliveries)])
        }
        if store.unfinishedCompleted > 0 {
            // Written in parts, stopped before the last; the rest written at open.
            log.info("unfinished_messages_completed", ["count": String(store.unfinishedCompleted)])
        }
        recordServerKeys(credentials, store: store, log: log)
        delivery.scheduler.observeLaneHealth { lane, change in
            let event: NewEvent
            switch change {
            case .degraded(let reason):
                event = NewEvent(
                    app: lane.app, kind: .transport, platform: lane.platform.rawValue, state: "degraded",
                    reason: reason.rawValue)
            case .recovered:
                event = NewEvent(app: lane.app, kind: .transport, platform: lane.platform.rawValue, state: "recovered")
            }
            store.append([event]) { result in
                if case .failure(let error) = result {
                    log.warning(
                        "event_write_failed",
                        ["kind": "transport", "app": lane.app, "platform": lane.platform.rawValue, "error": "\(error)"])
                }
            }
        }
        delivery.scheduler.start()
        // Proven at start without holding readiness back: the first verdicts
        // come as the providers answer (`unknown` until then).
        let credentialChecks = CredentialMonitor(events: { store.append($0, completion: $1) }, log: log)
        credentialChecks.replace(probes: delivery.initialProbes)
        credentialChecks.setInterval(config.delivery.credentialCheckInterval)
        service.credentialHealth = credentialChecks
        services.started("credential checks") { credentialChecks.stop() }
        credentialChecks.checkAll()

        stopper.attach(
            loop: loop, server: server, log: log,
            stopWork: {
                service.serving = false
                delivery.scheduler.stopClaiming()
                waiters.releaseAll()
            },
            isIdle: { delivery.scheduler.inFlightCount == 0 })
        let reloader = Reloader(
            path: path, environment: environment, running: config, loop: loop, service: service, delivery: delivery,
            credentialChecks: credentialChecks, log: log, notifier: notifier)
        hangups.attach { [stopper] in
            if stopper.isStopping {
                log.info("reload_ignored", ["why": "stopping"])
            } else {
                reloader.reload()
            }
        }
        logApps(credentials, log: log)
        log.info(
            "herald_started",
            [
                "version": HeraldService.version, "socket": listener.ownedPath ?? "systemd", "config": path,
                "store": databasePath, "open_files_limit": String(openFiles),
            ])
        loop.execute { service.serving = true }
        notifier.notify("READY=1\nSTATUS=serving")

        loop.run()
        services.stopAll()
        log.info("herald_stopped")
        return 0
    }

    /// Raises the soft limit on open descriptors to the hard one, as nginx
    /// (`worker_rlimit_nofile`) and PostgreSQL do: a shell's soft limit of
    /// 1,024 would cap connections and provider sockets long before
    /// `max_connections` and the send slots do. Under the shipped unit
    /// `LimitNOFILE=` sets both and resource calls are filtered: refused,
    /// the limit in force stands. Returns the soft limit in force.
    static func raiseOpenFileLimit(log: Logger) -> UInt64 {
        var soft: UInt64 = 0
        var hard: UInt64 = 0
        let result = hs_raise_nofile_limit(&soft, &hard)
        if result != 0 {
            log.debug(
                "open_files_limit_kept",
                ["soft": String(soft), "hard": String(hard), "error": String(cString: strerror(-result))])
        }
        return soft
    }

    private static func ensureDirectory(_ path: String) throws {
        var st = stat()
        if stat(path, &st) == 0 { return }
        try FileManager.default.createDirectory(
            atPath: path, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o750])
    }

    /// One `app_loaded` line per app: which transports are ready, which disabled and why.
    static func logApps(_ credentials: [String: LoadedCredentials], log: Logger) {
        for (name, c) in credentials.sorted(by: { $0.key < $1.key }) {
            log.info(
                "app_loaded",
                [
                    "app": name, "apns": TransportState(c.apns.disabledReason).wire,
                    "fcm": TransportState(c.fcm.disabledReason).wire,
                    "web": TransportState(c.webPush.disabledReason).wire,
                ])
        }
    }

    /// What the metrics listener asks: the metrics text made on the loop
    /// (at most 2 s wait, at most once a second for every scraper together),
    /// and the probes' answers from state kept current for them.
    private static func metricsSource(
        loop: EventLoop, service: HeraldService, heartbeat: Heartbeat, appFigures: Bool
    ) -> MetricsListener.Source {
        let shared = SharedAnswer(maxAgeMs: 1000, timeoutMs: 2000)
        return MetricsListener.Source(
            metrics: {
                shared.get { done in
                    loop.execute {
                        service.metrics(appFigures: appFigures) { result in
                            done(try? result.get())
                        }
                    }
                }
            },
            live: { heartbeat.isRecent(withinMs: 10_000) },
            ready: { service.readiness })
    }

    /// SIGTERM/SIGINT stop; SIGHUP reloads (once the daemon is up; a SIGHUP
    /// while starting is remembered and carried out then).
    private static func installSignals(stopper: Shutdown, hangups: Hangups) -> [any DispatchSourceSignal] {
        // A parent may have left these blocked (a mask is inherited across exec).
        var unblock = sigset_t()
        sigemptyset(&unblock)
        for sig in [SIGTERM, SIGINT, SIGHUP] { sigaddset(&unblock, sig) }
        pthread_sigmask(SIG_UNBLOCK, &unblock, nil)
        var sources: [any DispatchSourceSignal] = []
        for sig in [SIGTERM, SIGINT, SIGHUP] {
            signal(sig, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: sig, queue: .global())
            source.setEventHandler {
                if sig == SIGHUP {
                    hangups.received()
                } else {
                    stopper.begin(signal: sig == SIGTERM ? "SIGTERM" : "SIGINT")
                }
            }
            source.resume()
            sources.append(source)
        }
        return sources
    }
}

/// Graceful stop: no new connections, requests in flight get up to the
/// budget to finish, then the loop ends. A stop asked for before the loop
/// exists is remembered and carried out as soon as it does.
final class Shutdown: Sendable {
    private struct Attached {
        let loop: EventLoop
        let server: RPCServer
        let log: Logger
        let stopWork: @Sendable () -> Void
        let isIdle: @Sendable () -> Bool
    }

    private struct State {
        var attached: Attached?
        /// The signal that asked for the stop.
        var requested: String?
    }

    private let state = Locked(State())
    private let notifier: SystemdNotifier

    init(notifier: SystemdNotifier) {
        self.notifier = notifier
    }

    /// `stopWork` runs on the loop when the stop begins; the loop ends once
    /// the server is quiescent and `isIdle` holds, or the budget is spent.
    func attach(
        loop: EventLoop, server: RPCServer, log: Logger, stopWork: @escaping @Sendable () -> Void = {},
        isIdle: @escaping @Sendable () -> Bool = { true }
    ) {
        let parts = Attached(loop: loop, server: server, log: log, stopWork: stopWork, isIdle: isIdle)
        let early: String? = state.withLock {
            $0.attached = parts
            return $0.requested
        }
        if let early { start(signal: early, parts) }
    }

    /// Forgets the loop and the server (once they have stopped); a later signal
    /// finds nothing to stop.
    func detach() {
        state.withLock { $0.attached = nil }
    }

    /// A stop has been asked for.
    var isStopping: Bool { state.withLock { $0.requested != nil } }

    func begin(signal: String) {
        notifier.notify("STOPPING=1")
        let parts: Attached? = state.withLock {
            guard $0.requested == nil else { return nil }
            $0.requested = signal
            return $0.attached
        }
        if let parts { start(signal: signal, parts) }
    }

    private func start(signal: String, _ parts: Attached) {
        let (loop, server, log) = (parts.loop, parts.server, parts.log)
        loop.execute {
            log.info("herald_stopping", ["signal": signal])
            server.stopAccepting()
            parts.stopWork()
            let deadline = monotonicMilliseconds() + Daemon.shutdownBudgetMs
            loop.every(milliseconds: 20) {
                if (server.isQuiescent && parts.isIdle()) || monotonicMilliseconds() >= deadline { loop.stop() }
            }
        }
    }
}

/// SIGHUPs, passed on to the reloader once it exists; one that comes while
/// the daemon is starting is carried out as soon as it is up.
final class Hangups: Sendable {
    private struct State {
        var handler: (@Sendable () -> Void)?
        var pending = false
    }

    private let state = Locked(State())

    func attach(_ handler: @escaping @Sendable () -> Void) {
        let early: Bool = state.withLock { state in
            state.handler = handler
            defer { state.pending = false }
            return state.pending
        }
        if early { handler() }
    }

    /// Forgets the handler (when the daemon stops).
    func detach() {
        state.withLock { $0.handler = nil }
    }

    func received() {
        let handler: (@Sendable () -> Void)? = state.withLock {
            if $0.handler == nil { $0.pending = true }
            return $0.handler
        }
        handler?()
    }
}

/// When the main loop last ran its one-second tick, for `/livez`.
final class Heartbeat: Sendable {
    private let last = Atomic<Int64>(monotonicMilliseconds())

    func beat() { last.store(monotonicMilliseconds(), ordering: .relaxed) }

    func isRecent(withinMs limit: Int64) -> Bool {
        monotonicMilliseconds() - last.load(ordering: .relaxed) < limit
    }
}
