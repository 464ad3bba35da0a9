/// What one send attempt to one device came to, independent of the transport.
///
/// The scheduler turns an outcome into a ``DeliveryState``: `retry` and
/// `authRejected` go through ``BackoffPolicy``, `stale` through ``StaleGuard``.
public enum Outcome: Sendable, Hashable {
    /// The provider accepted the notification (2xx).
    case delivered
    /// A transient failure: try again later, no sooner than `after` when the
    /// provider said so (`Retry-After`).
    case retry(after: Duration?, reason: ProviderReason)
    /// The provider rejected Herald's credential or configuration: mark the
    /// transport degraded, refresh the credential, retry. Never deletes the device.
    case authRejected(reason: ProviderReason)
    /// A permanent failure for this delivery; the device is kept.
    case failed(reason: ProviderReason)
    /// The device's token is no longer valid: delete it if ``StaleGuard`` allows
    /// and the device still holds the token that was sent.
    case stale(reason: ProviderReason)
    /// Web Push 413 on the full-size record: resend once with the minimal payload.
    case tooLarge

    /// A transport-level failure (timeout, reset, GOAWAY, refused stream, DNS,
    /// TLS): always worth a retry, with no provider-given delay.
    public static func transient(reason: ProviderReason) -> Outcome {
        .retry(after: nil, reason: reason)
    }

    /// The reason to record with the delivery; nil only for `delivered`.
    public var reason: ProviderReason? {
        switch self {
        case .delivered: nil
        case .retry(_, let reason), .authRejected(let reason), .failed(let reason), .stale(let reason): reason
        case .tooLarge: .payloadTooLarge
        }
    }

    /// Whether another attempt may follow (after backoff, a credential refresh,
    /// or the Web Push step-down).
    public var isRetryable: Bool {
        switch self {
        case .retry, .authRejected, .tooLarge: true
        case .delivered, .failed, .stale: false
        }
    }
}

/// Statuses every provider's classifier treats alike.
public enum HTTPStatus {
    public static func isSuccess(_ status: Int) -> Bool { (200..<300).contains(status) }

    /// 408, 429 and 5xx: the request may succeed if sent again later.
    public static func isTransient(_ status: Int) -> Bool {
        status == 408 || status == 429 || (500..<600).contains(status)
    }
}
