import Foundation
import HeraldCrypto
import HeraldTestSupport
import Testing

extension PushDelivery {
    /// The Web Push form on every platform, against the gateways: each kind
    /// reaches the platforms and forms it is for, and a Web Push-form
    /// registration of any platform arrives as an RFC 8291 record the
    /// gateway decrypts, whatever the platform.
    @Suite("Registration forms and routing end to end")
    struct FormsAndRoutingTests {
        @discardableResult
        static func registerWebPush(
            _ h: PushHarness, _ user: String, _ platform: String, _ s: Subscription, extra: [String: Any] = [:]
        ) throws -> String {
            var params: [String: Any] = [
                "user": user, "platform": platform, "token": s.endpoint, "keys": ["p256dh": s.p256dh, "auth": s.auth],
            ]
            params.merge(extra) { $1 }
            return try h.ok("device.register", params)["device_id"] as! String
        }

        /// The decrypted records the Web Push gateway took, by subscription id.
        static func records(_ h: PushHarness) async throws -> [String: [String: Any]] {
            var out: [String: [String: Any]] = [:]
            for r in try await h.gateways.received("webpush") { out[r["token"] as? String ?? ""] = r }
            return out
        }

        @Test(
            "notification, clear and call_ring reach each platform and form as the routing table says; Web Push-form records decrypt, with TTL and Urgency per kind and the app's VAPID key"
        )
        func routingTable() async throws {
            try await withHarness { h in
                let voipSub = try await h.subscription()
                let fcmSub = try await h.subscription()
                let webSub = try await h.subscription()
                let upSub = try await h.subscription()
                try h.registerAPNs("r", hex(1))
                try h.registerAPNs("r", hex(2), voip: true)
                try Self.registerWebPush(h, "r", "apns_voip", voipSub)
                try h.registerFCM("r", "fcm-legacy-r")
                try Self.registerWebPush(h, "r", "fcm", fcmSub)
                try h.registerWeb("r", webSub)
                try Self.registerWebPush(h, "r", "unified_push", upSub)
                let forms = Dictionary(
                    try h.devices("r").map { ("\($0["platform"]!)/\($0["form"]!)", 1) }, uniquingKeysWith: +)
                #expect(
                    forms == [
                        "apns/legacy": 1, "apns_voip/legacy": 1, "apns_voip/webpush": 1, "fcm/legacy": 1,
                        "fcm/webpush": 1, "web/webpush": 1, "unified_push/webpush": 1,
                    ])
                let vapidKey = ProviderKeys.shared.vapid.publicKeyBase64URL

                for (kind, urgency, ttl) in [("notification", "high", 86_400), ("clear", "low", 3_600)] {
                    try await h.gateways.reset()
                    let r = try h.sendAndWait(["to": ["users": ["r"]], "kind": kind])
                    #expect(r["devices"] as? Int == 5 && r["skipped"] as? Int == 2, "\(kind): \(r)")
                    #expect(counts(r)["delivered"] == 5, "\(kind): \(r)")
                    let apns = try await h.gateways.received("apns")
                    #expect(apns.map { $0["token"] as? String } == [hex(1)], "\(kind): only the alert registration")
                    let fcmSent = try await h.gateways.received("fcm", query: "&kind=send")
                    // (A reset of the gateways revokes FCM access tokens: a 401 and a new token may come first.)
                    let fcmTaken = fcmSent.filter { $0["valid"] as? Int == 1 }.compactMap { $0["token"] as? String }
                    #expect(fcmTaken == ["fcm-legacy-r"], "\(kind): only the legacy fcm registration: \(fcmSent)")
                    let records = try await Self.records(h)
                    #expect(Set(records.keys) == [fcmSub.id, webSub.id, upSub.id], "\(kind)")
                    for (id, rec) in records {
                        #expect(rec["valid"] as? Bool == true, "\(kind) \(id): \(rec)")
                        let plain = rec["plaintext_json"] as? [String: Any]
                        #expect(plain?["kind"] as? String == kind, "\(kind) \(id): decrypted \(rec)")
                        #expect(rec["urgency"] as? String == urgency, "\(kind) \(id)")
                        let t = rec["ttl"] as? Int ?? -1
                        #expect(t > ttl - 60 && t <= ttl, "\(kind) \(id): ttl \(t)")
                        #expect((rec["vapid"] as? [String: Any])?["k"] as? String == vapidKey)
                    }
                    let skipped = deviceStates(try h.status(r["message_id"] as! String)).filter {
                        $0["state"] as? String == "skipped"
                    }
                    #expect(skipped.allSatisfy { $0["platform"] as? String == "apns_voip" })
                    #expect(skipped.allSatisfy { $0["reason"] as? String == "kind_not_for_platform" })
                }

                try await h.gateways.reset()
                let ring = try h.sendAndWait(["to": ["users": ["r"]], "kind": "call_ring", "data": ["call": "c9"]])
                #expect(ring["devices"] as? Int == 3 && ring["skipped"] as? Int == 4, "\(ring)")
                #expect(counts(ring)["delivered"] == 3, "\(ring)")
                let voip = try await h.gateways.received("apns")
                #expect(voip.map { $0["token"] as? String } == [hex(2)])
                #expect((voip.first?["headers"] as? [String: String])?["apns-push-type"] == "voip")
                #expect(try await h.gateways.received("fcm", query: "&kind=send").isEmpty, "no legacy fcm ring")
                let records = try await Self.records(h)
                #expect(Set(records.keys) == [voipSub.id, fcmSub.id])
                for (id, rec) in records {
                    #expect(rec["valid"] as? Bool == true && rec["urgency"] as? String == "high", "\(id): \(rec)")
                    #expect(rec["ttl"] as? Int == 0, "\(id): a ring is now or never")
                    let plain = rec["plaintext_json"] as? [String: Any] ?? [:]
                    #expect(plain["kind"] as? String == "call_ring", "\(id): \(plain)")
                    #expect((plain["data"] as? [String: Any])?["call"] as? String == "c9", "\(id): \(plain)")
                }
                let skipped = deviceStates(try h.status(ring["message_id"] as! String)).filter {
                    $0["state"] as? String == "skipped"
                }
                #expect(
                    Set(skipped.compactMap { $0["platform"] as? String }) == ["apns", "fcm", "web", "unified_push"])
            }
        }

        @Test(
            "unified_push end to end: registered with its keys, listed with form, app_id and user_agent, delivered as a record, removed by a 410"
        )
        func unifiedPush() async throws {
            try await withHarness(transports: ["web"]) { h in
                let s = try await h.subscription()
                let id = try Self.registerWebPush(
                    h, "u", "unified_push", s, extra: ["app_id": "canary", "user_agent": "Chat/5.0 (Android 15)"])
                let listed = try #require(try h.devices("u").first)
                #expect(listed["device_id"] as? String == id && listed["platform"] as? String == "unified_push")
                #expect(listed["form"] as? String == "webpush" && listed["app_id"] as? String == "canary")
                #expect(listed["user_agent"] as? String == "Chat/5.0 (Android 15)")
                #expect(listed["environment"] is NSNull && listed["bundle_id"] is NSNull)

                let r = try h.sendAndWait(["to": ["users": ["u"]], "data": ["m": "1"]])
                #expect(counts(r)["delivered"] == 1, "\(r)")
                let rec = try #require(try await Self.records(h)[s.id])
                #expect(rec["valid"] as? Bool == true && rec["plaintext_json"] is [String: Any], "\(rec)")
                let stats = try h.ok("system.stats")
                #expect((stats["devices"] as? [String: Int])?["unified_push"] == 1, "\(stats)")
                #expect((stats["transports"] as? [String: [String: Int]])?["unified_push"]?["delivered"] == 1)

                try await h.gateways.program("webpush", token: s.id, [["status": 410]])
                _ = try h.sendAndWait(["to": ["users": ["u"]]])
                let deadline = Date().addingTimeInterval(10)
                while try !h.devices("u").isEmpty && Date() < deadline { try await Task.sleep(for: .milliseconds(50)) }
                #expect(try h.devices("u").isEmpty, "a 410 removes a unified_push registration as it does a web one")
            }
        }

        @Test(
            "a Web Push-form fcm device is delivered by Web Push when FCM has no credentials; a legacy one is skipped transport_disabled"
        )
        func webPushFormWithoutFCM() async throws {
            try await withHarness(transports: ["web"]) { h in
                let s = try await h.subscription()
                try Self.registerWebPush(h, "w", "fcm", s)
                try h.registerFCM("w", "fcm-legacy-w")
                let r = try h.sendAndWait(["to": ["users": ["w"]]])
                #expect(r["devices"] as? Int == 1 && r["skipped"] as? Int == 1, "\(r)")
                #expect(counts(r)["delivered"] == 1)
                let skipped = deviceStates(try h.status(r["message_id"] as! String)).first {
                    $0["state"] as? String == "skipped"
                }
                #expect(
                    (skipped?["reason"] as? String)?.hasPrefix("transport_disabled") == true,
                    "\(String(describing: skipped))")
                #expect(try await Self.records(h)[s.id]?["valid"] as? Bool == true)
            }
        }

        @Test(
            "a Web Push-form fcm subscription made under the previous VAPID key is signed with that key after a rotation"
        )
        func rotationOnFCMForm() async throws {
            try await withHarness(transports: ["web"]) { h in
                let old = ProviderKeys.shared.vapid
                let new = try P256PrivateKey.generate()
                let s = try await h.subscription(vapidKey: old.publicKeyBase64URL)
                try Self.registerWebPush(h, "v", "fcm", s)
                try VAPIDRotationTests.rotate(h, current: new, previous: old, reload: 1)
                let fresh = try await h.subscription(vapidKey: new.publicKeyBase64URL)
                try Self.registerWebPush(
                    h, "v", "apns_voip", fresh, extra: ["application_server_key": new.publicKeyBase64URL])
                let r = try h.sendAndWait(["to": ["users": ["v"]]])
                #expect(counts(r)["delivered"] == 1, "the notification reaches the fcm registration: \(r)")
                let rec = try await VAPIDRotationTests.lastRecord(h, s)
                #expect((rec["vapid"] as? [String: Any])?["k"] as? String == old.publicKeyBase64URL, "\(rec)")
                #expect(try VAPIDRotationTests.jwtVerifies(rec, under: old))
                let ring = try h.sendAndWait(["to": ["users": ["v"]], "kind": "call_ring"])
                #expect(counts(ring)["delivered"] == 2, "\(ring)")
                let ringRec = try await VAPIDRotationTests.lastRecord(h, fresh)
                #expect((ringRec["vapid"] as? [String: Any])?["k"] as? String == new.publicKeyBase64URL)
                let byKey = try VAPIDRotationTests.byKey(h)
                #expect(byKey == [old.publicKeyBase64URL: 1, new.publicKeyBase64URL: 1], "\(byKey)")
            }
        }
    }
}
