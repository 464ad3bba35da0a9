import APNs
import FCM
import HTTP2
import HTTPClient
import HeraldCore
import HeraldDelivery
import HeraldIO
import HeraldNet
import HeraldScheduler
import HeraldStore
import HeraldTransport
import WebPush
import HeraldConfiguration

/// The transports of every app and the scheduler that drives them, built
/// from the configuration and the loaded credentials.
///
/// The provider clients (connections, threads) are shared by every app and
/// made when the first app needs them; `transports(apps:credentials:)` builds
/// an app's transports on them, at startup and again at each reload, so a
/// reload with new keys keeps the connections that still serve.
final class DeliveryStack: Sendable {
    let scheduler: Scheduler
    let providers: ProviderClients
    /// The disabled platforms of the configuration the stack was made with.
    let initialDisabled: [String: [Platform: String]]
    /// What proves the credentials of the configuration the stack was made with.
    let initialProbes: [CredentialKey: any CredentialProbe]
    /// Each app's channel management, as the last configuration made it.
    private let managers: Locked<[String: APNsChannelManager]>

    init(
        config: HeraldConfig, credentials: [String: LoadedCredentials], store: any DeliveryStore,
        resolvers: Resolvers, log: Logger
    ) throws {
        providers = ProviderClients(
            endpoints: config.endpoints, resolvers: resolvers, pingTimeout: config.delivery.pingTimeout,
            webPushTimeouts: (config.delivery.webPushConnectTimeout, config.delivery.webPushTimeout), log: log)
        let built = try providers.transports(apps: config.apps, credentials: credentials)
        initialDisabled = built.disabled
        initialProbes = built.probes
        managers = Locked(built.channelManagers)
        let d = config.delivery
        var settings = SchedulerSettings(
            maxInflight: config.server.maxInflight,
            backoff: BackoffPolicy(maxRetries: d.maxRetries, base: d.backoffBase, max: d.backoffMax),
            stale: StaleGuard.Settings(
                windowCap: d.staleWindowCap, batchRatio: d.staleBatchRatio, batchMin: d.staleBatchMin))
        settings.originInflight = d.webPushOriginInflight
        settings.originTimeoutLimit = d.webPushOriginTimeouts
        scheduler = Scheduler(store: store, transports: built.transports, settings: settings, log: log)
        store.publish(lanes: built.sendable)
    }

    var apns: APNsClient? { providers.apns }

    /// The app's channel management, nil when its APNs is not configured.
    func channelManager(_ app: String) -> APNsChannelManager? { managers.withLock { $0[app] } }

    /// A reload's channel management.
    func replaceChannelManagers(_ next: [String: APNsChannelManager]) { managers.withLock { $0 = next } }

    /// Ends every provider connection; sends still out complete as failures
    /// (`shutdown`) and are recorded as retrying.
    func shutdownTransports() { providers.shutdown() }
}

/// What one configuration gives: the scheduler's transports, and per app the
/// platforms whose sends are skipped and why.
struct BuiltTransports {
    var transports: [QueueLane: any PushTransport] = [:]
    var disabled: [String: [Platform: String]] = [:]
    /// What proves each configured credential (``CredentialMonitor``).
    var probes: [CredentialKey: any CredentialProbe] = [:]
    /// Each app's APNs channel management (broadcast channels), where APNs is configured.
    var channelManagers: [String: APNsChannelManager] = [:]

    /// The lanes whose raw-token registrations this instance can send (a
    /// lane may have a transport for its Web Push-form registrations only):
    /// published to the other instances sharing the store.
    var sendable: Set<QueueLane> {
        Set(transports.keys.filter { disabled[$0.app]?[$0.platform] == nil })
    }
}

/// The provider clients (connections and their threads), shared by every app
/// and made when the first app needs them.
final class ProviderClients: Sendable {
    private let endpoints: HeraldConfig.Endpoints
    /// `[delivery] ping_timeout`, for every HTTP/2 client.
    private let pingTimeout: Duration
    /// `[delivery] webpush_connect_timeout` and `webpush_timeout`.
    private let webPushTimeouts: (connect: Duration, request: Duration)
    private let log: Logger
    private let clients = Locked(Clients())
    /// Send-time checks reuse a name's answer for 30 s (one lookup per push
    /// service per fan-out, not one per push); registrations resolve afresh.
    private let endpointGuard: EndpointGuard
    /// APNs and FCM hosts, looked up without a thread per lookup, answers and failures kept 30 s.
    private let providerResolver: CachingResolver
    /// Every resolver of the daemon, for the metrics.
    let resolvers: Resolvers

    private struct Clients {
        var apns: APNsClient?
        var fcm: HTTPClient?
        /// FCM `messages:send` when the FCM origin speaks HTTP/2 (the OAuth token
        /// endpoint, and an origin without HTTP/2, go through libcurl).
        var fcmHTTP2: HTTP2Client?
        var web: HTTPClient?
        /// Web Push to origins that speak HTTP/2 (the others go through libcurl).
        var webHTTP2: HTTP2Client?
    }

    init(
        endpoints: HeraldConfig.Endpoints, resolvers: Resolvers, pingTimeout: Duration = .seconds(5),
        webPushTimeouts: (connect: Duration, request: Duration) = (.seconds(5), .seconds(15)), log: Logger
    ) {
        self.endpoints = endpoints
        self.pingTimeout = pingTimeout
        self.webPushTimeouts = webPushTimeouts
        self.log = log
        endpointGuard = EndpointGuard(allowPrivate: endpoints.webPushAllowPrivate, resolver: resolvers.webPush)
        providerResolver = resolvers.providers
        self.resolvers = resolvers
    }

    var apns: APNsClient? { clients.withLock { $0.apns } }

    /// Provider connection counters per transport (`apns`, `fcm`, `web`), for the metrics.
    var connectionStats: [String: HTTP2ClientStats] {
        clients.withLock { c in
            var out: [String: HTTP2ClientStats] = [:]
            if let apns = c.apns { out["apns"] = apns.stats }
            if let fcm = c.fcmHTTP2 { out["fcm"] = fcm.stats }
            if let web = c.webHTTP2 { out["web"] = web.stats }
            return out
        }
    }

    /// The transports of `apps` with `credentials`, on the shared clients
    /// (made now if no earlier configuration needed them).
    func transports(apps: [String: AppConfig], credentials: [String: LoadedCredentials]) throws -> BuiltTransports {
        let caFile = endpoints.caFile?.path
        let apnsEndpoints = (
            production: Self.apnsEndpoint(endpoints.apnsProduction),
            development: Self.apnsEndpoint(endpoints.apnsDevelopment)
        )
        let manageEndpoints = (
            production: Self.apnsEndpoint(endpoints.apnsManageProduction),
            development: Self.apnsEndpoint(endpoints.apnsManageDevelopment)
        )
        let needsAPNs = credentials.values.contains { $0.apns.isReady }
        let needsFCM = credentials.values.contains { $0.fcm.isReady }
        let needsWeb = credentials.values.contains { $0.webPush.isReady }
        let fcmOverTLS = endpoints.fcm.origin.usesTLS
        let log = self.log
        let pingTimeout = self.pingTimeout
        let webPushTimeouts = self.webPushTimeouts
        let resolver = providerResolver
        let blocking: @Sendable (String, Int) throws -> [String] = { host, port in
            try resolver.resolve(host: host, port: port).map(\.description)
        }
        let lookup: HTTP2Lookup = { host, port, completion in
            let now = resolver.resolve(host: host, port: port) { result in
                completion(result.map { $0.map(\.description) }.mapError { $0 })
            }
            if let now { completion(now.map { $0.map(\.description) }.mapError { $0 }) }
        }
        let c = try clients.withLock { c throws -> Clients in
            if needsAPNs && c.apns == nil {
                var settings = APNsClientSettings(caFile: caFile, resolver: blocking)
                settings.lookup = lookup
                settings.pingTimeout = pingTimeout
                c.apns = try APNsClient(settings: settings, log: log)
            }
            if needsFCM && c.fcm == nil {
                c.fcm = try HTTPClient(
                    configuration: .init(
                        caFile: caFile, maxConnectionsPerHost: 4, allowPlainHTTPToLoopback: !fcmOverTLS))
            }
            // Its own thread too; the HTTP/2 client speaks TLS only, so an http:// (loopback)
            // FCM endpoint stays on libcurl.
            if needsFCM && fcmOverTLS && c.fcmHTTP2 == nil {
                var settings = HTTP2ClientSettings(caFile: caFile, resolver: blocking)
                settings.lookup = lookup
                settings.pingTimeout = pingTimeout
                c.fcmHTTP2 = try HTTP2Client(settings: settings, log: log, threadName: "herald-fcm")
            }
            if needsWeb && c.web == nil {
                c.web = try HTTPClient(configuration: .init(caFile: caFile, maxConnectionsPerHost: 2))
            }
            // Its own thread, so Web Push and APNs fan-outs do not share a loop.
            if needsWeb && c.webHTTP2 == nil {
                var settings = HTTP2ClientSettings(caFile: caFile, resolver: blocking)
                settings.lookup = lookup
                settings.pingTimeout = pingTimeout
                settings.connectTimeout = webPushTimeouts.connect
                settings.requestTimeout = webPushTimeouts.request
                c.webHTTP2 = try HTTP2Client(settings: settings, log: log, threadName: "herald-webpush")
            }
            return c
        }

        var built = BuiltTransports()
        for (name, app) in apps {
            let creds = credentials[name]!
            var off: [Platform: String] = [:]
            switch creds.apns {
            case .disabled(let reason):
                for platform in Platform.allCases where platform.isAPNs { off[platform] = reason }
            case .ready(let apnsCreds):
                if let apns = c.apns, let production = apnsEndpoints.production,
                    let development = apnsEndpoints.development
                {
                    let transport = APNsTransport(
                        client: apns, app: name,
                        signer: APNsSigner(key: apnsCreds.key, keyID: apnsCreds.keyID, teamID: apnsCreds.teamID),
                        settings: APNsAppSettings(topic: apnsCreds.topic, defaultAlertLocKey: app.alertLocKey),
                        production: production, development: development)
                    for platform in Platform.allCases where platform.isAPNs {
                        built.transports[QueueLane(app: name, platform: platform)] = transport
                    }
                    built.probes[CredentialKey(app: name, platform: "apns")] = transport
                    if let production = manageEndpoints.production, let development = manageEndpoints.development {
                        built.channelManagers[name] = APNsChannelManager(
                            client: apns, app: name,
                            signer: APNsSigner(key: apnsCreds.key, keyID: apnsCreds.keyID, teamID: apnsCreds.teamID),
                            topic: apnsCreds.topic, production: production, development: development)
                    }
                } else {
                    for platform in Platform.allCases where platform.isAPNs {
                        off[platform] = "APNs endpoints must be https URLs"
                    }
                }
            }
            switch creds.fcm {
            case .disabled(let reason):
                off[.fcm] = reason
            case .ready(let account):
                let sender = FCMSender(
                    account: account, baseURL: endpoints.fcm,
                    transport: OriginTransport(http1: c.fcm!, http2: c.fcmHTTP2, clock: SystemClock()))
                let transport = FCMTransport(
                    sender: sender,
                    settings: FCMAppSettings(channelID: app.androidChannelID, defaultAlertLocKey: app.alertLocKey))
                built.transports[QueueLane(app: name, platform: .fcm)] = transport
                built.probes[CredentialKey(app: name, platform: "fcm")] = transport
            }
            switch creds.webPush {
            case .disabled(let reason):
                off[.web] = reason
                off[.unifiedPush] = reason
            case .ready(let vapid):
                let sender = WebPushSender(
                    guard: endpointGuard,
                    transport: OriginTransport(
                        http1: c.web!, http2: c.webHTTP2, clock: SystemClock(),
                        capacity: WebPushSender.maxRememberedHTTP1Origins), vapidKey: vapid.key,
                    subject: vapid.subject, app: name, timeout: webPushTimeouts.request,
                    connectTimeout: webPushTimeouts.connect, previousVapidKey: vapid.previous)
                built.transports[QueueLane(app: name, platform: .web)] = WebPushTransport(sender: sender)
                built.probes[CredentialKey(app: name, platform: "web")] = VAPIDProbe(
                    key: vapid.key, subject: vapid.subject)
            }
            // The Web Push form on the other platforms: their lanes send a
            // registration with keys through the app's Web Push sender.
            let webPush = built.transports[QueueLane(app: name, platform: .web)]
            for platform in [Platform.apnsVoIP, .fcm, .unifiedPush] {
                let lane = QueueLane(app: name, platform: platform)
                let legacy = platform == .unifiedPush ? nil : built.transports[lane]
                if legacy == nil && webPush == nil { continue }
                built.transports[lane] = FormRoutedTransport(legacy: legacy, webPush: webPush)
            }
            built.disabled[name] = off
        }
        return built
    }

    /// APNs speaks HTTP/2 over TLS only.
    private static func apnsEndpoint(_ url: HTTPURL) -> APNsEndpoint? {
        let origin = url.origin
        guard origin.usesTLS else { return nil }
        return APNsEndpoint(host: origin.host, port: origin.port, pathPrefix: url.target)
    }

    /// Closes every connection and stops the clients' threads.
    func shutdown() {
        let c = clients.withLock { $0 }
        c.apns?.shutdown()
        c.webHTTP2?.shutdown()
        c.fcmHTTP2?.shutdown()
        c.fcm?.shutdown()
        c.web?.shutdown()
    }
}
