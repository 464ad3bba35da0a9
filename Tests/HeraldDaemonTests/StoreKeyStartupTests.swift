import Foundation
import HeraldTestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// `herald serve` run to its exit (a start that must fail): the exit status,
/// what it wrote, and what it told systemd.
private struct FailedStart {
    let status: Int32
    let output: String
    let notified: [String]

    /// Runs `herald serve --config` with a `NOTIFY_SOCKET`; a daemon still
    /// running after `timeout` seconds is stopped and reported with status -1.
    init(config: String, timeout: Double = 30) throws {
        let notify = try NotifyCapture()
        defer { notify.close() }
        let p = Process()
        p.executableURL = URL(fileURLWithPath: heraldBinary())
        p.arguments = ["serve", "--config", config]
        var env = ProcessInfo.processInfo.environment
        for name in ["LISTEN_FDS", "LISTEN_PID", "WATCHDOG_USEC", "WATCHDOG_PID", "CREDENTIALS_DIRECTORY"] {
            env[name] = nil
        }
        env["NOTIFY_SOCKET"] = notify.path
        p.environment = env
        let out = Pipe()
        p.standardOutput = out
        p.standardError = out
        try p.run()
        let deadline = Date().addingTimeInterval(timeout)
        while p.isRunning && Date() < deadline { usleep(20_000) }
        var status = Int32(-1)
        if p.isRunning {
            kill(p.processIdentifier, SIGKILL)
            p.waitUntilExit()
        } else {
            status = p.terminationStatus
        }
        output = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        self.status = status
        notified = notify.collect(for: 0.2)
    }
}

@Suite("The daemon checks the store key against its database", .serialized)
struct StoreKeyStartupTests {
    /// A daemon with three registered devices, stopped.
    private func stoppedWithDevices() throws -> DaemonProcess {
        let d = try DaemonProcess()
        for (i, platform) in ["fcm", "apns", "fcm"].enumerated() {
            var params: [String: Any] = ["user": "u\(i)", "platform": platform, "token": "tok-\(i)-\(platform)"]
            if platform == "apns" {
                params["environment"] = "production"
                params["token"] = String(repeating: "a\(i)", count: 32)
            }
            #expect(try d.call("device.register", params).result?["device_id"] != nil)
        }
        #expect(d.stop() == 0)
        return d
    }

    private func keyPath(_ d: DaemonProcess) -> String { d.dir.appendingPathComponent("store.key").path }
    private func dbPath(_ d: DaemonProcess) -> String { d.dir.appendingPathComponent("herald.db").path }

    /// The one error line of a refused start: priority 3, naming both files.
    private func expectRefusal(_ start: FailedStart, _ d: DaemonProcess, key: [UInt8]?, says: String) {
        #expect(start.status != 0 && start.status != -1, "exit status \(start.status):\n\(start.output)")
        #expect(!start.notified.contains { $0.contains("READY=1") }, "no READY=1: \(start.notified)")
        let errors = start.output.split(separator: "\n").filter { $0.hasPrefix("<3>") }
        #expect(errors.count == 1, "one error line:\n\(start.output)")
        let line = String(errors.first ?? "")
        #expect(line.hasPrefix("<3>startup_failed "), "\(line)")
        #expect(line.contains(keyPath(d)) && line.contains(dbPath(d)), "names the key file and the database: \(line)")
        #expect(line.contains(says), "\(line)")
        if let key {
            let hex = key.map { String(format: "%02x", $0) }.joined()
            let b64 = Data(key).base64EncodedString()
            #expect(!start.output.contains(hex) && !start.output.contains(b64), "no key material in the log")
        }
        #expect(!start.output.contains("herald_started"))
    }

    @Test(
        "another 32-byte key in place of store.key: the start fails (non-zero, one <3> line naming both files, no READY=1)"
    )
    func replacedKey() throws {
        let d = try stoppedWithDevices()
        defer { d.cleanup() }
        let original = try Data(contentsOf: URL(fileURLWithPath: keyPath(d)))
        let other = (0..<32).map { _ in UInt8.random(in: 0...255) }
        try Data(other).write(to: URL(fileURLWithPath: keyPath(d)))
        chmod(keyPath(d), 0o600)
        let start = try FailedStart(config: d.configPath)
        expectRefusal(start, d, key: other, says: "does not open the database")
        #expect(try Data(contentsOf: URL(fileURLWithPath: keyPath(d))) == Data(other), "the key file is left alone")

        // The right key back: it starts, and the devices are there.
        try original.write(to: URL(fileURLWithPath: keyPath(d)))
        chmod(keyPath(d), 0o600)
        try d.start()
        let listed = try d.call("device.list", ["user": "u1"]).result?["devices"] as? [[String: Any]]
        #expect(listed?.count == 1)
    }

    @Test("store.key deleted on a database with devices: the start fails and no new key is created")
    func deletedKey() throws {
        let d = try stoppedWithDevices()
        defer { d.cleanup() }
        let original = try Data(contentsOf: URL(fileURLWithPath: keyPath(d)))
        try FileManager.default.removeItem(atPath: keyPath(d))
        let start = try FailedStart(config: d.configPath)
        expectRefusal(start, d, key: Array(original), says: "is missing but the database")
        #expect(!FileManager.default.fileExists(atPath: keyPath(d)), "no key was created")
        let leftovers = try FileManager.default.contentsOfDirectory(atPath: d.dir.path).filter {
            $0.hasPrefix("store.key")
        }
        #expect(leftovers.isEmpty, "no temporary key file either: \(leftovers)")

        try original.write(to: URL(fileURLWithPath: keyPath(d)))
        chmod(keyPath(d), 0o600)
        try d.start()
        #expect(try d.call("system.health").result?["status"] as? String == "ok")
    }

    @Test("a new state directory: the key is created 0600 and its check value recorded; the next start verifies it")
    func createdOnEmptyDatabase() throws {
        let d = try DaemonProcess()
        defer { d.cleanup() }
        var st = stat()
        #expect(stat(keyPath(d), &st) == 0 && st.st_size == 32)
        #expect(st.st_mode & 0o777 == 0o600, "mode \(String(st.st_mode & 0o777, radix: 8))")
        #expect(d.log().contains("<6>store_key_created "), "\(d.log(tail: 20))")
        #expect(d.stop() == 0)
        try d.start()
        #expect(d.log().components(separatedBy: "store_key_created").count == 2, "created once only")
    }

    @Test(
        "a key file of the wrong size, or one that cannot be read as a key, is a clear startup error naming it",
        arguments: ["short", "directory"])
    func unusableKeyFile(kind: String) throws {
        let d = try stoppedWithDevices()
        defer { d.cleanup() }
        try FileManager.default.removeItem(atPath: keyPath(d))
        let says: String
        if kind == "short" {
            try Data(repeating: 1, count: 31).write(to: URL(fileURLWithPath: keyPath(d)))
            chmod(keyPath(d), 0o600)
            says = "must be exactly 32 bytes (found 31)"
        } else {
            try FileManager.default.createDirectory(atPath: keyPath(d), withIntermediateDirectories: false)
            chmod(keyPath(d), 0o700)
            says = "not a regular file"
        }
        let start = try FailedStart(config: d.configPath)
        #expect(start.status == 1, "\(start.output)")
        #expect(!start.notified.contains { $0.contains("READY=1") })
        let errors = start.output.split(separator: "\n").filter { $0.hasPrefix("<3>") }
        #expect(errors.count == 1 && errors[0].hasPrefix("<3>startup_failed "), "\(start.output)")
        #expect(start.output.contains("[store] key: \(keyPath(d)): \(says)"), "\(start.output)")
    }
}
