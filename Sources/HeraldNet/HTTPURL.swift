// The one URL parser. Foundation's URL is not used: its idea of the host may
// differ from the HTTP client's, and that gap is where SSRF lives.

private enum ASCII {
    static let slash = UInt8(ascii: "/")
    static let question = UInt8(ascii: "?")
    static let hash = UInt8(ascii: "#")
    static let at = UInt8(ascii: "@")
    static let colon = UInt8(ascii: ":")
    static let percent = UInt8(ascii: "%")
    static let openBracket = UInt8(ascii: "[")
    static let closeBracket = UInt8(ascii: "]")
    static let dot = UInt8(ascii: ".")
    static let hyphen = UInt8(ascii: "-")
    static let zero = UInt8(ascii: "0")
    static let nine = UInt8(ascii: "9")
}

private func lowercased(_ byte: UInt8) -> UInt8 {
    (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(byte) ? byte | 0x20 : byte
}

private func isAlphanumeric(_ byte: UInt8) -> Bool {
    (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte)
        || (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(byte)
        || (ASCII.zero...ASCII.nine).contains(byte)
}

private func isHexDigit(_ byte: UInt8) -> Bool {
    (ASCII.zero...ASCII.nine).contains(byte) || (UInt8(ascii: "a")...UInt8(ascii: "f")).contains(lowercased(byte))
}

/// RFC 3986 characters of a path or query: unreserved, sub-delims, `:@/?`, `%`.
private let pathPunctuation = Set("-._~!$&'()*+,;=:@/?%".utf8)

/// Why a URL was refused, by the split every caller shares or by the strict
/// rules (``HTTPURL/strictHost()``, ``HTTPURL/checkStrictTarget()``).
public enum URLSyntaxError: Error, Sendable, Hashable {
    /// Not `http://` or `https://` (in any case).
    case scheme
    /// `user@` in the authority.
    case userinfo
    /// A bracketed host that is unclosed, not IPv6, or followed by other than `:port`.
    case badIPv6
    /// `%` inside the brackets.
    case zoneID
    /// `[` or `]` in a host that does not start with `[`.
    case bracketInHost
    /// `%` in the host.
    case percentHost
    case noHost
    /// Not decimal digits, or above 65535.
    case badPort
    /// The host ends in a number but is not an IPv4 address (strict rules).
    case badIPv4
    /// Not an RFC 1123 host name (strict rules).
    case badHostname
    /// A character RFC 3986 does not allow in a path or query (strict rules).
    case badPath
    /// `%` not followed by two hex digits (strict rules).
    case badEscape
}

/// An absolute `http` or `https` URL split into scheme, host, port and target.
///
/// This is what every URL Herald reads has in common (the config's provider
/// base URLs, Web Push endpoints): no userinfo, a host, a bracketed host is an
/// IPv6 literal without zone id, a port is decimal and at most 65535. The
/// authority ends at the first `/`, `?` or `#`. Callers add their own rules on
/// top; ``strictHost()`` and ``checkStrictTarget()`` are the strict ones the
/// Web Push endpoint guard adds.
public struct HTTPURL: Sendable, Hashable {
    public enum Scheme: String, Sendable {
        case http
        case https
    }

    public let scheme: Scheme
    /// The host as written (case kept), without brackets.
    public let host: String
    /// The address when the host was bracketed (`[::1]`).
    public let bracketedAddress: IPAddress?
    /// The text after the host's `:`, nil when there is no colon; may be empty.
    public let portText: String?
    /// The port written, nil when there is none (no colon, or nothing after it).
    public let port: Int?
    /// Everything from the first `/`, `?` or `#` after the authority on; may be empty.
    public let target: String

    /// Splits `text`; checks are made in this order, the first failure thrown:
    /// scheme, userinfo, brackets (zone id before IPv6 syntax), `%` in the host,
    /// an empty host, the port.
    public init(parsing text: some StringProtocol) throws(URLSyntaxError) {
        let bytes = Array(text.utf8)
        let scheme: Scheme
        let schemeLength: Int
        if bytes.count >= 8, bytes[0..<8].map(lowercased).elementsEqual("https://".utf8) {
            (scheme, schemeLength) = (.https, 8)
        } else if bytes.count >= 7, bytes[0..<7].map(lowercased).elementsEqual("http://".utf8) {
            (scheme, schemeLength) = (.http, 7)
        } else {
            throw .scheme
        }

        let rest = bytes[schemeLength...]
        let authorityEnd =
            rest.firstIndex { $0 == ASCII.slash || $0 == ASCII.question || $0 == ASCII.hash } ?? rest.endIndex
        let authority = rest[..<authorityEnd]
        if authority.contains(ASCII.at) { throw .userinfo }

        let hostPart: ArraySlice<UInt8>
        let portPart: ArraySlice<UInt8>?
        var bracketed: IPAddress?
        if authority.first == ASCII.openBracket {
            guard let close = authority.firstIndex(of: ASCII.closeBracket) else { throw .badIPv6 }
            let inside = authority[(authority.startIndex + 1)..<close]
            if inside.contains(ASCII.percent) { throw .zoneID }
            guard let address = parseIPv6(inside) else { throw .badIPv6 }
            bracketed = address
            hostPart = inside
            let after = authority[(close + 1)...]
            if after.isEmpty {
                portPart = nil
            } else {
                guard after.first == ASCII.colon else { throw .badIPv6 }
                portPart = after.dropFirst()
            }
        } else {
            if authority.contains(ASCII.openBracket) || authority.contains(ASCII.closeBracket) {
                throw .bracketInHost
            }
            if let colon = authority.firstIndex(of: ASCII.colon) {
                hostPart = authority[..<colon]
                portPart = authority[(colon + 1)...]
            } else {
                hostPart = authority
                portPart = nil
            }
            if hostPart.contains(ASCII.percent) { throw .percentHost }
        }
        guard !hostPart.isEmpty else { throw .noHost }

        var port: Int?
        if let portPart, !portPart.isEmpty {
            var value = 0
            for byte in portPart {
                guard (ASCII.zero...ASCII.nine).contains(byte) else { throw .badPort }
                value = value * 10 + Int(byte - ASCII.zero)
                guard value <= 65535 else { throw .badPort }
            }
            port = value
        }

        self.scheme = scheme
        self.host = String(decoding: hostPart, as: UTF8.self)
        self.bracketedAddress = bracketed
        self.portText = portPart.map { String(decoding: $0, as: UTF8.self) }
        self.port = port
        self.target = String(decoding: rest[authorityEnd...], as: UTF8.self)
    }

    /// The host under the strict rules: an IP address (bracketed IPv6, or IPv4
    /// read as the C library reads a host that ends in a number: `127.1`,
    /// `0x7f.0.0.1`) named by its canonical text, or an RFC 1123 host name (LDH
    /// labels of 1–63 bytes, 253 in all; punycode for international names),
    /// lowercased, without its one allowed trailing dot.
    public func strictHost() throws(URLSyntaxError) -> (name: String, address: IPAddress?) {
        if let bracketedAddress { return (bracketedAddress.description, bracketedAddress) }
        var host = ArraySlice(host.utf8.map(lowercased))
        if endsInNumber(host) {
            guard let value = parseIPv4(host) else { throw .badIPv4 }
            let address = IPAddress.v4(value)
            return (address.description, address)
        }
        guard isValidHostname(host) else { throw .badHostname }
        // `push.example.com.` and `push.example.com` are one host.
        if host.last == ASCII.dot { host = host.dropLast() }
        return (String(decoding: host, as: UTF8.self), nil)
    }

    /// Checks the target under the strict rules: RFC 3986 path and query
    /// characters only, every `%` followed by two hex digits.
    public func checkStrictTarget() throws(URLSyntaxError) {
        let target = Array(target.utf8)
        var index = 0
        while index < target.count {
            let byte = target[index]
            guard isAlphanumeric(byte) || pathPunctuation.contains(byte) else { throw .badPath }
            if byte == ASCII.percent {
                guard index + 2 < target.count, isHexDigit(target[index + 1]), isHexDigit(target[index + 2])
                else { throw .badEscape }
                index += 3
                continue
            }
            index += 1
        }
    }
}

/// RFC 1123 host names: dot-separated labels of letters, digits and hyphens,
/// 1–63 bytes each, no hyphen at either end, 253 bytes in all; one trailing dot
/// allowed. Internationalised names must already be punycode (`xn--`).
private func isValidHostname(_ host: ArraySlice<UInt8>) -> Bool {
    let labels = hostLabels(host)
    guard labels.reduce(0, { $0 + $1.count }) + labels.count - 1 <= 253 else { return false }
    return labels.allSatisfy { label in
        guard (1...63).contains(label.count), label.first != ASCII.hyphen, label.last != ASCII.hyphen else {
            return false
        }
        return label.allSatisfy { isAlphanumeric($0) || $0 == ASCII.hyphen }
    }
}
