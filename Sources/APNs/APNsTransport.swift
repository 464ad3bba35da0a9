public import HeraldCore
import HeraldCrypto
import HeraldIO
import HeraldNet

/// APNs as a ``PushTransport`` for one app: builds each request with
/// ``APNsRequest`` and sends it on the lane of the device's environment.
public final class APNsTransport: PushTransport {
    public let concurrencyLimit: Int
    private let settings: APNsAppSettings
    let production: APNsLaneHandle
    private let development: APNsLaneHandle
    /// Each environment's origin, as receipts name it.
    private let productionOrigin: String
    private let developmentOrigin: String
    let clock: any WallClock
    /// The requests of the messages being sent (see ``RecentlyBuilt``).
    private let requests = RecentlyBuilt<RequestKey, Result<Built, APNsRequestError>>()

    /// What an APNs request depends on besides the device's token and environment.
    private struct RequestKey: Hashable, Sendable {
        let messageID: String
        let acceptedAt: Int64
        let platform: Platform
        let bundleID: String?
        let badge: Int?
        let silent: Bool
    }

    /// A request's headers and body, as every device of its key gets them.
    private struct Built: Sendable {
        let headers: [(name: String, value: String)]
        let payload: [UInt8]
    }

    public init(
        client: APNsClient, app: String, signer: APNsSigner, settings: APNsAppSettings, production: APNsEndpoint,
        development: APNsEndpoint, clock: any WallClock = SystemClock(), concurrencyLimit: Int = 1000
    ) {
        self.settings = settings
        self.clock = clock
        self.concurrencyLimit = concurrencyLimit
        // A key replaced under the same key ID must not reuse the old key's lane (and tokens).
        let keyTag = String(SHA256.hex(signer.key.publicKey).prefix(16))
        func lane(_ env: APNsEnvironment, _ endpoint: APNsEndpoint) -> APNsLaneHandle {
            client.lane(
                APNsLaneKey(app: app, keyID: signer.keyID, teamID: signer.teamID, environment: env, keyTag: keyTag),
                endpoint: endpoint, signer: signer)
        }
        self.production = lane(.production, production)
        self.development = lane(.development, development)
        productionOrigin = Self.origin(production)
        developmentOrigin = Self.origin(development)
    }

    /// The app's bundle id (`apns-topic`).
    var topic: String { settings.topic }

    static func origin(_ e: APNsEndpoint) -> String {
        Origin(scheme: .https, host: e.host, port: e.port).description
    }

    /// The `apns-id` of a delivery: a UUID (version 8, RFC 9562) of the
    /// first 16 bytes of SHA-256 over its message and device, so every
    /// attempt of it carries the same one and no two deliveries share it.
    public static func apnsID(messageID: String, deviceID: String) -> String {
        var b = Array(SHA256.hash(Array("herald-apns-id:\(messageID):\(deviceID)".utf8)).prefix(16))
        b[6] = (b[6] & 0x0F) | 0x80
        b[8] = (b[8] & 0x3F) | 0x80
        var uuid = ""
        for (i, digit) in b.hexString.enumerated() {
            if i == 8 || i == 12 || i == 16 || i == 20 { uuid.append("-") }
            uuid.append(digit)
        }
        return uuid
    }

    public func send(_ job: DeliveryJob, completion: @escaping @Sendable (AttemptReport) -> Void) {
        // The headers and body are the same for every device of the message
        // that shares its platform, bundle id and badge: built (and their
        // size checked) once for all of them.
        let key = RequestKey(
            messageID: job.messageID, acceptedAt: job.acceptedAt, platform: job.platform, bundleID: job.bundleID,
            badge: job.message.badge(for: job.user), silent: job.silent)
        let built = requests.value(for: key) {
            // Expiration counts from acceptance: a retry never stretches the TTL.
            Result { () throws(APNsRequestError) in
                var message = job.message
                message.silent = job.silent
                let request = try APNsRequest(
                    message: message, platform: job.platform, user: job.user, settings: settings,
                    now: job.acceptedAt / 1000, bundleID: job.bundleID)
                return Built(headers: request.headers, payload: request.payload)
            }
        }
        guard case .success(let request) = built else {
            completion(AttemptReport(outcome: .failed(reason: .requestInvalid)))
            return
        }
        let development = job.environment == .development
        let lane = development ? self.development : production
        let origin = development ? developmentOrigin : productionOrigin
        let registeredAt = job.registeredAt
        let clock = self.clock
        let apnsID = Self.apnsID(messageID: job.messageID, deviceID: job.deviceID)
        let started = monotonicMilliseconds()
        if job.platform == .apnsChannel {
            // A broadcast: the channel (the row's token) in apns-channel-id,
            // the bundle in the path; apns-request-id for apns-id.
            let bundle = job.bundleID ?? settings.topic
            lane.request(
                method: "POST", path: "/4/broadcasts/apps/\(bundle)",
                headers: request.headers + [("apns-channel-id", job.token), ("apns-request-id", apnsID)],
                body: request.payload, notAfter: job.sendDeadline
            ) { result in
                var receipt = ProviderReceipt(
                    apnsID: apnsID, origin: origin, elapsedMs: monotonicMilliseconds() - started)
                switch result.map(APNsAnswer.response) {
                case .success(let r):
                    receipt.apnsUniqueID = r.uniqueID
                    let retryAfter = r.retryAfter.flatMap { RetryAfter.parse($0, now: clock.nowMilliseconds()) }
                    // A broadcast has no device token to go stale: a 410 is not one.
                    let outcome = APNsClassifier.classify(
                        status: r.status == 410 ? 400 : r.status, reason: r.reason, timestamp: nil,
                        registeredAt: registeredAt, retryAfter: retryAfter)
                    completion(AttemptReport(outcome: outcome, httpStatus: r.status, receipt: receipt))
                case .failure(let error):
                    completion(AttemptReport(outcome: .transient(reason: ProviderReason(error)), receipt: receipt))
                }
            }
            return
        }
        let push = APNsPush(
            deviceToken: job.token, headers: request.headers + [("apns-id", apnsID)], payload: request.payload,
            notAfter: job.sendDeadline)
        lane.send(push) { result in
            var receipt = ProviderReceipt(
                apnsID: apnsID, origin: origin, elapsedMs: monotonicMilliseconds() - started)
            switch result {
            case .success(let r):
                receipt.apnsUniqueID = r.uniqueID
                let retryAfter = r.retryAfter.flatMap { RetryAfter.parse($0, now: clock.nowMilliseconds()) }
                let outcome = APNsClassifier.classify(
                    status: r.status, reason: r.reason, timestamp: r.timestamp, registeredAt: registeredAt,
                    retryAfter: retryAfter)
                completion(AttemptReport(outcome: outcome, httpStatus: r.status, receipt: receipt))
            case .failure(let error):
                completion(AttemptReport(outcome: .transient(reason: ProviderReason(error)), receipt: receipt))
            }
        }
    }

}
