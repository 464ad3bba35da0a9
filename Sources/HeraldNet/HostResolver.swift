import Glibc

/// Turns a hostname into the addresses a connection to it could reach.
///
/// Implementations may block; callers run them off the event loop.
public protocol HostResolver: Sendable {
    /// Every address `host` resolves to, IPv4 and IPv6. Throws `ResolverError`
    /// (or any error, which the guard reports as a resolution failure).
    func resolve(host: String, port: Int) throws -> [IPAddress]
}

/// Why a name did not resolve.
public enum ResolverError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The name does not exist or has no addresses (NXDOMAIN, NODATA).
    case notFound(host: String)
    /// The lookup failed without an answer (timeout, SERVFAIL, resolver
    /// error); asking again later may succeed.
    case failed(host: String, reason: String)

    public var description: String {
        switch self {
        case .notFound(let host): "\(host) does not resolve"
        case .failed(let host, let reason): "resolving \(host) failed: \(reason)"
        }
    }
}

// glibc defines these only under _GNU_SOURCE, which the Glibc module lacks.
private let eaiNoData: Int32 = -5
private let eaiAddressFamily: Int32 = -9

/// Resolves names with the C library's `getaddrinfo` (A and AAAA, no
/// `AI_ADDRCONFIG`, so every address is vetted even if this host lacks a route).
///
/// `getaddrinfo` blocks for as long as DNS takes: call it from a thread pool or
/// a detached task, never from an event loop.
public struct SystemResolver: HostResolver {
    public init() {}

    public func resolve(host: String, port: Int) throws -> [IPAddress] {
        guard !host.isEmpty, !host.utf8.contains(0) else { throw ResolverError.notFound(host: host) }
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_flags = AI_NUMERICSERV
        var list: UnsafeMutablePointer<addrinfo>?
        let status = getaddrinfo(host, String(port), &hints, &list)
        defer { if let list { freeaddrinfo(list) } }

        guard status == 0 else {
            switch status {
            case EAI_NONAME, eaiNoData, eaiAddressFamily:
                throw ResolverError.notFound(host: host)
            case EAI_SYSTEM:
                throw ResolverError.failed(host: host, reason: String(cString: strerror(errno)))
            default:
                throw ResolverError.failed(host: host, reason: String(cString: gai_strerror(status)))
            }
        }

        // The answer's distinct addresses, at most IPAddress.answerLimit, in one pass.
        let entries = sequence(state: list) { entry -> addrinfo? in
            guard let current = entry else { return nil }
            entry = current.pointee.ai_next
            return current.pointee
        }
        let addresses = IPAddress.distinct(entries.lazy.compactMap { IPAddress(socketAddress: $0.ai_addr) })
        guard !addresses.isEmpty else { throw ResolverError.notFound(host: host) }
        return addresses
    }
}

extension IPAddress {
    /// The address of an `AF_INET` or `AF_INET6` socket address; nil for another family.
    init?(socketAddress sockaddr: UnsafeMutablePointer<sockaddr>?) {
        guard let sockaddr else { return nil }
        switch Int32(sockaddr.pointee.sa_family) {
        case AF_INET:
            self = sockaddr.withMemoryRebound(to: sockaddr_in.self, capacity: 1) {
                .v4(UInt32(bigEndian: $0.pointee.sin_addr.s_addr))
            }
        case AF_INET6:
            guard
                let address = sockaddr.withMemoryRebound(
                    to: sockaddr_in6.self, capacity: 1,
                    {
                        var raw = $0.pointee.sin6_addr
                        return withUnsafeBytes(of: &raw) { IPAddress(bytes: $0) }
                    })
            else { return nil }
            self = address
        default:
            return nil
        }
    }
}
