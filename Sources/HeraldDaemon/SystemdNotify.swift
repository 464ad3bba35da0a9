import CHeraldSys
import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// `sd_notify` without libsystemd: datagrams to `$NOTIFY_SOCKET`.
struct SystemdNotifier: Sendable {
    let path: String?

    init(environment: [String: String]) {
        path = environment["NOTIFY_SOCKET"].flatMap { $0.isEmpty ? nil : $0 }
    }

    /// How often to send `WATCHDOG=1`, in microseconds: half of
    /// `WATCHDOG_USEC`, when systemd asks this process for pings.
    static func watchdogInterval(environment: [String: String]) -> Int64? {
        guard let usec = environment["WATCHDOG_USEC"].flatMap(Int64.init), usec > 0 else { return nil }
        if let pid = environment["WATCHDOG_PID"].flatMap(Int32.init), pid != getpid() { return nil }
        return usec / 2
    }

    /// Sends e.g. "READY=1\nSTATUS=…"; silently does nothing outside systemd.
    func notify(_ state: String) {
        guard let path else { return }
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return }
        defer { close(fd) }
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        var bytes = Array(path.utf8)
        if bytes.first == UInt8(ascii: "@") { bytes[0] = 0 }  // abstract namespace
        let capacity = MemoryLayout.size(ofValue: addr.sun_path)
        guard bytes.count < capacity else { return }
        withUnsafeMutableBytes(of: &addr.sun_path) { $0.copyBytes(from: bytes) }
        let length = socklen_t(MemoryLayout<sa_family_t>.size + bytes.count + (bytes.first == 0 ? 0 : 1))
        let message = Array(state.utf8)
        _ = withUnsafePointer(to: &addr) { ptr in
            ptr.withMemoryRebound(to: sockaddr.self, capacity: 1) { sa in
                message.withUnsafeBytes { sendto(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL), sa, length) }
            }
        }
    }
}
