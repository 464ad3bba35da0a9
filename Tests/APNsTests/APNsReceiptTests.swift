import APNs
import Foundation
import HeraldCore
import HeraldCrypto
import HeraldIO
import HeraldTestSupport
import Testing

/// What an APNs attempt reports of itself, judged by the gateways' records.
@Suite("APNs receipts: the apns-id Herald sets, the apns-unique-id Apple answers")
struct APNsReceiptTests {
    static func job(_ n: Int, environment: APNsEnvironment, messageID: String = "m1") -> DeliveryJob {
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        return DeliveryJob(
            deliveryID: Int64(n), messageID: messageID, app: "default", deviceID: "device-\(n)", user: "u",
            platform: .apns, environment: environment, token: hexToken(n), keys: nil, tokenHash: "h\(n)",
            registeredAt: now - 1000, message: PushMessage(kind: .notification, badge: 1), acceptedAt: now,
            expiresAt: now + 60_000, previousAttempts: 0)
    }

    /// A transport of the suite's key and topic, both environments on loopback ports.
    static func transport(_ client: APNsClient, production: Int, development: Int) -> APNsTransport {
        APNsTransport(
            client: client, app: "default",
            signer: APNsSigner(key: SharedGateways.shared.key, keyID: apnsKeyID, teamID: apnsTeamID),
            settings: APNsAppSettings(topic: apnsTopic), production: APNsEndpoint(host: "127.0.0.1", port: production),
            development: APNsEndpoint(host: "127.0.0.1", port: development))
    }

    static func send(_ t: APNsTransport, _ job: DeliveryJob) async -> AttemptReport {
        await withCheckedContinuation { c in t.send(job) { c.resume(returning: $0) } }
    }

    @Test("apns-id is a version-8 UUID per delivery: the same on every attempt, another for another device")
    func apnsIDIsStablePerDelivery() {
        let a = APNsTransport.apnsID(messageID: "m1", deviceID: "d1")
        #expect(a == APNsTransport.apnsID(messageID: "m1", deviceID: "d1"))
        #expect(a != APNsTransport.apnsID(messageID: "m1", deviceID: "d2"))
        #expect(a != APNsTransport.apnsID(messageID: "m2", deviceID: "d1"))
        let uuid = /^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/
        #expect(a.wholeMatch(of: uuid) != nil, "\(a)")
        // As docs/delivery.md says, so that an operator can find a delivery's.
        var b = Array(SHA256.hash(Array("herald-apns-id:m1:d1".utf8)).prefix(16))
        b[6] = b[6] & 0x0F | 0x80
        b[8] = b[8] & 0x3F | 0x80
        #expect(a.filter { $0 != "-" } == b.hexString)
    }

    @Test("each attempt reports the apns-id the gateway received, the origin, and (development) apns-unique-id")
    func receiptsMatchTheGateways() async throws {
        let g = try await SharedGateways.shared.get()
        let settings = APNsClientSettings(caFile: g.ca) { _, _ in ["127.0.0.1"] }
        let client = try APNsClient(settings: settings)
        defer { client.shutdown() }
        let transport = Self.transport(client, production: g.apns, development: g.apnsDev)

        let production = Self.job(1, environment: .production)
        let first = await Self.send(transport, production)
        let again = await Self.send(transport, production)
        #expect(first.httpStatus == 200 && again.httpStatus == 200)
        let expectedID = APNsTransport.apnsID(messageID: "m1", deviceID: "device-1")
        #expect(first.receipt?.apnsID == expectedID && again.receipt?.apnsID == expectedID)
        #expect(first.receipt?.apnsUniqueID == nil, "production answers without apns-unique-id")
        #expect(first.receipt?.origin == "https://127.0.0.1:\(g.apns)")
        #expect((first.receipt?.elapsedMs ?? -1) >= 0)
        let sent = try await g.received("apns")
        #expect(sent.count == 2)
        for record in sent {
            let headers = record["headers"] as? [String: Any] ?? [:]
            #expect(headers["apns-id"] as? String == expectedID, "every attempt carries the same apns-id")
        }

        let development = await Self.send(transport, Self.job(2, environment: .development))
        #expect(development.httpStatus == 200)
        let devRecord = try #require(try await g.received("apns_dev").last)
        let response = devRecord["response"] as? [String: Any] ?? [:]
        let answered = (response["headers"] as? [String: Any])?["apns-unique-id"] as? String
        #expect(answered != nil)
        #expect(development.receipt?.apnsUniqueID == answered)
        #expect(development.receipt?.apnsID == APNsTransport.apnsID(messageID: "m1", deviceID: "device-2"))
        #expect(development.receipt?.origin == "https://127.0.0.1:\(g.apnsDev)")
    }

    @Test("an attempt that got no answer still reports its apns-id and origin")
    func unansweredAttemptKeepsItsID() async throws {
        let g = try await SharedGateways.shared.get()
        let settings = APNsClientSettings(caFile: g.ca) { _, _ in ["127.0.0.1"] }
        let client = try APNsClient(settings: settings)
        defer { client.shutdown() }
        // Port 1 on loopback: nothing listens, the connection fails.
        let closedPort = 1
        let transport = Self.transport(client, production: closedPort, development: closedPort)
        let report = await Self.send(transport, Self.job(3, environment: .production))
        #expect(report.httpStatus == nil)
        #expect(report.receipt?.apnsID == APNsTransport.apnsID(messageID: "m1", deviceID: "device-3"))
        #expect(report.receipt?.origin == "https://127.0.0.1:\(closedPort)")
    }
}
