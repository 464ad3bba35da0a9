public import HeraldCore

/// What one attempt came to, as a transport reports it.
public struct AttemptReport: Sendable, Hashable {
    public var outcome: Outcome
    /// The provider's HTTP status, when an answer arrived.
    public var httpStatus: Int?

    public init(outcome: Outcome, httpStatus: Int? = nil) {
        self.outcome = outcome
        self.httpStatus = httpStatus
    }
}

/// One app's sender for one platform: builds the provider request from a
/// ``DeliveryJob``, sends it and classifies the answer. The scheduler owns
/// retries, stale deletion and the queue; a transport only attempts.
public protocol PushTransport: AnyObject, Sendable {
    /// The most of this transport's sends the scheduler keeps in flight at once.
    var concurrencyLimit: Int { get }

    /// Sends once; `completion` runs exactly once, on any thread, and must
    /// not block.
    func send(_ job: DeliveryJob, completion: @escaping @Sendable (AttemptReport) -> Void)
}

extension DeliveryJob {
    /// The message as it goes out at `now` (ms): its TTL cut to what is left
    /// of it, so a retry never asks a provider to keep it past the deadline.
    /// A TTL-0 message stays 0 (now or never).
    public func message(sentAt now: Int64) -> PushMessage {
        var m = message
        let left = expiresAt - now
        m.ttlSeconds = left <= 0 ? 0 : min(m.ttlSeconds, Int((left + 999) / 1000))
        return m
    }
}

extension ProviderReason {
    /// A request Herald could not build for this device (a routing or data bug).
    public static let requestInvalid = ProviderReason("request_invalid")
}
