import Foundation
import HeraldNet
import Testing
import WebPush

@Suite("EndpointGuard")
struct EndpointGuardTests {
    @Test("a hostname endpoint carries its parts, origin and vetted addresses")
    func checkedHostname() throws {
        let checked = try strictGuard.check("HTTPS://Push.Example.NET:443/wpush/v2/AbC?x=1")
        #expect(checked.url == "https://push.example.net/wpush/v2/AbC?x=1")
        #expect(checked.scheme == "https")
        #expect(checked.host == "push.example.net")
        #expect(checked.port == 443)
        #expect(checked.pathAndQuery == "/wpush/v2/AbC?x=1")
        #expect(checked.authority == "push.example.net")
        #expect(checked.origin == "https://push.example.net")
        #expect(checked.hostAddress == nil)
        #expect(checked.addresses == [ip("93.184.215.14")])
    }

    @Test("addresses keep resolver order without duplicates")
    func dedupedAddresses() throws {
        let checked = try strictGuard.check("https://dual.example.net/")
        #expect(checked.addresses == [ip("93.184.215.14"), ip("2606:2800:21f:cb07:6820:80da:af6b:8b2c")])
    }

    @Test("a huge answer keeps its first distinct addresses, every one vetted; what lies past them is never dialled")
    func hugeAnswer() throws {
        let public4 = (0..<50).map { IPAddress.v4(0x5DB8_D700 + UInt32($0)) }
        // 5,000 addresses, the 50 public ones over and over, a private one far past the limit.
        var late = (0..<5_000).map { public4[$0 % 50] }
        late[4_000] = ip("10.0.0.1")
        // The same, the private one among the first addresses.
        var early = late
        early[3] = ip("127.0.0.1")
        let resolver = StaticResolver(["late.example": late, "early.example": early])
        let guarded = EndpointGuard(allowPrivate: false, resolver: resolver)
        let checked = try guarded.check("https://late.example/push")
        #expect(checked.addresses == Array(public4.prefix(IPAddress.answerLimit)))
        #expect(!checked.addresses.contains(ip("10.0.0.1")))
        #expect(throws: EndpointError.notPubliclyRoutable(address: "127.0.0.1")) {
            try guarded.check("https://early.example/push")
        }
    }

    @Test("IP literals are canonicalised and checked without DNS")
    func literalsSkipResolver() throws {
        let noDNS = EndpointGuard(allowPrivate: false, resolver: UnreachableResolver())
        let v4 = try noDNS.check("https://0x08.0x08.0x08.0x08/p")
        #expect(v4.url == "https://8.8.8.8/p")
        #expect(v4.host == "8.8.8.8")
        #expect(v4.hostAddress == ip("8.8.8.8"))
        #expect(v4.addresses == [ip("8.8.8.8")])
        #expect(v4.origin == "https://8.8.8.8")

        let v6 = try noDNS.check("https://[2606:4700:0:0::1111]")
        #expect(v6.url == "https://[2606:4700::1111]/")
        #expect(v6.host == "2606:4700::1111")
        #expect(v6.authority == "[2606:4700::1111]")
        #expect(v6.origin == "https://[2606:4700::1111]")
        #expect(v6.pathAndQuery == "/")

        #expect(throws: EndpointError.notPubliclyRoutable(address: "127.0.0.1")) {
            try noDNS.check("https://0x7f.1/")
        }
    }

    @Test("one private address among public ones refuses the name (rebinding)")
    func rebinding() {
        #expect(throws: EndpointError.notPubliclyRoutable(address: "10.0.0.1")) {
            try strictGuard.check("https://rebind.example/push")
        }
    }

    @Test("resolver errors become unresolvable or resolutionFailed")
    func resolverErrors() {
        #expect(throws: EndpointError.unresolvable(host: "nx.example")) { try strictGuard.check("https://NX.example/") }
        #expect(throws: EndpointError.unresolvable(host: "empty.example")) {
            try strictGuard.check("https://empty.example/")
        }
        #expect(
            throws: EndpointError.resolutionFailed(
                host: "servfail.example", reason: "Temporary failure in name resolution")
        ) { try strictGuard.check("https://servfail.example/") }

        struct Odd: Error, CustomStringConvertible { var description: String { "odd" } }
        struct Throwing: HostResolver {
            func resolve(host: String, port: Int) throws -> [IPAddress] { throw Odd() }
        }
        let guarded = EndpointGuard(allowPrivate: false, resolver: Throwing())
        #expect(throws: EndpointError.resolutionFailed(host: "push.example.net", reason: "odd")) {
            try guarded.check("https://push.example.net/")
        }
    }

    @Test("allowPrivate accepts loopback on any port and still demands https")
    func allowPrivate() throws {
        let lenient = EndpointGuard(allowPrivate: true, resolver: testResolver)
        let checked = try lenient.check("https://127.0.0.1:8443/push")
        #expect(checked.url == "https://127.0.0.1:8443/push")
        #expect(checked.port == 8443)
        #expect(checked.origin == "https://127.0.0.1:8443")
        #expect(checked.addresses == [ip("127.0.0.1")])

        let local = try lenient.check("https://localhost:9443/")
        #expect(local.addresses == [ip("127.0.0.1"), ip("::1")])
        #expect(local.origin == "https://localhost:9443")
        #expect(try lenient.check("https://[::1]:8443/x").origin == "https://[::1]:8443")

        #expect(throws: EndpointError.malformed(reason: "must be an https URL")) {
            try lenient.check("http://127.0.0.1:8443/push")
        }
        #expect(throws: EndpointError.malformed(reason: "must not contain userinfo")) {
            try lenient.check("https://user@127.0.0.1:8443/push")
        }
        #expect(throws: EndpointError.malformed(reason: "port is not a valid port number")) {
            try lenient.check("https://127.0.0.1:65536/push")
        }
        #expect(throws: EndpointError.unresolvable(host: "nx.example")) { try lenient.check("https://nx.example/") }
    }

    @Test("the resolver is asked for the lowercase host and the port")
    func resolverArguments() throws {
        struct Expecting: HostResolver {
            func resolve(host: String, port: Int) throws -> [IPAddress] {
                #expect(host == "push.example.net")
                #expect(port == 443)
                return [ip("93.184.215.14")]
            }
        }
        _ = try EndpointGuard(allowPrivate: false, resolver: Expecting()).check("https://PUSH.example.net/")
    }

    @Test("length limit is 2048 bytes")
    func length() throws {
        let prefix = "https://push.example.net/"
        let exact = prefix + String(repeating: "a", count: 2048 - prefix.utf8.count)
        #expect(try strictGuard.check(exact).url == exact)
        #expect(throws: EndpointError.malformed(reason: "is longer than 2048 bytes")) {
            try strictGuard.check(exact + "a")
        }
        #expect(throws: EndpointError.malformed(reason: "is longer than 2048 bytes")) {
            try strictGuard.check("https://127.0.0.1/" + String(repeating: "x", count: 1 << 16))
        }
    }

    @Test("a long path with a query passes unchanged")
    func longPath() throws {
        let path = "/wpush/v2/" + String(repeating: "gAAAAABk-_Z9", count: 120) + "?ttl=60&topic=a%20b"
        let checked = try strictGuard.check("https://push.example.net" + path)
        #expect(checked.pathAndQuery == path)
        #expect(checked.url == "https://push.example.net" + path)
    }

    @Test("errors read as sentences")
    func descriptions() {
        #expect(EndpointError.malformed(reason: "port must be 443").description == "endpoint port must be 443")
        #expect(
            EndpointError.notPubliclyRoutable(address: "10.0.0.1").description
                == "endpoint address 10.0.0.1 is not publicly routable")
        #expect(
            EndpointError.unresolvable(host: "nx.example").description == "endpoint host nx.example does not resolve")
        #expect(EndpointError.unresolvable(host: "nx.example").reason == "host does not resolve")
        #expect(EndpointError.malformed(reason: "must be an https URL").reason == "must be an https URL")
        #expect(
            EndpointError.resolutionFailed(host: "a.example", reason: "timeout").description
                == "endpoint host a.example lookup failed: timeout")
    }

    @Test("StaticResolver matches names case-insensitively and knows no others")
    func staticResolver() throws {
        #expect(try testResolver.resolve(host: "PUSH.example.net", port: 443) == [ip("93.184.215.14")])
        #expect(throws: ResolverError.notFound(host: "other.example")) {
            try testResolver.resolve(host: "other.example", port: 443)
        }
    }
}

@Suite("CachingResolver")
struct CachingResolverTests {
    final class Counting: HostResolver, NonBlockingResolver, @unchecked Sendable {
        private let lock = NSLock()
        private var _calls = 0
        private var _answer: [IPAddress]
        init(_ answer: [IPAddress]) { _answer = answer }
        var calls: Int { lock.withLock { _calls } }
        var answer: [IPAddress] {
            get { lock.withLock { _answer } }
            set { lock.withLock { _answer = newValue } }
        }
        func resolve(host: String, port: Int) throws -> [IPAddress] {
            let answer = lock.withLock { () -> [IPAddress] in
                _calls += 1
                return _answer
            }
            if answer.isEmpty { throw ResolverError.notFound(host: host) }
            return answer
        }
        func lookup(
            host: String, port: Int, completion: @escaping @Sendable (Result<[IPAddress], ResolverError>) -> Void
        ) {
            completion(Result { try resolve(host: host, port: port) }.mapError { $0 as! ResolverError })
        }
    }

    @Test("an answer is reused within its TTL, a failure within its own, and the guard still vets what it returns")
    func reuse() throws {
        let base = Counting([IPAddress(numericHost: "93.184.216.34")!])
        let cache = CachingResolver(base, ttl: .milliseconds(200), negativeTTL: .milliseconds(200))
        let guardian = EndpointGuard(resolver: cache)
        for _ in 0..<50 { _ = try guardian.check("https://push.example.com/p/1") }
        #expect(base.calls == 1)
        #expect(cache.baseLookups == 1)
        _ = try guardian.check("https://PUSH.example.com/p/2")
        #expect(base.calls == 1, "names are matched case-insensitively")
        // The name moves to a private address: refused once the entry expires.
        base.answer = [IPAddress(numericHost: "10.0.0.7")!]
        Thread.sleep(forTimeInterval: 0.25)
        #expect(throws: EndpointError.self) { try guardian.check("https://push.example.com/p/1") }
        #expect(base.calls == 2)
        base.answer = []
        Thread.sleep(forTimeInterval: 0.25)
        #expect(throws: EndpointError.unresolvable(host: "push.example.com")) {
            try guardian.check("https://push.example.com/p/1")
        }
        #expect(throws: EndpointError.unresolvable(host: "push.example.com")) {
            try guardian.check("https://push.example.com/p/1")
        }
        #expect(base.calls == 3, "a failure is remembered")
        Thread.sleep(forTimeInterval: 0.25)
        #expect(throws: EndpointError.self) { try guardian.check("https://push.example.com/p/1") }
        #expect(base.calls == 4, "and asked again once its entry expires")
    }
}
