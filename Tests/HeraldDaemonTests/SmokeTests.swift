import Foundation
import HeraldTestSupport
import Testing

@Suite("daemon smoke", .serialized)
struct SmokeTests {
    @Test("starts, answers health, registers and lists, stops with status 0")
    func lifecycle() throws {
        let d = try DaemonProcess()
        defer { d.cleanup() }
        let health = try d.call("system.health")
        #expect(health.result?["status"] as? String == "ok")
        let reg = try d.call("device.register", ["user": "alice", "platform": "fcm", "token": "tok-1"])
        #expect(reg.result?["created"] as? Bool == true)
        let list = try d.call("device.list", ["user": "alice"])
        #expect((list.result?["devices"] as? [Any])?.count == 1)
        #expect(d.stop() == 0)
    }
}
