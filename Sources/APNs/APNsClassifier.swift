public import HeraldCore

/// Maps an APNs response (apns-fcm.md §1.4–1.5) to an ``Outcome``.
public enum APNsClassifier {
    /// - Parameters:
    ///   - status: the HTTP `:status`.
    ///   - reason: the body's `reason`, if any.
    ///   - timestamp: the body's `timestamp` (ms since the epoch); APNs sends it only with 410.
    ///   - registeredAt: when the device last registered this token (ms since the epoch).
    ///   - retryAfter: the parsed `Retry-After` header, if any (see ``RetryAfter``).
    ///
    /// 410 `Unregistered`/`ExpiredToken` is stale only when `timestamp` is not older
    /// than `registeredAt`; an older timestamp means the device registered again
    /// after APNs invalidated the token, so the answer is recorded as `failed` and
    /// the device kept. A 410 without a timestamp carries no such evidence and is
    /// stale. `BadDeviceToken` and `DeviceTokenNotForTopic` are never stale.
    public static func classify(
        status: Int, reason: String?, timestamp: Int64?, registeredAt: Int64, retryAfter: Duration?
    ) -> Outcome {
        let named = reason.flatMap { $0.isEmpty ? nil : ProviderReason($0) }
        let why = named ?? .httpStatus(status)
        if HTTPStatus.isSuccess(status) { return .delivered }
        switch status {
        case 410:
            guard why == .unregistered || why == .expiredToken else { return .failed(reason: why) }
            if let timestamp, timestamp < registeredAt { return .failed(reason: why) }
            return .stale(reason: why)
        case 403:
            // Forbidden is Apple's "do not retry"; every other 403 is about the credential.
            return why == .forbidden ? .failed(reason: why) : .authRejected(reason: why)
        case 413:
            return .failed(reason: named ?? .payloadTooLarge)
        case 400 where why == .idleTimeout:
            // The connection idled out before the request was read: resend on a new one.
            return .retry(after: retryAfter, reason: why)
        default:
            if HTTPStatus.isTransient(status) { return .retry(after: retryAfter, reason: why) }
            return .failed(reason: why)
        }
    }
}
