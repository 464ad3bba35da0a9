public import Foundation
public import HTTPClient

/// The project's Python test gateways (Tests/gateways/gateways.py) in a
/// process of their own, with an HTTP client for their control API (and,
/// with the gateways' CA, for the gateways themselves).
public final class TestGateways: @unchecked Sendable {
    let process: Process
    public let dir: URL
    /// The CA that signed the gateways' certificate.
    public let ca: String
    /// Ports by listener name ("apns", "apns_dev", "apns_manage", "apns_manage_dev", "fcm", "fcm_h1",
    /// "webpush", "webpush_h1", "control").
    public let ports: [String: Int]
    public let client: HTTPClient

    public var control: Int { ports["control"] ?? 0 }
    /// APNs production (api.push.apple.com).
    public var apns: Int { ports["apns"] ?? 0 }
    /// APNs development (api.sandbox.push.apple.com): a host of its own, with its own
    /// records, programs, knobs and connections (gateway name `apns_dev`).
    public var apnsDev: Int { ports["apns_dev"] ?? 0 }
    public var fcm: Int { ports["fcm"] ?? 0 }
    public var webpush: Int { ports["webpush"] ?? 0 }
    /// The Web Push gateway again, on a listener whose TLS offers only ALPN `http/1.1`
    /// (a push service without HTTP/2); its records and connections are webpush's.
    public var webpushH1: Int { ports["webpush_h1"] ?? 0 }
    /// The FCM gateway again, on a listener whose TLS offers only ALPN `http/1.1`
    /// (an FCM origin without HTTP/2); its records and connections are fcm's.
    public var fcmH1: Int { ports["fcm_h1"] ?? 0 }
    /// APNs channel management, production (api-manage-broadcast.push.apple.com:2196): h2 only,
    /// the production environment's broadcast channels (gateway name `apns_manage`).
    public var apnsManage: Int { ports["apns_manage"] ?? 0 }
    /// APNs channel management, development (api-manage-broadcast.sandbox.push.apple.com:2195):
    /// channels of its own, never shared with production (gateway name `apns_manage_dev`).
    public var apnsManageDev: Int { ports["apns_manage_dev"] ?? 0 }

    public init() async throws {
        guard FileManager.default.isExecutableFile(atPath: venvPython) else {
            throw TestSupportError("missing \(venvPython): run `make deps`")
        }
        dir = URL(fileURLWithPath: "/tmp").appendingPathComponent("herald-gw-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        let p = Process()
        p.executableURL = URL(fileURLWithPath: venvPython)
        p.arguments = [
            "-c", unblockSignalsPrelude + "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')",
            repoRoot.appendingPathComponent("Tests/gateways/gateways.py").path, "--dir", dir.path,
            // Suites that share one gateway process for the whole run never stop it: it
            // goes when the test process does.
            "--exit-with-parent",
        ]
        p.standardOutput = FileHandle.nullDevice
        p.standardError = FileHandle(forWritingAtPath: "/dev/null")
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
            stopProcess(p)
            throw TestSupportError("gateways did not start")
        }
        var ports: [String: Int] = [:]
        for name in [
            "apns", "apns_dev", "apns_manage", "apns_manage_dev", "fcm", "fcm_h1", "webpush", "webpush_h1",
            "control",
        ] {
            ports[name] = obj[name] as? Int
        }
        self.ports = ports
        ca = dir.appendingPathComponent("ca.pem").path
        client = try HTTPClient(
            configuration: .init(caFile: ca, maxResponseBodyBytes: 256 << 20, allowPlainHTTPToLoopback: true))
    }

    public func stop() {
        client.shutdown()
        stopProcess(process)
        try? FileManager.default.removeItem(at: dir)
    }

    /// A control call: JSON in (POST when body is given), JSON out, 200 only.
    @discardableResult
    public func control(_ method: String, _ path: String, _ body: [String: Any]? = nil) async throws -> [String: Any] {
        let bytes = try body.map { Array(try JSONSerialization.data(withJSONObject: $0)) } ?? []
        let request = HTTPRequest(
            method: method, url: "http://127.0.0.1:\(control)\(path)",
            headers: body == nil ? [] : [("content-type", "application/json")], body: bytes)
        let response = try await client.send(request).get()
        guard response.status == 200,
            let obj = try JSONSerialization.jsonObject(with: Data(response.body)) as? [String: Any]
        else {
            throw TestSupportError("\(path): \(response.status) \(String(decoding: response.body, as: UTF8.self))")
        }
        return obj
    }

    /// `POST /control/…` with a JSON body.
    @discardableResult
    public func post(_ path: String, _ body: [String: Any]) async throws -> [String: Any] {
        try await control("POST", path, body)
    }

    /// `GET /control/…`.
    public func get(_ path: String) async throws -> [String: Any] {
        try await control("GET", path)
    }

    /// Programs the answers for one token (or "*") of one gateway.
    public func program(_ gateway: String, token: String = "*", _ responses: [[String: Any]]) async throws {
        try await post("/control/program", ["gateway": gateway, "token": token, "responses": responses])
    }

    /// Sets knobs of one gateway.
    public func knobs(_ gateway: String, _ values: [String: Any]) async throws {
        var body = values
        body["gateway"] = gateway
        try await post("/control/knobs", body)
    }

    /// The requests a gateway recorded, in arrival order.
    public func received(_ gateway: String, query: String = "") async throws -> [[String: Any]] {
        try await get("/control/received?gateway=\(gateway)\(query)")["requests"] as? [[String: Any]] ?? []
    }

    /// The gateway's per-connection view.
    public func connections(_ gateway: String) async throws -> [[String: Any]] {
        try await get("/control/connections?gateway=\(gateway)")["connections"] as? [[String: Any]] ?? []
    }

    /// Forgets records, programs, knobs and counters (`all`: keys and subscriptions too).
    public func reset(all: Bool = false) async throws {
        try await post("/control/reset", all ? ["all": true] : [:])
    }
}
