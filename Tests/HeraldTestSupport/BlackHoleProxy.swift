import Foundation
import HeraldIO

#if canImport(Glibc)
    import Glibc
#endif

/// A TCP proxy on loopback in front of a test gateway. It pipes each
/// connection both ways until `silence()`: from then on the connections open
/// at that moment forward nothing more in either direction (what arrives is
/// read and dropped) while staying open, like a peer behind a NAT that lost
/// the flow, or a half-open TCP connection. Connections opened later are
/// piped as usual.
public final class BlackHoleProxy: @unchecked Sendable {
    /// One proxied connection.
    public final class Link: @unchecked Sendable {
        public let index: Int
        private let state = Locked<(silenced: Bool, held: Bool, clientClosed: Bool, dropped: Int)>(
            (false, false, false, 0))
        init(index: Int) { self.index = index }

        public var isSilenced: Bool { state.withLock { $0.silenced } }
        /// Bytes are kept, not forwarded, until `resume()`.
        public var isHeld: Bool { state.withLock { $0.held } }
        fileprivate func hold(_ on: Bool) { state.withLock { $0.held = on } }
        /// The client closed (or reset) its side.
        public var clientClosed: Bool { state.withLock { $0.clientClosed } }
        /// Bytes the client sent after the silence (dropped).
        public var dropped: Int { state.withLock { $0.dropped } }
        fileprivate func silence() { state.withLock { $0.silenced = true } }
        fileprivate func markClientClosed() { state.withLock { $0.clientClosed = true } }
        fileprivate func countDropped(_ n: Int) { state.withLock { $0.dropped += n } }
    }

    public let port: Int
    private let listener: Int32
    private let targetPort: Int
    private let state = Locked<(links: [Link], stopped: Bool)>(([], false))

    public init(targetPort: Int) throws {
        self.targetPort = targetPort
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw TestProxyError("socket: \(errno)") }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var addr = Self.loopback(port: 0)
        let bound = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard bound == 0, listen(fd, 64) == 0 else {
            close(fd)
            throw TestProxyError("bind/listen: \(errno)")
        }
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) }
        }
        listener = fd
        port = Int(UInt16(bigEndian: addr.sin_port))
        let thread = Thread { [self] in acceptLoop() }
        thread.start()
    }

    /// Every connection accepted so far, in order.
    public var links: [Link] { state.withLock { $0.links } }

    /// From now on the connections open now forward nothing.
    public func silence() {
        for link in links { link.silence() }
    }

    /// The connections open now forward nothing until `resume()`, which
    /// delivers what they kept: a path that stalls for a while, then recovers.
    public func hold() {
        for link in links { link.hold(true) }
    }

    public func resume() {
        for link in links { link.hold(false) }
    }

    public func stop() {
        state.withLock { $0.stopped = true }
    }

    private var stopped: Bool { state.withLock { $0.stopped } }

    private static func loopback(port: UInt16) -> sockaddr_in {
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = port.bigEndian
        addr.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        return addr
    }

    private func acceptLoop() {
        defer { close(listener) }
        while !stopped {
            var p = pollfd(fd: listener, events: Int16(POLLIN), revents: 0)
            guard poll(&p, 1, 100) > 0 else { continue }
            let client = accept(listener, nil, nil)
            guard client >= 0 else { continue }
            let upstream = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var addr = Self.loopback(port: UInt16(targetPort))
            let rc = withUnsafePointer(to: &addr) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    connect(upstream, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                }
            }
            guard rc == 0 else {
                close(client)
                close(upstream)
                continue
            }
            let link = state.withLock { s -> Link in
                let l = Link(index: s.links.count)
                s.links.append(l)
                return l
            }
            let thread = Thread { [self] in pipe(link, client: client, upstream: upstream) }
            thread.start()
        }
    }

    private func pipe(_ link: Link, client: Int32, upstream: Int32) {
        defer {
            close(client)
            close(upstream)
        }
        var buffer = [UInt8](repeating: 0, count: 65536)
        var fds = [
            pollfd(fd: client, events: Int16(POLLIN), revents: 0),
            pollfd(fd: upstream, events: Int16(POLLIN), revents: 0),
        ]
        // What a held link kept, per direction (0: to the server, 1: to the client).
        var kept: [[UInt8]] = [[], []]
        func sendAll(_ bytes: UnsafeRawBufferPointer, to fd: Int32) -> Bool {
            var off = 0
            while off < bytes.count {
                let w = send(fd, bytes.baseAddress! + off, bytes.count - off, Int32(MSG_NOSIGNAL))
                if w <= 0 { return false }
                off += w
            }
            return true
        }
        while !stopped {
            if !link.isHeld {
                for i in 0..<2 where !kept[i].isEmpty {
                    guard kept[i].withUnsafeBytes({ sendAll($0, to: i == 0 ? upstream : client) }) else { return }
                    kept[i].removeAll()
                }
            }
            for i in fds.indices { fds[i].revents = 0 }
            guard poll(&fds, 2, 100) > 0 else { continue }
            for (i, p) in fds.enumerated() where p.revents != 0 && p.fd >= 0 {
                let from = i == 0 ? client : upstream
                let to = i == 0 ? upstream : client
                let n = buffer.withUnsafeMutableBytes { recv(from, $0.baseAddress, $0.count, 0) }
                if n <= 0 {
                    if i == 0 { link.markClientClosed() }
                    // A silenced link keeps the client's side open whatever the server does.
                    if i == 1 && link.isSilenced {
                        fds[1].fd = -1
                        continue
                    }
                    return
                }
                if link.isSilenced {
                    if i == 0 { link.countDropped(n) }
                    continue
                }
                if link.isHeld {
                    kept[i].append(contentsOf: buffer[0..<n])
                    continue
                }
                guard buffer.withUnsafeBytes({ sendAll(UnsafeRawBufferPointer(rebasing: $0[0..<n]), to: to) }) else {
                    return
                }
            }
        }
    }
}

public struct TestProxyError: Error, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}
