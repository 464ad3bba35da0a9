#if canImport(Glibc)
    import Glibc
#endif

/// A failed system call: which call and its errno.
public struct SystemError: Error, Sendable, CustomStringConvertible {
    public let call: String
    public let errno: Int32

    public init(call: String, errno: Int32) {
        self.call = call
        self.errno = errno
    }

    public var description: String { "\(call): \(String(cString: strerror(errno)))" }
}

/// Runs a system call, retrying on EINTR and throwing its errno otherwise.
@discardableResult
public func syscall<T: FixedWidthInteger>(_ name: String, _ body: () -> T) throws(SystemError) -> T {
    while true {
        let rc = body()
        if rc >= 0 { return rc }
        let err = errno
        if err == EINTR { continue }
        throw SystemError(call: name, errno: err)
    }
}
