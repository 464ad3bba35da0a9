public import HeraldCore
public import HeraldIO
import CHeraldH2
import CHeraldSys
import Foundation

/// Names one lane: the connections that carry requests to one endpoint with
/// one credential. The client keeps one lane per key.
public struct HTTP2LaneKey: Hashable, Sendable, CustomStringConvertible {
    public let name: String

    public init(_ name: String) { self.name = name }

    public var description: String { name }
}

/// Where a lane connects.
public struct HTTP2Endpoint: Hashable, Sendable {
    /// A DNS name or an IP literal (no brackets): the certificate must match
    /// it, and it is the SNI and `:authority`.
    public let host: String
    public let port: Int
    /// Numeric addresses to connect to instead of resolving `host` (an
    /// address that was vetted: IP pinning). Tried in order.
    public let addresses: [String]?

    /// `:authority`: the host (bracketed when IPv6) with the port unless
    /// 443. Made once: every request of the lane sends it.
    let authority: String

    public init(host: String, port: Int = 443, addresses: [String]? = nil) {
        self.host = host
        self.port = port
        self.addresses = addresses
        let name = host.utf8.contains(UInt8(ascii: ":")) ? "[\(host)]" : host
        self.authority = port == 443 ? name : "\(name):\(port)"
    }
}

/// A bearer token a lane signs and reuses, sent as `authorization: bearer …`
/// on every request of a connection (APNs provider tokens).
public struct HTTP2BearerTokens: Sendable {
    /// Signs a token whose `iat` is `issuedAt` (Unix seconds).
    public let mint: @Sendable (_ issuedAt: Int64) throws -> String
    /// A token is replaced once it is this old…
    public var refresh: Duration
    /// …but a connection switches tokens no more often than this.
    public var minimumInterval: Duration

    public init(
        refresh: Duration = .seconds(50 * 60), minimumInterval: Duration = .seconds(20 * 60),
        mint: @escaping @Sendable (_ issuedAt: Int64) throws -> String
    ) {
        self.mint = mint
        self.refresh = refresh
        self.minimumInterval = minimumInterval
    }
}

/// What an answer says about the connection that carried it.
public enum HTTP2Verdict: Sendable {
    /// Carry on.
    case keep
    /// The server will not take more on this connection (APNs wedges a
    /// connection whose token it rejected): finish its streams and close it.
    case retire
    /// Retire it, and sign the lane's token anew unless it is younger than
    /// the tokens' minimum interval.
    case retireAndRenewToken
}

/// How one lane behaves beyond the client's settings.
public struct HTTP2LaneOptions: Sendable {
    public var tokens: HTTP2BearerTokens?
    /// Looks at every answer; nil keeps every connection.
    public var judge: (@Sendable (HTTP2Response) -> HTTP2Verdict)?
    /// A connection that carried no request for this long is closed; nil
    /// keeps it open (with PINGs) for as long as the server allows. Lanes to
    /// many servers (Web Push origins) set it so idle ones cost nothing.
    public var idleTimeout: Duration?
    /// Reads the server's reason from a GOAWAY frame's opaque data, for the
    /// log, ``HTTP2ClientError/goAway(reason:)`` and
    /// ``HTTP2ClientStats/lastGoAwayReason``; nil records none. The data's
    /// shape is the provider's (APNs puts `{"reason": …}` there).
    public var goAwayReason: (@Sendable ([UInt8]) -> String?)?

    public init(
        tokens: HTTP2BearerTokens? = nil, idleTimeout: Duration? = nil,
        judge: (@Sendable (HTTP2Response) -> HTTP2Verdict)? = nil,
        goAwayReason: (@Sendable ([UInt8]) -> String?)? = nil
    ) {
        self.tokens = tokens
        self.idleTimeout = idleTimeout
        self.judge = judge
        self.goAwayReason = goAwayReason
    }
}

/// How lanes behave. The defaults follow Apple's guidance for APNs
/// (apns-fcm.md §1.6, §5) and suit any HTTP/2 push service.
public struct HTTP2ClientSettings: Sendable {
    /// Extra CA bundle trusted next to the system store (`[endpoints] ca_file`).
    public var caFile: String?
    /// Connections a lane may open. A second one opens only when every open
    /// connection is warmed up (past the first answer) and full.
    public var maxConnectionsPerLane = 2
    /// From handing a request to the client until its answer, queueing included.
    public var requestTimeout: Duration = .seconds(15)
    /// From starting a connection until the server's first SETTINGS.
    public var connectTimeout: Duration = .seconds(10)
    /// A connection that received nothing for this long is sent a PING…
    public var pingInterval: Duration = .seconds(60)
    /// …and is closed when the PING is not answered within this. A request
    /// that times out on a connection also sends one at once: until it is
    /// answered the connection takes no new requests, and when it is not
    /// answered within this (or the flow-control window that held the
    /// request back stays shut) the connection is closed and its unanswered
    /// requests go out on another (`[delivery] ping_timeout`).
    public var pingTimeout: Duration = .seconds(5)
    /// First and largest delay between failed connection attempts of a lane.
    public var reconnectBase: Duration = .milliseconds(200)
    public var reconnectMax: Duration = .seconds(30)
    /// Times a request is put back in the queue after the server left it
    /// unprocessed (REFUSED_STREAM, or above a GOAWAY's last stream).
    public var maxRequeues = 3
    /// Lanes the client keeps (each an origin or a credential, with its
    /// connections). Past it the least recently used lanes holding no
    /// request are forgotten and their connections closed, so that
    /// subscriptions on ever new Web Push origins cannot pile up state and
    /// sockets. Lanes busy with requests are kept: those are bounded by the
    /// scheduler's `max_inflight`.
    public var maxLanes = 4096
    /// Response bodies are kept up to this size (the C layer's cap).
    public static let maxResponseBody = Int(HH2_MAX_RESPONSE_BODY)
    /// Resolves a host name to numeric addresses. It may block: the client
    /// calls it off its event loop. IP literals and pinned endpoints are
    /// never resolved.
    public var resolver: @Sendable (_ host: String, _ port: Int) throws -> [String]
    /// Resolves a host name without blocking; used instead of `resolver`
    /// when set, so that no thread waits on a name server.
    public var lookup: HTTP2Lookup?

    public init(caFile: String? = nil, resolver: @escaping @Sendable (_ host: String, _ port: Int) throws -> [String]) {
        self.caFile = caFile
        self.resolver = resolver
    }
}

/// Starts resolving `host` to numeric addresses and calls `completion` once
/// with them, on any thread (from the call itself when the answer is known).
public typealias HTTP2Lookup =
    @Sendable (
        _ host: String, _ port: Int, _ completion: @escaping @Sendable (Result<[String], any Error>) -> Void
    ) -> Void

/// One request: `POST` (or another method) of `body` to `path`.
public struct HTTP2Request: Sendable {
    public var method: String
    public var path: String
    /// Regular header fields, lower case; the client adds the pseudo-headers
    /// (and `authorization` when the lane has tokens).
    public var headers: [(name: String, value: String)]
    public var body: [UInt8]
    /// Wall-clock ms after which the request is no longer started: one still
    /// waiting for a stream then (a connection warming up, a full pool, a
    /// retry from a silent connection) fails as a timeout, unsent. A push's
    /// TTL ends here: it is never sent after `accepted_at + ttl + 2 s`.
    public var notAfter: Int64?

    public init(
        method: String = "POST", path: String, headers: [(name: String, value: String)], body: [UInt8],
        notAfter: Int64? = nil
    ) {
        self.method = method
        self.path = path
        self.headers = headers
        self.body = body
        self.notAfter = notAfter
    }
}

/// A server's answer.
public struct HTTP2Response: Sendable {
    public let status: Int
    /// The regular header fields as "name: value\n" lines.
    public let headerBlock: String
    /// The body, up to ``HTTP2ClientSettings/maxResponseBody``.
    public let body: [UInt8]

    public init(status: Int, headerBlock: String, body: [UInt8]) {
        self.status = status
        self.headerBlock = headerBlock
        self.body = body
    }

    /// The first value of header `name` (lower case).
    public func header(_ name: String) -> String? {
        var utf8 = Substring(headerBlock).utf8[...]
        let wanted = Array(name.utf8) + [UInt8(ascii: ":")]
        while !utf8.isEmpty {
            let end = utf8.firstIndex(of: 10) ?? utf8.endIndex
            let line = utf8[utf8.startIndex..<end]
            if line.starts(with: wanted) {
                var value = line.dropFirst(wanted.count)
                while value.first == 32 { value = value.dropFirst() }
                return String(Substring(value))
            }
            utf8 = end == utf8.endIndex ? utf8[end...] : utf8[utf8.index(after: end)...]
        }
        return nil
    }
}

/// Why a request got no answer.
public enum HTTP2ClientError: Error, Sendable, Hashable, CustomStringConvertible {
    /// No answer within the request deadline (or no connection within it).
    case timeout(String)
    case dnsFailure(String)
    case connectFailed(String)
    /// The TLS handshake or the certificate check failed.
    case tls(String)
    /// The server does not speak HTTP/2 (ALPN chose no `h2`).
    case noHTTP2(String)
    /// The connection failed or the stream was reset before an answer.
    case connectionReset(String)
    /// The server refused the stream too many times (REFUSED_STREAM).
    case refusedStream
    /// The server sent GOAWAY before processing the request, too many times.
    case goAway(reason: String?)
    /// The client is shutting down.
    case shutdown

    public var description: String {
        switch self {
        case .timeout(let m): "timeout: \(m)"
        case .dnsFailure(let m): "DNS failure: \(m)"
        case .connectFailed(let m): "connect failed: \(m)"
        case .tls(let m): "TLS failure: \(m)"
        case .noHTTP2(let m): "no HTTP/2: \(m)"
        case .connectionReset(let m): "connection reset: \(m)"
        case .refusedStream: "stream refused"
        case .goAway(let r): "GOAWAY\(r.map { " (\($0))" } ?? "")"
        case .shutdown: "shutting down"
        }
    }
}

/// Counters of one client, for `system.stats`.
public struct HTTP2ClientStats: Sendable, Hashable {
    public var connectionsOpen = 0
    public var connectionsOpened = 0
    public var connectFailures = 0
    public var goaways = 0
    /// The `reason` of the last GOAWAY whose debug data carried one (`{"reason": …}`).
    public var lastGoAwayReason: String?
    /// Bearer tokens signed (one per lane per ~50 min when all is well).
    public var tokensMinted = 0
    public var requestsSent = 0
    public var requeued = 0
    public var timeouts = 0
    public var pings = 0
    /// Connections closed because they went silent: a PING (after a request
    /// timed out, or after a long quiet) not answered within the ping timeout.
    public var silentConnectionsClosed = 0
    /// Connections now suspected dead (a request timed out on them; their
    /// PING is outstanding): they take no new requests.
    public var connectionsSuspect = 0
    /// Lanes forgotten, their connections closed, to stay within ``HTTP2ClientSettings/maxLanes``.
    public var lanesRetired = 0

    public init() {}
}

/// HTTP/2 over TLS (libnghttp2 + OpenSSL, `CSources/CHeraldH2`) on one
/// event-loop thread, for many lanes.
///
/// Each lane (``HTTP2LaneKey``) keeps a small pool of long-lived connections
/// (ALPN h2, the certificate checked against the host, the configured CA
/// file) and a queue:
/// - A new connection waits for the server's SETTINGS and never opens more
///   streams than SETTINGS_MAX_CONCURRENT_STREAMS allows (APNs starts token
///   connections at one stream and raises the limit after the first accepted
///   push: the lane sends one, then fans out). Requests beyond the limit wait
///   in the lane's queue.
/// - Every request has a deadline (15 s, queueing included); a late stream is
///   reset and reported as a timeout.
/// - A connection where a request timed out is suspected dead: it takes no
///   new streams, and is sent a PING at once. Answered within the ping
///   timeout (and, when flow control had held the request back, with the
///   window open again), it carries on; otherwise it is closed and its
///   unanswered requests go back to the queue, for a new connection.
/// - GOAWAY reasons are recorded; requests the server left unprocessed
///   (above the GOAWAY's last stream, or REFUSED_STREAM) go back to the queue
///   and out on another connection.
/// - Idle connections are kept alive with PING; failed connection attempts
///   back off exponentially.
/// - With ``HTTP2BearerTokens``: one token per connection, reused by every
///   connection and request of the lane until it is `refresh` old; a
///   connection switches to a newer one no more often than `minimumInterval`.
///
/// Requests handed over from other threads are taken by the loop in bursts,
/// so a fan-out costs one wakeup and a few writes, not one of each per request.
/// Completions run on the client's thread: they must not block.
public final class HTTP2Client: Sendable {
    public let settings: HTTP2ClientSettings
    let clock: any WallClock
    let log: Logger?
    let loop: EventLoop
    let tls: TLSContext
    let resolverQueue = DispatchQueue(label: "herald.http2.resolver", attributes: .concurrent)
    private let registry = Locked<Registry>(Registry())
    let counters = Locked(HTTP2ClientStats())
    private let finished = DispatchSemaphore(value: 0)
    /// Requests handed over to the loop, not yet taken by it (each made
    /// by its sender and not touched by it again).
    private let inbox = Locked<[(Lane, Pending)]>([])

    private struct Registry {
        var lanes: [HTTP2LaneKey: Lane] = [:]
        var stopping = false
    }

    public init(
        settings: HTTP2ClientSettings, clock: any WallClock = SystemClock(), log: Logger? = nil,
        threadName: String = "herald-http2"
    ) throws(HTTP2ClientError) {
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
            _ = hs_set_thread_name(threadName)
            loop.run()
            done.signal()
        }
        thread.name = threadName
        thread.start()
        loop.execute { [weak self, loop] in
            loop.every(milliseconds: 100) { [weak self] in self?.sweep() }
            _ = self
        }
    }

    /// The lane for `key`, created on first use. The endpoint and options of
    /// an existing lane are kept (give a new key for a new endpoint or credential).
    public func lane(
        _ key: HTTP2LaneKey, endpoint: HTTP2Endpoint, options: HTTP2LaneOptions = .init()
    )
        -> HTTP2LaneHandle
    {
        HTTP2LaneHandle(
            client: self,
            lane: registry.withLock { r in
                if let lane = r.lanes[key] { return lane }
                let lane = Lane(key: key, endpoint: endpoint, options: options, client: self)
                r.lanes[key] = lane
                return lane
            })
    }

    public var stats: HTTP2ClientStats { counters.withLock { $0 } }

    /// Fails what is queued or in flight with ``HTTP2ClientError/shutdown``,
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
        var idle: [Lane] = []
        for lane in lanes {
            lane.sweep(now: now)
            if lane.isIdle(now: now) { idle.append(lane) }
        }
        forget(idle)
        let over = lanes.count - idle.count - settings.maxLanes
        guard over > 0 else { return }
        // Over the bound: the least recently used lanes that hold no request.
        let unused = lanes.filter { !$0.detached && !$0.isBusy }.sorted { $0.lastUsed < $1.lastUsed }.prefix(over)
        forget(Array(unused))
        for lane in unused { lane.retire() }
        if !unused.isEmpty {
            count { $0.lanesRetired += unused.count }
            log?.info("http2_lanes_retired", ["count": String(unused.count), "bound": String(settings.maxLanes)])
        }
    }

    /// Takes lanes out of the registry; a request that still reaches one
    /// registers it again (`reattach`). Loop thread only.
    private func forget(_ lanes: [Lane]) {
        guard !lanes.isEmpty else { return }
        registry.withLock { r in
            for lane in lanes where r.lanes[lane.key] === lane {
                r.lanes[lane.key] = nil
                lane.detached = true
            }
        }
    }

    /// Lanes currently known to the client (idle ones with an idle timeout
    /// are forgotten).
    public var laneCount: Int { registry.withLock { $0.lanes.count } }

    func count(_ update: (inout HTTP2ClientStats) -> Void) { counters.withLock { update(&$0) } }

    /// Hands `pending` to the loop, its only user from here on.
    func submit(_ pending: sending Pending, to lane: Lane) {
        let first = inbox.withLock { box -> Bool in
            box.append((lane, pending))
            return box.count == 1
        }
        if first { loop.execute { [self] in drainInbox() } }
    }

    /// Sends several requests (of any lanes of this client) with one wakeup
    /// of the client's thread: they go out in the same writes. Each
    /// completion runs once, on the client's thread.
    public func send(_ batch: [HTTP2Send]) {
        guard !batch.isEmpty else { return }
        if isStopping {
            for item in batch { item.completion(.failure(.shutdown)) }
            return
        }
        let deadline = monotonicMilliseconds() + settings.requestTimeout.wholeMilliseconds
        let items = batch.map {
            ($0.lane.lane, Pending(request: $0.request, deadline: deadline, completion: $0.completion))
        }
        let first = inbox.withLock { box -> Bool in
            let wasEmpty = box.isEmpty
            box.append(contentsOf: items)
            return wasEmpty
        }
        if first { loop.execute { [self] in drainInbox() } }
    }

    private func drainInbox() {
        let batch = inbox.withLock { box -> [(Lane, Pending)] in
            defer { box.removeAll(keepingCapacity: true) }
            return box
        }
        var lanes: [Lane] = []
        for (handed, pending) in batch {
            let lane = handed.detached ? reattach(handed) : handed
            lane.enqueue(pending, pump: false)
            if !lanes.contains(where: { $0 === lane }) { lanes.append(lane) }
        }
        for lane in lanes { lane.pump() }
    }
}

extension HTTP2Client {
    /// A request reached a lane the sweep forgot: the registered lane of its
    /// key takes it (or this one is registered again). Loop thread only.
    fileprivate func reattach(_ lane: Lane) -> Lane {
        registry.withLock { r in
            if let current = r.lanes[lane.key] { return current }
            r.lanes[lane.key] = lane
            lane.detached = false
            return lane
        }
    }
}

/// One request of a batch for ``HTTP2Client/send(_:)``.
public struct HTTP2Send: Sendable {
    public let lane: HTTP2LaneHandle
    public let request: HTTP2Request
    public let completion: @Sendable (Result<HTTP2Response, HTTP2ClientError>) -> Void

    public init(
        lane: HTTP2LaneHandle, request: HTTP2Request,
        completion: @escaping @Sendable (Result<HTTP2Response, HTTP2ClientError>) -> Void
    ) {
        self.lane = lane
        self.request = request
        self.completion = completion
    }
}

/// A lane of an ``HTTP2Client``: where requests are sent.
public struct HTTP2LaneHandle: Sendable {
    let client: HTTP2Client
    let lane: Lane

    public var key: HTTP2LaneKey { lane.key }

    /// Sends one request. The completion runs once, on the client's thread.
    public func send(
        _ request: HTTP2Request, completion: @escaping @Sendable (Result<HTTP2Response, HTTP2ClientError>) -> Void
    ) {
        let deadline = monotonicMilliseconds() + client.settings.requestTimeout.wholeMilliseconds
        let pending = Pending(request: request, deadline: deadline, completion: completion)
        if client.isStopping {
            completion(.failure(.shutdown))
            return
        }
        client.submit(pending, to: lane)
    }

    /// The async form of ``send(_:completion:)``.
    public func send(_ request: HTTP2Request) async -> Result<HTTP2Response, HTTP2ClientError> {
        await withCheckedContinuation { c in send(request) { c.resume(returning: $0) } }
    }
}

/// The OpenSSL client context every connection shares.
final class TLSContext: Sendable {
    private let context: SharedHandle
    /// The SSL_CTX: immutable after setup; OpenSSL allows its concurrent use.
    var handle: OpaquePointer { context.pointer }

    init(caFile: String?) throws(HTTP2ClientError) {
        var err = [CChar](repeating: 0, count: 256)
        guard let handle = hh2_tls_new(caFile, &err, err.count) else {
            throw .tls(String(cBuffer: err))
        }
        context = SharedHandle(handle) { hh2_tls_free($0) }
    }
}
