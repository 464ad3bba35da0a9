public import HeraldCore
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
        // The payload and the subscriber's key are made on the sender's
        // worker, in parallel, not on the scheduler's queue.
        let clock = self.clock
        sender.send(
            endpoint: job.token,
            prepare: {
                let message = job.message(sentAt: clock.nowMilliseconds())
                let payload: WebPushPayload
                do {
                    payload = try WebPushPayload(message: message, user: job.user)
                } catch {
                    if message.webContent != nil, case .payloadTooLarge? = error as? WebPushPayloadError {
                        return .refused(.failed(reason: WebPushSender.webPayloadTooLarge))
                    }
                    return .refused(.failed(reason: .requestInvalid))
                }
                guard let keys = job.keys, let subscriber = try? WebPushSubscriber(p256dh: keys.p256dh, auth: keys.auth)
                else { return .refused(.failed(reason: WebPushSender.invalidKeys)) }
                return .ready(
                    .init(
                        subscriber: subscriber, payload: payload, headers: WebPushHeaders(message: message),
                        notAfter: job.sendDeadline, serverKey: job.serverKey))
            }, report: completion)
    }
}
