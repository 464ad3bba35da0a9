import CHeraldHTTPD
import Dispatch
import Foundation
import HeraldIO

#if canImport(Glibc)
    import Glibc
#endif

/// The optional HTTP listener of `[metrics] listen`: `/metrics` (Prometheus
/// text), `/livez` (the main loop answers) and `/readyz` (serving, store
/// answering). libmicrohttpd parses HTTP on its own thread; each answer is
/// made on the event loop, which owns the figures.
// @unchecked: the daemon handle is set once at start and freed at stop; answers are made on the loop.
final class MetricsListener: @unchecked Sendable {
    /// What the listener asks the daemon; each runs on the listener's thread
    /// and may wait for the loop.
    struct Source: Sendable {
        /// The metrics text, or nil when the daemon did not answer in time.
        let metrics: @Sendable () -> String?
        let live: @Sendable () -> Bool
        let ready: @Sendable () -> (ready: Bool, why: String)
    }

    private let server: OpaquePointer
    private let box: Unmanaged<SourceBox>
    let port: Int

    private final class SourceBox: Sendable {
        let source: Source
        init(_ source: Source) { self.source = source }
    }

    init(address: ListenAddress, source: Source) throws {
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
        guard let server = hh_start(address.host, UInt16(address.port), handler, box.toOpaque(), &error, error.count)
        else {
            box.release()
            throw DaemonError(
                "[metrics] listen \(address): \(String(decoding: error.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))"
            )
        }
        self.server = server
        self.box = box
        port = Int(hh_port(server))
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
        hh_stop(server)
        box.release()
    }
}

// Static C strings for the content types (never freed).
private nonisolated(unsafe) let metricsContentType = UnsafePointer(strdup(PrometheusText.contentType)!)
private nonisolated(unsafe) let plainContentType = UnsafePointer(strdup("text/plain; charset=utf-8")!)
