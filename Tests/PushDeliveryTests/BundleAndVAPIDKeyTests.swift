import Foundation
import HeraldCrypto
import HeraldTestSupport
import Testing

/// device.register's `bundle_id` (APNs) and `application_server_key` (Web
/// Push) for one user's devices in one app: each is stored on its own
/// platform's devices, listed and used on the send, and neither leaks into
/// the other.
extension PushDelivery {
    @Suite("Bundle ids and VAPID keys on one user's devices")
    struct BundleAndVAPIDKeyTests {
        @Test(
            "APNs devices on two bundles and web devices under the current and previous VAPID key: one send reaches all, each with its topic or key; device.list and system.stats show them"
        )
        func oneUser() async throws {
            try await withHarness(appLines: bundleLines) { h in
                try await allowDevBundle(h.gateways)
                let old = ProviderKeys.shared.vapid
                let new = try P256PrivateKey.generate()
                try VAPIDRotationTests.rotate(h, current: new, previous: old, reload: 1)

                let dev =
                    try h.ok(
                        "device.register",
                        ["user": "m", "platform": "apns", "token": hex(1), "bundle_id": devTopic])["device_id"]
                    as! String
                let plain = try h.registerAPNs("m", hex(2))
                let underOld = try await h.subscription(vapidKey: old.publicKeyBase64URL)
                let oldID = try VAPIDRotationTests.register(h, "m", underOld, key: old.publicKeyBase64URL)
                let underNew = try await h.subscription(vapidKey: new.publicKeyBase64URL)
                let newID = try VAPIDRotationTests.register(h, "m", underNew, key: new.publicKeyBase64URL)

                // Each param on the other platform is refused, naming it; nothing is stored.
                let c = try h.daemon.connect()
                defer { c.close() }
                let third = try await h.subscription(vapidKey: new.publicKeyBase64URL)
                let web: [String: Any] = [
                    "user": "m", "platform": "web", "token": third.endpoint,
                    "keys": ["p256dh": third.p256dh, "auth": third.auth],
                ]
                var webWithBundle = web
                webWithBundle["bundle_id"] = topic
                webWithBundle["application_server_key"] = new.publicKeyBase64URL
                var apnsWithKey: [String: Any] = ["user": "m", "platform": "apns", "token": hex(3)]
                apnsWithKey["bundle_id"] = devTopic
                apnsWithKey["application_server_key"] = new.publicKeyBase64URL
                for (params, field) in [(webWithBundle, "bundle_id"), (apnsWithKey, "application_server_key")] {
                    let r = try c.call("device.register", params)
                    #expect(r.errorCode == -32602, "\(params): \(r)")
                    #expect(r.errorData?["field"] as? String == field, "\(r)")
                }
                #expect(try c.call("system.health").result != nil, "the connection stays usable")
                #expect(try h.devices("m").count == 4)

                let listed = try h.devices("m")
                var bundles: [String: String?] = [:]
                for d in listed {
                    bundles.updateValue(d["bundle_id"] as? String, forKey: d["device_id"] as! String)
                    #expect(d["server_key"] == nil && d["application_server_key"] == nil, "\(d)")
                }
                #expect(bundles == [dev: devTopic, plain: topic, oldID: nil, newID: nil], "\(listed)")
                try await VAPIDRotationTests.expectByKey(h, [old.publicKeyBase64URL: 1, new.publicKeyBase64URL: 1])

                let r = try h.sendAndWait(["to": ["users": ["m"]], "interruption_level": "passive"])
                #expect(counts(r)["delivered"] == 4, "\(r)")
                var topics: [String: String] = [:]
                for rec in try await h.gateways.received("apns") {
                    topics[rec["token"] as? String ?? ""] = (rec["headers"] as? [String: String])?["apns-topic"]
                    let aps = (rec["body"] as? [String: Any])?["aps"] as? [String: Any] ?? [:]
                    #expect(aps["interruption-level"] as? String == "passive", "\(rec)")
                }
                #expect(topics == [hex(1): devTopic, hex(2): topic])
                for (s, key) in [(underOld, old), (underNew, new)] {
                    let record = try await VAPIDRotationTests.lastRecord(h, s)
                    let vapid = record["vapid"] as? [String: Any] ?? [:]
                    #expect(vapid["k"] as? String == key.publicKeyBase64URL, "k= of \(s.id): \(vapid)")
                    #expect(record["valid"] as? Bool == true, "\(record)")
                    #expect(try VAPIDRotationTests.jwtVerifies(record, under: key))
                }

                // Registering again: the APNs device without bundle_id keeps its bundle;
                // the web device subscribed anew under the current key records that.
                _ = try h.ok("device.register", ["user": "m", "platform": "apns", "token": hex(1)])
                let renewed = try VAPIDRotationTests.register(h, "m", underOld, key: new.publicKeyBase64URL)
                #expect(renewed == oldID)
                #expect(
                    try h.devices("m").first { $0["device_id"] as? String == dev }?["bundle_id"] as? String == devTopic)
                try await VAPIDRotationTests.expectByKey(h, [old.publicKeyBase64URL: 0, new.publicKeyBase64URL: 2])
            }
        }
    }
}
