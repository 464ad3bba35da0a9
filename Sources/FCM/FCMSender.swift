public import HTTPClient
public import HeraldCore
public import HeraldCrypto
public import HeraldDelivery
internal import JSONRPC

/// What the provider said, for logs and `push.status`: present whenever an
/// HTTP answer was received (from the send, or from the token endpoint when the
/// access token could not be obtained).
public struct HTTPStatusInfo: Sendable, Hashable {
    /// The HTTP status.
    public var status: Int
    /// `"1.1"`, `"2"`, …
    public var httpVersion: String
    /// The FCM `errorCode` from `error.details`, else `error.status` (or the
    /// OAuth `error` for a token-endpoint answer).
    public var errorCode: String?
    /// `error.message` (or the OAuth `error_description`).
    public var message: String?
    /// The raw `Retry-After` header.
    public var retryAfter: String?
    /// `name` of a successful send (`projects/{p}/messages/{id}`).
    public var messageName: String?

    public init(status: Int, httpVersion: String, errorCode: String? = nil, message: String? = nil,
                retryAfter: String? = nil, messageName: String? = nil) {
        self.status = status
        self.httpVersion = httpVersion
        self.errorCode = errorCode
        self.message = message
        self.retryAfter = retryAfter
        self.messageName = messageName
    }
}

/// Sends FCM HTTP v1 `messages:send` requests for one service account.
///
/// `POST {baseURL}/v1/projects/{project_id}/messages:send` with
/// `authorization: Bearer <access token>` (from ``FCMAccessTokenCache``) and the
/// body built by ``FCMMessage``. The answer goes through ``FCMClassifier``; an
/// `authRejected` outcome invalidates the access token so the next send fetches
/// a new one, and a 401 is sent once more at once with a fresh token.
/// Transport failures are `Outcome.transient` with Herald's reason.
public final class FCMSender: Sendable {
    public typealias Completion = @Sendable (Outcome, HTTPStatusInfo?) -> Void

    public let account: FCMServiceAccount
    public let tokens: FCMAccessTokenCache
    public let sendURL: String
    private let client: HTTPClient
    private let clock: any WallClock
    private let requestTimeout: Duration

    public init(
        account: FCMServiceAccount,
        baseURL: String = "https://fcm.googleapis.com",
        client: HTTPClient,
        clock: any WallClock = SystemClock(),
        refreshMargin: Duration = .seconds(300),
        requestTimeout: Duration = .seconds(15)
    ) {
        self.account = account
        self.client = client
        self.clock = clock
        self.requestTimeout = requestTimeout
        var base = baseURL
        while base.hasSuffix("/") { base.removeLast() }
        self.sendURL = base + "/v1/projects/" + account.projectID + "/messages:send"
        self.tokens = FCMAccessTokenCache(
            account: account, client: client, clock: clock, refreshMargin: refreshMargin,
            requestTimeout: requestTimeout)
    }

    /// Sends one message body (``FCMMessage``'s JSON). The completion runs once,
    /// on the caller's thread or on the HTTP client's network thread.
    public func send(body: [UInt8], completion: @escaping Completion) {
        tokens.token { [self] result in
            switch result {
            case .failure(let error):
                let (outcome, info) = Self.outcome(for: error, now: clock.nowMilliseconds())
                completion(outcome, info)
            case .success(let token):
                post(body: body, token: token, completion: completion)
            }
        }
    }

    /// The async form of ``send(body:completion:)``.
    public func send(body: [UInt8]) async -> (Outcome, HTTPStatusInfo?) {
        await withCheckedContinuation { (c: CheckedContinuation<(Outcome, HTTPStatusInfo?), Never>) in
            send(body: body) { outcome, info in c.resume(returning: (outcome, info)) }
        }
    }

    private func post(body: [UInt8], token: String, resent: Bool = false, completion: @escaping Completion) {
        let request = HTTPRequest(
            method: "POST", url: sendURL,
            headers: [("authorization", "Bearer " + token), ("content-type", "application/json; charset=UTF-8")],
            body: body, timeout: requestTimeout)
        client.send(request) { [self] result in
            switch result {
            case .failure(let error):
                completion(Self.outcome(for: error), nil)
            case .success(let response):
                let (outcome, info) = Self.classify(response, now: clock.nowMilliseconds())
                if case .authRejected = outcome {
                    tokens.invalidate(token: token)
                    // A 401 usually means the cached access token was revoked or
                    // expired early: send once more with a fresh one, at once, so
                    // that a TTL-0 push (a call ring) is not lost to it.
                    if response.status == 401 && !resent {
                        tokens.token { [self] fresh in
                            switch fresh {
                            case .success(let t): post(body: body, token: t, resent: true, completion: completion)
                            case .failure(let error):
                                let (o, i) = Self.outcome(for: error, now: clock.nowMilliseconds())
                                completion(o, i)
                            }
                        }
                        return
                    }
                }
                completion(outcome, info)
            }
        }
    }

    // MARK: - Mapping

    /// Classifies one `messages:send` answer.
    static func classify(_ response: HTTPResponse, now: Int64) -> (Outcome, HTTPStatusInfo) {
        let retryHeader = response.header("retry-after")
        var info = HTTPStatusInfo(status: response.status, httpVersion: response.httpVersion, retryAfter: retryHeader)
        let json = response.body.isEmpty ? nil : try? JSONParser.parse(response.body)
        if (200..<300).contains(response.status) {
            info.messageName = json?["name"]?.stringValue
        } else if let error = json?["error"] {
            info.errorCode = errorCode(error)
            info.message = error["message"]?.stringValue
        }
        let retryAfter = retryHeader.flatMap { RetryAfter.parse($0, now: now) }
        let outcome = FCMClassifier.classify(status: response.status, errorCode: info.errorCode, retryAfter: retryAfter)
        return (outcome, info)
    }

    /// `errorCode` of the first `FcmError` in `error.details`, else `error.status`.
    static func errorCode(_ error: JSON) -> String? {
        for detail in error["details"]?.arrayValue ?? [] {
            if let code = detail["errorCode"]?.stringValue, !code.isEmpty {
                let type = detail["@type"]?.stringValue ?? ""
                if type.isEmpty || type.hasSuffix("google.firebase.fcm.v1.FcmError") { return code }
            }
        }
        if let status = error["status"]?.stringValue, !status.isEmpty { return status }
        return nil
    }

    /// A transport failure: always worth a retry, with Herald's reason.
    public static func outcome(for error: HTTPError) -> Outcome {
        switch error {
        case .timeout: return .transient(reason: .timeout)
        case .connectFailed: return .transient(reason: .connectFailure)
        case .dnsFailure: return .transient(reason: .dnsFailure)
        case .tls: return .transient(reason: .tlsFailure)
        case .http2Stream(let message):
            let upper = message.uppercased()
            if upper.contains("REFUSED") { return .transient(reason: .refusedStream) }
            if upper.contains("GOAWAY") { return .transient(reason: .goAway) }
            return .transient(reason: .connectionReset)
        case .bodyTooLarge: return .transient(reason: .unknown("response_too_large"))
        case .invalidRequest: return .failed(reason: .unknown("invalid_request"))
        case .shutdown: return .transient(reason: .shutdown)
        case .other: return .transient(reason: .connectionReset)
        }
    }

    /// No access token: a token-endpoint 4xx is a credential problem
    /// (`authRejected`), a 429/5xx or a garbled answer a transient one.
    static func outcome(for error: FCMAccessTokenError, now: Int64) -> (Outcome, HTTPStatusInfo?) {
        switch error {
        case .assertion:
            return (.authRejected(reason: .unknown("assertion_failed")), nil)
        case .transport(let e):
            return (outcome(for: e), nil)
        case .status(let status, let code, let retryHeader):
            let info = HTTPStatusInfo(status: status, httpVersion: "", errorCode: code, retryAfter: retryHeader)
            let reason = code.map { ProviderReason($0) } ?? .httpStatus(status)
            if status == 408 || status == 429 || (500..<600).contains(status) {
                return (.retry(after: retryHeader.flatMap { RetryAfter.parse($0, now: now) }, reason: reason), info)
            }
            return (.authRejected(reason: reason), info)
        case .badResponse:
            return (.transient(reason: .unknown("token_bad_response")), nil)
        }
    }
}
