public import HeraldCore
public import HeraldCrypto
internal import HeraldJSON
import HeraldIO
public import HeraldTransport

/// Why an OAuth2 access token could not be obtained.
public enum FCMAccessTokenError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The JWT-bearer assertion could not be signed.
    case assertion(CryptoError)
    /// The token request got no HTTP answer.
    case transport(OriginFailure)
    /// The token endpoint answered with a status other than 200. `error` is the
    /// OAuth `error` member (`invalid_grant`, …) when the body had one.
    case status(Int, error: String?, retryAfter: String?)
    /// A 200 answer whose body is not `{"access_token": "…", "expires_in": n, …}`.
    case badResponse(String)

    public var description: String {
        switch self {
        case .assertion(let e): "FCM assertion: \(e)"
        case .transport(let e): "FCM token request: \(e)"
        case .status(let s, let error, _): "FCM token endpoint answered \(s)\(error.map { " (\($0))" } ?? "")"
        case .badResponse(let why): "FCM token endpoint: bad response: \(why)"
        }
    }
}

/// One OAuth2 access token for one service account, shared by every send.
///
/// - A cached token is used while it stays valid for more than `refreshMargin`
///   (5 minutes by default) by the injected clock.
/// - Otherwise ONE token exchange runs (single flight): every caller that asks
///   while it is in flight waits for it and gets its result, token or error.
/// - ``invalidate()`` (or ``invalidate(token:)``) after an auth rejection, so the
///   next call exchanges again.
///
/// Completions run either on the caller's thread (cache hit) or on the
/// transport's libcurl thread: they must not block.
public final class FCMAccessTokenCache: Sendable {
    public typealias Completion = @Sendable (Result<String, FCMAccessTokenError>) -> Void

    /// The OAuth scope the assertion asks for: sending through FCM HTTP v1.
    public static let scope = "https://www.googleapis.com/auth/firebase.messaging"

    public let account: FCMServiceAccount
    private let transport: OriginTransport
    private let clock: any WallClock
    private let refreshMarginMs: Int64
    private let assertionLifetime: Int64
    private let requestTimeout: Duration

    private struct State {
        var token: String?
        /// Milliseconds since the epoch at which the token stops being valid.
        var expiresAt: Int64 = 0
        var inFlight = false
        var waiters: [Completion] = []
        var exchanges = 0
    }

    private let state = Locked(State())

    public init(
        account: FCMServiceAccount,
        transport: OriginTransport,
        clock: any WallClock = SystemClock(),
        refreshMargin: Duration = .seconds(300),
        assertionLifetime: Int64 = 3600,
        requestTimeout: Duration = .seconds(15)
    ) {
        self.account = account
        self.transport = transport
        self.clock = clock
        self.refreshMarginMs = refreshMargin.wholeMilliseconds
        self.assertionLifetime = assertionLifetime
        self.requestTimeout = requestTimeout
    }

    /// How many token exchanges this cache has started.
    public var exchangeCount: Int { state.withLock { $0.exchanges } }

    /// The cached token if it is still usable, without starting an exchange.
    public var cachedToken: String? {
        let now = clock.nowMilliseconds()
        return state.withLock { s in
            guard let t = s.token, s.expiresAt - refreshMarginMs > now else { return nil }
            return t
        }
    }

    /// A usable access token: the cached one, or the result of the (single) exchange.
    public func token(completion: @escaping Completion) {
        let now = clock.nowMilliseconds()
        enum Action {
            case hit(String)
            case wait, start
        }
        let action: Action = state.withLock { s in
            if let t = s.token, s.expiresAt - refreshMarginMs > now { return .hit(t) }
            s.waiters.append(completion)
            if s.inFlight { return .wait }
            s.inFlight = true
            s.exchanges += 1
            return .start
        }
        switch action {
        case .hit(let t): completion(.success(t))
        case .wait: break
        case .start: exchange(now: now)
        }
    }

    /// The async form of ``token(completion:)``.
    public func token() async throws(FCMAccessTokenError) -> String {
        let result = await withCheckedContinuation {
            (c: CheckedContinuation<Result<String, FCMAccessTokenError>, Never>) in
            token { c.resume(returning: $0) }
        }
        return try result.get()
    }

    /// Forgets the cached token: the next ``token(completion:)`` exchanges again.
    public func invalidate() {
        state.withLock { s in
            s.token = nil
            s.expiresAt = 0
        }
    }

    /// Forgets the cached token only if it is still `token` (a rejection of an
    /// older token must not throw away a newer one).
    public func invalidate(token: String) {
        state.withLock { s in
            if s.token == token {
                s.token = nil
                s.expiresAt = 0
            }
        }
    }

    // MARK: - Exchange

    private func exchange(now: Int64) {
        request(now: now) { [self] result in
            switch result {
            case .failure(let e): finish(.failure(e), expiresAt: 0)
            case .success(let (token, expiresAt)): finish(.success(token), expiresAt: expiresAt)
            }
        }
    }

    /// Exchanges the assertion now, outside the single flight and apart from
    /// the cache (a credential check: a revoked key is found at the token
    /// endpoint while an access token it issued still works). Its token is
    /// the caller's alone: the sends' cached token, and what they see of the
    /// endpoint, stay as they were. Not counted in ``exchangeCount``.
    public func exchangeAfresh(completion: @escaping Completion) {
        request(now: clock.nowMilliseconds()) { result in completion(result.map(\.0)) }
    }

    /// One token request: the token and when it stops being valid (ms since the epoch).
    private func request(
        now: Int64, completion: @escaping @Sendable (Result<(String, Int64), FCMAccessTokenError>) -> Void
    ) {
        let assertion: String
        do {
            assertion = try account.assertion(
                scope: Self.scope, issuedAt: now / 1000, lifetime: assertionLifetime)
        } catch {
            completion(.failure(.assertion(error)))
            return
        }
        let body =
            "grant_type=" + Self.formEncode("urn:ietf:params:oauth:grant-type:jwt-bearer")
            + "&assertion=" + Self.formEncode(assertion)
        let request = OriginRequest(
            origin: account.tokenURI, url: account.tokenURI, path: "",
            headers: [("content-type", "application/x-www-form-urlencoded"), ("accept", "application/json")],
            body: Array(body.utf8), notAfter: nil, timeout: requestTimeout)
        transport.sendHTTP1(request) { result in
            switch result {
            case .failure(let e):
                completion(.failure(.transport(e)))
            case .success(let response):
                // Measured from when the exchange started: errs on the early side.
                completion(Self.parse(response).map { token, expiresIn in (token, now + expiresIn * 1000) })
            }
        }
    }

    private func finish(_ result: Result<String, FCMAccessTokenError>, expiresAt: Int64) {
        let waiters: [Completion] = state.withLock { s in
            if case .success(let t) = result {
                s.token = t
                s.expiresAt = expiresAt
            }
            s.inFlight = false
            let w = s.waiters
            s.waiters = []
            return w
        }
        for w in waiters { w(result) }
    }

    static func parse(_ response: OriginResponse) -> Result<(String, Int64), FCMAccessTokenError> {
        let json = try? JSONParser.parse(response.body)
        guard response.status == 200 else {
            return .failure(
                .status(
                    response.status, error: json?["error"]?.stringValue,
                    retryAfter: response.header("retry-after")))
        }
        guard let json else { return .failure(.badResponse("body is not JSON")) }
        guard let token = json["access_token"]?.stringValue, !token.isEmpty else {
            return .failure(.badResponse("no access_token"))
        }
        let expiresIn: Int64
        switch json["expires_in"] {
        case nil, .null?: expiresIn = 3600
        case .number(let n)?:
            guard let v = n.int64 ?? (n.double.isFinite ? Int64(exactly: n.double.rounded(.down)) : nil), v > 0 else {
                return .failure(.badResponse("bad expires_in"))
            }
            expiresIn = v
        case .string(let s)?:
            guard let v = Int64(s), v > 0 else { return .failure(.badResponse("bad expires_in")) }
            expiresIn = v
        default:
            return .failure(.badResponse("bad expires_in"))
        }
        return .success((token, expiresIn))
    }

    /// application/x-www-form-urlencoded: everything but unreserved characters is %-escaped.
    static func formEncode(_ text: String) -> String {
        var out = ""
        let hex = Array("0123456789ABCDEF")
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"),
                UInt8(ascii: "~"):
                out.unicodeScalars.append(Unicode.Scalar(byte))
            default:
                out.append("%")
                out.append(hex[Int(byte >> 4)])
                out.append(hex[Int(byte & 0x0F)])
            }
        }
        return out
    }
}
