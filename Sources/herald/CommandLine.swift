import Foundation
import HeraldCrypto

/// A failure that ends a command: one line on stderr and an exit status.
struct CommandFailure: Error {
    static let usageStatus: Int32 = 2

    let message: String
    let status: Int32

    init(_ message: String, status: Int32 = CommandFailure.usageStatus) {
        self.message = message
        self.status = status
    }
}

/// Options of one subcommand: `--name value` pairs and bare flags.
struct Options {
    private var values: [String: String] = [:]
    private var lists: [String: [String]] = [:]
    private var flags: Set<String> = []
    private(set) var positional: [String] = []

    /// Parses `arguments` allowing only the named value options and flags;
    /// options in `repeated` may be given more than once.
    init(
        _ arguments: [String], values allowed: Set<String>, flags allowedFlags: Set<String> = [],
        repeated: Set<String> = []
    ) throws(CommandFailure) {
        var i = 0
        while i < arguments.count {
            let arg = arguments[i]
            if arg.hasPrefix("--") {
                var name = String(arg.dropFirst(2))
                var inline: String?
                if let eq = name.firstIndex(of: "=") {
                    inline = String(name[name.index(after: eq)...])
                    name = String(name[..<eq])
                }
                if allowedFlags.contains(name), inline == nil {
                    flags.insert(name)
                } else if allowed.contains(name) || repeated.contains(name) {
                    if values[name] != nil && !repeated.contains(name) { throw CommandFailure("--\(name) given twice") }
                    if let inline {
                        values[name] = inline
                    } else {
                        guard i + 1 < arguments.count else {
                            throw CommandFailure("--\(name) needs a value")
                        }
                        i += 1
                        values[name] = arguments[i]
                    }
                    lists[name, default: []].append(values[name]!)
                } else {
                    throw CommandFailure("unknown option --\(name)")
                }
            } else {
                positional.append(arg)
            }
            i += 1
        }
    }

    func value(_ name: String) -> String? { values[name] }

    /// Every value of a repeatable option, in order.
    func all(_ name: String) -> [String] { lists[name] ?? [] }

    func required(_ name: String) throws(CommandFailure) -> String {
        guard let v = values[name], !v.isEmpty else {
            throw CommandFailure("--\(name) is required")
        }
        return v
    }

    func flag(_ name: String) -> Bool { flags.contains(name) }

    /// A whole number option within a range.
    func integer(
        _ name: String, default fallback: Int64, in range: ClosedRange<Int64>
    )
        throws(CommandFailure) -> Int64
    {
        guard let text = values[name] else { return fallback }
        guard let n = Int64(text), range.contains(n) else {
            throw CommandFailure(
                "--\(name) must be a whole number from \(range.lowerBound) to \(range.upperBound)")
        }
        return n
    }

    func noPositional() throws(CommandFailure) {
        if let extra = positional.first { throw CommandFailure("unexpected argument '\(extra)'") }
    }
}

enum Terminal {
    static func out(_ line: String) {
        FileHandle.standardOutput.write(Data((line + "\n").utf8))
    }

    static func err(_ line: String) {
        FileHandle.standardError.write(Data((line + "\n").utf8))
    }

    static func writeOut(_ bytes: [UInt8]) {
        FileHandle.standardOutput.write(Data(bytes))
    }

    static func readStandardInput() -> [UInt8] {
        [UInt8](FileHandle.standardInput.readDataToEndOfFile())
    }
}

/// A key file, read straight into ``SecretBytes`` (locked where possible,
/// wiped on release) so the key reaches the crypto core without passing
/// through a `String` or an `Array`.
func readSecretFile(_ path: String, limit: Int = 64 * 1024) throws(CommandFailure) -> SecretBytes {
    func failure(_ err: Int32) -> CommandFailure {
        CommandFailure("cannot read \(path): \(err == ENOENT ? "no such file" : String(cString: strerror(err)))")
    }
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { throw failure(errno) }
    defer { _ = close(fd) }
    var st = stat()
    guard fstat(fd, &st) == 0 else { throw failure(errno) }
    guard st.st_mode & S_IFMT == S_IFREG, st.st_size <= limit else {
        throw CommandFailure("cannot read \(path): not a regular file of at most \(limit) bytes")
    }
    let size = Int(st.st_size)
    return try SecretBytes(capacity: size + 1) { (buffer) throws(CommandFailure) -> Int in
        var total = 0
        while total < buffer.count {
            let n = read(fd, buffer.baseAddress! + total, buffer.count - total)
            if n < 0 {
                if errno == EINTR { continue }
                throw failure(errno)
            }
            if n == 0 { break }
            total += n
        }
        guard total <= size else { throw CommandFailure("cannot read \(path): file changed while it was read") }
        return total
    }
}

/// Creates a new file readable only by its owner and writes bytes to it;
/// refuses to replace an existing file.
func writeSecretFile(_ path: String, _ bytes: [UInt8]) throws(CommandFailure) {
    let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
    if fd < 0 {
        let reason = String(cString: strerror(errno))
        throw CommandFailure("cannot create \(path): \(reason)")
    }
    defer { close(fd) }
    var written = 0
    while written < bytes.count {
        let n = bytes[written...].withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        if n < 0 {
            if errno == EINTR { continue }
            let reason = String(cString: strerror(errno))
            unlink(path)
            throw CommandFailure("cannot write \(path): \(reason)")
        }
        written += n
    }
    if fsync(fd) != 0 {
        let reason = String(cString: strerror(errno))
        unlink(path)
        throw CommandFailure("cannot write \(path): \(reason)")
    }
}
