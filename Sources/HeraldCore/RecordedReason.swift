/// Why a delivery is recorded as it is: the reason (a provider's, or
/// Herald's own) and, when Herald ended the delivery on it, how. It stays
/// this value from the answer to the store; the text `push.status` shows
/// (`deliveries.reason`) is made only where the statement binds it.
public struct RecordedReason: Sendable, Hashable, CustomStringConvertible, ExpressibleByStringLiteral {
    public let reason: ProviderReason
    public let ending: Ending?

    /// How Herald ended a delivery on its reason.
    public enum Ending: Sendable, Hashable {
        /// `max_retries` attempts were made: `<reason> (retries exhausted)`.
        case retriesExhausted
        /// The TTL ran out before another attempt: `<reason> (ttl elapsed)`.
        case ttlElapsed
        /// The device was stale but not deleted (the stale guard's name for
        /// why): `<reason> (stale; not deleted: <why>)`.
        case staleNotDeleted(String)
        /// The device registered a new token meanwhile:
        /// `<reason> (device kept: it registered a new token)`.
        case deviceKept
    }

    public init(_ reason: ProviderReason, _ ending: Ending? = nil) {
        self.reason = reason
        self.ending = ending
    }

    /// A reason with no ending, spelled out (tests, fixed names).
    public init(stringLiteral value: String) {
        self.init(ProviderReason(value))
    }

    /// The text written to the store.
    public var text: String {
        switch ending {
        case nil: reason.rawValue
        case .retriesExhausted: reason.rawValue + " (retries exhausted)"
        case .ttlElapsed: reason.rawValue + " (ttl elapsed)"
        case .staleNotDeleted(let why): reason.rawValue + " (stale; not deleted: " + why + ")"
        case .deviceKept: reason.rawValue + " (device kept: it registered a new token)"
        }
    }

    public var description: String { text }
}

extension ProviderReason {
    /// Herald's: the send deadline passed before the delivery was sent.
    public static let ttlElapsed = ProviderReason("ttl elapsed")
    /// Herald's: the delivery's lane has no transport (configuration changed).
    public static let noTransport = ProviderReason("transport_disabled: no transport configured")
    /// Herald's: waiting for a credential the provider rejected (``DeliveryReason/credentialRejected``).
    public static let credentialRejected = ProviderReason(DeliveryReason.credentialRejected)
    /// Herald's: waiting for an unresponsive Web Push origin (``DeliveryReason/originUnresponsive``).
    public static let originUnresponsive = ProviderReason(DeliveryReason.originUnresponsive)
}
