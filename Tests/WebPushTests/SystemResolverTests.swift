import HeraldNet
import Testing
import WebPush

/// These use only names the C library answers locally (/etc/hosts, literals).
@Suite("SystemResolver")
struct SystemResolverTests {
    @Test("localhost resolves to loopback, which the guard refuses")
    func localhost() throws {
        let addresses = try SystemResolver().resolve(host: "localhost", port: 443)
        #expect(!addresses.isEmpty)
        for address in addresses {
            let loopback = address.family == .v4 ? address.bytes[0] == 127 : address == ip("::1")
            #expect(loopback, "\(address)")
            #expect(!address.isPubliclyRoutable)
        }
        let guarded = EndpointGuard(allowPrivate: false, resolver: SystemResolver())
        #expect {
            try guarded.check("https://localhost/push")
        } throws: { error in
            guard case .notPubliclyRoutable(let address) = error as? EndpointError else { return false }
            return addresses.map(\.description).contains(address)
        }
    }

    @Test("numeric hosts come back as themselves")
    func numeric() throws {
        #expect(try SystemResolver().resolve(host: "127.0.0.1", port: 443) == [ip("127.0.0.1")])
        #expect(try SystemResolver().resolve(host: "::1", port: 443) == [ip("::1")])
    }

    @Test("a name with a NUL byte is refused before the C library sees it")
    func nul() {
        #expect(throws: ResolverError.notFound(host: "localhost\u{0}.example")) {
            try SystemResolver().resolve(host: "localhost\u{0}.example", port: 443)
        }
    }
}
