/// What one attempt came to, as a transport reports it.
public struct AttemptReport: Sendable, Hashable {
    public var outcome: Outcome
    /// The provider's HTTP status, when an answer arrived.
    public var httpStatus: Int?
    /// Set when the attempt sealed a record of `web_payload`: whether it
    /// fitted whole or which shrink step made it fit (`push.status` `shrunk`).
    public var shrink: ShrinkOutcome?

    public init(outcome: Outcome, httpStatus: Int? = nil, shrink: ShrinkOutcome? = nil) {
        self.outcome = outcome
        self.httpStatus = httpStatus
        self.shrink = shrink
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
