import HeraldCrypto
import HeraldIO

#if canImport(Glibc)
    import Glibc
#endif

/// A setting that names a file (a credential, the store key, a CA bundle):
/// the value as written, the path it resolved to, and where it was set.
public struct ConfigFileReference: Sendable, Equatable, CustomStringConvertible {
    /// The value as written in the config file.
    public let value: String
    /// The absolute path Herald reads.
    public let path: String
    /// Where the setting was made, for error messages.
    public let location: ConfigLocation

    public init(value: String, path: String, location: ConfigLocation) {
        self.value = value
        self.path = path
        self.location = location
    }

    /// The resolved path; never the file's contents.
    public var description: String { path }
}

/// Turns the name of a secret file into a path (SPEC "Process and configuration"):
/// an absolute path is used as is; a bare file name is looked up in
/// `$CREDENTIALS_DIRECTORY` (systemd `LoadCredential=`) when that directory holds
/// it, otherwise next to the config file; a relative path with a `/` is relative
/// to the config file's directory.
public struct SecretResolver: Sendable, Equatable {
    /// The directory of the config file (absolute).
    public let configDirectory: String
    /// `$CREDENTIALS_DIRECTORY`, when set and non-empty.
    public let credentialsDirectory: String?

    public init(configFile: String, environment: [String: String]) {
        configDirectory = ConfigPath.directory(of: ConfigPath.absolute(configFile))
        credentialsDirectory = environment["CREDENTIALS_DIRECTORY"].flatMap { $0.isEmpty ? nil : $0 }
    }

    /// The path of the secret file named by `value`.
    public func resolveSecret(_ value: String) -> String {
        resolve(value, relativeTo: configDirectory)
    }

    /// The prefix systemd gives the files of a directory credential
    /// (`LoadCredential=herald:/etc/herald/credentials` in herald.service):
    /// `/etc/herald/credentials/vapid.pem` arrives as `herald_vapid.pem`.
    public static let directoryCredentialPrefix = "herald_"

    /// As `resolveSecret`, with relative names taken against `base` instead of
    /// the config directory (the store key lives in `state_dir`). A bare name
    /// is looked up in `$CREDENTIALS_DIRECTORY` as itself, then with the
    /// `herald_` prefix of the unit's directory credential.
    public func resolve(_ value: String, relativeTo base: String) -> String {
        if value.hasPrefix("/") { return value }
        if !value.contains("/"), let credentials = credentialsDirectory {
            for name in [value, Self.directoryCredentialPrefix + value] {
                let candidate = ConfigPath.join(credentials, name)
                var st = stat()
                if stat(candidate, &st) == 0 { return candidate }
            }
        }
        return ConfigPath.join(base, value)
    }
}

/// Path arithmetic on strings (no normalisation beyond what callers need).
package enum ConfigPath {
    package static func absolute(_ path: String) -> String {
        if path.hasPrefix("/") { return path }
        guard let cwd = getcwd(nil, 0) else { return path }
        defer { free(cwd) }
        return join(String(cString: cwd), path)
    }

    package static func directory(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        if slash == path.startIndex { return "/" }
        return String(path[..<slash])
    }

    package static func join(_ base: String, _ name: String) -> String {
        var name = Substring(name)
        while name.hasPrefix("./") { name = name.dropFirst(2) }
        return base.hasSuffix("/") ? base + name : base + "/" + name
    }
}

/// Why a file could not be read or written, in words for an error message.
struct ConfigIOError: Error {
    let reason: String

    init(_ reason: String) { self.reason = reason }
    init(_ error: SystemError) { reason = String(cString: strerror(error.errno)) }
}

/// Small file operations for configuration and secrets.
enum ConfigIO {
    /// The whole of a regular file of at most `limit` bytes.
    static func read(_ path: String, limit: Int) throws(ConfigIOError) -> [UInt8] {
        let (fd, size) = try openRegular(path, limit: limit)
        defer { _ = close(fd) }
        return try readAll(fd, expected: size)
    }

    /// As ``read(_:limit:)``, straight into memory that is locked where
    /// possible and wiped on release: for key files, which must grant
    /// nothing to group or others (as the store key and the database
    /// password file), else the error says so with the file's mode.
    static func readSecret(_ path: String, limit: Int) throws(ConfigIOError) -> SecretBytes {
        let (fd, size) = try openRegular(path, limit: limit)
        defer { _ = close(fd) }
        var st = stat()
        do {
            try HeraldIO.syscall("fstat") { fstat(fd, &st) }
        } catch { throw ConfigIOError(error) }
        let permissions = st.st_mode & 0o7777
        guard permissions & 0o077 == 0 else {
            throw ConfigIOError(
                "mode \(ConfigValue.octal(permissions)) is too open: a key file must not be accessible to group or others (chmod 0600)"
            )
        }
        return try readAllSecret(fd, expected: size)
    }

    /// Reads `expected` bytes and checks the file ends there.
    static func readAll(_ fd: Int32, expected: Int) throws(ConfigIOError) -> [UInt8] {
        var buffer = [UInt8](repeating: 0, count: expected + 1)
        let result = buffer.withUnsafeMutableBytes { raw in
            Result { () throws(ConfigIOError) in try fill(raw, from: fd, expected: expected) }
        }
        switch result {
        case .success(let total):
            buffer.removeLast(buffer.count - total)
            return buffer
        case .failure(let error):
            wipe(&buffer)
            throw error
        }
    }

    /// As ``readAll(_:expected:)``, into ``SecretBytes``.
    static func readAllSecret(_ fd: Int32, expected: Int) throws(ConfigIOError) -> SecretBytes {
        try SecretBytes(capacity: expected + 1) { raw throws(ConfigIOError) in
            try fill(raw, from: fd, expected: expected)
        }
    }

    /// Opens a regular file of at most `limit` bytes; the caller closes it.
    private static func openRegular(_ path: String, limit: Int) throws(ConfigIOError) -> (Int32, Int) {
        let fd: Int32
        do {
            fd = try HeraldIO.syscall("open") { open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK) }
        } catch { throw ConfigIOError(error) }
        var st = stat()
        do {
            try HeraldIO.syscall("fstat") { fstat(fd, &st) }
        } catch {
            _ = close(fd)
            throw ConfigIOError(error)
        }
        guard st.st_mode & S_IFMT == S_IFREG else {
            _ = close(fd)
            throw ConfigIOError("not a regular file")
        }
        guard st.st_size <= limit else {
            _ = close(fd)
            throw ConfigIOError("larger than \(limit) bytes")
        }
        return (fd, Int(st.st_size))
    }

    /// Reads into `buffer` (one byte larger than `expected`) until end of
    /// file; the number of bytes read, at most `expected`.
    private static func fill(
        _ buffer: UnsafeMutableRawBufferPointer, from fd: Int32, expected: Int
    ) throws(ConfigIOError) -> Int {
        var total = 0
        while total < buffer.count {
            let n = Glibc.read(fd, buffer.baseAddress! + total, buffer.count - total)
            if n < 0 {
                let err = errno
                if err == EINTR { continue }
                throw ConfigIOError(SystemError(call: "read", errno: err))
            }
            if n == 0 { break }
            total += n
        }
        if total > expected { throw ConfigIOError("file changed while it was read") }
        return total
    }

    /// Writes all of `bytes`.
    static func writeAll(_ fd: Int32, _ bytes: UnsafeRawBufferPointer) throws(SystemError) {
        var written = 0
        while written < bytes.count {
            let n = write(fd, bytes.baseAddress! + written, bytes.count - written)
            if n < 0 {
                let err = errno
                if err == EINTR { continue }
                throw SystemError(call: "write", errno: err)
            }
            written += n
        }
    }

    /// Overwrites a buffer that held secret material.
    static func wipe(_ bytes: inout [UInt8]) {
        bytes.withUnsafeMutableBytes { raw in
            if let base = raw.baseAddress { explicit_bzero(base, raw.count) }
        }
    }
}
