public import Foundation
public import HeraldCore
import HeraldIO

/// The SPKI PEM of an uncompressed P-256 public point, the form the test gateways take.
public func spkiPEM(_ point: [UInt8]) -> String {
    let prefix: [UInt8] = [
        0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a, 0x86, 0x48,
        0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
    ]
    let b64 = Data(prefix + point).base64EncodedString(options: [.lineLength64Characters, .endLineWithLineFeed])
    return "-----BEGIN PUBLIC KEY-----\n\(b64)\n-----END PUBLIC KEY-----\n"
}

/// A wall clock that is the system clock plus an offset the test moves.
public final class OffsetClock: WallClock {
    private let offset: Locked<Int64>

    public init(offsetMs: Int64 = 0) { offset = Locked(offsetMs) }

    public func nowMilliseconds() -> Int64 { SystemClock().nowMilliseconds() + offset.withLock { $0 } }

    public func advance(ms: Int64) { offset.withLock { $0 += ms } }
}

/// Writes a key file as an operator must: readable by its owner alone
/// (0600). Herald refuses a key file that group or others can read.
public func writeKeyFile(_ text: String, to url: URL) throws {
    try text.write(to: url, atomically: true, encoding: .utf8)
    try makeKeyFilePrivate(url.path)
}

/// Makes the file at `path` readable by its owner alone (0600).
public func makeKeyFilePrivate(_ path: String) throws {
    guard chmod(path, 0o600) == 0 else { throw CocoaError(.fileWriteNoPermission) }
}
