/// Where requests go: scheme, host and port (RFC 6454), as one value, so
/// that every place that names a server (a lane, a remembered fallback, a
/// VAPID audience, a provider's base URL) prints it the same way.
public struct Origin: Sendable, Hashable, CustomStringConvertible {
    public let scheme: HTTPURL.Scheme
    /// Lower-cased; an IPv6 address without brackets.
    public let host: String
    /// The port requests go to (443 or 80 when none is written).
    public let port: Int

    public init(scheme: HTTPURL.Scheme, host: String, port: Int? = nil) {
        self.scheme = scheme
        self.host = host.lowercased()
        self.port = port ?? scheme.defaultPort
    }

    public var usesTLS: Bool { scheme == .https }

    /// The host (an IPv6 address in brackets), then `:port` unless it is the
    /// scheme's default: what a `Host` or `:authority` header carries.
    public var authority: String {
        port == scheme.defaultPort ? bracketedHost : "\(bracketedHost):\(port)"
    }

    /// The host, an IPv6 address in brackets.
    public var bracketedHost: String { host.contains(":") ? "[\(host)]" : host }

    /// `scheme://authority`.
    public var description: String { "\(scheme.rawValue)://\(authority)" }

    /// `scheme://host[:port]` of a stored Web Push endpoint, as written
    /// (a written port kept), lower-cased; nil if it has none. It does not
    /// parse: endpoints are checked and normalised when registered, and this
    /// runs per delivery.
    public static func text(ofEndpoint endpoint: String) -> String? {
        guard let schemeEnd = endpoint.firstRange(of: "://")?.upperBound else { return nil }
        let rest = endpoint[schemeEnd...]
        let authority = rest.prefix { $0 != "/" && $0 != "?" && $0 != "#" }
        guard !authority.isEmpty else { return nil }
        return endpoint[..<schemeEnd].lowercased() + authority.lowercased()
    }
}

extension HTTPURL.Scheme {
    /// 443 for `https`, 80 for `http`.
    public var defaultPort: Int { self == .https ? 443 : 80 }
}

extension HTTPURL: CustomStringConvertible {
    /// A URL made of checked parts: `origin`, then `target` (a path such as
    /// `/proxy`, or empty). The port is written only when it is not the
    /// scheme's default, as ``description`` prints it.
    public init(origin: Origin, target: String) {
        self.scheme = origin.scheme
        self.host = origin.host
        self.bracketedAddress = origin.host.contains(":") ? IPAddress(literal: origin.host) : nil
        let written = origin.port == origin.scheme.defaultPort ? nil : origin.port
        self.portText = written.map(String.init)
        self.port = written
        self.target = target
    }

    /// The port requests go to: the one written, else the scheme's default.
    public var effectivePort: Int { port ?? scheme.defaultPort }

    /// Scheme, host (lower-cased) and the port requests go to.
    public var origin: Origin { Origin(scheme: scheme, host: host, port: effectivePort) }

    /// The origin, then the target as written.
    public var description: String { origin.description + target }
}
