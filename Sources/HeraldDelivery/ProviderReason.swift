/// Why a provider (or the connection to it) answered the way it did: an APNs
/// `reason`, an FCM error code, or a Herald-side name for a transport failure.
///
/// A closed-looking set that stays open: the known values are `static let`
/// members, and anything a provider adds tomorrow is kept verbatim through
/// ``unknown(_:)`` so it can still be recorded in `push.status`.
public struct ProviderReason: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    /// The reason exactly as the provider spelled it (or Herald's own name).
    public let rawValue: String

    public init(rawValue: String) { self.rawValue = rawValue }

    public init(_ rawValue: String) { self.rawValue = rawValue }

    /// A reason this module has no name for, kept as the provider sent it.
    public static func unknown(_ rawValue: String) -> ProviderReason { ProviderReason(rawValue) }

    /// A reason for an answer that carried none: `http_<status>`.
    public static func httpStatus(_ status: Int) -> ProviderReason { ProviderReason("http_\(status)") }

    public var description: String { rawValue }

    /// Whether this is one of the `static let` members below.
    public var isKnown: Bool { Self.known.contains(self) }
}

// MARK: - APNs (`{"reason": …}` in the response body, apns-fcm.md §1.5)

extension ProviderReason {
    public static let badCollapseID = ProviderReason("BadCollapseId")
    public static let badDeviceToken = ProviderReason("BadDeviceToken")
    public static let badExpirationDate = ProviderReason("BadExpirationDate")
    public static let badMessageID = ProviderReason("BadMessageId")
    public static let badPriority = ProviderReason("BadPriority")
    public static let badTopic = ProviderReason("BadTopic")
    public static let deviceTokenNotForTopic = ProviderReason("DeviceTokenNotForTopic")
    public static let duplicateHeaders = ProviderReason("DuplicateHeaders")
    public static let idleTimeout = ProviderReason("IdleTimeout")
    public static let invalidPushType = ProviderReason("InvalidPushType")
    public static let missingDeviceToken = ProviderReason("MissingDeviceToken")
    public static let missingTopic = ProviderReason("MissingTopic")
    public static let payloadEmpty = ProviderReason("PayloadEmpty")
    public static let topicDisallowed = ProviderReason("TopicDisallowed")
    public static let badCertificate = ProviderReason("BadCertificate")
    public static let badCertificateEnvironment = ProviderReason("BadCertificateEnvironment")
    public static let expiredProviderToken = ProviderReason("ExpiredProviderToken")
    public static let forbidden = ProviderReason("Forbidden")
    public static let invalidProviderToken = ProviderReason("InvalidProviderToken")
    public static let missingProviderToken = ProviderReason("MissingProviderToken")
    public static let unrelatedKeyIDInToken = ProviderReason("UnrelatedKeyIdInToken")
    public static let badEnvironmentKeyIDInToken = ProviderReason("BadEnvironmentKeyIdInToken")
    /// Undocumented but seen in the field (apns-fcm.md §1.5).
    public static let badEnvironmentKeyInToken = ProviderReason("BadEnvironmentKeyInToken")
    public static let badPath = ProviderReason("BadPath")
    public static let methodNotAllowed = ProviderReason("MethodNotAllowed")
    public static let expiredToken = ProviderReason("ExpiredToken")
    public static let unregistered = ProviderReason("Unregistered")
    public static let payloadTooLarge = ProviderReason("PayloadTooLarge")
    public static let tooManyProviderTokenUpdates = ProviderReason("TooManyProviderTokenUpdates")
    public static let tooManyRequests = ProviderReason("TooManyRequests")
    public static let internalServerError = ProviderReason("InternalServerError")
    public static let serviceUnavailable = ProviderReason("ServiceUnavailable")
    public static let shutdown = ProviderReason("Shutdown")

    /// The 403 reasons that blame the provider credential, not the device.
    static let apnsCredentialReasons: Set<ProviderReason> = [
        .expiredProviderToken, .invalidProviderToken, .missingProviderToken, .unrelatedKeyIDInToken,
        .badEnvironmentKeyIDInToken, .badEnvironmentKeyInToken, .badCertificate, .badCertificateEnvironment,
    ]
}

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
}

// MARK: - Transport failures (Herald's names; no provider answer was received)

extension ProviderReason {
    /// The request got no answer within its deadline.
    public static let timeout = ProviderReason("timeout")
    /// The connection was reset or closed mid-request.
    public static let connectionReset = ProviderReason("connection_reset")
    /// The server sent GOAWAY before answering this stream.
    public static let goAway = ProviderReason("goaway")
    /// The server refused the stream (RST_STREAM REFUSED_STREAM).
    public static let refusedStream = ProviderReason("refused_stream")
    /// The provider's host name did not resolve.
    public static let dnsFailure = ProviderReason("dns_failure")
    /// The TLS handshake or the certificate check failed.
    public static let tlsFailure = ProviderReason("tls_failure")
    /// The connection could not be opened.
    public static let connectFailure = ProviderReason("connect_failure")
}

extension ProviderReason {
    static let known: Set<ProviderReason> = [
        .badCollapseID, .badDeviceToken, .badExpirationDate, .badMessageID, .badPriority, .badTopic,
        .deviceTokenNotForTopic, .duplicateHeaders, .idleTimeout, .invalidPushType, .missingDeviceToken,
        .missingTopic, .payloadEmpty, .topicDisallowed, .badCertificate, .badCertificateEnvironment,
        .expiredProviderToken, .forbidden, .invalidProviderToken, .missingProviderToken, .unrelatedKeyIDInToken,
        .badEnvironmentKeyIDInToken, .badEnvironmentKeyInToken, .badPath, .methodNotAllowed, .expiredToken,
        .unregistered, .payloadTooLarge, .tooManyProviderTokenUpdates, .tooManyRequests, .internalServerError,
        .serviceUnavailable, .shutdown,
        .fcmUnspecifiedError, .fcmInvalidArgument, .fcmUnregistered, .fcmSenderIDMismatch, .fcmQuotaExceeded,
        .fcmUnavailable, .fcmInternal, .fcmThirdPartyAuthError,
        .timeout, .connectionReset, .goAway, .refusedStream, .dnsFailure, .tlsFailure, .connectFailure,
    ]
}
