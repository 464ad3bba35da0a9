import Foundation
import HeraldTestSupport

#if canImport(Glibc)
    import Glibc
#endif

/// A Unix socket that stands in for the daemon: it keeps every request a
/// command writes and answers each with what `answer` makes of it, so a test
/// sees exactly the params the command built. Call `close()` when done.
final class RecordingSocket: @unchecked Sendable {
    let path: String
    private let listener: Int32
    private let answer: @Sendable (_ index: Int, _ method: String, _ params: [String: Any]) -> Any
    private let lock = NSLock()
    private var received: [[String: Any]] = []
    private var closed = false

    /// `answer` gives each request's result (any JSON value) from its index
    /// (0 for the first request the socket received), method and params; by
    /// default `{}`.
    init(
        in dir: TempDir,
        answer: @escaping @Sendable (_ index: Int, _ method: String, _ params: [String: Any]) -> Any = { _, _, _ in
            [String: Any]()
        }
    ) throws {
        path = dir.path("recording.sock")
        self.answer = answer
        listener = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        guard listener >= 0 else { throw HarnessError("socket: \(String(cString: strerror(errno)))") }
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: addr.sun_path) else {
            Glibc.close(listener)
            throw HarnessError("socket path too long: \(path)")
        }
        withUnsafeMutableBytes(of: &addr.sun_path) { $0.copyBytes(from: bytes) }
        let bound = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(listener, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        guard bound == 0, listen(listener, 8) == 0 else {
            let e = errno
            Glibc.close(listener)
            throw HarnessError("bind \(path): \(String(cString: strerror(e)))")
        }
        let thread = Thread { [self] in serve() }
        thread.start()
    }

    /// The requests received so far (`method` and `params` of each), in order.
    var requests: [[String: Any]] { lock.withLock { received } }

    /// Stops accepting; a command started later cannot connect.
    func close() {
        let first = lock.withLock {
            defer { closed = true }
            return !closed
        }
        guard first else { return }
        // Wakes the accept of the serving thread, which then ends.
        shutdown(listener, Int32(SHUT_RDWR))
        Glibc.close(listener)
    }

    private func serve() {
        while true {
            let fd = accept(listener, nil, nil)
            if fd < 0 {
                if errno == EINTR { continue }
                return
            }
            converse(fd)
            Glibc.close(fd)
        }
    }

    /// Answers every request line of one connection until the command closes it.
    private func converse(_ fd: Int32) {
        var buffer: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            while let nl = buffer.firstIndex(of: 10) {
                let line = Data(buffer[..<nl])
                buffer.removeSubrange(...nl)
                guard let request = try? JSONSerialization.jsonObject(with: line) as? [String: Any] else { return }
                let index = lock.withLock {
                    received.append(request)
                    return received.count - 1
                }
                let method = request["method"] as? String ?? ""
                let params = request["params"] as? [String: Any] ?? [:]
                let response: [String: Any] = [
                    "jsonrpc": "2.0", "id": request["id"] ?? NSNull(), "result": answer(index, method, params),
                ]
                guard let data = try? JSONSerialization.data(withJSONObject: response) else { return }
                let bytes = [UInt8](data) + [10]
                let sent = bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                if sent != bytes.count { return }
            }
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { return }
            buffer += chunk[0..<n]
        }
    }
}
