import HeraldNet
import Testing

@Suite("Origin")
struct OriginTests {
    @Test(
        "a URL's origin: scheme, host lower-cased, the port requests go to; printed without a default port",
        arguments: [
            ("https://Push.Example.NET:0443/a/b?c=d", "https://push.example.net", "push.example.net", 443),
            ("https://h.example:8443", "https://h.example:8443", "h.example:8443", 8443),
            ("http://127.0.0.1/fcm", "http://127.0.0.1", "127.0.0.1", 80),
            ("http://localhost:80", "http://localhost", "localhost", 80),
            ("http://[::1]:9002/fcm", "http://[::1]:9002", "[::1]:9002", 9002),
            ("https://[2001:DB8::1]/", "https://[2001:db8::1]", "[2001:db8::1]", 443),
        ])
    func ofURL(text: String, printed: String, authority: String, port: Int) throws {
        let origin = try HTTPURL(parsing: text).origin
        #expect(origin.description == printed)
        #expect(origin.authority == authority)
        #expect(origin.port == port)
        #expect(origin.usesTLS == text.lowercased().hasPrefix("https"))
    }

    @Test("an IPv6 host is kept without brackets and bracketed where a URL or header needs it")
    func ipv6() {
        let origin = Origin(scheme: .https, host: "2001:DB8::1", port: 443)
        #expect(origin.host == "2001:db8::1")
        #expect(origin.bracketedHost == "[2001:db8::1]")
        #expect(Origin(scheme: .https, host: "h.example").bracketedHost == "h.example")
    }

    @Test("a URL made of an origin and a target prints as one parsed from that text, and parses back equal")
    func urlFromParts() throws {
        for (origin, target) in [
            (Origin(scheme: .https, host: "api.push.apple.com"), ""),
            (Origin(scheme: .https, host: "h.example", port: 8443), "/proxy"),
            (Origin(scheme: .http, host: "::1", port: 9002), "/fcm"),
        ] {
            let url = HTTPURL(origin: origin, target: target)
            #expect(url.origin == origin)
            #expect(url.description == origin.description + target)
            #expect(try HTTPURL(parsing: url.description) == url, "\(url)")
        }
        let v6 = HTTPURL(origin: Origin(scheme: .http, host: "::1", port: 9002), target: "")
        #expect(v6.bracketedAddress == IPAddress(literal: "::1"))
        #expect(HTTPURL(origin: Origin(scheme: .https, host: "h.example"), target: "").port == nil)
    }

    @Test(
        "a stored endpoint's origin text, as written up to its path, lower-cased; nil without a scheme or host",
        arguments: [
            ("https://Push.Example.net/wpush/v2/x", "https://push.example.net"),
            ("https://push.example.net:8443/x?y", "https://push.example.net:8443"),
            ("https://push.example.net?y", "https://push.example.net"),
            ("https://[2001:db8::1]/x", "https://[2001:db8::1]"),
            ("push.example.net/x", nil),
            ("https:///x", nil),
        ] as [(String, String?)])
    func endpointText(endpoint: String, expected: String?) {
        #expect(Origin.text(ofEndpoint: endpoint) == expected)
    }
}
