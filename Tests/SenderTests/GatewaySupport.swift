import Foundation
import HTTPClient

/// The project's Python test gateways (Tests/gateways/gateways.py) in a
/// process of their own, with an HTTP client for their control API (and,
/// with the gateways' CA, for the gateways themselves).
final class TestGateways: @unchecked Sendable {
    let process: Process
    let dir: URL
    /// The CA that signed the gateways' certificate.
    let ca: String
    /// Ports by gateway name ("apns", "fcm", "webpush", "control").
    let ports: [String: Int]
    let client: HTTPClient

    var control: Int { ports["control"] ?? 0 }

    init() async throws {
        guard FileManager.default.isExecutableFile(atPath: fcmVenvPython) else {
            throw FCMTestError(description: "missing \(fcmVenvPython): run `make deps`")
        }
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("herald-gw-\(UUID().uuidString)")
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
            if let d = try? Data(contentsOf: json), !d.isEmpty {
                data = d
                break
            }
            if !p.isRunning { break }
            try await Task.sleep(for: .milliseconds(50))
        }
        guard let data, let obj = try JSONSerialization.jsonObject(with: data) as? [String: Any] else {
            fcmStopProcess(p)
            throw FCMTestError(description: "gateways did not start")
        }
        var ports: [String: Int] = [:]
        for name in ["apns", "fcm", "webpush", "control"] { ports[name] = obj[name] as? Int }
        self.ports = ports
        ca = dir.appendingPathComponent("ca.pem").path
        client = try HTTPClient(configuration: .init(caFile: ca, allowPlainHTTPToLoopback: true))
    }

    func stop() {
        client.shutdown()
        fcmStopProcess(process)
        try? FileManager.default.removeItem(at: dir)
    }

    /// A control call: JSON in (POST when body is given), JSON out, 200 only.
    @discardableResult
    func control(_ method: String, _ path: String, _ body: [String: Any]? = nil) async throws -> [String: Any] {
        let bytes = try body.map { Array(try JSONSerialization.data(withJSONObject: $0)) } ?? []
        let request = HTTPRequest(
            method: method, url: "http://127.0.0.1:\(control)\(path)",
            headers: body == nil ? [] : [("content-type", "application/json")], body: bytes)
        let response = try await client.send(request).get()
        guard response.status == 200,
            let obj = try JSONSerialization.jsonObject(with: Data(response.body)) as? [String: Any]
        else {
            throw FCMTestError(description: "\(path): \(response.status) \(String(decoding: response.body, as: UTF8.self))")
        }
        return obj
    }
}
