import Foundation
import HTTPClient
import Testing

/// Repository root, found from this file's location (Tests/HTTPClientTests/Servers.swift).
let repoRoot: URL = URL(fileURLWithPath: #filePath)
    .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

let venvPython = repoRoot.appendingPathComponent(".venv/bin/python").path

/// Processes started from a Swift concurrency thread inherit its blocked signal mask, which
/// would make SIGTERM pending forever; the Python side unblocks everything first.
let unblockSignalsPrelude = "import signal, sys, runpy; signal.pthread_sigmask(signal.SIG_SETMASK, set())\n"

/// SIGTERM, up to 5 s for a clean exit, then SIGKILL.
func stopProcess(_ p: Process) {
    guard p.isRunning else { return }
    p.terminate()
    let deadline = Date().addingTimeInterval(5)
    while p.isRunning && Date() < deadline { Thread.sleep(forTimeInterval: 0.02) }
    if p.isRunning {
        kill(p.processIdentifier, SIGKILL)
        while p.isRunning { Thread.sleep(forTimeInterval: 0.02) }
    }
}

struct ServerError: Error, CustomStringConvertible {
    var description: String
}

/// The project's Python test gateways (Tests/gateways/gateways.py), one process per test.
final class Gateways: @unchecked Sendable {
    let process: Process
    let dir: URL
    let ca: String
    let webpush: Int
    let fcm: Int
    let control: Int

    init() throws {
        guard FileManager.default.isExecutableFile(atPath: venvPython) else {
            throw ServerError(description: "missing \(venvPython): run `make deps`")
        }
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("herald-httpclient-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        let p = Process()
        p.executableURL = URL(fileURLWithPath: venvPython)
        p.arguments = ["-c", unblockSignalsPrelude + "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')",
                       repoRoot.appendingPathComponent("Tests/gateways/gateways.py").path, "--dir", dir.path]
        p.standardOutput = FileHandle.nullDevice
        p.standardError = FileHandle.nullDevice
        try p.run()
        process = p
        let json = dir.appendingPathComponent("gateways.json")
        let deadline = Date().addingTimeInterval(90)
        var data: Data?
        while Date() < deadline {
            if let d = try? Data(contentsOf: json), !d.isEmpty { data = d; break }
            if !p.isRunning { break }
            Thread.sleep(forTimeInterval: 0.05)
        }
        guard let data, let obj = try JSONSerialization.jsonObject(with: data) as? [String: Any],
              let webpush = obj["webpush"] as? Int, let fcm = obj["fcm"] as? Int, let control = obj["control"] as? Int
        else {
            p.terminate()
            throw ServerError(description: "gateways did not start")
        }
        self.webpush = webpush
        self.fcm = fcm
        self.control = control
        self.ca = dir.appendingPathComponent("ca.pem").path
    }

    func stop() {
        stopProcess(process)
        try? FileManager.default.removeItem(at: dir)
    }
}

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
            p.terminate()
            throw ServerError(description: "plain server did not start")
        }
        self.port = port
    }

    func stop() {
        stopProcess(process)
    }
}

func withGateways<T>(_ body: (Gateways) async throws -> T) async throws -> T {
    let g = try Gateways()
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
