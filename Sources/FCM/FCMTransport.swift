public import HeraldCore
import HeraldIO

/// FCM HTTP v1 as a ``PushTransport`` for one app: builds each message with
/// ``FCMMessage`` (its TTL cut to what is left) and sends it with the app's
/// ``FCMSender``.
public final class FCMTransport: PushTransport {
    public let concurrencyLimit: Int
    public let sender: FCMSender
    private let settings: FCMAppSettings
    private let clock: any WallClock
    /// The templates of the messages being sent (see ``RecentlyBuilt``).
    private let templates = RecentlyBuilt<TemplateKey, Result<FCMMessage.Template, FCMMessageError>>()

    /// What an FCM body depends on besides the device's token.
    private struct TemplateKey: Hashable, Sendable {
        let messageID: String
        let acceptedAt: Int64
        let ttlSeconds: Int
        let badge: Int?
        let silent: Bool
    }

    public init(
        sender: FCMSender, settings: FCMAppSettings, clock: any WallClock = SystemClock(), concurrencyLimit: Int = 400
    ) {
        self.sender = sender
        self.settings = settings
        self.clock = clock
        self.concurrencyLimit = concurrencyLimit
    }

    public func send(_ job: DeliveryJob, completion: @escaping @Sendable (AttemptReport) -> Void) {
        // Everything but the token is the same for every device of the
        // message with the same badge, within the same second of its TTL:
        // built (and its size checked) once for them.
        let message = job.message(sentAt: clock.nowMilliseconds())
        let key = TemplateKey(
            messageID: job.messageID, acceptedAt: job.acceptedAt, ttlSeconds: message.ttlSeconds,
            badge: message.badge(for: job.user), silent: job.silent)
        let template = templates.value(for: key) {
            Result { () throws(FCMMessageError) in
                try FCMMessage.Template(message: message, user: job.user, settings: settings)
            }
        }
        guard case .success(let template) = template else {
            completion(AttemptReport(outcome: .failed(reason: .requestInvalid)))
            return
        }
        let body = FCMMessage(template, token: job.token).body
        let origin = sender.origin
        let started = monotonicMilliseconds()
        sender.send(body: body, notAfter: job.sendDeadline) { outcome, info in
            let receipt = ProviderReceipt(
                fcmName: info?.messageName, origin: origin, elapsedMs: monotonicMilliseconds() - started)
            completion(AttemptReport(outcome: outcome, httpStatus: info?.status, receipt: receipt))
        }
    }
}
