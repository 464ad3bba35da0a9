import Dispatch
import HeraldCore
import HeraldIO
import HeraldConfiguration

/// SIGHUP: reads the configuration file and every credential again and, if
/// all of it is good, puts it into effect without touching client
/// connections. A configuration that does not load (a bad value, a missing or
/// unreadable key file) is refused with a log line; the running one stays.
///
/// What takes effect: every `[app.*]` section (apps added or removed, peers
/// allowed, device caps, APNs/FCM/VAPID credentials and their other keys),
/// `[server] log_level` and `[delivery] credential_check_interval`; every
/// credential is checked again. Settings bound at startup (the socket, the
/// state directory, the store, `max_inflight`, the rest of `[delivery]`,
/// `[endpoints]`, `[metrics]`) keep their running values; a change to one is
/// logged as needing a restart.
final class Reloader: Sendable {
    private let queue = DispatchQueue(label: "herald.reload")
    private let path: String
    private let environment: [String: String]
    private let loop: EventLoop
    private let service: HeraldService
    private let delivery: DeliveryStack
    private let credentialChecks: CredentialMonitor
    private let log: Logger
    private let notifier: SystemdNotifier
    /// The configuration in effect (read and written by the reload queue).
    private let current: Locked<HeraldConfig>

    init(
        path: String, environment: [String: String], running: HeraldConfig, loop: EventLoop, service: HeraldService,
        delivery: DeliveryStack, credentialChecks: CredentialMonitor, log: Logger, notifier: SystemdNotifier
    ) {
        self.credentialChecks = credentialChecks
        self.path = path
        self.environment = environment
        current = Locked(running)
        self.loop = loop
        self.service = service
        self.delivery = delivery
        self.log = log
        self.notifier = notifier
    }

    /// Reloads on the reload queue; reloads asked for meanwhile run one after another.
    func reload() {
        queue.async { [self] in run() }
    }

    private func run() {
        notifier.notify("RELOADING=1\nMONOTONIC_USEC=\(monotonicMicroseconds())")
        log.info("reload_started", ["config": path])
        let next: HeraldConfig
        let credentials: [String: LoadedCredentials]
        let built: BuiltTransports
        do {
            next = try HeraldConfig.load(path: path, environment: environment)
            credentials = try LoadedCredentials.load(next)
            built = try delivery.providers.transports(apps: next.apps, credentials: credentials)
        } catch {
            log.error("reload_refused", ["error": String(describing: error), "config": path])
            loop.execute { [service] in service.reloads.refused += 1 }
            notifier.notify("READY=1\nSTATUS=serving (reload refused: see the log)")
            return
        }
        let fixed = Self.restartOnlyChanges(from: current.withLock { $0 }, to: next)
        if !fixed.isEmpty {
            log.warning("reload_needs_restart", ["settings": fixed.joined(separator: ","), "config": path])
        }
        var apps: [String: AppRuntime] = [:]
        for (name, app) in next.apps {
            apps[name] = AppRuntime(config: app, credentials: credentials[name]!, disabled: built.disabled[name] ?? [:])
        }
        delivery.scheduler.replaceTransports(built.transports)
        delivery.replaceChannelManagers(built.channelManagers)
        delivery.scheduler.publish(lanes: built.sendable)
        // READY=1 and `config_reloaded` only once calls see the new apps (the
        // loop may be busy; a loop that has stopped never runs it: no wait then).
        let applied = DispatchSemaphore(value: 0)
        loop.execute { [service, apps] in
            service.replaceApps(apps)
            service.reloads.applied += 1
            applied.signal()
        }
        _ = applied.wait(timeout: .now() + 5)
        log.level = next.server.logLevel
        current.withLock {
            $0.apps = next.apps
            $0.server.logLevel = next.server.logLevel
            $0.delivery.credentialCheckInterval = next.delivery.credentialCheckInterval
        }
        // Every credential proven again, the new ones first time.
        credentialChecks.replace(probes: built.probes)
        credentialChecks.setInterval(next.delivery.credentialCheckInterval)
        credentialChecks.checkAll()
        Daemon.logApps(credentials, log: log)
        log.info("config_reloaded", ["config": path, "apps": next.apps.keys.sorted().joined(separator: ",")])
        notifier.notify("READY=1\nSTATUS=serving (configuration reloaded)")
    }

    /// The settings of `next` that differ from `running` but only take effect at a restart.
    static func restartOnlyChanges(from running: HeraldConfig, to next: HeraldConfig) -> [String] {
        running.restartOnlyChanges(to: next)
    }
}
