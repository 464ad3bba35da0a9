import Foundation
import HeraldTestSupport
import HTTPClient
import HeraldCore
import HeraldCrypto
import HeraldDelivery
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

private struct Subscription {
    let id: String
    let endpoint: String
    let p256dh: String
    let auth: String
}

private struct Harness {
    let gateways: TestGateways
    let client: HTTPClient
    let sender: WebPushSender
    let subscription: Subscription
}

private func withHarness(
    allowPrivate: Bool = true, _ body: (Harness) async throws -> Void
) async throws {
    let g = try await TestGateways()
    defer { g.stop() }
    let key = try P256PrivateKey.generate()
    _ = try await g.call("POST", "/control/webpush-vapid-key", ["public_key": key.publicKeyBase64URL])
    let sub = try await g.call("POST", "/control/webpush-subscription", [:])
    let subscription = Subscription(
        id: sub["id"] as? String ?? "", endpoint: sub["endpoint"] as? String ?? "",
        p256dh: sub["p256dh"] as? String ?? "", auth: sub["auth"] as? String ?? "")
    let client = try HTTPClient(configuration: .init(caFile: g.ca))
    defer { client.shutdown() }
    let sender = WebPushSender(
        guard: EndpointGuard(allowPrivate: allowPrivate), client: client, vapidKey: key,
        subject: "mailto:ops@example.com", app: "app1", clock: SystemClock())
    try await body(Harness(gateways: g, client: client, sender: sender, subscription: subscription))
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
}

private func header(_ record: [String: Any], _ name: String) -> String? {
    (record["headers"] as? [String: Any])?[name] as? String
}

private func vapidT(_ authorization: String?) -> String? {
    guard let authorization, let range = authorization.range(of: "t=") else { return nil }
    return String(authorization[range.upperBound...].prefix { $0 != "," && $0 != " " })
}

// MARK: - Tests

@Suite("WebPushSender against the Web Push test gateway", .serialized)
struct WebPushSenderTests {
    @Test("A send is delivered: plaintext, 2816-byte body, TTL/Urgency/Topic, one VAPID token per origin")
    func delivered() async throws {
        try await withHarness { h in
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
            for record in records {
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
            let tokens = records.map { vapidT(header($0, "authorization")) }
            #expect(tokens[0] != nil)
            #expect(tokens[0] == tokens[1])
            #expect(h.sender.tokens.count == 1)
        }
    }

    @Test("No Topic header without a collapse key")
    func noTopic() async throws {
        try await withHarness { h in
            let msg = message(collapseKey: nil)
            let (outcome, _) = await h.send(try WebPushPayload(message: msg, user: "u1"), WebPushHeaders(message: msg))
            #expect(outcome == .delivered)
            let records = try await h.gateways.received()
            try #require(records.count == 1)
            #expect(header(records[0], "topic") == nil)
        }
    }

    @Test("410 and 404 are stale; 429 with Retry-After is a retry")
    func errorStatuses() async throws {
        try await withHarness { h in
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
        }
    }

    @Test("One 413: the sender steps down to a 2048-byte record and delivers")
    func stepDown() async throws {
        try await withHarness { h in
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
            #expect(records[1]["plaintext"] as? String == String(decoding: payload.minimalPlaintext, as: UTF8.self))
        }
    }

    @Test("Two 413s: failed with PayloadTooLarge, no third request")
    func stepDownFails() async throws {
        try await withHarness { h in
            let msg = message()
            try await h.gateways.program(h.subscription.id, [["status": 413]])
            let (outcome, status) = await h.send(try WebPushPayload(message: msg, user: "u1"), WebPushHeaders(message: msg))
            #expect(outcome == .failed(reason: .payloadTooLarge))
            #expect(status == 413)
            #expect(try await h.gateways.received().count == 2)
        }
    }

    @Test("A loopback endpoint under a strict guard fails without any request")
    func guardRefuses() async throws {
        try await withHarness(allowPrivate: false) { h in
            let msg = message()
            let endpoint = h.subscription.endpoint
            #expect(endpoint.hasPrefix("https://127.0.0.1:"))
            let (outcome, status) = await h.send(
                try WebPushPayload(message: msg, user: "u1"), WebPushHeaders(message: msg), endpoint: endpoint)
            guard case .failed = outcome else {
                Issue.record("expected failed, got \(outcome)")
                return
            }
            #expect(status == nil)
            #expect(try await h.gateways.received().isEmpty)
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
        #expect(try cache.authorization(app: "x", origin: "https://push.example", key: key, subject: "mailto:a@b.c") == a)
        let other = try cache.authorization(app: "x", origin: "https://other.example", key: key, subject: "mailto:a@b.c")
        #expect(other != a)
        let otherApp = try cache.authorization(app: "y", origin: "https://push.example", key: key, subject: "mailto:a@b.c")
        #expect(otherApp != a)
        #expect(cache.count == 3)
        clock.advance(seconds: 1)  // 59:59 left
        let renewed = try cache.authorization(app: "x", origin: "https://push.example", key: key, subject: "mailto:a@b.c")
        #expect(renewed != a)
        let expected: Int64 = 1_700_000_000 + 11 * 3600 + 1 + 12 * 3600
        #expect(cache.expiry(app: "x", origin: "https://push.example") == expected)
    }
}
