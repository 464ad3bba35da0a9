/// Maps an FCM HTTP v1 response (apns-fcm.md §2.3) to an ``Outcome``.
public enum FCMClassifier {
    /// - Parameters:
    ///   - status: the HTTP status.
    ///   - errorCode: `FcmError.errorCode` from `error.details`, or failing that the
    ///     top-level `error.status`.
    ///   - retryAfter: the parsed `Retry-After` header, if any.
    ///
    /// `SENDER_ID_MISMATCH` (403) is `failed`, not `authRejected`: the token belongs
    /// to another Firebase project, so no credential refresh can fix it, and
    /// degrading the whole FCM transport for one foreign token would be wrong. Nor
    /// is it stale: the spec deletes only on `UNREGISTERED`. Likewise
    /// `INVALID_ARGUMENT` is `failed`, never stale.
    public static func classify(status: Int, errorCode: String?, retryAfter: Duration?) -> Outcome {
        let named = errorCode.flatMap { $0.isEmpty ? nil : ProviderReason($0) }
        let why = named ?? .httpStatus(status)
        if HTTPStatus.isSuccess(status) { return .delivered }
        let clientError = (400..<500).contains(status)
        if status == 404 || (clientError && named == .fcmUnregistered) { return .stale(reason: why) }
        if named == .fcmSenderIDMismatch { return .failed(reason: why) }
        if status == 401 || status == 403 || named == .fcmThirdPartyAuthError { return .authRejected(reason: why) }
        if HTTPStatus.isTransient(status) || named == .fcmQuotaExceeded || named == .fcmUnavailable
            || named == .fcmInternal
        {
            return .retry(after: retryAfter, reason: why)
        }
        return .failed(reason: why)
    }
}
