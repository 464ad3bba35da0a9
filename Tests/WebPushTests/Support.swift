import HeraldNet
import WebPush

/// The addresses test hostnames resolve to; nothing here touches the network.
let testResolver = StaticResolver(
    parsing: [
        "push.example.net": ["93.184.215.14"],
        "push.example.net.": ["93.184.215.14"],
        "fcm.googleapis.com": ["142.250.74.42", "2a00:1450:4001:82b::200a"],
        "updates.push.services.mozilla.com": ["34.117.237.239"],
        "web.push.apple.com": ["17.188.143.34"],
        "xn--bcher-kva.example": ["93.184.215.14"],
        "v6only.example": ["2606:4700::1111"],
        "dual.example.net": ["93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c", "93.184.215.14"],
        "nat64ok.example": ["64:ff9b::808:808"],
        "rebind.example": ["93.184.215.14", "10.0.0.1"],
        "internal.example": ["169.254.169.254"],
        "metadata.google.internal": ["169.254.169.254"],
        "v6private.example": ["2606:4700::1111", "fd00::1"],
        "nat64.example": ["64:ff9b::a9fe:a9fe"],
        "mapped.example": ["::ffff:192.168.1.1"],
        "sixtofour.example": ["2002:c0a8:101::1"],
        "teredo.example": ["2001:0:4136:e378:8000:63bf:3fff:fdd2"],
        "cgnat.example": ["100.100.100.100"],
        "localhost": ["127.0.0.1", "::1"],
        "localhost.": ["127.0.0.1", "::1"],
        "empty.example": [],
    ],
    failures: ["servfail.example": .failed(host: "servfail.example", reason: "Temporary failure in name resolution")]
)

let strictGuard = EndpointGuard(allowPrivate: false, resolver: testResolver)

/// A resolver that must not be asked: numeric hosts are checked without DNS.
struct UnreachableResolver: HostResolver {
    struct Asked: Error {}
    func resolve(host: String, port: Int) throws -> [IPAddress] {
        throw Asked()
    }
}

func ip(_ text: String) -> IPAddress {
    guard let address = IPAddress(numericHost: text) else { fatalError("bad test address \(text)") }
    return address
}
