import Testing
import HeraldNet

@Suite("isPubliclyRoutable")
struct RoutabilityTests {
    @Test(
        "refused IPv4 ranges, at both ends",
        arguments: [
            "0.0.0.0", "0.255.255.255", "10.0.0.0", "10.255.255.255", "100.64.0.0", "100.127.255.255",
            "127.0.0.1", "127.255.255.255", "169.254.0.0", "169.254.255.255", "172.16.0.0",
            "172.31.255.255", "192.0.0.0", "192.0.0.255", "192.0.2.0", "192.0.2.255", "192.88.99.0",
            "192.88.99.255", "192.168.0.0", "192.168.255.255", "198.18.0.0", "198.19.255.255",
            "198.51.100.0", "198.51.100.255", "203.0.113.0", "203.0.113.255", "224.0.0.0",
            "239.255.255.255", "240.0.0.0", "255.255.255.254", "255.255.255.255",
        ])
    func refusedIPv4(_ text: String) {
        #expect(!ip(text).isPubliclyRoutable)
    }

    @Test(
        "public IPv4 just outside the refused ranges",
        arguments: [
            "1.0.0.0", "1.1.1.1", "8.8.8.8", "9.255.255.255", "11.0.0.0", "100.63.255.255", "100.128.0.0",
            "126.255.255.255", "128.0.0.0", "169.253.255.255", "169.255.0.0", "172.15.255.255",
            "172.32.0.0", "191.255.255.255", "192.0.1.0", "192.0.3.0", "192.88.98.255", "192.88.100.0",
            "192.167.255.255", "192.169.0.0", "198.17.255.255", "198.20.0.0", "198.51.99.255",
            "198.51.101.0", "203.0.112.255", "203.0.114.0", "223.255.255.255", "93.184.215.14",
        ])
    func publicIPv4(_ text: String) {
        #expect(ip(text).isPubliclyRoutable)
    }

    @Test(
        "refused IPv6 ranges and embedded forms",
        arguments: [
            "::", "::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "::ffff:0.0.0.0", "::ffff:255.255.255.255",
            "::127.0.0.1", "::169.254.169.254", "::ffff:0:7f00:1", "1::", "ff:ffff::", "64:ff9b::7f00:1",
            "64:ff9b::a9fe:a9fe", "64:ff9b::c0a8:101", "64:ff9b:1::", "64:ff9b:1:ffff:ffff:ffff:ffff:ffff",
            "64:ff9b:1::808:808", "100::", "100::ffff:ffff:ffff:ffff", "2001::", "2001::1",
            "2001:0:ffff:ffff:ffff:ffff:ffff:ffff", "2001:2::1", "2001:10::1", "2001:1f:ffff::",
            "2001:20::1", "2001:2f:ffff::", "2001:db8::", "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff",
            "2002:7f00:1::1", "2002:c0a8:101::1", "2002:a9fe:a9fe::", "2002:a00:1::", "2002::",
            "3fff::", "3fff:fff:ffff::", "5f00::", "5f00:ffff::1", "fc00::", "fd12:3456::1",
            "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "fe80::", "fe80::1", "febf:ffff::",
            "fec0::", "feff:ffff::", "ff00::", "ff02::1", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        ])
    func refusedIPv6(_ text: String) {
        #expect(!ip(text).isPubliclyRoutable)
    }

    @Test(
        "public IPv6, including embedded forms of public IPv4",
        arguments: [
            "2606:4700::1111", "2001:4860:4860::8888", "2a00:1450:4001:82b::200a", "2000::1",
            "2001:1::1", "2001:3::1", "2001:4:112::1", "2001:30::1", "2001:db9::1", "2003::1",
            "3ffe::1", "3fff:1000::1", "5f01::1", "fbff::1", "::ffff:8.8.8.8", "::8.8.8.8",
            "64:ff9b::808:808", "64:ff9b::1.1.1.1", "2002:808:808::1", "2002:5db8:d70e::",
            "101::1", "100:0:0:1::",
        ])
    func publicIPv6(_ text: String) {
        #expect(ip(text).isPubliclyRoutable)
    }
}
