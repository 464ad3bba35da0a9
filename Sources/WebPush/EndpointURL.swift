// The strict endpoint URL parser. Foundation's URL is not used: its idea of
// the host may differ from the HTTP client's, and that gap is where SSRF lives.

private enum ASCII {
    static let slash = UInt8(ascii: "/")
    static let question = UInt8(ascii: "?")
    static let hash = UInt8(ascii: "#")
    static let at = UInt8(ascii: "@")
    static let colon = UInt8(ascii: ":")
    static let percent = UInt8(ascii: "%")
    static let backslash = UInt8(ascii: "\\")
    static let openBracket = UInt8(ascii: "[")
    static let closeBracket = UInt8(ascii: "]")
    static let dot = UInt8(ascii: ".")
    static let hyphen = UInt8(ascii: "-")
    static let zero = UInt8(ascii: "0")
}

private func lowercased(_ byte: UInt8) -> UInt8 {
    (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(byte) ? byte | 0x20 : byte
}

private func isAlphanumeric(_ byte: UInt8) -> Bool {
    (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte)
        || (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(byte)
        || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte)
}

private func isHexDigit(_ byte: UInt8) -> Bool {
    (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte)
        || (UInt8(ascii: "a")...UInt8(ascii: "f")).contains(lowercased(byte))
}

/// RFC 3986 characters of a path or query: unreserved, sub-delims, `:@/?`, `%`.
private let pathPunctuation = Set("-._~!$&'()*+,;=:@/?%".utf8)

/// An endpoint URL that passed the syntax rules; not yet resolved or vetted.
struct EndpointURL: Equatable {
    /// Lowercase hostname without a trailing dot, or canonical IP text, no brackets.
    let host: String
    /// The host when it is an IP literal.
    let address: IPAddress?
    let port: Int
    let pathAndQuery: String

    var normalized: String {
        let name = address?.urlHost ?? host
        return "https://" + (port == 443 ? name : "\(name):\(port)") + pathAndQuery
    }

    init(parsing text: String, allowAnyPort: Bool) throws(EndpointError) {
        let bytes = Array(text.utf8)
        guard bytes.count <= EndpointGuard.maximumLength else { throw .tooLong }
        if bytes.contains(where: { $0 <= 0x20 || $0 == 0x7f }) { throw .whitespace }
        if bytes.contains(where: { $0 >= 0x80 }) { throw .nonASCII }

        let scheme = Array("https://".utf8)
        guard bytes.count >= scheme.count, bytes[0..<scheme.count].map(lowercased) == scheme else {
            throw .notHTTPS
        }
        if bytes.contains(ASCII.backslash) { throw .backslash }
        if bytes.contains(ASCII.hash) { throw .fragment }

        let rest = bytes[scheme.count...]
        let authorityEnd = rest.firstIndex { $0 == ASCII.slash || $0 == ASCII.question } ?? rest.endIndex
        let authority = rest[..<authorityEnd]
        let target = rest[authorityEnd...]
        if authority.contains(ASCII.at) { throw .userinfo }

        // Split host and port.
        let hostPart: ArraySlice<UInt8>
        let portPart: ArraySlice<UInt8>?
        var literal: IPAddress?
        if authority.first == ASCII.openBracket {
            guard let close = authority.firstIndex(of: ASCII.closeBracket) else { throw .badIPv6 }
            let inside = authority[(authority.startIndex + 1)..<close]
            if inside.contains(ASCII.percent) { throw .zoneID }
            guard let address = parseIPv6(inside) else { throw .badIPv6 }
            literal = address
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
                throw .badHostname
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

        // Port: absent, empty or decimal without leading zeros.
        var port = 443
        if let portPart, !portPart.isEmpty {
            guard portPart.count <= 5, portPart.first != ASCII.zero,
                portPart.allSatisfy({ (ASCII.zero...UInt8(ascii: "9")).contains($0) })
            else { throw .badPort }
            port = portPart.reduce(0) { $0 * 10 + Int($1 - ASCII.zero) }
            guard port <= 65535 else { throw .badPort }
        }
        if port != 443 && !allowAnyPort { throw .port443 }

        // Host: numeric (read as a C library would) or an LDH hostname.
        var host = ArraySlice(hostPart.map(lowercased))
        if literal == nil {
            if endsInNumber(host) {
                guard let value = parseIPv4(host) else { throw .badIPv4 }
                literal = .v4(value)
            } else if !isValidHostname(host) {
                throw .badHostname
            }
            // `push.example.com.` and `push.example.com` are one host (SPEC.md
            // Revision 2): stored, bound and hashed without the dot.
            if host.last == ASCII.dot { host = host.dropLast() }
        }

        // Path and query: RFC 3986 characters, well-formed escapes.
        var index = target.startIndex
        while index < target.endIndex {
            let byte = target[index]
            guard isAlphanumeric(byte) || pathPunctuation.contains(byte) else { throw .badPath }
            if byte == ASCII.percent {
                guard index + 2 < target.endIndex, isHexDigit(target[index + 1]), isHexDigit(target[index + 2])
                else { throw .badEscape }
                index += 3
                continue
            }
            index += 1
        }

        self.address = literal
        self.host = literal?.description ?? String(decoding: host, as: UTF8.self)
        self.port = port
        let path = String(decoding: target, as: UTF8.self)
        self.pathAndQuery = path.hasPrefix("/") ? path : "/" + path
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
