import Foundation
import HeraldTestSupport
import HeraldCrypto
import HeraldStore
import Testing

@Suite("registration identity", .serialized)
struct RegistrationIdentityTests {
    static func webKeys() throws -> [String: String] {
        [
            "p256dh": Base64URL.encode(try P256PrivateKey.generate().publicKey),
            "auth": Base64URL.encode(try SecureRandom.bytes(16)),
        ]
    }

    @Test("a device first registered by token takes the registration_id's id once one is given")
    func rekey() throws {
        let d = try DaemonProcess()
        defer { d.cleanup() }
        let c = try d.connect()
        defer { c.close() }
        let first = try #require(
            try c.call("device.register", ["user": "ann", "platform": "fcm", "token": "tok-a", "name": "pixel"]).result)
        let named = try #require(
            try c.call(
                "device.register",
                ["user": "ann", "platform": "fcm", "token": "tok-a", "registration_id": "inst-9", "version": 1]
            ).result)
        let expected = Identity.deviceID(user: "ann", app: "default", registrationID: "inst-9")
        #expect(named["device_id"] as? String == expected)
        #expect(first["device_id"] as? String != expected)
        #expect(named["created"] as? Bool == false)
        let devices = try #require(try c.call("device.list", ["user": "ann"]).result?["devices"] as? [[String: Any]])
        #expect(devices.count == 1)
        #expect(devices.first?["device_id"] as? String == expected)
        #expect(devices.first?["name"] as? String == "pixel", "fields survive the re-key")
        // The ordering rules now apply to it.
        let older = try c.call(
            "device.register",
            ["user": "ann", "platform": "fcm", "token": "tok-b", "registration_id": "inst-9", "version": 0])
        #expect(older.errorCode == 1008)
    }

    @Test("registration_id and version go together")
    func pairRequired() throws {
        let d = try DaemonProcess()
        defer { d.cleanup() }
        let r = try d.call("device.register", ["user": "ann", "platform": "fcm", "token": "t", "registration_id": "x"])
        #expect(r.errorCode == -32602)
        #expect(r.errorData?["field"] as? String == "version")
        #expect(try d.call("device.list", ["user": "ann"]).result?["devices"] as? [Any] != nil)
        #expect((try d.call("device.list", ["user": "ann"]).result?["devices"] as? [Any])?.isEmpty == true)
    }

    @Test("spellings of one Web Push endpoint are one device, and unregister finds it by any spelling")
    func webNormalization() throws {
        let d = try DaemonProcess()
        defer { d.cleanup() }
        let c = try d.connect()
        defer { c.close() }
        let keys = try Self.webKeys()
        let a = try #require(
            try c.call(
                "device.register",
                ["user": "wes", "platform": "web", "token": "https://93.184.215.14/push/abc", "keys": keys]
            ).result)
        let b = try #require(
            try c.call(
                "device.register",
                ["user": "wes", "platform": "web", "token": "HTTPS://93.184.215.14:443/push/abc", "keys": keys]
            ).result)
        #expect(b["device_id"] as? String == a["device_id"] as? String)
        #expect(b["created"] as? Bool == false)
        let removed = try c.call(
            "device.unregister", ["user": "wes", "platform": "web", "token": "https://93.184.215.14:443/push/abc"])
        #expect(removed.result?["removed"] as? Int == 1)
    }
}
