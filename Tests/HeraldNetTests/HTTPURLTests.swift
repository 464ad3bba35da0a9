import HeraldNet
import Testing

@Suite("HTTPURL")
struct HTTPURLTests {
    @Test("the parts: scheme in any case, host as written, port text and value, target from / ? or #")
    func parts() throws {
        let url = try HTTPURL(parsing: "HTTPS://Push.Example.NET:0443/a/b?c=d")
        #expect(url.scheme == .https)
        #expect(url.host == "Push.Example.NET")
        #expect(url.bracketedAddress == nil)
        #expect(url.portText == "0443" && url.port == 443)
        #expect(url.target == "/a/b?c=d")

        let v6 = try HTTPURL(parsing: "http://[::1]:9002/fcm")
        #expect(v6.scheme == .http && v6.host == "::1" && v6.bracketedAddress == IPAddress(literal: "::1"))
        #expect(v6.port == 9002 && v6.target == "/fcm")

        let bare = try HTTPURL(parsing: "https://example.com")
        #expect(bare.portText == nil && bare.port == nil && bare.target == "")
        let emptyPort = try HTTPURL(parsing: "https://example.com:?q")
        #expect(emptyPort.portText == "" && emptyPort.port == nil && emptyPort.target == "?q")
        #expect(try HTTPURL(parsing: "https://example.com#top").target == "#top")
        #expect(try HTTPURL(parsing: "https://1.2.3.4:65535").port == 65535)
    }

    @Test(
        "refusals, the first failing check named",
        arguments: [
            ("ftp://example.com/", URLSyntaxError.scheme),
            ("https:/example.com", .scheme),
            ("example.com", .scheme),
            ("https://user@example.com/", .userinfo),
            ("https://[::1@x", .userinfo),
            ("https://[::1", .badIPv6),
            ("https://[127.0.0.1]/", .badIPv6),
            ("https://[::1]x/", .badIPv6),
            ("https://[fe80::1%eth0]x/", .zoneID),
            ("https://[]/", .badIPv6),
            ("https://a[b]/", .bracketInHost),
            ("https://a]:1/", .bracketInHost),
            ("https://a%2eb/", .percentHost),
            ("https://:443/", .noHost),
            ("https:///path", .noHost),
            ("https://example.com:65536/", .badPort),
            ("https://example.com:99999999999999999999999/", .badPort),
            ("https://example.com:+1/", .badPort),
            ("https://example.com:1:2/", .badPort),
        ])
    func refusals(_ text: String, _ error: URLSyntaxError) {
        #expect(throws: error) { try HTTPURL(parsing: text) }
    }

    @Test(
        "strict host: canonical addresses, lowercase LDH names without the trailing dot",
        arguments: [
            ("https://Push.Example.Net./x", "push.example.net", nil),
            ("https://xn--bcher-kva.example/", "xn--bcher-kva.example", nil),
            ("https://127.1/", "127.0.0.1", "127.0.0.1"),
            ("https://0x7F.0.0.1./", "127.0.0.1", "127.0.0.1"),
            ("https://[0:0::FFFF:7f00:1]/", "::ffff:127.0.0.1", "::ffff:127.0.0.1"),
        ] as [(String, String, String?)])
    func strictHost(_ text: String, _ name: String, _ address: String?) throws {
        let host = try HTTPURL(parsing: text).strictHost()
        #expect(host.name == name)
        #expect(host.address == address.flatMap { IPAddress(numericHost: $0) })
    }

    @Test(
        "strict host refusals",
        arguments: [
            ("https://1.2.3.256/", URLSyntaxError.badIPv4),
            ("https://example.0x/", .badIPv4),
            ("https://-bad.example/", .badHostname),
            ("https://bad-.example/", .badHostname),
            ("https://a..b/", .badHostname),
            ("https://under_score.example/", .badHostname),
            ("https://\(String(repeating: "a", count: 64)).example/", .badHostname),
        ])
    func strictHostRefusals(_ text: String, _ error: URLSyntaxError) throws {
        let url = try HTTPURL(parsing: text)
        #expect(throws: error) { try url.strictHost() }
    }

    @Test("strict target: RFC 3986 characters and well-formed escapes")
    func strictTarget() throws {
        try HTTPURL(parsing: "https://a.example/p/%41~-._!$&'()*+,;=:@?q=/?%ff").checkStrictTarget()
        #expect(throws: URLSyntaxError.badPath) { try HTTPURL(parsing: "https://a.example/a^b").checkStrictTarget() }
        #expect(throws: URLSyntaxError.badPath) { try HTTPURL(parsing: "https://a.example/a\"b").checkStrictTarget() }
        #expect(throws: URLSyntaxError.badEscape) { try HTTPURL(parsing: "https://a.example/%4").checkStrictTarget() }
        #expect(throws: URLSyntaxError.badEscape) { try HTTPURL(parsing: "https://a.example/%zz").checkStrictTarget() }
    }
}
