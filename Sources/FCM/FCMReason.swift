public import HeraldCore

// MARK: - FCM HTTP v1 (`FcmError.errorCode` in `error.details`, apns-fcm.md §2.3)

extension ProviderReason {
    public static let fcmUnspecifiedError = ProviderReason("UNSPECIFIED_ERROR")
    public static let fcmInvalidArgument = ProviderReason("INVALID_ARGUMENT")
    public static let fcmUnregistered = ProviderReason("UNREGISTERED")
    public static let fcmSenderIDMismatch = ProviderReason("SENDER_ID_MISMATCH")
    public static let fcmQuotaExceeded = ProviderReason("QUOTA_EXCEEDED")
    public static let fcmUnavailable = ProviderReason("UNAVAILABLE")
    public static let fcmInternal = ProviderReason("INTERNAL")
    public static let fcmThirdPartyAuthError = ProviderReason("THIRD_PARTY_AUTH_ERROR")

    /// Every `FcmError.errorCode` FCM documents.
    public static let fcmErrorCodes: Set<ProviderReason> = [
        .fcmUnspecifiedError, .fcmInvalidArgument, .fcmUnregistered, .fcmSenderIDMismatch, .fcmQuotaExceeded,
        .fcmUnavailable, .fcmInternal, .fcmThirdPartyAuthError,
    ]
}
