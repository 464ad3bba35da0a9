/// Why a Web Push endpoint was refused.
///
/// `malformed` and `unresolvable` are the caller's input errors (JSON-RPC
/// -32602); `notPubliclyRoutable` is the application error 1001
/// `not_publicly_routable`; `resolutionFailed` is a lookup that may succeed
/// if tried again.
public enum EndpointError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The URL breaks the endpoint rules; `reason` completes "endpoint …",
    /// e.g. "must be an https URL", "port must be 443".
    case malformed(reason: String)
    /// The host is, or resolves to, an address that must not be dialled.
    case notPubliclyRoutable(address: String)
    /// The name does not exist or has no addresses.
    case unresolvable(host: String)
    /// The lookup failed without an answer (timeout, SERVFAIL).
    case resolutionFailed(host: String, reason: String)

    /// A short reason for an `invalid params` message, completing "endpoint …".
    public var reason: String {
        switch self {
        case .malformed(let reason): reason
        case .notPubliclyRoutable(let address): "resolves to \(address), which is not publicly routable"
        case .unresolvable: "host does not resolve"
        case .resolutionFailed(_, let reason): "host lookup failed: \(reason)"
        }
    }

    public var description: String {
        switch self {
        case .malformed(let reason): "endpoint \(reason)"
        case .notPubliclyRoutable(let address): "endpoint address \(address) is not publicly routable"
        case .unresolvable(let host): "endpoint host \(host) does not resolve"
        case .resolutionFailed(let host, let reason): "endpoint host \(host) lookup failed: \(reason)"
        }
    }
}

extension EndpointError {
    static let notHTTPS = EndpointError.malformed(reason: "must be an https URL")
    static let userinfo = EndpointError.malformed(reason: "must not contain userinfo")
    static let port443 = EndpointError.malformed(reason: "port must be 443")
    static let badPort = EndpointError.malformed(reason: "port is not a valid port number")
    static let fragment = EndpointError.malformed(reason: "must not have a fragment")
    static let tooLong = EndpointError.malformed(reason: "is longer than \(EndpointGuard.maximumLength) bytes")
    static let whitespace = EndpointError.malformed(reason: "must not contain whitespace or control characters")
    static let nonASCII = EndpointError.malformed(
        reason: "must be ASCII (punycode the host, percent-encode the path)")
    static let backslash = EndpointError.malformed(reason: "must not contain backslashes")
    static let noHost = EndpointError.malformed(reason: "host is required")
    static let badHostname = EndpointError.malformed(reason: "host is not a valid hostname")
    static let badIPv4 = EndpointError.malformed(reason: "host is not a valid IPv4 address")
    static let badIPv6 = EndpointError.malformed(reason: "host is not a valid IPv6 address")
    static let zoneID = EndpointError.malformed(reason: "host must not contain an IPv6 zone id")
    static let percentHost = EndpointError.malformed(reason: "host must not contain percent-encoding")
    static let badPath = EndpointError.malformed(reason: "path contains a character not allowed in a URL")
    static let badEscape = EndpointError.malformed(reason: "path contains a malformed percent-encoding")
}
