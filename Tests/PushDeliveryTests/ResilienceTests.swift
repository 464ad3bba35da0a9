import Foundation
import HeraldTestSupport
import Testing

extension PushDelivery {
    @Suite("Restarts and secrets")
    struct ResilienceTests {
        /// 300 APNs and 100 Web Push devices over 100 users.
        func registerFleet(_ h: PushHarness) async throws -> (users: [String], web: [Subscription]) {
            var params: [[String: Any]] = []
            var web: [Subscription] = []
            for u in 0..<100 {
                for k in 0..<3 {
                    params.append(["user": "f\(u)", "platform": "apns", "token": hex(u * 3 + k)])
                }
                let s = try await h.subscription()
                web.append(s)
                params.append([
                    "user": "f\(u)", "platform": "web", "token": s.endpoint,
                    "keys": ["p256dh": s.p256dh, "auth": s.auth],
                ])
            }
            _ = try h.registerMany(params)
            return ((0..<100).map { "f\($0)" }, web)
        }

        @Test("kill -9 in the middle of a fan-out: after the restart every device still gets its push")
        func killDuringFanOut() async throws {
            try await withHarness { h in
                let (users, web) = try await registerFleet(h)
                try await h.gateways.knobs("apns", ["delay_ms": 400])
                try await h.gateways.knobs("webpush", ["delay_ms": 400])
                let id =
                    try h.ok("push.send", ["to": ["users": users], "collapse_key": "k"])["message_id"]
                    as! String
                // Wait until sends are out (the gateways hold their answers), then kill.
                for _ in 0..<200 {
                    if try await h.gateways.received("apns").count > 0 { break }
                    try await Task.sleep(for: .milliseconds(10))
                }
                h.daemon.kill9()
                try await h.gateways.knobs("apns", ["delay_ms": 0])
                try await h.gateways.knobs("webpush", ["delay_ms": 0])
                try h.daemon.start()
                let s = try await h.waitComplete(id)
                #expect(h.daemon.log().contains("deliveries_recovered"))
                #expect(counts(s)["delivered"] == 400, "\(counts(s))")
                let apnsTokens = Set(
                    try await h.gateways.received("apns").compactMap { $0["token"] as? String })
                #expect(apnsTokens.count == 300)
                let webIDs = Set(
                    try await h.gateways.received("webpush").compactMap { $0["token"] as? String })
                #expect(webIDs == Set(web.map(\.id)))
                // Retried pushes kept their collapse id / Topic, so a device shows one notification.
                let collapse = Set(
                    try await h.gateways.received("apns").compactMap {
                        ($0["headers"] as? [String: String])?["apns-collapse-id"]
                    })
                #expect(collapse == ["k"])
            }
        }

        @Test("SIGTERM during a fan-out: exit 0, and what was not sent is sent after the restart")
        func termDuringFanOut() async throws {
            try await withHarness { h in
                let (users, _) = try await registerFleet(h)
                try await h.gateways.knobs("apns", ["delay_ms": 300])
                let id = try h.ok("push.send", ["to": ["users": users]])["message_id"] as! String
                for _ in 0..<200 {
                    if try await h.gateways.received("apns").count > 0 { break }
                    try await Task.sleep(for: .milliseconds(10))
                }
                #expect(h.daemon.stop() == 0)
                try await h.gateways.knobs("apns", ["delay_ms": 0])
                try h.daemon.start()
                let s = try await h.waitComplete(id)
                #expect(counts(s)["delivered"] == 400, "\(counts(s))")
            }
        }

        @Test("the log never holds a device token, subscription key, endpoint or JWT")
        func noSecretsInLogs() async throws {
            try await withHarness { h in
                let s1 = try await h.subscription()
                let s2 = try await h.subscription()
                let apnsTokens = [hex(11), hex(12), hex(13)]
                for t in apnsTokens { try h.registerAPNs("l", t) }
                try h.registerFCM("l", "fcm-secret-token-l1")
                try h.registerWeb("l", s1)
                try h.registerWeb("l", s2)
                try await h.gateways.program(
                    "apns", token: apnsTokens[0], [["status": 410, "reason": "Unregistered"]])
                try await h.gateways.program(
                    "apns", token: apnsTokens[1], [["status": 400, "reason": "BadDeviceToken"]])
                try await h.gateways.program("webpush", token: s2.id, [["status": 403], ["status": 201]])
                try await h.gateways.program(
                    "fcm", token: "fcm-secret-token-l1",
                    [["error": "UNAVAILABLE", "retry_after": 0], ["status": 200]])
                _ = try h.sendAndWait(["to": ["users": ["l"]]])
                h.daemon.stop()
                let log = h.daemon.log()
                #expect(log.contains("push_accepted"), "the log was written")
                var secrets =
                    apnsTokens + [
                        "fcm-secret-token-l1", s1.endpoint, s2.endpoint, s1.p256dh, s1.auth, s2.p256dh, s2.auth,
                    ]
                secrets += [s1.id, s2.id]
                for secret in secrets {
                    #expect(!log.contains(secret), "the log holds \(secret.prefix(12))…")
                }
                for marker in ["eyJ", "ya29.", "bearer ", "Bearer ", "vapid t=", "BEGIN"] {
                    #expect(!log.contains(marker), "the log holds \(marker)")
                }
            }
        }
    }
}
