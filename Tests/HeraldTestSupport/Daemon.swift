public import Foundation
public import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The herald binary was not built where the tests look for it.
public struct HeraldBinaryNotFound: Error, CustomStringConvertible {
    public let searched: [String]
    public var description: String {
        "the herald binary was not found (run `swift build` first); looked at: " + searched.joined(separator: ", ")
    }
}

/// The built `herald` binary: next to the test bundle (same build directory
/// and configuration), else `.build/debug/herald` under the package root.
public let heraldBinaryLocation: Result<URL, HeraldBinaryNotFound> = {
    let fm = FileManager.default
    var searched: [String] = []
    func candidate(_ url: URL) -> URL? {
        let path = url.standardizedFileURL.path
        searched.append(path)
        var isDir: ObjCBool = false
        if fm.fileExists(atPath: path, isDirectory: &isDir), !isDir.boolValue, fm.isExecutableFile(atPath: path) {
            return url.standardizedFileURL
        }
        return nil
    }
    if let first = CommandLine.arguments.first {
        let sibling = URL(fileURLWithPath: first).deletingLastPathComponent().appendingPathComponent("herald")
        if let found = candidate(sibling) { return .success(found) }
    }
    var dir = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
    while dir.path != "/" && !dir.path.isEmpty {
        if fm.fileExists(atPath: dir.appendingPathComponent("Package.swift").path) {
            if let found = candidate(dir.appendingPathComponent(".build/debug/herald")) { return .success(found) }
            break
        }
        dir = dir.deletingLastPathComponent()
    }
    return .failure(HeraldBinaryNotFound(searched: searched))
}()

/// The built `herald` binary's path; stops the test run when there is none.
public func heraldBinary() -> String {
    switch heraldBinaryLocation {
    case .success(let url): return url.path
    case .failure(let error): fatalError(error.description)
    }
}

/// A real `herald serve` in a temporary directory, talking over its socket.
public final class DaemonProcess: @unchecked Sendable {
    public let dir: URL
    public let socketPath: String
    public let configPath: String
    private var process: Process?
    private let logPath: String
    /// The current process's end is accounted for: it was stopped by `stop()`
    /// (its status judged there), killed on purpose by `kill9()`, or never came up.
    private var ended = false
    /// What `stop()` returned for the current process.
    private var stopStatus: Int32 = 0
    /// When the test itself sent SIGTERM or SIGINT (through `signal(_:)`).
    private var terminationSent: Date?

    /// See `daemonShutdownBudget`.
    public static let shutdownBudget: Double = daemonShutdownBudget
    /// Set for the next `start()` on top of the inherited environment
    /// (which loses NOTIFY_SOCKET and LISTEN_* first), e.g. NOTIFY_SOCKET or WATCHDOG_USEC.
    public var environment: [String: String] = [:]

    /// `appSections` replaces the default `[app.default]` section; `extra`
    /// is appended to the config as is.
    /// `server`, `delivery` and `endpoints` are extra lines for those sections.
    public init(
        appSections: String = "[app.default]\ndevice_cap = 20\n", synchronous: String = "full",
        allowPrivate: Bool = false, extra: String = "", server: String = "", delivery: String = "",
        endpoints: String = "", logLevel: String = "debug", metrics: String = "",
        environment: [String: String] = [:]
    ) throws {
        self.environment = environment
        dir = URL(fileURLWithPath: "/tmp").appendingPathComponent("hd-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        socketPath = dir.appendingPathComponent("herald.sock").path
        configPath = dir.appendingPathComponent("herald.conf").path
        logPath = dir.appendingPathComponent("stderr.log").path
        let config = """
            [server]
            socket = \(socketPath)
            socket_mode = 0600
            state_dir = \(dir.path)
            log_level = \(logLevel)
            \(server)

            [store]
            key = \(dir.path)/store.key
            synchronous = \(synchronous)

            [delivery]
            \(delivery)

            [endpoints]
            webpush_allow_private = \(allowPrivate)
            \(endpoints)

            [metrics]
            \(metrics)

            \(appSections)
            \(extra)
            """
        try config.write(toFile: configPath, atomically: true, encoding: .utf8)
        try start()
    }

    public func start() throws {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: heraldBinary())
        p.arguments = ["serve", "--config", configPath]
        if !FileManager.default.fileExists(atPath: logPath) {
            _ = FileManager.default.createFile(atPath: logPath, contents: nil)  // a restart appends
        }
        let sink = FileHandle(forWritingAtPath: logPath)!
        sink.seekToEndOfFile()
        p.standardError = sink
        p.standardOutput = sink
        var env = ProcessInfo.processInfo.environment
        env["NOTIFY_SOCKET"] = nil
        env["LISTEN_FDS"] = nil
        env["LISTEN_PID"] = nil
        env["WATCHDOG_USEC"] = nil
        env["WATCHDOG_PID"] = nil
        for (k, v) in environment { env[k] = v }
        p.environment = env
        try p.run()
        process = p
        ended = false
        terminationSent = nil
        let deadline = Date().addingTimeInterval(15)
        while Date() < deadline {
            if let c = try? TestConnection(path: socketPath) {
                c.close()
                return
            }
            if !p.isRunning { break }
            usleep(20_000)
        }
        // A start that fails is the caller's to judge (it gets the error); the
        // process is not left behind for `stop()` to report.
        if p.isRunning { kill(p.processIdentifier, SIGKILL) }
        p.waitUntilExit()
        ended = true
        stopStatus = exitCode(p)
        throw HarnessError("daemon did not start (\(exitDescription(p))):\n\(log(tail: 40))")
    }

    /// SIGTERM, then wait up to `shutdownBudget` for the exit; returns the exit
    /// status (0 for a clean stop; 128 + n for death by signal n; -1 for a
    /// daemon that had to be killed because it hung at SIGTERM).
    ///
    /// Anything but exit status 0 within the budget fails the calling test, with
    /// the status or signal and the tail of the daemon's stderr: a hang, a
    /// non-zero exit, a crash, and a daemon that died on its own before it was
    /// told to stop. A process already judged (an earlier `stop()`, a
    /// deliberate `kill9()`, a failed `start()`) is not judged again.
    @discardableResult
    public func stop(sourceLocation: SourceLocation = #_sourceLocation) -> Int32 {
        guard let p = process else { return 0 }
        if ended { return stopStatus }
        ended = true
        let sentAt: Date
        if let earlier = terminationSent {
            sentAt = earlier
        } else {
            if !p.isRunning {
                p.waitUntilExit()
                stopStatus = exitCode(p)
                reportDaemon(
                    p, "ended by itself before it was told to stop (\(exitDescription(p)))", log(tail: 40),
                    sourceLocation)
                return stopStatus
            }
            sentAt = Date()
            kill(p.processIdentifier, SIGTERM)
        }
        stopStatus = judgeShutdown(p, sentAt: sentAt, stderrTail: { log(tail: 40) }, sourceLocation: sourceLocation)
        return stopStatus
    }

    /// SIGKILL: no chance to clean up. Exempt from the exit-status check (for
    /// this process only: a daemon started again is judged at its own stop).
    public func kill9() {
        guard let p = process, p.isRunning, !ended else { return }
        kill(p.processIdentifier, SIGKILL)
        p.waitUntilExit()
        ended = true
        stopStatus = exitCode(p)
    }

    public var isRunning: Bool { process?.isRunning ?? false }

    /// The daemon's pid (0 when it never started).
    public var pid: Int32 { process?.processIdentifier ?? 0 }

    /// Sends `sig` to the running daemon.
    /// SIGTERM and SIGINT sent this way start the shutdown `stop()` then judges.
    public func signal(_ sig: Int32) {
        guard let p = process, p.isRunning else { return }
        if (sig == SIGTERM || sig == SIGINT) && terminationSent == nil { terminationSent = Date() }
        kill(p.processIdentifier, sig)
    }

    /// Waits until the log holds `text` at least `count` times; false on timeout.
    public func waitForLog(_ text: String, count: Int = 1, timeout: Double = 15) -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if log().components(separatedBy: text).count - 1 >= count { return true }
            usleep(20_000)
        }
        return false
    }

    /// The port of the `[metrics]` listener, from its `metrics_listening` log line.
    public var metricsPort: Int? {
        for line in log().split(separator: "\n").reversed() where line.contains("metrics_listening") {
            if let colon = line.lastIndex(of: ":"), let port = Int(line[line.index(after: colon)...]) { return port }
        }
        return nil
    }

    public func log(tail lines: Int = 1000) -> String {
        let text = (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? ""
        return text.split(separator: "\n", omittingEmptySubsequences: false).suffix(lines).joined(separator: "\n")
    }

    public func connect() throws -> TestConnection { try TestConnection(path: socketPath) }

    /// One call on a fresh connection.
    public func call(_ method: String, _ params: [String: Any] = [:]) throws -> [String: Any] {
        let c = try connect()
        defer { c.close() }
        return try c.call(method, params)
    }

    /// Stops the daemon (judging its exit as `stop()` does) and removes its directory.
    public func cleanup(sourceLocation: SourceLocation = #_sourceLocation) {
        stop(sourceLocation: sourceLocation)
        try? FileManager.default.removeItem(at: dir)
    }

    deinit { if process?.isRunning == true { process?.terminate() } }
}

/// SIGTERM to exit: docs/operations.md ("Stop") gives sends already out up to
/// 10 s to finish before Herald closes the store and exits 0; the 5 s beyond
/// that are room for a loaded machine. A daemon still running after this is hung.
public let daemonShutdownBudget: Double = 15

/// Waits up to `budget` from `sentAt` (SIGTERM is sent now when nil) for `p`, a
/// `herald serve` however it was started, to exit; returns its exit status
/// (128 + n for death by signal n, -1 when it hung and was killed). Anything
/// but exit status 0 within the budget fails the calling test with the status
/// or signal and `stderrTail()`.
@discardableResult
public func judgeShutdown(
    _ p: Process, sentAt: Date? = nil, budget: Double = daemonShutdownBudget, stderrTail: () -> String,
    sourceLocation: SourceLocation = #_sourceLocation
) -> Int32 {
    let start = sentAt ?? Date()
    if sentAt == nil && p.isRunning { kill(p.processIdentifier, SIGTERM) }
    let deadline = start.addingTimeInterval(budget)
    while p.isRunning && Date() < deadline { usleep(10_000) }
    if p.isRunning {
        kill(p.processIdentifier, SIGKILL)
        p.waitUntilExit()
        reportDaemon(
            p, "did not exit within \(budget) s of SIGTERM (killed with SIGKILL)", stderrTail(), sourceLocation)
        return -1
    }
    p.waitUntilExit()
    let status = exitCode(p)
    if status != 0 {
        reportDaemon(p, "did not stop cleanly at SIGTERM (\(exitDescription(p)))", stderrTail(), sourceLocation)
    }
    return status
}

private func reportDaemon(_ p: Process, _ what: String, _ tail: String, _ location: SourceLocation) {
    Issue.record(
        Comment(rawValue: "the daemon (pid \(p.processIdentifier)) \(what); stderr tail:\n\(tail)"),
        sourceLocation: location)
}

/// The exit status of an ended process, or 128 + the signal that ended it.
private func exitCode(_ p: Process) -> Int32 {
    p.terminationReason == .uncaughtSignal ? 128 + p.terminationStatus : p.terminationStatus
}

private func exitDescription(_ p: Process) -> String {
    p.terminationReason == .uncaughtSignal
        ? "killed by signal \(p.terminationStatus)" : "exit status \(p.terminationStatus)"
}

public struct HarnessError: Error, CustomStringConvertible {
    public let description: String
    public init(_ d: String) { description = d }
}

/// A raw client connection: bytes in, lines out.
public final class TestConnection: @unchecked Sendable {
    public let fd: Int32
    private var buffer: [UInt8] = []
    private var nextID = 1

    public init(path: String) throws {
        fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        withUnsafeMutableBytes(of: &addr.sun_path) { $0.copyBytes(from: bytes) }
        let rc = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        if rc != 0 {
            let e = errno
            Glibc.close(fd)
            throw HarnessError("connect \(path): \(String(cString: strerror(e)))")
        }
    }

    public func close() { Glibc.close(fd) }

    public func shutdownWrite() { Glibc.shutdown(fd, Int32(SHUT_WR)) }

    public func send(_ bytes: [UInt8]) throws {
        var sent = 0
        while sent < bytes.count {
            let n = bytes[sent...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n < 0 { throw HarnessError("send: \(String(cString: strerror(errno)))") }
            sent += n
        }
    }

    public func send(_ text: String) throws { try send(Array(text.utf8)) }

    /// The next `\n`-terminated line (without it), or nil at EOF or timeout.
    public func readLine(timeout: Double = 10) -> String? {
        let deadline = Date().addingTimeInterval(timeout)
        while true {
            if let nl = buffer.firstIndex(of: 10) {
                let line = String(decoding: buffer[..<nl], as: UTF8.self)
                buffer.removeSubrange(...nl)
                return line
            }
            let remaining = deadline.timeIntervalSinceNow
            if remaining <= 0 { return nil }
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            if poll(&pfd, 1, Int32(remaining * 1000)) <= 0 { return nil }
            var chunk = [UInt8](repeating: 0, count: 65536)
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { return nil }
            buffer += chunk[0..<n]
        }
    }

    /// True when the daemon closes its side within the timeout (after any data).
    public func readsEOF(timeout: Double = 5) -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        while deadline.timeIntervalSinceNow > 0 {
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            if poll(&pfd, 1, Int32(deadline.timeIntervalSinceNow * 1000)) <= 0 { return false }
            var chunk = [UInt8](repeating: 0, count: 65536)
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n == 0 { return true }
            if n < 0 { return errno == ECONNRESET }
            buffer += chunk[0..<n]
        }
        return false
    }

    /// Sends a request with a fresh numeric id and returns the whole response object.
    public func call(_ method: String, _ params: [String: Any] = [:]) throws -> [String: Any] {
        let id = nextID
        nextID += 1
        let request: [String: Any] = ["jsonrpc": "2.0", "id": id, "method": method, "params": params]
        try send([UInt8](try JSONSerialization.data(withJSONObject: request)) + [10])
        guard let line = readLine() else { throw HarnessError("no response to \(method)") }
        guard let object = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] else {
            throw HarnessError("response is not an object: \(line)")
        }
        return object
    }
}

extension Dictionary where Key == String, Value == Any {
    public var result: [String: Any]? { self["result"] as? [String: Any] }
    public var error: [String: Any]? { self["error"] as? [String: Any] }
    public var errorCode: Int? { error?["code"] as? Int }
    public var errorData: [String: Any]? { error?["data"] as? [String: Any] }
}

/// Runs the herald binary and returns (status, stdout, stderr).
public func runHerald(_ arguments: [String], environment: [String: String] = [:]) throws -> (Int32, String, String) {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: heraldBinary())
    p.arguments = arguments
    var env = ProcessInfo.processInfo.environment
    env["HERALD_SOCKET"] = nil
    env["HERALD_CONFIG"] = nil
    for (k, v) in environment { env[k] = v }
    p.environment = env
    let out = Pipe()
    let err = Pipe()
    p.standardOutput = out
    p.standardError = err
    try p.run()
    let o = out.fileHandleForReading.readDataToEndOfFile()
    let e = err.fileHandleForReading.readDataToEndOfFile()
    p.waitUntilExit()
    return (p.terminationStatus, String(decoding: o, as: UTF8.self), String(decoding: e, as: UTF8.self))
}
