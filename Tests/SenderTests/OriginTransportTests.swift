import HTTP2
import HTTPClient
import HeraldCore
import HeraldTestSupport
import HeraldTransport
import Testing

/// The one HTTP/1.1 fallback every provider goes through, against the test
/// gateways' HTTP/1.1-only listener (no h2 in ALPN).
@Suite("OriginTransport: HTTP/2 first, libcurl for an origin without it")
struct OriginTransportTests {
    static func send(
        _ t: OriginTransport, _ r: OriginRequest, lane: OriginLane?
    ) async -> Result<OriginResponse, OriginFailure> {
        await withCheckedContinuation { c in t.send(r, lane: { lane }) { c.resume(returning: $0) } }
    }

    static func request(_ g: FCMGateways, origin: String? = nil, notAfter: Int64? = nil) -> OriginRequest {
        let path = "/v1/projects/\(g.projectID)/messages:send"
        return OriginRequest(
            origin: origin ?? g.fcmH1Base, url: g.fcmH1Base + path, path: path,
            headers: [("Content-Type", "application/json")], body: Array("{}".utf8), notAfter: notAfter,
            timeout: .seconds(10))
    }

    static func version(_ r: Result<OriginResponse, OriginFailure>) -> String? {
        if case .success(let response) = r { response.httpVersion } else { nil }
    }

    @Test(
        "a refusal of HTTP/2 sends that request through libcurl and the origin's next ones at once, until the memory passes"
    )
    func fallbackIsRemembered() async throws {
        try await withFCMGateways(.http2) { g in
            let http2 = try #require(g.http2)
            let clock = OffsetClock()
            let t = OriginTransport(http1: g.client, http2: http2, clock: clock, memory: .seconds(60))
            let lane = t.lane("test:h1", host: "127.0.0.1", port: g.gateways.fcmH1, idleTimeout: .seconds(5))
            #expect(lane != nil)
            let r = Self.request(g)
            #expect(!t.usesHTTP1(r.origin))
            #expect(Self.version(await Self.send(t, r, lane: lane)) == "1.1", "the refused request itself is carried")
            #expect(t.usesHTTP1(r.origin) && t.rememberedHTTP1Origins == 1)
            #expect(http2.stats.connectFailures == 1)
            #expect(Self.version(await Self.send(t, r, lane: lane)) == "1.1")
            #expect(http2.stats.connectFailures == 1, "not tried over HTTP/2 again")
            clock.advance(ms: 61_000)
            #expect(!t.usesHTTP1(r.origin), "forgotten after the memory")
            #expect(Self.version(await Self.send(t, r, lane: lane)) == "1.1")
            #expect(http2.stats.connectFailures == 2, "HTTP/2 tried once more, refused again")
            #expect(http2.stats.requestsSent == 0)
            let h1 = try await g.sends(listener: "fcm_h1")
            #expect(h1.count == 3 && h1.allSatisfy { $0["http_version"] as? String == "http/1.1" })
        }
    }

    @Test("without a lane (no HTTP/2 client, or plain http) a request goes through libcurl and nothing is remembered")
    func noLane() async throws {
        try await withFCMGateways(.http2) { g in
            let t = OriginTransport(http1: g.client, clock: SystemClock())
            #expect(!t.carriesHTTP2)
            #expect(t.lane("test:none", host: "127.0.0.1", port: g.gateways.fcmH1, idleTimeout: .seconds(5)) == nil)
            let r = Self.request(g)
            #expect(Self.version(await Self.send(t, r, lane: nil)) == "1.1")
            #expect(!t.usesHTTP1(r.origin) && t.rememberedHTTP1Origins == 0)
        }
    }

    @Test("a request past its notAfter is not resent through libcurl: it fails expired, unsent")
    func expiredIsNotResent() async throws {
        try await withFCMGateways(.http2) { g in
            let t = OriginTransport(http1: g.client, clock: SystemClock())
            let r = Self.request(g, notAfter: SystemClock().nowMilliseconds() - 1)
            let result = await Self.send(t, r, lane: nil)
            var expired = false
            if case .failure(.expired) = result { expired = true }
            #expect(expired, "\(result)")
            let sends = try await g.sends(listener: "fcm_h1")
            #expect(sends.isEmpty)
        }
    }

    @Test("the origins remembered are bounded: past the capacity the least recently used is forgotten")
    func bounded() async throws {
        try await withFCMGateways(.http2) { g in
            let http2 = try #require(g.http2)
            let t = OriginTransport(http1: g.client, http2: http2, clock: SystemClock(), capacity: 2)
            let lane = t.lane("test:h1:bounded", host: "127.0.0.1", port: g.gateways.fcmH1, idleTimeout: .seconds(5))
            for origin in ["https://a.example", "https://b.example", "https://c.example"] {
                _ = await Self.send(t, Self.request(g, origin: origin), lane: lane)
            }
            #expect(t.rememberedHTTP1Origins == 2)
            #expect(!t.usesHTTP1("https://a.example"))
            #expect(t.usesHTTP1("https://b.example") && t.usesHTTP1("https://c.example"))
        }
    }

    @Test("a request that got no answer means the same for every provider: libcurl's failures")
    func http1FailureOutcomes() {
        #expect(OriginFailure.http1(.timeout("t")).outcome == .transient(reason: .timeout))
        #expect(OriginFailure.http1(.dnsFailure("d")).outcome == .transient(reason: .dnsFailure))
        #expect(OriginFailure.http1(.tls("x")).outcome == .transient(reason: .tlsFailure))
        #expect(OriginFailure.http1(.connectFailed("c")).outcome == .transient(reason: .connectFailure))
        #expect(OriginFailure.http1(.http2Stream("REFUSED_STREAM")).outcome == .transient(reason: .refusedStream))
        #expect(OriginFailure.http1(.http2Stream("GOAWAY")).outcome == .transient(reason: .goAway))
        #expect(OriginFailure.http1(.http2Stream("reset")).outcome == .transient(reason: .connectionReset))
        #expect(OriginFailure.http1(.shutdown).outcome == .transient(reason: .shutdown))
        #expect(
            OriginFailure.http1(.bodyTooLarge(limit: 1)).outcome == .transient(reason: .unknown("response_too_large")))
        #expect(OriginFailure.http1(.invalidRequest("bad")).outcome == .failed(reason: .unknown("invalid_request")))
        #expect(OriginFailure.http1(.other(code: 1, message: "o")).outcome == .transient(reason: .connectionReset))
        #expect(OriginFailure.expired.outcome == .transient(reason: .timeout))
    }

    @Test("a request that got no answer means the same for every provider: the HTTP/2 client's failures")
    func http2FailureOutcomes() {
        #expect(OriginFailure.http2(.timeout("t")).outcome == .transient(reason: .timeout))
        #expect(OriginFailure.http2(.dnsFailure("d")).outcome == .transient(reason: .dnsFailure))
        #expect(OriginFailure.http2(.connectFailed("c")).outcome == .transient(reason: .connectFailure))
        #expect(OriginFailure.http2(.tls("x")).outcome == .transient(reason: .tlsFailure))
        #expect(OriginFailure.http2(.connectionReset("r")).outcome == .transient(reason: .connectionReset))
        #expect(OriginFailure.http2(.refusedStream).outcome == .transient(reason: .refusedStream))
        #expect(OriginFailure.http2(.goAway(reason: "Shutdown")).outcome == .transient(reason: .goAway))
        #expect(OriginFailure.http2(.shutdown).outcome == .transient(reason: .shutdown))
    }
}
