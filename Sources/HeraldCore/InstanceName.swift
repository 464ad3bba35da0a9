import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// The name an instance of Herald goes by: in `push.status` detail
/// (`sent_by`, the instance that made a delivery's latest attempt), in
/// `system.stats` and in the metrics. Several instances sharing one store
/// tell their work apart by it.
public enum InstanceName {
    /// 1 to 64 bytes of `A-Z a-z 0-9 . _ -`.
    public static func isValid(_ name: String) -> Bool {
        let bytes = Array(name.utf8)
        guard (1...64).contains(bytes.count) else { return false }
        return bytes.allSatisfy { b in
            (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A)
                || b == 0x2E || b == 0x5F || b == 0x2D
        }
    }

    /// This host's name (`gethostname`); when it is not a valid instance
    /// name, "host-" and the start of `/etc/machine-id` (unique per host),
    /// and "herald" only when neither is there.
    public static var host: String {
        var buffer = [CChar](repeating: 0, count: 256)
        if gethostname(&buffer, buffer.count - 1) == 0 {
            let name = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            if isValid(name) { return name }
        }
        if let id = try? String(contentsOfFile: "/etc/machine-id", encoding: .utf8) {
            let hex = id.prefix { $0.isHexDigit }.prefix(16)
            if hex.count >= 8 { return "host-" + hex }
        }
        return "herald"
    }

    /// The default identity of an instance: the host name and 8 hex digits
    /// of a digest of its socket path, so that two instances on one host
    /// (each has its own socket) differ, and a restart keeps its name.
    public static func `default`(socket: String) -> String {
        // FNV-1a, 32 bits: a name, not a secret.
        var hash: UInt32 = 2_166_136_261
        for byte in socket.utf8 {
            hash = (hash ^ UInt32(byte)) &* 16_777_619
        }
        let digest = String(hash, radix: 16)
        let suffix = String(repeating: "0", count: 8 - digest.count) + digest
        return String(host.prefix(64 - 9)) + "-" + suffix
    }
}
