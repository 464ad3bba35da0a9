internal import CLibPQ

#if canImport(Glibc)
    import Glibc
#endif

/// Where and how to connect: a libpq connection string without a password,
/// the file that holds the password, and the reconnect backoff.
public struct PostgresConfiguration: Sendable {
    /// A libpq connection string (`host=/run/postgresql dbname=herald user=herald`
    /// or a `postgresql://` URI), checked to carry no password.
    public let dsn: String
    /// Read at every connect (so a rotated password is picked up), never logged.
    public let passwordFile: String?
    /// `application_name` unless the connection string sets one.
    public let applicationName: String
    /// Seconds libpq waits for a connection (`connect_timeout`) unless the connection string sets one.
    public let connectTimeoutSeconds: Int
    /// The wait before the second connect attempt after a failed one; it
    /// doubles with every further failure, up to `maxReconnectDelay`.
    public let reconnectDelay: Duration
    public let maxReconnectDelay: Duration
    /// Monotonic nanoseconds, injectable so backoff is testable without sleeping.
    public let clock: @Sendable () -> UInt64

    /// Throws `.configuration` when the connection string does not parse or
    /// carries a password (the password belongs in `passwordFile`).
    public init(
        dsn: String, passwordFile: String? = nil, applicationName: String = "herald", connectTimeoutSeconds: Int = 10,
        reconnectDelay: Duration = .milliseconds(100), maxReconnectDelay: Duration = .seconds(5),
        clock: @escaping @Sendable () -> UInt64 = monotonicNanoseconds
    ) throws(PostgresError) {
        try Self.check(dsn: dsn)
        guard reconnectDelay > .zero, maxReconnectDelay >= reconnectDelay else {
            throw PostgresError(.configuration, "the reconnect delays must be positive, the maximum at least the first")
        }
        self.dsn = dsn
        self.passwordFile = passwordFile
        self.applicationName = applicationName
        self.connectTimeoutSeconds = connectTimeoutSeconds
        self.reconnectDelay = reconnectDelay
        self.maxReconnectDelay = maxReconnectDelay
        self.clock = clock
    }

    /// libpq's own parser decides what the string holds. Its message is not
    /// repeated: it may quote part of the string.
    static func check(dsn: String) throws(PostgresError) {
        var error: UnsafeMutablePointer<CChar>?
        guard let options = PQconninfoParse(dsn, &error) else {
            if let error { PQfreemem(error) }
            throw PostgresError(.configuration, "the dsn is not a libpq connection string")
        }
        defer { PQconninfoFree(options) }
        var option = options
        while let keyword = option.pointee.keyword {
            if String(cString: keyword) == "password", let value = option.pointee.val, value.pointee != 0 {
                throw PostgresError(.configuration, "the dsn carries a password: put it in the password file instead")
            }
            option += 1
        }
    }

    /// The password file's first line, as NUL-terminated bytes the caller
    /// wipes after use; nil without a password file.
    func readPassword() throws(PostgresError) -> [CChar]? {
        guard let passwordFile else { return nil }
        let fd = open(passwordFile, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            throw PostgresError(.configuration, "password file \(passwordFile): \(String(cString: strerror(errno)))")
        }
        defer { close(fd) }
        var chunk = [CChar](repeating: 0, count: 256)
        defer { wipe(&chunk) }
        // Room for the longest read and the NUL up front: an array that grew
        // would leave unwiped copies of the password in the memory it let go.
        var bytes: [CChar] = []
        bytes.reserveCapacity(4096 + chunk.count + 1)
        while bytes.count <= 4096 {
            let n = read(fd, &chunk, chunk.count)
            if n < 0 {
                if errno == EINTR { continue }
                wipe(&bytes)
                throw PostgresError(
                    .configuration, "password file \(passwordFile): \(String(cString: strerror(errno)))")
            }
            if n == 0 { break }
            bytes.append(contentsOf: chunk[0..<n])
        }
        if let newline = bytes.firstIndex(where: { $0 == 0x0A || $0 == 0x0D }) {
            for i in newline..<bytes.count { bytes[i] = 0 }
            bytes.removeSubrange(newline...)
        }
        guard !bytes.isEmpty, bytes.count <= 4096, !bytes.contains(0) else {
            wipe(&bytes)
            throw PostgresError(.configuration, "password file \(passwordFile): empty, too long or not text")
        }
        bytes.append(0)
        return bytes
    }
}

/// CLOCK_MONOTONIC in nanoseconds.
public func monotonicNanoseconds() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
}

/// Overwrites a secret before its memory is let go.
func wipe(_ bytes: inout [CChar]) {
    bytes.withUnsafeMutableBytes { raw in
        guard let base = raw.baseAddress else { return }
        explicit_bzero(base, raw.count)  // a memset the optimizer may not drop
    }
}

extension Duration {
    var nanoseconds: UInt64 {
        let (seconds, attoseconds) = components
        return UInt64(max(0, seconds)) * 1_000_000_000 + UInt64(max(0, attoseconds) / 1_000_000_000)
    }
}
