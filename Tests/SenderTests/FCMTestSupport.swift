import Foundation
import HTTPClient
import HeraldCore
import HeraldCrypto
import HeraldTestSupport
import Synchronization
import Testing

struct FCMTestError: Error, CustomStringConvertible {
    var description: String
}

/// One RSA-2048 key pair for every test (PEM strings).
let fcmTestKey: (privatePEM: String, publicPEM: String) = {
    let priv = try! runCommand("/usr/bin/openssl", ["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"])
    let pub = try! runCommand("/usr/bin/openssl", ["pkey", "-pubout"], stdin: priv)
    return (String(decoding: priv, as: UTF8.self), String(decoding: pub, as: UTF8.self))
}()

/// The test gateways with the FCM service account registered, one process per test.
final class FCMGateways: @unchecked Sendable {
    let gateways: TestGateways
    let projectID = "herald-test"
    let clientEmail = "herald@herald-test.iam.gserviceaccount.com"
    var client: HTTPClient { gateways.client }
    var fcmBase: String { "https://127.0.0.1:\(gateways.ports["fcm"] ?? 0)" }

    init() async throws {
        gateways = try await TestGateways()
        do {
            _ = try await controlPost("/control/fcm-key", [
                "client_email": clientEmail, "public_key_pem": fcmTestKey.publicPEM, "project_id": projectID,
            ])
        } catch {
            gateways.stop()
            throw error
        }
    }

    func stop() { gateways.stop() }

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
        try await gateways.control("POST", path, body)
    }

    func controlGet(_ path: String) async throws -> [String: Any] {
        try await gateways.control("GET", path)
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
