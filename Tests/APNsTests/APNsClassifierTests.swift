import APNs
import HeraldCore
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
        Row(
            status: 410, reason: "SomethingElse", timestamp: t0 + 1,
            expected: .failed(reason: .unknown("SomethingElse"))),
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
        Row(
            status: 403, reason: "BadEnvironmentKeyIdInToken",
            expected: .authRejected(reason: .badEnvironmentKeyIDInToken)),
        Row(
            status: 403, reason: "BadEnvironmentKeyInToken", expected: .authRejected(reason: .badEnvironmentKeyInToken)),
        Row(status: 403, reason: "UnrelatedKeyIdInToken", expected: .authRejected(reason: .unrelatedKeyIDInToken)),
        Row(
            status: 403, reason: "BadCertificateEnvironment",
            expected: .authRejected(reason: .badCertificateEnvironment)),
        Row(status: 403, reason: nil, expected: .authRejected(reason: .httpStatus(403))),
        Row(status: 403, reason: "Forbidden", expected: .failed(reason: .forbidden)),
        // Other 4xx.
        Row(status: 404, reason: "BadPath", expected: .failed(reason: .badPath)),
        Row(status: 405, reason: "MethodNotAllowed", expected: .failed(reason: .methodNotAllowed)),
        Row(status: 413, reason: "PayloadTooLarge", expected: .failed(reason: .payloadTooLarge)),
        Row(status: 413, reason: nil, expected: .failed(reason: .payloadTooLarge)),
        Row(status: 418, reason: "NewReason", expected: .failed(reason: .unknown("NewReason"))),
        // Transient, honouring Retry-After.
        Row(
            status: 429, reason: "TooManyRequests", retryAfter: .seconds(30),
            expected: .retry(after: .seconds(30), reason: .tooManyRequests)),
        Row(
            status: 429, reason: "TooManyProviderTokenUpdates",
            expected: .retry(after: nil, reason: .tooManyProviderTokenUpdates)),
        Row(status: 500, reason: "InternalServerError", expected: .retry(after: nil, reason: .internalServerError)),
        Row(
            status: 503, reason: "ServiceUnavailable", retryAfter: .seconds(120),
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

    @Test("reasons keep APNs' exact spelling and are named in apnsReasons")
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
        ]
        for (reason, raw) in pairs {
            #expect(reason.rawValue == raw)
            #expect(ProviderReason.apnsReasons.contains(reason))
            #expect(ProviderReason(raw) == reason)
        }
        #expect(!ProviderReason.apnsReasons.contains(.unknown("BrandNewReason")))
        #expect(!ProviderReason.apnsReasons.contains(ProviderReason("UNREGISTERED")))
    }
}
