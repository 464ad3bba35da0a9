internal import CAres
internal import Foundation
internal import Glibc
import HeraldCore
import HeraldIO

/// A resolver that starts a lookup and is told when it ends: no thread waits
/// on a name server.
public protocol NonBlockingResolver: Sendable {
    /// Starts looking `host` up. `completion` is called once, later, on the
    /// resolver's own thread (it must not block), or at once from this call.
    func lookup(host: String, port: Int, completion: @escaping @Sendable (Result<[IPAddress], ResolverError>) -> Void)
}

/// Why the asynchronous resolver could not be set up.
public struct ResolverSetupError: Error, Sendable, CustomStringConvertible {
    public let description: String
}

/// Name lookups with c-ares on one thread of its own: every query is a UDP
/// exchange on that thread's event loop, so a name server that never answers
/// costs an entry in a table until the query's timeout, not a thread.
///
/// Like the C library it reads /etc/resolv.conf and /etc/nsswitch.conf
/// (`hosts:` files and dns, in their order) at start and /etc/hosts at every
/// lookup. Each name server is asked once and given `timeout` (2 s), whatever
/// resolv.conf's `timeout` and `attempts` say (glibc would wait their
/// product), so a query that is never answered ends after `timeout` times the
/// name servers.
public final class AresResolver: NonBlockingResolver, HostResolver {
    /// How long a query waits for each name server.
    public let timeoutMs: Int64
    private let engine: Engine

    /// `servers` (`ip[:port]`, comma-separated) replaces resolv.conf's name servers (for tests).
    public init(timeout: Duration = .seconds(2), servers: String? = nil) throws(ResolverSetupError) {
        timeoutMs = max(1, timeout.wholeMilliseconds)
        guard Self.libraryReady else { throw ResolverSetupError(description: "ares_library_init failed") }
        let loop: EventLoop
        do {
            loop = try EventLoop()
        } catch {
            throw ResolverSetupError(description: "event loop: \(error)")
        }
        let nsswitch = FileManager.default.contents(atPath: "/etc/nsswitch.conf").map {
            String(decoding: $0, as: UTF8.self)
        }
        engine = try Engine(
            loop: loop, timeoutMs: timeoutMs,
            readsHostsFile: Self.hostsFileIsSource(nsswitch: nsswitch), servers: servers)
        let engine = self.engine
        let thread = Thread {
            engine.loop.every(milliseconds: 50) { engine.processTimeouts() }
            engine.loop.run()
            engine.loop.shutdown()
        }
        thread.name = "herald-dns"
        thread.start()
    }

    deinit {
        engine.stop()
    }

    /// Queries started and not yet ended (c-ares's own timeout included).
    public var outstanding: Int { engine.outstanding.withLock { $0 } }

    public func lookup(
        host: String, port: Int, completion: @escaping @Sendable (Result<[IPAddress], ResolverError>) -> Void
    ) {
        guard !host.isEmpty, !host.utf8.contains(0) else {
            completion(.failure(.notFound(host: host)))
            return
        }
        engine.outstanding.withLock { $0 += 1 }
        let engine = self.engine
        engine.loop.execute { engine.start(host: host, completion: completion) }
    }

    /// Blocks the caller until the lookup ends (never call it on this resolver's thread).
    public func resolve(host: String, port: Int) throws -> [IPAddress] {
        let box = Locked<Result<[IPAddress], ResolverError>?>(nil)
        let done = DispatchSemaphore(value: 0)
        lookup(host: host, port: port) { result in
            box.withLock { $0 = result }
            done.signal()
        }
        done.wait()
        return try box.withLock { $0! }.get()
    }

    private static let libraryReady: Bool = ares_library_init(ARES_LIB_INIT_ALL) == ARES_SUCCESS

    /// Whether nsswitch.conf's `hosts:` line names `files` (c-ares reads it
    /// the same way; without the file or the line it reads /etc/hosts first).
    static func hostsFileIsSource(nsswitch: String?) -> Bool {
        guard let nsswitch else { return true }
        for line in nsswitch.split(whereSeparator: \.isNewline) {
            let words = line.split(whereSeparator: { $0 == " " || $0 == "\t" })
            guard words.first == "hosts:" else { continue }
            return words.dropFirst().contains("files")
        }
        return true
    }

    /// The channel and its sockets; touched on the loop thread only (and in `init`, before it runs).
    // @unchecked: `channel` and `interest` are touched on the resolver's loop thread only (and in init, before the loop runs); `outstanding` is a Locked.
    private final class Engine: @unchecked Sendable {
        let loop: EventLoop
        let timeoutMs: Int64
        /// Whether /etc/hosts is a source: c-ares answers `localhost` from it
        /// and never asks a name server for it (RFC 6761).
        let readsHostsFile: Bool
        let outstanding = Locked(0)
        private var channel: ares_channel?
        private var interest: [Int32: UInt32] = [:]

        init(
            loop: EventLoop, timeoutMs: Int64, readsHostsFile: Bool, servers: String?
        ) throws(ResolverSetupError) {
            self.loop = loop
            self.timeoutMs = timeoutMs
            self.readsHostsFile = readsHostsFile
            var options = ares_options()
            options.tries = 1
            // One try per name server, of the whole timeout (a retransmission within it
            // would come when the callers have already been told).
            options.timeout = Int32(clamping: timeoutMs)
            options.sock_state_cb = { data, fd, readable, writable in
                guard let data else { return }
                Unmanaged<Engine>.fromOpaque(data).takeUnretainedValue()
                    .socketChanged(fd, readable: readable != 0, writable: writable != 0)
            }
            // The engine outlives the channel: `stop` destroys the channel first.
            options.sock_state_cb_data = Unmanaged.passUnretained(self).toOpaque()
            let mask = ARES_OPT_TRIES | ARES_OPT_TIMEOUTMS | ARES_OPT_SOCK_STATE_CB
            var made: ares_channel?
            let rc = ares_init_options(&made, &options, mask)
            guard rc == ARES_SUCCESS, made != nil else {
                throw ResolverSetupError(description: String(cString: ares_strerror(rc)))
            }
            if let servers {
                let rc = ares_set_servers_ports_csv(made, servers)
                guard rc == ARES_SUCCESS else {
                    ares_destroy(made)
                    throw ResolverSetupError(description: "servers \(servers): \(String(cString: ares_strerror(rc)))")
                }
            }
            channel = made
        }

        func stop() {
            loop.execute { [self] in
                // Queries still running end with ARES_EDESTRUCTION: their callers hear of it.
                if let channel { ares_destroy(channel) }
                channel = nil
                loop.stop()
            }
        }

        func start(host: String, completion: @escaping @Sendable (Result<[IPAddress], ResolverError>) -> Void) {
            guard let channel else {
                finish(.failure(.failed(host: host, reason: "resolver stopped")), completion)
                return
            }
            var hints = ares_addrinfo_hints()
            hints.ai_family = AF_UNSPEC
            // No RFC 6724 sorting (a socket per address): the callers sort and vet.
            hints.ai_flags = ARES_AI_NOSORT
            let query = Query(engine: self, host: host, completion: completion)
            // With DNS alone (`hosts: dns`) glibc asks the name server for `localhost`;
            // c-ares does so only for the absolute name.
            let name = host == "localhost" && !readsHostsFile ? "localhost." : host
            ares_getaddrinfo(channel, name, nil, &hints, Self.answered, Unmanaged.passRetained(query).toOpaque())
        }

        private static let answered: ares_addrinfo_callback = { arg, status, _, info in
            guard let arg else { return }
            let query = Unmanaged<Query>.fromOpaque(arg).takeRetainedValue()
            defer { if let info { ares_freeaddrinfo(info) } }
            let host = query.host
            let result: Result<[IPAddress], ResolverError>
            switch status {
            case ARES_SUCCESS:
                let nodes = sequence(first: info?.pointee.nodes) { $0?.pointee.ai_next }.lazy.compactMap { $0 }
                let addresses = IPAddress.distinct(nodes.compactMap { IPAddress(socketAddress: $0.pointee.ai_addr) })
                result = addresses.isEmpty ? .failure(.notFound(host: host)) : .success(addresses)
            case ARES_ENOTFOUND, ARES_ENODATA, ARES_ENONAME:
                result = .failure(.notFound(host: host))
            case ARES_ETIMEOUT:
                result = .failure(.failed(host: host, reason: "no answer within \(query.engine.timeoutMs) ms"))
            default:
                result = .failure(.failed(host: host, reason: String(cString: ares_strerror(status))))
            }
            query.engine.finish(result, query.completion)
        }

        private func finish(
            _ result: Result<[IPAddress], ResolverError>,
            _ completion: @Sendable (Result<[IPAddress], ResolverError>) -> Void
        ) {
            outstanding.withLock { $0 -= 1 }
            completion(result)
        }

        func processTimeouts() {
            guard let channel else { return }
            ares_process_fd(channel, ARES_SOCKET_BAD, ARES_SOCKET_BAD)
        }

        private func socketChanged(_ fd: Int32, readable: Bool, writable: Bool) {
            let events =
                (readable ? PollEvents.readable : 0) | (writable ? PollEvents.writable : 0)
            let old = interest[fd]
            if events == 0 {
                if old != nil { loop.remove(fd) }
                interest[fd] = nil
                return
            }
            interest[fd] = events
            if old != nil {
                loop.modify(fd, events: events)
                return
            }
            do {
                try loop.add(fd, events: events) { [unowned self] ready in
                    guard let channel else { return }
                    let error = ready & (PollEvents.error | PollEvents.hangup) != 0
                    let r = ready & PollEvents.readable != 0 || error ? fd : ARES_SOCKET_BAD
                    let w = ready & PollEvents.writable != 0 ? fd : ARES_SOCKET_BAD
                    ares_process_fd(channel, r, w)
                }
            } catch {
                // Not watched: the query on it ends at its timeout.
                interest[fd] = nil
            }
        }
    }

    private final class Query {
        let engine: Engine
        let host: String
        let completion: @Sendable (Result<[IPAddress], ResolverError>) -> Void

        init(engine: Engine, host: String, completion: @escaping @Sendable (Result<[IPAddress], ResolverError>) -> Void)
        {
            self.engine = engine
            self.host = host
            self.completion = completion
        }
    }
}
