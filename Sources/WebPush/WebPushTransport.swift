public import HeraldCore
public import HeraldDelivery
import HeraldCrypto

/// Web Push as a ``PushTransport`` for one app: the plaintext and headers of
/// each device (TTL cut to what is left), sealed and sent by the app's
/// ``WebPushSender`` (send-time endpoint check, pinning, one 413 step-down).
public final class WebPushTransport: PushTransport {
    public let concurrencyLimit: Int
    public let sender: WebPushSender
    private let clock: any WallClock

    public init(sender: WebPushSender, clock: any WallClock = SystemClock(), concurrencyLimit: Int = 1000) {
        self.sender = sender
        self.clock = clock
        self.concurrencyLimit = concurrencyLimit
    }

    public func send(_ job: DeliveryJob, completion: @escaping @Sendable (AttemptReport) -> Void) {
        let message = job.message(sentAt: clock.nowMilliseconds())
        let payload: WebPushPayload
        let subscriber: WebPushSubscriber
        do {
            payload = try WebPushPayload(message: message, user: job.user)
        } catch {
            completion(AttemptReport(outcome: .failed(reason: .requestInvalid)))
            return
        }
        do {
            guard let keys = job.keys else { throw CryptoError.publicKeyLength }
            subscriber = try WebPushSubscriber(p256dh: keys.p256dh, auth: keys.auth)
        } catch {
            completion(AttemptReport(outcome: .failed(reason: WebPushSender.invalidKeys)))
            return
        }
        sender.send(
            endpoint: job.token, subscriber: subscriber, payload: payload, headers: WebPushHeaders(message: message)
        ) { outcome, status in
            completion(AttemptReport(outcome: outcome, httpStatus: status))
        }
    }
}
