import Foundation
import HeraldTestSupport
import Testing

/// Each device's own rules from the command line: `herald register` and
/// `herald device prefs` (time zone, quiet hours, topics), `herald send`
/// (topics, `--not-before`, `--at-local`) and `herald status --watch` (held
/// deliveries). What each command sends is checked against a recording
/// socket; one round trip runs against a real daemon.
@Suite("herald device prefs and timed sends", .serialized)
struct DeviceRulesCommandTests {
    static let id = "07dada258e877bf00e12e921d46d5ab0"

    /// Runs `herald` against a recording socket; the one request it sent.
    func request(_ arguments: [String]) throws -> (method: String, params: [String: Any]) {
        let dir = try TempDir()
        let recorder = try RecordingSocket(in: dir)
        defer { recorder.close() }
        let result = try herald(arguments + ["--socket", recorder.path])
        try #require(result.status == 0, "\(result)")
        let requests = recorder.requests
        try #require(requests.count == 1, "\(requests)")
        let method = try #require(requests[0]["method"] as? String)
        return (method, try #require(requests[0]["params"] as? [String: Any]))
    }

    /// JSON text with sorted keys, to compare two parsed objects.
    func canonical(_ object: [String: Any]) throws -> String {
        String(decoding: try JSONSerialization.data(withJSONObject: object, options: .sortedKeys), as: UTF8.self)
    }

    func object(_ json: String) throws -> [String: Any] {
        try #require(try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: Any])
    }

    @Test(
        "the rules reach the daemon as the interface names them",
        arguments: [
            (
                [
                    "register", "--user", "alice", "--platform", "fcm", "--token", "t", "--time-zone", "Europe/Paris",
                    "--quiet-hours", "22:00-07:00", "--quiet-days", "fri,sat", "--during", "silent", "--topics",
                    "mention,mailbox:inbox",
                ],
                "device.register",
                #"""
                {"user":"alice","platform":"fcm","token":"t","time_zone":"Europe/Paris",
                 "quiet_hours":{"start":"22:00","end":"07:00","days":["fri","sat"],"during":"silent"},
                 "topics":["mention","mailbox:inbox"]}
                """#
            ),
            (
                ["register", "--user", "alice", "--platform", "fcm", "--token", "t"], "device.register",
                #"{"user":"alice","platform":"fcm","token":"t"}"#
            ),
            (
                ["device", "prefs", id, "--time-zone", "America/New_York", "--quiet-hours=23:30-06:15"],
                "device.update",
                #"""
                {"device_id":"\#(id)","time_zone":"America/New_York","quiet_hours":{"start":"23:30","end":"06:15"}}
                """#
            ),
            (
                [
                    "device", "prefs", id, "--user", "alice", "--app", "default", "--clear-time-zone",
                    "--clear-quiet-hours", "--clear-topics",
                ],
                "device.update",
                #"""
                {"app":"default","user":"alice","device_id":"\#(id)","time_zone":null,"quiet_hours":null,"topics":null}
                """#
            ),
            // An empty --topics: the device wants none.
            (["device", "prefs", id, "--topics", ""], "device.update", #"{"device_id":"\#(id)","topics":[]}"#),
            (
                ["send", "--user", "alice", "--topics", "mention", "--not-before", "2026-12-24T09:00:00+01:00"],
                "push.send",
                #"""
                {"to":{"users":["alice"]},"topics":["mention"],"not_before":"2026-12-24T09:00:00+01:00"}
                """#
            ),
            (
                ["send", "--device", id, "--at-local", "09:00", "--ttl", "90000", "--collapse-key", "digest"],
                "push.send",
                #"{"to":{"devices":["\#(id)"]},"collapse_key":"digest","at_local":"09:00","ttl":90000}"#
            ),
            (
                ["send", "--user", "alice", "--not-before", "2026-12-24T08:00:00.250Z"], "push.send",
                #"{"to":{"users":["alice"]},"not_before":"2026-12-24T08:00:00.250Z"}"#
            ),
        ])
    func sent(arguments: [String], method: String, params: String) throws {
        let got = try request(arguments)
        #expect(got.method == method)
        let expected = try object(params)
        #expect(try canonical(got.params) == canonical(expected))
    }

    @Test(
        "bad rules are bad input (exit 2, one line naming the option) without calling the daemon",
        arguments: [
            (["device", "prefs", id, "--quiet-hours", "25:00-07:00"], "--quiet-hours"),
            (["device", "prefs", id, "--quiet-hours", "22:00"], "--quiet-hours"),
            (["device", "prefs", id, "--quiet-hours", "22:00-22:00"], "different"),
            (["device", "prefs", id, "--quiet-hours", "22:00-07:00", "--during", "loud"], "--during"),
            (["device", "prefs", id, "--quiet-hours", "22:00-07:00", "--quiet-days", "fri,someday"], "--quiet-days"),
            (["device", "prefs", id, "--quiet-hours", "22:00-07:00", "--quiet-days", "fri,fri"], "twice"),
            (["device", "prefs", id, "--during", "hold"], "--quiet-hours"),
            (["device", "prefs", id, "--quiet-days", "mon", "--clear-quiet-hours"], "--quiet-hours"),
            (["device", "prefs", id, "--time-zone", "UTC", "--clear-time-zone"], "--clear-time-zone"),
            (["device", "prefs", id, "--time-zone", ""], "--time-zone"),
            (["device", "prefs", id, "--topics", "a b"], "--topics"),
            (["device", "prefs", id, "--topics", "a,,b"], "--topics"),
            (["device", "prefs", id, "--topics", "a,a"], "twice"),
            (["device", "prefs", id], "--time-zone"),
            (["device", "prefs"], "usage"),
            (["device", "prefs", id, "extra", "--clear-topics"], "usage"),
            (["device", "rename", id, "phone", "--time-zone", "UTC"], "--time-zone"),
            (["device", "disable", id, "--clear-topics"], "--clear-topics"),
            (["register", "--user", "u", "--platform", "fcm", "--token", "t", "--clear-topics"], "--clear-topics"),
            (["register", "--user", "u", "--platform", "fcm", "--token", "t", "--quiet-days", "mon"], "--quiet-hours"),
            (
                ["register", "--user", "u", "--platform", "fcm", "--token", "t", "--quiet-hours", "7-9"],
                "--quiet-hours"
            ),
            (["send", "--user", "u", "--topics", ""], "--topics"),
            (["send", "--user", "u", "--topics", ",a"], "--topics"),
            (["send", "--user", "u", "--not-before", "2026-12-24"], "--not-before"),
            (["send", "--user", "u", "--not-before", "2026-12-24T09:00:00"], "--not-before"),
            (["send", "--user", "u", "--not-before", "2026-02-30T09:00:00Z"], "--not-before"),
            (["send", "--user", "u", "--not-before", "2026-12-24T09:00:00+1:00"], "--not-before"),
            (["send", "--user", "u", "--at-local", "24:00"], "--at-local"),
            (["send", "--user", "u", "--at-local", "9:00"], "--at-local"),
            (["send", "--user", "u", "--at-local", "09:00", "--not-before", "2026-12-24T09:00:00Z"], "--not-before"),
        ])
    func badInput(arguments: [String], mentioning: String) throws {
        // No socket exists: bad input is found before any connection is tried.
        let result = try herald(arguments + ["--socket", "/tmp/no-such-herald-\(UUID().uuidString).sock"])
        expectBadInput(result, mentioning: [mentioning])
    }

    @Test("status --watch counts held deliveries among those still open")
    func watchHeld() throws {
        let dir = try TempDir()
        let recorder = try RecordingSocket(in: dir) { index, _, params in
            let first = index == 0
            var counts: [String: Int] = [
                "queued": 0, "held": 0, "in_flight": 0, "delivered": 0, "retrying": 0, "failed": 0, "expired": 0,
                "superseded": 0, "skipped": 0, "removed_stale": 0,
            ]
            if first {
                counts["held"] = 2
                counts["delivered"] = 1
            } else {
                counts["delivered"] = 3
            }
            return [
                "message_id": params["message_id"] ?? "", "created_at": "2026-12-07T22:10:00.000Z",
                "state": first ? "pending" : "complete", "counts": counts,
            ] as [String: Any]
        }
        defer { recorder.close() }
        let result = try herald(["status", Self.id, "--watch", "--interval-ms", "10", "--socket", recorder.path])
        #expect(result.status == 0, "\(result)")
        let lines = result.stderr.split(separator: "\n").map(String.init)
        #expect(lines == ["pending 1/3: delivered 1, held 2", "complete 3/3: delivered 3"], "\(result)")
        #expect(result.stdoutText.contains(#""state":"complete""#), "\(result)")
    }

    @Test("register and device prefs set, show and clear the rules on a real daemon; devices lists them")
    func roundTrip() throws {
        let d = try DaemonProcess()
        defer { d.cleanup() }
        let socket = ["--socket", d.socketPath]
        let registered = try herald(
            [
                "register", "--user", "alice", "--platform", "apns", "--token", "aabbccddeeff00112233445566778899",
                "--time-zone", "Europe/Paris", "--quiet-hours", "22:00-07:00", "--quiet-days", "fri,sat",
                "--topics", "mention,mailbox:inbox",
            ] + socket)
        try #require(registered.status == 0, "\(registered)")

        func listed() throws -> [String: Any] {
            let result = try herald(["devices", "alice"] + socket)
            try #require(result.status == 0, "\(result)")
            let object = try JSONSerialization.jsonObject(with: Data(result.stdout)) as? [String: Any]
            return try #require((object?["devices"] as? [[String: Any]])?.first)
        }
        let device = try listed()
        let id = try #require(device["device_id"] as? String)
        #expect(device["time_zone"] as? String == "Europe/Paris")
        let quiet = try #require(device["quiet_hours"] as? [String: Any])
        #expect(quiet["start"] as? String == "22:00" && quiet["end"] as? String == "07:00")
        #expect(quiet["days"] as? [String] == ["fri", "sat"] && quiet["during"] as? String == "hold")
        #expect(device["topics"] as? [String] == ["mention", "mailbox:inbox"])

        // A rule not named keeps its value.
        let changed = try herald(
            ["device", "prefs", id, "--user", "alice", "--quiet-hours", "23:00-06:30", "--during", "drop"] + socket)
        try #require(changed.status == 0, "\(changed)")
        let answered = try #require(
            (try JSONSerialization.jsonObject(with: Data(changed.stdout)) as? [String: Any])?["device"]
                as? [String: Any])
        let after = try listed()
        #expect(try canonical(answered) == canonical(after), "device.update answered \(answered)")
        let quietAfter = try #require(after["quiet_hours"] as? [String: Any])
        #expect(quietAfter["start"] as? String == "23:00" && quietAfter["during"] as? String == "drop")
        #expect(quietAfter["days"] is NSNull)
        #expect(
            after["time_zone"] as? String == "Europe/Paris"
                && after["topics"] as? [String] == ["mention", "mailbox:inbox"])

        // Quiet hours need a time zone: the daemon refuses, nothing changes.
        let orphaned = try herald(["device", "prefs", id, "--clear-time-zone"] + socket)
        #expect(orphaned.status == 1 && orphaned.stderr.contains("-32602"), "\(orphaned)")
        #expect(orphaned.stderr.contains("time_zone"), "\(orphaned)")
        let unknownZone = try herald(["device", "prefs", id, "--time-zone", "Mars/Olympus_Mons"] + socket)
        #expect(unknownZone.status == 1 && unknownZone.stderr.contains("time_zone"), "\(unknownZone)")
        #expect(try listed()["time_zone"] as? String == "Europe/Paris")

        let cleared = try herald(
            ["device", "prefs", id, "--clear-quiet-hours", "--clear-time-zone", "--clear-topics"] + socket)
        try #require(cleared.status == 0, "\(cleared)")
        let none = try listed()
        #expect(none["time_zone"] is NSNull && none["quiet_hours"] is NSNull && none["topics"] is NSNull, "\(none)")

        // A timed send with topics is accepted; the daemon's own refusals name the param.
        let sent = try herald(["send", "--user", "alice", "--topics", "mention", "--at-local", "09:00"] + socket)
        #expect(sent.status == 0 && sent.stdoutText.contains("message_id"), "\(sent)")
        let tooFar = try herald(["send", "--user", "alice", "--not-before", "2099-01-01T00:00:00Z"] + socket)
        #expect(tooFar.status == 1 && tooFar.stderr.contains("not_before"), "\(tooFar)")
    }

    @Test("device help and the top-level help name device prefs and the new send options")
    func help() throws {
        let device = try herald("device", "help")
        #expect(device.status == 0, "\(device)")
        for text in ["herald device prefs", "--quiet-hours", "--clear-topics"] {
            #expect(device.stdoutText.contains(text), "\(text) missing from herald device help")
        }
        let top = try herald("help")
        for text in ["device prefs", "--time-zone", "--not-before", "--at-local", "--topics"] {
            #expect(top.stdoutText.contains(text), "\(text) missing from herald help")
        }
    }
}
