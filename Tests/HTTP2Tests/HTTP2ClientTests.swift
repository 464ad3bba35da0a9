import Foundation
import HTTP2
import HeraldIO
import HeraldTestSupport
import Testing

/// The HTTP/2 client keeps at most `maxLanes` lanes: past it, the least
/// recently used lanes that hold no request are forgotten and their
/// connections closed (a subscription on a new Web Push origin each time
/// must not pile up lanes and sockets).
@Suite("HTTP/2 client lane bound", .serialized)
struct HTTP2LaneBoundTests {
    @Test("lanes past the bound are retired, least recently used first, and come back on use")
    func lanesPastTheBound() async throws {
        let g = try await TestGateways()
        defer { g.stop() }
        let sub = try await g.control("POST", "/control/webpush-subscription", ["listener": "webpush"])
        let endpoint = try #require(URL(string: sub["endpoint"] as? String ?? ""))
        let host = try #require(endpoint.host)
        var settings = HTTP2ClientSettings(caFile: g.ca) { host, _ in
            throw TestSupportError("unexpected lookup of \(host)")
        }
        settings.maxLanes = 2
        let client = try HTTP2Client(settings: settings, threadName: "herald-lanes-test")
        defer { client.shutdown() }
        let target = HTTP2Endpoint(host: host, port: endpoint.port ?? 443, addresses: ["127.0.0.1"])
        func post(_ lane: HTTP2LaneHandle) async -> Int? {
            let request = HTTP2Request(
                path: endpoint.path, headers: [("ttl", "60"), ("content-length", "3")], body: Array("abc".utf8))
            return await withCheckedContinuation { c in
                lane.send(request) { result in c.resume(returning: try? result.get().status) }
            }
        }
        var lanes: [HTTP2LaneHandle] = []
        for i in 0..<5 {
            let lane = client.lane(HTTP2LaneKey("origin-\(i)"), endpoint: target)
            lanes.append(lane)
            #expect(await post(lane) != nil, "lane \(i) got no answer")
        }
        try await waitUntil("the client is back within its bound, three lanes retired") {
            client.laneCount <= 2 && client.stats.lanesRetired == 3
        }
        try await waitUntil("the retired lanes' connections are closed") { client.stats.connectionsOpen <= 2 }
        // The most recently used lanes stayed; an old handle still works.
        #expect(await post(lanes[0]) != nil, "a retired lane did not come back")
        try await waitUntil("the bound holds after the reuse") { client.laneCount <= 2 }
        #expect(client.stats.connectionsOpen <= 2)
    }
}

/// The client reads nothing into a GOAWAY frame's opaque data itself: the
/// lane's `goAwayReason` hook does (APNs sets one), so a lane without it
/// records no reason.
@Suite("HTTP/2 client GOAWAY reason", .serialized)
struct HTTP2GoAwayReasonTests {
    @Test("the GOAWAY reason comes from the lane's hook alone")
    func reasonThroughTheHook() async throws {
        let g = try await TestGateways()
        defer { g.stop() }
        try await g.knobs("webpush", ["goaway_after": 1, "goaway_reason": "Shutdown"])
        let sub = try await g.control("POST", "/control/webpush-subscription", ["listener": "webpush"])
        let endpoint = try #require(URL(string: sub["endpoint"] as? String ?? ""))
        let host = try #require(endpoint.host)
        let target = HTTP2Endpoint(host: host, port: endpoint.port ?? 443, addresses: ["127.0.0.1"])
        let request = HTTP2Request(
            path: endpoint.path, headers: [("ttl", "60"), ("content-length", "3")], body: Array("abc".utf8))
        for hooked in [false, true] {
            let settings = HTTP2ClientSettings(caFile: g.ca) { host, _ in
                throw TestSupportError("unexpected lookup of \(host)")
            }
            let client = try HTTP2Client(settings: settings, threadName: "herald-goaway-test")
            defer { client.shutdown() }
            let seen = Locked<[UInt8]?>(nil)
            let options =
                hooked
                ? HTTP2LaneOptions(goAwayReason: { debug in
                    seen.withLock { $0 = debug }
                    return "read by the hook"
                }) : HTTP2LaneOptions()
            let lane = client.lane(HTTP2LaneKey("origin"), endpoint: target, options: options)
            let status = await withCheckedContinuation { c in
                lane.send(request) { result in c.resume(returning: try? result.get().status) }
            }
            #expect(status != nil, "no answer before the GOAWAY")
            try await waitUntil("the GOAWAY arrived") { client.stats.goaways == 1 }
            if hooked {
                #expect(client.stats.lastGoAwayReason == "read by the hook")
                let debug = try #require(seen.withLock { $0 })
                #expect(String(decoding: debug, as: UTF8.self).contains(#""Shutdown""#))
            } else {
                #expect(client.stats.lastGoAwayReason == nil)
            }
        }
    }
}

/// With a non-blocking `lookup`, the client asks it and never calls the
/// blocking `resolver` (which would take a thread per lookup).
@Suite("HTTP/2 client non-blocking lookup", .serialized)
struct HTTP2LookupTests {
    @Test("a host is looked up through `lookup`, never the blocking resolver, and its failure fails the request")
    func lookupInsteadOfResolver() async throws {
        let g = try await TestGateways()
        defer { g.stop() }
        let sub = try await g.control("POST", "/control/webpush-subscription", ["listener": "webpush"])
        let endpoint = try #require(URL(string: sub["endpoint"] as? String ?? ""))
        let asked = Locked<[String]>([])
        var settings = HTTP2ClientSettings(caFile: g.ca) { host, _ in
            throw TestSupportError("the blocking resolver was called for \(host)")
        }
        settings.lookup = { host, _, completion in
            asked.withLock { $0.append(host) }
            if host == "localhost" {
                completion(.success(["127.0.0.1"]))
            } else {
                completion(.failure(TestSupportError("no answer within 2000 ms")))
            }
        }
        settings.requestTimeout = .seconds(3)
        let client = try HTTP2Client(settings: settings, threadName: "herald-lookup-test")
        defer { client.shutdown() }
        func post(host: String) async -> Result<HTTP2Response, HTTP2ClientError> {
            let lane = client.lane(
                HTTP2LaneKey("lookup-\(host)"), endpoint: HTTP2Endpoint(host: host, port: endpoint.port ?? 443))
            let request = HTTP2Request(
                path: endpoint.path, headers: [("ttl", "60"), ("content-length", "3")], body: Array("abc".utf8))
            return await lane.send(request)
        }
        let good = await post(host: "localhost")
        #expect((try? good.get()) != nil, "\(good)")
        let hung = await post(host: "hung.example")
        guard case .failure(let error) = hung else {
            Issue.record("a failed lookup answered")
            return
        }
        #expect(!error.description.contains("blocking resolver"), "\(error)")
        #expect(asked.withLock { $0 } == ["localhost", "hung.example"])
    }
}
