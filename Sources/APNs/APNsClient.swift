public import HeraldCore
public import HeraldCrypto
import CHeraldH2
import Foundation
public import HeraldIO
import Synchronization

/// Identifies one APNs lane: the connections that carry one app's pushes for
/// one signing key and environment.
public struct APNsLaneKey: Hashable, Sendable, CustomStringConvertible {
    public let app: String
    public let keyID: String
    public let teamID: String
    public let environment: APNsEnvironment

    public init(app: String, keyID: String, teamID: String, environment: APNsEnvironment) {
        self.app = app
        self.keyID = keyID
        self.teamID = teamID
        self.environment = environment
    }

    public var description: String { "\(app)/\(teamID).\(keyID)/\(environment.rawValue)" }
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

    /// `:authority`: the host (bracketed when IPv6) with the port unless 443.
    var authority: String {
        let name = host.contains(":") ? "[\(host)]" : host
        return port == 443 ? name : "\(name):\(port)"
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
    /// …and is closed when the PING is not answered within this.
    public var pingTimeout: Duration = .seconds(15)
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

    public init(caFile: String? = nil, resolver: @escaping @Sendable (_ host: String, _ port: Int) throws -> [String]) {
        self.caFile = caFile
        self.resolver = resolver
    }
}

/// One push as the wire sees it: the device token, the `apns-*` headers and the body.
public struct APNsPush: Sendable {
    public var deviceToken: String
    public var headers: [(name: String, value: String)]
    public var payload: [UInt8]

    public init(deviceToken: String, headers: [(name: String, value: String)], payload: [UInt8]) {
        self.deviceToken = deviceToken
        self.headers = headers
        self.payload = payload
    }

    public init(deviceToken: String, request: APNsRequest) {
        self.init(deviceToken: deviceToken, headers: request.headers, payload: request.payload)
    }
}

/// APNs' answer to one push.
public struct APNsResponse: Sendable, Hashable {
    public let status: Int
    /// The `apns-id` response header.
    public let apnsID: String?
    /// The body's `reason` (error answers only).
    public let reason: String?
    /// The body's `timestamp`, ms since the epoch (410 only).
    public let timestamp: Int64?
    /// A `Retry-After` header, if the server sent one.
    public let retryAfter: String?
}

/// Why a push got no answer from APNs.
public enum APNsClientError: Error, Sendable, Hashable, CustomStringConvertible {
    /// No answer within the request deadline (or no connection within it).
    case timeout(String)
    case dnsFailure(String)
    case connectFailed(String)
    /// The TLS handshake, the certificate check or ALPN h2 failed.
    case tls(String)
    /// The connection failed or the stream was reset before an answer.
    case connectionReset(String)
    /// The server refused the stream too many times (REFUSED_STREAM).
    case refusedStream
    /// The server sent GOAWAY before processing the push, too many times.
    case goAway(reason: String?)
    /// The client is shutting down.
    case shutdown

    public var description: String {
        switch self {
        case .timeout(let m): "timeout: \(m)"
        case .dnsFailure(let m): "DNS failure: \(m)"
        case .connectFailed(let m): "connect failed: \(m)"
        case .tls(let m): "TLS failure: \(m)"
        case .connectionReset(let m): "connection reset: \(m)"
        case .refusedStream: "stream refused"
        case .goAway(let r): "GOAWAY\(r.map { " (\($0))" } ?? "")"
        case .shutdown: "shutting down"
        }
    }
}

/// Counters of one client, for `system.stats`.
public struct APNsClientStats: Sendable, Hashable {
    public var connectionsOpen = 0
    public var connectionsOpened = 0
    public var connectFailures = 0
    public var goaways = 0
    /// The `reason` of the last GOAWAY that carried one.
    public var lastGoAwayReason: String?
    /// Provider tokens signed (one per lane per ~50 min when all is well).
    public var tokensMinted = 0
    public var pushesSent = 0
    public var requeued = 0
    public var timeouts = 0
    public var pings = 0

    public init() {}
}

/// APNs over HTTP/2 (libnghttp2 + OpenSSL) on one event-loop thread.
///
/// Pushes go through lanes (``APNsLaneKey``); each lane keeps a small pool of
/// long-lived connections (ALPN h2, the certificate checked against the host,
/// the configured CA file) and a queue:
/// - A new connection waits for the server's SETTINGS and never opens more
///   streams than SETTINGS_MAX_CONCURRENT_STREAMS allows. APNs starts token
///   connections at one stream and raises the limit after the first accepted
///   push: the lane sends one, then fans out. Pushes beyond the limit wait in
///   the lane's queue.
/// - Every push has a deadline (15 s, queueing included); a late stream is
///   reset and reported as a timeout.
/// - GOAWAY reasons are recorded; pushes the server left unprocessed
///   (above the GOAWAY's last stream, or REFUSED_STREAM) go back to the
///   queue and are sent on another connection.
/// - Idle connections are kept alive with PING; failed connection attempts
///   back off exponentially.
/// - One provider token per connection: a lane signs a token and reuses it
///   for every connection and push until it is about 50 minutes old; a
///   connection switches to a newer token no more often than every 20
///   minutes, and `ExpiredProviderToken` closes the connection.
///
/// Completions run on the client's thread: they must not block.
public final class APNsClient: Sendable {
    public let settings: APNsClientSettings
    let clock: any WallClock
    let log: Logger?
    let loop: EventLoop
    let tls: TLSContext
    let resolverQueue = DispatchQueue(label: "herald.apns.resolver", attributes: .concurrent)
    private let registry = Mutex<Registry>(Registry())
    let counters = Mutex(APNsClientStats())
    private let finished = DispatchSemaphore(value: 0)

    private struct Registry {
        var lanes: [APNsLaneKey: Lane] = [:]
        var stopping = false
    }

    public init(settings: APNsClientSettings, clock: any WallClock = SystemClock(), log: Logger? = nil)
        throws(APNsClientError)
    {
        self.settings = settings
        self.clock = clock
        self.log = log
        do {
            loop = try EventLoop()
        } catch {
            throw .connectFailed("event loop: \(error)")
        }
        tls = try TLSContext(caFile: settings.caFile)
        let loop = self.loop
        let done = finished
        let thread = Thread {
            loop.run()
            done.signal()
        }
        thread.name = "herald-apns"
        thread.start()
        loop.execute { [weak self, loop] in
            loop.every(milliseconds: 100) { [weak self] in self?.sweep() }
            _ = self
        }
    }

    /// The lane for `key`, created on first use. The endpoint and signer of
    /// an existing lane are kept (a new key or team is a new lane).
    public func lane(_ key: APNsLaneKey, endpoint: APNsEndpoint, signer: APNsSigner) -> APNsLaneHandle {
        APNsLaneHandle(client: self, lane: registry.withLock { r in
            if let lane = r.lanes[key] { return lane }
            let lane = Lane(key: key, endpoint: endpoint, signer: signer, client: self)
            r.lanes[key] = lane
            return lane
        })
    }

    public var stats: APNsClientStats { counters.withLock { $0 } }

    /// Fails what is queued or in flight with ``APNsClientError/shutdown``,
    /// closes every connection and stops the thread. Idempotent; must not be
    /// called from a completion.
    public func shutdown() {
        let lanes: [Lane]? = registry.withLock { r in
            if r.stopping { return nil }
            r.stopping = true
            return Array(r.lanes.values)
        }
        guard let lanes else { return }
        loop.execute { [loop] in
            for lane in lanes { lane.close() }
            loop.stop()
        }
        finished.wait()
    }

    var isStopping: Bool { registry.withLock { $0.stopping } }

    private func sweep() {
        let lanes = registry.withLock { Array($0.lanes.values) }
        let now = monotonicMilliseconds()
        for lane in lanes { lane.sweep(now: now) }
    }

    func count(_ update: (inout APNsClientStats) -> Void) { counters.withLock { update(&$0) } }

    /// Pushes handed over from other threads, taken by the loop in one go: a
    /// fan-out of 500 becomes one wakeup, one pump per lane and a few writes,
    /// not 500 of each.
    private let inbox = Mutex<[(Lane, Pending)]>([])

    func submit(_ pending: Pending, to lane: Lane) {
        let first = inbox.withLock { box -> Bool in
            box.append((lane, pending))
            return box.count == 1
        }
        if first { loop.execute { [self] in drainInbox() } }
    }

    private func drainInbox() {
        let batch = inbox.withLock { box -> [(Lane, Pending)] in
            defer { box.removeAll(keepingCapacity: true) }
            return box
        }
        var lanes: [Lane] = []
        for (lane, pending) in batch {
            lane.enqueue(pending, pump: false)
            if !lanes.contains(where: { $0 === lane }) { lanes.append(lane) }
        }
        for lane in lanes { lane.pump() }
    }
}

/// A lane of an ``APNsClient``: where pushes are sent.
public struct APNsLaneHandle: Sendable {
    let client: APNsClient
    let lane: Lane

    public var key: APNsLaneKey { lane.key }

    /// Sends one push. The completion runs once, on the client's thread.
    public func send(_ push: APNsPush, completion: @escaping @Sendable (Result<APNsResponse, APNsClientError>) -> Void) {
        let deadline = monotonicMilliseconds() + client.settings.requestTimeout.wholeMilliseconds
        let pending = Pending(push: push, deadline: deadline, completion: completion)
        if client.isStopping {
            completion(.failure(.shutdown))
            return
        }
        client.submit(pending, to: lane)
    }

    /// The async form of ``send(_:completion:)``.
    public func send(_ push: APNsPush) async -> Result<APNsResponse, APNsClientError> {
        await withCheckedContinuation { c in send(push) { c.resume(returning: $0) } }
    }
}

/// The OpenSSL client context every connection shares.
final class TLSContext: @unchecked Sendable {
    // Immutable after init; OpenSSL allows concurrent use of an SSL_CTX.
    let handle: OpaquePointer

    init(caFile: String?) throws(APNsClientError) {
        var err = [CChar](repeating: 0, count: 256)
        guard let handle = hh2_tls_new(caFile, &err, err.count) else {
            throw .tls(String(cBuffer: err))
        }
        self.handle = handle
    }

    deinit { hh2_tls_free(handle) }
}
