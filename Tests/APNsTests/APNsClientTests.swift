import APNs
import Foundation
import HeraldCore
import HeraldCrypto
import HeraldTestSupport
import HeraldIO
import Testing

let apnsKeyID = "ABC123DEFG"
let apnsTeamID = "TEAM123456"
let apnsTopic = "com.example.app"

/// One gateway process for the suite, reset before each test.
actor SharedGateways {
    static let shared = SharedGateways()
    private var gateways: TestGateways?
    let key = try! P256PrivateKey.generate()

    func get() async throws -> TestGateways {
        if let gateways {
            try await gateways.reset()
            return gateways
        }
        let g = try await TestGateways()
        try await g.post(
            "/control/apns-key",
            [
                "key_id": apnsKeyID, "team_id": apnsTeamID, "public_key_pem": spkiPEM(key.publicKey),
                "topics": [apnsTopic, apnsTopic + ".voip"],
            ])
        gateways = g
        return g
    }
}

struct APNsHarness {
    let gateways: TestGateways
    let client: APNsClient
    let lane: APNsLaneHandle
    let clock: OffsetClock

    static func make(
        clockOffsetMs: Int64 = 0, caFile: String?? = nil, host: String = "127.0.0.1", port: Int? = nil,
        configure: (inout APNsClientSettings) -> Void = { _ in }
    ) async throws -> APNsHarness {
        let g = try await SharedGateways.shared.get()
        var settings = APNsClientSettings(caFile: caFile ?? g.ca) { host, _ in
            // Every name the tests use lives on the gateways' loopback address.
            guard host.hasSuffix(".test") || host == "localhost" else { throw TestSupportError("no such host \(host)") }
            return ["127.0.0.1"]
        }
        configure(&settings)
        let clock = OffsetClock(offsetMs: clockOffsetMs)
        let client = try APNsClient(settings: settings, clock: clock)
        let key = APNsLaneKey(app: "default", keyID: apnsKeyID, teamID: apnsTeamID, environment: .production)
        let lane = client.lane(
            key, endpoint: APNsEndpoint(host: host, port: port ?? g.apns),
            signer: APNsSigner(key: SharedGateways.shared.key, keyID: apnsKeyID, teamID: apnsTeamID))
        return APNsHarness(gateways: g, client: client, lane: lane, clock: clock)
    }

    func push(_ token: String, kind: PushKind = .notification, collapseKey: String? = nil) -> APNsPush {
        let message = PushMessage(kind: kind, data: [(key: "thread", value: "t1")], badge: 2, collapseKey: collapseKey)
        let platform: Platform = kind == .callRing ? .apnsVoIP : .apns
        let request = try! APNsRequest(
            message: message, platform: platform, user: "u", settings: APNsAppSettings(topic: apnsTopic),
            now: Int64(Date().timeIntervalSince1970))
        return APNsPush(deviceToken: token, request: request)
    }

    /// Sends a first push and waits until the gateway's raise of the stream
    /// limit (after that first answer) is acknowledged: the connection is past its warm-up.
    func warmUp() async throws {
        #expect(await lane.send(push(hexToken(0))).value?.status == 200)
        let record = try #require(try await gateways.received("apns").last)
        let conn = try #require(record["conn"] as? Int)
        let deadline = Date().addingTimeInterval(15)
        while Date() < deadline {
            let c = try await gateways.connections("apns").first { $0["id"] as? Int == conn }
            if c?["advertised_max_streams"] as? Int == 500 { return }
            try await Task.sleep(for: .milliseconds(20))
        }
        Issue.record("the gateway's SETTINGS raise was never acknowledged")
    }

    /// Sends `count` pushes at once and waits for every answer.
    func sendAll(_ tokens: [String]) async -> [Result<APNsResponse, APNsClientError>] {
        await withTaskGroup(of: (Int, Result<APNsResponse, APNsClientError>).self) { group in
            for (i, t) in tokens.enumerated() {
                group.addTask { (i, await lane.send(push(t))) }
            }
            var out = [Result<APNsResponse, APNsClientError>?](repeating: nil, count: tokens.count)
            for await (i, r) in group { out[i] = r }
            return out.map { $0! }
        }
    }
}

/// Waits for `condition`, polling, for up to `seconds`.
func waitUntil(_ what: String, seconds: Double = 15, _ condition: () -> Bool) async throws {
    let deadline = Date().addingTimeInterval(seconds)
    while !condition() {
        guard Date() < deadline else {
            Issue.record("timed out waiting until \(what)")
            return
        }
        try await Task.sleep(for: .milliseconds(20))
    }
}

func hexToken(_ i: Int) -> String {
    String(format: "%064x", i + 1)
}

extension Result {
    var value: Success? { try? get() }
    var failure: Failure? {
        if case .failure(let e) = self { return e }
        return nil
    }
}

@Suite("APNs client against the test gateway", .serialized)
struct APNsClientTests {
    @Test("a push reaches the gateway with a valid provider token and Apple's headers")
    func onePush() async throws {
        let h = try await APNsHarness.make()
        defer { h.client.shutdown() }
        let result = await h.lane.send(h.push(hexToken(1), collapseKey: "thread-1"))
        let response = try result.get()
        #expect(response.status == 200)
        #expect(response.apnsID?.count == 36)
        let records = try await h.gateways.received("apns")
        #expect(records.count == 1)
        let r = try #require(records.first)
        #expect(r["valid"] as? Bool == true, "\(r["errors"] ?? "")")
        let headers = r["headers"] as? [String: String] ?? [:]
        #expect(headers["apns-topic"] == apnsTopic)
        #expect(headers["apns-push-type"] == "alert")
        #expect(headers["apns-priority"] == "10")
        #expect(headers["apns-collapse-id"] == "thread-1")
        #expect(r["path"] as? String == "/3/device/\(hexToken(1))")
        let jwt = r["jwt"] as? [String: Any] ?? [:]
        #expect(jwt["kid"] as? String == apnsKeyID)
        #expect(jwt["iss"] as? String == apnsTeamID)
    }

    @Test("500 pushes: the 1-stream start is respected, then the lane fans out on one token")
    func fanOut() async throws {
        let h = try await APNsHarness.make()
        defer { h.client.shutdown() }
        let results = await h.sendAll((0..<500).map(hexToken))
        #expect(results.allSatisfy { $0.value?.status == 200 }, "\(results.compactMap(\.failure).prefix(3))")
        let conns = try await h.gateways.connections("apns")
        #expect(!conns.isEmpty && conns.count <= 2)
        for c in conns {
            #expect(c["stream_violations"] as? Int == 0)
            #expect(c["distinct_jwts"] as? Int == 1)
        }
        let peak = conns.map { $0["peak_open_streams"] as? Int ?? 0 }.max() ?? 0
        #expect(peak > 1, "the lane fanned out after the warm-up")
        let stats = try await h.gateways.get("/control/stats")
        #expect(stats["apns_stream_violations"] as? Int ?? 0 == 0)
        #expect(h.client.stats.tokensMinted == 1)
        #expect(h.client.stats.requestsSent == 500)
    }

    @Test("error answers carry Apple's reason and the 410 timestamp")
    func errorAnswers() async throws {
        let h = try await APNsHarness.make()
        defer { h.client.shutdown() }
        try await h.gateways.program(
            "apns", token: hexToken(1), [["status": 410, "reason": "Unregistered", "timestamp": 1_700_000_000_123]])
        try await h.gateways.program("apns", token: hexToken(2), [["status": 400, "reason": "BadDeviceToken"]])
        try await h.gateways.program("apns", token: hexToken(3), [["status": 429, "retry_after": 7]])
        let r = await h.sendAll([hexToken(1), hexToken(2), hexToken(3)])
        #expect(r[0].value?.status == 410 && r[0].value?.reason == "Unregistered")
        #expect(r[0].value?.timestamp == 1_700_000_000_123)
        #expect(r[0].value?.apnsID != nil)
        #expect(r[1].value?.status == 400 && r[1].value?.reason == "BadDeviceToken")
        #expect(r[2].value?.status == 429 && r[2].value?.retryAfter == "7")
    }

    @Test("GOAWAY before processing: the reason is recorded and the pushes go out on a new connection")
    func goAway() async throws {
        let h = try await APNsHarness.make()
        defer { h.client.shutdown() }
        try await h.gateways.knobs(
            "apns", ["goaway_after": 20, "goaway_answer_last": false, "goaway_times": 1, "goaway_reason": "Shutdown"])
        let results = await h.sendAll((0..<200).map(hexToken))
        #expect(
            results.allSatisfy { $0.value?.status == 200 }, "\(results.filter { $0.value?.status != 200 }.prefix(3))")
        let stats = h.client.stats
        #expect(stats.goaways == 1)
        #expect(stats.lastGoAwayReason == "Shutdown")
        #expect(stats.requeued > 0)
        #expect(try await h.gateways.connections("apns").count == 2)
    }

    @Test("a refused stream is sent again")
    func refusedStream() async throws {
        let h = try await APNsHarness.make()
        defer { h.client.shutdown() }
        try await h.gateways.program("apns", token: hexToken(9), [["reset": "REFUSED_STREAM"], ["status": 200]])
        let r = await h.lane.send(h.push(hexToken(9)))
        #expect(r.value?.status == 200)
        #expect(h.client.stats.requeued == 1)
    }

    @Test("an unanswered stream times out at its deadline and the connection carries on")
    func deadline() async throws {
        // Long enough that a loaded machine answers every other push well within it.
        let h = try await APNsHarness.make { $0.requestTimeout = .seconds(3) }
        defer { h.client.shutdown() }
        try await h.gateways.knobs("apns", ["hang_tokens": [hexToken(5)]])
        // A first push warms the connection (APNs then allows 500 streams).
        #expect(await h.lane.send(h.push(hexToken(4))).value?.status == 200)
        let started = Date()
        let results = await h.sendAll([hexToken(4), hexToken(5), hexToken(6)])
        #expect(results[0].value?.status == 200)
        guard case .timeout = results[1].failure else {
            Issue.record("expected a timeout, got \(results[1])")
            return
        }
        #expect(Date().timeIntervalSince(started) >= 2.9)
        #expect(results[2].value?.status == 200)
        #expect(h.client.stats.timeouts == 1)
        // The timeout made the connection suspect until the gateway answered its PING.
        #expect(h.client.stats.pings >= 1)
        try await waitUntil("the PING is answered") { h.client.stats.connectionsSuspect == 0 }
        #expect(await h.lane.send(h.push(hexToken(7))).value?.status == 200)
        #expect(h.client.stats.connectionsOpened == 1)
        #expect(h.client.stats.silentConnectionsClosed == 0)
    }

    @Test("a connection that goes silent is closed after the ping timeout; every push is delivered on a new one")
    func silentConnection() async throws {
        let g = try await SharedGateways.shared.get()
        let proxy = try BlackHoleProxy(targetPort: g.apns)
        defer { proxy.stop() }
        let h = try await APNsHarness.make(port: proxy.port) {
            $0.requestTimeout = .seconds(2)
            $0.pingTimeout = .milliseconds(500)
        }
        defer { h.client.shutdown() }
        // A live connection, past its warm-up; then it forwards nothing more either way.
        try await h.warmUp()
        proxy.silence()
        let tokens = (1...30).map(hexToken)
        let first = await h.sendAll(tokens)
        // What the silent connection took is not answered: each gets a timeout (never a
        // provider answer), and is then sent again, as the scheduler does.
        var final = first
        for (i, r) in first.enumerated() {
            if case .failure(let e) = r {
                guard case .timeout = e else {
                    Issue.record("\(tokens[i]): \(e)")
                    continue
                }
                final[i] = await h.lane.send(h.push(tokens[i]))
            }
        }
        #expect(first.contains { $0.failure != nil }, "the silent connection took pushes")
        #expect(final.allSatisfy { $0.value?.status == 200 }, "\(final.compactMap(\.failure).prefix(3))")
        // Each push arrived at the gateway, and on a connection other than the silent one.
        let records = try await h.gateways.received("apns")
        let silentConn = try #require(
            records.first { ($0["path"] as? String)?.hasSuffix(hexToken(0)) == true }?["conn"] as? Int)
        for t in tokens {
            let conns = records.filter { ($0["path"] as? String)?.hasSuffix(t) == true }.compactMap {
                $0["conn"] as? Int
            }
            #expect(!conns.isEmpty && !conns.contains(silentConn), "\(t) on \(conns)")
        }
        // The silent connection is closed by the client after its PING went unanswered.
        try await waitUntil("the silent connection is closed") { proxy.links.first?.clientClosed == true }
        #expect(h.client.stats.silentConnectionsClosed == 1)
        // No retry was handed to the suspected connection (it would have had to be requeued at its close).
        #expect(h.client.stats.requeued == 0)
        #expect(h.client.stats.connectionsOpen == 1)
        #expect(proxy.links.count >= 2)
        #expect(proxy.links.dropFirst().allSatisfy { !$0.clientClosed }, "the new connection stays open")
    }

    @Test("pushes still waiting on a silent connection are sent again on a new one")
    func silentConnectionRequeues() async throws {
        let g = try await SharedGateways.shared.get()
        let proxy = try BlackHoleProxy(targetPort: g.apns)
        defer { proxy.stop() }
        let h = try await APNsHarness.make(port: proxy.port) {
            $0.requestTimeout = .seconds(5)
            $0.pingTimeout = .milliseconds(300)
        }
        defer { h.client.shutdown() }
        try await h.warmUp()
        proxy.silence()
        let early = Locked<Result<APNsResponse, APNsClientError>?>(nil)
        h.lane.send(h.push(hexToken(1))) { r in early.withLock { $0 = r } }
        // A second push, 1.5 s later: the connection is not suspected yet, so it takes it.
        try await Task.sleep(for: .milliseconds(1500))
        let late = await h.lane.send(h.push(hexToken(2)))
        guard case .timeout = early.withLock({ $0?.failure }) else {
            Issue.record("the first push should time out: \(String(describing: early.withLock { $0 }))")
            return
        }
        // Its PING unanswered, the connection was closed; the second push, still within its
        // deadline, went out on a new connection and was answered.
        #expect(late.value?.status == 200, "\(late)")
        #expect(h.client.stats.silentConnectionsClosed == 1)
        #expect(h.client.stats.requeued >= 1)
        #expect(h.client.stats.connectionsOpened == 2)
    }

    @Test("a suspected connection that answers its PING in time is kept; the lane goes back to its size")
    func latePingAnswer() async throws {
        let g = try await SharedGateways.shared.get()
        let proxy = try BlackHoleProxy(targetPort: g.apns)
        defer { proxy.stop() }
        let h = try await APNsHarness.make(port: proxy.port) {
            $0.maxConnectionsPerLane = 1
            $0.requestTimeout = .seconds(1)
            // Long: the path recovers when the test says so, well within it.
            $0.pingTimeout = .seconds(10)
        }
        defer { h.client.shutdown() }
        try await h.warmUp()
        // The path stalls: the push times out, the connection is suspected and its PING waits.
        proxy.hold()
        let first = await h.lane.send(h.push(hexToken(1)))
        guard case .timeout = first.failure else {
            Issue.record("expected a timeout while the path stalls, got \(first)")
            return
        }
        #expect(h.client.stats.connectionsSuspect == 1)
        // The retry does not wait for the suspected connection: a replacement opens, though the
        // lane is allowed one connection.
        #expect(await h.lane.send(h.push(hexToken(1))).value?.status == 200)
        #expect(h.client.stats.connectionsOpened == 2)
        // The path recovers within the ping timeout: the PING is answered, the connection is no
        // longer suspected and, the lane being over its size, it is retired (not closed as silent).
        proxy.resume()
        try await waitUntil("the suspected connection is retired") {
            h.client.stats.connectionsSuspect == 0 && h.client.stats.connectionsOpen == 1
        }
        #expect(h.client.stats.silentConnectionsClosed == 0)
        #expect(await h.lane.send(h.push(hexToken(2))).value?.status == 200)
        #expect(h.client.stats.connectionsOpened == 2)
    }

    @Test("a flow-control window that never reopens counts as silence, though PINGs are answered")
    func stalledWindow() async throws {
        let h = try await APNsHarness.make {
            $0.requestTimeout = .milliseconds(1500)
            $0.pingTimeout = .milliseconds(500)
        }
        defer { h.client.shutdown() }
        try await h.gateways.knobs("apns", ["zero_window_times": 1])
        let first = await h.lane.send(h.push(hexToken(1)))
        guard case .timeout = first.failure else {
            Issue.record("expected a timeout on the stalled connection, got \(first)")
            return
        }
        let retry = await h.lane.send(h.push(hexToken(1)))
        #expect(retry.value?.status == 200, "\(retry)")
        // The stalled connection never got the body; the retry went out on another connection.
        let stalled = try await h.gateways.connections("apns").filter { $0["zero_window"] as? Bool == true }
        #expect(stalled.count == 1)
        let records = try await h.gateways.received("apns")
        #expect(records.count == 1)
        #expect(records.first?["conn"] as? Int != nil && records.first?["conn"] as? Int != stalled.first?["id"] as? Int)
        try await waitUntil("the stalled connection is closed") { h.client.stats.silentConnectionsClosed == 1 }
        #expect(h.client.stats.requeued == 0, "the retry was not handed to the stalled connection")
        #expect(h.client.stats.connectionsOpen == 1)
    }

    @Test("without the gateways' CA the handshake fails as a TLS failure")
    func untrustedCertificate() async throws {
        let h = try await APNsHarness.make(caFile: .some(nil))
        defer { h.client.shutdown() }
        let r = await h.lane.send(h.push(hexToken(1)))
        guard case .tls(let message) = r.failure else {
            Issue.record("expected a TLS failure, got \(r)")
            return
        }
        #expect(message.contains("certificate"))
        #expect(try await h.gateways.received("apns").isEmpty)
    }

    @Test("a certificate for another host name is refused")
    func wrongHost() async throws {
        let h = try await APNsHarness.make(host: "api.push.test")
        defer { h.client.shutdown() }
        let r = await h.lane.send(h.push(hexToken(1)))
        guard case .tls = r.failure else {
            Issue.record("expected a TLS failure, got \(r)")
            return
        }
    }

    @Test("a name that does not resolve is a DNS failure; a closed port a connect failure")
    func unreachable() async throws {
        let h = try await APNsHarness.make(host: "nowhere.invalid")
        defer { h.client.shutdown() }
        guard case .dnsFailure = await h.lane.send(h.push(hexToken(1))).failure else {
            Issue.record("expected a DNS failure")
            return
        }
        let g = try await SharedGateways.shared.get()
        let client = try APNsClient(settings: APNsClientSettings(caFile: g.ca) { _, _ in [] })
        defer { client.shutdown() }
        let lane = client.lane(
            APNsLaneKey(app: "a", keyID: apnsKeyID, teamID: apnsTeamID, environment: .development),
            endpoint: APNsEndpoint(host: "127.0.0.1", port: 1),
            signer: APNsSigner(key: SharedGateways.shared.key, keyID: apnsKeyID, teamID: apnsTeamID))
        guard case .connectFailed = await lane.send(h.push(hexToken(1))).failure else {
            Issue.record("expected a connect failure")
            return
        }
    }

    @Test("the provider token is reused for ~50 minutes, then replaced on the same connection")
    func tokenRotation() async throws {
        // The clock starts 55 minutes behind, so the first token is signed "55 minutes ago".
        let h = try await APNsHarness.make(clockOffsetMs: -55 * 60_000)
        defer { h.client.shutdown() }
        _ = await h.sendAll((0..<50).map(hexToken))
        #expect(h.client.stats.tokensMinted == 1)
        h.clock.advance(ms: 30 * 60_000)  // 30 min: still fresh
        _ = await h.sendAll((50..<60).map(hexToken))
        #expect(h.client.stats.tokensMinted == 1)
        h.clock.advance(ms: 25 * 60_000)  // 55 min old: replaced
        let later = await h.sendAll((60..<70).map(hexToken))
        #expect(later.allSatisfy { $0.value?.status == 200 })
        #expect(h.client.stats.tokensMinted == 2)
        let conns = try await h.gateways.connections("apns")
        #expect(conns.count == 1)
        #expect(conns.first?["distinct_jwts"] as? Int == 2)
    }

    @Test("ExpiredProviderToken retires the connection; a young token is kept, an old one re-signed")
    func expiredProviderToken() async throws {
        let h = try await APNsHarness.make(clockOffsetMs: -25 * 60_000)
        defer { h.client.shutdown() }
        #expect(await h.lane.send(h.push(hexToken(1))).value?.status == 200)
        h.clock.advance(ms: 25 * 60_000)  // the token is 25 minutes old now
        try await h.gateways.program(
            "apns", token: hexToken(2), [["status": 403, "reason": "ExpiredProviderToken"], ["status": 200]])
        let r = await h.lane.send(h.push(hexToken(2)))
        #expect(r.value?.reason == "ExpiredProviderToken")
        #expect(h.client.stats.tokensMinted == 2, "a 25-minute-old token is signed again")
        #expect(await h.lane.send(h.push(hexToken(2))).value?.status == 200)
        let conns = try await h.gateways.connections("apns")
        #expect(conns.count == 2, "the rejected connection was replaced")

        // The token just signed is fresh.
        try await h.gateways.program(
            "apns", token: hexToken(3), [["status": 403, "reason": "ExpiredProviderToken"], ["status": 200]])
        _ = await h.lane.send(h.push(hexToken(3)))
        #expect(h.client.stats.tokensMinted == 2, "a token younger than 20 minutes is not replaced")
    }

    @Test("an idle connection is kept alive with PING")
    func keepAlive() async throws {
        let h = try await APNsHarness.make {
            $0.pingInterval = .milliseconds(300)
            $0.pingTimeout = .seconds(2)
        }
        defer { h.client.shutdown() }
        #expect(await h.lane.send(h.push(hexToken(1))).value?.status == 200)
        // Every 300 ms while idle: waited for, not timed.
        try await waitUntil("two keep-alive PINGs") { h.client.stats.pings >= 2 }
        #expect(await h.lane.send(h.push(hexToken(2))).value?.status == 200)
        #expect(h.client.stats.connectionsOpened == 1)
        #expect(h.client.stats.connectionsOpen == 1)
    }

    @Test("VoIP pushes carry the .voip topic and push type")
    func voip() async throws {
        let h = try await APNsHarness.make()
        defer { h.client.shutdown() }
        let r = await h.lane.send(h.push(hexToken(1), kind: .callRing))
        #expect(r.value?.status == 200)
        let rec = try #require(try await h.gateways.received("apns").first)
        let headers = rec["headers"] as? [String: String] ?? [:]
        #expect(headers["apns-topic"] == apnsTopic + ".voip")
        #expect(headers["apns-push-type"] == "voip")
        #expect(headers["apns-expiration"] == "0")
    }

    @Test("shutdown fails what is still waiting")
    func shutdown() async throws {
        let h = try await APNsHarness.make()
        try await h.gateways.knobs("apns", ["hang_tokens": [hexToken(1)]])
        let box = Locked<Result<APNsResponse, APNsClientError>?>(nil)
        h.lane.send(h.push(hexToken(1))) { r in box.withLock { $0 = r } }
        try await Task.sleep(for: .milliseconds(500))
        h.client.shutdown()
        #expect(box.withLock { $0?.failure } == .shutdown)
        #expect(await h.lane.send(h.push(hexToken(2))).failure == .shutdown)
    }

    @Test("a push still waiting for a stream at its send deadline is not sent")
    func notSentPastItsDeadline() async throws {
        let h = try await APNsHarness.make()
        defer { h.client.shutdown() }
        // A new connection takes one stream until the gateway raises the
        // limit after its first answer: the second push waits behind the
        // first, which the gateway holds for 1.5 s.
        try await h.gateways.program("apns", token: hexToken(1), [["status": 200, "delay_ms": 1500]])
        async let first = h.lane.send(h.push(hexToken(1)))
        // Once the first push holds the only stream, the others queue behind it.
        try await waitUntil("the first push is on its stream") { h.client.stats.requestsSent == 1 }
        var late = h.push(hexToken(2))
        late.notAfter = h.clock.nowMilliseconds() + 300
        var inTime = h.push(hexToken(3))
        inTime.notAfter = h.clock.nowMilliseconds() + 60_000
        async let second = h.lane.send(late)
        async let third = h.lane.send(inTime)
        #expect(await first.value?.status == 200)
        guard case .timeout = await second.failure else {
            Issue.record("the push past its send deadline was not refused as a timeout")
            return
        }
        #expect(await third.value?.status == 200)
        let paths = try await h.gateways.received("apns").compactMap { $0["path"] as? String }
        #expect(paths.contains("/3/device/\(hexToken(3))"))
        #expect(!paths.contains("/3/device/\(hexToken(2))"), "a push was sent after its send deadline")
    }
}
