import Foundation
import HeraldTestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// `herald events` against a running daemon whose default app has no
/// credentials: every push is skipped at once, which is a final outcome
/// with its events like any other.
@Suite("herald events", .serialized)
struct EventsCommandTests {
    static let token = "aabbccddeeff00112233445566778899"

    /// Registers alice's phone; the socket arguments.
    func daemonWithDevice() throws -> (DaemonProcess, [String]) {
        let d = try DaemonProcess()
        let socket = ["--socket", d.socketPath]
        let registered = try herald(
            ["register", "--user", "alice", "--platform", "apns", "--token", Self.token] + socket)
        try #require(registered.status == 0, "\(registered)")
        return (d, socket)
    }

    /// Sends to alice and waits for it to be complete; the message id.
    func send(_ socket: [String]) throws -> String {
        let sent = try herald(["send", "--user", "alice", "--wait"] + socket)
        try #require(sent.status == 0, "\(sent)")
        let object = try JSONSerialization.jsonObject(with: Data(sent.stdout)) as? [String: Any]
        return try #require(object?["message_id"] as? String)
    }

    /// Every stdout line as a JSON object (each must be one).
    func events(_ stdout: [UInt8]) throws -> [[String: Any]] {
        try String(decoding: stdout, as: UTF8.self).split(separator: "\n").map {
            try #require(try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any], "\($0)")
        }
    }

    @Test("without --follow: the events kept, one JSON object a line, then exit 0")
    func backlog() throws {
        let (d, socket) = try daemonWithDevice()
        defer { d.cleanup() }
        let first = try send(socket)
        let second = try send(socket)

        let result = try herald(["events"] + socket)
        #expect(result.status == 0 && result.stderr.isEmpty, "\(result)")
        let all = try events(result.stdout)
        let deliveries = all.filter { $0["kind"] as? String == "delivery" }
        #expect(deliveries.map { $0["message_id"] as? String } == [first, second])
        for e in deliveries {
            #expect(e["user"] as? String == "alice" && e["platform"] as? String == "apns")
            #expect(e["state"] as? String == "skipped" && e["app"] as? String == "default")
            #expect(e["device_id"] is String && e["at"] is String && e["cursor"] is String)
        }
        let complete = all.filter { $0["kind"] as? String == "message_complete" }
        #expect(complete.map { $0["message_id"] as? String } == [first, second])
        #expect((complete.first?["counts"] as? [String: Any])?["skipped"] as? Int == 1)

        // --since: what comes after that event; --kinds: only those.
        let cursor = try #require(deliveries.last?["cursor"] as? String)
        let after = try herald(["events", "--since", cursor] + socket)
        #expect(after.status == 0, "\(after)")
        let later = try events(after.stdout).filter {
            ["delivery", "message_complete"].contains($0["kind"] as? String)
        }
        #expect(later.count == 1 && later.first?["kind"] as? String == "message_complete")
        #expect(later.first?["message_id"] as? String == second)

        let only = try herald(["events", "--kinds", "message_complete", "--app", "default"] + socket)
        #expect(only.status == 0, "\(only)")
        #expect(try events(only.stdout).map { $0["kind"] as? String } == ["message_complete", "message_complete"])
    }

    @Test("--follow prints what comes after it started, and SIGTERM ends it with status 0")
    func follow() throws {
        let (d, socket) = try daemonWithDevice()
        defer { d.cleanup() }
        let before = try send(socket)
        let follower = try Follower(["events", "--follow", "--kinds", "message_complete"] + socket)
        defer { follower.kill() }

        // Sent until one is seen: the subscription starts when the daemon answers it.
        var sent: [String] = []
        let deadline = Date().addingTimeInterval(20)
        var seen: [String] = []
        while Date() < deadline {
            sent.append(try send(socket))
            Thread.sleep(forTimeInterval: 0.2)
            seen = try events(follower.stdout).compactMap { $0["message_id"] as? String }
            if !seen.isEmpty { break }
        }
        try #require(!seen.isEmpty, "nothing printed: \(follower.stderr)")
        #expect(!seen.contains(before), "without --since it starts from now")
        #expect(Set(seen).isSubset(of: Set(sent)))
        // Every message sent after the first one printed is printed too.
        let last = try send(socket)
        #expect(
            follower.waitFor {
                (try? events(follower.stdout))?.contains { $0["message_id"] as? String == last } == true
            })

        let status = follower.stop(SIGTERM)
        #expect(status == 0, "\(follower.stderr)")
    }

    @Test("--follow --since reads the backlog first; a daemon that goes away is status 1 with the cursor")
    func followSinceAndDaemonGone() throws {
        let (d, socket) = try daemonWithDevice()
        defer { d.cleanup() }
        let first = try send(socket)
        let follower = try Follower(["events", "--follow", "--since", "0"] + socket)
        defer { follower.kill() }
        #expect(
            follower.waitFor {
                (try? events(follower.stdout))?.contains {
                    $0["kind"] as? String == "message_complete" && $0["message_id"] as? String == first
                } == true
            })
        let cursor = try #require(try events(follower.stdout).last?["cursor"] as? String)
        _ = d.stop()
        #expect(follower.waitForExit() == 1)
        #expect(follower.stderr.hasPrefix("herald: "))
        #expect(follower.stderr.contains("--since \(cursor)"), "\(follower.stderr)")
    }

    @Test(
        "usage mistakes are bad input (exit 2, one line) without calling the daemon",
        arguments: [
            (["events", "extra"], "extra"),
            (["events", "--kinds", "delivery,,transport"], "--kinds"),
            (["events", "--since", ""], "--since"),
            (["events", "--follow=yes"], "--follow"),
            (["events", "--bogus"], "--bogus"),
        ])
    func usage(arguments: [String], mentioning: String) throws {
        expectBadInput(try herald(arguments + ["--socket", "/nonexistent/herald.sock"]), mentioning: [mentioning])
    }

    @Test("--help prints the usage")
    func help() throws {
        let result = try herald("events", "--help")
        #expect(result.status == 0 && result.stdoutText.contains("usage: herald events"), "\(result)")
        #expect(try herald("help").stdoutText.contains("herald events"))
    }

    @Test("a call the daemon refuses and a socket with no daemon are status 1 with one line")
    func failures() throws {
        let d = try DaemonProcess()
        defer { d.cleanup() }
        let refused = try herald("events", "--kinds", "delivery,bogus", "--socket", d.socketPath)
        #expect(refused.status == 1 && refused.stdout.isEmpty, "\(refused)")
        #expect(refused.stderr.hasPrefix("herald: error -32602") && isSingleLine(refused.stderr), "\(refused)")
        let badCursor = try herald("events", "--since", "yesterday", "--socket", d.socketPath)
        #expect(badCursor.status == 1 && badCursor.stderr.contains("since"), "\(badCursor)")

        let dir = try TempDir()
        let absent = try herald("events", "--follow", "--socket", dir.path("none.sock"))
        #expect(absent.status == 1 && absent.stderr.contains("cannot connect"), "\(absent)")
    }
}

/// `herald` running in the background, its stdout and stderr collected.
final class Follower: @unchecked Sendable {
    private let process = Process()
    private let lock = NSLock()
    private var out: [UInt8] = []
    private var err: [UInt8] = []

    init(_ arguments: [String]) throws {
        process.executableURL = try Herald.binary()
        process.arguments = arguments
        let outPipe = Pipe()
        let errPipe = Pipe()
        process.standardOutput = outPipe
        process.standardError = errPipe
        process.standardInput = FileHandle.nullDevice
        outPipe.fileHandleForReading.readabilityHandler = { [self] h in
            let data = h.availableData
            lock.withLock { out += data }
        }
        errPipe.fileHandleForReading.readabilityHandler = { [self] h in
            let data = h.availableData
            lock.withLock { err += data }
        }
        try process.run()
    }

    /// Complete lines only.
    var stdout: [UInt8] {
        lock.withLock {
            guard let end = out.lastIndex(of: UInt8(ascii: "\n")) else { return [] }
            return Array(out[...end])
        }
    }

    var stderr: String { lock.withLock { String(decoding: err, as: UTF8.self) } }

    /// Polls until `condition` holds (true) or 15 s pass (false).
    func waitFor(_ condition: () -> Bool) -> Bool {
        let deadline = Date().addingTimeInterval(15)
        while Date() < deadline {
            if condition() { return true }
            Thread.sleep(forTimeInterval: 0.05)
        }
        return condition()
    }

    /// Its exit status; -1 if it is still running after 15 s.
    func waitForExit() -> Int32 {
        guard waitFor({ !process.isRunning }) else { return -1 }
        process.waitUntilExit()
        // What it wrote last reaches the handlers after it exits.
        Thread.sleep(forTimeInterval: 0.1)
        return process.terminationReason == .exit ? process.terminationStatus : 128 + process.terminationStatus
    }

    func stop(_ sig: Int32) -> Int32 {
        if process.isRunning { Glibc.kill(process.processIdentifier, sig) }
        return waitForExit()
    }

    func kill() {
        if process.isRunning { Glibc.kill(process.processIdentifier, SIGKILL) }
    }
}
