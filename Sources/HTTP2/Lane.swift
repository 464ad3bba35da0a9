import HeraldCore
import HeraldIO

/// A request waiting for, or riding on, a stream. Made on the sender's
/// thread, then handed to the client's loop (``HTTP2Client/submit(_:to:)``
/// and ``HTTP2Client/send(_:)`` take it `sending`), whose thread is its only
/// user: its lane's and connections'.
final class Pending {
    let request: HTTP2Request
    /// Monotonic ms by which the answer must be in.
    let deadline: Int64
    private let completion: @Sendable (Result<HTTP2Response, HTTP2ClientError>) -> Void
    var requeues = 0
    private(set) var done = false

    init(
        request: HTTP2Request, deadline: Int64,
        completion: @escaping @Sendable (Result<HTTP2Response, HTTP2ClientError>) -> Void
    ) {
        self.request = request
        self.deadline = deadline
        self.completion = completion
    }

    func finish(_ result: Result<HTTP2Response, HTTP2ClientError>) {
        guard !done else { return }
        done = true
        completion(result)
    }
}

/// A lane's bearer token, reused until it is `refresh` old.
struct BearerToken {
    let value: String
    /// Wall-clock ms of its `iat`.
    let issuedAt: Int64
    /// The `authorization` value, made once for every request it signs.
    let header: String

    init(value: String, issuedAt: Int64) {
        self.value = value
        self.issuedAt = issuedAt
        self.header = "bearer " + value
    }
}

/// One lane: a queue and a small pool of connections. Loop thread only.
// @unchecked: loop thread only (the client's event loop), as are the Pendings it queues, each handed over `sending` through the client's inbox.
final class Lane: @unchecked Sendable {
    let key: HTTP2LaneKey
    let endpoint: HTTP2Endpoint
    let options: HTTP2LaneOptions
    unowned let client: HTTP2Client
    private var queue: [Pending] = []
    private var queueHead = 0
    private(set) var connections: [Connection] = []
    private var nextConnectionID = 1
    private var token: BearerToken?
    /// Monotonic ms before which no new connection is attempted.
    private var reconnectAt: Int64 = 0
    private var reconnectDelay: Int64 = 0
    private var closed = false
    /// Monotonic ms of the last request handed to the lane.
    private(set) var lastUsed = monotonicMilliseconds()
    /// Taken out of the client's registry while idle; a request that still
    /// reaches it puts it back.
    var detached = false

    init(key: HTTP2LaneKey, endpoint: HTTP2Endpoint, options: HTTP2LaneOptions, client: HTTP2Client) {
        self.key = key
        self.endpoint = endpoint
        self.options = options
        self.client = client
    }

    var settings: HTTP2ClientSettings { client.settings }
    var queued: Int { queue.count - queueHead }

    // MARK: Queue

    func enqueue(_ pending: Pending, pump now: Bool = true) {
        if closed {
            pending.finish(.failure(.shutdown))
            return
        }
        queue.append(pending)
        lastUsed = monotonicMilliseconds()
        if now { pump() }
    }

    /// Puts a request the server did not process back at the front of the queue.
    func requeue(_ pending: Pending, reason: HTTP2ClientError) {
        guard !pending.done else { return }
        pending.requeues += 1
        if pending.requeues > settings.maxRequeues || closed {
            pending.finish(.failure(closed ? .shutdown : reason))
            return
        }
        client.count { $0.requeued += 1 }
        if queueHead > 0 {
            queueHead -= 1
            queue[queueHead] = pending
        } else {
            queue.insert(pending, at: 0)
        }
    }

    private func popFront() -> Pending? {
        while queueHead < queue.count {
            let p = queue[queueHead]
            queueHead += 1
            if queueHead > 1024 && queueHead * 2 > queue.count {
                queue.removeFirst(queueHead)
                queueHead = 0
            }
            if !p.done { return p }
        }
        if queueHead > 0 {
            queue.removeAll(keepingCapacity: true)
            queueHead = 0
        }
        return nil
    }

    /// Moves queued pushes onto streams with room, then opens a connection if
    /// the queue still waits and the pool may grow.
    func pump() {
        guard !closed else { return }
        var touched: [Connection] = []
        var now: Int64?
        while queued > 0 {
            var best: Connection?
            for c in connections where c.canTakeStream && c.freeSlots > (best?.freeSlots ?? 0) { best = c }
            guard let conn = best else { break }
            guard let pending = popFront() else { break }
            if let notAfter = pending.request.notAfter {
                let wall = now ?? client.clock.nowMilliseconds()
                now = wall
                if wall > notAfter {
                    pending.finish(.failure(.timeout("its send deadline passed before a stream was free; not sent")))
                    continue
                }
            }
            if !touched.contains(where: { $0 === conn }) { touched.append(conn) }
            conn.submit(pending)
        }
        for conn in touched { conn.flush() }
        if queued > 0 { maybeConnect() }
    }

    private func maybeConnect() {
        // A suspected connection (a request timed out on it) is closed within
        // the ping timeout unless it proves alive: it does not hold a place
        // the replacement needs.
        guard connections.count(where: { !$0.isSuspect }) < settings.maxConnectionsPerLane else { return }
        guard !connections.contains(where: { !$0.isReady && !$0.isFinished }) else { return }  // one attempt at a time
        // A connection still warming up (one stream until the server raises the
        // limit) is not "full": wait for it rather than open another.
        let usable = connections.filter { $0.isReady && !$0.draining && !$0.isSuspect }
        guard usable.allSatisfy({ ($0.isWarm && $0.freeSlots == 0) || $0.isStuckWarmingUp }) else { return }
        let now = monotonicMilliseconds()
        guard now >= reconnectAt else { return }
        let conn = Connection(id: nextConnectionID, lane: self)
        nextConnectionID += 1
        connections.append(conn)
        conn.start()
    }

    // MARK: Connection events

    func connectionReady(_ conn: Connection) {
        reconnectDelay = 0
        reconnectAt = 0
        pump()
    }

    /// A connection attempt failed before it became usable.
    func connectionFailed(_ conn: Connection, _ error: HTTP2ClientError) {
        client.count { $0.connectFailures += 1 }
        client.log?.warning(
            "http2_connect_failed", ["lane": key.description, "conn": String(conn.id), "error": error.description])
        reconnectDelay =
            reconnectDelay == 0
            ? settings.reconnectBase.wholeMilliseconds
            : min(settings.reconnectMax.wholeMilliseconds, reconnectDelay * 2)
        reconnectAt = monotonicMilliseconds() + reconnectDelay
        remove(conn)
        // Nothing can carry the queue now: tell its pushes why, so they are
        // retried later by the scheduler rather than waiting out a deadline.
        if !connections.contains(where: { $0.isReady && !$0.isSuspect }) {
            while let p = popFront() { p.finish(.failure(error)) }
        }
    }

    /// A connection ended (failed, drained or closed by the server).
    func connectionClosed(_ conn: Connection) {
        remove(conn)
        pump()
    }

    private func remove(_ conn: Connection) {
        connections.removeAll { $0 === conn }
    }

    // MARK: Bearer tokens

    /// The token a new connection (or a connection due to switch) should use:
    /// the lane's current one, signed again once it is `refresh` old. Nil when
    /// the lane has no tokens, or signing failed.
    func currentToken() -> BearerToken? {
        guard let tokens = options.tokens else { return nil }
        let now = client.clock.nowMilliseconds()
        if let token, now - token.issuedAt < tokens.refresh.wholeMilliseconds { return token }
        return mint(tokens, now: now)
    }

    /// The server rejected `value`: sign a new one unless the current one is
    /// younger than the minimum interval (then the clock is off, and a new
    /// token would be refused as too frequent an update).
    func tokenRejected(_ value: String) {
        guard let tokens = options.tokens, let token, token.value == value else { return }
        let now = client.clock.nowMilliseconds()
        if now - token.issuedAt >= tokens.minimumInterval.wholeMilliseconds { _ = mint(tokens, now: now) }
    }

    private func mint(_ tokens: HTTP2BearerTokens, now: Int64) -> BearerToken? {
        do {
            let value = try tokens.mint(now / 1000)
            let minted = BearerToken(value: value, issuedAt: (now / 1000) * 1000)
            token = minted
            client.count { $0.tokensMinted += 1 }
            client.log?.info("http2_token_signed", ["lane": key.description])
            return minted
        } catch {
            client.log?.error("http2_token_failed", ["lane": key.description, "error": String(describing: error)])
            return nil
        }
    }

    // MARK: Timers and shutdown

    func sweep(now: Int64) {
        guard !closed else { return }
        for p in queue[queueHead...] where !p.done && now >= p.deadline {
            client.count { $0.timeouts += 1 }
            p.finish(.failure(.timeout("no connection took the request within its deadline")))
        }
        for conn in connections { conn.sweep(now: now) }
        if queued > 0 { pump() }
    }

    /// Holds nothing and has been unused for its idle timeout: the client
    /// may forget it. Lanes without an idle timeout are kept.
    func isIdle(now: Int64) -> Bool {
        guard let idle = options.idleTimeout else { return false }
        return connections.isEmpty && queued == 0 && now - lastUsed >= idle.wholeMilliseconds
    }

    /// Holds a request: queued, or on a stream.
    var isBusy: Bool { queued > 0 || connections.contains { $0.inFlight > 0 } }

    /// Closes the lane's connections (it holds no request); the lane itself
    /// stays usable, and opens a connection again for a request that reaches it.
    func retire() {
        for conn in connections { conn.closeUnused() }
    }

    func close() {
        closed = true
        while let p = popFront() { p.finish(.failure(.shutdown)) }
        for conn in connections { conn.abort(.shutdown) }
        connections.removeAll()
    }
}
