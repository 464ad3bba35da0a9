import HeraldIO
import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// The listening Unix stream socket: passed by systemd (`LISTEN_FDS`) or
/// created here with the configured mode.
struct Listener {
    let fd: Int32
    /// The path we created and must remove on exit (nil when systemd owns it).
    let ownedPath: String?

    /// The first socket systemd passed us, if `LISTEN_PID` names this process.
    static func fromSystemd(environment: [String: String]) -> Listener? {
        guard let pid = environment["LISTEN_PID"].flatMap(Int32.init), pid == getpid(),
            let count = environment["LISTEN_FDS"].flatMap(Int.init), count >= 1
        else { return nil }
        let fd: Int32 = 3  // SD_LISTEN_FDS_START
        _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        let flags = fcntl(fd, F_GETFL)
        _ = fcntl(fd, F_SETFL, flags | O_NONBLOCK)
        return Listener(fd: fd, ownedPath: nil)
    }

    /// Binds `path` with `mode`. A socket file left by a dead process is
    /// replaced; one that still has a listener is not (startup error).
    static func create(path: String, mode: mode_t, backlog: Int32 = 512) throws -> Listener {
        if socketIsLive(path) {
            throw DaemonError("socket \(path) is in use by another process")
        }
        var st = stat()
        if lstat(path, &st) == 0 {
            guard (st.st_mode & S_IFMT) == S_IFSOCK else {
                throw DaemonError("\(path) exists and is not a socket; not replacing it")
            }
            unlink(path)
        }
        let fd = try HeraldIO.syscall("socket") {
            socket(
                AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        }
        do {
            var addr = try unixAddress(path)
            // Create with no access, then open up to the configured mode: no
            // window in which the socket is more open than configured.
            let old = umask(0o777)
            let rc = withUnsafePointer(to: &addr) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
                }
            }
            let bindErrno = errno
            umask(old)
            if rc != 0 { throw SystemError(call: "bind \(path)", errno: bindErrno) }
            try HeraldIO.syscall("chmod \(path)") { chmod(path, mode) }
            try HeraldIO.syscall("listen") { listen(fd, backlog) }
        } catch {
            _ = Glibc.close(fd)
            throw error
        }
        return Listener(fd: fd, ownedPath: path)
    }

    func close() {
        _ = Glibc.close(fd)
        if let ownedPath { unlink(ownedPath) }
    }
}

/// True when something accepts connections on the socket at path.
func socketIsLive(_ path: String) -> Bool {
    guard let fd = try? connectUnixSocket(path) else { return false }
    close(fd)
    return true
}

/// A startup or runtime failure with a message for the operator.
public struct DaemonError: Error, Sendable, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}
