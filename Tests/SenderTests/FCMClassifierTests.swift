import FCM
import HeraldCore
import Testing

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
        Row(
            status: 429, code: "QUOTA_EXCEEDED", retryAfter: .seconds(60),
            expected: .retry(after: .seconds(60), reason: .fcmQuotaExceeded)),
        Row(status: 429, code: nil, expected: .retry(after: nil, reason: .httpStatus(429))),
        Row(
            status: 503, code: "UNAVAILABLE", retryAfter: .seconds(10),
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

    @Test("error codes keep FCM's exact spelling and are named in fcmErrorCodes")
    func spelling() {
        let pairs: [(ProviderReason, String)] = [
            (.fcmUnregistered, "UNREGISTERED"), (.fcmInvalidArgument, "INVALID_ARGUMENT"),
            (.fcmSenderIDMismatch, "SENDER_ID_MISMATCH"), (.fcmQuotaExceeded, "QUOTA_EXCEEDED"),
            (.fcmUnavailable, "UNAVAILABLE"), (.fcmInternal, "INTERNAL"),
            (.fcmThirdPartyAuthError, "THIRD_PARTY_AUTH_ERROR"), (.fcmUnspecifiedError, "UNSPECIFIED_ERROR"),
        ]
        for (reason, raw) in pairs {
            #expect(reason.rawValue == raw)
            #expect(ProviderReason.fcmErrorCodes.contains(reason))
            #expect(ProviderReason(raw) == reason)
        }
        #expect(!ProviderReason.fcmErrorCodes.contains(.unknown("NOT_FOUND")))
    }
}
