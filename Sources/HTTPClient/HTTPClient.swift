import CHeraldCurl
import CHeraldSys
import Dispatch
import Foundation
import HeraldIO

#if canImport(Glibc)
    import Glibc
#endif

/// A small HTTP client over libcurl: one multi handle, driven by one dedicated thread.
///
/// - Connections are reused and HTTP/2 streams are multiplexed (`CURLPIPE_MULTIPLEX`,
///   `CURLOPT_PIPEWAIT`), with at most ``Configuration/maxConnectionsPerHost`` connections per host.
/// - Certificate and host name verification are always on. Redirects are never followed
///   (a 3xx is returned as a response). Proxies from the environment are ignored.
/// - Only `https` is allowed, plus `http` to loopback hosts when
///   ``Configuration/allowPlainHTTPToLoopback`` is set (tests only).
/// - Response bodies are capped at ``Configuration/maxResponseBodyBytes``; a larger body aborts
///   the transfer with ``HTTPError/bodyTooLarge(limit:)`` (no truncated success).
/// - Completion handlers run on the client's network thread: they must not block. They may call
///   ``send(_:completion:)`` again.
public final class HTTPClient: Sendable {
    public struct Configuration: Sendable {
        /// An extra PEM file of trusted CAs (`CURLOPT_CAINFO`), trusted next to the system
        /// store (`/etc/ssl/certs` as `CURLOPT_CAPATH`). `nil`: libcurl's system default.
        public var caFile: String?
        /// At most this many connections per host (`CURLMOPT_MAX_HOST_CONNECTIONS`).
        public var maxConnectionsPerHost: Int
        /// At most this many connections in total (`CURLMOPT_MAX_TOTAL_CONNECTIONS`); 0: no limit.
        public var maxTotalConnections: Int
        /// At most this many concurrent HTTP/2 streams per connection (`CURLMOPT_MAX_CONCURRENT_STREAMS`).
        public var maxConcurrentStreams: Int
        /// Response bodies larger than this fail with ``HTTPError/bodyTooLarge(limit:)``.
        public var maxResponseBodyBytes: Int
        /// Allow `http://` to loopback hosts (127.0.0.0/8, ::1, localhost). For tests.
        public var allowPlainHTTPToLoopback: Bool

        public init(
            caFile: String? = nil,
            maxConnectionsPerHost: Int = 2,
            maxTotalConnections: Int = 0,
            maxConcurrentStreams: Int = 100,
            maxResponseBodyBytes: Int = 64 * 1024,
            allowPlainHTTPToLoopback: Bool = false
        ) {
            self.caFile = caFile
            self.maxConnectionsPerHost = maxConnectionsPerHost
            self.maxTotalConnections = maxTotalConnections
            self.maxConcurrentStreams = maxConcurrentStreams
            self.maxResponseBodyBytes = maxResponseBodyBytes
            self.allowPlainHTTPToLoopback = allowPlainHTTPToLoopback
        }
    }

    /// curl_global_init, once per process (Swift static lets are initialised thread-safely).
    private static let globalInit: Int32 = herald_curl_global_init()

    public let configuration: Configuration
    private let engine: Engine

    public init(configuration: Configuration = Configuration()) throws(HTTPError) {
        let rc = HTTPClient.globalInit
        if rc != 0 {
            throw .other(code: Int(rc), message: "curl_global_init failed")
        }
        self.configuration = configuration
        guard let multi = curl_multi_init() else {
            throw .other(code: -1, message: "curl_multi_init failed")
        }
        _ = herald_curl_multi_setopt_long(multi, CURLMOPT_PIPELINING, herald_curl_pipe_multiplex())
        _ = herald_curl_multi_setopt_long(
            multi, CURLMOPT_MAX_HOST_CONNECTIONS, max(1, configuration.maxConnectionsPerHost))
        _ = herald_curl_multi_setopt_long(
            multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, max(0, configuration.maxTotalConnections))
        _ = herald_curl_multi_setopt_long(
            multi, CURLMOPT_MAX_CONCURRENT_STREAMS, max(1, configuration.maxConcurrentStreams))
        engine = Engine(multi: multi)
        let engine = self.engine
        let thread = Thread {
            _ = hs_set_thread_name("herald-http")
            engine.run()
        }
        thread.name = "herald-http"
        thread.start()
    }

    deinit {
        engine.shutdown()
    }

    /// Stops the network thread and frees the multi handle. Requests still in flight or queued
    /// complete with ``HTTPError/shutdown``; later ``send(_:completion:)`` calls fail the same way.
    /// Waits for the thread to finish unless called from a completion handler. Idempotent.
    public func shutdown() {
        engine.shutdown()
    }

    /// Sends `request`; `completion` is called exactly once, on the client's network thread
    /// (or on the caller's thread for requests rejected before any network activity).
    public func send(_ request: HTTPRequest, completion: @escaping @Sendable (Result<HTTPResponse, HTTPError>) -> Void)
    {
        let transfer: Transfer
        do {
            transfer = try Transfer.make(request, configuration: configuration, completion: completion)
        } catch {
            completion(.failure(error))
            return
        }
        engine.enqueue(transfer)
    }

    /// `async` convenience over ``send(_:completion:)``.
    public func send(_ request: HTTPRequest) async -> Result<HTTPResponse, HTTPError> {
        await withCheckedContinuation { (continuation: CheckedContinuation<Result<HTTPResponse, HTTPError>, Never>) in
            send(request) { continuation.resume(returning: $0) }
        }
    }
}

// MARK: - Engine (the multi handle and its thread)

// @unchecked: the multi handle and `active` are touched on the engine thread only, and so is each Transfer once its maker hands it over (enqueue takes it `sending`); `shared` is under its lock.
final class Engine: @unchecked Sendable {
    private struct Shared {
        var pending: [Transfer] = []
        var stopping = false
        var closed = false
        var thread: pthread_t?
    }

    private let multi: UnsafeMutableRawPointer
    private let shared = Locked(Shared())
    private let finished = DispatchSemaphore(value: 0)
    /// Only touched by the engine thread.
    private var active: [UnsafeMutableRawPointer: Transfer] = [:]

    init(multi: UnsafeMutableRawPointer) {
        self.multi = multi
    }

    /// Takes `transfer` over: from here on only the engine thread touches
    /// it (or this call, when the engine is stopping).
    func enqueue(_ transfer: sending Transfer) {
        let accepted = shared.withLock { s -> Bool in
            if s.stopping { return false }
            s.pending.append(transfer)
            _ = curl_multi_wakeup(multi)
            return true
        }
        if !accepted {
            transfer.finish(.failure(.shutdown))
        }
    }

    func shutdown() {
        let wait = shared.withLock { s -> Bool in
            s.stopping = true
            if !s.closed { _ = curl_multi_wakeup(multi) }
            let onEngineThread = s.thread.map { pthread_equal($0, pthread_self()) != 0 } ?? false
            return !onEngineThread
        }
        if wait {
            finished.wait()
            finished.signal()  // latch: later callers pass straight through
        }
    }

    func run() {
        shared.withLock { $0.thread = pthread_self() }
        while true {
            let (adds, stopping) = shared.withLock { s -> ([Transfer], Bool) in
                let a = s.pending
                s.pending = []
                return (a, s.stopping)
            }
            if stopping {
                for t in adds { t.finish(.failure(.shutdown)) }
                break
            }
            for t in adds {
                let rc = curl_multi_add_handle(multi, t.easy)
                if rc == CURLM_OK {
                    active[t.easy] = t
                } else {
                    t.finish(.failure(.other(code: Int(rc.rawValue), message: "curl_multi_add_handle failed")))
                }
            }
            var running: Int32 = 0
            _ = curl_multi_perform(multi, &running)
            drainMessages()
            var numfds: Int32 = 0
            _ = curl_multi_poll(multi, nil, 0, 1000, &numfds)
        }
        let remaining = active
        active.removeAll()
        for (easy, t) in remaining {
            _ = curl_multi_remove_handle(multi, easy)
            t.finish(.failure(.shutdown))
        }
        // Late enqueues are impossible once `stopping` is set; flip `closed` before the cleanup
        // so that no other thread calls curl_multi_wakeup on a freed handle.
        shared.withLock { $0.closed = true }
        _ = curl_multi_cleanup(multi)
        finished.signal()
    }

    private func drainMessages() {
        var queued: Int32 = 0
        while let msg = curl_multi_info_read(multi, &queued) {
            guard msg.pointee.msg == CURLMSG_DONE, let easy = msg.pointee.easy_handle else { continue }
            let code = msg.pointee.data.result
            guard let t = active.removeValue(forKey: easy) else {
                _ = curl_multi_remove_handle(multi, easy)
                continue
            }
            let result = t.result(for: code)
            if code == CURLE_OPERATION_TIMEDOUT {
                // A timed-out stream leaves a multiplexed HTTP/2 connection in the cache, where
                // the next request would go into it again: drop it. (libcurl closes an HTTP/1.1
                // connection with an unfinished answer itself; then there is nothing to drop.)
                _ = herald_curl_drop_connection(easy)
            }
            _ = curl_multi_remove_handle(multi, easy)
            t.finish(result)
        }
    }
}
