import CHeraldHTTPD
import Dispatch
import Foundation
import HeraldCrypto
import HeraldIO
import HeraldConfiguration

#if canImport(Glibc)
    import Glibc
#endif

/// The optional HTTP listener of `[metrics] listen`: `/metrics` (Prometheus
/// text), `/livez` (the main loop answers) and `/readyz` (serving, store
/// answering). libmicrohttpd parses HTTP with a thread per connection (128
/// at most). `/livez` and `/readyz` are answered on that thread from state
/// the daemon keeps current, without the loop or the store; `/metrics` is
/// made on the event loop, which owns the figures, at most once a second
/// however many scrapers ask (``SharedAnswer``). With `[metrics]
/// bearer_token_file`, `/metrics` asks for the token (checked in the C
/// listener, in constant time); the probes never do.
final class MetricsListener: Sendable {
    /// What the listener asks the daemon; each runs on the listener's thread
    /// and may wait for the loop.
    struct Source: Sendable {
        /// The metrics text, or nil when the daemon did not answer in time.
        let metrics: @Sendable () -> String?
        /// Whether the loop ran lately; must not wait.
        let live: @Sendable () -> Bool
        /// Serving and the store answering; must not wait.
        let ready: @Sendable () -> (ready: Bool, why: String)
    }

    /// The libmicrohttpd daemon, until `stop` frees it.
    private let server: Locked<OpaquePointer?>
    private let box: Unmanaged<SourceBox>
    let port: Int

    private final class SourceBox: Sendable {
        let source: Source
        init(_ source: Source) { self.source = source }
    }

    init(address: ListenAddress, token: SecretBytes?, source: Source) throws {
        let box = Unmanaged.passRetained(SourceBox(source))
        var error = [CChar](repeating: 0, count: 256)
        let handler: hh_handler = { context, path, status, body, length, contentType in
            let source = Unmanaged<SourceBox>.fromOpaque(context!).takeUnretainedValue().source
            let answer = MetricsListener.answer(path.map { String(cString: $0) } ?? "", source)
            status!.pointee = Int32(answer.status)
            contentType!.pointee = answer.metrics ? metricsContentType : plainContentType
            let bytes = Array(answer.body.utf8)
            let buffer = malloc(max(1, bytes.count))!.assumingMemoryBound(to: CChar.self)
            bytes.withUnsafeBytes { raw in
                if let base = raw.baseAddress { memcpy(buffer, base, bytes.count) }
            }
            body!.pointee = buffer
            length!.pointee = bytes.count
        }
        let started = { (bytes: UnsafeRawBufferPointer?) in
            hh_start(
                address.host, UInt16(address.port), bytes?.baseAddress?.assumingMemoryBound(to: UInt8.self),
                bytes?.count ?? 0, handler, box.toOpaque(), &error, error.count)
        }
        guard let server = token.map({ $0.withUnsafeBytes { started($0) } }) ?? started(nil) else {
            box.release()
            throw DaemonError(
                "[metrics] listen \(address): \(String(decoding: error.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))"
            )
        }
        port = Int(hh_port(server))
        self.server = Locked(server)
        self.box = box
    }

    private static func answer(_ path: String, _ source: Source) -> (status: Int, body: String, metrics: Bool) {
        switch path {
        case "/metrics":
            guard let text = source.metrics() else { return (503, "the daemon did not answer in time\n", false) }
            return (200, text, true)
        case "/livez":
            return source.live() ? (200, "ok\n", false) : (503, "the main loop is not answering\n", false)
        case "/readyz":
            let r = source.ready()
            return r.ready ? (200, "ok\n", false) : (503, r.why + "\n", false)
        default:
            return (404, "not found: try /metrics, /livez or /readyz\n", false)
        }
    }

    /// Stops the listener thread (waits for an answer being made).
    func stop() {
        server.withLock { server in
            guard let running = server else { return }
            hh_stop(running)
            server = nil
            box.release()
        }
    }
}

/// One answer shared by every thread that asks while it is being made, and
/// reused for `maxAgeMs`: fifty scrapers of `/metrics` cost the loop one
/// text a second. A computation that never answers (a wedged loop) is given
/// up after `timeoutMs` for its callers, and another is started by the next
/// caller after that.
final class SharedAnswer: Sendable {
    private struct State {
        /// The last computation's answer (nil: it had none).
        var answer: String?
        var answeredAt: Int64 = 0
        /// When the computation under way started (nil: none).
        var computingSince: Int64?
        /// Counts computations that ended, so waiters see theirs end.
        var generation = 0
    }

    private let state = Locked(State())
    let maxAgeMs: Int64
    let timeoutMs: Int64

    init(maxAgeMs: Int64 = 1000, timeoutMs: Int64 = 2000) {
        self.maxAgeMs = maxAgeMs
        self.timeoutMs = timeoutMs
    }

    /// The answer at most `maxAgeMs` old, or the one `compute` gives (which
    /// calls its argument once, from any thread, with nil for no answer);
    /// nil when none came within `timeoutMs`.
    func get(_ compute: (@escaping @Sendable (String?) -> Void) -> Void) -> String? {
        enum Next {
            case answer(String)
            case compute(seen: Int)
            case wait(seen: Int)
        }
        let now = monotonicMilliseconds()
        let next = state.withLock { s -> Next in
            if let answer = s.answer, now - s.answeredAt < maxAgeMs { return .answer(answer) }
            if s.computingSince.map({ now - $0 > timeoutMs }) ?? true {
                s.computingSince = now
                return .compute(seen: s.generation)
            }
            return .wait(seen: s.generation)
        }
        let seen: Int
        switch next {
        case .answer(let answer):
            return answer
        case .compute(let generation):
            seen = generation
            compute { [state] text in
                state.withLock { s in
                    s.answer = text
                    s.answeredAt = monotonicMilliseconds()
                    s.computingSince = nil
                    s.generation += 1
                }
                state.broadcast()
            }
        case .wait(let generation):
            seen = generation
        }
        // The computation waited on ended (its answer, or nil when it had
        // none), or the wait passed its deadline.
        return state.withLock(when: { $0.generation != seen }, timeout: .milliseconds(timeoutMs)) { s in
            s.generation != seen ? s.answer : nil
        }
    }
}

// Static C strings for the content types (never freed).
private nonisolated(unsafe) let metricsContentType = UnsafePointer(strdup(PrometheusText.contentType)!)
private nonisolated(unsafe) let plainContentType = UnsafePointer(strdup("text/plain; charset=utf-8")!)
