import Glibc
import HeraldTestSupport
import Testing
import HeraldNet

@Suite("IPAddress")
struct IPAddressTests {
    @Test(
        "IPv4 in every inet_aton spelling",
        arguments: [
            ("127.0.0.1", "127.0.0.1"),
            ("127.1", "127.0.0.1"),
            ("127.0.1", "127.0.0.1"),
            ("2130706433", "127.0.0.1"),
            ("0177.0.0.1", "127.0.0.1"),
            ("017700000001", "127.0.0.1"),
            ("0x7f.0.0.1", "127.0.0.1"),
            ("0x7f000001", "127.0.0.1"),
            ("0X7F.0x0.0.01", "127.0.0.1"),
            ("0177.0x0.1", "127.0.0.1"),
            ("127.0.0.1.", "127.0.0.1"),
            ("0", "0.0.0.0"),
            ("1.", "0.0.0.1"),
            ("00", "0.0.0.0"),
            ("0x0", "0.0.0.0"),
            ("4294967295", "255.255.255.255"),
            ("0xffffffff", "255.255.255.255"),
            ("037777777777", "255.255.255.255"),
            ("1.0xffffff", "1.255.255.255"),
            ("1.2.0xffff", "1.2.255.255"),
            ("000000000000000000000000000010.1", "8.0.0.1"),
            ("169.254.43518", "169.254.169.254"),
        ])
    func ipv4Forms(_ text: String, _ canonical: String) throws {
        let address = try #require(IPAddress(numericHost: text))
        #expect(address.family == .v4)
        #expect(address.description == canonical)
    }

    @Test(
        "text that is not an IPv4 address",
        arguments: [
            "", ".", "..", "1..1", ".1", "1.2.3.4.5", "1.2.3.4..", "256.0.0.1", "1.256.0.1",
            "1.2.65536", "1.16777216", "4294967296", "0x100000000", "08", "09.1", "0x", "0xg",
            "1.0x", "-1", "+1", "1e3", "0x7f.0.0.1 ", " 1", "localhost", "push.example.net",
            "1.2.3.4%eth0", "99999999999999999999999",
        ])
    func notIPv4(_ text: String) {
        #expect(IPAddress(numericHost: text) == nil)
    }

    @Test(
        "IPv6 literals, bracketed or not",
        arguments: [
            ("::", "::"),
            ("::1", "::1"),
            ("[::1]", "::1"),
            ("0:0:0:0:0:0:0:1", "::1"),
            ("2001:DB8::1", "2001:db8::1"),
            ("2001:0db8:0000:0000:0000:0000:0000:0001", "2001:db8::1"),
            ("2001:db8:0:1:1:1:1:1", "2001:db8:0:1:1:1:1:1"),
            ("2001:db8:0:0:1:0:0:1", "2001:db8::1:0:0:1"),
            ("2001:0:0:1:0:0:0:1", "2001:0:0:1::1"),
            ("1:2:3:4:5:6:7::", "1:2:3:4:5:6:7:0"),
            ("::2:3:4:5:6:7:8", "0:2:3:4:5:6:7:8"),
            ("fe80::", "fe80::"),
            ("::ffff:127.0.0.1", "::ffff:127.0.0.1"),
            ("::ffff:7f00:1", "::ffff:127.0.0.1"),
            ("[::FFFF:7F00:0001]", "::ffff:127.0.0.1"),
            ("::127.0.0.1", "::127.0.0.1"),
            ("::7f00:1", "::127.0.0.1"),
            ("::0.0.0.1", "::1"),
            ("::ffff:0.0.0.0", "::ffff:0.0.0.0"),
            ("64:ff9b::169.254.169.254", "64:ff9b::a9fe:a9fe"),
            ("1:2:3:4:5:6:1.2.3.4", "1:2:3:4:5:6:102:304"),
        ])
    func ipv6Forms(_ text: String, _ canonical: String) throws {
        let address = try #require(IPAddress(numericHost: text))
        #expect(address.family == .v6)
        #expect(address.description == canonical)
    }

    @Test(
        "text that is not an IPv6 address",
        arguments: [
            ":", ":::", "1:::2", "1::2::3", ":1::", "1::2:", "1:2:3:4:5:6:7:8:9", "1:2:3:4:5:6:7",
            "1:2:3:4:5:6:7:8::", "::1:2:3:4:5:6:7:8", "12345::", "g::", "::1%eth0", "[::1%25eth0]",
            "[::1", "::1]", "[]", "[127.0.0.1]", "::ffff:127.0.0.01", "::ffff:127.1", "::ffff:256.0.0.1",
            "::1.2.3.4:1", "1:2:3:4:5:6:7:1.2.3.4", "::ffff:0x7f.0.0.1", "[v1.fe80::1]",
        ])
    func notIPv6(_ text: String) {
        #expect(IPAddress(numericHost: text) == nil)
    }

    @Test("bytes round-trip in network order")
    func bytes() throws {
        #expect(IPAddress.v4(0x7f00_0001).bytes == [127, 0, 0, 1])
        #expect(IPAddress.v4(10, 1, 2, 3) == ip("10.1.2.3"))
        #expect(IPAddress.v4(10, 1, 2, 3).ipv4Value == 0x0a01_0203)
        let v6 = ip("2001:db8::ff00:42:8329")
        #expect(v6.bytes == [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0xff, 0x00, 0x00, 0x42, 0x83, 0x29])
        #expect(IPAddress(bytes: v6.bytes) == v6)
        #expect(IPAddress(bytes: [1, 2, 3]) == nil)
        #expect(v6.ipv4Value == nil)
        #expect(v6.urlHost == "[2001:db8::ff00:42:8329]")
        #expect(ip("8.8.8.8").urlHost == "8.8.8.8")
    }

    @Test("embedded IPv4 is found in mapped, compatible, NAT64 and 6to4 forms only")
    func embedded() {
        #expect(ip("::ffff:10.1.2.3").embeddedIPv4 == ip("10.1.2.3"))
        #expect(ip("::10.1.2.3").embeddedIPv4 == ip("10.1.2.3"))
        #expect(ip("::").embeddedIPv4 == ip("0.0.0.0"))
        #expect(ip("64:ff9b::a9fe:a9fe").embeddedIPv4 == ip("169.254.169.254"))
        #expect(ip("2002:c0a8:101::1").embeddedIPv4 == ip("192.168.1.1"))
        #expect(ip("64:ff9b:1::a9fe:a9fe").embeddedIPv4 == nil)
        #expect(ip("2001:db8::a9fe:a9fe").embeddedIPv4 == nil)
        #expect(ip("10.1.2.3").embeddedIPv4 == nil)
    }

    /// Random strings over the numeric alphabet: wherever glibc's `inet_aton`
    /// (what `getaddrinfo` uses for numeric hosts) finds an address, we find the
    /// same one, and we accept nothing it refuses except one trailing dot.
    @Test("IPv4 parsing agrees with glibc inet_aton")
    func agreesWithInetAton() {
        var random = SplitMix64(seed: 0x5eed)
        let alphabet = Array("0123456789.xX.abcdefABCDEF0.1".utf8)
        var agreed = 0
        for _ in 0..<200_000 {
            let length = Int.random(in: 1...14, using: &random)
            let text = String(
                decoding: (0..<length).map { _ in alphabet.randomElement(using: &random)! }, as: UTF8.self)
            var raw = in_addr()
            let libc = inet_aton(text, &raw) != 0 ? UInt32(bigEndian: raw.s_addr) : nil
            let ours = IPAddress(numericHost: text)?.ipv4Value
            if let libc {
                #expect(ours == libc, "\(text)")
                agreed += 1
            } else if let ours {
                #expect(text.hasSuffix("."), "\(text) parsed as \(ours), inet_aton refuses it")
                var trimmed = in_addr()
                #expect(inet_aton(String(text.dropLast()), &trimmed) != 0 && UInt32(bigEndian: trimmed.s_addr) == ours)
            }
        }
        #expect(agreed > 1000)
    }

    /// Tokens assembled into near-IPv6 text: our parser accepts exactly what
    /// `inet_pton` accepts, with the same bytes, and prints what `inet_ntop` prints.
    @Test("IPv6 parsing and printing agree with glibc inet_pton / inet_ntop")
    func agreesWithInetPton() {
        var random = SplitMix64(seed: 0x1f6)
        let tokens = [
            "0", "1", "ffff", "FFFF", "db8", "2001", "00000", "12345", "g", ":", ":", "::", "::", "1.2.3.4",
            "127.0.0.1", "01.2.3.4", "0", "0", "a",
        ]
        var accepted = 0
        for _ in 0..<200_000 {
            let count = Int.random(in: 1...16, using: &random)
            let text = (0..<count).map { _ in tokens.randomElement(using: &random)! }.joined()
            var raw = in6_addr()
            let libc: [UInt8]? = inet_pton(AF_INET6, text, &raw) == 1 ? withUnsafeBytes(of: &raw) { Array($0) } : nil
            let ours = text.contains(":") ? IPAddress(numericHost: text) : nil
            #expect(ours?.bytes == libc, "\(text)")
            if let ours, libc != nil {
                accepted += 1
                #expect(ours.description == ntop(ours), "\(text)")
            }
        }
        #expect(accepted > 1000)
    }

    @Test("IPv6 text matches inet_ntop for random addresses with zero runs")
    func printsLikeInetNtop() {
        var random = SplitMix64(seed: 42)
        for _ in 0..<50_000 {
            let words: [UInt16] = (0..<8).map { _ in
                switch Int.random(in: 0..<4, using: &random) {
                case 0, 1: 0
                case 2: 0xffff
                default: UInt16.random(in: 0...0xffff, using: &random)
                }
            }
            let address = IPAddress(bytes: words.flatMap { [UInt8($0 >> 8), UInt8($0 & 0xff)] })!
            #expect(address.description == ntop(address))
            #expect(IPAddress(numericHost: address.description) == address)
        }
    }
}

private func ntop(_ address: IPAddress) -> String {
    var buffer = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
    let bytes = address.bytes
    let family = address.family == .v4 ? AF_INET : AF_INET6
    _ = bytes.withUnsafeBytes { inet_ntop(family, $0.baseAddress, &buffer, socklen_t(buffer.count)) }
    return String(decoding: buffer.prefix { $0 != 0 }.map(UInt8.init(bitPattern:)), as: UTF8.self)
}

@Suite("One answer's addresses: distinct, in order, capped")
struct DistinctAddressTests {
    @Test("duplicates go, order stays, and at most answerLimit are kept of a huge answer")
    func distinctAndCapped() {
        let base = (0..<40).map { IPAddress.v4(0x5DB8_D700 + UInt32($0)) }
        // 100,000 addresses: each of the 40 repeated, interleaved.
        let answer = (0..<100_000).map { base[($0 * 7) % 40] }
        let kept = IPAddress.distinct(answer)
        #expect(kept.count == IPAddress.answerLimit)
        #expect(Set(kept).count == kept.count)
        var expected: [IPAddress] = []
        for a in answer where !expected.contains(a) && expected.count < IPAddress.answerLimit { expected.append(a) }
        #expect(kept == expected)
        #expect(IPAddress.distinct([base[1], base[0], base[1]]) == [base[1], base[0]])
        #expect(IPAddress.distinct([]).isEmpty)
        #expect(IPAddress.distinct(base, limit: 3) == Array(base.prefix(3)))
    }
}
