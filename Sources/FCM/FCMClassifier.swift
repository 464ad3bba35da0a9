public import HeraldCore

/// Maps an FCM HTTP v1 response (apns-fcm.md §2.3) to an ``Outcome``.
public enum FCMClassifier {
    /// - Parameters:
    ///   - status: the HTTP status.
    ///   - errorCode: `FcmError.errorCode` from `error.details`, or failing that the
    ///     top-level `error.status`.
    ///   - fromDetails: whether `errorCode` came from a `google.firebase.fcm.v1.FcmError`
    ///     detail (false when it is the top-level `error.status`).
    ///   - retryAfter: the parsed `Retry-After` header, if any.
    ///
    /// Stale is only a 404 whose `FcmError` detail says `UNREGISTERED`: a plain
    /// `NOT_FOUND` (a wrong project path, a proxy's 404) says nothing about the
    /// token, so it is `failed` and the device is kept.
    /// `SENDER_ID_MISMATCH` (403) is `failed`, not `authRejected`: the token belongs
    /// to another Firebase project, so no credential refresh can fix it, and
    /// degrading the whole FCM transport for one foreign token would be wrong. Nor
    /// is it stale: the spec deletes only on `UNREGISTERED`. Likewise
    /// `INVALID_ARGUMENT` is `failed`, never stale.
    public static func classify(
        status: Int, errorCode: String?, fromDetails: Bool = true, retryAfter: Duration?
    ) -> Outcome {
        let named = errorCode.flatMap { $0.isEmpty ? nil : ProviderReason($0) }
        let why = named ?? .httpStatus(status)
        if HTTPStatus.isSuccess(status) { return .delivered }
        if status == 404 && fromDetails && named == .fcmUnregistered { return .stale(reason: why) }
        if status == 404 { return .failed(reason: why) }
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
