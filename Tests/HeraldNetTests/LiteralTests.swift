import Glibc
import HeraldNet
import HeraldTestSupport
import Testing

@Suite("IPAddress literals and loopback")
struct LiteralTests {
    @Test(
        "literals are read as inet_pton reads them",
        arguments: [
            ("127.0.0.1", "127.0.0.1"), ("0.0.0.0", "0.0.0.0"), ("255.255.255.255", "255.255.255.255"),
            ("::1", "::1"), ("0:0::1", "::1"), ("2001:DB8::1", "2001:db8::1"), ("::ffff:127.0.0.1", "::ffff:127.0.0.1"),
        ])
    func literals(_ text: String, _ canonical: String) throws {
        #expect(try #require(IPAddress(literal: text)).description == canonical)
    }

    @Test(
        "not literals: resolver spellings, brackets, zone ids, trailing dots, names",
        arguments: [
            "", "127.1", "0x7f.0.0.1", "2130706433", "017.0.0.1", "127.0.0.01", "127.0.0.1.", "256.0.0.1", "[::1]",
            "::1%lo", "fe80::1%25eth0", "localhost", "1.2.3.4 ", " ::1", "1.2.3.4\u{0}", "::1\u{0}x",
        ])
    func notLiterals(_ text: String) {
        #expect(IPAddress(literal: text) == nil)
    }

    /// Random text over both alphabets: accepted exactly when glibc's
    /// `inet_pton` accepts it (for one family or the other), with its bytes.
    @Test("literal parsing agrees with glibc inet_pton")
    func agreesWithInetPton() {
        var random = SplitMix64(seed: 0x11ee)
        let tokens = [
            "0", "1", "9", "10", "255", "256", "00", "01", "ffff", "FfFf", "db8", "12345", "g", ".", ".", ":", ":",
            "::", "1.2.3.4", "127.0.0.1", "x",
        ]
        var accepted = (v4: 0, v6: 0)
        for _ in 0..<200_000 {
            let count = Int.random(in: 1...12, using: &random)
            let text = (0..<count).map { _ in tokens.randomElement(using: &random)! }.joined()
            var v4 = in_addr()
            var v6 = in6_addr()
            let libc: [UInt8]? =
                if inet_pton(AF_INET, text, &v4) == 1 {
                    withUnsafeBytes(of: &v4) { Array($0) }
                } else if inet_pton(AF_INET6, text, &v6) == 1 {
                    withUnsafeBytes(of: &v6) { Array($0) }
                } else {
                    nil
                }
            let ours = IPAddress(literal: text)
            #expect(ours?.bytes == libc, "\(text)")
            switch ours?.family {
            case .v4: accepted.v4 += 1
            case .v6: accepted.v6 += 1
            case nil: break
            }
        }
        #expect(accepted.v4 > 500 && accepted.v6 > 500)
    }

    @Test(
        "loopback is 127.0.0.0/8 and ::1 only",
        arguments: [
            ("127.0.0.1", true), ("127.255.255.254", true), ("127.0.0.0", true), ("::1", true),
            ("0:0:0:0:0:0:0:1", true),
            ("126.255.255.255", false), ("128.0.0.1", false), ("::", false), ("::2", false),
            ("::ffff:127.0.0.1", false),
            ("::127.0.0.1", false), ("0.0.0.0", false), ("10.0.0.1", false),
        ])
    func loopback(_ text: String, _ expected: Bool) throws {
        #expect(try #require(IPAddress(literal: text)).isLoopback == expected)
    }

    @Test(
        "loopback hosts: localhost or a loopback literal, no brackets",
        arguments: [
            ("localhost", true), ("127.0.0.1", true), ("127.9.9.9", true), ("::1", true), ("[::1]", false),
            ("LOCALHOST", false), ("localhost.", false), ("127.1", false), ("localhost.example", false),
            ("example.com", false), ("", false),
        ])
    func loopbackHosts(_ host: String, _ expected: Bool) {
        #expect(IPAddress.isLoopbackHost(host) == expected)
    }
}
