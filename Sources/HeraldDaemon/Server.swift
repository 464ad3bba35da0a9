import HeraldIO
import CHeraldSys
import Foundation
import JSONRPC

#if canImport(Glibc)
    import Glibc
#endif

/// Who is calling: the peer's credentials from SO_PEERCRED.
public struct CallContext: Sendable {
    public let uid: UInt32
    public let gid: UInt32
    public let pid: Int32
}

/// Answers one request. `reply` may be called from any thread, exactly once.
protocol RequestHandler: Sendable {
    func handle(_ request: RPCRequest, context: CallContext, reply: @escaping @Sendable (Result<JSON, RPCError>) -> Void)
}

/// Limits of the socket server.
struct ServerLimits: Sendable {
    var maxConnections = 512
    var maxMessageBytes = JSONFramer.defaultMaxMessageBytes
    /// Requests in flight on one connection before it stops being read.
    var maxPendingPerConnection = 1024
    /// Unsent response bytes on one connection before it stops being read.
    var maxOutputBytes = 8 * 1024 * 1024
    /// Messages taken from one connection per loop iteration, so that one
    /// pipelining client cannot hold the loop while others wait.
    var messagesPerTurn = 256
    var idleTimeoutMs: Int64 = 300_000
    /// A connection whose unsent output makes no progress for this long is dropped.
    var stalledWriteTimeoutMs: Int64 = 30_000
}

/// Counters the server keeps for `system.stats` (loop thread only).
struct ServerCounters {
    var accepted = 0
    var refused = 0
    var requests = 0
    var errors = 0
}

/// JSON-RPC 2.0 over a Unix stream socket, on the event loop. Each
/// connection is read, framed and decoded on the loop; requests go to the
/// handler and their responses come back in any order. All mutable state
/// is touched on the loop thread only.
final class RPCServer: @unchecked Sendable {
    private let loop: EventLoop
    private let listener: Listener
    private let handler: any RequestHandler
    private let log: Logger
    let limits: ServerLimits
    private var connections: [UInt64: Connection] = [:]
    private var dirty: [UInt64] = []
    /// Connections with complete messages still buffered, served next turn.
    private var backlog: [UInt64] = []
    private var nextID: UInt64 = 1
    private(set) var counters = ServerCounters()
    private var accepting = true

    init(loop: EventLoop, listener: Listener, handler: any RequestHandler, log: Logger, limits: ServerLimits = ServerLimits()) {
        self.loop = loop
        self.listener = listener
        self.handler = handler
        self.log = log
        self.limits = limits
    }

    var openConnections: Int { connections.count }

    /// True when every request is answered and every answer written out.
    var isQuiescent: Bool {
        connections.values.allSatisfy { $0.pending == 0 && $0.output.count == $0.outputOffset }
    }

    /// Registers the listener and the idle sweep (call on the loop thread or before `run`).
    func start() throws(SystemError) {
        try loop.add(listener.fd, events: UInt32(EPOLLIN.rawValue)) { [self] _ in acceptAll() }
        loop.every(milliseconds: 1000) { [self] in sweep() }
        loop.afterIteration = { [self] in
            serveBacklog()
            flushDirty()
        }
        loop.hasDeferredWork = { [self] in !backlog.isEmpty }
    }

    /// Stops accepting new connections; open ones are served on.
    func stopAccepting() {
        guard accepting else { return }
        accepting = false
        loop.remove(listener.fd)
    }

    /// Closes every connection (after their pending responses, if they
    /// complete within the loop's remaining life).
    func closeAll() {
        flushDirty()
        for conn in Array(connections.values) { close(conn) }
    }

    // MARK: Accepting

    private func acceptAll() {
        while accepting {
            let fd = hs_accept(listener.fd)
            if fd < 0 {
                if errno == EINTR { continue }
                if errno != EAGAIN && errno != EWOULDBLOCK && errno != ECONNABORTED {
                    log.warning("accept_failed", ["errno": String(cString: strerror(errno))])
                }
                return
            }
            if connections.count >= limits.maxConnections {
                counters.refused += 1
                let error = RPCError.application(
                    code: 1007, reason: "overloaded", message: "too many connections",
                    extra: [("retry_after_ms", .int(1000))])
                let bytes = RPCResponse.frame(RPCResponse.failure(id: nil, error: error))
                _ = bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                Glibc.close(fd)
                continue
            }
            var uid: UInt32 = 0, gid: UInt32 = 0, pid: Int32 = 0
            if hs_peer_credentials(fd, &uid, &gid, &pid) != 0 {
                Glibc.close(fd)
                continue
            }
            let conn = Connection(
                id: nextID, fd: fd, context: CallContext(uid: uid, gid: gid, pid: pid),
                maxMessageBytes: limits.maxMessageBytes)
            nextID += 1
            do {
                try loop.add(fd, events: conn.events) { [self] events in handleEvents(conn, events) }
            } catch {
                Glibc.close(fd)
                continue
            }
            connections[conn.id] = conn
            counters.accepted += 1
            log.debug("connection_open", ["conn": String(conn.id), "uid": String(uid), "pid": String(pid)])
        }
    }

    // MARK: Connection events

    private func handleEvents(_ conn: Connection, _ events: UInt32) {
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

    private func readAvailable(_ conn: Connection) {
        var chunk = [UInt8](repeating: 0, count: 65536)
        // A bounded number of reads per wakeup keeps one busy client from starving others.
        for _ in 0..<4 {
            guard !conn.readClosed, !conn.closing, !conn.readPaused, !conn.backlogged else { break }
            let n = chunk.withUnsafeMutableBytes { recv(conn.fd, $0.baseAddress, $0.count, 0) }
            if n > 0 {
                conn.lastActivity = monotonicMilliseconds()
                chunk.withUnsafeBytes { conn.framer.append(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
                processFrames(conn)
                if n < chunk.count { break }
            } else if n == 0 {
                conn.readClosed = true
                while !conn.closing, connections[conn.id] != nil, let frame = conn.framer.finish() {
                    process(frame, conn)
                }
                updateInterest(conn)
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

    private func processFrames(_ conn: Connection) {
        var taken = 0
        while !conn.closing, connections[conn.id] != nil {
            if taken == limits.messagesPerTurn {
                // More may be buffered: continue next turn, after other clients.
                if !conn.backlogged {
                    conn.backlogged = true
                    backlog.append(conn.id)
                }
                return
            }
            guard let frame = conn.framer.next() else { return }
            taken += 1
            process(frame, conn)
            if conn.shouldPause(limits) {
                pauseReading(conn)
                return
            }
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
            if !conn.backlogged && !conn.readPaused { readAvailable(conn) }
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
            switch RPCMessage.decode(bytes) {
            case .single(let call):
                run(call, conn, batch: nil)
            case .batch(let calls):
                var batch: Int? = nil
                let expected = RPCMessage.batch(calls).expectedResponseCount
                if expected > 0 {
                    batch = conn.startBatch(expecting: expected)
                }
                for call in calls { run(call, conn, batch: batch) }
            }
        }
    }

    private func run(_ call: RPCCall, _ conn: Connection, batch: Int?) {
        counters.requests += 1
        switch call {
        case .failure(let failure):
            counters.errors += 1
            if let response = failure.response { emit(conn, response, batch: batch) }
        case .success(let request):
            conn.pending += 1
            let connID = conn.id
            let id = request.id
            handler.handle(request, context: conn.context) { [self] result in
                if loop.inLoop {
                    complete(connID, id: id, batch: batch, result)
                } else {
                    loop.execute { self.complete(connID, id: id, batch: batch, result) }
                }
            }
        }
    }

    private func complete(_ connID: UInt64, id: RPCID?, batch: Int?, _ result: Result<JSON, RPCError>) {
        guard let conn = connections[connID] else { return }
        conn.pending -= 1
        if case .failure = result { counters.errors += 1 }
        if let id {
            switch result {
            case .success(let value): emit(conn, RPCResponse.success(id: id, result: value), batch: batch)
            case .failure(let error): emit(conn, RPCResponse.failure(id: id, error: error), batch: batch)
            }
        }
        if conn.readPaused && !conn.shouldResume(limits) { return }
        if conn.readPaused { resumeReading(conn) }
        maybeClose(conn)
    }

    private func emit(_ conn: Connection, _ response: JSON, batch: Int?) {
        if let batch {
            if let bytes = conn.batches[batch]?.add(response) {
                conn.batches[batch] = nil
                enqueue(conn, bytes)
            }
        } else {
            enqueue(conn, RPCResponse.frame(response))
        }
    }

    // MARK: Writing

    private func enqueue(_ conn: Connection, _ bytes: [UInt8]) {
        if conn.output.isEmpty { conn.lastWriteProgress = monotonicMilliseconds() }
        conn.output.append(contentsOf: bytes)
        if !conn.dirty && !conn.waitingForWritable {
            conn.dirty = true
            dirty.append(conn.id)
        }
    }

    /// Writes what each connection has queued: one send per connection per
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
        while conn.outputOffset < conn.output.count {
            let n = conn.output.withUnsafeBytes {
                send(conn.fd, $0.baseAddress! + conn.outputOffset, $0.count - conn.outputOffset, Int32(MSG_NOSIGNAL))
            }
            if n > 0 {
                conn.outputOffset += n
                conn.lastWriteProgress = monotonicMilliseconds()
            } else if n < 0 && errno == EINTR {
                continue
            } else if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) {
                break
            } else {
                close(conn)
                return
            }
        }
        if conn.outputOffset == conn.output.count {
            conn.output.removeAll(keepingCapacity: conn.output.count < 65536)
            conn.outputOffset = 0
        } else if conn.outputOffset > 1 << 20 {
            conn.output.removeFirst(conn.outputOffset)
            conn.outputOffset = 0
        }
        let waiting = !conn.output.isEmpty
        if waiting != conn.waitingForWritable {
            conn.waitingForWritable = waiting
            updateInterest(conn)
        }
        if conn.readPaused && conn.shouldResume(limits) { resumeReading(conn) }
        maybeClose(conn)
    }

    // MARK: Flow control and closing

    private func pauseReading(_ conn: Connection) {
        conn.readPaused = true
        updateInterest(conn)
    }

    private func resumeReading(_ conn: Connection) {
        conn.readPaused = false
        updateInterest(conn)
        // Frames already buffered are processed now; the socket may have more.
        processFrames(conn)
        if !conn.readPaused { readAvailable(conn) }
    }

    private func updateInterest(_ conn: Connection) {
        guard connections[conn.id] != nil else { return }
        loop.modify(conn.fd, events: conn.events)
    }

    private func maybeClose(_ conn: Connection) {
        guard connections[conn.id] != nil else { return }
        let done = conn.pending == 0 && conn.output.isEmpty && conn.framer.bufferedByteCount == 0
        if conn.closing && conn.output.isEmpty {
            close(conn)
        } else if conn.readClosed && done {
            close(conn)
        }
    }

    private func close(_ conn: Connection) {
        guard connections.removeValue(forKey: conn.id) != nil else { return }
        loop.remove(conn.fd)
        Glibc.close(conn.fd)
        log.debug("connection_closed", ["conn": String(conn.id)])
    }

    private func sweep() {
        let now = monotonicMilliseconds()
        for conn in Array(connections.values) {
            if !conn.output.isEmpty && now - conn.lastWriteProgress > limits.stalledWriteTimeoutMs {
                log.info("connection_stalled", ["conn": String(conn.id), "unsent_bytes": String(conn.output.count - conn.outputOffset)])
                close(conn)
            } else if conn.pending == 0 && conn.output.isEmpty && now - conn.lastActivity > limits.idleTimeoutMs {
                log.debug("connection_idle", ["conn": String(conn.id)])
                close(conn)
            }
        }
    }
}

/// One client connection's state (loop thread only).
final class Connection {
    let id: UInt64
    let fd: Int32
    let context: CallContext
    var framer: JSONFramer
    var output: [UInt8] = []
    var outputOffset = 0
    var pending = 0
    var batches: [Int: BatchCollector] = [:]
    private var nextBatch = 0
    var readClosed = false
    /// Set after an oversized message: flush the error, then close.
    var closing = false
    var readPaused = false
    /// Complete messages are buffered beyond this turn's share.
    var backlogged = false
    var waitingForWritable = false
    var dirty = false
    var lastActivity = monotonicMilliseconds()
    var lastWriteProgress = monotonicMilliseconds()

    init(id: UInt64, fd: Int32, context: CallContext, maxMessageBytes: Int) {
        self.id = id
        self.fd = fd
        self.context = context
        framer = JSONFramer(maxMessageBytes: maxMessageBytes)
    }

    var events: UInt32 {
        var e: UInt32 = 0
        if !readClosed && !closing && !readPaused { e |= UInt32(EPOLLIN.rawValue) | UInt32(EPOLLRDHUP.rawValue) }
        if waitingForWritable { e |= UInt32(EPOLLOUT.rawValue) }
        return e
    }

    func startBatch(expecting count: Int) -> Int {
        nextBatch += 1
        batches[nextBatch] = BatchCollector(expecting: count)
        return nextBatch
    }

    func shouldPause(_ limits: ServerLimits) -> Bool {
        pending >= limits.maxPendingPerConnection || output.count - outputOffset >= limits.maxOutputBytes
    }

    func shouldResume(_ limits: ServerLimits) -> Bool {
        pending < limits.maxPendingPerConnection / 2 && output.count - outputOffset < limits.maxOutputBytes / 2
    }
}
