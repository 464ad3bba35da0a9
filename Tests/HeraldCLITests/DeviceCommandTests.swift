import Foundation
import HeraldTestSupport
import Testing

/// `herald device rename | disable | enable` and `herald devices`, against a
/// running daemon.
@Suite("herald device", .serialized)
struct DeviceCommandTests {
    static let token = "aabbccddeeff00112233445566778899"

    /// The first device of the listing, parsed.
    func listed(_ socket: [String], user: String = "alice") throws -> [String: Any] {
        let result = try herald(["devices", user] + socket)
        try #require(result.status == 0, "\(result)")
        let object = try JSONSerialization.jsonObject(with: Data(result.stdout)) as? [String: Any]
        return try #require((object?["devices"] as? [[String: Any]])?.first)
    }

    /// The `device` of a device.update answer on stdout.
    func answered(_ result: RunResult) throws -> [String: Any] {
        try #require(result.status == 0, "\(result)")
        #expect(result.stderr.isEmpty)
        let object = try JSONSerialization.jsonObject(with: Data(result.stdout)) as? [String: Any]
        return try #require(object?["device"] as? [String: Any])
    }

    @Test("rename, disable and enable change one device by id; devices shows the state")
    func roundTrip() throws {
        let d = try DaemonProcess()
        defer { d.cleanup() }
        let socket = ["--socket", d.socketPath]
        let registered = try herald(
            ["register", "--user", "alice", "--platform", "apns", "--token", Self.token, "--name", "phone"] + socket)
        try #require(registered.status == 0, "\(registered)")
        let before = try listed(socket)
        let id = try #require(before["device_id"] as? String)
        #expect(before["enabled"] as? Bool == true)

        let renamed = try answered(try herald(["device", "rename", id, "work phone", "--user", "alice"] + socket))
        #expect(renamed["name"] as? String == "work phone" && renamed["enabled"] as? Bool == true)

        let off = try answered(try herald(["device", "disable", id, "--user", "alice"] + socket))
        #expect(off["enabled"] as? Bool == false && off["name"] as? String == "work phone")
        let shown = try listed(socket)
        #expect(shown["enabled"] as? Bool == false && shown["device_id"] as? String == id)

        // Registering the token again through the CLI leaves it off.
        let again = try herald(["register", "--user", "alice", "--platform", "apns", "--token", Self.token] + socket)
        try #require(again.status == 0, "\(again)")
        #expect(try listed(socket)["enabled"] as? Bool == false)

        let on = try answered(try herald(["device", "enable", id, "--user", "alice", "--app", "default"] + socket))
        #expect(on["enabled"] as? Bool == true)
        #expect(try listed(socket)["enabled"] as? Bool == true)

        // The id alone is enough: an operator often has nothing else.
        let byID = try answered(try herald(["device", "disable", id] + socket))
        #expect(byID["enabled"] as? Bool == false && byID["device_id"] as? String == id)
        let renamedByID = try answered(try herald(["device", "rename", id, "old phone"] + socket))
        #expect(renamedByID["name"] as? String == "old phone")
        // With --user the device must be that user's.
        let notBobs = try herald(["device", "enable", id, "--user", "bob"] + socket)
        #expect(notBobs.status == 1 && notBobs.stderr.contains("1003"), "\(notBobs)")
    }

    @Test("a device the user does not have: the JSON-RPC error on stderr, exit 1")
    func unknownDevice() throws {
        let d = try DaemonProcess()
        defer { d.cleanup() }
        let socket = ["--socket", d.socketPath]
        let unknown = String(repeating: "0", count: 32)
        let result = try herald(["device", "disable", unknown, "--user", "alice"] + socket)
        #expect(result.status == 1, "\(result)")
        #expect(result.stdout.isEmpty)
        #expect(result.stderr.contains("1003") && result.stderr.contains("not_found"), "\(result)")
        #expect(result.stderr.contains(unknown))
        // A malformed id is the daemon's -32602 on device_id.
        let bad = try herald(["device", "enable", "XYZ", "--user", "alice"] + socket)
        #expect(bad.status == 1 && bad.stderr.contains("-32602") && bad.stderr.contains("device_id"), "\(bad)")
    }

    @Test(
        "usage mistakes are bad input (exit 2, one line) without calling the daemon",
        arguments: [
            (["device"], "rename"),
            (["device", "bogus"], "bogus"),
            (["device", "rename", "0123"], "usage"),
            (["device", "rename", "0123", "name", "extra", "--user", "u"], "usage"),
            (["device", "disable"], "usage"),
            (["device", "disable", "0123", "--name", "x", "--user", "u"], "--name"),
            (["device", "enable"], "usage"),
        ])
    func usage(arguments: [String], mentioning: String) throws {
        // No socket exists: bad input is found before any connection is tried.
        let result = try herald(arguments + ["--socket", "/tmp/no-such-herald-\(UUID().uuidString).sock"])
        expectBadInput(result, mentioning: [mentioning])
    }

    @Test("device help and the top-level help name the commands")
    func help() throws {
        let device = try herald("device", "help")
        #expect(device.status == 0 && device.stdoutText.contains("herald device disable"), "\(device)")
        let top = try herald("help")
        for command in ["device rename", "device disable", "device enable"] {
            #expect(top.stdoutText.contains(command), "\(command) missing from herald help")
        }
    }
}
