public import HeraldCore
public import HeraldCrypto
public import HeraldNet
public import HeraldTransport
internal import HeraldJSON
import HeraldIO

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

    public init(
        status: Int, httpVersion: String, errorCode: String? = nil, message: String? = nil,
        retryAfter: String? = nil, messageName: String? = nil
    ) {
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
///
/// The requests go through `transport` (an ``OriginTransport``): with an
/// HTTP/2 client (and an `https` base URL) on one lane for the FCM origin
/// (`fcm:<host>:<port>`: long-lived HTTP/2 connections, closed after
/// ``idleTimeout`` without a request), whatever the service account: the
/// access token is a header of each request. An origin that does not offer
/// HTTP/2 is sent through libcurl for the next ``http1Memory``: the
/// transport decides, for every provider alike. The OAuth token exchange
/// always goes through libcurl. Requests carried over HTTP/2 have that
/// client's `requestTimeout`.
public final class FCMSender: Sendable {
    public typealias Completion = @Sendable (Outcome, HTTPStatusInfo?) -> Void

    /// The HTTP/2 lane of the FCM origin closes its connection after this long without a request.
    public static let idleTimeout: Duration = .seconds(120)
    /// How long an origin that refused HTTP/2 is sent through libcurl.
    public static let http1Memory: Duration = OriginTransport.memory

    public let account: FCMServiceAccount
    public let tokens: FCMAccessTokenCache
    public let sendURL: String
    let clock: any WallClock
    private let requestTimeout: Duration
    /// HTTP/2 first, libcurl for an origin that does not offer it.
    let transport: OriginTransport
    /// The origin's text (`https://host[:port]`), as receipts name it.
    public let origin: String
    /// The request path on it.
    let path: String
    /// The FCM origin's HTTP/2 lane, when there is a client and the base URL
    /// is `https`. Taken once: a lane the client forgot while idle comes back
    /// when it is sent on.
    let lane: OriginLane?
    /// The last access token and its `authorization` value.
    private let lastBearer = Locked<(token: String, header: String)?>(nil)

    public init(
        account: FCMServiceAccount,
        baseURL: HTTPURL = HTTPURL(origin: Origin(scheme: .https, host: "fcm.googleapis.com"), target: ""),
        transport: OriginTransport,
        clock: any WallClock = SystemClock(),
        refreshMargin: Duration = .seconds(300),
        requestTimeout: Duration = .seconds(15)
    ) {
        self.account = account
        self.clock = clock
        self.requestTimeout = requestTimeout
        var prefix = baseURL.target
        while prefix.hasSuffix("/") { prefix.removeLast() }
        let origin = baseURL.origin
        let path = prefix + "/v1/projects/" + account.projectID + "/messages:send"
        self.origin = origin.description
        self.path = path
        self.sendURL = origin.description + path
        self.transport = transport
        // The HTTP/2 client speaks TLS only.
        self.lane =
            origin.usesTLS
            ? transport.lane(
                "fcm:\(origin.bracketedHost):\(origin.port)", host: origin.host, port: origin.port,
                idleTimeout: Self.idleTimeout) : nil
        self.tokens = FCMAccessTokenCache(
            account: account, transport: transport, clock: clock, refreshMargin: refreshMargin,
            requestTimeout: requestTimeout)
    }

    /// Sends one message body (``FCMMessage``'s JSON). The completion runs once,
    /// on the caller's thread or on a network thread (libcurl's or the HTTP/2 client's).
    /// A message still unsent at `notAfter` (wall-clock ms: waiting for an
    /// access token or a stream) is not sent: it ends as a `timeout`.
    public func send(body: [UInt8], notAfter: Int64? = nil, completion: @escaping Completion) {
        tokens.token { [self] result in
            switch result {
            case .failure(let error):
                let (outcome, info) = Self.outcome(for: error, now: clock.nowMilliseconds())
                completion(outcome, info)
            case .success(let token):
                post(body: body, token: token, notAfter: notAfter, completion: completion)
            }
        }
    }

    /// The async form of ``send(body:completion:)``.
    public func send(body: [UInt8]) async -> (Outcome, HTTPStatusInfo?) {
        await withCheckedContinuation { (c: CheckedContinuation<(Outcome, HTTPStatusInfo?), Never>) in
            send(body: body) { outcome, info in c.resume(returning: (outcome, info)) }
        }
    }

    /// Whether sends currently go through libcurl because the origin refused HTTP/2.
    public var usesHTTP1: Bool { transport.usesHTTP1(origin) }

    /// Whether an HTTP/2 client carries the sends (else libcurl does).
    public var carriesHTTP2: Bool { lane != nil }

    /// What a `messages:send` request got, whichever client carried it.
    private enum Answer {
        case answered(Outcome, HTTPStatusInfo)
        case unanswered(Outcome)
    }

    private func post(
        body: [UInt8], token: String, notAfter: Int64?, resent: Bool = false, completion: @escaping Completion
    ) {
        let answered: @Sendable (Answer) -> Void = { [self] answer in
            switch answer {
            case .unanswered(let outcome):
                completion(outcome, nil)
            case .answered(let outcome, let info):
                if case .authRejected = outcome {
                    tokens.invalidate(token: token)
                    // A 401 usually means the cached access token was revoked or
                    // expired early: send once more with a fresh one, at once, so
                    // that a TTL-0 push (a call ring) is not lost to it.
                    if info.status == 401 && !resent {
                        tokens.token { [self] fresh in
                            switch fresh {
                            case .success(let t):
                                post(body: body, token: t, notAfter: notAfter, resent: true, completion: completion)
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
        let request = OriginRequest(
            origin: origin, url: sendURL, path: path,
            headers: [("authorization", bearer(token)), ("content-type", "application/json; charset=UTF-8")],
            body: body, notAfter: notAfter, timeout: requestTimeout)
        transport.send(request, lane: { lane }) { [self] result in
            switch result {
            case .success(let response):
                let (outcome, info) = Self.classify(response, now: clock.nowMilliseconds())
                answered(.answered(outcome, info))
            case .failure(let failure):
                answered(.unanswered(failure.outcome))
            }
        }
    }

    /// `Bearer <token>`, made once per access token (over a kilobyte) rather
    /// than once per request.
    private func bearer(_ token: String) -> String {
        if let hit = lastBearer.withLock({ $0?.token == token ? $0?.header : nil }) { return hit }
        let header = "Bearer " + token
        lastBearer.withLock { $0 = (token, header) }
        return header
    }

    // MARK: - Mapping

    /// Classifies one `messages:send` answer, whichever client carried it.
    static func classify(_ response: OriginResponse, now: Int64) -> (Outcome, HTTPStatusInfo) {
        classify(
            status: response.status, httpVersion: response.httpVersion, header: response.header, body: response.body,
            now: now)
    }

    /// Classifies one `messages:send` answer, whichever client carried it.
    static func classify(
        status: Int, httpVersion: String, header: (String) -> String?, body: [UInt8], now: Int64
    ) -> (Outcome, HTTPStatusInfo) {
        let retryHeader = header("retry-after")
        var info = HTTPStatusInfo(status: status, httpVersion: httpVersion, retryAfter: retryHeader)
        let json = body.isEmpty ? nil : try? JSONParser.parse(body)
        var fromDetails = false
        if (200..<300).contains(status) {
            info.messageName = json?["name"]?.stringValue
        } else if let error = json?["error"] {
            let detail = detailErrorCode(error)
            fromDetails = detail != nil
            info.errorCode = detail ?? errorCode(error)
            info.message = error["message"]?.stringValue
        }
        let retryAfter = retryHeader.flatMap { RetryAfter.parse($0, now: now) }
        let outcome = FCMClassifier.classify(
            status: status, errorCode: info.errorCode, fromDetails: fromDetails, retryAfter: retryAfter)
        return (outcome, info)
    }

    /// `errorCode` of the first `FcmError` in `error.details`, else `error.status`.
    static func errorCode(_ error: JSON) -> String? {
        if let code = detailErrorCode(error) { return code }
        if let status = error["status"]?.stringValue, !status.isEmpty { return status }
        return nil
    }

    /// `errorCode` of the first `FcmError` in `error.details`; nil when there is none.
    static func detailErrorCode(_ error: JSON) -> String? {
        for detail in error["details"]?.arrayValue ?? [] {
            if let code = detail["errorCode"]?.stringValue, !code.isEmpty {
                let type = detail["@type"]?.stringValue ?? ""
                if type.isEmpty || type.hasSuffix("google.firebase.fcm.v1.FcmError") { return code }
            }
        }
        return nil
    }

    /// No access token: a token-endpoint 4xx is a credential problem
    /// (`authRejected`), a 429/5xx or a garbled answer a transient one.
    static func outcome(for error: FCMAccessTokenError, now: Int64) -> (Outcome, HTTPStatusInfo?) {
        switch error {
        case .assertion:
            return (.authRejected(reason: .unknown("assertion_failed")), nil)
        case .transport(let failure):
            return (failure.outcome, nil)
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
