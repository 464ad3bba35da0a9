import HeraldNet
import Testing
import WebPush

// Endpoint spellings and the guard's verdict, one per line:
//   <verdict> <endpoint> <detail>
// verdict: pass (detail: the normalised URL), private (detail: the address the
// error names), malformed (detail: the reason), unresolvable (detail: the host),
// failed (detail: the host). Hostnames resolve through `testResolver`.
// Spellings containing whitespace or control characters are in `unprintableCorpus`.
let ssrfCorpus = #"""
    # --- loopback, every numeric spelling
    private   https://127.0.0.1/                              127.0.0.1
    private   https://127.0.0.1:443/push                      127.0.0.1
    private   https://127.255.255.254/                        127.255.255.254
    private   https://2130706433/                             127.0.0.1
    private   https://0177.0.0.1/                             127.0.0.1
    private   https://0177.00.000.01/                         127.0.0.1
    private   https://127.000.000.001/                        127.0.0.1
    private   https://017700000001/                           127.0.0.1
    private   https://0x7f.0.0.1/                             127.0.0.1
    private   https://0x7F.0x0.0x0.0x1/                       127.0.0.1
    private   https://0x7f000001/                             127.0.0.1
    private   https://0X7F000001/                             127.0.0.1
    private   https://127.1/                                  127.0.0.1
    private   https://127.0.1/                                127.0.0.1
    private   https://0x7f.1/                                 127.0.0.1
    private   https://0177.0x0.1/                             127.0.0.1
    private   https://0x7f.0.0x00001/                         127.0.0.1
    private   https://127.0.0.1./                             127.0.0.1
    private   https://127.1./                                 127.0.0.1
    private   https://0x7f000001.:443/x                       127.0.0.1
    private   https://[::1]/                                  ::1
    private   https://[0:0:0:0:0:0:0:1]/                      ::1
    private   https://[0000:0000:0000:0000:0000:0000:0000:0001]/  ::1
    private   https://[::ffff:127.0.0.1]/                     ::ffff:127.0.0.1
    private   https://[::FFFF:7F00:1]/                        ::ffff:127.0.0.1
    private   https://[::127.0.0.1]/                          ::127.0.0.1
    private   https://[64:ff9b::127.0.0.1]/                   64:ff9b::7f00:1
    private   https://[2002:7f00:1::1]/                       2002:7f00:1::1
    private   https://localhost/                              127.0.0.1
    private   https://LOCALHOST./push                         127.0.0.1
    # --- "this network", private, link-local, cloud metadata
    private   https://0.0.0.0/                                0.0.0.0
    private   https://0/                                      0.0.0.0
    private   https://0x0/                                    0.0.0.0
    private   https://[::]/                                   ::
    private   https://10.0.0.1/                               10.0.0.1
    private   https://012.1/                                  10.0.0.1
    private   https://167772161/                              10.0.0.1
    private   https://172.16.0.1/                             172.16.0.1
    private   https://172.31.255.255/                         172.31.255.255
    private   https://192.168.1.1/                            192.168.1.1
    private   https://3232235777/                             192.168.1.1
    private   https://169.254.169.254/latest/meta-data/       169.254.169.254
    private   https://0xa9fea9fe/                             169.254.169.254
    private   https://0251.0376.0251.0376/                    169.254.169.254
    private   https://169.254.43518/                          169.254.169.254
    private   https://[::ffff:169.254.169.254]/               ::ffff:169.254.169.254
    private   https://[::ffff:a9fe:a9fe]/                     ::ffff:169.254.169.254
    private   https://[64:ff9b::a9fe:a9fe]/                   64:ff9b::a9fe:a9fe
    private   https://[2002:a9fe:a9fe::1]/                    2002:a9fe:a9fe::1
    private   https://[2002:c0a8:101::1]/                     2002:c0a8:101::1
    private   https://[::ffff:10.0.0.1]/                      ::ffff:10.0.0.1
    # --- CGNAT, multicast, reserved, broadcast, documentation, benchmarking
    private   https://100.64.0.1/                             100.64.0.1
    private   https://100.100.100.100/                        100.100.100.100
    private   https://100.127.255.255/                        100.127.255.255
    private   https://224.0.0.1/                              224.0.0.1
    private   https://239.255.255.250/                        239.255.255.250
    private   https://240.0.0.1/                              240.0.0.1
    private   https://255.255.255.255/                        255.255.255.255
    private   https://4294967295/                             255.255.255.255
    private   https://192.0.0.8/                              192.0.0.8
    private   https://192.0.2.1/                              192.0.2.1
    private   https://198.51.100.1/                           198.51.100.1
    private   https://203.0.113.1/                            203.0.113.1
    private   https://198.18.0.1/                             198.18.0.1
    private   https://198.19.255.255/                         198.19.255.255
    private   https://192.88.99.1/                            192.88.99.1
    # --- IPv6 special ranges
    private   https://[fe80::1]/                              fe80::1
    private   https://[FE80::1]/                              fe80::1
    private   https://[fc00::1]/                              fc00::1
    private   https://[fd12::1]/                              fd12::1
    private   https://[fec0::1]/                              fec0::1
    private   https://[ff02::1]/                              ff02::1
    private   https://[2001:db8::1]/                          2001:db8::1
    private   https://[2001::1]/                              2001::1
    private   https://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/  2001:0:4136:e378:8000:63bf:3fff:fdd2
    private   https://[2001:2::1]/                            2001:2::1
    private   https://[2001:10::1]/                           2001:10::1
    private   https://[2001:20::1]/                           2001:20::1
    private   https://[100::1]/                               100::1
    private   https://[64:ff9b:1::808:808]/                   64:ff9b:1::808:808
    private   https://[3fff::1]/                              3fff::1
    private   https://[5f00::1]/                              5f00::1
    private   https://[::ffff:0:127.0.0.1]/                   ::ffff:0:7f00:1
    # --- names that resolve inward (DNS rebinding: one bad address is enough)
    private   https://rebind.example/                         10.0.0.1
    private   https://internal.example/                       169.254.169.254
    private   https://metadata.google.internal/computeMetadata/v1/  169.254.169.254
    private   https://v6private.example/                      fd00::1
    private   https://nat64.example/                          64:ff9b::a9fe:a9fe
    private   https://mapped.example/                         ::ffff:192.168.1.1
    private   https://sixtofour.example/                      2002:c0a8:101::1
    private   https://teredo.example/                         2001:0:4136:e378:8000:63bf:3fff:fdd2
    private   https://cgnat.example/                          100.100.100.100
    # --- scheme
    malformed http://push.example.net/                        must be an https URL
    malformed HTTP://push.example.net/                        must be an https URL
    malformed ftp://push.example.net/                         must be an https URL
    malformed wss://push.example.net/                         must be an https URL
    malformed httpss://push.example.net/                      must be an https URL
    malformed //push.example.net/                             must be an https URL
    malformed push.example.net/                               must be an https URL
    malformed https:/push.example.net/                        must be an https URL
    malformed https:push.example.net/                         must be an https URL
    malformed https:\\127.0.0.1/                              must be an https URL
    malformed javascript:alert(1)//https://push.example.net/  must be an https URL
    # --- userinfo
    malformed https://user@push.example.net/x                 must not contain userinfo
    malformed https://push.example.net@127.0.0.1/             must not contain userinfo
    malformed https://user:pass@push.example.net/             must not contain userinfo
    malformed https://@push.example.net/                      must not contain userinfo
    malformed https://push.example.net:443@127.0.0.1/         must not contain userinfo
    malformed https://push.example.net%40127.0.0.1/           host must not contain percent-encoding
    # --- port
    malformed https://push.example.net:8443/                  port must be 443
    malformed https://push.example.net:80/                    port must be 443
    malformed https://127.0.0.1:8443/                         port must be 443
    malformed https://[::1]:9200/                             port must be 443
    malformed https://push.example.net:0443/                  port is not a valid port number
    malformed https://push.example.net:0/                     port is not a valid port number
    malformed https://push.example.net:99999/                 port is not a valid port number
    malformed https://push.example.net:443a/                  port is not a valid port number
    malformed https://push.example.net:443:443/               port is not a valid port number
    malformed https://push.example.net:+443/                  port is not a valid port number
    # --- fragment
    malformed https://push.example.net/x#frag                 must not have a fragment
    malformed https://push.example.net#@127.0.0.1/            must not have a fragment
    malformed https://127.0.0.1#.push.example.net/            must not have a fragment
    malformed https://push.example.net/#                      must not have a fragment
    # --- percent-encoding and backslashes
    malformed https://127.0.0.1%2e/                           host must not contain percent-encoding
    malformed https://push%2eexample.net/                     host must not contain percent-encoding
    malformed https://%31%32%37.0.0.1/                        host must not contain percent-encoding
    malformed https://%6c%6f%63%61%6c%68%6f%73%74/            host must not contain percent-encoding
    malformed https://push.example.net\@127.0.0.1/            must not contain backslashes
    malformed https://127.0.0.1\.push.example.net/            must not contain backslashes
    malformed https://push.example.net\x                      must not contain backslashes
    malformed https://push.example.net/a\..\b                 must not contain backslashes
    # --- IPv6 literal syntax and zone ids
    malformed https://[::1%25eth0]/                           host must not contain an IPv6 zone id
    malformed https://[fe80::1%25lo]:443/                     host must not contain an IPv6 zone id
    malformed https://[fe80::1%eth0]/                         host must not contain an IPv6 zone id
    malformed https://[::1/                                   host is not a valid IPv6 address
    malformed https://[::1]x/                                 host is not a valid IPv6 address
    malformed https://[::1]]/                                 host is not a valid IPv6 address
    malformed https://[v1.fe80::1]/                           host is not a valid IPv6 address
    malformed https://[127.0.0.1]/                            host is not a valid IPv6 address
    malformed https://[1:2:3:4:5:6:7:8:9]/                    host is not a valid IPv6 address
    malformed https://[1::2::3]/                              host is not a valid IPv6 address
    malformed https://[::ffff:127.0.0.01]/                    host is not a valid IPv6 address
    malformed https://[::ffff:0x7f.1]/                        host is not a valid IPv6 address
    malformed https://[]/                                     host is not a valid IPv6 address
    malformed https://::1/                                    host is required
    malformed https://push.example.net]/                      host is not a valid hostname
    # --- host syntax
    malformed https:///push                                   host is required
    malformed https://                                        host is required
    malformed https://?x=1                                    host is required
    malformed https://:443/                                   host is required
    malformed https://256.0.0.1/                              host is not a valid IPv4 address
    malformed https://127.0.0.1.1/                            host is not a valid IPv4 address
    malformed https://08.0.0.1/                               host is not a valid IPv4 address
    malformed https://0x/                                     host is not a valid IPv4 address
    malformed https://0x7g.0.0.1/                             host is not a valid IPv4 address
    malformed https://4294967296/                             host is not a valid IPv4 address
    malformed https://127.16777216/                           host is not a valid IPv4 address
    malformed https://localhost.127/                          host is not a valid IPv4 address
    malformed https://push.example.123/                       host is not a valid IPv4 address
    malformed https://1.2.3.4../                              host is not a valid hostname
    malformed https://push_service.example.net/               host is not a valid hostname
    malformed https://-push.example.net/                      host is not a valid hostname
    malformed https://push-.example.net/                      host is not a valid hostname
    malformed https://push..example.net/                      host is not a valid hostname
    malformed https://.push.example.net/                      host is not a valid hostname
    malformed https://push.example.net../                     host is not a valid hostname
    malformed https://push.exa$mple.net/                      host is not a valid hostname
    malformed https://push.example.net;.evil/                 host is not a valid hostname
    malformed https://bücher.example/                         must be ASCII (punycode the host, percent-encode the path)
    malformed https://１２７.0.0.1/                            must be ASCII (punycode the host, percent-encode the path)
    malformed https://127。0。0。1/                             must be ASCII (punycode the host, percent-encode the path)
    # --- path and query
    malformed https://push.example.net/<script>               path contains a character not allowed in a URL
    malformed https://push.example.net/a|b                    path contains a character not allowed in a URL
    malformed https://push.example.net/a"b                    path contains a character not allowed in a URL
    malformed https://push.example.net/{x}                    path contains a character not allowed in a URL
    malformed https://push.example.net/a%zz                   path contains a malformed percent-encoding
    malformed https://push.example.net/a%2                    path contains a malformed percent-encoding
    # --- names that do not resolve
    unresolvable https://nx.example/                          nx.example
    unresolvable https://empty.example/                       empty.example
    unresolvable https://Push.Example.ORG/                    push.example.org
    failed    https://servfail.example/                       servfail.example
    # --- endpoints that pass
    pass      https://push.example.net/send/abc               https://push.example.net/send/abc
    pass      https://push.example.net                        https://push.example.net/
    pass      https://push.example.net:443/x                  https://push.example.net/x
    pass      https://push.example.net:/x                     https://push.example.net/x
    pass      HTTPS://PUSH.Example.NET/AbC?Q=1                https://push.example.net/AbC?Q=1
    pass      https://push.example.net?x=1                    https://push.example.net/?x=1
    pass      https://push.example.net./x                     https://push.example.net/x
    pass      https://PUSH.example.net.:443/x                 https://push.example.net/x
    pass      https://push.example.net/a@b:c;d=e,f+g!h$i&j'k(l)m*n~o.p_q-r%20s?t=/u?v  https://push.example.net/a@b:c;d=e,f+g!h$i&j'k(l)m*n~o.p_q-r%20s?t=/u?v
    pass      https://fcm.googleapis.com/fcm/send/dGVzdA:APA91bHun4MxP5egoKMwt2KZFBaFUH-1RYqx  https://fcm.googleapis.com/fcm/send/dGVzdA:APA91bHun4MxP5egoKMwt2KZFBaFUH-1RYqx
    pass      https://updates.push.services.mozilla.com/wpush/v2/gAAAAABkZ_x-Yq  https://updates.push.services.mozilla.com/wpush/v2/gAAAAABkZ_x-Yq
    pass      https://web.push.apple.com/QGuQyavXutnMH-4T1Mhc  https://web.push.apple.com/QGuQyavXutnMH-4T1Mhc
    pass      https://xn--bcher-kva.example/push              https://xn--bcher-kva.example/push
    pass      https://v6only.example/                         https://v6only.example/
    pass      https://dual.example.net/                       https://dual.example.net/
    pass      https://nat64ok.example/                        https://nat64ok.example/
    pass      https://8.8.8.8/                                https://8.8.8.8/
    pass      https://8.8.8.8:443/push                        https://8.8.8.8/push
    pass      https://0x08080808/                             https://8.8.8.8/
    pass      https://134744072/                              https://8.8.8.8/
    pass      https://010.010.010.010/                        https://8.8.8.8/
    pass      https://8.8.8.8./                               https://8.8.8.8/
    pass      https://[2606:4700::1111]/                      https://[2606:4700::1111]/
    pass      https://[2606:4700:0000:0000:0000:0000:0000:1111]/  https://[2606:4700::1111]/
    pass      https://[2001:4860:4860::8888]:443/dns          https://[2001:4860:4860::8888]/dns
    pass      https://[::ffff:8.8.8.8]/                       https://[::ffff:8.8.8.8]/
    pass      https://[64:ff9b::8.8.8.8]/                     https://[64:ff9b::808:808]/
    pass      https://[2002:808:808::1]/                      https://[2002:808:808::1]/
    """#

/// Spellings that cannot sit on a whitespace-separated line.
let unprintableCorpus: [(endpoint: String, reason: String)] = [
    (" https://push.example.net/", "must not contain whitespace or control characters"),
    ("https://push.example.net/ ", "must not contain whitespace or control characters"),
    ("https://push.example.net/a b", "must not contain whitespace or control characters"),
    ("https:// push.example.net/", "must not contain whitespace or control characters"),
    ("https://push.example.net\t/", "must not contain whitespace or control characters"),
    ("https://push.example.net\n.127.0.0.1/", "must not contain whitespace or control characters"),
    ("https://127.0.0.1\r\n/", "must not contain whitespace or control characters"),
    ("https://127.0.0.1\u{0}.push.example.net/", "must not contain whitespace or control characters"),
    ("https://push.example.net/\u{7f}", "must not contain whitespace or control characters"),
    ("https://push.example.net/\u{0b}", "must not contain whitespace or control characters"),
    ("https://push.example.net/\u{a0}", "must be ASCII (punycode the host, percent-encode the path)"),
    ("https://push.example.net\u{3000}/", "must be ASCII (punycode the host, percent-encode the path)"),
    ("https://push.example.net\u{200b}/", "must be ASCII (punycode the host, percent-encode the path)"),
]

struct CorpusEntry: CustomTestStringConvertible, Sendable {
    let line: Int
    let verdict: String
    let endpoint: String
    let detail: String
    var testDescription: String { "line \(line): \(verdict) \(endpoint)" }
}

let corpusEntries: [CorpusEntry] = ssrfCorpus.split(separator: "\n", omittingEmptySubsequences: false)
    .enumerated()
    .compactMap { number, line in
        guard !line.isEmpty, !line.hasPrefix("#") else { return nil }
        let fields = line.split(separator: " ")
        guard fields.count >= 3 else { fatalError("corpus line \(number + 1) is malformed: \(line)") }
        return CorpusEntry(
            line: number + 1, verdict: String(fields[0]), endpoint: String(fields[1]),
            detail: fields[2...].joined(separator: " "))
    }

@Suite("SSRF corpus")
struct SSRFCorpusTests {
    @Test("corpus is large enough")
    func corpusSize() {
        let refused = corpusEntries.filter { $0.verdict != "pass" }.count + unprintableCorpus.count
        let passed = corpusEntries.filter { $0.verdict == "pass" }.count
        #expect(refused >= 40)
        #expect(passed >= 5)
    }

    @Test("each spelling gets its verdict", arguments: corpusEntries)
    func verdict(_ entry: CorpusEntry) {
        let expected: EndpointError? =
            switch entry.verdict {
            case "pass": nil
            case "private": .notPubliclyRoutable(address: entry.detail)
            case "malformed": .malformed(reason: entry.detail)
            case "unresolvable": .unresolvable(host: entry.detail)
            case "failed": .resolutionFailed(host: entry.detail, reason: "Temporary failure in name resolution")
            default: fatalError("unknown verdict \(entry.verdict)")
            }
        do {
            let checked = try strictGuard.check(entry.endpoint)
            #expect(expected == nil, "accepted, expected \(expected.map(String.init(describing:)) ?? "")")
            #expect(checked.url == entry.detail)
            #expect(checked.addresses.allSatisfy { $0.isPubliclyRoutable })
            #expect(!checked.addresses.isEmpty)
        } catch {
            #expect(error == expected)
        }
    }

    @Test("unprintable spellings are refused", arguments: unprintableCorpus.map { $0.endpoint })
    func unprintable(_ endpoint: String) {
        let reason = unprintableCorpus.first { $0.endpoint == endpoint }!.reason
        #expect(throws: EndpointError.malformed(reason: reason)) { try strictGuard.check(endpoint) }
    }

    @Test("private spellings stay refused whatever the path and query")
    func privateSpellingsRefusedRegardlessOfPath() {
        for entry in corpusEntries where entry.verdict == "private" {
            let endpoint = entry.endpoint + (entry.endpoint.hasSuffix("/") ? "" : "/") + "push?x=1"
            #expect(throws: EndpointError.notPubliclyRoutable(address: entry.detail)) {
                try strictGuard.check(endpoint)
            }
        }
    }
}
