import Foundation
import HTTP2
import HeraldTestSupport
import HTTPClient
import HeraldCore
import HeraldTransport
import HeraldCrypto
import HeraldNet
import Testing
import WebPush

// MARK: - Gateways (TestGateways, GatewaySupport.swift)

extension TestGateways {
    func call(_ method: String, _ path: String, _ body: [String: Any]? = nil) async throws -> [String: Any] {
        try await control(method, path, body)
    }

    func received() async throws -> [[String: Any]] {
        try await control("GET", "/control/received?gateway=webpush")["requests"] as? [[String: Any]] ?? []
    }

    func program(_ token: String, _ responses: [[String: Any]]) async throws {
        try await control("POST", "/control/program", ["gateway": "webpush", "token": token, "responses": responses])
    }
}

/// What carries the sender's requests: libcurl alone, or the shared HTTP/2 client
/// (with libcurl for origins that do not offer HTTP/2).
enum Carrier: String, CaseIterable, Sendable, CustomTestStringConvertible {
    case curl, http2
    var testDescription: String { rawValue }
}

private struct Subscription: Sendable {
    let id: String
    let endpoint: String
    let p256dh: String
    let auth: String
}

private struct Harness: Sendable {
    let carrier: Carrier
    let gateways: TestGateways
    let client: HTTPClient
    /// Set for `.http2`: the client the sender was given.
    let http2: HTTP2Client?
    let sender: WebPushSender
    let subscription: Subscription
}

/// A gateway process, a VAPID key it accepts, one subscription (its endpoint on `listener`:
/// "webpush", or "webpush_h1" which offers only ALPN http/1.1) and a sender over `carrier`.
/// With `.http2`, once `body` is done, every request that reached the h2-capable listener must
/// have gone out on the HTTP/2 client (none through libcurl).
private func withHarness(
    _ carrier: Carrier, allowPrivate: Bool = true, listener: String = "webpush",
    http2IdleTimeout: Duration = WebPushSender.idleTimeout, resolver: (any HostResolver)? = nil,
    _ body: (Harness) async throws -> Void
) async throws {
    let g = try await TestGateways()
    defer { g.stop() }
    let key = try P256PrivateKey.generate()
    _ = try await g.call("POST", "/control/webpush-vapid-key", ["public_key": key.publicKeyBase64URL])
    let sub = try await g.call("POST", "/control/webpush-subscription", ["listener": listener])
    let subscription = Subscription(
        id: sub["id"] as? String ?? "", endpoint: sub["endpoint"] as? String ?? "",
        p256dh: sub["p256dh"] as? String ?? "", auth: sub["auth"] as? String ?? "")
    let client = try HTTPClient(configuration: .init(caFile: g.ca))
    defer { client.shutdown() }
    let http2: HTTP2Client? =
        carrier == .http2
        ? try HTTP2Client(
            settings: HTTP2ClientSettings(caFile: g.ca) { host, _ in
                // Web Push lanes are pinned to the guard's vetted addresses: nothing is looked up.
                throw TestSupportError("unexpected lookup of \(host)")
            }, threadName: "herald-webpush-test") : nil
    defer { http2?.shutdown() }
    let sender = WebPushSender(
        guard: resolver.map { EndpointGuard(allowPrivate: allowPrivate, resolver: $0) }
            ?? EndpointGuard(allowPrivate: allowPrivate),
        transport: OriginTransport(http1: client, http2: http2, clock: SystemClock()), vapidKey: key,
        subject: "mailto:ops@example.com", app: "app1", clock: SystemClock(), http2IdleTimeout: http2IdleTimeout)
    let h = Harness(
        carrier: carrier, gateways: g, client: client, http2: http2, sender: sender, subscription: subscription)
    try await body(h)
    if let http2 {
        let viaH2Listener = try await g.received("webpush").filter { $0["listener"] as? String == "webpush" }
        #expect(
            http2.stats.requestsSent == viaH2Listener.count,
            "every request to the h2 listener went out on the HTTP/2 client")
    }
}

private func message(collapseKey: String? = "thread-7") -> PushMessage {
    PushMessage(
        kind: .notification, data: [(key: "thread", value: "t7"), (key: "msg", value: "m42")], badge: 3,
        collapseKey: collapseKey, priority: .high, ttlSeconds: 120)
}

extension Harness {
    func send(_ payload: WebPushPayload, _ headers: WebPushHeaders, endpoint: String? = nil) async -> (Outcome, Int?) {
        await withCheckedContinuation { continuation in
            sender.send(
                endpoint: endpoint ?? subscription.endpoint, p256dh: subscription.p256dh, auth: subscription.auth,
                payload: payload, headers: headers
            ) { outcome, status in continuation.resume(returning: (outcome, status)) }
        }
    }

    /// The subscription's endpoint on another listener of the gateway (subscriptions are shared).
    func endpoint(port: Int) -> String {
        "https://127.0.0.1:\(port)/push/\(subscription.id)"
    }
}

private func header(_ record: [String: Any], _ name: String) -> String? {
    (record["headers"] as? [String: Any])?[name] as? String
}

private func vapidT(_ authorization: String?) -> String? {
    guard let authorization, let range = authorization.range(of: "t=") else { return nil }
    return String(authorization[range.upperBound...].prefix { $0 != "," && $0 != " " })
}

/// The gateway decrypted `record` to `payload`'s plaintext and found every Web Push header right.
private func expectDelivered(_ record: [String: Any], _ payload: WebPushPayload, _ headers: WebPushHeaders) {
    #expect(record["valid"] as? Bool == true, "errors: \(record["errors"] ?? "")")
    #expect(record["plaintext"] as? String == String(decoding: payload.plaintext, as: UTF8.self))
    #expect(record["body_len"] as? Int == 2816)
    #expect(header(record, "ttl") == "120")
    #expect(header(record, "urgency") == "high")
    #expect(header(record, "topic") == headers.topic)
    #expect(header(record, "content-encoding") == "aes128gcm")
    #expect(header(record, "content-type") == "application/octet-stream")
    #expect(header(record, "encryption") == nil)
}

/// A loopback port nothing listens on (bound, then closed).
private func closedPort() throws -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { throw TestSupportError("socket failed") }
    defer { close(fd) }
    var addr = sockaddr_in()
    addr.sin_family = sa_family_t(AF_INET)
    addr.sin_addr.s_addr = inet_addr("127.0.0.1")
    addr.sin_port = 0
    var len = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &addr) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { p in
            bind(fd, p, len) == 0 && getsockname(fd, p, &len) == 0
        }
    }
    guard bound else { throw TestSupportError("bind failed") }
    return Int(UInt16(bigEndian: addr.sin_port))
}

// MARK: - Tests

@Suite("WebPushSender against the Web Push test gateway", .serialized)
struct WebPushSenderTests {
    @Test(
        "A send is delivered: plaintext, 2816-byte body, TTL/Urgency/Topic, one VAPID token per origin",
        arguments: Carrier.allCases)
    func delivered(_ carrier: Carrier) async throws {
        try await withHarness(carrier) { h in
            let msg = message()
            let payload = try WebPushPayload(message: msg, user: "u1")
            let headers = WebPushHeaders(message: msg)
            let (first, status) = await h.send(payload, headers)
            #expect(first == .delivered)
            #expect(status == 201)
            let (second, _) = await h.send(payload, headers)
            #expect(second == .delivered)

            let records = try await h.gateways.received()
            try #require(records.count == 2)
            for record in records { expectDelivered(record, payload, headers) }
            let tokens = records.map { vapidT(header($0, "authorization")) }
            #expect(tokens[0] != nil)
            #expect(tokens[0] == tokens[1])
            #expect(h.sender.tokens.count == 1)
            #expect(h.sender.http2IdleTimeout == .seconds(120))
            if let http2 = h.http2 {
                // Both went on one lane and one connection, which stays open (120 s idle timeout).
                #expect(records.allSatisfy { $0["http_version"] as? String == "h2" })
                #expect(Set(records.compactMap { $0["conn"] as? Int }).count == 1)
                #expect(http2.laneCount == 1)
                #expect(http2.stats.connectionsOpened == 1)
                #expect(http2.stats.connectionsOpen == 1)
                #expect(!h.sender.usesHTTP1("https://127.0.0.1:\(h.gateways.webpush)"))
            }
        }
    }

    @Test(
        "through the transport: a job's push is sealed and delivered; unusable keys fail before any request",
        arguments: Carrier.allCases)
    func transportJobs(_ carrier: Carrier) async throws {
        try await withHarness(carrier) { h in
            let transport = WebPushTransport(sender: h.sender)
            func job(_ keys: WebPushKeys?) -> DeliveryJob {
                let now = SystemClock().nowMilliseconds()
                return DeliveryJob(
                    deliveryID: 1, messageID: "m1", app: "app1", deviceID: "d1", user: "u1", platform: .web,
                    environment: nil, token: h.subscription.endpoint, keys: keys, tokenHash: "h", registeredAt: now,
                    message: message(), acceptedAt: now, expiresAt: now + 120_000, previousAttempts: 0)
            }
            func send(_ j: DeliveryJob) async -> AttemptReport {
                await withCheckedContinuation { c in transport.send(j) { c.resume(returning: $0) } }
            }
            let good = WebPushKeys(
                p256dh: try Base64URL.decode(h.subscription.p256dh), auth: try Base64URL.decode(h.subscription.auth))
            #expect(await send(job(good)).outcome == .delivered)
            let offCurve = WebPushKeys(p256dh: [0x04] + [UInt8](repeating: 7, count: 64), auth: good.auth)
            #expect(await send(job(offCurve)).outcome == .failed(reason: WebPushSender.invalidKeys))
            #expect(await send(job(nil)).outcome == .failed(reason: WebPushSender.invalidKeys))
            let records = try await h.gateways.received()
            #expect(records.count == 1, "only the good job reached the push service")
            #expect(records.first?["valid"] as? Bool == true)
        }
    }

    @Test("No Topic header without a collapse key", arguments: Carrier.allCases)
    func noTopic(_ carrier: Carrier) async throws {
        try await withHarness(carrier) { h in
            let msg = message(collapseKey: nil)
            let (outcome, _) = await h.send(try WebPushPayload(message: msg, user: "u1"), WebPushHeaders(message: msg))
            #expect(outcome == .delivered)
            let records = try await h.gateways.received()
            try #require(records.count == 1)
            #expect(records[0]["valid"] as? Bool == true, "errors: \(records[0]["errors"] ?? "")")
            #expect(header(records[0], "topic") == nil)
        }
    }

    @Test("410 and 404 are stale; 429 with Retry-After is a retry", arguments: Carrier.allCases)
    func errorStatuses(_ carrier: Carrier) async throws {
        try await withHarness(carrier) { h in
            let msg = message()
            let payload = try WebPushPayload(message: msg, user: "u1")
            let headers = WebPushHeaders(message: msg)

            try await h.gateways.program(h.subscription.id, [["status": 410]])
            let (gone, goneStatus) = await h.send(payload, headers)
            #expect(gone == .stale(reason: .httpStatus(410)))
            #expect(goneStatus == 410)

            try await h.gateways.program(h.subscription.id, [["status": 404]])
            let (notFound, _) = await h.send(payload, headers)
            #expect(notFound == .stale(reason: .httpStatus(404)))

            try await h.gateways.program(h.subscription.id, [["status": 429, "retry_after": 7]])
            let (limited, limitedStatus) = await h.send(payload, headers)
            #expect(limited == .retry(after: .seconds(7), reason: .httpStatus(429)))
            #expect(limitedStatus == 429)
            #expect(try await h.gateways.received().count == 3)
        }
    }

    @Test("A VAPID rejection (401) is authRejected and drops the origin's cached token", arguments: Carrier.allCases)
    func vapidRejected(_ carrier: Carrier) async throws {
        try await withHarness(carrier) { h in
            let msg = message()
            let payload = try WebPushPayload(message: msg, user: "u1")
            let headers = WebPushHeaders(message: msg)
            // The gateway now accepts only another application-server key: the sender's token is refused.
            let other = try P256PrivateKey.generate()
            _ = try await h.gateways.call(
                "POST", "/control/webpush-vapid-key", ["clear": true, "public_key": other.publicKeyBase64URL])
            let (refused, status) = await h.send(payload, headers)
            #expect(refused == .authRejected(reason: .httpStatus(401)))
            #expect(status == 401)
            #expect(h.sender.tokens.count == 0)
            let records = try await h.gateways.received()
            try #require(records.count == 1)
            #expect((records[0]["errors"] as? [String])?.contains("VAPID public key mismatch") == true)
        }
    }

    @Test("One 413: the sender steps down to a 2048-byte record and delivers", arguments: Carrier.allCases)
    func stepDown(_ carrier: Carrier) async throws {
        try await withHarness(carrier) { h in
            let msg = message()
            let payload = try WebPushPayload(message: msg, user: "u1")
            try await h.gateways.program(h.subscription.id, [["status": 413], ["status": 201]])
            let (outcome, status) = await h.send(payload, WebPushHeaders(message: msg))
            #expect(outcome == .delivered)
            #expect(status == 201)
            let records = try await h.gateways.received()
            try #require(records.count == 2)
            #expect(records[0]["body_len"] as? Int == 2816)
            #expect(records[1]["body_len"] as? Int == 2048)
            #expect(records[1]["valid"] as? Bool == true, "errors: \(records[1]["errors"] ?? "")")
            #expect(records[1]["plaintext"] as? String == String(decoding: payload.minimalPlaintext, as: UTF8.self))
        }
    }

    @Test(
        "the report's receipt names the push service's Location for the push, the origin and the time taken",
        arguments: Carrier.allCases)
    func receiptCarriesLocation(_ carrier: Carrier) async throws {
        try await withHarness(carrier) { h in
            let msg = message()
            let payload = try WebPushPayload(message: msg, user: "u1")
            let subscriber = try WebPushSubscriber(p256dh: h.subscription.p256dh, auth: h.subscription.auth)
            let ready = WebPushSender.Prepared(
                subscriber: subscriber, payload: payload, headers: WebPushHeaders(message: msg))
            let report = await withCheckedContinuation { (c: CheckedContinuation<AttemptReport, Never>) in
                h.sender.send(endpoint: h.subscription.endpoint, prepare: { .ready(ready) }) { c.resume(returning: $0) }
            }
            #expect(report.outcome == .delivered && report.httpStatus == 201)
            let record = try #require(try await h.gateways.received().last)
            let response = record["response"] as? [String: Any] ?? [:]
            let location = (response["headers"] as? [String: Any])?["location"] as? String
            #expect(location != nil)
            #expect(report.receipt?.location == location)
            let endpoint = try HTTPURL(parsing: h.subscription.endpoint)
            #expect(report.receipt?.origin == endpoint.origin.description)
            #expect((report.receipt?.elapsedMs ?? -1) >= 0)
        }
    }

    @Test("Two 413s: failed with PayloadTooLarge, no third request", arguments: Carrier.allCases)
    func stepDownFails(_ carrier: Carrier) async throws {
        try await withHarness(carrier) { h in
            let msg = message()
            try await h.gateways.program(h.subscription.id, [["status": 413]])
            let (outcome, status) = await h.send(
                try WebPushPayload(message: msg, user: "u1"), WebPushHeaders(message: msg))
            #expect(outcome == .failed(reason: .payloadTooLarge))
            #expect(status == 413)
            #expect(try await h.gateways.received().count == 2)
        }
    }

    @Test("A loopback endpoint under a strict guard fails without any request", arguments: Carrier.allCases)
    func guardRefuses(_ carrier: Carrier) async throws {
        try await withHarness(carrier, allowPrivate: false) { h in
            let msg = message()
            let endpoint = h.subscription.endpoint
            #expect(endpoint.hasPrefix("https://127.0.0.1:"))
            let payload = try WebPushPayload(message: msg, user: "u1")
            let headers = WebPushHeaders(message: msg)
            let (outcome, status) = await h.send(payload, headers, endpoint: endpoint)
            #expect(outcome == .failed(reason: WebPushSender.endpointRefused))
            #expect(status == nil)
            // Not https: refused before any lookup, whatever the guard allows.
            let (plain, _) = await h.send(payload, headers, endpoint: "http://127.0.0.1:\(h.gateways.webpush)/push/x")
            #expect(plain == .failed(reason: WebPushSender.endpointRefused))
            #expect(try await h.gateways.received().isEmpty)
            #expect(try await h.gateways.connections("webpush").isEmpty)
            if let http2 = h.http2 {
                #expect(http2.laneCount == 0)
                #expect(http2.stats.connectionsOpened == 0)
            }
        }
    }

    @Test("Nothing listening: transient connect_failure, no status", arguments: Carrier.allCases)
    func connectFailure(_ carrier: Carrier) async throws {
        try await withHarness(carrier) { h in
            let msg = message()
            let port = try closedPort()
            let (outcome, status) = await h.send(
                try WebPushPayload(message: msg, user: "u1"), WebPushHeaders(message: msg),
                endpoint: h.endpoint(port: port))
            #expect(outcome == .transient(reason: .connectFailure))
            #expect(status == nil)
            if let http2 = h.http2 {
                // A failed connection is not a refusal of HTTP/2: the origin is not sent through libcurl.
                #expect(http2.stats.connectFailures == 1)
                #expect(!h.sender.usesHTTP1("https://127.0.0.1:\(port)"))
            }
        }
    }
}

// MARK: - Slow DNS

/// `localhost` is loopback; names under `.hang.example` are answered only at
/// `release()` (a name server that never answers); other names do not exist.
private final class HangingResolver: NonBlockingResolver, @unchecked Sendable {
    private let lock = NSLock()
    private var released = false
    private var hung: [(String, @Sendable (Result<[IPAddress], ResolverError>) -> Void)] = []

    func lookup(
        host: String, port: Int, completion: @escaping @Sendable (Result<[IPAddress], ResolverError>) -> Void
    ) {
        if host == "localhost" { return completion(.success([IPAddress(numericHost: "127.0.0.1")!])) }
        guard host.hasSuffix(".hang.example") else { return completion(.failure(.notFound(host: host))) }
        let now = lock.withLock { () -> Bool in
            if released { return true }
            hung.append((host, completion))
            return false
        }
        if now { completion(.failure(.failed(host: host, reason: "released"))) }
    }

    func release() {
        let waiting = lock.withLock { () -> [(String, @Sendable (Result<[IPAddress], ResolverError>) -> Void)] in
            released = true
            defer { hung.removeAll() }
            return hung
        }
        for (host, completion) in waiting { completion(.failure(.failed(host: host, reason: "released"))) }
    }
}

/// Completions in the order they came.
private final class Finished: @unchecked Sendable {
    private let lock = NSLock()
    private var items: [(name: String, outcome: Outcome)] = []
    func add(_ name: String, _ outcome: Outcome) { lock.withLock { items.append((name, outcome)) } }
    var all: [(name: String, outcome: Outcome)] { lock.withLock { items } }
}

@Suite("WebPushSender and a name server that never answers", .serialized)
struct WebPushSenderSlowDNSTests {
    @Test(
        "Endpoints whose lookups hang do not hold up the others; they end as DNS failures after the timeout",
        arguments: Carrier.allCases)
    func slowNameServer(_ carrier: Carrier) async throws {
        let base = HangingResolver()
        defer { base.release() }
        // 5 s rather than the daemon's 2 s: room for a loaded test machine.
        let resolver = CachingResolver(base, timeout: .seconds(5))
        try await withHarness(carrier, resolver: resolver) { h in
            let msg = message()
            let payload = try WebPushPayload(message: msg, user: "u1")
            let headers = WebPushHeaders(message: msg)
            let finished = Finished()
            let path = "/push/\(h.subscription.id)"
            let port = h.gateways.webpush
            let subscriber = try WebPushSubscriber(p256dh: h.subscription.p256dh, auth: h.subscription.auth)
            // The hung ones first, so each worker meets them before the good ones.
            let count = 24
            for i in 0..<count {
                h.sender.send(
                    endpoint: "https://s\(i).hang.example:\(port)\(path)", subscriber: subscriber, payload: payload,
                    headers: headers
                ) { outcome, _ in finished.add("hung\(i)", outcome) }
            }
            for i in 0..<count {
                h.sender.send(
                    endpoint: "https://localhost:\(port)\(path)", subscriber: subscriber, payload: payload,
                    headers: headers
                ) { outcome, _ in finished.add("good\(i)", outcome) }
            }
            try await waitUntil("every send has ended", timeout: .seconds(60)) { finished.all.count == 2 * count }
            let all = finished.all
            let good = all.filter { $0.name.hasPrefix("good") }
            let hung = all.filter { $0.name.hasPrefix("hung") }
            #expect(good.allSatisfy { $0.outcome == .delivered }, "\(good)")
            #expect(hung.allSatisfy { $0.outcome == .transient(reason: .dnsFailure) }, "\(hung)")
            let lastGood = try #require(all.lastIndex { $0.name.hasPrefix("good") })
            let firstHung = try #require(all.firstIndex { $0.name.hasPrefix("hung") })
            #expect(lastGood < firstHung, "every good endpoint was delivered before the hung lookups timed out")
            #expect(try await h.gateways.received().count == count)
            #expect(resolver.baseLookups <= count + 1, "one lookup per name")
        }
    }
}

// MARK: - The HTTP/2 carrier

@Suite("WebPushSender over the HTTP/2 client", .serialized)
struct WebPushSenderHTTP2Tests {
    @Test("50 concurrent sends to one origin share one HTTP/2 connection (ALPN h2)")
    func oneConnectionPerOrigin() async throws {
        try await withHarness(.http2) { h in
            let http2 = try #require(h.http2)
            // Answers are held for 200 ms, so the streams overlap on the connection.
            try await h.gateways.knobs("webpush", ["delay_ms": 200])
            let msg = message()
            let payload = try WebPushPayload(message: msg, user: "u1")
            let headers = WebPushHeaders(message: msg)
            let results = await withTaskGroup(of: (Outcome, Int?).self) { group in
                for _ in 0..<50 { group.addTask { await h.send(payload, headers) } }
                var all: [(Outcome, Int?)] = []
                for await result in group { all.append(result) }
                return all
            }
            #expect(results.count == 50)
            #expect(results.allSatisfy { $0.0 == .delivered && $0.1 == 201 })

            let records = try await h.gateways.received()
            #expect(records.count == 50)
            #expect(Set(records.compactMap { $0["salt"] as? String }).count == 50, "50 distinct records")
            for record in records {
                expectDelivered(record, payload, headers)
                #expect(record["http_version"] as? String == "h2")
            }
            #expect(Set(records.compactMap { $0["conn"] as? Int }).count == 1)
            let connections = try await h.gateways.connections("webpush")
            try #require(connections.count == 1)
            let connection = connections[0]
            #expect(connection["alpn"] as? String == "h2")
            #expect(connection["requests"] as? Int == 50)
            #expect((connection["peak_open_streams"] as? Int ?? 0) > 1, "the streams were concurrent")
            #expect(connection["stream_violations"] as? Int == 0)
            #expect(connection["closed"] is NSNull)
            #expect(http2.laneCount == 1)
            #expect(http2.stats.connectionsOpened == 1)
            #expect(http2.stats.requestsSent == 50)
            #expect(h.sender.tokens.count == 1)
        }
    }

    @Test("An origin without ALPN h2 is delivered through libcurl over HTTP/1.1 and remembered for the next send")
    func http1OnlyOrigin() async throws {
        try await withHarness(.http2, listener: "webpush_h1") { h in
            let http2 = try #require(h.http2)
            let origin = "https://127.0.0.1:\(h.gateways.webpushH1)"
            #expect(h.gateways.webpushH1 != 0 && h.gateways.webpushH1 != h.gateways.webpush)
            #expect(h.subscription.endpoint == h.endpoint(port: h.gateways.webpushH1))
            #expect(!h.sender.usesHTTP1(origin))
            let msg = message()
            let payload = try WebPushPayload(message: msg, user: "u1")
            let headers = WebPushHeaders(message: msg)

            let (first, firstStatus) = await h.send(payload, headers)
            #expect(first == .delivered)
            #expect(firstStatus == 201)
            #expect(h.sender.usesHTTP1(origin))
            #expect(http2.stats.connectFailures == 1, "one HTTP/2 attempt, refused in ALPN")
            let (second, secondStatus) = await h.send(payload, headers)
            #expect(second == .delivered)
            #expect(secondStatus == 201)

            let records = try await h.gateways.received("webpush_h1")
            try #require(records.count == 2)
            for record in records {
                expectDelivered(record, payload, headers)
                #expect(record["http_version"] as? String == "http/1.1")
                #expect(record["listener"] as? String == "webpush_h1")
            }
            let connections = try await h.gateways.connections("webpush_h1")
            // The HTTP/2 client's attempt, which got no ALPN protocol, and libcurl's HTTP/1.1 connection(s).
            let refused = connections.filter { $0["alpn"] is NSNull }
            let carried = connections.filter { $0["alpn"] as? String == "http/1.1" }
            #expect(refused.count == 1, "the second send did not try HTTP/2 again")
            #expect(refused.allSatisfy { $0["requests"] as? Int == 0 })
            #expect(!carried.isEmpty)
            #expect(carried.reduce(0) { $0 + ($1["requests"] as? Int ?? 0) } == 2)
            #expect(connections.count == refused.count + carried.count)
            #expect(http2.stats.connectFailures == 1)
            #expect(http2.stats.requestsSent == 0)
            #expect(h.sender.usesHTTP1(origin))

            // The memory is per origin: the h2 listener of the same gateway still gets HTTP/2.
            let (other, _) = await h.send(payload, headers, endpoint: h.endpoint(port: h.gateways.webpush))
            #expect(other == .delivered)
            #expect(!h.sender.usesHTTP1("https://127.0.0.1:\(h.gateways.webpush)"))
            #expect(http2.stats.requestsSent == 1)
            let h2Connections = try await h.gateways.connections("webpush").filter {
                $0["listener"] as? String == "webpush"
            }
            #expect(h2Connections.map { $0["alpn"] as? String } == ["h2"])
        }
    }

    @Test("An idle HTTP/2 connection and its lane are retired after the idle timeout; the next send opens a new one")
    func idleRetirement() async throws {
        try await withHarness(.http2, http2IdleTimeout: .seconds(2)) { h in
            let http2 = try #require(h.http2)
            #expect(h.sender.http2IdleTimeout == .seconds(2))
            let msg = message()
            let payload = try WebPushPayload(message: msg, user: "u1")
            let headers = WebPushHeaders(message: msg)
            let (first, _) = await h.send(payload, headers)
            #expect(first == .delivered)
            #expect(http2.laneCount == 1)

            // Well inside the timeout: still open on both sides.
            try await Task.sleep(for: .milliseconds(500))
            #expect(http2.laneCount == 1)
            #expect(http2.stats.connectionsOpen == 1)
            var connections = try await h.gateways.connections("webpush")
            try #require(connections.count == 1)
            #expect(connections[0]["alpn"] as? String == "h2")
            #expect(connections[0]["closed"] is NSNull)

            try await waitUntil("the lane is retired") { http2.laneCount == 0 }
            #expect(http2.stats.connectionsOpen == 0)
            try await waitUntil("the gateway saw the connection close") {
                try await h.gateways.connections("webpush").first?["closed"] is Double
            }

            let (second, status) = await h.send(payload, headers)
            #expect(second == .delivered)
            #expect(status == 201)
            #expect(http2.laneCount == 1)
            #expect(http2.stats.connectionsOpened == 2)
            connections = try await h.gateways.connections("webpush")
            try #require(connections.count == 2)
            #expect(connections[0]["closed"] is Double)
            #expect(connections[1]["alpn"] as? String == "h2")
            #expect(connections[1]["closed"] is NSNull)
            let records = try await h.gateways.received()
            try #require(records.count == 2)
            for record in records { expectDelivered(record, payload, headers) }
            #expect(records[0]["conn"] as? Int == connections[0]["id"] as? Int)
            #expect(records[1]["conn"] as? Int == connections[1]["id"] as? Int)
        }
    }
}

// MARK: - VAPIDTokenCache (no gateway)

private final class ManualClock: WallClock, @unchecked Sendable {
    private let lock = NSLock()
    private var now: Int64
    init(_ now: Int64) { self.now = now }
    func nowMilliseconds() -> Int64 { lock.withLock { now } }
    func advance(seconds: Int64) { lock.withLock { now += seconds * 1000 } }
}

@Suite("VAPIDTokenCache")
struct WebPushVAPIDTokenCacheTests {
    @Test("At most 4,096 tokens: a 4,097th origin evicts the least recently used")
    func bounded() throws {
        let clock = ManualClock(1_700_000_000_000)
        let cache = VAPIDTokenCache(clock: clock)
        let key = try P256PrivateKey.generate()
        func token(_ i: Int) throws -> String {
            try cache.authorization(app: "x", origin: "https://o\(i).example", key: key, subject: "mailto:a@b.c")
        }
        let first = try token(0)
        for i in 1..<4096 { _ = try token(i) }
        #expect(cache.count == 4096)
        #expect(try token(0) == first, "still cached; now the most recently used")
        _ = try token(4096)
        #expect(cache.count == 4096)
        #expect(cache.expiry(app: "x", origin: "https://o1.example") == nil, "the least recently used went")
        #expect(cache.expiry(app: "x", origin: "https://o0.example") != nil)
        #expect(cache.expiry(app: "x", origin: "https://o4096.example") != nil)
        cache.removeAll(app: "x")
        #expect(cache.count == 0)
    }

    @Test("One token per (app, origin), 12 h lifetime, renewed with less than 1 h left")
    func reuseAndRenewal() throws {
        let clock = ManualClock(1_700_000_000_000)
        let cache = VAPIDTokenCache(clock: clock)
        let key = try P256PrivateKey.generate()
        let a = try cache.authorization(app: "x", origin: "https://push.example", key: key, subject: "mailto:a@b.c")
        #expect(a.hasPrefix("vapid t="))
        let firstExpiry: Int64 = 1_700_000_000 + 12 * 3600
        #expect(cache.expiry(app: "x", origin: "https://push.example") == firstExpiry)
        clock.advance(seconds: 11 * 3600)
        #expect(
            try cache.authorization(app: "x", origin: "https://push.example", key: key, subject: "mailto:a@b.c") == a)
        let other = try cache.authorization(
            app: "x", origin: "https://other.example", key: key, subject: "mailto:a@b.c")
        #expect(other != a)
        let otherApp = try cache.authorization(
            app: "y", origin: "https://push.example", key: key, subject: "mailto:a@b.c")
        #expect(otherApp != a)
        #expect(cache.count == 3)
        clock.advance(seconds: 1)  // 59:59 left
        let renewed = try cache.authorization(
            app: "x", origin: "https://push.example", key: key, subject: "mailto:a@b.c")
        #expect(renewed != a)
        let expected: Int64 = 1_700_000_000 + 11 * 3600 + 1 + 12 * 3600
        #expect(cache.expiry(app: "x", origin: "https://push.example") == expected)
    }
}
