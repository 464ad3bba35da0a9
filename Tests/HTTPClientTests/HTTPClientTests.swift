import Foundation
import HTTPClient
import HeraldTestSupport
import Testing

private func webPushRequest(_ url: String, pinned: [String]? = nil, timeout: Duration = .seconds(15)) -> HTTPRequest {
    HTTPRequest(
        url: url,
        headers: [("TTL", "60"), ("Content-Encoding", "aes128gcm"), ("Content-Type", "application/octet-stream")],
        body: Array("not really encrypted".utf8),
        timeout: timeout,
        pinnedAddresses: pinned)
}

@Suite("HTTPClient", .serialized)
struct HTTPClientTests {
    @Test("HTTP/2 with the test CA: status, headers and body")
    func http2WithCA() async throws {
        try await withGateways { g in
            let client = try HTTPClient(configuration: .init(caFile: g.ca))
            defer { client.shutdown() }
            let r = try await client.send(webPushRequest("https://localhost:\(g.webpush)/push/unknown-sub")).get()
            #expect(r.status == 404)
            #expect(r.httpVersion == "2")
            #expect(r.header("Content-Type") == "application/json; charset=utf-8")
            #expect(r.headers.allSatisfy { $0.name == $0.name.lowercased() })
            let body = String(decoding: r.body, as: UTF8.self)
            #expect(body.contains("unknown subscription"))
            #expect(r.header("content-length") == String(r.body.count))
            #expect(isLoopback(r.primaryIP))

            // A bad request (no TTL) on the same client: 400, also over h2.
            let bad = try await client.send(HTTPRequest(url: "https://127.0.0.1:\(g.webpush)/push/x", body: [1, 2, 3]))
                .get()
            #expect(bad.status == 400 || bad.status == 404)
            #expect(bad.httpVersion == "2")
            #expect(bad.primaryIP == "127.0.0.1")
        }
    }

    @Test("Without the test CA the certificate does not verify: TLS error")
    func tlsFailureWithoutCA() async throws {
        try await withGateways { g in
            let client = try HTTPClient()
            defer { client.shutdown() }
            let r = await client.send(webPushRequest("https://localhost:\(g.webpush)/push/x"))
            guard case .tls = r.failure else {
                Issue.record("expected a TLS error, got \(r)")
                return
            }
        }
    }

    @Test("A 302 is returned as 302, not followed")
    func redirectNotFollowed() async throws {
        try await withPlainServer { s in
            let client = try HTTPClient(configuration: .init(allowPlainHTTPToLoopback: true))
            defer { client.shutdown() }
            let r = try await client.send(HTTPRequest(method: "GET", url: "http://127.0.0.1:\(s.port)/redirect")).get()
            #expect(r.status == 302)
            #expect(r.header("location") == "http://127.0.0.1:\(s.port)/target")
            #expect(r.body.isEmpty)
            #expect(r.httpVersion == "1.1")

            let ok = try await client.send(
                HTTPRequest(url: "http://localhost:\(s.port)/target", body: Array("hi".utf8))
            ).get()
            #expect(ok.status == 200)
            #expect(ok.header("x-test") == "Yes")
            #expect(String(decoding: ok.body, as: UTF8.self) == "target")
            #expect(ok.primaryIP == "127.0.0.1")
        }
    }

    @Test("Pinning: localhost pinned to 127.0.0.1 goes there; a wrong pin is used too, even with a connection open")
    func pinningLocalhost() async throws {
        try await withGateways { g in
            let client = try HTTPClient(configuration: .init(caFile: g.ca))
            defer { client.shutdown() }
            let r = try await client.send(
                webPushRequest("https://localhost:\(g.webpush)/push/x", pinned: ["127.0.0.1"])
            ).get()
            #expect(r.status == 404)
            #expect(r.primaryIP == "127.0.0.1")
            #expect(r.httpVersion == "2")

            // The gateway listens on 127.0.0.1 only: a pin to 127.0.0.2 must be honoured (→ refused),
            // proving neither the resolver's answer nor the open connection to 127.0.0.1 is used.
            let wrong = await client.send(
                webPushRequest("https://localhost:\(g.webpush)/push/x", pinned: ["127.0.0.2"], timeout: .seconds(5)))
            guard case .connectFailed = wrong.failure else {
                Issue.record("expected a connect failure, got \(wrong)")
                return
            }
            let again = try await client.send(
                webPushRequest("https://localhost:\(g.webpush)/push/x", pinned: ["127.0.0.1"])
            ).get()
            #expect(again.primaryIP == "127.0.0.1")
        }
    }

    @Test("Pinning bypasses the resolver; the certificate host check still uses the name")
    func pinningUnresolvableName() async throws {
        try await withGateways { g in
            let client = try HTTPClient(configuration: .init(caFile: g.ca))
            defer { client.shutdown() }
            let url = "https://herald-test.invalid:\(g.webpush)/push/x"
            // Without a pin the name does not resolve.
            let unpinned = await client.send(webPushRequest(url))
            guard case .dnsFailure = unpinned.failure else {
                Issue.record("expected a DNS failure, got \(unpinned)")
                return
            }
            // With a pin the connection reaches 127.0.0.1 and the TLS handshake happens, but the
            // certificate (localhost, 127.0.0.1, ::1) does not cover herald-test.invalid.
            let pinned = await client.send(webPushRequest(url, pinned: ["127.0.0.1"]))
            guard case .tls(let message) = pinned.failure else {
                Issue.record("expected a TLS host name failure, got \(pinned)")
                return
            }
            #expect(message.contains("herald-test.invalid"))
        }
    }

    @Test("A hung endpoint ends in a timeout error within the timeout")
    func timeout() async throws {
        try await withPlainServer { s in
            let client = try HTTPClient(configuration: .init(allowPlainHTTPToLoopback: true))
            defer { client.shutdown() }
            let start = ContinuousClock.now
            let r = await client.send(HTTPRequest(url: "http://127.0.0.1:\(s.port)/hang", timeout: .seconds(1)))
            let elapsed = ContinuousClock.now - start
            guard case .timeout = r.failure else {
                Issue.record("expected a timeout, got \(r)")
                return
            }
            // The timeout is honoured, not cut short (no upper bound: machines are shared).
            #expect(elapsed >= .milliseconds(900))
        }
    }

    @Test("An HTTP/2 connection that goes silent is not used again after a timeout")
    func silentHTTP2Connection() async throws {
        try await withGateways { g in
            let proxy = try BlackHoleProxy(targetPort: g.webpush)
            defer { proxy.stop() }
            let client = try HTTPClient(configuration: .init(caFile: g.ca))
            defer { client.shutdown() }
            let url = "https://localhost:\(proxy.port)/push/unknown-sub"
            let first = try await client.send(webPushRequest(url, pinned: ["127.0.0.1"])).get()
            #expect(first.status == 404 && first.httpVersion == "2")
            proxy.silence()
            let lost = await client.send(webPushRequest(url, pinned: ["127.0.0.1"], timeout: .seconds(1)))
            guard case .timeout = lost.failure else {
                Issue.record("expected a timeout on the silent connection, got \(lost)")
                return
            }
            // The next request goes out on a new connection and is answered.
            let next = await client.send(webPushRequest(url, pinned: ["127.0.0.1"], timeout: .seconds(5)))
            #expect((try? next.get())?.status == 404, "\(next)")
            #expect(proxy.links.count == 2)
        }
    }

    @Test("200 concurrent requests are multiplexed over few HTTP/2 connections")
    func concurrentMultiplexed() async throws {
        try await withGateways { g in
            let client = try HTTPClient(
                configuration: .init(caFile: g.ca, maxConnectionsPerHost: 2, allowPlainHTTPToLoopback: true))
            defer { client.shutdown() }
            let results = await withTaskGroup(of: Result<HTTPResponse, HTTPError>.self) { group in
                for i in 0..<200 {
                    group.addTask {
                        await client.send(webPushRequest("https://localhost:\(g.webpush)/push/sub-\(i)"))
                    }
                }
                var all: [Result<HTTPResponse, HTTPError>] = []
                for await r in group { all.append(r) }
                return all
            }
            #expect(results.count == 200)
            let responses = results.compactMap { try? $0.get() }
            #expect(responses.count == 200, "failures: \(results.compactMap(\.failure).prefix(3))")
            #expect(responses.allSatisfy { $0.status == 404 && $0.httpVersion == "2" && isLoopback($0.primaryIP) })

            // Ask the gateway how many connections carried them.
            let ctl = try await client.send(
                HTTPRequest(method: "GET", url: "http://127.0.0.1:\(g.control)/control/connections?gateway=webpush")
            ).get()
            #expect(ctl.status == 200)
            let obj = try JSONSerialization.jsonObject(with: Data(ctl.body)) as? [String: Any]
            let conns = obj?["connections"] as? [[String: Any]] ?? []
            let total = conns.reduce(0) { $0 + (($1["requests"] as? Int) ?? 0) }
            #expect(total == 200)
            #expect(conns.count >= 1 && conns.count <= 2, "connections: \(conns.count)")
            #expect(conns.allSatisfy { ($0["alpn"] as? String) == "h2" })
        }
    }

    @Test("Response bodies over the cap fail with bodyTooLarge")
    func bodyCap() async throws {
        try await withPlainServer { s in
            let client = try HTTPClient(
                configuration: .init(maxResponseBodyBytes: 64 * 1024, allowPlainHTTPToLoopback: true))
            defer { client.shutdown() }
            let r = await client.send(HTTPRequest(method: "GET", url: "http://127.0.0.1:\(s.port)/big"))
            #expect(r.failure == .bodyTooLarge(limit: 64 * 1024))
        }
    }

    @Test("No request leaves loopback: plain http is refused for other hosts and addresses")
    func loopbackOnlyForPlainHTTP() async throws {
        let strict = try HTTPClient()
        defer { strict.shutdown() }
        let noFlag = await strict.send(HTTPRequest(url: "http://127.0.0.1:9/"))
        guard case .invalidRequest = noFlag.failure else {
            Issue.record("got \(noFlag)")
            return
        }

        let client = try HTTPClient(configuration: .init(allowPlainHTTPToLoopback: true))
        defer { client.shutdown() }
        for url in [
            "http://example.com/", "http://10.0.0.1/", "http://[2001:db8::1]/", "ftp://127.0.0.1/",
            "file:///etc/passwd",
        ] {
            let r = await client.send(HTTPRequest(url: url))
            guard case .invalidRequest = r.failure else {
                Issue.record("\(url): got \(r)")
                continue
            }
        }
        let pinnedAway = await client.send(HTTPRequest(url: "http://localhost:9/", pinnedAddresses: ["192.0.2.1"]))
        guard case .invalidRequest = pinnedAway.failure else {
            Issue.record("got \(pinnedAway)")
            return
        }
        let notLiteral = await client.send(HTTPRequest(url: "https://localhost:9/", pinnedAddresses: ["example.com"]))
        guard case .invalidRequest = notLiteral.failure else {
            Issue.record("got \(notLiteral)")
            return
        }
        let literalMismatch = await client.send(
            HTTPRequest(url: "https://127.0.0.1:9/", pinnedAddresses: ["192.0.2.1"]))
        guard case .invalidRequest = literalMismatch.failure else {
            Issue.record("got \(literalMismatch)")
            return
        }
        let headerInjection = await client.send(
            HTTPRequest(url: "https://localhost:9/", headers: [("X", "a\r\nEvil: 1")]))
        guard case .invalidRequest = headerInjection.failure else {
            Issue.record("got \(headerInjection)")
            return
        }
    }

    @Test("Shutdown fails in-flight and later requests")
    func shutdownFailsPending() async throws {
        try await withPlainServer { s in
            let client = try HTTPClient(configuration: .init(allowPlainHTTPToLoopback: true))
            async let pending = client.send(HTTPRequest(url: "http://127.0.0.1:\(s.port)/hang", timeout: .seconds(30)))
            try await Task.sleep(for: .milliseconds(300))
            client.shutdown()
            let r = await pending
            #expect(r.failure == .shutdown)
            let late = await client.send(HTTPRequest(url: "http://127.0.0.1:\(s.port)/target"))
            #expect(late.failure == .shutdown)
            client.shutdown()  // idempotent
        }
    }
}
