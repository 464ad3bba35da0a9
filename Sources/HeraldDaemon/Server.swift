import HeraldIO
import CHeraldSys
import Foundation
import HeraldJSON
import JSONRPC
import HeraldConfiguration

#if canImport(Glibc)
    import Glibc
#endif

/// Who is calling: the peer's credentials from SO_PEERCRED, and its
/// supplementary groups from SO_PEERGROUPS.
public struct CallContext: Sendable {
    public let uid: UInt32
    public let gid: UInt32
    public let pid: Int32
    /// Supplementary groups of the peer when it connected (may include `gid`).
    public var groups: [UInt32] = []
    /// The connection the call came on (an event subscription streams to it).
    var connectionID: UInt64 = 0
}

/// Answers one request. `reply` may be called from any thread, exactly once.
protocol RequestHandler: Sendable {
    func handle(
        _ request: RPCRequest, context: CallContext, reply: @escaping @Sendable (Result<JSON, RPCError>) -> Void)
}

/// Limits of the socket server (SPEC Revision 2, "Limits on what one client can cost").
struct ServerLimits: Sendable {
    var maxConnections = 512
    /// `[server] max_connections_per_uid`.
    var maxConnectionsPerUID = 64
    var maxMessageBytes = JSONFramer.defaultMaxMessageBytes
    /// `[server] max_batch`: calls in one batch.
    var maxBatch = 1000
    /// `[server] max_reply_bytes`: answers owed to one connection (unsent, or
    /// gathered for a batch not yet complete). An answer that would pass it is
    /// replaced by 1007 `overloaded`; reading pauses at half of it and resumes
    /// below a quarter.
    var maxReplyBytes = 16 * 1024 * 1024
    /// Requests in flight on one connection before it stops being read.
    var maxPendingPerConnection = 1024
    /// `[server] request_timeout_ms`: a message must be complete this long after its first byte.
    var requestTimeoutMs: Int64 = 10_000
    /// A connection with no complete message for this long (and nothing owed) is closed.
    var idleTimeoutMs: Int64 = 300_000
    /// A connection whose unsent output makes no progress for this long is dropped.
    var stalledWriteTimeoutMs: Int64 = 30_000
    /// Bytes of messages read and not yet taken, all connections together. Past
    /// it, a connection in the middle of a message is not read until the total
    /// falls to three quarters (its message may then time out): 512 clients
    /// each 4 MiB into a message would otherwise hold 2 GiB.
    var maxBufferedBytes = 64 * 1024 * 1024
    /// The same for one peer uid's connections: half of it, so that one uid
    /// in the middle of many big messages leaves room for the others'.
    var maxBufferedBytesPerUID: Int { maxBufferedBytes / 2 }
    /// JSON values in one message (a larger tree is refused while it is parsed).
    var maxValuesPerMessage = 262_144
    /// `[server] max_uid_bytes`: what one peer uid's connections hold
    /// together, answers owed and decoded calls not yet run (see
    /// `decodedBytesPerMessageByte`). Past it, that uid's connections take
    /// no new message until it falls to three quarters, and answers that do
    /// not fit are replaced by 1007 `overloaded`.
    var maxUIDBytes = 128 * 1024 * 1024
    /// `[server] max_client_bytes`: the same, every connection together. Past
    /// it every connection waits as above; held past it for a second, the
    /// connection holding the most is closed (`client_shed`).
    var maxClientBytes = 384 * 1024 * 1024
    /// What a decoded call is counted as holding, per byte of the message
    /// it came from: a parse tree of small objects is 10 to 14 times its
    /// text (measured: a 3.5 MB message of 130,000 objects held 55 MB).
    static let decodedBytesPerMessageByte = 16
    /// Messages at least this long are parsed and decoded off the loop.
    var offLoopMessageBytes = 64 * 1024
    /// Work one connection may do per loop turn before the others get theirs:
    /// messages taken, and time spent running calls.
    var messagesPerTurn = 256
    var sliceMicroseconds: Int64 = 2_000

    init() {}

    init(_ server: HeraldConfig.Server) {
        maxConnectionsPerUID = server.maxConnectionsPerUID
        maxBatch = server.maxBatch
        maxReplyBytes = server.maxReplyBytes
        requestTimeoutMs = server.requestTimeoutMs
        maxUIDBytes = server.maxUIDBytes
        maxClientBytes = server.maxClientBytes
    }
}

/// Counters the server keeps for `system.stats` (loop thread only).
struct ServerCounters {
    var accepted = 0
    /// Connections refused at accept (the global or the per-uid cap).
    var refused = 0
    var requests = 0
    var errors = 0
    /// Connections closed because a message was not complete within `request_timeout_ms`.
    var timedOut = 0
    /// Answers replaced by `overloaded` (the reply budget) and batches refused as too large.
    var overloaded = 0
    /// Times the listener was left alone for a sweep because accept found
    /// no descriptor (EMFILE, ENFILE) or no memory.
    var acceptPauses = 0
    /// Times a connection stopped being read because its uid, or every
    /// connection together, held its budget (`max_uid_bytes`, `max_client_bytes`).
    var budgetPauses = 0
    /// Connections closed because every connection together held past `max_client_bytes`.
    var shed = 0
    /// Bytes the connections hold now (answers owed, decoded calls); filled when read.
    var heldBytes = 0
}

/// JSON-RPC 2.0 over a Unix stream socket, on the event loop. Each
/// connection is read and framed on the loop; small messages are decoded
/// there, large ones on a worker queue. Calls go to the handler in order, a
/// bounded slice per loop turn, and their responses come back in any order.
/// All mutable state is touched on the loop thread only.
// @unchecked: every mutable field is touched on the loop thread only (preconditionInLoop).
final class RPCServer: @unchecked Sendable {
    private let loop: EventLoop
    private let listener: Listener
    private let handler: any RequestHandler
    private let log: Logger
    let limits: ServerLimits
    private var connections: [UInt64: Connection] = [:]
    private var perUID: [UInt32: Int] = [:]
    private var dirty: [UInt64] = []
    /// Connections with work left (calls or complete messages), served next turn.
    private var backlog: [UInt64] = []
    private var nextID: UInt64 = 1
    private(set) var counters = ServerCounters()
    private var accepting = true
    /// The listener is not watched: accept failed for want of descriptors
    /// or memory (see ``pauseAccepting(_:)``).
    private var acceptPaused = false
    /// Pauses since accepting last worked.
    private var pausesInRun = 0
    /// One read buffer for every connection (loop thread only).
    private let readBuffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 65536, alignment: 16)
    /// Large messages are parsed here, one at a time, so that at most one big
    /// parse tree exists at once.
    private let parseWorker = ParseWorker()
    /// Set when a large buffer was released: the next sweep gives free memory back.
    private var trimWanted = false
    /// Answer bytes written since the last trim (they were freed as they went).
    private var writtenSinceTrim = 0
    /// Calls answered since the last trim: their work (store results, parse
    /// trees) was freed on other threads, whose malloc arenas keep the pages.
    private var answeredSinceTrim = 0
    /// A burst of this many calls is trimmed after once the daemon is idle.
    static let trimAfterCalls = 512
    /// When the trims that follow the last one are due (monotonic ms).
    private var trimFollowUps: [Int64] = []
    /// Time spent reading and framing in this loop turn, in microseconds.
    private var readTimeThisTurn: Int64 = 0
    /// Bytes the connections' framers hold (see `maxBufferedBytes`).
    private var bufferedTotal = 0
    /// `bufferedTotal` per peer uid (while it has a connection).
    private var bufferedByUID: [UInt32: Int] = [:]
    /// Connections not read because `bufferedTotal` is past `maxBufferedBytes`
    /// (or their uid's part past `maxBufferedBytesPerUID`).
    private var starved: [UInt64] = []
    /// What every connection holds (answers owed, decoded calls), against `maxClientBytes`.
    let clientBudget: ClientBudget
    /// The same per peer uid, against `maxUIDBytes` (while it has a connection).
    private var uidBudgets: [UInt32: ClientBudget] = [:]
    /// Connections not taking messages because a budget is spent, in the order they stopped.
    private var budgetWaiting: [UInt64] = []
    /// A running estimate of each method's answer size (results only): a call
    /// whose answer would not fit is refused before it runs.
    private var answerSizes: [String: Int] = [:]
    /// Sweeps in a row that found `clientBudget` past its limit.
    private var overBudgetSweeps = 0
    /// The most `clientBudget` held since the last trim.
    private var heldPeakSinceTrim = 0
    /// When `client_budget_paused` was last logged (one line a second at most).
    private var budgetLoggedAt: Int64 = 0

    /// Bytes every connection holds: answers owed and decoded calls not yet run.
    var heldBytes: Int { clientBudget.value }
    /// A streaming connection's unsent output fell below ``EventStream/lowWater``
    /// after the stream asked (loop thread).
    var streamDrained: ((UInt64) -> Void)?
    /// A streaming connection closed (loop thread).
    var streamClosed: ((UInt64) -> Void)?

    init(
        loop: EventLoop, listener: Listener, handler: any RequestHandler, log: Logger,
        limits: ServerLimits = ServerLimits()
    ) {
        self.loop = loop
        self.listener = listener
        self.handler = handler
        self.log = log
        self.limits = limits
        clientBudget = ClientBudget(limit: limits.maxClientBytes, parent: nil)
        // Big buffers (messages, answers, parse trees' arrays) are mapped on
        // their own and unmapped when freed: glibc's default raises this
        // threshold after each big free, and the next big buffers then come
        // from the heap, where a hostile client's peak stays resident.
        hs_malloc_large_buffers_mapped(256 * 1024)
    }

    deinit { readBuffer.deallocate() }

    var openConnections: Int { connections.count }

    /// True when every request is answered and every answer written out. An
    /// event subscriber's unsent notifications are not waited for: a stop
    /// would otherwise wait its whole budget for one that does not read (it
    /// resubscribes from its cursor).
    var isQuiescent: Bool {
        connections.values.allSatisfy {
            $0.pending == 0 && ($0.outputBytes == 0 || $0.streaming) && $0.idleOfWork
        }
    }

    /// Registers the listener and the idle sweep (call on the loop thread or before `run`).
    func start() throws(SystemError) {
        try loop.add(listener.fd, events: UInt32(EPOLLIN.rawValue)) { [self] _ in acceptAll() }
        loop.every(milliseconds: 250) { [self] in sweep() }
        loop.afterIteration = { [self] in
            serveBacklog()
            serveStarved()
            serveBudgetWaiting()
            readTimeThisTurn = 0
            flushDirty()
        }
        loop.hasDeferredWork = { [self] in !backlog.isEmpty }
    }

    /// Stops watching the listener until the next ``sweep()`` (every 250
    /// ms): one warning at the first pause of a run of them, the count of
    /// the run when accepting works again.
    private func pauseAccepting(_ error: Int32) {
        guard !acceptPaused else { return }
        acceptPaused = true
        counters.acceptPauses += 1
        pausesInRun += 1
        loop.modify(listener.fd, events: 0)
        if pausesInRun == 1 {
            log.warning(
                "accept_paused",
                [
                    "errno": String(cString: strerror(error)), "connections": String(connections.count),
                    "retry_ms": "250",
                ])
        }
    }

    /// Watches the listener again after a pause (from the sweep).
    private func resumeAccepting() {
        guard acceptPaused else { return }
        acceptPaused = false
        guard accepting else { return }
        loop.modify(listener.fd, events: UInt32(EPOLLIN.rawValue))
        // Taken now: a connection that waited through the pause is served
        // without waiting for another wake-up, and a pause that still holds
        // shows here (the run goes on).
        let before = counters.accepted
        acceptAll()
        if !acceptPaused && pausesInRun > 0 {
            log.info("accept_resumed", ["pauses": String(pausesInRun), "accepted": String(counters.accepted - before)])
            pausesInRun = 0
        }
    }

    /// Stops accepting new connections; open ones are served on.
    func stopAccepting() {
        loop.preconditionInLoop()
        guard accepting else { return }
        accepting = false
        loop.remove(listener.fd)
    }

    /// Closes every connection (after their pending responses, if they
    /// complete within the loop's remaining life).
    func closeAll() {
        loop.preconditionInLoop()
        flushDirty()
        for conn in Array(connections.values) { close(conn) }
    }

    // MARK: Accepting

    private func acceptAll() {
        loop.preconditionInLoop()
        while accepting {
            let fd = hs_accept(listener.fd)
            if fd < 0 {
                let error = errno
                if error == EINTR { continue }
                if error == EMFILE || error == ENFILE || error == ENOBUFS || error == ENOMEM {
                    // Out of descriptors or memory: the pending connection
                    // keeps the listener readable, and taking it again at
                    // once would spin. Stop watching the listener until the
                    // next sweep, as nginx does; the connections wait in the
                    // backlog meanwhile.
                    pauseAccepting(error)
                } else if error != EAGAIN && error != EWOULDBLOCK && error != ECONNABORTED {
                    log.warning("accept_failed", ["errno": String(cString: strerror(error))])
                }
                return
            }
            if connections.count >= limits.maxConnections {
                refuse(fd, "too many connections")
                continue
            }
            var uid: UInt32 = 0, gid: UInt32 = 0, pid: Int32 = 0
            if hs_peer_credentials(fd, &uid, &gid, &pid) != 0 {
                Glibc.close(fd)
                continue
            }
            if perUID[uid, default: 0] >= limits.maxConnectionsPerUID {
                log.debug("connection_refused", ["uid": String(uid), "reason": "max_connections_per_uid"])
                refuse(fd, "too many connections for this uid (\(limits.maxConnectionsPerUID))")
                continue
            }
            var context = CallContext(uid: uid, gid: gid, pid: pid)
            context.groups = Self.peerGroups(fd)
            context.connectionID = nextID
            let uidBudget =
                uidBudgets[uid]
                ?? ClientBudget(limit: limits.maxUIDBytes, parent: clientBudget)
            let conn = Connection(
                id: nextID, fd: fd, context: context, maxMessageBytes: limits.maxMessageBytes,
                maxReplyBytes: limits.maxReplyBytes, shared: uidBudget)
            nextID += 1
            do {
                try loop.add(fd, events: conn.events) { [self] events in handleEvents(conn, events) }
            } catch {
                Glibc.close(fd)
                continue
            }
            connections[conn.id] = conn
            perUID[uid, default: 0] += 1
            uidBudgets[uid] = uidBudget
            counters.accepted += 1
            log.debug("connection_open", ["conn": String(conn.id), "uid": String(uid), "pid": String(pid)])
        }
    }

    /// 1007 `overloaded` on a connection that is not taken, then close.
    private func refuse(_ fd: Int32, _ message: String) {
        counters.refused += 1
        let error = RPCError(.overloaded(message, retryAfterMs: 1000))
        let bytes = RPCResponse.frame(RPCResponse.failure(id: nil, error: error))
        _ = bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        Glibc.close(fd)
    }

    /// The peer's supplementary groups (SO_PEERGROUPS); empty when the kernel cannot tell.
    static func peerGroups(_ fd: Int32) -> [UInt32] {
        var groups = [UInt32](repeating: 0, count: 64)
        var n = groups.withUnsafeMutableBufferPointer { hs_peer_groups(fd, $0.baseAddress, Int32($0.count)) }
        if n > Int32(groups.count) {
            groups = [UInt32](repeating: 0, count: Int(n))
            n = groups.withUnsafeMutableBufferPointer { hs_peer_groups(fd, $0.baseAddress, Int32($0.count)) }
        }
        guard n > 0, n <= Int32(groups.count) else { return [] }
        return Array(groups[0..<Int(n)])
    }

    // MARK: Connection events

    private func handleEvents(_ conn: Connection, _ events: UInt32) {
        loop.preconditionInLoop()
        guard connections[conn.id] != nil else { return }
        if events & UInt32(EPOLLERR.rawValue) != 0 {
            close(conn)
            return
        }
        if events & UInt32(EPOLLOUT.rawValue) != 0 {
            flush(conn)
            guard connections[conn.id] != nil else { return }
        }
        if events & (UInt32(EPOLLIN.rawValue) | UInt32(EPOLLHUP.rawValue) | UInt32(EPOLLRDHUP.rawValue)) != 0 {
            readAvailable(conn)
        }
        // HUP: the peer closed both directions. What it sent has been read and
        // dispatched; nothing more can be delivered (and HUP would fire again).
        if events & UInt32(EPOLLHUP.rawValue) != 0 { close(conn) }
    }

    /// True when the connection may take more bytes from its socket: nothing
    /// buffered or decoded is still waiting for its turn.
    private func mayRead(_ conn: Connection) -> Bool {
        guard !conn.readClosed && !conn.closing && !conn.readPaused && !conn.backlogged && conn.idleOfWork,
            !conn.starved, !conn.budgetPaused
        else { return false }
        if conn.framer.bufferedByteCount > 0,
            bufferedTotal >= limits.maxBufferedBytes
                || bufferedByUID[conn.context.uid, default: 0] >= limits.maxBufferedBytesPerUID
        {
            // Too much is buffered in unfinished messages, of every uid or
            // of this one: this one waits.
            conn.starved = true
            starved.append(conn.id)
            updateInterest(conn)
            return false
        }
        return true
    }

    /// Keeps `bufferedTotal` up to date after the connection's framer changed.
    private func account(_ conn: Connection) {
        let now = conn.framer.storedByteCount
        bufferedTotal += now - conn.accountedBytes
        bufferedByUID[conn.context.uid, default: 0] += now - conn.accountedBytes
        conn.accountedBytes = now
    }

    /// Reads again the connections that waited for buffer room, once there is some.
    private func serveStarved() {
        guard !starved.isEmpty, bufferedTotal < limits.maxBufferedBytes / 4 * 3 else { return }
        let ids = starved
        starved.removeAll()
        for id in ids {
            guard let conn = connections[id] else { continue }
            guard bufferedByUID[conn.context.uid, default: 0] < limits.maxBufferedBytesPerUID / 4 * 3 else {
                starved.append(id)
                continue
            }
            conn.starved = false
            updateInterest(conn)
            if mayRead(conn) { readAvailable(conn) }
        }
    }

    private func readAvailable(_ conn: Connection) {
        loop.preconditionInLoop()
        // Many clients in the middle of big messages could fill a turn with
        // reading and framing: past a few milliseconds a turn, those wait for
        // the next one (their sockets stay readable), while a client with no
        // message under way is still read, so that small calls are answered.
        if readTimeThisTurn > limits.sliceMicroseconds * 2 && conn.framer.bufferedByteCount > 0 { return }
        let started = monotonicMicroseconds()
        defer { readTimeThisTurn += monotonicMicroseconds() - started }
        // A bounded number of reads per wakeup keeps one busy client from starving others.
        for _ in 0..<4 {
            guard mayRead(conn) else { break }
            let n = recv(conn.fd, readBuffer.baseAddress, readBuffer.count, 0)
            if n > 0 {
                conn.framer.append(UnsafeRawBufferPointer(rebasing: readBuffer[0..<n]))
                account(conn)
                processFrames(conn)
                if n < readBuffer.count { break }
                // A message under way waits for the next turn once this one has had its share.
                if conn.framer.bufferedByteCount > 0 && monotonicMicroseconds() - started > limits.sliceMicroseconds {
                    break
                }
            } else if n == 0 {
                conn.readClosed = true
                conn.partialSince = nil
                updateInterest(conn)
                processFrames(conn)
                break
            } else {
                if errno == EINTR { continue }
                if errno == EAGAIN || errno == EWOULDBLOCK { break }
                close(conn)
                return
            }
        }
        maybeClose(conn)
    }

    /// Runs the connection's decoded calls and takes its buffered messages,
    /// within one slice; what is left waits in the backlog for the next turn.
    private func processFrames(_ conn: Connection) {
        loop.preconditionInLoop()
        defer { if connections[conn.id] != nil { account(conn) } }
        let deadline = monotonicMicroseconds() + limits.sliceMicroseconds
        var taken = 0
        while !conn.closing, !conn.readPaused, connections[conn.id] != nil {
            if conn.hasQueuedCalls {
                runQueued(conn, until: deadline)
                if conn.hasQueuedCalls {
                    // Paused: answers in flight resume it; else the slice ended.
                    if !conn.readPaused { postpone(conn) }
                    return
                }
            }
            if conn.parsing { return }
            if conn.shouldPause(limits) {
                pauseReading(conn)
                return
            }
            if taken == limits.messagesPerTurn || monotonicMicroseconds() > deadline {
                // More may be buffered: continue next turn, after other clients.
                if conn.framer.bufferedByteCount > 0 { postpone(conn) }
                return
            }
            if conn.shared.spent {
                // The uid's connections, or all of them, hold their budget:
                // no new message is taken (and decoded) until it frees.
                if conn.framer.bufferedByteCount > 0 || !conn.readClosed { budgetPause(conn) }
                return
            }
            let frame = conn.readClosed ? conn.framer.finish() : conn.framer.next()
            guard let frame else {
                if conn.framer.bufferedByteCount == 0 {
                    conn.partialSince = nil
                    if conn.framer.releaseStorage() { trimWanted = true }
                } else if conn.partialSince == nil && !conn.readClosed {
                    conn.partialSince = monotonicMilliseconds()
                }
                return
            }
            taken += 1
            conn.partialSince = nil
            conn.lastActivity = monotonicMilliseconds()
            process(frame, conn)
        }
    }

    private func postpone(_ conn: Connection) {
        if !conn.backlogged {
            conn.backlogged = true
            backlog.append(conn.id)
        }
    }

    private func serveBacklog() {
        guard !backlog.isEmpty else { return }
        let ids = backlog
        backlog.removeAll(keepingCapacity: true)
        for id in ids {
            guard let conn = connections[id] else { continue }
            conn.backlogged = false
            guard !conn.readPaused else { continue }
            processFrames(conn)
            if mayRead(conn) { readAvailable(conn) } else { maybeClose(conn) }
        }
    }

    private func process(_ frame: JSONFramer.Frame, _ conn: Connection) {
        switch frame {
        case .tooLarge:
            counters.errors += 1
            let error = RPCError.messageTooLarge(limit: limits.maxMessageBytes)
            enqueue(conn, RPCResponse.frame(RPCResponse.failure(id: .null, error: error)))
            conn.closing = true
            updateInterest(conn)
        case .message(let bytes):
            let maxBatch = limits.maxBatch
            let maxValues = limits.maxValuesPerMessage
            // Counted from now: a large message is parsed on the worker, and
            // the next one must see what this one will hold.
            let cost = bytes.count * ServerLimits.decodedBytesPerMessageByte
            conn.decodedBytes += cost
            conn.shared.add(cost)
            guard bytes.count >= limits.offLoopMessageBytes else {
                accept(
                    Self.decode(bytes, maxBatch: maxBatch, maxValues: maxValues), conn, large: false, cost: cost)
                return
            }
            // Parsed on the worker; the connection takes nothing more until it is back.
            conn.parsing = true
            updateInterest(conn)
            trimWanted = true
            let connID = conn.id
            parseWorker.submit { [self] in
                let message = Self.decode(bytes, maxBatch: maxBatch, maxValues: maxValues)
                loop.execute { [self] in
                    guard let conn = connections[connID] else { return }
                    conn.parsing = false
                    updateInterest(conn)
                    accept(message, conn, large: true, cost: cost)
                    processFrames(conn)
                    if mayRead(conn) { readAvailable(conn) } else { maybeClose(conn) }
                }
            }
        }
    }

    /// Decodes one message; a batch of more than `maxBatch` calls is one
    /// -32600 `batch_too_large`, found without parsing it.
    static func decode(_ bytes: [UInt8], maxBatch: Int, maxValues: Int) -> RPCMessage {
        if RPCMessage.batchExceeds(bytes, limit: maxBatch) {
            return .single(.failure(RPCFailure(id: .null, error: .batchTooLarge(limit: maxBatch))))
        }
        return RPCMessage.decode(bytes, maxValues: maxValues)
    }

    /// Queues a decoded message's calls, in order. `large`: from a message
    /// parsed off the loop, whose calls are also released off the loop.
    /// `cost`: what the message is counted as holding, released when its
    /// last call runs.
    private func accept(_ message: RPCMessage, _ conn: Connection, large: Bool, cost: Int) {
        switch message {
        case .single(let call):
            if case .failure(let failure) = call, failure.id == .null,
                failure.error.reason == "batch_too_large" || failure.error.reason == "too_many_values"
            {
                counters.overloaded += 1
            }
            conn.queue.append(QueuedCall(call: call, batch: nil, large: large, cost: cost))
        case .batch(let calls):
            var batch: Int? = nil
            let expected = message.expectedResponseCount
            if expected > 0 { batch = conn.startBatch(expecting: expected) }
            // The whole message is counted until its last call runs: the
            // calls' sizes are not known, and one may hold nearly all of it.
            for (i, call) in calls.enumerated() {
                let part = i == calls.count - 1 ? cost : 0
                conn.queue.append(QueuedCall(call: call, batch: batch, large: large, cost: part))
            }
            if calls.isEmpty { release(cost, of: conn) }
        }
    }

    /// A decoded call's share of its message, given back as it runs.
    private func release(_ cost: Int, of conn: Connection) {
        conn.decodedBytes -= cost
        conn.shared.remove(cost)
    }

    /// Runs queued calls until the slice ends (at least one).
    private func runQueued(_ conn: Connection, until deadline: Int64) {
        var first = true
        while conn.hasQueuedCalls, !conn.closing, connections[conn.id] != nil {
            if !first && monotonicMicroseconds() > deadline { return }
            if conn.pending >= conn.pendingWindow(limits) {
                pauseReading(conn)
                return
            }
            first = false
            guard let call = conn.queue[conn.queueHead].call else { break }
            let batch = conn.queue[conn.queueHead].batch
            let large = conn.queue[conn.queueHead].large
            release(conn.queue[conn.queueHead].cost, of: conn)
            conn.queue[conn.queueHead].call = nil
            conn.queueHead += 1
            if conn.queueHead == conn.queue.count {
                conn.queue.removeAll(keepingCapacity: conn.queue.count <= 1024)
                conn.queueHead = 0
            }
            run(call, conn, batch: batch)
            if large {
                // A big tree costs time to free: the worker frees it (unless the handler still holds it).
                parseWorker.submit { withExtendedLifetime(call) {} }
            }
        }
    }

    private func run(_ call: RPCCall, _ conn: Connection, batch: Int?) {
        loop.preconditionInLoop()
        counters.requests += 1
        switch call {
        case .failure(let failure):
            counters.errors += 1
            if let id = failure.id {
                emit(conn, Self.serialize(RPCResponse.failure(id: id, error: failure.error)), batch: batch)
            }
        case .success(let request):
            if let id = request.id,
                !conn.budget.hasRoom(answerSizes[request.method] ?? 1, besides: conn.decodedBytes)
            {
                // An answer of the method's usual size fits neither the
                // connection's budget nor its uid's or the process's (what its
                // own decoded calls hold aside: they are let go as they run):
                // refused without running it, nor making an answer to drop.
                counters.errors += 1
                counters.overloaded += 1
                emit(conn, Self.serialize(RPCResponse.failure(id: id, error: overloaded())), batch: batch)
                return
            }
            conn.pending += 1
            let connID = conn.id
            let id = request.id
            let method = request.method
            let budget = conn.budget
            let overloadedError = overloaded()
            handler.handle(request, context: conn.context) { [self] result in
                // Serialised on the thread that answers (for the store, not the loop),
                // and held only if it fits the connection's budget: an answer that
                // does not is dropped here, before it reaches the loop.
                var outcome = Outcome.answered
                var bytes: [UInt8]? = nil
                var made = 0
                if let id {
                    switch result {
                    case .success(let value):
                        let answer = Self.serialize(RPCResponse.success(id: id, result: value))
                        made = answer.count
                        if budget.reserve(answer.count) {
                            bytes = answer
                        } else {
                            outcome = .overloaded
                            let refusal = Self.serialize(RPCResponse.failure(id: id, error: overloadedError))
                            budget.force(refusal.count)
                            bytes = refusal
                        }
                    case .failure(let error):
                        let answer = Self.serialize(RPCResponse.failure(id: id, error: error))
                        budget.force(answer.count)
                        bytes = answer
                        made = answer.count
                    }
                }
                if case .failure = result { outcome = .failed }
                let done = outcome
                let answer = bytes
                let size = made
                if loop.inLoop {
                    complete(connID, method, batch: batch, outcome: done, made: size, answer)
                } else {
                    loop.execute { self.complete(connID, method, batch: batch, outcome: done, made: size, answer) }
                }
            }
        }
    }

    static func serialize(_ response: JSON) -> [UInt8] { response.serialized() }

    private func overloaded() -> RPCError {
        RPCError(
            .overloaded(
                "answers owed to this connection passed max_reply_bytes (\(limits.maxReplyBytes)); read them first",
                retryAfterMs: 100))
    }

    enum Outcome: Sendable {
        case answered, failed, overloaded
    }

    /// A call's answer, already counted in the connection's budget; `made`:
    /// the size of the answer as made (a refused one's too; 0 for a notification).
    private func complete(
        _ connID: UInt64, _ method: String, batch: Int?, outcome: Outcome, made: Int, _ bytes: [UInt8]?
    ) {
        loop.preconditionInLoop()
        if made > 0 && outcome != .failed {
            // Only methods that exist answer with a result: the table stays as small as the method list.
            let seen = answerSizes[method] ?? made
            answerSizes[method] = (seen * 3 + made) / 4
        }
        guard let conn = connections[connID] else { return }
        conn.pending -= 1
        answeredSinceTrim += 1
        switch outcome {
        case .answered: break
        case .failed: counters.errors += 1
        case .overloaded:
            counters.errors += 1
            counters.overloaded += 1
        }
        if made > 0 { conn.recordAnswer(made) }
        if let bytes {
            emit(conn, bytes, batch: batch, reserved: true)
        }
        if conn.readPaused && !conn.shouldResume(limits) {
            if conn.shouldPause(limits) { return }
        }
        if conn.readPaused && conn.shouldResume(limits) { resumeReading(conn) }
        maybeClose(conn)
    }

    /// One serialised response (no newline): alone, or into its batch.
    /// `reserved`: its bytes are already counted in the connection's budget.
    private func emit(_ conn: Connection, _ bytes: [UInt8], batch: Int?, reserved: Bool = false) {
        guard let batch else {
            enqueue(conn, bytes, reserved: reserved)
            enqueue(conn, [10])
            return
        }
        guard let collector = conn.batches[batch] else {
            if reserved { conn.budget.release(bytes.count) }
            return
        }
        if !reserved { conn.budget.force(bytes.count) }
        conn.budget.force(1)  // its "[" or ","
        collector.pieces.append(bytes)
        collector.bytes += bytes.count + 1
        conn.batchBytes += bytes.count + 1
        collector.remaining -= 1
        guard collector.remaining == 0 else { return }
        conn.batches[batch] = nil
        conn.batchBytes -= collector.bytes
        enqueue(conn, [UInt8(ascii: "[")], reserved: true)
        for (i, piece) in collector.pieces.enumerated() {
            if i > 0 { enqueue(conn, [UInt8(ascii: ",")], reserved: true) }
            enqueue(conn, piece, reserved: true)
        }
        enqueue(conn, [UInt8(ascii: "]"), 10])
    }

    // MARK: Writing

    private func enqueue(_ conn: Connection, _ bytes: [UInt8], reserved: Bool = false) {
        if !reserved { conn.budget.force(bytes.count) }
        if conn.outputBytes == 0 { conn.lastWriteProgress = monotonicMilliseconds() }
        conn.appendOutput(bytes)
        if !conn.dirty && !conn.waitingForWritable {
            conn.dirty = true
            dirty.append(conn.id)
        }
    }

    /// Writes what each connection has queued: one pass per connection per
    /// loop iteration, however many responses it gathered.
    private func flushDirty() {
        guard !dirty.isEmpty else { return }
        let ids = dirty
        dirty.removeAll(keepingCapacity: true)
        for id in ids {
            guard let conn = connections[id] else { continue }
            conn.dirty = false
            flush(conn)
        }
    }

    private func flush(_ conn: Connection) {
        loop.preconditionInLoop()
        while let head = conn.output.first {
            let offset = conn.outputOffset
            let n = head.withUnsafeBytes {
                send(conn.fd, $0.baseAddress! + offset, $0.count - offset, Int32(MSG_NOSIGNAL))
            }
            if n > 0 {
                conn.outputOffset += n
                conn.outputBytes -= n
                conn.budget.release(n)
                writtenSinceTrim += n
                conn.lastWriteProgress = monotonicMilliseconds()
                if conn.outputOffset == head.count {
                    if head.count >= 1 << 20 { trimWanted = true }
                    conn.output.removeFirst()
                    conn.outputOffset = 0
                }
            } else if n < 0 && errno == EINTR {
                continue
            } else if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) {
                break
            } else {
                close(conn)
                return
            }
        }
        if conn.output.isEmpty && conn.outputPeak >= 1 << 20 {
            conn.outputPeak = 0
            trimWanted = true
        }
        let waiting = !conn.output.isEmpty
        if waiting != conn.waitingForWritable {
            conn.waitingForWritable = waiting
            updateInterest(conn)
        }
        if conn.readPaused && conn.shouldResume(limits) { resumeReading(conn) }
        if conn.drainWanted && conn.outputBytes < EventStream.lowWater {
            conn.drainWanted = false
            streamDrained?(conn.id)
        }
        maybeClose(conn)
    }

    // MARK: Flow control and closing

    private func pauseReading(_ conn: Connection) {
        guard !conn.readPaused else { return }
        conn.readPaused = true
        updateInterest(conn)
    }

    private func resumeReading(_ conn: Connection) {
        conn.readPaused = false
        // The time waited for our own output does not count against the client.
        if conn.partialSince != nil { conn.partialSince = monotonicMilliseconds() }
        updateInterest(conn)
        // Frames already buffered are processed now; the socket may have more.
        processFrames(conn)
        if mayRead(conn) { readAvailable(conn) }
    }

    /// Stops taking messages from a connection whose budget is spent (its
    /// socket is not read either); ``serveBudgetWaiting()`` takes it up again.
    private func budgetPause(_ conn: Connection) {
        guard !conn.budgetPaused else { return }
        conn.budgetPaused = true
        counters.budgetPauses += 1
        budgetWaiting.append(conn.id)
        updateInterest(conn)
        let now = monotonicMilliseconds()
        if now - budgetLoggedAt >= 1000 {
            budgetLoggedAt = now
            let uidSpent = conn.shared.value >= conn.shared.limit
            log.warning(
                "client_budget_paused",
                [
                    "uid": String(conn.context.uid), "scope": uidSpent ? "uid" : "process",
                    "held_bytes": String(uidSpent ? conn.shared.value : clientBudget.value),
                    "limit_bytes": String(uidSpent ? conn.shared.limit : clientBudget.limit),
                    "waiting": String(budgetWaiting.count),
                ])
        }
    }

    /// Takes up the connections that waited for their budget, in the order
    /// they stopped, once their uid and the process hold under three quarters.
    private func serveBudgetWaiting() {
        guard !budgetWaiting.isEmpty, clientBudget.value < clientBudget.limit / 4 * 3 else { return }
        // A connection taken up may stop again at once (its next message
        // spends the budget): it then queues itself behind those still waiting.
        let ids = budgetWaiting
        budgetWaiting.removeAll()
        var still: [UInt64] = []
        defer { budgetWaiting = still + budgetWaiting }
        for id in ids {
            guard let conn = connections[id] else { continue }
            guard conn.shared.value < conn.shared.limit / 4 * 3, clientBudget.value < clientBudget.limit / 4 * 3
            else {
                still.append(id)
                continue
            }
            conn.budgetPaused = false
            // The time waited for the budget does not count against the client.
            if conn.partialSince != nil { conn.partialSince = monotonicMilliseconds() }
            updateInterest(conn)
            processFrames(conn)
            if mayRead(conn) { readAvailable(conn) } else { maybeClose(conn) }
        }
    }

    /// Sheds the connection holding the most once every connection
    /// together has held past `maxClientBytes` for a second (four sweeps):
    /// its answers were not read, or its calls wait on something that does
    /// not end.
    private func shedIfOverBudget() {
        heldPeakSinceTrim = max(heldPeakSinceTrim, clientBudget.value)
        guard clientBudget.value > clientBudget.limit else {
            overBudgetSweeps = 0
            return
        }
        overBudgetSweeps += 1
        guard overBudgetSweeps >= 4,
            let largest = connections.values.max(by: { $0.owed + $0.decodedBytes < $1.owed + $1.decodedBytes })
        else { return }
        overBudgetSweeps = 0
        counters.shed += 1
        log.warning(
            "client_shed",
            [
                "conn": String(largest.id), "uid": String(largest.context.uid),
                "held_bytes": String(largest.owed + largest.decodedBytes),
                "all_held_bytes": String(clientBudget.value), "limit_bytes": String(clientBudget.limit),
            ])
        close(largest)
    }

    private func updateInterest(_ conn: Connection) {
        guard connections[conn.id] != nil else { return }
        loop.modify(conn.fd, events: conn.events)
    }

    private func maybeClose(_ conn: Connection) {
        guard connections[conn.id] != nil else { return }
        let done = conn.pending == 0 && conn.output.isEmpty && conn.idleOfWork && conn.framer.bufferedByteCount == 0
        if conn.closing && conn.output.isEmpty {
            close(conn)
        } else if conn.readClosed && done {
            close(conn)
        }
    }

    private func close(_ conn: Connection) {
        loop.preconditionInLoop()
        guard connections.removeValue(forKey: conn.id) != nil else { return }
        bufferedTotal -= conn.accountedBytes
        bufferedByUID[conn.context.uid, default: 0] -= conn.accountedBytes
        conn.accountedBytes = 0
        // What it held leaves its uid's and the process's budgets; answers
        // still on their way to it count against nothing but itself.
        if conn.decodedBytes > 0 { trimWanted = true }
        conn.shared.remove(conn.decodedBytes)
        conn.decodedBytes = 0
        conn.budget.detach()
        if let n = perUID[conn.context.uid] {
            perUID[conn.context.uid] = n > 1 ? n - 1 : nil
            if n == 1 {
                uidBudgets[conn.context.uid] = nil
                bufferedByUID[conn.context.uid] = nil
            }
        }
        loop.remove(conn.fd)
        Glibc.close(conn.fd)
        if conn.outputBytes + conn.batchBytes + conn.framer.storedByteCount >= 1 << 20 || conn.outputPeak >= 1 << 20 {
            trimWanted = true
        }
        log.debug("connection_closed", ["conn": String(conn.id)])
        if conn.streaming { streamClosed?(conn.id) }
    }

    private func sweep() {
        loop.preconditionInLoop()
        resumeAccepting()
        let now = monotonicMilliseconds()
        for conn in Array(connections.values) {
            // A subscriber that stops reading holds what its stream bounds
            // (`event_buffer_bytes`, a batch unsent): it may read again.
            if conn.outputBytes > 0 && !conn.streaming && now - conn.lastWriteProgress > limits.stalledWriteTimeoutMs {
                log.info("connection_stalled", ["conn": String(conn.id), "unsent_bytes": String(conn.outputBytes)])
                close(conn)
            } else if let since = conn.partialSince, !conn.closing, !conn.readPaused, !conn.backlogged,
                !conn.budgetPaused, conn.idleOfWork, now - since > limits.requestTimeoutMs
            {
                // A message begun and not finished in time: say why, then close.
                counters.timedOut += 1
                counters.errors += 1
                log.info("request_timeout", ["conn": String(conn.id), "uid": String(conn.context.uid)])
                let error = RPCError(
                    code: RPCError.Code.invalidRequest, message: "Invalid Request",
                    data: ["reason": "request_timeout", "limit_ms": .int(limits.requestTimeoutMs)])
                enqueue(conn, RPCResponse.frame(RPCResponse.failure(id: .null, error: error)))
                conn.closing = true
                conn.partialSince = nil
                updateInterest(conn)
                flush(conn)
            } else if conn.pending == 0 && conn.output.isEmpty && conn.idleOfWork && conn.partialSince == nil
                && !conn.streaming && now - conn.lastActivity > limits.idleTimeoutMs
            {
                log.debug("connection_idle", ["conn": String(conn.id)])
                close(conn)
            }
        }
        shedIfOverBudget()
        let idleAfterBurst =
            answeredSinceTrim >= Self.trimAfterCalls && connections.values.allSatisfy { $0.pending == 0 }
        // What the connections held came down from 32 MiB or more to a quarter of it.
        let heldFell = heldPeakSinceTrim >= 32 << 20 && clientBudget.value < heldPeakSinceTrim / 4
        // Memory freed just after a trim (trees and buffers let go on other
        // threads, calls that ended with their connection, sends that gave
        // up later) waits for the next: a trim that had cause is followed
        // by three more, 2 s, 8 s and 20 s on.
        let followUp = trimFollowUps.first.map { now >= $0 } ?? false
        if followUp { trimFollowUps.removeFirst() }
        if trimWanted || writtenSinceTrim >= 8 << 20 || idleAfterBurst || heldFell || followUp {
            if !followUp { trimFollowUps = [now + 2000, now + 8000, now + 20_000] }
            heldPeakSinceTrim = clientBudget.value
            // Large buffers freed, or a burst of calls is over (the store's and
            // resolvers' threads freed their results): hand the free pages
            // back to the system, off the loop.
            trimWanted = false
            writtenSinceTrim = 0
            answeredSinceTrim = 0
            DispatchQueue.global(qos: .utility).async { _ = hs_malloc_trim() }
        }
    }
}

/// What a group of connections holds (one peer uid's, or every one):
/// answers owed and decoded calls not yet run, in bytes, against `limit`;
/// each change passes on to `parent`. Thread-safe: answers are counted on
/// the threads that make them.
final class ClientBudget: Sendable {
    let limit: Int
    let parent: ClientBudget?
    private let held = Locked(0)

    init(limit: Int, parent: ClientBudget?) {
        self.limit = limit
        self.parent = parent
    }

    var value: Int { held.withLock { $0 } }

    /// This group or a group it is part of holds its limit.
    var spent: Bool { value >= limit || parent?.spent == true }

    /// `n` more bytes would fit here and in every parent now.
    func hasRoom(_ n: Int) -> Bool {
        value + n <= limit && parent?.hasRoom(n) != false
    }

    /// Counts `n` bytes here and in every parent if they fit under every limit.
    func reserve(_ n: Int) -> Bool {
        let fits = held.withLock { held in
            guard held + n <= limit else { return false }
            held += n
            return true
        }
        guard fits else { return false }
        if let parent, !parent.reserve(n) {
            held.withLock { $0 -= n }
            return false
        }
        return true
    }

    /// Counts `n` bytes here and in every parent, whether or not they fit.
    func add(_ n: Int) {
        held.withLock { $0 += n }
        parent?.add(n)
    }

    func remove(_ n: Int) { add(-n) }
}

/// The bytes of answers one connection is owed, shared by the threads that
/// make answers (which reserve room for them) and the loop (which releases
/// it as they are written). Each change is also its uid's (`shared`, and
/// through it the process's) until the connection closes (``detach()``).
final class ReplyBudget: Sendable {
    let limit: Int
    let shared: ClientBudget?
    /// Bytes held, and whether the connection closed.
    private let state = Locked((held: 0, detached: false))

    init(limit: Int, shared: ClientBudget? = nil) {
        self.limit = limit
        self.shared = shared
    }

    var value: Int { state.withLock { $0.held } }

    /// `n` more bytes would fit under the limit, and under the uid's and the
    /// process's once `besides` bytes they count (the connection's decoded
    /// calls) are let go.
    func hasRoom(_ n: Int, besides: Int = 0) -> Bool {
        state.withLock { s in
            s.held + n <= limit && (s.detached || shared?.hasRoom(n - besides) != false)
        }
    }

    /// Counts `n` bytes if they fit under the limit, the uid's and the process's.
    func reserve(_ n: Int) -> Bool {
        state.withLock { s in
            guard s.held + n <= limit else { return false }
            if !s.detached, let shared, !shared.reserve(n) { return false }
            s.held += n
            return true
        }
    }

    /// Counts `n` bytes whether or not they fit (errors, separators).
    func force(_ n: Int) {
        state.withLock { s in
            s.held += n
            if !s.detached { shared?.add(n) }
        }
    }

    func release(_ n: Int) { force(-n) }

    /// The connection closed: what it holds leaves the shared budgets, and
    /// what comes after counts here only.
    func detach() {
        state.withLock { s in
            guard !s.detached else { return }
            shared?.remove(s.held)
            s.detached = true
        }
    }
}

/// A decoded call waiting for its turn (nil once taken).
struct QueuedCall {
    var call: RPCCall?
    let batch: Int?
    let large: Bool
    /// What its message is counted as holding, on the message's last call (else 0).
    let cost: Int
}

/// The answers of one batch, gathered until the last one (loop thread only).
final class BatchAnswers {
    var remaining: Int
    var pieces: [[UInt8]] = []
    /// Bytes gathered, separators included.
    var bytes = 0

    init(expecting count: Int) { remaining = count }
}

/// One client connection's state (loop thread only).
final class Connection {
    let id: UInt64
    let fd: Int32
    let context: CallContext
    var framer: JSONFramer
    /// Unsent output, in pieces (small answers share one piece of up to 64 KiB).
    var output: [[UInt8]] = []
    /// Bytes of `output.first` already sent.
    var outputOffset = 0
    /// Unsent bytes in `output`.
    var outputBytes = 0
    /// The most output held since it was last empty.
    var outputPeak = 0
    var pending = 0
    var batches: [Int: BatchAnswers] = [:]
    /// Bytes gathered for batches not yet complete.
    var batchBytes = 0
    private var nextBatch = 0
    /// Decoded calls not yet run, with their batch.
    var queue: [QueuedCall] = []
    var queueHead = 0
    /// A large message is being parsed off the loop.
    var parsing = false
    /// Not read while the server holds too much of unfinished messages.
    var starved = false
    /// Not read, and no message taken, while its uid or the process holds its budget.
    var budgetPaused = false
    /// What its decoded calls not yet run are counted as holding.
    var decodedBytes = 0
    /// Its uid's budget (through it, the process's).
    var shared: ClientBudget { budget.shared! }
    /// Framer bytes counted in the server's total.
    var accountedBytes = 0
    var readClosed = false
    /// Set after an oversized message or a timeout: flush the error, then close.
    var closing = false
    var readPaused = false
    /// Work is left for the next turn.
    var backlogged = false
    var waitingForWritable = false
    var dirty = false
    /// When the last complete message arrived (or the connection opened).
    var lastActivity = monotonicMilliseconds()
    /// When the first byte of the message not yet complete was read.
    var partialSince: Int64?
    var lastWriteProgress = monotonicMilliseconds()
    /// An event subscription streams to it: not closed for idling or for
    /// output it does not read (its stream bounds what it holds).
    var streaming = false
    /// The stream waits for its unsent output to fall below ``EventStream/lowWater``.
    var drainWanted = false

    init(
        id: UInt64, fd: Int32, context: CallContext, maxMessageBytes: Int, maxReplyBytes: Int, shared: ClientBudget
    ) {
        budget = ReplyBudget(limit: maxReplyBytes, shared: shared)
        self.id = id
        self.fd = fd
        self.context = context
        framer = JSONFramer(maxMessageBytes: maxMessageBytes)
    }

    var events: UInt32 {
        var e: UInt32 = 0
        // Not while a message is parsed off the loop: the socket would wake the loop for nothing.
        if !readClosed && !closing && !readPaused && !parsing && !starved && !budgetPaused {
            e |= UInt32(EPOLLIN.rawValue) | UInt32(EPOLLRDHUP.rawValue)
        }
        if waitingForWritable { e |= UInt32(EPOLLOUT.rawValue) }
        return e
    }

    var hasQueuedCalls: Bool { queueHead < queue.count }

    /// No decoded call waits and no message is being parsed.
    var idleOfWork: Bool { !hasQueuedCalls && !parsing }

    /// The bytes of answers this connection is owed and Herald holds: unsent,
    /// gathered for a batch, or made on another thread and on their way.
    var owed: Int { budget.value }
    let budget: ReplyBudget

    func appendOutput(_ bytes: [UInt8]) {
        outputBytes += bytes.count
        outputPeak = max(outputPeak, outputBytes)
        // Small answers are gathered into one piece, so one send carries many.
        if bytes.count < 4096, !output.isEmpty, output[output.count - 1].count + bytes.count <= 65536 {
            output[output.count - 1].append(contentsOf: bytes)
        } else {
            output.append(bytes)
        }
    }

    func startBatch(expecting count: Int) -> Int {
        nextBatch += 1
        batches[nextBatch] = BatchAnswers(expecting: count)
        return nextBatch
    }

    /// A running estimate of this connection's answer size (0 before the
    /// first), from the answers made, refused ones included.
    var answerBytesEstimate = 0

    func recordAnswer(_ bytes: Int) {
        answerBytesEstimate = answerBytesEstimate == 0 ? bytes : (answerBytesEstimate * 7 + bytes) / 8
    }

    /// Calls in flight at once: as many as half the reply budget holds at the
    /// estimated answer size (16 until an answer is seen), at most
    /// `maxPendingPerConnection`. The answers of calls in flight are made,
    /// and held by the store until its commit, before the budget can refuse
    /// them: the window bounds what they cost together.
    func pendingWindow(_ limits: ServerLimits) -> Int {
        guard answerBytesEstimate > 0 else { return 16 }
        return min(limits.maxPendingPerConnection, max(16, limits.maxReplyBytes / 2 / answerBytesEstimate))
    }

    func shouldPause(_ limits: ServerLimits) -> Bool {
        pending >= pendingWindow(limits) || owed >= limits.maxReplyBytes / 2
    }

    func shouldResume(_ limits: ServerLimits) -> Bool {
        pending < pendingWindow(limits) / 2 && owed < limits.maxReplyBytes / 4
    }
}

/// One thread, below the loop's priority, that parses large messages in the
/// order they are submitted: a client's 4 MiB message takes CPU from the
/// loop only when the loop has nothing to do.
final class ParseWorker: Sendable {
    /// The parses not yet started, and whether the thread was started; its
    /// condition wakes the thread when one comes.
    private let state = Locked<(jobs: [@Sendable () -> Void], started: Bool)>(([], false))

    func submit(_ job: @escaping @Sendable () -> Void) {
        let start = state.withLock { s in
            s.jobs.append(job)
            defer { s.started = true }
            return !s.started
        }
        if start {
            let thread = Thread { [self] in run() }
            thread.name = "herald-parse"
            thread.start()
        }
        state.signal()
    }

    private func run() {
        _ = hs_set_thread_name("herald-parse")
        // Nice 10 for this thread only (Linux: a thread id names one thread).
        _ = hs_set_thread_nice(10)
        while true {
            let job = state.withLock(when: { !$0.jobs.isEmpty }) { $0.jobs.removeFirst() }
            job()
        }
    }
}

extension RPCServer: StreamSink {
    func streamWrite(_ connID: UInt64, _ bytes: [UInt8]) -> Bool {
        loop.preconditionInLoop()
        guard let conn = connections[connID], !conn.closing else { return false }
        enqueue(conn, bytes)
        enqueue(conn, [10])
        return true
    }

    func streamUnsent(_ connID: UInt64) -> Int? {
        connections[connID]?.outputBytes
    }

    func streamReserve(_ connID: UInt64, _ n: Int) -> Bool {
        connections[connID]?.budget.reserve(n) ?? false
    }

    func streamRelease(_ connID: UInt64, _ n: Int) {
        connections[connID]?.budget.release(n)
    }

    func streamStart(_ connID: UInt64) -> Bool {
        guard let conn = connections[connID], !conn.closing else { return false }
        conn.streaming = true
        return true
    }

    func streamStop(_ connID: UInt64) {
        guard let conn = connections[connID] else { return }
        conn.streaming = false
        conn.drainWanted = false
        conn.lastActivity = monotonicMilliseconds()
    }

    func streamWantsDrain(_ connID: UInt64) {
        connections[connID]?.drainWanted = true
    }
}
