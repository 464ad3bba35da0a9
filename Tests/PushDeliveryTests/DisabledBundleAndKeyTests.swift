import Foundation
import HeraldCrypto
import HeraldTestSupport
import Testing

/// `device.update` where it meets the other device fields: one user with
/// APNs devices on two bundle ids and Web Push subscriptions under the
/// current and the previous VAPID key, one of them turned off. A send skips
/// the disabled one and signs and addresses the rest as before; turning
/// devices off, on and renaming them keeps their bundle id and their key.
extension PushDelivery {
    @Suite("Disabled devices among bundle ids and VAPID keys")
    struct DisabledBundleAndKeyTests {
        @Test(
            "a disabled APNs device on the second bundle is skipped (device_disabled); the others get the push with their topic or key; device.list shows bundle_id and enabled; updates keep both"
        )
        func disabledAmongBundlesAndKeys() async throws {
            try await withHarness(appLines: bundleLines) { h in
                try await allowDevBundle(h.gateways)
                let old = ProviderKeys.shared.vapid
                let new = try P256PrivateKey.generate()
                try VAPIDRotationTests.rotate(h, current: new, previous: old, reload: 1)

                func registerAPNs(_ token: String, bundle: String?) throws -> String {
                    var params: [String: Any] = ["user": "mx", "platform": "apns", "token": token]
                    if let bundle { params["bundle_id"] = bundle }
                    return try h.ok("device.register", params)["device_id"] as! String
                }
                let devOff = try registerAPNs(hex(1), bundle: devTopic)
                let devOn = try registerAPNs(hex(2), bundle: devTopic)
                let plain = try registerAPNs(hex(3), bundle: nil)
                let underOld = try await h.subscription(vapidKey: old.publicKeyBase64URL)
                let oldID = try VAPIDRotationTests.register(h, "mx", underOld, key: old.publicKeyBase64URL)
                let underNew = try await h.subscription(vapidKey: new.publicKeyBase64URL)
                let newID = try VAPIDRotationTests.register(h, "mx", underNew, key: new.publicKeyBase64URL)

                // Turned off: the answer is the device as device.list shows it, bundle id included.
                let off = try h.ok("device.update", ["user": "mx", "device_id": devOff, "enabled": false])
                let offDevice = try #require(off["device"] as? [String: Any])
                #expect(offDevice["enabled"] as? Bool == false && offDevice["bundle_id"] as? String == devTopic)
                // Renamed: the web device under the previous key keeps that key.
                let renamed = try h.ok("device.update", ["user": "mx", "device_id": oldID, "name": "old browser"])
                let renamedDevice = try #require(renamed["device"] as? [String: Any])
                #expect(renamedDevice["name"] as? String == "old browser" && renamedDevice["enabled"] as? Bool == true)
                #expect(renamedDevice["bundle_id"] is NSNull, "\(renamedDevice)")
                #expect(
                    try VAPIDRotationTests.byKey(h) == [old.publicKeyBase64URL: 1, new.publicKeyBase64URL: 1])

                var listed: [String: (bundle: String?, enabled: Bool?)] = [:]
                for d in try h.devices("mx") {
                    #expect(d.keys.contains("bundle_id") && d.keys.contains("enabled"), "\(d)")
                    listed[d["device_id"] as! String] = (d["bundle_id"] as? String, d["enabled"] as? Bool)
                }
                #expect(listed.count == 5)
                #expect(listed[devOff]?.bundle == devTopic && listed[devOff]?.enabled == false)
                #expect(listed[devOn]?.bundle == devTopic && listed[devOn]?.enabled == true)
                #expect(listed[plain]?.bundle == topic && listed[plain]?.enabled == true)
                for id in [oldID, newID] {
                    #expect(
                        listed[id]?.bundle == nil && listed[id]?.enabled == true,
                        "\(id): \(String(describing: listed[id]))")
                }

                let r = try h.sendAndWait(["to": ["users": ["mx"]]])
                #expect(r["devices"] as? Int == 4 && r["skipped"] as? Int == 1, "\(r)")
                #expect(counts(r)["delivered"] == 4 && counts(r)["skipped"] == 1, "\(r)")
                for entry in deviceStates(try h.status(r["message_id"] as! String)) {
                    let isOff = entry["device_id"] as? String == devOff
                    #expect(entry["state"] as? String == (isOff ? "skipped" : "delivered"), "\(entry)")
                    #expect((entry["reason"] as? String == "device_disabled") == isOff, "\(entry)")
                }
                var topics: [String: String] = [:]
                for rec in try await h.gateways.received("apns") {
                    topics[rec["token"] as? String ?? ""] = (rec["headers"] as? [String: String])?["apns-topic"]
                }
                #expect(topics == [hex(2): devTopic, hex(3): topic], "the disabled device's token is never sent to")
                for (s, key) in [(underOld, old), (underNew, new)] {
                    let record = try await VAPIDRotationTests.lastRecord(h, s)
                    let vapid = record["vapid"] as? [String: Any] ?? [:]
                    #expect(vapid["k"] as? String == key.publicKeyBase64URL, "k= of \(s.id): \(vapid)")
                    #expect(try VAPIDRotationTests.jwtVerifies(record, under: key))
                }

                // Off and on again: the web device under the previous key is still
                // signed with it, and the APNs device still goes to its own bundle.
                _ = try h.ok("device.update", ["user": "mx", "device_id": oldID, "enabled": false])
                _ = try h.ok("device.update", ["user": "mx", "device_id": oldID, "enabled": true])
                let on = try h.ok("device.update", ["user": "mx", "device_id": devOff, "enabled": true])
                #expect((on["device"] as? [String: Any])?["bundle_id"] as? String == devTopic)
                let back = try h.sendAndWait(["to": ["devices": [devOff, oldID]]])
                #expect(counts(back)["delivered"] == 2 && back["skipped"] as? Int == 0, "\(back)")
                let apns = try await h.gateways.received("apns").filter { $0["token"] as? String == hex(1) }
                #expect(apns.count == 1, "\(apns)")
                #expect((apns.first?["headers"] as? [String: String])?["apns-topic"] == devTopic)
                let webRecords = try await h.gateways.received("webpush").filter {
                    $0["token"] as? String == underOld.id
                }
                #expect(webRecords.count == 2, "one push before the updates and one after")
                let record = try await VAPIDRotationTests.lastRecord(h, underOld)
                #expect((record["vapid"] as? [String: Any])?["k"] as? String == old.publicKeyBase64URL, "\(record)")
                #expect(try VAPIDRotationTests.jwtVerifies(record, under: old))
            }
        }
    }
}
