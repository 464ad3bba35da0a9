import Foundation
import HeraldCrypto
import HeraldTestSupport
import Testing

extension PushDelivery {
    /// VAPID key rotation: subscriptions stay bound to the key they were made
    /// with (the browser's applicationServerKey), Herald signs each with its
    /// own key while it holds it, and counts them per key.
    @Suite("VAPID key rotation without losing subscriptions")
    struct VAPIDRotationTests {
        /// Makes `current` the app's VAPID key and `previous` (when given)
        /// its `vapid_key_previous`, and reloads (the `n`th reload).
        static func rotate(
            _ h: PushHarness, current: P256PrivateKey, previous: P256PrivateKey?, reload n: Int
        ) throws {
            try writeKeyFile(current.pem(), to: h.keysDir.appendingPathComponent("vapid.pem"))
            let previousFile = h.keysDir.appendingPathComponent("vapid-previous.pem")
            if let previous {
                try writeKeyFile(previous.pem(), to: previousFile)
            } else {
                try? FileManager.default.removeItem(at: previousFile)
            }
            try ReloadTests.reload(h, count: n) { text in
                var lines = text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
                lines.removeAll { $0.trimmingCharacters(in: .whitespaces).hasPrefix("vapid_key_previous") }
                if previous != nil, let i = lines.firstIndex(where: { $0.hasPrefix("vapid_key = ") }) {
                    lines.insert("vapid_key_previous = \(previousFile.path)", at: i + 1)
                }
                return lines.joined(separator: "\n")
            }
        }

        /// Registers `s` for `user`; `key`: the `application_server_key` to give (none when nil).
        @discardableResult
        static func register(_ h: PushHarness, _ user: String, _ s: Subscription, key: String?) throws -> String {
            var params: [String: Any] = [
                "user": user, "platform": "web", "token": s.endpoint, "keys": ["p256dh": s.p256dh, "auth": s.auth],
            ]
            if let key { params["application_server_key"] = key }
            return try h.ok("device.register", params)["device_id"] as! String
        }

        /// A subscription the push service takes under any of `keys`.
        static func subscription(_ h: PushHarness, keys: [P256PrivateKey]) async throws -> Subscription {
            let s = try await h.gateways.post(
                "/control/webpush-subscription", ["vapid_public_key": keys.map(\.publicKeyBase64URL)])
            return Subscription(
                id: s["id"] as! String, endpoint: s["endpoint"] as! String, p256dh: s["p256dh"] as! String,
                auth: s["auth"] as! String)
        }

        /// `system.stats` `web_subscriptions_by_key` of the default app.
        static func byKey(_ h: PushHarness) throws -> [String: Int] {
            let all = try h.ok("system.stats")["web_subscriptions_by_key"] as? [String: Any] ?? [:]
            return (all["default"] as? [String: Any] ?? [:]).compactMapValues { $0 as? Int }
        }

        /// Expects `byKey` to be `expected` within 3 s: the store's figures
        /// are read at most once a second.
        static func expectByKey(
            _ h: PushHarness, _ expected: [String: Int], _ comment: Comment? = nil,
            sourceLocation: SourceLocation = #_sourceLocation
        ) async throws {
            let deadline = ContinuousClock.now + .seconds(3)
            var counts = try byKey(h)
            while counts != expected && ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(100))
                counts = try byKey(h)
            }
            #expect(counts == expected, comment, sourceLocation: sourceLocation)
        }

        /// The last request the gateway took for subscription `s`.
        static func lastRecord(_ h: PushHarness, _ s: Subscription) async throws -> [String: Any] {
            try await h.gateways.received("webpush").last { $0["token"] as? String == s.id } ?? [:]
        }

        /// Whether the record's VAPID JWT verifies (OpenSSL, not Herald's core) under `key`.
        static func jwtVerifies(_ record: [String: Any], under key: P256PrivateKey) throws -> Bool {
            let jwt = try #require((record["vapid"] as? [String: Any])?["jwt"] as? String)
            let parts = jwt.split(separator: ".", omittingEmptySubsequences: false)
            try #require(parts.count == 3, "\(jwt)")
            return try OpenSSLVerifier.verifyES256(
                message: Array("\(parts[0]).\(parts[1])".utf8), signature: try Base64URL.decode(String(parts[2])),
                publicKey: key.publicKey)
        }

        @Test(
            "after a rotation, subscriptions made under the previous key are signed with it (JWT and k=), the others with the current key; system.stats counts them per key"
        )
        func previousKeySigns() async throws {
            try await withHarness(transports: ["web"]) { h in
                let old = ProviderKeys.shared.vapid
                let new = try P256PrivateKey.generate()
                // Made before the rotation, registered without a key: recorded under the then current key.
                let early = try await h.subscription(vapidKey: old.publicKeyBase64URL)
                try Self.register(h, "early", early, key: nil)
                try await Self.expectByKey(h, [old.publicKeyBase64URL: 1])

                try Self.rotate(h, current: new, previous: old, reload: 1)
                #expect(try h.ok("vapid.public_key")["public_key"] as? String == new.publicKeyBase64URL)
                try await Self.expectByKey(
                    h, [old.publicKeyBase64URL: 1, new.publicKeyBase64URL: 0],
                    "both configured keys are listed, the new one with none yet")

                // A browser that has not subscribed again still holds the old key and says so.
                let late = try await h.subscription(vapidKey: old.publicKeyBase64URL)
                try Self.register(h, "late", late, key: old.publicKeyBase64URL)
                let fresh = try await h.subscription(vapidKey: new.publicKeyBase64URL)
                try Self.register(h, "fresh", fresh, key: nil)
                let explicit = try await h.subscription(vapidKey: new.publicKeyBase64URL)
                try Self.register(h, "explicit", explicit, key: new.publicKeyBase64URL)
                try await Self.expectByKey(h, [old.publicKeyBase64URL: 2, new.publicKeyBase64URL: 2])

                let r = try h.sendAndWait(["to": ["users": ["early", "late", "fresh", "explicit"]]])
                #expect(counts(r)["delivered"] == 4, "\(r)")
                var jwts: [String: Set<String>] = [:]
                for (s, key) in [(early, old), (late, old), (fresh, new), (explicit, new)] {
                    let record = try await Self.lastRecord(h, s)
                    let vapid = record["vapid"] as? [String: Any] ?? [:]
                    #expect(vapid["k"] as? String == key.publicKeyBase64URL, "k= of \(s.id): \(vapid)")
                    #expect(record["valid"] as? Bool == true, "the gateway took it: \(record)")
                    let other = key.publicKey == old.publicKey ? new : old
                    #expect(try Self.jwtVerifies(record, under: key), "the JWT is signed with the subscription's key")
                    #expect(try !Self.jwtVerifies(record, under: other), "and not with the other key")
                    jwts[key.publicKeyBase64URL, default: []].insert(vapid["jwt"] as? String ?? "")
                }
                #expect(jwts[old.publicKeyBase64URL]?.count == 1, "one cached token per key and origin")
                #expect(jwts[new.publicKeyBase64URL]?.count == 1)
                let web = (try h.ok("system.stats")["transports"] as? [String: [String: Int]])?["web"] ?? [:]
                #expect(web["auth_rejected"] == 0, "\(web)")
            }
        }

        @Test(
            "a subscription whose key was dropped: signed with the current key; a 401/403 ends it failed (vapid_key_retired), once, the transport undegraded; a push service that takes the current key still delivers"
        )
        func retiredKey() async throws {
            try await withHarness(transports: ["web"]) { h in
                let old = ProviderKeys.shared.vapid
                let new = try P256PrivateKey.generate()
                try Self.rotate(h, current: new, previous: old, reload: 1)
                let bound = try await h.subscription(vapidKey: old.publicKeyBase64URL)
                try Self.register(h, "bound", bound, key: old.publicKeyBase64URL)
                // A push service that does not hold a subscription to one key (it accepts either).
                let loose = try await Self.subscription(h, keys: [old, new])
                try Self.register(h, "loose", loose, key: old.publicKeyBase64URL)
                let current = try await h.subscription(vapidKey: new.publicKeyBase64URL)
                try Self.register(h, "current", current, key: nil)

                // The old key is dropped: Herald no longer holds it.
                try Self.rotate(h, current: new, previous: nil, reload: 2)
                try await Self.expectByKey(
                    h, [old.publicKeyBase64URL: 2, new.publicKeyBase64URL: 1],
                    "subscriptions under a dropped key still show, under that key")

                for status in [401, 403] {
                    try await h.gateways.knobs("webpush", ["auth_fail_status": status])
                    let r = try h.sendAndWait(["to": ["users": ["bound"]]])
                    #expect(counts(r)["failed"] == 1, "\(r)")
                    let d = deviceStates(try h.status(r["message_id"] as! String)).first ?? [:]
                    #expect(d["reason"] as? String == "vapid_key_retired", "\(d)")
                    #expect(d["http_status"] as? Int == status, "\(d)")
                    #expect(d["attempts"] as? Int == 1, "not retried: no retry can succeed")
                    let record = try await Self.lastRecord(h, bound)
                    let k = (record["vapid"] as? [String: Any])?["k"] as? String
                    #expect(k == new.publicKeyBase64URL, "signed with the current key")
                }

                let r = try h.sendAndWait(["to": ["users": ["loose", "current"]]])
                #expect(counts(r)["delivered"] == 2, "\(r)")
                let record = try await Self.lastRecord(h, loose)
                #expect((record["vapid"] as? [String: Any])?["k"] as? String == new.publicKeyBase64URL)
                #expect(try Self.jwtVerifies(record, under: new))

                let health = try h.ok("system.health")
                #expect(health["status"] as? String == "ok", "\(health)")
                #expect(((health["transports"] as? [String: Any])?["default"] as? [String: String])?["web"] == "ready")
                let web = (try h.ok("system.stats")["transports"] as? [String: [String: Int]])?["web"] ?? [:]
                #expect(web["auth_rejected"] == 0 && web["failed"] == 2, "\(web)")
                #expect(!h.daemon.log().contains("webpush_origin_degraded"), "the push service is not marked degraded")
                #expect(try h.devices("bound").count == 1, "the subscription is kept")
            }
        }

        @Test(
            "subscriptions registered before keys were recorded get the current key at the next start, and keep it through a rotation"
        )
        func unrecordedGetTheCurrentKey() async throws {
            try await withHarness(transports: ["fcm"]) { h in
                let old = ProviderKeys.shared.vapid
                let new = try P256PrivateKey.generate()
                // No VAPID key yet: the registration records none (as one made before keys were recorded).
                let s = try await h.subscription(vapidKey: old.publicKeyBase64URL)
                try Self.register(h, "before", s, key: nil)
                try await Self.expectByKey(h, ["unrecorded": 1])

                #expect(h.daemon.stop() == 0)
                let text = try String(contentsOfFile: h.daemon.configPath, encoding: .utf8)
                try text.replacingOccurrences(
                    of: "fcm_credentials = ",
                    with: "\(PushHarness.credentials(h.keysDir, ["web"]))\nfcm_credentials = "
                ).write(toFile: h.daemon.configPath, atomically: true, encoding: .utf8)
                try h.daemon.start()
                #expect(h.daemon.waitForLog("web_subscription_keys_recorded"), "\(h.daemon.log(tail: 20))")
                try await Self.expectByKey(h, [old.publicKeyBase64URL: 1])

                // Recorded, not merely counted as current: after a rotation it stays under the old key and is signed with it.
                try Self.rotate(h, current: new, previous: old, reload: 1)
                try await Self.expectByKey(h, [old.publicKeyBase64URL: 1, new.publicKeyBase64URL: 0])
                let r = try h.sendAndWait(["to": ["users": ["before"]]])
                #expect(counts(r)["delivered"] == 1, "\(r)")
                let record = try await Self.lastRecord(h, s)
                #expect((record["vapid"] as? [String: Any])?["k"] as? String == old.publicKeyBase64URL)
            }
        }

        @Test(
            "device.register refuses an application_server_key that is not the current or previous key, malformed, or for another platform; nothing is stored"
        )
        func badServerKey() async throws {
            try await withHarness(transports: ["web", "fcm"]) { h in
                let old = ProviderKeys.shared.vapid
                let new = try P256PrivateKey.generate()
                let s = try await h.subscription()
                let base: [String: Any] = [
                    "user": "u", "platform": "web", "token": s.endpoint, "keys": ["p256dh": s.p256dh, "auth": s.auth],
                ]
                func refused(_ key: Any, _ params: [String: Any] = [:], why: String) throws {
                    var p = params.isEmpty ? base : params
                    p["application_server_key"] = key
                    let r = try h.call("device.register", p)
                    #expect(r.errorCode == -32602, "\(why): \(r)")
                    #expect(r.errorData?["field"] as? String == "application_server_key", "\(why): \(r)")
                }
                try refused(new.publicKeyBase64URL, why: "a key the app does not hold")
                try refused("not base64url!", why: "malformed")
                try refused(Base64URL.encode([4] + [UInt8](repeating: 1, count: 64)), why: "not a point on P-256")
                try refused(Base64URL.encode(Array(old.publicKey.prefix(33))), why: "a compressed-size key")
                try refused(17, why: "not a string")
                try refused(
                    old.publicKeyBase64URL, ["user": "u", "platform": "fcm", "token": "fcm-u"], why: "not for fcm")
                #expect(try h.devices("u").isEmpty, "nothing stored")

                // The key becomes the previous one: now it is taken, the unknown one still not.
                try Self.rotate(h, current: new, previous: old, reload: 1)
                let other = try P256PrivateKey.generate()
                try refused(other.publicKeyBase64URL, why: "neither current nor previous")
                #expect(try h.devices("u").isEmpty, "nothing stored")
                // base64url with its '=' padding names the same key: recorded as vapid.public_key spells it.
                let padded =
                    Data(old.publicKey).base64EncodedString().replacingOccurrences(of: "+", with: "-")
                    .replacingOccurrences(of: "/", with: "_")
                #expect(padded.hasSuffix("=") && padded != old.publicKeyBase64URL)
                var p = base
                p["application_server_key"] = padded
                let r = try h.call("device.register", p)
                #expect(r.result != nil, "\(r)")
                try await Self.expectByKey(
                    h, [old.publicKeyBase64URL: 1, new.publicKeyBase64URL: 0],
                    "recorded in canonical form")
            }
        }
    }
}
