public import HeraldCore
import HeraldCrypto
import HeraldIO

/// APNs as a ``PushTransport`` for one app: builds each request with
/// ``APNsRequest`` and sends it on the lane of the device's environment.
public final class APNsTransport: PushTransport {
    public let concurrencyLimit: Int
    private let settings: APNsAppSettings
    private let production: APNsLaneHandle
    private let development: APNsLaneHandle
    private let clock: any WallClock
    /// The requests of the messages being sent (see ``RecentlyBuilt``).
    private let requests = RecentlyBuilt<RequestKey, Result<Built, APNsRequestError>>()

    /// What an APNs request depends on besides the device's token and environment.
    private struct RequestKey: Hashable, Sendable {
        let messageID: String
        let acceptedAt: Int64
        let platform: Platform
        let bundleID: String?
        let badge: Int?
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
    }

    public func send(_ job: DeliveryJob, completion: @escaping @Sendable (AttemptReport) -> Void) {
        // The headers and body are the same for every device of the message
        // that shares its platform, bundle id and badge: built (and their
        // size checked) once for all of them.
        let key = RequestKey(
            messageID: job.messageID, acceptedAt: job.acceptedAt, platform: job.platform, bundleID: job.bundleID,
            badge: job.message.badge(for: job.user))
        let built = requests.value(for: key) {
            // Expiration counts from acceptance: a retry never stretches the TTL.
            Result { () throws(APNsRequestError) in
                let request = try APNsRequest(
                    message: job.message, platform: job.platform, user: job.user, settings: settings,
                    now: job.acceptedAt / 1000, bundleID: job.bundleID)
                return Built(headers: request.headers, payload: request.payload)
            }
        }
        guard case .success(let request) = built else {
            completion(AttemptReport(outcome: .failed(reason: .requestInvalid)))
            return
        }
        let lane = job.environment == .development ? development : production
        let registeredAt = job.registeredAt
        let clock = self.clock
        let push = APNsPush(
            deviceToken: job.token, headers: request.headers, payload: request.payload, notAfter: job.sendDeadline)
        lane.send(push) { result in
            switch result {
            case .success(let r):
                let retryAfter = r.retryAfter.flatMap { RetryAfter.parse($0, now: clock.nowMilliseconds()) }
                let outcome = APNsClassifier.classify(
                    status: r.status, reason: r.reason, timestamp: r.timestamp, registeredAt: registeredAt,
                    retryAfter: retryAfter)
                completion(AttemptReport(outcome: outcome, httpStatus: r.status))
            case .failure(let error):
                completion(AttemptReport(outcome: .transient(reason: ProviderReason(error))))
            }
        }
    }

}
