import Foundation
import HeraldTestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

@Suite("client commands", .serialized)
struct ClientCommandTests {
    @Test("register, devices, health, stats and call work against a running daemon")
    func clients() throws {
        let d = try DaemonProcess()
        defer { d.cleanup() }
        let socket = ["--socket", d.socketPath]

        let (hs, hout, _) = try runHerald(["health"] + socket)
        #expect(hs == 0)
        #expect(hout.contains("\"status\":\"ok\""))

        let (rs, rout, rerr) = try runHerald(
            [
                "register", "--user", "alice", "--platform", "apns", "--token", "AABBCCDDEEFF00112233445566778899",
                "--name", "phone",
            ]
                + socket)
        #expect(rs == 0, "\(rerr)")
        let registered = try JSONSerialization.jsonObject(with: Data(rout.utf8)) as? [String: Any]
        #expect(registered?["created"] as? Bool == true)

        let (ds, dout, _) = try runHerald(["devices", "alice"] + socket)
        #expect(ds == 0)
        let listed = try JSONSerialization.jsonObject(with: Data(dout.utf8)) as? [String: Any]
        #expect((listed?["devices"] as? [[String: Any]])?.first?["name"] as? String == "phone")
        #expect(!dout.contains("aabbccddeeff"), "no raw token in the listing")

        let (ss, sout, _) = try runHerald(["stats"] + socket)
        #expect(ss == 0)
        #expect(sout.contains("\"apns\":1"))

        // A failing call prints the JSON-RPC error on stderr and exits 1.
        let (cs, cout, cerr) = try runHerald(["call", "device.list", #"{"user":""}"#] + socket)
        #expect(cs == 1)
        #expect(cout.isEmpty)
        #expect(cerr.contains("-32602") && cerr.contains("\"field\":\"user\""))

        // The socket comes from HERALD_SOCKET, then from the config.
        #expect(try runHerald(["health"], environment: ["HERALD_SOCKET": d.socketPath]).0 == 0)
        #expect(try runHerald(["health", "--config", d.configPath]).0 == 0)
    }

    @Test("health exits 1 when the daemon cannot be reached")
    func unreachable() throws {
        let (status, out, err) = try runHerald(["health", "--socket", "/tmp/no-such-herald.sock"])
        #expect(status == 1)
        #expect(out.isEmpty)
        #expect(err.contains("cannot connect"))
    }

    @Test("the connection limit answers 1007 overloaded and closes; others keep working")
    func connectionLimit() throws {
        // Every connection is root's: the per-uid cap must not be the one reached.
        let d = try DaemonProcess(server: "max_connections_per_uid = 512")
        defer { d.cleanup() }
        // The start's readiness probe (connection 1) counts until the daemon
        // has seen it close: with 512 more, the last would be the one refused.
        #expect(d.waitForLog("connection_closed conn=1\n"))
        var open: [TestConnection] = []
        defer { open.forEach { $0.close() } }
        for _ in 0..<512 { open.append(try d.connect()) }
        // Make sure the daemon has accepted them all.
        _ = try open[511].call("system.health")
        let extra = try d.connect()
        defer { extra.close() }
        let line = try #require(extra.readLine(timeout: 30))
        let response = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
        #expect(response?.errorCode == 1007)
        #expect((response?.errorData?["retry_after_ms"] as? Int ?? 0) > 0)
        #expect(extra.readsEOF())
        // Once the daemon has seen a close, a new connection is served again.
        open.removeLast().close()
        let deadline = Date().addingTimeInterval(30)
        var health = try? d.call("system.health")
        while health?.result == nil && Date() < deadline {
            usleep(20_000)
            health = try? d.call("system.health")
        }
        // Served, whatever the health says (a machine loaded by parallel
        // tests may see a slow store ping and answer "degraded").
        #expect(health?.result?["status"] is String, "\(String(describing: health))")
    }
}
