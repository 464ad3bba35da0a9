import Foundation
import HeraldTestSupport
import Testing

/// `device.update` over the socket: its parameters, its errors, and what
/// device.list, device.register and push.send make of a disabled device.
@Suite("device.update through the daemon", .serialized)
struct DeviceUpdateTests {
    static let token = "00112233445566778899aabbccddeeff"

    @Test("bad params are -32602 naming the field; nothing changes and the connection stays usable")
    func badParams() throws {
        let d = try DaemonProcess()
        defer { d.cleanup() }
        let c = try d.connect()
        defer { c.close() }
        let registered = try #require(
            try c.call("device.register", ["user": "ann", "platform": "apns", "token": Self.token, "name": "phone"])
                .result)
        let id = try #require(registered["device_id"] as? String)

        let cases: [(params: [String: Any], field: String, reason: String?)] = [
            (
                ["user": "ann", "device_id": id], "name",
                "give at least one of name, enabled, time_zone, quiet_hours, topics"
            ),
            (["user": "ann", "device_id": id, "name": NSNull(), "enabled": NSNull()], "name", nil),
            (["user": "ann", "device_id": id, "enabled": "no"], "enabled", "must be a boolean"),
            (["user": "ann", "device_id": id, "enabled": 0], "enabled", "must be a boolean"),
            (["user": "ann", "device_id": id, "name": 7], "name", "must be a string"),
            (["user": "ann", "device_id": id, "name": String(repeating: "n", count: 257)], "name", nil),
            (["user": "ann", "enabled": false], "device_id", "is required"),
            (["user": "ann", "device_id": id.uppercased(), "enabled": false], "device_id", nil),
            (["user": "ann", "device_id": String(id.dropLast()), "enabled": false], "device_id", nil),
            (["user": "ann", "device_id": id + "0", "enabled": false], "device_id", nil),
            (["user": "", "device_id": id, "enabled": false], "user", nil),
            (["user": 7, "device_id": id, "enabled": false], "user", "must be a string"),
            (["user": "ann", "device_id": id, "enabled": false, "token": Self.token], "token", "unknown parameter"),
        ]
        for (params, field, reason) in cases {
            let r = try c.call("device.update", params)
            #expect(r.errorCode == -32602, "\(params): \(r)")
            #expect(r.errorData?["field"] as? String == field, "\(params): \(r)")
            if let reason { #expect(r.errorData?["reason"] as? String == reason, "\(params): \(r)") }
        }
        // The limit itself is allowed, as at registration.
        let long = String(repeating: "n", count: 256)
        let ok = try c.call("device.update", ["user": "ann", "device_id": id, "name": long])
        #expect((ok.result?["device"] as? [String: Any])?["name"] as? String == long, "\(ok)")

        // Nothing but that name changed; the connection still answers.
        let devices = try #require(try c.call("device.list", ["user": "ann"]).result?["devices"] as? [[String: Any]])
        #expect(devices.count == 1)
        #expect(devices.first?["name"] as? String == long && devices.first?["enabled"] as? Bool == true)
    }

    @Test("an unknown id, another user's device or another app's is 1003 not_found with data.device_id")
    func unknownID() throws {
        let d = try DaemonProcess(appSections: "[app.default]\ndevice_cap = 20\n[app.other]\ndevice_cap = 20\n")
        defer { d.cleanup() }
        let id = try #require(
            try d.call("device.register", ["user": "ann", "platform": "apns", "token": Self.token]).result?[
                "device_id"] as? String)
        let unknown = String(repeating: "ab", count: 16)
        for (params, named) in [
            (["user": "ann", "device_id": unknown, "enabled": false], unknown),
            (["user": "bob", "device_id": id, "enabled": false, "name": "mine"], id),
            (["app": "other", "user": "ann", "device_id": id, "enabled": false], id),
        ] as [([String: Any], String)] {
            let r = try d.call("device.update", params)
            #expect(r.errorCode == 1003, "\(params): \(r)")
            #expect(r.errorData?["reason"] as? String == "not_found")
            #expect(r.errorData?["device_id"] as? String == named)
        }
        // Nothing changed.
        let listed = try #require(try d.call("device.list", ["user": "ann"]).result?["devices"] as? [[String: Any]])
        #expect(listed.first?["enabled"] as? Bool == true && listed.first?["name"] is NSNull)
        // An unknown app is still 1004.
        let app = try d.call("device.update", ["app": "nope", "user": "ann", "device_id": id, "enabled": false])
        #expect(app.errorCode == 1004)
        // Without a user: the app's device of that id, whoever's it is; not another app's.
        let byID = try d.call("device.update", ["device_id": id, "name": "by id"])
        #expect((byID.result?["device"] as? [String: Any])?["name"] as? String == "by id", "\(byID)")
        let otherApp = try d.call("device.update", ["app": "other", "device_id": id, "enabled": false])
        #expect(otherApp.errorCode == 1003 && otherApp.errorData?["device_id"] as? String == id)
        #expect(try d.call("device.update", ["device_id": unknown, "enabled": false]).errorCode == 1003)
        // After device.unregister the id is unknown, with or without the user.
        _ = try d.call("device.unregister", ["user": "ann", "device_id": id])
        #expect(try d.call("device.update", ["user": "ann", "device_id": id, "enabled": true]).errorCode == 1003)
        #expect(try d.call("device.update", ["device_id": id, "enabled": true]).errorCode == 1003)
    }

    @Test("disable, list, re-register, send and enable: the whole round through the socket")
    func roundTrip() throws {
        // No credentials: every send is recorded at once, so the counts are final at the answer.
        let d = try DaemonProcess()
        defer { d.cleanup() }
        let phone = try #require(
            try d.call("device.register", ["user": "ann", "platform": "apns", "token": Self.token, "name": "phone"])
                .result?["device_id"] as? String)
        let tablet = try #require(
            try d.call("device.register", ["user": "ann", "platform": "fcm", "token": "fcm-tablet"]).result?[
                "device_id"] as? String)

        let off = try #require(
            try d.call("device.update", ["user": "ann", "device_id": phone, "enabled": false, "name": "old phone"])
                .result?["device"] as? [String: Any])
        #expect(off["device_id"] as? String == phone && off["enabled"] as? Bool == false)
        #expect(off["name"] as? String == "old phone" && off["platform"] as? String == "apns")
        #expect(off["token_hash"] is String && off["token"] == nil)

        var devices = try #require(try d.call("device.list", ["user": "ann"]).result?["devices"] as? [[String: Any]])
        #expect(devices.allSatisfy { $0["enabled"] is Bool }, "every entry carries enabled")
        #expect(devices.first { $0["device_id"] as? String == phone }?["enabled"] as? Bool == false)
        #expect(devices.first { $0["device_id"] as? String == tablet }?["enabled"] as? Bool == true)

        // Registering the same token again refreshes it and leaves it off.
        let again = try #require(
            try d.call("device.register", ["user": "ann", "platform": "apns", "token": Self.token]).result)
        #expect(again["device_id"] as? String == phone && again["created"] as? Bool == false)
        devices = try #require(try d.call("device.list", ["user": "ann"]).result?["devices"] as? [[String: Any]])
        #expect(devices.first { $0["device_id"] as? String == phone }?["enabled"] as? Bool == false)

        // A send skips it with device_disabled (the fcm device has no
        // credentials here: transport_disabled).
        let sent = try #require(try d.call("push.send", ["to": ["users": ["ann"]]]).result)
        #expect(sent["devices"] as? Int == 0 && sent["skipped"] as? Int == 2, "\(sent)")
        let status = try #require(
            try d.call("push.status", ["message_id": sent["message_id"] as! String, "detail": true]).result)
        let entries = status["devices"] as? [[String: Any]] ?? []
        let phoneEntry = entries.first { $0["device_id"] as? String == phone }
        #expect(phoneEntry?["state"] as? String == "skipped" && phoneEntry?["reason"] as? String == "device_disabled")
        #expect(phoneEntry?["attempts"] as? Int == 0)
        let tabletEntry = entries.first { $0["device_id"] as? String == tablet }
        #expect((tabletEntry?["reason"] as? String ?? "").hasPrefix("transport_disabled"))
        #expect(status["state"] as? String == "complete")

        // Enabled again: the next send reaches the transport rule, not device_disabled.
        let on = try #require(
            try d.call("device.update", ["user": "ann", "device_id": phone, "enabled": true]).result?["device"]
                as? [String: Any])
        #expect(on["enabled"] as? Bool == true && on["name"] as? String == "old phone")
        let next = try #require(try d.call("push.send", ["to": ["devices": [phone]]]).result)
        let nextStatus = try #require(
            try d.call("push.status", ["message_id": next["message_id"] as! String, "detail": true]).result)
        let reason = (nextStatus["devices"] as? [[String: Any]])?.first?["reason"] as? String ?? ""
        #expect(reason.hasPrefix("transport_disabled"), "\(nextStatus)")
        #expect(d.waitForLog("device_updated"), "the change is logged")
        #expect(!d.log().contains("old phone"), "the name is never logged")
    }
}
