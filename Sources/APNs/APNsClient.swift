public import HTTP2
public import HeraldCore
public import HeraldCrypto
public import HeraldIO
import HeraldJSON

/// Identifies one APNs lane: the connections that carry one app's pushes for
/// one signing key and environment.
public struct APNsLaneKey: Hashable, Sendable, CustomStringConvertible {
    public let app: String
    public let keyID: String
    public let teamID: String
    public let environment: APNsEnvironment
    /// Tells signing keys apart when a key is replaced under the same key ID
    /// (a few bytes of its public key), so that a reload with a new key gets
    /// a new lane and new provider tokens; empty when not needed.
    public let keyTag: String

    public init(app: String, keyID: String, teamID: String, environment: APNsEnvironment, keyTag: String = "") {
        self.app = app
        self.keyID = keyID
        self.teamID = teamID
        self.environment = environment
        self.keyTag = keyTag
    }

    public var description: String {
        "\(app)/\(teamID).\(keyID)\(keyTag.isEmpty ? "" : "~" + keyTag)/\(environment.rawValue)"
    }
}

/// Where a lane connects: `https://host:port` plus an optional path prefix.
public struct APNsEndpoint: Hashable, Sendable {
    /// A DNS name or an IP literal (no brackets): the certificate must match it.
    public let host: String
    public let port: Int
    /// Put before `/3/device/…` (no trailing slash); empty for APNs itself.
    public let pathPrefix: String

    public init(host: String, port: Int = 443, pathPrefix: String = "") {
        self.host = host
        self.port = port
        self.pathPrefix = pathPrefix
    }
}

/// The key that signs a lane's provider tokens (ES256 JWTs with `kid`, `iss`, `iat`).
public struct APNsSigner: Sendable {
    public let key: P256PrivateKey
    public let keyID: String
    public let teamID: String

    public init(key: P256PrivateKey, keyID: String, teamID: String) {
        self.key = key
        self.keyID = keyID
        self.teamID = teamID
    }
}

/// How lanes behave. The defaults follow Apple's guidance (apns-fcm.md §1.6, §5).
public struct APNsClientSettings: Sendable {
    /// Extra CA bundle trusted next to the system store (`[endpoints] ca_file`).
    public var caFile: String?
    /// Connections a lane may open. A second one opens only when every open
    /// connection is warmed up (past the first answer) and full.
    public var maxConnectionsPerLane = 2
    /// From handing a push to the client until its answer, queueing included.
    public var requestTimeout: Duration = .seconds(15)
    /// From starting a connection until the server's first SETTINGS.
    public var connectTimeout: Duration = .seconds(10)
    /// A connection that received nothing for this long is sent a PING…
    public var pingInterval: Duration = .seconds(60)
    /// …and is closed when the PING is not answered within this. A push that
    /// times out on a connection sends one at once, and the connection takes
    /// no new pushes until it is answered (``HTTP2ClientSettings/pingTimeout``).
    public var pingTimeout: Duration = .seconds(5)
    /// A provider token is replaced once it is this old…
    public var tokenRefresh: Duration = .seconds(50 * 60)
    /// …but a connection never switches tokens more often than this.
    public var tokenMinimumInterval: Duration = .seconds(20 * 60)
    /// First and largest delay between failed connection attempts of a lane.
    public var reconnectBase: Duration = .milliseconds(200)
    public var reconnectMax: Duration = .seconds(30)
    /// Times a push is put back in the queue after the server left it
    /// unprocessed (REFUSED_STREAM, or above a GOAWAY's last stream).
    public var maxRequeues = 3
    /// Resolves a host name to numeric addresses. It may block: the client
    /// calls it off its event loop. IP literals are never resolved.
    public var resolver: @Sendable (_ host: String, _ port: Int) throws -> [String]
    /// Resolves a host name without blocking; used instead of `resolver` when set.
    public var lookup: HTTP2Lookup?

    public init(caFile: String? = nil, resolver: @escaping @Sendable (_ host: String, _ port: Int) throws -> [String]) {
        self.caFile = caFile
        self.resolver = resolver
    }

    var http2: HTTP2ClientSettings {
        var s = HTTP2ClientSettings(caFile: caFile, resolver: resolver)
        s.lookup = lookup
        s.maxConnectionsPerLane = maxConnectionsPerLane
        s.requestTimeout = requestTimeout
        s.connectTimeout = connectTimeout
        s.pingInterval = pingInterval
        s.pingTimeout = pingTimeout
        s.reconnectBase = reconnectBase
        s.reconnectMax = reconnectMax
        s.maxRequeues = maxRequeues
        return s
    }
}

/// One push as the wire sees it: the device token, the `apns-*` headers and the body.
public struct APNsPush: Sendable {
    public var deviceToken: String
    public var headers: [(name: String, value: String)]
    public var payload: [UInt8]
    /// Wall-clock ms after which the push is no longer started (see ``HTTP2Request/notAfter``).
    public var notAfter: Int64?

    public init(
        deviceToken: String, headers: [(name: String, value: String)], payload: [UInt8], notAfter: Int64? = nil
    ) {
        self.deviceToken = deviceToken
        self.headers = headers
        self.payload = payload
        self.notAfter = notAfter
    }

    public init(deviceToken: String, request: APNsRequest, notAfter: Int64? = nil) {
        self.init(deviceToken: deviceToken, headers: request.headers, payload: request.payload, notAfter: notAfter)
    }
}

/// APNs' answer to one push.
public struct APNsResponse: Sendable, Hashable {
    public let status: Int
    /// The `apns-id` response header.
    public let apnsID: String?
    /// The `apns-unique-id` response header (APNs' development environment).
    public let uniqueID: String?
    /// The body's `reason` (error answers only).
    public let reason: String?
    /// The body's `timestamp`, ms since the epoch (410 only).
    public let timestamp: Int64?
    /// A `Retry-After` header, if the server sent one.
    public let retryAfter: String?
}

/// Why a push got no answer from APNs.
public typealias APNsClientError = HTTP2ClientError

/// Counters of one client, for `system.stats`.
public typealias APNsClientStats = HTTP2ClientStats

/// APNs over HTTP/2 (``HTTP2Client``: libnghttp2 + OpenSSL) on one event-loop
/// thread.
///
/// A lane is (app, key id, team id, environment), with up to two long-lived
/// connections; see ``HTTP2Client`` for streams, deadlines, GOAWAY, PING and
/// reconnects. APNs specifics:
/// - One provider token (ES256 JWT with `kid`, `iss`, `iat`) per connection:
///   a lane signs a token and reuses it for every connection and push until
///   it is about 50 minutes old; a connection switches to a newer one no more
///   often than every 20 minutes.
/// - `ExpiredProviderToken` retires the connection (APNs wedges it) and signs
///   a new token; `UnrelatedKeyIdInToken` retires the connection.
/// - The body's `reason` and `timestamp` are read from error answers.
///
/// Completions run on the client's thread: they must not block.
public final class APNsClient: Sendable {
    public let settings: APNsClientSettings
    let http2: HTTP2Client

    public init(
        settings: APNsClientSettings, clock: any WallClock = SystemClock(), log: Logger? = nil
    )
        throws(APNsClientError)
    {
        self.settings = settings
        http2 = try HTTP2Client(settings: settings.http2, clock: clock, log: log, threadName: "herald-apns")
    }

    /// The lane for `key`, created on first use. The endpoint and signer of
    /// an existing lane are kept (a new key or team is a new lane).
    public func lane(_ key: APNsLaneKey, endpoint: APNsEndpoint, signer: APNsSigner) -> APNsLaneHandle {
        let tokens = HTTP2BearerTokens(refresh: settings.tokenRefresh, minimumInterval: settings.tokenMinimumInterval) {
            issuedAt in
            try APNsProviderToken.make(key: signer.key, keyID: signer.keyID, teamID: signer.teamID, issuedAt: issuedAt)
        }
        let options = HTTP2LaneOptions(
            tokens: tokens,
            judge: { answer in
                guard answer.status == 403 else { return .keep }
                switch APNsAnswer.reason(answer.body) {
                case "ExpiredProviderToken": return .retireAndRenewToken
                case "UnrelatedKeyIdInToken": return .retire
                default: return .keep
                }
            },
            goAwayReason: APNsAnswer.reason)
        let lane = http2.lane(
            HTTP2LaneKey("apns:\(key)"), endpoint: HTTP2Endpoint(host: endpoint.host, port: endpoint.port),
            options: options)
        return APNsLaneHandle(lane: lane, pathPrefix: endpoint.pathPrefix)
    }

    public var stats: APNsClientStats { http2.stats }

    /// Fails what is queued or in flight with `.shutdown`, closes every
    /// connection and stops the thread. Idempotent; must not be called from
    /// a completion.
    public func shutdown() { http2.shutdown() }
}

/// A lane of an ``APNsClient``: where pushes are sent.
public struct APNsLaneHandle: Sendable {
    let lane: HTTP2LaneHandle
    let pathPrefix: String

    /// Sends one push (`POST /3/device/<token>`). The completion runs once, on
    /// the client's thread.
    public func send(_ push: APNsPush, completion: @escaping @Sendable (Result<APNsResponse, APNsClientError>) -> Void)
    {
        let request = HTTP2Request(
            path: pathPrefix + "/3/device/" + push.deviceToken, headers: push.headers, body: push.payload,
            notAfter: push.notAfter)
        lane.send(request) { result in completion(result.map(APNsAnswer.response)) }
    }

    /// Sends any request on the lane (`method` and `path` below the
    /// endpoint's prefix), with the lane's provider token: the channel
    /// management API and broadcasts. The completion runs once, on the
    /// client's thread, with the whole answer.
    public func request(
        method: String, path: String, headers: [(name: String, value: String)] = [], body: [UInt8] = [],
        notAfter: Int64? = nil, completion: @escaping @Sendable (Result<HTTP2Response, APNsClientError>) -> Void
    ) {
        lane.send(
            HTTP2Request(method: method, path: pathPrefix + path, headers: headers, body: body, notAfter: notAfter),
            completion: completion)
    }

    /// The async form of ``send(_:completion:)``.
    public func send(_ push: APNsPush) async -> Result<APNsResponse, APNsClientError> {
        await withCheckedContinuation { c in send(push) { c.resume(returning: $0) } }
    }
}

/// Reading APNs' answers.
enum APNsAnswer {
    /// The `{"reason": …}` of a response body, or of a GOAWAY frame's opaque data.
    static func reason(_ body: [UInt8]) -> String? {
        body.isEmpty ? nil : (try? JSONParser.parse(body))?["reason"]?.stringValue
    }

    static func response(_ r: HTTP2Response) -> APNsResponse {
        let json = r.body.isEmpty ? nil : try? JSONParser.parse(r.body)
        let timestamp = json?["timestamp"].flatMap { j -> Int64? in
            if case .number(let n) = j { return n.int64 ?? Int64(exactly: n.double.rounded(.down)) }
            return nil
        }
        return APNsResponse(
            status: r.status, apnsID: r.header("apns-id"), uniqueID: r.header("apns-unique-id"),
            reason: json?["reason"]?.stringValue,
            timestamp: timestamp, retryAfter: r.status >= 300 ? r.header("retry-after") : nil)
    }
}
