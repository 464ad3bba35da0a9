import Foundation
import HeraldIO

#if canImport(Glibc)
    import Glibc
#endif

/// A throw-away PostgreSQL server for tests, run by `scripts/pg-test-server.sh`
/// (the Python tests use the same script): initdb into a directory under
/// /tmp, a Unix socket only, a random password in a file, fsync off. It can
/// be stopped and started again (a database outage) and is removed by
/// `destroy()` or when let go.
public final class PostgresServer: @unchecked Sendable {
    /// The server's directory: `data/`, `run/` (the socket), `password`, `server.log`.
    public let dir: String
    /// A libpq connection string without the password.
    public let dsn: String
    /// The password of the `herald` role, on one line.
    public let passwordFile: String

    public static let script = repoRoot.appendingPathComponent("scripts/pg-test-server.sh").path

    /// Initializes and starts a new server.
    public init() throws {
        dir = "/tmp/herald-pg-\(UUID().uuidString.prefix(8).lowercased())"
        passwordFile = dir + "/password"
        dsn = try Self.run("start", dir)
    }

    deinit { destroy() }

    /// Stops the server (fast shutdown: open connections are cut).
    public func stop() throws { _ = try Self.run("stop", dir) }

    /// Starts the stopped server again on the same data.
    public func start() throws { _ = try Self.run("start", dir) }

    /// Stops and starts the server: every open connection breaks.
    public func restart() throws { _ = try Self.run("restart", dir) }

    /// Stops the server and removes its directory.
    public func destroy() { _ = try? Self.run("destroy", dir) }

    /// One server for a whole test process, started on first use and
    /// removed at exit. Tests that stop or restart a server start their own.
    public static func shared() throws -> PostgresServer {
        try sharedServer.withLock { (server: inout PostgresServer?) throws -> PostgresServer in
            if let server { return server }
            let started = try PostgresServer()
            server = started
            atexit { sharedServer.withLock { $0?.destroy() } }
            return started
        }
    }

    /// Runs the script; its stdout, trimmed; a failure carries its stderr.
    ///
    /// With posix_spawn and waitpid rather than Foundation's `Process`, whose
    /// exit detection relies on a SIGCHLD that a test thread may have blocked
    /// (the wait then never ends); the child starts with no signal blocked, so
    /// the server it leaves running obeys pg_ctl's signals.
    private static func run(_ command: String, _ dir: String) throws -> String {
        let outPath = "/tmp/herald-pg-out-\(UUID().uuidString.prefix(8))"
        let errPath = outPath + ".err"
        defer {
            unlink(outPath)
            unlink(errPath)
        }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, outPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        posix_spawn_file_actions_addopen(&actions, 2, errPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var none = sigset_t()
        sigemptyset(&none)
        var all = sigset_t()
        sigfillset(&all)
        posix_spawnattr_setsigmask(&attributes, &none)
        posix_spawnattr_setsigdefault(&attributes, &all)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        let args: [String] = ["/bin/bash", script, command, dir]
        let argv: [UnsafeMutablePointer<CChar>?] = args.map { (arg: String) in strdup(arg) } + [nil]
        defer { for arg in argv { free(arg) } }
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, "/bin/bash", &actions, &attributes, argv, environ)
        guard rc == 0 else { throw TestSupportError("posix_spawn /bin/bash: \(String(cString: strerror(rc)))") }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        let stdout = readSmallFile(outPath)
        guard status == 0 else {
            let stderr = readSmallFile(errPath)
            throw TestSupportError("pg-test-server.sh \(command) \(dir) failed (status \(status)): \(stderr)")
        }
        return stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }
}

/// A file's text, read with plain read(2): `String(contentsOfFile:)` leaks its
/// buffer for an empty file (LeakSanitizer reports it in make test-sanitize).
private func readSmallFile(_ path: String) -> String {
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return "" }
    defer { close(fd) }
    var bytes: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 4096)
    while true {
        let n = read(fd, &chunk, chunk.count)
        if n < 0 && errno == EINTR { continue }
        if n <= 0 { break }
        bytes.append(contentsOf: chunk[0..<n])
    }
    return String(decoding: bytes, as: UTF8.self)
}

private let sharedServer = Locked<PostgresServer?>(nil)
