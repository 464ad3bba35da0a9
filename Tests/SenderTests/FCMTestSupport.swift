import FCM
import Foundation
import HTTP2
import HTTPClient
import HeraldCore
import HeraldTransport
import HeraldCrypto
import HeraldTestSupport
import HeraldIO
import HeraldNet
import Testing

struct FCMTestError: Error, CustomStringConvertible {
    var description: String
}

/// One RSA-2048 key pair for every test (PEM strings).
let fcmTestKey: (privatePEM: String, publicPEM: String) = {
    let priv = try! runCommand(
        "/usr/bin/openssl", ["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"])
    let pub = try! runCommand("/usr/bin/openssl", ["pkey", "-pubout"], stdin: priv)
    return (String(decoding: priv, as: UTF8.self), String(decoding: pub, as: UTF8.self))
}()

/// The test gateways with the FCM service account registered, one process per test, and
/// what carries the senders' `messages:send` requests: libcurl alone (`.curl`), or an
/// ``HTTP2Client`` of the test's own with libcurl for an origin without HTTP/2 (`.http2`).
final class FCMGateways: @unchecked Sendable {
    let carrier: Carrier
    let gateways: TestGateways
    /// Set for `.http2`: the client every ``sender(baseURL:clock:refreshMargin:)`` is given.
    let http2: HTTP2Client?
    let projectID = "herald-test"
    let clientEmail = "herald@herald-test.iam.gserviceaccount.com"
    var client: HTTPClient { gateways.client }
    var fcmBase: String { "https://127.0.0.1:\(gateways.fcm)" }
    /// The FCM gateway on its listener that offers only ALPN http/1.1.
    var fcmH1Base: String { "https://127.0.0.1:\(gateways.fcmH1)" }

    init(_ carrier: Carrier) async throws {
        self.carrier = carrier
        gateways = try await TestGateways()
        do {
            http2 =
                carrier == .http2
                ? try HTTP2Client(
                    settings: HTTP2ClientSettings(caFile: gateways.ca) { host, _ in
                        // The gateways are at 127.0.0.1: an IP literal is never looked up.
                        throw TestSupportError("unexpected lookup of \(host)")
                    }, threadName: "herald-fcm-test") : nil
        } catch {
            gateways.stop()
            throw error
        }
        do {
            _ = try await controlPost(
                "/control/fcm-key",
                [
                    "client_email": clientEmail, "public_key_pem": fcmTestKey.publicPEM, "project_id": projectID,
                ])
        } catch {
            gateways.stop()
            throw error
        }
    }

    func stop() {
        http2?.shutdown()
        gateways.stop()
    }

    /// A sender for the service account over the test's carrier (`baseURL` by default the h2-capable listener).
    func sender(
        baseURL: String? = nil, clock: any WallClock = SystemClock(), refreshMargin: Duration = .seconds(300)
    ) throws -> FCMSender {
        FCMSender(
            account: try account(), baseURL: try HTTPURL(parsing: baseURL ?? fcmBase),
            transport: OriginTransport(http1: client, http2: http2, clock: clock), clock: clock,
            refreshMargin: refreshMargin)
    }

    /// The `messages:send` requests the gateway recorded on `listener` ("fcm" or "fcm_h1"; the
    /// gateway's own view, `gateway=fcm`, has both).
    func sends(listener: String = "fcm", token: String? = nil) async throws -> [[String: Any]] {
        try await gateways.received(listener, query: "&kind=send" + (token.map { "&token=\($0)" } ?? ""))
            .filter { $0["listener"] as? String == listener }
    }

    /// The service-account JSON, its token_uri pointing at the gateway.
    func account(projectID: String? = nil) throws -> FCMServiceAccount {
        let json: [String: Any] = [
            "type": "service_account", "project_id": projectID ?? self.projectID, "private_key_id": "test-key",
            "private_key": fcmTestKey.privatePEM, "client_email": clientEmail,
            "token_uri": "\(fcmBase)/token",
        ]
        let data = try JSONSerialization.data(withJSONObject: json)
        return try FCMServiceAccount(json: SecretBytes(copying: data))
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

/// Runs `body` against a fresh gateway process with senders over `carrier`. With `.http2`, once
/// `body` is done, every `messages:send` request that reached the h2-capable listener must have
/// gone out on the HTTP/2 client (none through libcurl).
func withFCMGateways<T>(_ carrier: Carrier, _ body: (FCMGateways) async throws -> T) async throws -> T {
    let g = try await FCMGateways(carrier)
    defer { g.stop() }
    let result = try await body(g)
    if let http2 = g.http2 {
        let sends = try await g.sends()
        #expect(http2.stats.requestsSent == sends.count, "every send to the h2 listener went out on the HTTP/2 client")
    }
    return result
}

/// A minimal valid v1 body for one device token.
func fcmBody(token: String) -> [UInt8] {
    Array(
        #"{"message":{"token":"\#(token)","data":{"kind":"notification"},"android":{"priority":"HIGH","ttl":"60s"}}}"#
            .utf8)
}
