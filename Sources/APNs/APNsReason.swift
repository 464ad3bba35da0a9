public import HeraldCore

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
    public static let tooManyProviderTokenUpdates = ProviderReason("TooManyProviderTokenUpdates")
    public static let tooManyRequests = ProviderReason("TooManyRequests")
    public static let internalServerError = ProviderReason("InternalServerError")
    public static let serviceUnavailable = ProviderReason("ServiceUnavailable")
    // `PayloadTooLarge` and `Shutdown` are HeraldCore's ``ProviderReason/payloadTooLarge``
    // and ``ProviderReason/shutdown``: other transports record them too.

    /// Every reason APNs documents (and the one seen in the field).
    public static let apnsReasons: Set<ProviderReason> = [
        .badCollapseID, .badDeviceToken, .badExpirationDate, .badMessageID, .badPriority, .badTopic,
        .deviceTokenNotForTopic, .duplicateHeaders, .idleTimeout, .invalidPushType, .missingDeviceToken,
        .missingTopic, .payloadEmpty, .topicDisallowed, .badCertificate, .badCertificateEnvironment,
        .expiredProviderToken, .forbidden, .invalidProviderToken, .missingProviderToken, .unrelatedKeyIDInToken,
        .badEnvironmentKeyIDInToken, .badEnvironmentKeyInToken, .badPath, .methodNotAllowed, .expiredToken,
        .unregistered, .payloadTooLarge, .tooManyProviderTokenUpdates, .tooManyRequests, .internalServerError,
        .serviceUnavailable, .shutdown,
    ]

    /// The 403 reasons that blame the provider credential, not the device.
    static let apnsCredentialReasons: Set<ProviderReason> = [
        .expiredProviderToken, .invalidProviderToken, .missingProviderToken, .unrelatedKeyIDInToken,
        .badEnvironmentKeyIDInToken, .badEnvironmentKeyInToken, .badCertificate, .badCertificateEnvironment,
    ]
}
