import Foundation
import HeraldCrypto
import HeraldTestSupport
import Testing

let keyID = "ABC123DEFG"
let teamID = "TEAM123456"
let topic = "com.example.app"
let projectID = "herald-test"
let clientEmail = "herald@herald-test.iam.gserviceaccount.com"

/// Every suite of this target, one test at a time: they share one gateway process.
@Suite("Push delivery through the daemon", .serialized)
struct PushDelivery {}

/// Provider keys, made once for the whole run.
struct ProviderKeys: Sendable {
    let apns: P256PrivateKey
    let vapid: P256PrivateKey
    let rsaPrivatePEM: String
    let rsaPublicPEM: String

    static let shared: ProviderKeys = {
        let priv = try! runCommand(
            "/usr/bin/openssl", ["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"])
        let pub = try! runCommand("/usr/bin/openssl", ["pkey", "-pubout"], stdin: priv)
        return ProviderKeys(
            apns: try! P256PrivateKey.generate(), vapid: try! P256PrivateKey.generate(),
            rsaPrivatePEM: String(decoding: priv, as: UTF8.self), rsaPublicPEM: String(decoding: pub, as: UTF8.self))
    }()
}

/// One gateway process for the whole target, reset (records, programs,
/// knobs) before each test; keys stay registered.
actor SharedGateways {
    static let shared = SharedGateways()
    private var gateways: TestGateways?

    func get() async throws -> TestGateways {
        if let gateways {
            try await gateways.reset()
            return gateways
        }
        let g = try await TestGateways()
        let keys = ProviderKeys.shared
        try await g.post(
            "/control/apns-key",
            [
                "key_id": keyID, "team_id": teamID, "public_key_pem": spkiPEM(keys.apns.publicKey),
                "topics": [topic, topic + ".voip"],
            ])
        try await g.post(
            "/control/fcm-key",
            ["client_email": clientEmail, "public_key_pem": keys.rsaPublicPEM, "project_id": projectID])
        try await g.post("/control/webpush-vapid-key", ["public_key": keys.vapid.publicKeyBase64URL])
        gateways = g
        return g
    }
}

/// A Web Push subscription the gateway holds the private key of.
struct Subscription {
    let id: String
    let endpoint: String
    let p256dh: String
    let auth: String
}

/// A daemon configured against the gateways, with every transport ready.
final class PushHarness: @unchecked Sendable {
    let gateways: TestGateways
    let daemon: DaemonProcess
    let keysDir: URL

    /// `delivery` lines replace the fast-retry defaults; `apps` replaces the app section.
    init(
        delivery: String = "max_retries = 3\nbackoff_base_ms = 50\nbackoff_max_ms = 200",
        server: String = "", transports: Set<String> = ["apns", "fcm", "web"], appLines: String = ""
    ) async throws {
        let g = try await SharedGateways.shared.get()
        gateways = g
        keysDir = URL(fileURLWithPath: "/tmp").appendingPathComponent("hk-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: keysDir, withIntermediateDirectories: true)
        let keys = ProviderKeys.shared
        try writeKeyFile(keys.apns.pem(), to: keysDir.appendingPathComponent("apns.p8"))
        try writeKeyFile(keys.vapid.pem(), to: keysDir.appendingPathComponent("vapid.pem"))
        let account: [String: Any] = [
            "type": "service_account", "project_id": projectID, "private_key_id": "k1",
            "private_key": keys.rsaPrivatePEM, "client_email": clientEmail,
            "token_uri": "https://127.0.0.1:\(g.fcm)/token",
        ]
        try JSONSerialization.data(withJSONObject: account).write(to: keysDir.appendingPathComponent("fcm.json"))
        try makeKeyFilePrivate(keysDir.appendingPathComponent("fcm.json").path)
        let section = """
            [app.default]
            device_cap = 20
            \(Self.credentials(keysDir, transports))
            \(appLines)
            """
        daemon = try DaemonProcess(
            appSections: section, allowPrivate: true, server: server, delivery: delivery,
            endpoints: """
                apns_production = https://127.0.0.1:\(g.apns)
                apns_development = https://127.0.0.1:\(g.apnsDev)
                fcm = https://127.0.0.1:\(g.fcm)
                ca_file = \(g.ca)
                """)
    }

    /// The credential lines of an app section, all three transports.
    static func credentials(_ dir: URL, _ transports: Set<String>) -> String {
        var lines: [String] = []
        if transports.contains("apns") {
            lines += [
                "apns_key = \(dir.path)/apns.p8", "apns_key_id = \(keyID)", "apns_team_id = \(teamID)",
                "apns_topic = \(topic)",
            ]
        }
        if transports.contains("fcm") { lines.append("fcm_credentials = \(dir.path)/fcm.json") }
        if transports.contains("web") {
            lines += ["vapid_key = \(dir.path)/vapid.pem", "vapid_subject = mailto:ops@example.com"]
        }
        return lines.joined(separator: "\n")
    }

    func stop(sourceLocation: SourceLocation = #_sourceLocation) {
        daemon.cleanup(sourceLocation: sourceLocation)
        try? FileManager.default.removeItem(at: keysDir)
    }

    // MARK: Calls

    func call(_ method: String, _ params: [String: Any] = [:]) throws -> [String: Any] {
        try daemon.call(method, params)
    }

    /// The result of a call that must succeed.
    func ok(_ method: String, _ params: [String: Any] = [:]) throws -> [String: Any] {
        let r = try call(method, params)
        guard let result = r.result else { throw HarnessError("\(method) failed: \(r)") }
        return result
    }

    /// A new subscription; `vapidKey` pins it to one application-server key, as a browser does.
    func subscription(vapidKey: String? = nil) async throws -> Subscription {
        let s = try await gateways.post(
            "/control/webpush-subscription", vapidKey.map { ["vapid_public_key": $0] } ?? [:])
        return Subscription(
            id: s["id"] as! String, endpoint: s["endpoint"] as! String, p256dh: s["p256dh"] as! String,
            auth: s["auth"] as! String)
    }

    @discardableResult
    func registerAPNs(
        _ user: String, _ token: String, voip: Bool = false, environment: String = "production"
    ) throws -> String {
        try ok(
            "device.register",
            ["user": user, "platform": voip ? "apns_voip" : "apns", "token": token, "environment": environment])[
                "device_id"]
            as! String
    }

    @discardableResult
    func registerFCM(_ user: String, _ token: String) throws -> String {
        try ok("device.register", ["user": user, "platform": "fcm", "token": token])["device_id"] as! String
    }

    @discardableResult
    func registerWeb(_ user: String, _ s: Subscription) throws -> String {
        try ok(
            "device.register",
            ["user": user, "platform": "web", "token": s.endpoint, "keys": ["p256dh": s.p256dh, "auth": s.auth]])[
                "device_id"] as! String
    }

    /// Many registrations pipelined on one connection.
    func registerMany(_ params: [[String: Any]]) throws -> [String] {
        let c = try daemon.connect()
        defer { c.close() }
        var out: [String] = []
        for chunk in stride(from: 0, to: params.count, by: 200) {
            let part = params[chunk..<min(params.count, chunk + 200)]
            var bytes: [UInt8] = []
            for (i, p) in part.enumerated() {
                let request: [String: Any] = [
                    "jsonrpc": "2.0", "id": chunk + i, "method": "device.register", "params": p,
                ]
                bytes += Array(try JSONSerialization.data(withJSONObject: request)) + [10]
            }
            try c.send(bytes)
            var byID: [Int: String] = [:]
            for _ in part {
                guard let line = c.readLine(timeout: 30),
                    let obj = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
                    let id = obj["id"] as? Int, let result = obj["result"] as? [String: Any]
                else { throw HarnessError("registration failed") }
                byID[id] = result["device_id"] as? String
            }
            out += part.indices.map { byID[$0]! }
        }
        return out
    }

    /// `push.send` with `wait: true`; the result.
    func sendAndWait(_ params: [String: Any], timeoutMs: Int = 30_000) throws -> [String: Any] {
        var p = params
        p["wait"] = true
        p["timeout_ms"] = timeoutMs
        let c = try daemon.connect()
        defer { c.close() }
        let request: [String: Any] = ["jsonrpc": "2.0", "id": 1, "method": "push.send", "params": p]
        try c.send(Array(try JSONSerialization.data(withJSONObject: request)) + [10])
        guard let line = c.readLine(timeout: Double(timeoutMs) / 1000 + 20),
            let obj = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
        else { throw HarnessError("no answer to push.send") }
        guard let result = obj["result"] as? [String: Any] else { throw HarnessError("push.send failed: \(obj)") }
        return result
    }

    func status(_ id: String) throws -> [String: Any] {
        try ok("push.status", ["message_id": id, "detail": true])
    }

    /// Polls push.status until the message is complete.
    func waitComplete(_ id: String, timeout: Double = 30) async throws -> [String: Any] {
        let deadline = Date().addingTimeInterval(timeout)
        while true {
            let s = try status(id)
            if s["state"] as? String == "complete" || Date() > deadline { return s }
            try await Task.sleep(for: .milliseconds(50))
        }
    }

    func devices(_ user: String) throws -> [[String: Any]] {
        try ok("device.list", ["user": user])["devices"] as? [[String: Any]] ?? []
    }
}

func counts(_ r: [String: Any]) -> [String: Int] {
    (r["counts"] as? [String: Any] ?? [:]).compactMapValues { $0 as? Int }
}

func deviceStates(_ status: [String: Any]) -> [[String: Any]] {
    status["devices"] as? [[String: Any]] ?? []
}

func hex(_ i: Int, prefix: Int = 0) -> String {
    String(format: "%08x", prefix) + String(format: "%056x", i + 1)
}

func withHarness(
    delivery: String = "max_retries = 3\nbackoff_base_ms = 50\nbackoff_max_ms = 200", server: String = "",
    transports: Set<String> = ["apns", "fcm", "web"], appLines: String = "",
    sourceLocation: SourceLocation = #_sourceLocation, _ body: (PushHarness) async throws -> Void
) async throws {
    let h = try await PushHarness(delivery: delivery, server: server, transports: transports, appLines: appLines)
    defer { h.stop(sourceLocation: sourceLocation) }  // SIGTERM: exit 0 within the shutdown budget, or the test fails
    do {
        try await body(h)
    } catch {
        Issue.record("daemon log:\n\(h.daemon.log(tail: 60))")
        throw error
    }
}
