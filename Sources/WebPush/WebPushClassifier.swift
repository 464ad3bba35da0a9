public import HeraldCore

/// Maps a Web Push service's response (webpush.md §3.4) to an ``Outcome``.
public enum WebPushClassifier {
    /// - Parameters:
    ///   - status: the HTTP status.
    ///   - retryAfter: the parsed `Retry-After` header, if any.
    ///   - reason: a reason from the body when the service gives one (Apple's
    ///     `{"reason": …}`); `http_<status>` otherwise.
    ///   - steppedDown: whether this attempt already carried the minimal payload;
    ///     a second 413 is then `failed(PayloadTooLarge)` instead of `tooLarge`.
    ///
    /// 401/403 are VAPID or configuration errors, never a deletion; only 404 and
    /// 410 are stale.
    public static func classify(
        status: Int, retryAfter: Duration?, reason: String? = nil, steppedDown: Bool = false
    ) -> Outcome {
        let why = reason.flatMap { $0.isEmpty ? nil : ProviderReason($0) } ?? .httpStatus(status)
        if HTTPStatus.isSuccess(status) { return .delivered }
        switch status {
        case 404, 410: return .stale(reason: why)
        case 413: return steppedDown ? .failed(reason: .payloadTooLarge) : .tooLarge
        case 401, 403: return .authRejected(reason: why)
        default:
            if HTTPStatus.isTransient(status) { return .retry(after: retryAfter, reason: why) }
            return .failed(reason: why)
        }
    }
}
