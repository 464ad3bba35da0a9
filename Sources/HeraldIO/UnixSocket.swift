public import Glibc

/// A socket path that does not fit a `sockaddr_un`.
public struct SocketPathError: Error, Sendable, CustomStringConvertible {
    public let description: String
}

/// A `sockaddr_un` for a path, refusing paths that do not fit.
public func unixAddress(_ path: String) throws -> sockaddr_un {
    var addr = sockaddr_un()
    addr.sun_family = sa_family_t(AF_UNIX)
    let bytes = Array(path.utf8)
    let capacity = MemoryLayout.size(ofValue: addr.sun_path)
    guard !bytes.isEmpty, bytes.count < capacity else {
        throw SocketPathError(description: "socket path \(path) is longer than \(capacity - 1) bytes")
    }
    withUnsafeMutableBytes(of: &addr.sun_path) { raw in
        raw.copyBytes(from: bytes)
        raw[bytes.count] = 0
    }
    return addr
}

/// A blocking stream connection to the Unix socket at path; the caller
/// owns (and closes) the descriptor.
public func connectUnixSocket(_ path: String) throws -> Int32 {
    var addr = try unixAddress(path)
    let fd = try syscall("socket") {
        socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    }
    let rc = withUnsafePointer(to: &addr) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
            connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
        }
    }
    if rc != 0 {
        let err = errno
        close(fd)
        throw SystemError(call: "connect \(path)", errno: err)
    }
    return fd
}
