import Foundation
import HeraldTestSupport
import Testing

/// A device turned off with `device.update` receives nothing, on every
/// transport, while the user's other devices get the push.
extension PushDelivery {
    @Suite("Disabled devices end to end")
    struct DisabledDeviceTests {
        @Test("a disabled device receives nothing from any gateway; the user's other devices get the push")
        func disabledReceivesNothing() async throws {
            try await withHarness { h in
                let on = try await h.subscription()
                let off = try await h.subscription()
                try h.registerAPNs("dd", hex(1))
                let apnsOff = try h.registerAPNs("dd", hex(2))
                try h.registerFCM("dd", "fcm-dd-on")
                let fcmOff = try h.registerFCM("dd", "fcm-dd-off")
                try h.registerWeb("dd", on)
                let webOff = try h.registerWeb("dd", off)
                for id in [apnsOff, fcmOff, webOff] {
                    let device = try h.ok("device.update", ["user": "dd", "device_id": id, "enabled": false])
                    #expect((device["device"] as? [String: Any])?["enabled"] as? Bool == false)
                }

                let r = try h.sendAndWait(["to": ["users": ["dd"]], "data": ["m": "1"]])
                #expect(r["devices"] as? Int == 3 && r["skipped"] as? Int == 3, "\(r)")
                #expect(counts(r)["delivered"] == 3 && counts(r)["skipped"] == 3, "\(r)")
                #expect(r["state"] as? String == "complete")
                for entry in deviceStates(try h.status(r["message_id"] as! String)) {
                    let disabled = [apnsOff, fcmOff, webOff].contains(entry["device_id"] as? String ?? "")
                    #expect(
                        entry["state"] as? String == (disabled ? "skipped" : "delivered")
                            && (entry["reason"] as? String == "device_disabled") == disabled, "\(entry)")
                    if disabled { #expect(entry["attempts"] as? Int == 0 && entry["sent_by"] is NSNull) }
                }
                // What each gateway saw: the enabled devices only.
                #expect(try await h.gateways.received("apns").map { $0["token"] as? String } == [hex(1)])
                #expect(
                    try await h.gateways.received("fcm", query: "&kind=send").map { $0["token"] as? String }
                        == ["fcm-dd-on"])
                #expect(try await h.gateways.received("webpush").map { $0["token"] as? String } == [on.id])

                // Named by id, and registered again meanwhile: still nothing.
                try h.registerWeb("dd", off)
                try await h.gateways.reset()
                let named = try h.sendAndWait(["to": ["devices": [apnsOff, fcmOff, webOff]]])
                #expect(named["devices"] as? Int == 0 && named["skipped"] as? Int == 3, "\(named)")
                for gateway in ["apns", "fcm", "webpush"] {
                    let seen = try await h.gateways.received(gateway, query: gateway == "fcm" ? "&kind=send" : "")
                    #expect(seen.isEmpty, "\(gateway) received \(seen.count) requests for disabled devices")
                }

                // Enabled again, it is sent to as before.
                _ = try h.ok("device.update", ["user": "dd", "device_id": webOff, "enabled": true])
                let back = try h.sendAndWait(["to": ["devices": [webOff]]])
                #expect(counts(back)["delivered"] == 1, "\(back)")
                #expect(try await h.gateways.received("webpush").map { $0["token"] as? String } == [off.id])
            }
        }

        @Test("a retry due after its device was turned off is not sent: skipped, device_disabled")
        func disabledWhileRetrying() async throws {
            try await withHarness { h in
                let id = try h.registerFCM("dr", "fcm-dr")
                try await h.gateways.program(
                    "fcm", token: "fcm-dr", [["error": "UNAVAILABLE", "retry_after": 1], ["status": 200]])
                let sent = try h.ok("push.send", ["to": ["users": ["dr"]]])
                let messageID = sent["message_id"] as! String
                var retrying = false
                for _ in 0..<200 where !retrying {
                    retrying = counts(try h.status(messageID))["retrying"] == 1
                    if !retrying { try await Task.sleep(for: .milliseconds(10)) }
                }
                try #require(retrying, "the first attempt was answered 503 and waits for its retry")
                _ = try h.ok("device.update", ["user": "dr", "device_id": id, "enabled": false])
                let status = try await h.waitComplete(messageID)
                #expect(status["state"] as? String == "complete" && counts(status)["skipped"] == 1, "\(status)")
                let entry = try #require(deviceStates(status).first)
                #expect(entry["reason"] as? String == "device_disabled" && entry["attempts"] as? Int == 1)
                // Only the first attempt reached the gateway, the retry never did.
                try await Task.sleep(for: .milliseconds(300))
                #expect(try await h.gateways.received("fcm", query: "&kind=send").count == 1)
            }
        }
    }
}
