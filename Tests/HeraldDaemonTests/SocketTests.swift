import Foundation
import HeraldTestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

@Suite("the listening socket", .serialized)
struct SocketTests {
    @Test("created with the configured mode")
    func mode() throws {
        let d = try DaemonProcess()
        defer { d.cleanup() }
        var st = stat()
        #expect(stat(d.socketPath, &st) == 0)
        #expect(st.st_mode & 0o777 == 0o600)
        #expect(st.st_mode & S_IFMT == S_IFSOCK)
    }

    @Test("a live socket is not taken over; a stale one left by kill -9 is replaced")
    func staleSocket() throws {
        let d = try DaemonProcess()
        defer { d.cleanup() }
        // A second daemon on the same socket refuses to start and leaves it alone.
        let second = Process()
        second.executableURL = URL(fileURLWithPath: heraldBinary())
        second.arguments = ["serve", "--config", d.configPath]
        let err = Pipe()
        second.standardError = err
        try second.run()
        second.waitUntilExit()
        #expect(second.terminationStatus != 0)
        let message = String(decoding: err.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        #expect(message.contains("in use"))
        #expect(try d.call("system.health").result?["status"] as? String == "ok")

        d.kill9()
        #expect(FileManager.default.fileExists(atPath: d.socketPath), "kill -9 leaves the socket file")
        try d.start()
        #expect(try d.call("system.health").result?["status"] as? String == "ok")
    }

    @Test("a regular file at the socket path is never replaced")
    func notASocket() throws {
        let d = try DaemonProcess()
        defer { d.cleanup() }
        d.stop()
        try "keep me".write(toFile: d.socketPath, atomically: true, encoding: .utf8)
        #expect(throws: (any Error).self) { try d.start() }
        #expect(try String(contentsOfFile: d.socketPath, encoding: .utf8) == "keep me")
        #expect(d.log().contains("not a socket"))
    }

    @Test("socket activation: serves the socket systemd passes (LISTEN_FDS/LISTEN_PID)")
    func socketActivation() throws {
        let d = try DaemonProcess()
        defer { d.cleanup() }
        d.stop()
        let activated = d.dir.appendingPathComponent("activated.sock").path
        // Plays systemd: bind the socket, then exec herald with it as fd 3 and
        // LISTEN_PID set to herald's own pid.
        let script = """
            import os, socket, sys
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(sys.argv[1]); s.listen(16)
            os.dup2(s.fileno(), 3)
            os.set_inheritable(3, True)
            env = dict(os.environ, LISTEN_FDS="1", LISTEN_PID=str(os.getpid()))
            os.execve(sys.argv[2], [sys.argv[2], "serve", "--config", sys.argv[3]], env)
            """
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        p.arguments = ["python3", "-c", script, activated, heraldBinary(), d.configPath]
        let log = d.dir.appendingPathComponent("activated.log").path
        _ = FileManager.default.createFile(atPath: log, contents: nil)
        p.standardError = FileHandle(forWritingAtPath: log) ?? FileHandle.nullDevice
        try p.run()
        defer {
            if p.isRunning { kill(p.processIdentifier, SIGKILL) }
            p.waitUntilExit()
        }
        var response: [String: Any]?
        for _ in 0..<200 {
            if let c = try? TestConnection(path: activated) {
                response = try c.call("system.health")
                c.close()
                break
            }
            usleep(25_000)
        }
        #expect(response?.result?["status"] as? String == "ok")
        #expect(!FileManager.default.fileExists(atPath: d.socketPath), "the configured socket is not created")
        // The script exec'd herald: the same process, stopped as systemd stops it.
        judgeShutdown(p) { (try? String(contentsOfFile: log, encoding: .utf8)) ?? "" }
    }
}
