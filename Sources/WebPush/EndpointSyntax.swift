import HeraldNet

// Web Push's endpoint rules, on top of HeraldNet's URL parser: https only,
// ASCII, no fragment or backslash, port 443, the strict host and path rules.

/// An endpoint URL that passed the syntax rules; not yet resolved or vetted.
struct EndpointSyntax: Equatable {
    /// Lowercase hostname without a trailing dot, or canonical IP text, no brackets.
    let host: String
    /// The host when it is an IP literal.
    let address: IPAddress?
    let port: Int
    let pathAndQuery: String

    var normalized: String { Origin(scheme: .https, host: host, port: port).description + pathAndQuery }

    init(parsing text: String, allowAnyPort: Bool) throws(EndpointError) {
        let bytes = Array(text.utf8)
        guard bytes.count <= EndpointGuard.maximumLength else { throw .tooLong }
        if bytes.contains(where: { $0 <= 0x20 || $0 == 0x7f }) { throw .whitespace }
        if bytes.contains(where: { $0 >= 0x80 }) { throw .nonASCII }
        guard bytes.count >= 8, String(decoding: bytes[0..<8], as: UTF8.self).lowercased() == "https://" else {
            throw .notHTTPS
        }  // ASCII by now, so lowercased() is byte-wise
        if bytes.contains(UInt8(ascii: "\\")) { throw .backslash }
        if bytes.contains(UInt8(ascii: "#")) { throw .fragment }

        let url: HTTPURL
        do throws(URLSyntaxError) { url = try HTTPURL(parsing: text) } catch { throw EndpointError(error) }
        var port = 443
        if let written = url.port, let digits = url.portText {
            // Decimal without leading zeros (HTTPURL allows them).
            guard digits.utf8.count <= 5, digits.utf8.first != UInt8(ascii: "0") else { throw .badPort }
            port = written
        }
        if port != 443 && !allowAnyPort { throw .port443 }
        let host: (name: String, address: IPAddress?)
        do throws(URLSyntaxError) {
            host = try url.strictHost()
            try url.checkStrictTarget()
        } catch {
            throw EndpointError(error)
        }

        self.address = host.address
        self.host = host.name
        self.port = port
        self.pathAndQuery = url.target.hasPrefix("/") ? url.target : "/" + url.target
    }
}

extension EndpointError {
    /// The endpoint reason for a URL syntax refusal.
    init(_ error: URLSyntaxError) {
        self =
            switch error {
            case .scheme: .notHTTPS
            case .userinfo: .userinfo
            case .badIPv6: .badIPv6
            case .zoneID: .zoneID
            case .bracketInHost, .badHostname: .badHostname
            case .percentHost: .percentHost
            case .noHost: .noHost
            case .badPort: .badPort
            case .badIPv4: .badIPv4
            case .badPath: .badPath
            case .badEscape: .badEscape
            }
    }
}
