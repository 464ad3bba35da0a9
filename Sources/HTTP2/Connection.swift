import CHeraldH2
import HeraldIO
import HeraldNet

#if canImport(Glibc)
    import Glibc
#endif

// C callbacks of herald_h2: they only record what happened; the connection
// acts on it after hh2_conn_read returns (nghttp2 must not be re-entered).
private func connection(_ ctx: UnsafeMutableRawPointer?) -> Connection {
    Unmanaged<Connection>.fromOpaque(ctx!).takeUnretainedValue()
}

private let onSettings: @convention(c) (UnsafeMutableRawPointer?, UInt32) -> Void = { ctx, max in
    connection(ctx).events.append(.settings(max))
}

private let onGoAway: @convention(c) (UnsafeMutableRawPointer?, Int32, UInt32, UnsafePointer<UInt8>?, Int) -> Void = {
    ctx, last, code, data, len in
    let debug = data.map { Array(UnsafeBufferPointer(start: $0, count: len)) } ?? []
    connection(ctx).events.append(.goAway(lastStream: last, code: code, debug: debug))
}

private let onPingAck: @convention(c) (UnsafeMutableRawPointer?) -> Void = { ctx in
    connection(ctx).events.append(.pingAck)
}

private let onResponse: @convention(c) (UnsafeMutableRawPointer?, UnsafePointer<hh2_response>?) -> Void = { ctx, r in
    guard let r = r?.pointee else { return }
    let headers = r.headers.map {
        String(decoding: UnsafeRawBufferPointer(start: $0, count: r.headers_len), as: UTF8.self)
    }
    let body = r.body.map { Array(UnsafeBufferPointer(start: $0, count: r.body_len)) } ?? []
    connection(ctx).events.append(
        .response(stream: r.stream_id, status: Int(r.status), code: r.error_code, headers: headers ?? "", body: body))
}

/// One HTTP/2 connection of a lane. Loop thread only.
// @unchecked: loop thread only (the client's event loop), like the nghttp2 session it drives and the Pendings on its streams.
final class Connection: @unchecked Sendable {
    enum Event {
        case settings(UInt32)
        case goAway(lastStream: Int32, code: UInt32, debug: [UInt8])
        case pingAck
        case response(stream: Int32, status: Int, code: UInt32, headers: String, body: [UInt8])
    }

    private enum Phase { case resolving, connecting, handshaking, awaitingSettings, open, finished }

    let id: Int
    unowned let lane: Lane
    var events: [Event] = []
    private var phase = Phase.resolving
    private var fd: Int32 = -1
    private var registered = false
    private var handle: OpaquePointer?
    private var addresses: [String] = []
    private var nextAddress = 0
    private var streams: [Int32: Pending] = [:]
    private var maxStreams = 1
    /// Monotonic ms of the first answer on this connection.
    private var firstAnswerAt: Int64?
    /// No new streams: GOAWAY received, or the connection is being retired.
    private(set) var draining = false
    private var goAwayLastStream: Int32?
    private var goAwayReason: String?
    private var token: BearerToken?
    /// Wall-clock ms since this connection uses `token`.
    private var tokenSince: Int64 = 0
    private let startedAt = monotonicMilliseconds()
    private var lastRead = monotonicMilliseconds()
    /// Monotonic ms of the last stream opened or finished.
    private var lastStreamAt = monotonicMilliseconds()
    private var pingSentAt: Int64?
    /// PINGs sent and not yet acknowledged (the server acknowledges them in order).
    private var pingsInFlight = 0
    /// Monotonic ms since which the connection is suspected dead: a request
    /// timed out on it. It takes no new streams until its PING is answered
    /// (and, when its sending had stalled on flow control, the window has
    /// reopened), and is closed at `suspectSince + pingTimeout` otherwise.
    private var suspectSince: Int64?
    /// Acknowledgements still owed before the suspicion PING's own.
    private var suspectAcksOwed = 0
    private var suspectPingAnswered = false
    /// A request timed out with its body held back by flow control.
    private var flowStalled = false
    private var interest: UInt32 = 0

    init(id: Int, lane: Lane) {
        self.id = id
        self.lane = lane
    }

    var isReady: Bool { phase == .open }

    /// Past the warm-up: the server raised a one-stream limit, or had half a
    /// second after the first answer to do so. Only then does "full" mean
    /// the lane needs another connection.
    var isWarm: Bool {
        maxStreams > 1 || firstAnswerAt.map { monotonicMilliseconds() - $0 >= 500 } ?? false
    }

    /// Open for two seconds without a single answer (a hung first push):
    /// another connection may carry the queue meanwhile.
    var isStuckWarmingUp: Bool {
        phase == .open && firstAnswerAt == nil && monotonicMilliseconds() - startedAt >= 2000
    }
    var isFinished: Bool { phase == .finished }
    var freeSlots: Int { max(0, maxStreams - streams.count) }
    /// Requests on streams, waiting for their answers.
    var inFlight: Int { streams.count }
    /// A request timed out on it and it has not yet shown it is alive.
    var isSuspect: Bool { suspectSince != nil }
    var canTakeStream: Bool {
        phase == .open && !draining && suspectSince == nil && freeSlots > 0
            && (token != nil || lane.options.tokens == nil)
            && handle.map { hh2_conn_accepts_streams($0) != 0 } ?? false
    }

    private var client: HTTP2Client { lane.client }
    private var fields: KeyValuePairs<String, String> { ["lane": lane.key.description, "conn": String(id)] }

    // MARK: Connecting

    func start() {
        let endpoint = lane.endpoint
        if let pinned = endpoint.addresses, !pinned.isEmpty {
            connect(to: pinned)
            return
        }
        if IPAddress(literal: endpoint.host) != nil {
            connect(to: [endpoint.host])
            return
        }
        let resolved: @Sendable (Result<[String], any Error>) -> Void = { [self, client] result in
            client.loop.execute { [self] in
                guard phase == .resolving else { return }
                switch result {
                case .success(let list) where !list.isEmpty: connect(to: list)
                case .success: failed(.dnsFailure("\(endpoint.host) has no address"))
                case .failure(let error): failed(.dnsFailure("\(endpoint.host): \(error)"))
                }
            }
        }
        if let lookup = lane.settings.lookup {
            lookup(endpoint.host, endpoint.port, resolved)
            return
        }
        let resolver = lane.settings.resolver
        client.resolverQueue.async { resolved(Result { try resolver(endpoint.host, endpoint.port) }) }
    }

    private func connect(to list: [String]) {
        addresses = list
        nextAddress = 0
        tryNextAddress(lastError: nil)
    }

    private func tryNextAddress(lastError: String?) {
        phase = .connecting
        while nextAddress < addresses.count {
            let address = addresses[nextAddress]
            nextAddress += 1
            var inProgress: Int32 = 0
            let rc = hh2_tcp_connect(address, Int32(lane.endpoint.port), &inProgress)
            if rc < 0 {
                continue
            }
            fd = rc
            do {
                try client.loop.add(fd, events: PollEvents.writable) { [self] events in handleEvents(events) }
                registered = true
                interest = PollEvents.writable
            } catch {
                Glibc.close(fd)
                fd = -1
                continue
            }
            if inProgress == 0 { startTLS() }
            return
        }
        failed(
            .connectFailed(
                "\(lane.endpoint.host):\(lane.endpoint.port): \(lastError ?? "no address accepted the connection")"))
    }

    private func connectFinished() {
        let err = hh2_socket_error(fd)
        guard err == 0 else {
            unregister()
            Glibc.close(fd)
            fd = -1
            tryNextAddress(lastError: String(cString: strerror(err)))
            return
        }
        startTLS()
    }

    private func startTLS() {
        var callbacks = hh2_callbacks(
            on_settings: onSettings, on_goaway: onGoAway, on_ping_ack: onPingAck, on_response: onResponse)
        var err = [CChar](repeating: 0, count: 256)
        let ctx = Unmanaged.passUnretained(self).toOpaque()
        let host = lane.endpoint.host
        let hostIsAddress: Int32 = IPAddress(literal: host) != nil ? 1 : 0
        let created = hh2_conn_new(client.tls.handle, fd, host, hostIsAddress, &callbacks, ctx, &err, err.count)
        guard let created else {
            unregister()
            fd = -1  // closed by hh2_conn_new
            failed(.tls(String(cBuffer: err)))
            return
        }
        handle = created
        phase = .handshaking
        handshake()
    }

    private func handshake() {
        guard let handle else { return }
        let rc = hh2_conn_handshake(handle)
        if rc > 0 {
            setInterest(read: rc & HH2_WANT_READ != 0, write: rc & HH2_WANT_WRITE != 0)
            return
        }
        if rc < 0 {
            failed(error(for: rc, during: true))
            return
        }
        phase = .awaitingSettings
        if lane.options.tokens != nil {
            token = lane.currentToken()
            tokenSince = client.clock.nowMilliseconds()
            if token == nil {
                failed(.connectFailed("cannot sign a bearer token"))
                return
            }
        }
        readAndProcess()
    }

    // MARK: I/O

    private func handleEvents(_ events: UInt32) {
        switch phase {
        case .connecting:
            connectFinished()
        case .handshaking:
            handshake()
        case .awaitingSettings, .open:
            if events & (PollEvents.readable | PollEvents.hangup | PollEvents.error) != 0 {
                readAndProcess()
            } else {
                flush()
            }
        case .resolving, .finished:
            break
        }
    }

    private func readAndProcess() {
        readAgainQueued = false
        guard let handle else { return }
        let rc = hh2_conn_read(handle)
        lastRead = monotonicMilliseconds()
        pingSentAt = nil  // any frame proves the connection alive
        let pending = events
        events.removeAll()
        process(pending)
        guard phase != .finished else { return }
        if rc < 0 {
            failed(error(for: rc, during: phase != .open))
            return
        }
        lane.pump()
        flush()
        // The read stopped at its budget: the rest after the loop's turn, so
        // that a peer that never stops sending cannot hold the loop. (The
        // flush may have ended the connection and freed its handle: asked
        // of the handle still held, if any.)
        if let live = self.handle, phase != .finished, hh2_conn_read_more(live) != 0, !readAgainQueued {
            readAgainQueued = true
            client.loop.execute { [self] in
                if phase == .open || phase == .awaitingSettings { readAndProcess() } else { readAgainQueued = false }
            }
        }
    }

    /// A read that stopped at its budget is queued to go on (see ``readAndProcess()``).
    private var readAgainQueued = false
    /// GOAWAY frames this connection received (the first is logged, the
    /// number when the connection ends).
    private var goAwaysReceived = 0

    /// Streams opened since the last flush: counted (and the idle clock
    /// reset) once per flush, not per request.
    private var submittedSinceFlush = 0

    /// Writes what the session has queued and updates the poll interest.
    func flush() {
        if submittedSinceFlush > 0 {
            let n = submittedSinceFlush
            submittedSinceFlush = 0
            lastStreamAt = monotonicMilliseconds()
            client.count { $0.requestsSent += n }
        }
        guard let handle, phase == .open || phase == .awaitingSettings else { return }
        let rc = hh2_conn_write(handle)
        if rc < 0 {
            failed(error(for: rc, during: phase != .open))
            return
        }
        let wants = hh2_conn_wants(handle)
        if wants == 0 {
            // Both sides are done (after a GOAWAY): the session is over.
            finishStreams(.connectionReset("connection closed by the server"))
            teardown()
            lane.connectionClosed(self)
            return
        }
        setInterest(read: wants & HH2_WANT_READ != 0, write: wants & HH2_WANT_WRITE != 0)
        if draining && streams.isEmpty {
            retire()
        }
    }

    private func setInterest(read: Bool, write: Bool) {
        var e: UInt32 = 0
        if read { e |= PollEvents.readInterest }
        if write { e |= PollEvents.writable }
        guard registered, e != interest else { return }
        interest = e
        client.loop.modify(fd, events: e)
    }

    // MARK: Frames

    private func process(_ list: [Event]) {
        for event in list {
            switch event {
            case .settings(let max):
                maxStreams = Int(max)
                if phase == .awaitingSettings {
                    phase = .open
                    client.count {
                        $0.connectionsOpen += 1
                        $0.connectionsOpened += 1
                    }
                    client.log?.info("http2_connected", fields)
                    lane.connectionReady(self)
                }
            case .goAway(let last, let code, let debug):
                goAway(lastStream: last, code: code, debug: debug)
            case .pingAck:
                pingSentAt = nil
                pingsInFlight = max(0, pingsInFlight - 1)
                if suspectSince != nil, suspectAcksOwed > 0 {
                    suspectAcksOwed -= 1
                    if suspectAcksOwed == 0 {
                        suspectPingAnswered = true
                        clearSuspicionIfAlive()
                    }
                }
            case .response(let stream, let status, let code, let headers, let body):
                response(stream: stream, status: status, code: code, headers: headers, body: body)
            }
        }
    }

    private func goAway(lastStream: Int32, code: UInt32, debug: [UInt8]) {
        draining = true
        goAwayLastStream = lastStream
        let reason = lane.options.goAwayReason?(debug)
        goAwayReason = reason
        client.count {
            $0.goaways += 1
            if let reason { $0.lastGoAwayReason = reason }
        }
        goAwaysReceived += 1
        // One line for a connection's first GOAWAY; those after it (a server
        // may send several, a hostile one thousands) are counted, and said
        // once, with their number, when the connection ends.
        if goAwaysReceived == 1 {
            client.log?.warning(
                "http2_goaway",
                [
                    "lane": lane.key.description, "conn": String(id), "error_code": String(code),
                    "last_stream": String(lastStream), "reason": reason ?? "",
                ])
        }
        // Streams above the last one were never processed: send them elsewhere.
        for (sid, pending) in streams where sid > lastStream {
            streams[sid] = nil
            lane.requeue(pending, reason: .goAway(reason: reason))
        }
    }

    private func response(stream: Int32, status: Int, code: UInt32, headers: String, body: [UInt8]) {
        guard let pending = streams.removeValue(forKey: stream) else { return }  // cancelled at its deadline
        lastStreamAt = monotonicMilliseconds()
        guard status > 0 else {
            if code == HH2_REFUSED_STREAM {
                lane.requeue(pending, reason: .refusedStream)
            } else if let last = goAwayLastStream, stream > last {
                lane.requeue(pending, reason: .goAway(reason: goAwayReason))
            } else {
                pending.finish(.failure(.connectionReset("stream closed with HTTP/2 error \(code)")))
            }
            return
        }
        if firstAnswerAt == nil { firstAnswerAt = monotonicMilliseconds() }
        let answer = HTTP2Response(status: status, headerBlock: headers, body: body)
        switch lane.options.judge?(answer) ?? .keep {
        case .keep:
            break
        case .retire:
            draining = true
        case .retireAndRenewToken:
            if let token { lane.tokenRejected(token.value) }
            draining = true
        }
        pending.finish(.success(answer))
    }

    // MARK: Streams

    /// Opens a stream for `pending` (the caller flushes afterwards).
    func submit(_ pending: Pending) {
        guard let handle else {
            lane.requeue(pending, reason: .connectionReset("connection not ready"))
            return
        }
        var all: [(name: String, value: String)] = []
        if let tokens = lane.options.tokens {
            guard var current = token else {
                lane.requeue(pending, reason: .connectionReset("connection not ready"))
                return
            }
            let now = client.clock.nowMilliseconds()
            if now - current.issuedAt >= tokens.refresh.wholeMilliseconds,
                now - tokenSince >= tokens.minimumInterval.wholeMilliseconds, let fresh = lane.currentToken()
            {
                current = fresh
                token = fresh
                tokenSince = now
            }
            all.append(("authorization", current.header))
        }
        let request = pending.request
        all.append(contentsOf: request.headers)
        // Every name and value NUL-terminated in one buffer (nghttp2 copies
        // them at submit): one allocation per request, not two per field.
        var size = 0
        for (name, value) in all { size += name.utf8.count + value.utf8.count + 2 }
        var storage: [CChar] = []
        storage.reserveCapacity(size)
        var offsets: [(name: Int, value: Int)] = []
        offsets.reserveCapacity(all.count)
        for (name, value) in all {
            let n = storage.count
            for b in name.utf8 { storage.append(CChar(bitPattern: b)) }
            storage.append(0)
            let v = storage.count
            for b in value.utf8 { storage.append(CChar(bitPattern: b)) }
            storage.append(0)
            offsets.append((n, v))
        }
        let sid = storage.withUnsafeBufferPointer { text -> Int32 in
            let base = text.baseAddress!
            let headers = offsets.map { hh2_header(name: base + $0.name, value: base + $0.value) }
            return request.body.withUnsafeBufferPointer { body in
                hh2_conn_submit(
                    handle, request.method, request.path, lane.endpoint.authority, headers, headers.count,
                    body.baseAddress, body.count, 0)
            }
        }
        if sid > 0 {
            streams[sid] = pending
            submittedSinceFlush += 1
        } else if sid == HH2_ERR_REFUSED {
            draining = true
            lane.requeue(pending, reason: .goAway(reason: goAwayReason))
        } else {
            pending.finish(
                .failure(.connectionReset("cannot open a stream: \(String(cString: hh2_conn_error(handle)))")))
        }
    }

    // MARK: Timers

    func sweep(now: Int64) {
        let settings = lane.settings
        switch phase {
        case .resolving, .connecting, .handshaking, .awaitingSettings:
            if now - startedAt >= settings.connectTimeout.wholeMilliseconds {
                failed(.timeout("no HTTP/2 session within \(settings.connectTimeout)"))
            }
        case .open:
            guard let handle else { return }
            var wrote = false
            var late: [Pending] = []
            for (sid, pending) in streams where now >= pending.deadline {
                // Asked before the cancel frees the stream: did flow control hold its body back?
                if hh2_conn_stream_blocked(handle, sid) != 0 { flowStalled = true }
                streams[sid] = nil
                _ = hh2_conn_cancel(handle, sid)
                wrote = true
                late.append(pending)
            }
            if let since = suspectSince {
                clearSuspicionIfAlive()
                if suspectSince != nil, now - since >= settings.pingTimeout.wholeMilliseconds {
                    finishLate(late)
                    closeSilent()
                    return
                }
            } else if !late.isEmpty {
                // Suspected before the late requests are reported, so that no retry of
                // theirs can land here.
                suspect(now: now)
            }
            finishLate(late)
            if streams.isEmpty, let idle = lane.options.idleTimeout, now - lastStreamAt >= idle.wholeMilliseconds {
                retire()
                return
            }
            if let sent = pingSentAt {
                if now - sent >= settings.pingTimeout.wholeMilliseconds {
                    closeSilent()
                    return
                }
            } else if now - lastRead >= settings.pingInterval.wholeMilliseconds, hh2_conn_ping(handle) == HH2_OK {
                pingSentAt = now
                pingsInFlight += 1
                wrote = true
                client.count { $0.pings += 1 }
            }
            if wrote || (draining && streams.isEmpty) { flush() }
        case .finished:
            break
        }
    }

    private func finishLate(_ late: [Pending]) {
        guard !late.isEmpty else { return }
        let timeout = lane.settings.requestTimeout
        client.count { $0.timeouts += late.count }
        for pending in late { pending.finish(.failure(.timeout("no answer within \(timeout)"))) }
    }

    // MARK: Silence

    /// A request timed out here: the server may have gone silent (a dead
    /// peer, half-open TCP, a NAT that dropped the flow, a window that never
    /// reopens). Take no new streams and ask for a PING at once.
    private func suspect(now: Int64) {
        guard let handle else { return }
        suspectSince = now
        suspectPingAnswered = false
        client.count { $0.connectionsSuspect += 1 }
        if hh2_conn_ping(handle) == HH2_OK {
            pingsInFlight += 1
            client.count { $0.pings += 1 }
        }
        // Unanswered earlier PINGs are acknowledged first; a failed submit
        // leaves nothing to wait for, and the connection closes at the deadline.
        suspectAcksOwed = pingsInFlight
        client.log?.warning(
            "http2_connection_suspect",
            [
                "lane": lane.key.description, "conn": String(id), "ping_timeout": "\(lane.settings.pingTimeout)",
                "flow_stalled": String(flowStalled),
            ])
    }

    /// Ends the suspicion once the PING came back and, when a request had
    /// stalled on flow control, the server has opened the window again.
    private func clearSuspicionIfAlive() {
        guard suspectSince != nil, suspectPingAnswered, let handle else { return }
        if flowStalled && hh2_conn_send_window(handle) <= 0 { return }
        suspectSince = nil
        suspectPingAnswered = false
        flowStalled = false
        client.count { $0.connectionsSuspect -= 1 }
        client.log?.info("http2_connection_alive", fields)
        // A replacement may have opened meanwhile: keep the lane within its size.
        let active = lane.connections.count { $0.isReady && !$0.draining && !$0.isSuspect }
        if active > lane.settings.maxConnectionsPerLane { draining = true }
    }

    /// The suspicion PING went unanswered (or the window stayed shut) for
    /// `pingTimeout`: close the connection. Its unanswered requests go back
    /// to the lane's queue, for another connection, until their deadline.
    private func closeSilent() {
        let why =
            suspectPingAnswered
            ? "flow-control window not reopened within \(lane.settings.pingTimeout)"
            : "PING not answered within \(lane.settings.pingTimeout)"
        client.count { $0.silentConnectionsClosed += 1 }
        client.log?.warning(
            "http2_connection_silent",
            ["lane": lane.key.description, "conn": String(id), "error": why, "unanswered": String(streams.count)])
        let open = streams.sorted { $0.key < $1.key }.map(\.value)
        streams.removeAll()
        teardown()
        for pending in open.reversed() { lane.requeue(pending, reason: .connectionReset(why)) }
        lane.connectionClosed(self)
    }

    // MARK: Ending

    /// A connection that may carry no more: closed once its streams finish.
    private func retire() {
        guard phase != .finished else { return }
        client.log?.info("http2_connection_retired", fields)
        teardown()
        lane.connectionClosed(self)
    }

    /// The connection broke: its streams fail with `error`.
    private func failed(_ error: HTTP2ClientError) {
        guard phase != .finished else { return }
        let wasReady = phase == .open
        finishStreams(error)
        teardown()
        if wasReady {
            client.log?.warning(
                "http2_connection_failed",
                ["lane": lane.key.description, "conn": String(id), "error": error.description])
            lane.connectionClosed(self)
        } else {
            lane.connectionFailed(self, error)
        }
    }

    /// Closes a connection that carries nothing (its lane is retired to keep
    /// the client within its lane bound).
    func closeUnused() {
        guard phase != .finished, streams.isEmpty else { return }
        client.log?.info("http2_connection_retired", fields)
        teardown()
        lane.connectionClosed(self)
    }

    /// Ends the connection at once (client shutdown).
    func abort(_ error: HTTP2ClientError) {
        finishStreams(error)
        teardown()
    }

    private func finishStreams(_ error: HTTP2ClientError) {
        let open = streams
        streams.removeAll()
        for (_, pending) in open { pending.finish(.failure(error)) }
    }

    private func teardown() {
        if goAwaysReceived > 1 {
            client.log?.warning(
                "http2_goaway_repeated",
                ["lane": lane.key.description, "conn": String(id), "goaways": String(goAwaysReceived)])
            goAwaysReceived = 0
        }
        if phase == .open { client.count { $0.connectionsOpen -= 1 } }
        if suspectSince != nil {
            suspectSince = nil
            client.count { $0.connectionsSuspect -= 1 }
        }
        phase = .finished
        unregister()
        if let handle {
            hh2_conn_free(handle)  // closes fd
            self.handle = nil
        } else if fd >= 0 {
            Glibc.close(fd)
        }
        fd = -1
    }

    private func unregister() {
        if registered {
            client.loop.remove(fd)
            registered = false
            interest = 0
        }
    }

    private func error(for rc: Int32, during connecting: Bool) -> HTTP2ClientError {
        let message = handle.map { String(cString: hh2_conn_error($0)) } ?? "error \(rc)"
        switch rc {
        case HH2_ERR_TLS: return .tls(message)
        case HH2_ERR_ALPN: return .noHTTP2(message)
        case HH2_ERR_EOF, HH2_ERR_IO: return connecting ? .connectFailed(message) : .connectionReset(message)
        default: return .connectionReset(message)
        }
    }
}
