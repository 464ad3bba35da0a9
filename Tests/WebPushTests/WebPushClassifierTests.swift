import HeraldCore
import Testing
import WebPush

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
        Row(status: 410, reason: "Unregistered", expected: .stale(reason: ProviderReason("Unregistered"))),
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
