import HeraldDelivery
import Testing

private let t0: Int64 = 1_700_000_000_000

@Suite("APNs classification")
struct APNsClassifierTests {
    struct Row: Sendable, CustomTestStringConvertible {
        let status: Int
        let reason: String?
        var timestamp: Int64? = nil
        var registeredAt: Int64 = t0
        var retryAfter: Duration? = nil
        let expected: Outcome
        var testDescription: String { "\(status) \(reason ?? "-") ts=\(timestamp.map(String.init) ?? "-")" }
    }

    static let rows: [Row] = [
        Row(status: 200, reason: nil, expected: .delivered),
        // 410: stale only when the timestamp is not older than the registration.
        Row(status: 410, reason: "Unregistered", timestamp: t0 + 1, expected: .stale(reason: .unregistered)),
        Row(status: 410, reason: "Unregistered", timestamp: t0, expected: .stale(reason: .unregistered)),
        Row(status: 410, reason: "ExpiredToken", timestamp: t0 + 5000, expected: .stale(reason: .expiredToken)),
        Row(status: 410, reason: "Unregistered", timestamp: t0 - 1, expected: .failed(reason: .unregistered)),
        Row(status: 410, reason: "ExpiredToken", timestamp: t0 - 86_400_000, expected: .failed(reason: .expiredToken)),
        Row(status: 410, reason: "Unregistered", timestamp: nil, expected: .stale(reason: .unregistered)),
        Row(status: 410, reason: "SomethingElse", timestamp: t0 + 1, expected: .failed(reason: .unknown("SomethingElse"))),
        Row(status: 410, reason: nil, timestamp: t0 + 1, expected: .failed(reason: .httpStatus(410))),
        // 400: never stale.
        Row(status: 400, reason: "BadDeviceToken", expected: .failed(reason: .badDeviceToken)),
        Row(status: 400, reason: "DeviceTokenNotForTopic", expected: .failed(reason: .deviceTokenNotForTopic)),
        Row(status: 400, reason: "BadCollapseId", expected: .failed(reason: .badCollapseID)),
        Row(status: 400, reason: "BadExpirationDate", expected: .failed(reason: .badExpirationDate)),
        Row(status: 400, reason: "BadPriority", expected: .failed(reason: .badPriority)),
        Row(status: 400, reason: "BadTopic", expected: .failed(reason: .badTopic)),
        Row(status: 400, reason: "TopicDisallowed", expected: .failed(reason: .topicDisallowed)),
        Row(status: 400, reason: "BadMessageId", expected: .failed(reason: .badMessageID)),
        Row(status: 400, reason: "PayloadEmpty", expected: .failed(reason: .payloadEmpty)),
        Row(status: 400, reason: "IdleTimeout", expected: .retry(after: nil, reason: .idleTimeout)),
        // 403: credential problems degrade the transport; Forbidden is permanent.
        Row(status: 403, reason: "ExpiredProviderToken", expected: .authRejected(reason: .expiredProviderToken)),
        Row(status: 403, reason: "InvalidProviderToken", expected: .authRejected(reason: .invalidProviderToken)),
        Row(status: 403, reason: "MissingProviderToken", expected: .authRejected(reason: .missingProviderToken)),
        Row(status: 403, reason: "BadEnvironmentKeyIdInToken", expected: .authRejected(reason: .badEnvironmentKeyIDInToken)),
        Row(status: 403, reason: "BadEnvironmentKeyInToken", expected: .authRejected(reason: .badEnvironmentKeyInToken)),
        Row(status: 403, reason: "UnrelatedKeyIdInToken", expected: .authRejected(reason: .unrelatedKeyIDInToken)),
        Row(status: 403, reason: "BadCertificateEnvironment", expected: .authRejected(reason: .badCertificateEnvironment)),
        Row(status: 403, reason: nil, expected: .authRejected(reason: .httpStatus(403))),
        Row(status: 403, reason: "Forbidden", expected: .failed(reason: .forbidden)),
        // Other 4xx.
        Row(status: 404, reason: "BadPath", expected: .failed(reason: .badPath)),
        Row(status: 405, reason: "MethodNotAllowed", expected: .failed(reason: .methodNotAllowed)),
        Row(status: 413, reason: "PayloadTooLarge", expected: .failed(reason: .payloadTooLarge)),
        Row(status: 413, reason: nil, expected: .failed(reason: .payloadTooLarge)),
        Row(status: 418, reason: "NewReason", expected: .failed(reason: .unknown("NewReason"))),
        // Transient, honouring Retry-After.
        Row(status: 429, reason: "TooManyRequests", retryAfter: .seconds(30),
            expected: .retry(after: .seconds(30), reason: .tooManyRequests)),
        Row(status: 429, reason: "TooManyProviderTokenUpdates",
            expected: .retry(after: nil, reason: .tooManyProviderTokenUpdates)),
        Row(status: 500, reason: "InternalServerError", expected: .retry(after: nil, reason: .internalServerError)),
        Row(status: 503, reason: "ServiceUnavailable", retryAfter: .seconds(120),
            expected: .retry(after: .seconds(120), reason: .serviceUnavailable)),
        Row(status: 503, reason: "Shutdown", expected: .retry(after: nil, reason: .shutdown)),
        Row(status: 502, reason: nil, expected: .retry(after: nil, reason: .httpStatus(502))),
        // Odd statuses.
        Row(status: 301, reason: nil, expected: .failed(reason: .httpStatus(301))),
    ]

    @Test("every status/reason row", arguments: rows)
    func classify(_ row: Row) {
        let outcome = APNsClassifier.classify(
            status: row.status, reason: row.reason, timestamp: row.timestamp, registeredAt: row.registeredAt,
            retryAfter: row.retryAfter)
        #expect(outcome == row.expected)
    }

    @Test("an empty reason is treated as none")
    func emptyReason() {
        #expect(
            APNsClassifier.classify(status: 400, reason: "", timestamp: nil, registeredAt: 0, retryAfter: nil)
                == .failed(reason: .httpStatus(400)))
    }
}

@Suite("FCM classification")
struct FCMClassifierTests {
    struct Row: Sendable, CustomTestStringConvertible {
        let status: Int
        let code: String?
        var fromDetails = true
        var retryAfter: Duration? = nil
        let expected: Outcome
        var testDescription: String { "\(status) \(code ?? "-")\(fromDetails ? "" : " (error.status)")" }
    }

    static let rows: [Row] = [
        Row(status: 200, code: nil, expected: .delivered),
        Row(status: 404, code: "UNREGISTERED", expected: .stale(reason: .fcmUnregistered)),
        // Only a 404 whose FcmError detail says UNREGISTERED is stale (SPEC Revision 2).
        Row(status: 404, code: "NOT_FOUND", expected: .failed(reason: .unknown("NOT_FOUND"))),
        Row(status: 404, code: nil, expected: .failed(reason: .httpStatus(404))),
        Row(status: 404, code: "UNREGISTERED", fromDetails: false, expected: .failed(reason: .fcmUnregistered)),
        Row(status: 400, code: "UNREGISTERED", expected: .failed(reason: .fcmUnregistered)),
        Row(status: 400, code: "INVALID_ARGUMENT", expected: .failed(reason: .fcmInvalidArgument)),
        Row(status: 400, code: nil, expected: .failed(reason: .httpStatus(400))),
        Row(status: 400, code: "UNSPECIFIED_ERROR", expected: .failed(reason: .fcmUnspecifiedError)),
        // SENDER_ID_MISMATCH: a foreign token, permanent for this device; not a credential problem.
        Row(status: 403, code: "SENDER_ID_MISMATCH", expected: .failed(reason: .fcmSenderIDMismatch)),
        Row(status: 401, code: "THIRD_PARTY_AUTH_ERROR", expected: .authRejected(reason: .fcmThirdPartyAuthError)),
        Row(status: 401, code: "UNAUTHENTICATED", expected: .authRejected(reason: .unknown("UNAUTHENTICATED"))),
        Row(status: 401, code: nil, expected: .authRejected(reason: .httpStatus(401))),
        Row(status: 403, code: "PERMISSION_DENIED", expected: .authRejected(reason: .unknown("PERMISSION_DENIED"))),
        Row(status: 429, code: "QUOTA_EXCEEDED", retryAfter: .seconds(60),
            expected: .retry(after: .seconds(60), reason: .fcmQuotaExceeded)),
        Row(status: 429, code: nil, expected: .retry(after: nil, reason: .httpStatus(429))),
        Row(status: 503, code: "UNAVAILABLE", retryAfter: .seconds(10),
            expected: .retry(after: .seconds(10), reason: .fcmUnavailable)),
        Row(status: 500, code: "INTERNAL", expected: .retry(after: nil, reason: .fcmInternal)),
        Row(status: 500, code: "UNSPECIFIED_ERROR", expected: .retry(after: nil, reason: .fcmUnspecifiedError)),
        Row(status: 502, code: nil, expected: .retry(after: nil, reason: .httpStatus(502))),
        Row(status: 408, code: nil, expected: .retry(after: nil, reason: .httpStatus(408))),
        Row(status: 413, code: nil, expected: .failed(reason: .httpStatus(413))),
    ]

    @Test("every status/error-code row", arguments: rows)
    func classify(_ row: Row) {
        #expect(
            FCMClassifier.classify(
                status: row.status, errorCode: row.code, fromDetails: row.fromDetails, retryAfter: row.retryAfter)
                == row.expected)
    }
}

@Suite("Web Push classification")
struct WebPushClassifierTests {
    struct Row: Sendable, CustomTestStringConvertible {
        let status: Int
        var retryAfter: Duration? = nil
        var reason: String? = nil
        var steppedDown = false
        let expected: Outcome
        var testDescription: String { "\(status)\(steppedDown ? " (stepped down)" : "")" }
    }

    static let rows: [Row] = [
        Row(status: 200, expected: .delivered),
        Row(status: 201, expected: .delivered),
        Row(status: 202, expected: .delivered),
        Row(status: 404, expected: .stale(reason: .httpStatus(404))),
        Row(status: 410, expected: .stale(reason: .httpStatus(410))),
        Row(status: 410, reason: "Unregistered", expected: .stale(reason: .unregistered)),
        Row(status: 413, expected: .tooLarge),
        Row(status: 413, steppedDown: true, expected: .failed(reason: .payloadTooLarge)),
        Row(status: 401, expected: .authRejected(reason: .httpStatus(401))),
        Row(status: 403, reason: "BadJwtToken", expected: .authRejected(reason: .unknown("BadJwtToken"))),
        Row(status: 429, retryAfter: .seconds(30), expected: .retry(after: .seconds(30), reason: .httpStatus(429))),
        Row(status: 500, expected: .retry(after: nil, reason: .httpStatus(500))),
        Row(status: 502, expected: .retry(after: nil, reason: .httpStatus(502))),
        Row(status: 503, retryAfter: .seconds(120), expected: .retry(after: .seconds(120), reason: .httpStatus(503))),
        Row(status: 408, expected: .retry(after: nil, reason: .httpStatus(408))),
        Row(status: 400, expected: .failed(reason: .httpStatus(400))),
        Row(status: 400, reason: "VapidPkHashMismatch", expected: .failed(reason: .unknown("VapidPkHashMismatch"))),
        Row(status: 405, expected: .failed(reason: .httpStatus(405))),
        Row(status: 406, expected: .failed(reason: .httpStatus(406))),
        Row(status: 301, expected: .failed(reason: .httpStatus(301))),
    ]

    @Test("every status row", arguments: rows)
    func classify(_ row: Row) {
        let outcome = WebPushClassifier.classify(
            status: row.status, retryAfter: row.retryAfter, reason: row.reason, steppedDown: row.steppedDown)
        #expect(outcome == row.expected)
    }
}

@Suite("transport failures and reasons")
struct OutcomeTests {
    @Test(
        "transport-level failures retry with no provider delay",
        arguments: [
            ProviderReason.timeout, .connectionReset, .goAway, .refusedStream, .dnsFailure, .tlsFailure,
            .connectFailure,
        ])
    func transient(_ reason: ProviderReason) {
        let outcome = Outcome.transient(reason: reason)
        #expect(outcome == .retry(after: nil, reason: reason))
        #expect(outcome.isRetryable)
        #expect(outcome.reason == reason)
    }

    @Test("reasons keep the provider's exact spelling")
    func spelling() {
        let pairs: [(ProviderReason, String)] = [
            (.badDeviceToken, "BadDeviceToken"), (.unregistered, "Unregistered"), (.expiredToken, "ExpiredToken"),
            (.expiredProviderToken, "ExpiredProviderToken"), (.invalidProviderToken, "InvalidProviderToken"),
            (.missingProviderToken, "MissingProviderToken"),
            (.tooManyProviderTokenUpdates, "TooManyProviderTokenUpdates"), (.tooManyRequests, "TooManyRequests"),
            (.internalServerError, "InternalServerError"), (.serviceUnavailable, "ServiceUnavailable"),
            (.shutdown, "Shutdown"), (.payloadTooLarge, "PayloadTooLarge"), (.badCollapseID, "BadCollapseId"),
            (.badExpirationDate, "BadExpirationDate"), (.badPriority, "BadPriority"), (.badTopic, "BadTopic"),
            (.topicDisallowed, "TopicDisallowed"), (.deviceTokenNotForTopic, "DeviceTokenNotForTopic"),
            (.badEnvironmentKeyIDInToken, "BadEnvironmentKeyIdInToken"),
            (.fcmUnregistered, "UNREGISTERED"), (.fcmInvalidArgument, "INVALID_ARGUMENT"),
            (.fcmSenderIDMismatch, "SENDER_ID_MISMATCH"), (.fcmQuotaExceeded, "QUOTA_EXCEEDED"),
            (.fcmUnavailable, "UNAVAILABLE"), (.fcmInternal, "INTERNAL"),
            (.fcmThirdPartyAuthError, "THIRD_PARTY_AUTH_ERROR"), (.fcmUnspecifiedError, "UNSPECIFIED_ERROR"),
        ]
        for (reason, raw) in pairs {
            #expect(reason.rawValue == raw)
            #expect(reason.isKnown)
            #expect(ProviderReason(raw) == reason)
        }
    }

    @Test("an unknown reason is kept verbatim")
    func unknown() {
        let reason = ProviderReason.unknown("BrandNewReason")
        #expect(reason.rawValue == "BrandNewReason")
        #expect(reason.description == "BrandNewReason")
        #expect(!reason.isKnown)
        #expect(ProviderReason.httpStatus(418).rawValue == "http_418")
    }

    @Test("only retry, auth rejection and the Web Push step-down lead to another attempt")
    func retryable() {
        #expect(!Outcome.delivered.isRetryable)
        #expect(Outcome.authRejected(reason: .expiredProviderToken).isRetryable)
        #expect(Outcome.tooLarge.isRetryable)
        #expect(Outcome.tooLarge.reason == .payloadTooLarge)
        #expect(!Outcome.failed(reason: .badDeviceToken).isRetryable)
        #expect(!Outcome.stale(reason: .unregistered).isRetryable)
        #expect(Outcome.delivered.reason == nil)
    }
}
