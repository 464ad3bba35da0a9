public import HeraldCore
import HeraldCrypto

/// APNs as a ``PushTransport`` for one app: builds each request with
/// ``APNsRequest`` and sends it on the lane of the device's environment.
public final class APNsTransport: PushTransport {
    public let concurrencyLimit: Int
    private let settings: APNsAppSettings
    private let production: APNsLaneHandle
    private let development: APNsLaneHandle
    private let clock: any WallClock

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
        let request: APNsRequest
        do {
            // Expiration counts from acceptance: a retry never stretches the TTL.
            request = try APNsRequest(
                message: job.message, platform: job.platform, user: job.user, settings: settings,
                now: job.acceptedAt / 1000, bundleID: job.bundleID)
        } catch {
            completion(AttemptReport(outcome: .failed(reason: .requestInvalid)))
            return
        }
        let lane = job.environment == .development ? development : production
        let registeredAt = job.registeredAt
        let clock = self.clock
        lane.send(APNsPush(deviceToken: job.token, request: request, notAfter: job.sendDeadline)) { result in
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
