import APNs
import FCM
import HTTP2
import HTTPClient
import HeraldCore
import HeraldDelivery
import HeraldIO
import HeraldScheduler
import HeraldStore
import WebPush

/// The transports of every app and the scheduler that drives them, built
/// from the configuration and the loaded credentials.
final class DeliveryStack: @unchecked Sendable {
    let scheduler: Scheduler
    let apns: APNsClient?
    /// Web Push to origins that speak HTTP/2 (the others go through libcurl).
    let webHTTP2: HTTP2Client?
    /// FCM `messages:send` when the FCM origin speaks HTTP/2 (the OAuth token
    /// endpoint, and an origin without HTTP/2, go through libcurl).
    let fcmHTTP2: HTTP2Client?
    private let httpClients: [HTTPClient]
    /// Per app, the platforms whose sends are skipped and why.
    let disabled: [String: [Platform: String]]

    init(config: HeraldConfig, credentials: [String: LoadedCredentials], store: Store, log: Logger) throws {
        let caFile = config.endpoints.caFile?.path
        var transports: [QueueLane: any PushTransport] = [:]
        var disabled: [String: [Platform: String]] = [:]
        var clients: [HTTPClient] = []

        let apnsEndpoints = (
            production: Self.apnsEndpoint(config.endpoints.apnsProduction),
            development: Self.apnsEndpoint(config.endpoints.apnsDevelopment)
        )
        let needsAPNs = credentials.values.contains { $0.apns.isReady }
        let apns: APNsClient? =
            needsAPNs
            ? try APNsClient(
                settings: APNsClientSettings(caFile: caFile) { host, port in
                    try SystemResolver().resolve(host: host, port: port).map(\.description)
                }, log: log) : nil
        let needsFCM = credentials.values.contains { $0.fcm.isReady }
        let fcmClient: HTTPClient? =
            needsFCM
            ? try HTTPClient(
                configuration: .init(
                    caFile: caFile, maxConnectionsPerHost: 4,
                    allowPlainHTTPToLoopback: !config.endpoints.fcm.usesTLS)) : nil
        // Its own thread too; the HTTP/2 client speaks TLS only, so an http:// (loopback)
        // FCM endpoint stays on libcurl.
        let fcmHTTP2: HTTP2Client? =
            needsFCM && config.endpoints.fcm.usesTLS
            ? try HTTP2Client(
                settings: HTTP2ClientSettings(caFile: caFile) { host, port in
                    try SystemResolver().resolve(host: host, port: port).map(\.description)
                }, log: log, threadName: "herald-fcm") : nil
        let needsWeb = credentials.values.contains { $0.webPush.isReady }
        let webClient: HTTPClient? =
            needsWeb ? try HTTPClient(configuration: .init(caFile: caFile, maxConnectionsPerHost: 2)) : nil
        // Its own thread, so Web Push and APNs fan-outs do not share a loop.
        let webHTTP2: HTTP2Client? =
            needsWeb
            ? try HTTP2Client(
                settings: HTTP2ClientSettings(caFile: caFile) { host, port in
                    try SystemResolver().resolve(host: host, port: port).map(\.description)
                }, log: log, threadName: "herald-webpush") : nil
        clients += [fcmClient, webClient].compactMap { $0 }
        // Send-time checks reuse a name's answer for 30 s (one lookup per push
        // service per fan-out, not one per push); registrations resolve afresh.
        let endpointGuard = EndpointGuard(
            allowPrivate: config.endpoints.webPushAllowPrivate, resolver: CachingResolver(SystemResolver()))

        for (name, app) in config.apps {
            let c = credentials[name]!
            var off: [Platform: String] = [:]
            switch c.apns {
            case .disabled(let reason):
                off[.apns] = reason
                off[.apnsVoIP] = reason
            case .ready(let creds):
                if let apns, let production = apnsEndpoints.production, let development = apnsEndpoints.development {
                    let transport = APNsTransport(
                        client: apns, app: name,
                        signer: APNsSigner(key: creds.key, keyID: creds.keyID, teamID: creds.teamID),
                        settings: APNsAppSettings(topic: creds.topic, defaultAlertLocKey: app.alertLocKey),
                        production: production, development: development)
                    transports[QueueLane(app: name, platform: .apns)] = transport
                    transports[QueueLane(app: name, platform: .apnsVoIP)] = transport
                } else {
                    off[.apns] = "APNs endpoints must be https URLs"
                    off[.apnsVoIP] = off[.apns]
                }
            }
            switch c.fcm {
            case .disabled(let reason):
                off[.fcm] = reason
            case .ready(let account):
                let sender = FCMSender(
                    account: account, baseURL: config.endpoints.fcm.description, client: fcmClient!, http2: fcmHTTP2)
                transports[QueueLane(app: name, platform: .fcm)] = FCMTransport(
                    sender: sender,
                    settings: FCMAppSettings(channelID: app.androidChannelID, defaultAlertLocKey: app.alertLocKey))
            }
            switch c.webPush {
            case .disabled(let reason):
                off[.web] = reason
            case .ready(let vapid):
                let sender = WebPushSender(
                    guard: endpointGuard, client: webClient!, http2: webHTTP2, vapidKey: vapid.key, subject: vapid.subject, app: name)
                transports[QueueLane(app: name, platform: .web)] = WebPushTransport(sender: sender)
            }
            disabled[name] = off
        }

        let d = config.delivery
        scheduler = Scheduler(
            store: store, transports: transports,
            settings: SchedulerSettings(
                maxInflight: config.server.maxInflight,
                backoff: BackoffPolicy(maxRetries: d.maxRetries, base: d.backoffBase, max: d.backoffMax),
                stale: StaleGuard.Settings(
                    windowCap: d.staleWindowCap, batchRatio: d.staleBatchRatio, batchMin: d.staleBatchMin)),
            log: log)
        self.apns = apns
        self.webHTTP2 = webHTTP2
        self.fcmHTTP2 = fcmHTTP2
        self.httpClients = clients
        self.disabled = disabled
    }

    /// APNs speaks HTTP/2 over TLS only.
    private static func apnsEndpoint(_ url: EndpointURL) -> APNsEndpoint? {
        guard url.usesTLS else { return nil }
        return APNsEndpoint(host: url.host, port: url.port, pathPrefix: url.path)
    }

    /// Ends every provider connection; sends still out complete as failures
    /// (`shutdown`) and are recorded as retrying.
    func shutdownTransports() {
        apns?.shutdown()
        webHTTP2?.shutdown()
        fcmHTTP2?.shutdown()
        for client in httpClients { client.shutdown() }
    }
}
