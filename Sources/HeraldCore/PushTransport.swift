/// What one attempt came to, as a transport reports it.
public struct AttemptReport: Sendable, Hashable {
    public var outcome: Outcome
    /// The provider's HTTP status, when an answer arrived.
    public var httpStatus: Int?
    /// Set when the attempt sealed a record of `web_payload`: whether it
    /// fitted whole or which shrink step made it fit (`push.status` `shrunk`).
    public var shrink: ShrinkOutcome?
    /// What names the push at the provider, and how the attempt went on
    /// the wire; nil when nothing was sent.
    public var receipt: ProviderReceipt?

    public init(
        outcome: Outcome, httpStatus: Int? = nil, shrink: ShrinkOutcome? = nil, receipt: ProviderReceipt? = nil
    ) {
        self.outcome = outcome
        self.httpStatus = httpStatus
        self.shrink = shrink
        self.receipt = receipt
    }
}

/// One attempt as the provider saw it: the identifiers that find the push
/// in the provider's own records, where the request went and how long its
/// answer took.
public struct ProviderReceipt: Sendable, Hashable {
    /// APNs: the `apns-id` Herald sets, one UUID per delivery, the same on
    /// every attempt (Apple's delivery log is searched by it).
    public var apnsID: String?
    /// APNs: the `apns-unique-id` APNs answers with (its development
    /// environment gives one).
    public var apnsUniqueID: String?
    /// FCM: the message `name` a `messages:send` success answers with.
    public var fcmName: String?
    /// Web Push: the `Location` of the push service's answer (RFC 8030:
    /// the push message's URL).
    public var location: String?
    /// The origin the request went to (`https://host:port`).
    public var origin: String?
    /// From the request handed to the client to its answer (or failure), ms.
    public var elapsedMs: Int64?

    /// What the provider named the push in its answer: the
    /// `apns-unique-id`, the FCM message `name` or the Web Push `Location`
    /// (the store keeps it; the `apns-id` is derived from the delivery).
    public var providerID: String? { apnsUniqueID ?? fcmName ?? location }

    public init(
        apnsID: String? = nil, apnsUniqueID: String? = nil, fcmName: String? = nil, location: String? = nil,
        origin: String? = nil, elapsedMs: Int64? = nil
    ) {
        self.apnsID = apnsID
        self.apnsUniqueID = apnsUniqueID
        self.fcmName = fcmName
        self.location = location
        self.origin = origin
        self.elapsedMs = elapsedMs
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
