import Foundation
import HeraldCrypto

/// Decodes base64url test vectors, failing the test on bad input.
func b64(_ text: String) -> [UInt8] {
    guard let bytes = try? Base64URL.decode(text) else {
        fatalError("bad test vector: \(text)")
    }
    return bytes
}

/// Key material for a test, as the readers hand it to the core.
func secret(_ text: String) -> SecretBytes { SecretBytes(copying: text.utf8) }
func secret(_ bytes: [UInt8]) -> SecretBytes { SecretBytes(copying: bytes) }

/// Runs a command and returns its standard output (used to make RSA keys
/// with the openssl tool, which the C core cannot generate).
func run(_ executable: String, _ arguments: [String]) throws -> Data {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: executable)
    process.arguments = arguments
    let out = Pipe()
    process.standardOutput = out
    process.standardError = FileHandle.nullDevice
    try process.run()
    let data = out.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return data
}

/// Splits a compact JWS into its decoded header, claims and signature.
func jwsParts(_ token: String) -> (header: String, claims: String, signingInput: [UInt8], signature: [UInt8])? {
    let parts = token.split(separator: ".", omittingEmptySubsequences: false)
    guard parts.count == 3,
        let h = try? Base64URL.decode(String(parts[0])),
        let c = try? Base64URL.decode(String(parts[1])),
        let s = try? Base64URL.decode(String(parts[2]))
    else { return nil }
    return (
        String(decoding: h, as: UTF8.self), String(decoding: c, as: UTF8.self),
        Array("\(parts[0]).\(parts[1])".utf8), s
    )
}
