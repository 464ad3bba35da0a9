import Foundation
import HTTPClient
import HeraldTestSupport
import Testing

/// A tiny HTTP/1.1 server on 127.0.0.1 (Python http.server): /redirect → 302, /hang → never
/// answers, /big → 100 KiB body, anything else → 200 "target".
final class PlainServer: @unchecked Sendable {
    static let script = """
        import http.server, socketserver, time
        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            def log_message(self, *a): pass
            def do_POST(self): self.do_GET()
            def do_GET(self):
                n = int(self.headers.get('content-length') or 0)
                if n: self.rfile.read(n)
                if self.path.startswith('/redirect'):
                    self.send_response(302)
                    self.send_header('Location', 'http://127.0.0.1:%d/target' % self.server.server_port)
                    self.send_header('Content-Length', '0'); self.end_headers()
                elif self.path.startswith('/hang'):
                    time.sleep(120)
                elif self.path.startswith('/big'):
                    b = b'x' * (100 * 1024)
                    self.send_response(200); self.send_header('Content-Length', str(len(b))); self.end_headers()
                    self.wfile.write(b)
                else:
                    b = b'target'
                    self.send_response(200); self.send_header('X-Test', 'Yes'); self.send_header('Content-Length', str(len(b)))
                    self.end_headers(); self.wfile.write(b)
        class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
        s = S(('127.0.0.1', 0), H)
        print(s.server_port, flush=True)
        s.serve_forever()
        """

    let process: Process
    let port: Int

    init() throws {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: venvPython)
        p.arguments = ["-c", unblockSignalsPrelude + PlainServer.script]
        let out = Pipe()
        p.standardOutput = out
        p.standardError = FileHandle.nullDevice
        try p.run()
        process = p
        var line = Data()
        while true {
            let chunk = out.fileHandleForReading.availableData
            if chunk.isEmpty { break }
            line.append(chunk)
            if line.contains(UInt8(ascii: "\n")) { break }
        }
        guard let text = String(data: line, encoding: .utf8),
            let port = Int(text.trimmingCharacters(in: .whitespacesAndNewlines))
        else {
            stopProcess(p)
            throw TestSupportError("plain server did not start")
        }
        self.port = port
    }

    func stop() {
        stopProcess(process)
    }
}

func withGateways<T>(_ body: (TestGateways) async throws -> T) async throws -> T {
    let g = try await TestGateways()
    defer { g.stop() }
    return try await body(g)
}

func withPlainServer<T>(_ body: (PlainServer) async throws -> T) async throws -> T {
    let s = try PlainServer()
    defer { s.stop() }
    return try await body(s)
}

func isLoopback(_ ip: String) -> Bool {
    ip.hasPrefix("127.") || ip == "::1"
}

extension Result {
    var failure: Failure? {
        if case .failure(let e) = self { return e }
        return nil
    }
}
