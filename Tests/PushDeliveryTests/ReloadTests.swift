import Foundation
import HeraldCrypto
import HeraldTestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

extension PushDelivery {
    @Suite("Reload (SIGHUP) and metrics through a fan-out")
    struct ReloadTests {
        /// Rewrites the daemon's config through `edit`, sends SIGHUP and waits for the `n`th reload.
        static func reload(_ h: PushHarness, count n: Int, _ edit: (String) -> String = { $0 }) throws {
            let text = try String(contentsOfFile: h.daemon.configPath, encoding: .utf8)
            try edit(text).write(toFile: h.daemon.configPath, atomically: true, encoding: .utf8)
            h.daemon.signal(SIGHUP)
            guard h.daemon.waitForLog("config_reloaded", count: n) else {
                throw HarnessError("reload \(n) did not take effect:\n\(h.daemon.log(tail: 20))")
            }
        }

        @Test(
            "a new VAPID key takes effect at SIGHUP: vapid.public_key and new JWTs use it; the client connection stays")
        func vapidRotation() async throws {
            try await withHarness(transports: ["web"]) { h in
                let old = ProviderKeys.shared.vapid
                let new = try P256PrivateKey.generate()
                // Browsers pin the applicationServerKey they subscribed with.
                let pinnedOld = try await h.subscription(vapidKey: old.publicKeyBase64URL)
                let pinnedNew = try await h.subscription(vapidKey: new.publicKeyBase64URL)
                try h.registerWeb("old", pinnedOld)
                try h.registerWeb("new", pinnedNew)
                let c = try h.daemon.connect()
                defer { c.close() }
                #expect(try c.call("vapid.public_key").result?["public_key"] as? String == old.publicKeyBase64URL)
                #expect(counts(try h.sendAndWait(["to": ["users": ["old"]]]))["delivered"] == 1)

                try writeKeyFile(new.pem(), to: h.keysDir.appendingPathComponent("vapid.pem"))
                try Self.reload(h, count: 1)

                #expect(try c.call("vapid.public_key").result?["public_key"] as? String == new.publicKeyBase64URL)
                let after = try h.sendAndWait(["to": ["users": ["new"]]])
                #expect(counts(after)["delivered"] == 1, "\(after)")
                let records = try await h.gateways.received("webpush").filter { $0["token"] as? String == pinnedNew.id }
                let vapid = records.last?["vapid"] as? [String: Any]
                #expect(vapid?["k"] as? String == new.publicKeyBase64URL, "the JWT is signed with the new key")
                #expect(records.last?["valid"] as? Bool == true, "the gateway verified it: \(records.last ?? [:])")
            }
        }

        @Test("a new APNs key takes effect at SIGHUP, under a new key ID and under the same one")
        func apnsRotation() async throws {
            try await withHarness(transports: ["apns"]) { h in
                try h.registerAPNs("a", hex(7))
                #expect(counts(try h.sendAndWait(["to": ["users": ["a"]]]))["delivered"] == 1)
                func lastJWT() async throws -> [String: Any] {
                    try await h.gateways.received("apns").last?["jwt"] as? [String: Any] ?? [:]
                }
                #expect(try await lastJWT()["kid"] as? String == keyID)

                // A new key under a new key ID.
                let newID = "NEWKEY1234"
                let second = try P256PrivateKey.generate()
                _ = try await h.gateways.post(
                    "/control/apns-key",
                    [
                        "key_id": newID, "team_id": teamID, "public_key_pem": spkiPEM(second.publicKey),
                        "topics": [topic],
                    ])
                try writeKeyFile(second.pem(), to: h.keysDir.appendingPathComponent("apns.p8"))
                try Self.reload(h, count: 1) {
                    $0.replacingOccurrences(of: "apns_key_id = \(keyID)", with: "apns_key_id = \(newID)")
                }
                let r2 = try h.sendAndWait(["to": ["users": ["a"]]])
                #expect(counts(r2)["delivered"] == 1, "\(r2)")
                #expect(try await lastJWT()["kid"] as? String == newID)

                // Another key under the same key ID: the gateway now refuses tokens of the second key.
                let third = try P256PrivateKey.generate()
                _ = try await h.gateways.post(
                    "/control/apns-key",
                    ["key_id": newID, "team_id": teamID, "public_key_pem": spkiPEM(third.publicKey), "topics": [topic]])
                try writeKeyFile(third.pem(), to: h.keysDir.appendingPathComponent("apns.p8"))
                try Self.reload(h, count: 2)
                let r3 = try h.sendAndWait(["to": ["users": ["a"]]])
                #expect(counts(r3)["delivered"] == 1, "a token of the replaced key would be refused: \(r3)")
                let jwt = try await lastJWT()
                #expect(jwt["kid"] as? String == newID && jwt["valid"] as? Bool == true)
            }
        }

        @Test("a reload that drops a transport's credentials: its deliveries end skipped, nothing is lost")
        func transportDropped() async throws {
            try await withHarness(transports: ["apns", "fcm"]) { h in
                try h.registerAPNs("d", hex(9))
                try h.registerFCM("d", "fcm-d")
                try Self.reload(h, count: 1) { text in
                    text.split(separator: "\n").filter { !$0.hasPrefix("fcm_credentials") }.joined(separator: "\n")
                        + "\n"
                }
                let health = try h.ok("system.health")
                let transports = (health["transports"] as? [String: Any])?["default"] as? [String: Any]
                #expect((transports?["fcm"] as? String)?.hasPrefix("disabled:") == true, "\(health)")
                let r = try h.sendAndWait(["to": ["users": ["d"]]])
                #expect(counts(r)["delivered"] == 1 && counts(r)["skipped"] == 1, "\(r)")
            }
        }

        @Test("metrics after a fan-out: sends, outcomes, stale removals and the latency histogram add up")
        func metricsAfterFanOut() async throws {
            try await withHarness { h in
                for i in 0..<30 { try h.registerAPNs("m\(i % 10)", hex(100 + i)) }
                for i in 0..<20 { try h.registerFCM("m\(i % 10)", "fcm-m\(i)") }
                var subs: [Subscription] = []
                for i in 0..<10 {
                    let s = try await h.subscription()
                    subs.append(s)
                    try h.registerWeb("m\(i)", s)
                }
                try await h.gateways.program("apns", token: hex(100), [["status": 400, "reason": "BadDeviceToken"]])
                try await h.gateways.program("fcm", token: "fcm-m3", [["error": "UNREGISTERED"]])
                try await h.gateways.program("webpush", token: subs[0].id, [["status": 503], ["status": 201]])
                let users = (0..<10).map { "m\($0)" }
                let r = try h.sendAndWait(["to": ["users": users]])
                #expect(r["devices"] as? Int == 60)
                let m = try PrometheusExposition(try h.ok("system.metrics")["text"] as? String ?? "")
                func v(_ name: String, _ labels: [String: String]) -> Double { m.value(name, labels) ?? -1 }
                #expect(v("herald_sends_total", ["platform": "apns"]) == 30)
                #expect(v("herald_outcomes_total", ["platform": "apns", "outcome": "delivered"]) == 29)
                #expect(v("herald_outcomes_total", ["platform": "apns", "outcome": "failed"]) == 1)
                #expect(v("herald_sends_total", ["platform": "fcm"]) == 20)
                #expect(v("herald_outcomes_total", ["platform": "fcm", "outcome": "delivered"]) == 19)
                #expect(v("herald_stale_removed_total", ["platform": "fcm"]) == 1)
                #expect(v("herald_sends_total", ["platform": "web"]) == 11, "10 sends and one retry")
                #expect(v("herald_retries_total", ["platform": "web"]) == 1)
                #expect(v("herald_outcomes_total", ["platform": "web", "outcome": "delivered"]) == 10)
                for platform in ["apns", "fcm", "web"] {
                    #expect(
                        v("herald_send_duration_seconds_count", ["platform": platform])
                            == v("herald_sends_total", ["platform": platform]))
                }
                #expect(v("herald_provider_connections", ["transport": "apns"]) >= 1)
                #expect(v("herald_provider_connections_opened_total", ["transport": "web"]) >= 1)
                #expect(m.value("herald_queue_depth") == 0 && m.value("herald_queue_in_flight") == 0)
                #expect(m.value("herald_devices", ["platform": "fcm"]) == 19)
            }
        }
    }
}
