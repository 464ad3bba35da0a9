import Foundation
import HTTPClient
import HeraldCore
import HeraldCrypto
import Synchronization
import Testing

/// Repository root, from this file's location (Tests/SenderTests/FCMTestSupport.swift).
let fcmRepoRoot: URL = URL(fileURLWithPath: #filePath)
    .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

let fcmVenvPython = fcmRepoRoot.appendingPathComponent(".venv/bin/python").path

/// Processes started from a Swift concurrency thread inherit its blocked signal mask; the
/// Python side unblocks everything first so SIGTERM works.
let fcmUnblockSignalsPrelude = "import signal, sys, runpy; signal.pthread_sigmask(signal.SIG_SETMASK, set())\n"

struct FCMTestError: Error, CustomStringConvertible {
    var description: String
}

func fcmStopProcess(_ p: Process) {
    guard p.isRunning else { return }
    p.terminate()
    let deadline = Date().addingTimeInterval(5)
    while p.isRunning && Date() < deadline { Thread.sleep(forTimeInterval: 0.02) }
    if p.isRunning {
        kill(p.processIdentifier, SIGKILL)
        while p.isRunning { Thread.sleep(forTimeInterval: 0.02) }
    }
}

/// Runs a command and returns its stdout.
func fcmRun(_ path: String, _ args: [String], stdin: Data? = nil) throws -> Data {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: path)
    p.arguments = args
    let out = Pipe()
    p.standardOutput = out
    p.standardError = FileHandle.nullDevice
    let input = Pipe()
    if stdin != nil { p.standardInput = input }
    try p.run()
    if let stdin {
        input.fileHandleForWriting.write(stdin)
        try input.fileHandleForWriting.close()
    }
    let data = out.fileHandleForReading.readDataToEndOfFile()
    p.waitUntilExit()
    guard p.terminationStatus == 0 else { throw FCMTestError(description: "\(path) \(args) failed") }
    return data
}

/// One RSA-2048 key pair for every test (PEM strings).
let fcmTestKey: (privatePEM: String, publicPEM: String) = {
    let priv = try! fcmRun("/usr/bin/openssl", ["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"])
    let pub = try! fcmRun("/usr/bin/openssl", ["pkey", "-pubout"], stdin: priv)
    return (String(decoding: priv, as: UTF8.self), String(decoding: pub, as: UTF8.self))
}()

/// A wall clock that is the system clock plus an adjustable offset.
final class FCMTestClock: WallClock {
    private let offset = Mutex<Int64>(0)
    init(offsetMs: Int64 = 0) { offset.withLock { $0 = offsetMs } }
    func nowMilliseconds() -> Int64 { SystemClock().nowMilliseconds() + offset.withLock { $0 } }
    func advance(ms: Int64) { offset.withLock { $0 += ms } }
}

/// The project's Python test gateways (Tests/gateways/gateways.py), one process per test,
/// with an HTTP client trusting their CA and the FCM service account registered.
final class FCMGateways: @unchecked Sendable {
    let process: Process
    let dir: URL
    let ca: String
    let fcm: Int
    let control: Int
    let client: HTTPClient
    let projectID = "herald-test"
    let clientEmail = "herald@herald-test.iam.gserviceaccount.com"
    var fcmBase: String { "https://127.0.0.1:\(fcm)" }

    init() async throws {
        guard FileManager.default.isExecutableFile(atPath: fcmVenvPython) else {
            throw FCMTestError(description: "missing \(fcmVenvPython): run `make deps`")
        }
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("herald-fcm-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        let p = Process()
        p.executableURL = URL(fileURLWithPath: fcmVenvPython)
        p.arguments = [
            "-c", fcmUnblockSignalsPrelude + "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')",
            fcmRepoRoot.appendingPathComponent("Tests/gateways/gateways.py").path, "--dir", dir.path,
        ]
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
            try await Task.sleep(for: .milliseconds(50))
        }
        guard let data, let obj = try JSONSerialization.jsonObject(with: data) as? [String: Any],
            let fcm = obj["fcm"] as? Int, let control = obj["control"] as? Int
        else {
            fcmStopProcess(p)
            throw FCMTestError(description: "gateways did not start")
        }
        self.fcm = fcm
        self.control = control
        self.ca = dir.appendingPathComponent("ca.pem").path
        self.client = try HTTPClient(configuration: .init(caFile: ca, allowPlainHTTPToLoopback: true))
        _ = try await controlPost("/control/fcm-key", [
            "client_email": clientEmail, "public_key_pem": fcmTestKey.publicPEM, "project_id": projectID,
        ])
    }

    func stop() {
        client.shutdown()
        fcmStopProcess(process)
        try? FileManager.default.removeItem(at: dir)
    }

    /// The service-account JSON, its token_uri pointing at the gateway.
    func account() throws -> FCMServiceAccount {
        let json: [String: Any] = [
            "type": "service_account", "project_id": projectID, "private_key_id": "test-key",
            "private_key": fcmTestKey.privatePEM, "client_email": clientEmail,
            "token_uri": "\(fcmBase)/token",
        ]
        let data = try JSONSerialization.data(withJSONObject: json)
        return try FCMServiceAccount(json: Array(data))
    }

    @discardableResult
    func controlPost(_ path: String, _ body: [String: Any]) async throws -> [String: Any] {
        let data = try JSONSerialization.data(withJSONObject: body)
        let request = HTTPRequest(
            method: "POST", url: "http://127.0.0.1:\(control)\(path)",
            headers: [("content-type", "application/json")], body: Array(data))
        return try await controlCall(request)
    }

    func controlGet(_ path: String) async throws -> [String: Any] {
        try await controlCall(HTTPRequest(method: "GET", url: "http://127.0.0.1:\(control)\(path)"))
    }

    private func controlCall(_ request: HTTPRequest) async throws -> [String: Any] {
        let response = try await client.send(request).get()
        guard response.status == 200,
            let obj = try JSONSerialization.jsonObject(with: Data(response.body)) as? [String: Any]
        else {
            throw FCMTestError(description: "\(request.url): \(response.status) \(String(decoding: response.body, as: UTF8.self))")
        }
        return obj
    }

    /// Programs FCM send answers for one device token.
    func program(token: String, _ responses: [[String: Any]]) async throws {
        try await controlPost("/control/program", ["gateway": "fcm", "token": token, "responses": responses])
    }

    /// Programs the OAuth token endpoint.
    func programTokenEndpoint(_ responses: [[String: Any]]) async throws {
        try await controlPost("/control/program", ["gateway": "fcm-token", "token": "*", "responses": responses])
    }

    func tokenRequests() async throws -> Int {
        let stats = try await controlGet("/control/stats")
        return stats["fcm_token_requests"] as? Int ?? -1
    }
}

func withFCMGateways<T>(_ body: (FCMGateways) async throws -> T) async throws -> T {
    let g = try await FCMGateways()
    defer { g.stop() }
    return try await body(g)
}

/// A minimal valid v1 body for one device token.
func fcmBody(token: String) -> [UInt8] {
    Array(#"{"message":{"token":"\#(token)","data":{"kind":"notification"},"android":{"priority":"HIGH","ttl":"60s"}}}"#.utf8)
}
