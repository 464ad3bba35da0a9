import Foundation
import HeraldCrypto
import HeraldTestSupport
import Testing

// Helpers shared by the CLI suites: locating the built `herald` binary,
// running it with arguments and stdin, temp dirs and key fixtures.

/// What one run of the binary produced.
struct RunResult: CustomStringConvertible {
    let status: Int32
    let stdout: [UInt8]
    let stderr: String

    var stdoutText: String { String(decoding: stdout, as: UTF8.self) }

    /// stdout without its trailing newline, for one-line outputs.
    var stdoutLine: String {
        var text = stdoutText
        if text.hasSuffix("\n") { text.removeLast() }
        return text
    }

    var description: String {
        "status \(status), \(stdout.count) bytes on stdout, stderr: \(stderr.debugDescription)"
    }
}

enum Herald {
    /// The built binary (HeraldTestSupport finds it), or the places that were searched for it.
    static var location: Result<URL, HeraldBinaryNotFound> { heraldBinaryLocation }

    static func binary() throws -> URL { try location.get() }
}

/// A fresh directory under the system temp dir, removed when the value goes away.
final class TempDir: @unchecked Sendable {
    let url: URL

    init() throws {
        url = FileManager.default.temporaryDirectory
            .appendingPathComponent("herald-cli-tests-\(UUID().uuidString)", isDirectory: true)
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }

    deinit { try? FileManager.default.removeItem(at: url) }

    func path(_ name: String) -> String { url.appendingPathComponent(name).path }

    /// Writes a file and returns its path.
    @discardableResult
    func write(_ name: String, _ text: String) throws -> String {
        try write(name, Array(text.utf8))
    }

    @discardableResult
    func write(_ name: String, _ bytes: [UInt8]) throws -> String {
        let p = path(name)
        try Data(bytes).write(to: URL(fileURLWithPath: p))
        return p
    }
}

/// Runs `herald` with the arguments, feeding `stdin` (through a file, so a
/// command that exits without reading cannot break a pipe) and capturing
/// stdout and stderr (also through files, so nothing can block).
func herald(
    _ arguments: [String], stdin: [UInt8] = [], in directory: URL? = nil
) throws
    -> RunResult
{
    let binary = try Herald.binary()
    let scratch = try TempDir()
    let inURL = scratch.url.appendingPathComponent("stdin")
    let outURL = scratch.url.appendingPathComponent("stdout")
    let errURL = scratch.url.appendingPathComponent("stderr")
    try Data(stdin).write(to: inURL)
    _ = FileManager.default.createFile(atPath: outURL.path, contents: nil)
    _ = FileManager.default.createFile(atPath: errURL.path, contents: nil)

    let input = try FileHandle(forReadingFrom: inURL)
    let output = try FileHandle(forWritingTo: outURL)
    let error = try FileHandle(forWritingTo: errURL)
    defer {
        try? input.close()
        try? output.close()
        try? error.close()
    }

    let process = Process()
    process.executableURL = binary
    process.arguments = arguments
    process.currentDirectoryURL = directory ?? scratch.url
    process.standardInput = input
    process.standardOutput = output
    process.standardError = error
    try process.run()
    process.waitUntilExit()

    #expect(
        process.terminationReason == .exit,
        "herald \(arguments) was killed by signal \(process.terminationStatus)")
    return RunResult(
        status: process.terminationStatus,
        stdout: [UInt8](try Data(contentsOf: outURL)),
        stderr: String(decoding: try Data(contentsOf: errURL), as: UTF8.self))
}

func herald(
    _ arguments: String..., stdin: [UInt8] = [], in directory: URL? = nil
) throws
    -> RunResult
{
    try herald(arguments, stdin: stdin, in: directory)
}

/// Checks the bad-input contract: exit status 2, nothing on stdout, exactly
/// one line on stderr starting with "herald: ", and (when given) that the
/// line mentions at least one of `mentioning` (case-insensitive).
func expectBadInput(
    _ result: RunResult, mentioning: [String] = [],
    sourceLocation: SourceLocation = #_sourceLocation
) {
    #expect(result.status == 2, "exit status (\(result))", sourceLocation: sourceLocation)
    #expect(
        result.stdout.isEmpty, "stdout must be empty on bad input (\(result))",
        sourceLocation: sourceLocation)
    #expect(
        result.stderr.hasPrefix("herald: "), "stderr must start with 'herald: ' (\(result))",
        sourceLocation: sourceLocation)
    #expect(
        isSingleLine(result.stderr), "stderr must be exactly one line (\(result))",
        sourceLocation: sourceLocation)
    if !mentioning.isEmpty {
        let lower = result.stderr.lowercased()
        #expect(
            mentioning.contains { lower.contains($0.lowercased()) },
            "stderr should name the problem (one of \(mentioning)): \(result.stderr.debugDescription)",
            sourceLocation: sourceLocation)
    }
}

/// One non-empty line ending in a single newline.
func isSingleLine(_ text: String) -> Bool {
    guard text.hasSuffix("\n") else { return false }
    let body = text.dropLast()
    return !body.isEmpty && !body.contains("\n") && !body.contains("\r")
}

// MARK: - Encoding helpers

func b64url(_ bytes: [UInt8]) -> String { Base64URL.encode(bytes) }

func unb64url(_ text: String) throws -> [UInt8] { try Base64URL.decode(text) }

/// Standard base64 wrapped at 64 columns with "\n", as in PEM files.
func pemBody(_ der: [UInt8]) -> String {
    let b64 = Data(der).base64EncodedString()
    var lines: [String] = []
    var index = b64.startIndex
    while index < b64.endIndex {
        let end = b64.index(index, offsetBy: 64, limitedBy: b64.endIndex) ?? b64.endIndex
        lines.append(String(b64[index..<end]))
        index = end
    }
    return lines.joined(separator: "\n")
}

func pem(label: String, der: [UInt8]) -> String {
    "-----BEGIN \(label)-----\n\(pemBody(der))\n-----END \(label)-----\n"
}

/// SEC1 `ECPrivateKey` (RFC 5915) DER for a P-256 scalar and its public point,
/// with the curve parameters and the public key, as `openssl ec` writes it.
func sec1DER(scalar: [UInt8], publicKey: [UInt8]) -> [UInt8] {
    precondition(scalar.count == 32 && publicKey.count == 65)
    let prime256v1: [UInt8] = [0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07]
    var body: [UInt8] = [0x02, 0x01, 0x01]  // version 1
    body += [0x04, 0x20] + scalar  // privateKey OCTET STRING
    body += [0xa0, UInt8(prime256v1.count)] + prime256v1  // [0] parameters
    body += [0xa1, 0x44, 0x03, 0x42, 0x00] + publicKey  // [1] publicKey BIT STRING
    return [0x30, UInt8(body.count)] + body
}

/// A random valid P-256 scalar and the key made from it.
func randomRawKey() throws -> (scalar: [UInt8], key: P256PrivateKey) {
    while true {
        let scalar = try SecureRandom.bytes(32)
        if let key = try? P256PrivateKey(raw: SecretBytes(copying: scalar)) { return (scalar, key) }
    }
}

/// A key written by `herald vapid generate --out`, and the public key it printed.
func generatedKey(
    in dir: TempDir, name: String = "vapid.pem"
) throws -> (
    path: String, publicKey: String
) {
    let path = dir.path(name)
    let result = try herald("vapid", "generate", "--out", path)
    try #require(result.status == 0, "vapid generate failed: \(result)")
    return (path, result.stdoutLine)
}

/// A subscriber's p256dh (base64url point) and auth (base64url 16 bytes).
func subscriberKeys() throws -> (p256dh: String, auth: String, point: [UInt8]) {
    let key = try P256PrivateKey.generate()
    return (key.publicKeyBase64URL, b64url(try SecureRandom.bytes(16)), key.publicKey)
}

/// The same point with the last byte of Y changed: well formed, off the curve.
func offCurve(_ point: [UInt8]) -> [UInt8] {
    var bad = point
    bad[bad.count - 1] ^= 0x01
    return bad
}

func bytes(_ count: Int, _ seed: UInt8 = 0x41) -> [UInt8] {
    (0..<count).map { UInt8(truncatingIfNeeded: Int(seed) &+ $0 * 7) }
}
