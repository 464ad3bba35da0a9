import Foundation
import HeraldCrypto
import HeraldStore
import HeraldTestSupport
import Testing

/// The Web Push form on every platform and client builds (`app_id`,
/// `user_agent`) over the socket, and on the command line.
@Suite("registration forms and client builds over the socket", .serialized)
struct FormsAndBuildsSocketTests {
    static func webKeys() throws -> [String: String] {
        [
            "p256dh": Base64URL.encode(try P256PrivateKey.generate().publicKey),
            "auth": Base64URL.encode(try SecureRandom.bytes(16)),
        ]
    }

    @Test("one token under two builds is two registrations with two ids; unregister by values takes app_id")
    func twoBuilds() throws {
        let d = try DaemonProcess()
        defer { d.cleanup() }
        let c = try d.connect()
        defer { c.close() }
        let stable = try #require(
            try c.call("device.register", ["user": "bo", "platform": "fcm", "token": "tok-shared"]).result)
        // A stable registration's id is derived as before builds existed.
        #expect(
            stable["device_id"] as? String
                == Identity.deviceID(user: "bo", app: "default", platform: .fcm, environment: nil, token: "tok-shared"))
        let beta = try #require(
            try c.call(
                "device.register",
                ["user": "bo", "platform": "fcm", "token": "tok-shared", "app_id": "beta", "user_agent": "Chat/2 beta"]
            ).result)
        #expect(beta["created"] as? Bool == true && beta["device_id"] as? String != stable["device_id"] as? String)
        let betaAgain = try #require(
            try c.call("device.register", ["user": "bo", "platform": "fcm", "token": "tok-shared", "app_id": "beta"])
                .result)
        #expect(betaAgain["device_id"] as? String == beta["device_id"] as? String)
        #expect(betaAgain["created"] as? Bool == false)

        var devices = try #require(try c.call("device.list", ["user": "bo"]).result?["devices"] as? [[String: Any]])
        #expect(devices.count == 2)
        let betaRow = try #require(devices.first { $0["app_id"] as? String == "beta" })
        #expect(betaRow["user_agent"] as? String == "Chat/2 beta" && betaRow["form"] as? String == "legacy")
        let stableRow = try #require(devices.first { $0["app_id"] as? String == "stable" })
        #expect(stableRow["user_agent"] is NSNull)

        let removed = try c.call(
            "device.unregister", ["user": "bo", "platform": "fcm", "token": "tok-shared", "app_id": "beta"])
        #expect(removed.result?["removed"] as? Int == 1)
        devices = try #require(try c.call("device.list", ["user": "bo"]).result?["devices"] as? [[String: Any]])
        #expect(devices.map { $0["device_id"] as? String } == [stable["device_id"] as? String])
        let byDefault = try c.call("device.unregister", ["user": "bo", "platform": "fcm", "token": "tok-shared"])
        #expect(byDefault.result?["removed"] as? Int == 1, "no app_id: the stable registration")
    }

    @Test("app_id and user_agent at their limits are accepted; one past them is refused at the field, nothing stored")
    func limits() throws {
        let d = try DaemonProcess()
        defer { d.cleanup() }
        let c = try d.connect()
        defer { c.close() }
        let longID = String(repeating: "a", count: 60) + "._-9"
        let agent = String(repeating: "é", count: 1024)
        let ok = try c.call(
            "device.register",
            ["user": "li", "platform": "fcm", "token": "tok-li", "app_id": longID, "user_agent": agent])
        #expect(ok.result != nil, "\(ok)")
        let listed = try #require(
            (try c.call("device.list", ["user": "li"]).result?["devices"] as? [[String: Any]])?.first)
        #expect(listed["app_id"] as? String == longID && listed["user_agent"] as? String == agent)
        for (field, value) in [("app_id", longID + "x"), ("user_agent", agent + "é"), ("app_id", "")] {
            let r = try c.call(
                "device.register", ["user": "li", "platform": "fcm", "token": "tok-li2", field: value])
            #expect(r.errorCode == -32602 && r.errorData?["field"] as? String == field, "\(field): \(r)")
        }
        #expect((try c.call("device.list", ["user": "li"]).result?["devices"] as? [Any])?.count == 1)
    }

    @Test(
        "the Web Push form on fcm, apns_voip and unified_push: registered, listed as webpush, normalised, unregistered by values"
    )
    func webPushFormEverywhere() throws {
        let d = try DaemonProcess()
        defer { d.cleanup() }
        let c = try d.connect()
        defer { c.close() }
        for (i, platform) in ["fcm", "apns_voip", "unified_push", "web"].enumerated() {
            let endpoint = "https://93.184.215.14/push/\(platform)-\(i)"
            let r = try c.call(
                "device.register", ["user": "wp", "platform": platform, "token": endpoint, "keys": try Self.webKeys()])
            #expect(r.result?["created"] as? Bool == true, "\(platform): \(r)")
            // Another spelling of the endpoint is the same registration.
            let again = try c.call(
                "device.register",
                [
                    "user": "wp", "platform": platform, "token": "HTTPS://93.184.215.14:443/push/\(platform)-\(i)",
                    "keys": try Self.webKeys(),
                ])
            #expect(again.result?["device_id"] as? String == r.result?["device_id"] as? String, "\(platform)")
        }
        let devices = try #require(try c.call("device.list", ["user": "wp"]).result?["devices"] as? [[String: Any]])
        #expect(devices.count == 4 && devices.allSatisfy { $0["form"] as? String == "webpush" })
        #expect(devices.first { $0["platform"] as? String == "apns_voip" }?["environment"] as? String == "production")
        for (i, platform) in ["fcm", "apns_voip", "unified_push", "web"].enumerated() {
            let removed = try c.call(
                "device.unregister",
                ["user": "wp", "platform": platform, "token": "https://93.184.215.14:443/push/\(platform)-\(i)"])
            #expect(removed.result?["removed"] as? Int == 1, "\(platform): \(removed)")
        }
        let stats = try #require(try c.call("system.stats").result)
        #expect((stats["devices"] as? [String: Int])?["unified_push"] == 0)
    }

    @Test(
        "herald register takes --app-id and --user-agent and platform unified_push; herald devices shows form, app_id and user_agent"
    )
    func commandLine() throws {
        let d = try DaemonProcess()
        defer { d.cleanup() }
        let socket = ["--socket", d.socketPath]
        let keys = try Self.webKeys()
        let (rs, _, rerr) = try runHerald(
            [
                "register", "--user", "cl", "--platform", "unified_push", "--token", "https://93.184.215.14/up/cl",
                "--p256dh", keys["p256dh"]!, "--auth", keys["auth"]!, "--app-id", "canary", "--user-agent",
                "Chat/9 (Android)",
            ] + socket)
        #expect(rs == 0, "\(rerr)")
        let (ds, dout, _) = try runHerald(["devices", "cl"] + socket)
        #expect(ds == 0)
        let listed = try #require(
            ((try JSONSerialization.jsonObject(with: Data(dout.utf8)) as? [String: Any])?["devices"]
                as? [[String: Any]])?.first)
        #expect(listed["platform"] as? String == "unified_push" && listed["form"] as? String == "webpush")
        #expect(listed["app_id"] as? String == "canary" && listed["user_agent"] as? String == "Chat/9 (Android)")
        let (bs, _, berr) = try runHerald(
            ["register", "--user", "cl", "--platform", "fcm", "--token", "t", "--app-id", "no good"] + socket)
        #expect(bs == 1 && berr.contains("\"field\":\"app_id\""), "\(berr)")
        let (_, help, _) = try runHerald(["help"])
        #expect(help.contains("--app-id") && help.contains("--user-agent") && help.contains("unified_push"))
    }
}
