import Foundation
import HeraldCore
import HeraldCrypto
import HeraldIO

/// A push waiting for, or riding on, a stream.
final class Pending: @unchecked Sendable {
    // Loop thread only after `send` hands it over.
    let push: APNsPush
    /// Monotonic ms by which the answer must be in.
    let deadline: Int64
    private let completion: @Sendable (Result<APNsResponse, APNsClientError>) -> Void
    var requeues = 0
    private(set) var done = false

    init(
        push: APNsPush, deadline: Int64, completion: @escaping @Sendable (Result<APNsResponse, APNsClientError>) -> Void
    ) {
        self.push = push
        self.deadline = deadline
        self.completion = completion
    }

    func finish(_ result: Result<APNsResponse, APNsClientError>) {
        guard !done else { return }
        done = true
        completion(result)
    }
}

/// A lane's provider token: one ES256 JWT reused until it is ~50 minutes old.
struct ProviderToken {
    let value: String
    /// Wall-clock ms of its `iat`.
    let issuedAt: Int64
}

/// One lane: a queue and a small pool of connections. Loop thread only.
final class Lane: @unchecked Sendable {
    let key: APNsLaneKey
    let endpoint: APNsEndpoint
    let signer: APNsSigner
    unowned let client: APNsClient
    private var queue: [Pending] = []
    private var queueHead = 0
    private(set) var connections: [Connection] = []
    private var nextConnectionID = 1
    private var token: ProviderToken?
    /// Monotonic ms before which no new connection is attempted.
    private var reconnectAt: Int64 = 0
    private var reconnectDelay: Int64 = 0
    private var closed = false

    init(key: APNsLaneKey, endpoint: APNsEndpoint, signer: APNsSigner, client: APNsClient) {
        self.key = key
        self.endpoint = endpoint
        self.signer = signer
        self.client = client
    }

    var settings: APNsClientSettings { client.settings }
    var queued: Int { queue.count - queueHead }

    // MARK: Queue

    func enqueue(_ pending: Pending, pump now: Bool = true) {
        if closed {
            pending.finish(.failure(.shutdown))
            return
        }
        queue.append(pending)
        if now { pump() }
    }

    /// Puts a push the server did not process back at the front of the queue.
    func requeue(_ pending: Pending, reason: APNsClientError) {
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
        while queued > 0 {
            guard let conn = connections.filter(\.canTakeStream).max(by: { $0.freeSlots < $1.freeSlots }) else { break }
            guard let pending = popFront() else { break }
            if !touched.contains(where: { $0 === conn }) { touched.append(conn) }
            conn.submit(pending)
        }
        for conn in touched { conn.flush() }
        if queued > 0 { maybeConnect() }
    }

    private func maybeConnect() {
        guard connections.count < settings.maxConnectionsPerLane else { return }
        guard !connections.contains(where: { !$0.isReady && !$0.isFinished }) else { return }  // one attempt at a time
        // A connection still warming up (one stream until APNs raises the
        // limit) is not "full": wait for it rather than open another.
        let usable = connections.filter { $0.isReady && !$0.draining }
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
    func connectionFailed(_ conn: Connection, _ error: APNsClientError) {
        client.count { $0.connectFailures += 1 }
        client.log?.warning(
            "apns_connect_failed", ["lane": key.description, "conn": String(conn.id), "error": error.description])
        reconnectDelay =
            reconnectDelay == 0
            ? settings.reconnectBase.wholeMilliseconds : min(settings.reconnectMax.wholeMilliseconds, reconnectDelay * 2)
        reconnectAt = monotonicMilliseconds() + reconnectDelay
        remove(conn)
        // Nothing can carry the queue now: tell its pushes why, so they are
        // retried later by the scheduler rather than waiting out a deadline.
        if !connections.contains(where: \.isReady) {
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

    // MARK: Provider tokens

    /// The token a new connection (or a connection due to switch) should use:
    /// the lane's current one, signed again once it is `tokenRefresh` old.
    func currentToken() -> ProviderToken? {
        let now = client.clock.nowMilliseconds()
        if let token, now - token.issuedAt < settings.tokenRefresh.wholeMilliseconds { return token }
        return mint(now: now)
    }

    /// APNs called the token expired: sign a new one unless the current one is
    /// younger than the minimum interval (then the clock is off, and a new
    /// token would be refused as too frequent an update).
    func tokenRejected(_ value: String) {
        let now = client.clock.nowMilliseconds()
        guard let token, token.value == value else { return }
        if now - token.issuedAt >= settings.tokenMinimumInterval.wholeMilliseconds { _ = mint(now: now) }
    }

    private func mint(now: Int64) -> ProviderToken? {
        do {
            let value = try APNsProviderToken.make(
                key: signer.key, keyID: signer.keyID, teamID: signer.teamID, issuedAt: now / 1000)
            let minted = ProviderToken(value: value, issuedAt: (now / 1000) * 1000)
            token = minted
            client.count { $0.tokensMinted += 1 }
            client.log?.info("apns_token_signed", ["lane": key.description])
            return minted
        } catch {
            client.log?.error("apns_token_failed", ["lane": key.description, "error": String(describing: error)])
            return nil
        }
    }

    // MARK: Timers and shutdown

    func sweep(now: Int64) {
        guard !closed else { return }
        for p in queue[queueHead...] where !p.done && now >= p.deadline {
            client.count { $0.timeouts += 1 }
            p.finish(.failure(.timeout("no connection took the push within its deadline")))
        }
        for conn in connections { conn.sweep(now: now) }
        if queued > 0 { pump() }
    }

    func close() {
        closed = true
        while let p = popFront() { p.finish(.failure(.shutdown)) }
        for conn in connections { conn.abort(.shutdown) }
        connections.removeAll()
    }
}
