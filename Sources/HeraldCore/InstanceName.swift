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

    /// This host's name (`gethostname`), the default; "herald" when the
    /// host name is not a valid instance name.
    public static var host: String {
        var buffer = [CChar](repeating: 0, count: 256)
        guard gethostname(&buffer, buffer.count - 1) == 0 else { return "herald" }
        let name = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return isValid(name) ? name : "herald"
    }
}
