public import HeraldCore

/// FCM HTTP v1 as a ``PushTransport`` for one app: builds each message with
/// ``FCMMessage`` (its TTL cut to what is left) and sends it with the app's
/// ``FCMSender``.
public final class FCMTransport: PushTransport {
    public let concurrencyLimit: Int
    public let sender: FCMSender
    private let settings: FCMAppSettings
    private let clock: any WallClock

    public init(
        sender: FCMSender, settings: FCMAppSettings, clock: any WallClock = SystemClock(), concurrencyLimit: Int = 400
    ) {
        self.sender = sender
        self.settings = settings
        self.clock = clock
        self.concurrencyLimit = concurrencyLimit
    }

    public func send(_ job: DeliveryJob, completion: @escaping @Sendable (AttemptReport) -> Void) {
        let body: [UInt8]
        do {
            body = try FCMMessage(
                message: job.message(sentAt: clock.nowMilliseconds()), token: job.token, user: job.user,
                settings: settings
            ).body
        } catch {
            completion(AttemptReport(outcome: .failed(reason: .requestInvalid)))
            return
        }
        sender.send(body: body, notAfter: job.sendDeadline) { outcome, info in
            completion(AttemptReport(outcome: outcome, httpStatus: info?.status))
        }
    }
}
