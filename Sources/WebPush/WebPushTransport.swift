public import HeraldCore
import HeraldCrypto
import HeraldIO

/// Web Push as a ``PushTransport`` for one app: the plaintext and headers of
/// each device (TTL cut to what is left), sealed and sent by the app's
/// ``WebPushSender`` (send-time endpoint check, pinning, one 413 step-down).
public final class WebPushTransport: PushTransport {
    public let concurrencyLimit: Int
    public let sender: WebPushSender
    private let clock: any WallClock
    /// The fitted `web_payload` of recent messages: fitted once per message,
    /// not once per device and attempt.
    let fits = WebContentFitCache()

    public init(sender: WebPushSender, clock: any WallClock = SystemClock(), concurrencyLimit: Int = 1000) {
        self.sender = sender
        self.clock = clock
        self.concurrencyLimit = concurrencyLimit
    }

    public func send(_ job: DeliveryJob, completion: @escaping @Sendable (AttemptReport) -> Void) {
        // The payload and the subscriber's key are made on the sender's
        // worker, in parallel, not on the scheduler's queue.
        let clock = self.clock
        let fits = self.fits
        sender.send(
            endpoint: job.token,
            prepare: {
                let message = job.message(sentAt: clock.nowMilliseconds())
                let payload: WebPushPayload
                do {
                    payload = try WebPushPayload(
                        message: message, user: job.user,
                        fitted: message.webContent.map { fits.fitted(messageID: job.messageID, content: $0) })
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

/// A bounded memo of fitted `web_payload`s by message id (least recently
/// used forgotten past `capacity`): a fan-out's devices share one fit. A
/// message's content never changes, so its id names its fit.
final class WebContentFitCache: Sendable {
    static let defaultCapacity = 64
    let capacity: Int
    private let state: Locked<(cache: LRUCache<String, WebPushPayload.FittedContent>, computed: Int)>

    init(capacity: Int = WebContentFitCache.defaultCapacity) {
        self.capacity = capacity
        state = Locked((LRUCache(capacity: capacity), 0))
    }

    /// The fit of `content`, the `web_payload` of message `messageID`.
    func fitted(messageID: String, content: WebContent) -> WebPushPayload.FittedContent {
        if let known = state.withLock({ $0.cache.get(messageID) }) { return known }
        // Fitted outside the lock: two workers may both fit a new message once.
        let fitted = WebPushPayload.fit(content)
        state.withLock {
            _ = $0.cache.set(messageID, fitted)
            $0.computed += 1
        }
        return fitted
    }

    var count: Int { state.withLock { $0.cache.count } }
    /// How many fits were made (not found in the memo).
    var computed: Int { state.withLock { $0.computed } }
}
