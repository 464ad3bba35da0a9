import HeraldCore
import HeraldJSON
import Testing
import WebPush

@Suite("Web Push payloads and headers")
struct WebPushRequestTests {
    func build(_ message: PushMessage, user: String = "alice") throws(WebPushPayloadError) -> WebPushPayload {
        try WebPushPayload(message: message, user: user)
    }

    // MARK: Plaintext

    @Test("notification: exact plaintext and minimal form")
    func notificationCanonical() throws {
        let payload = try build(Fixture.notification())
        #expect(
            text(payload.plaintext) == #"{"kind":"notification","data":{"thread_id":"t1","message_id":"m9"},"badge":3}"#
        )
        #expect(
            text(payload.minimalPlaintext) == #"{"kind":"notification","data":{"thread_id":"t1","message_id":"m9"}}"#)
        #expect(payload.minimalKeepsData)
        #expect(payload.kind == .notification)
        #expect(payload.bodySize == 2816)
        #expect(payload.stepDownBodySize == 2048)
    }

    @Test("clear and call_ring: badge left out when none, data always present", arguments: [PushKind.clear, .callRing])
    func otherKinds(kind: PushKind) throws {
        // A ring's record goes to Web Push-form fcm and apns_voip registrations, not to web.
        #expect(kind == .callRing ? kind.reaches(.fcm, webPushForm: true) : kind.reaches(.web))
        let empty = try build(Fixture.message(kind))
        #expect(text(empty.plaintext) == #"{"kind":"\#(kind.rawValue)","data":{}}"#)
        let withBadge = try build(Fixture.message(kind, data: [("id", "7")], badge: 0))
        #expect(text(withBadge.plaintext) == #"{"kind":"\#(kind.rawValue)","data":{"id":"7"},"badge":0}"#)
        #expect(text(withBadge.minimalPlaintext) == #"{"kind":"\#(kind.rawValue)","data":{"id":"7"}}"#)
    }

    @Test("per-user badge")
    func perUserBadge() throws {
        let message = Fixture.notification(data: [], badge: 4, badgePerUser: ["alice": 1])
        #expect(try parsed(build(message, user: "alice").plaintext)["badge"] == 1)
        #expect(try parsed(build(message, user: "bob").plaintext)["badge"] == 4)
        let perUserOnly = Fixture.notification(data: [], badge: nil, badgePerUser: ["alice": 1])
        #expect(try parsed(build(perUserOnly, user: "bob").plaintext)["badge"] == nil)
    }

    @Test("alert keys are not part of the Web Push plaintext (the service worker renders)")
    func noAlert() throws {
        let json = try parsed(build(Fixture.notification()).plaintext)
        #expect(json.objectValue?.keys == ["kind", "data", "badge"])
    }

    @Test("data with unicode and U+2028 is escaped and round-trips; no reserved keys")
    func unicodeData() throws {
        let payload = try build(
            Fixture.notification(data: [("kind", "inner"), ("ü", Fixture.awkward)], badge: nil))
        #expect(
            text(payload.plaintext) == #"{"kind":"notification","data":{"kind":"inner","ü":""# + Fixture.awkwardEscaped
                + #""}}"#)
        #expect(
            try sameJSON(
                payload.plaintext, ["data": ["ü": .string(Fixture.awkward), "kind": "inner"], "kind": "notification"]))
        #expect(throws: WebPushPayloadError.duplicateDataKey("ü")) {
            try build(Fixture.notification(data: [("ü", "1"), ("ü", "2")]))
        }
    }

    // MARK: Size

    @Test("capacity comes from the sealer: 2816 → 2713, 2048 → 1945, unpadded → 3993")
    func capacity() {
        #expect(WebPushPayload.defaultBodySize == 2816)
        #expect(WebPushPayload.plaintextCapacity(bodySize: 2816) == 2713)
        #expect(WebPushPayload.plaintextCapacity(bodySize: 2048) == 1945)
        #expect(WebPushPayload.plaintextCapacity(bodySize: 0) == 3993)
        #expect(WebPushPayload.plaintextCapacity(bodySize: 4097) == 0)
        #expect(WebPushPayload.plaintextCapacity(bodySize: -1) == 0)
    }

    func sized(_ size: Int, kind: PushKind = .notification, badge: Int? = nil) throws -> PushMessage {
        let base = try build(Fixture.message(kind, data: [("pad", "")], badge: badge)).plaintext.count
        return Fixture.message(kind, data: [("pad", String(repeating: "a", count: size - base))], badge: badge)
    }

    @Test("2713 bytes of plaintext: accepted at exactly the limit, refused one byte over", arguments: PushKind.allCases)
    func sizeLimit(kind: PushKind) throws {
        let atLimit = try build(sized(2713, kind: kind, badge: 12))
        #expect(atLimit.plaintext.count == 2713)
        let tooLarge = PayloadTooLarge(platform: .web, limit: 2713, size: 2714)
        #expect(throws: WebPushPayloadError.payloadTooLarge(tooLarge)) {
            try build(sized(2714, kind: kind, badge: 12))
        }
    }

    @Test("a smaller configured record lowers the limit; a bad body size is refused")
    func configuredBodySize() throws {
        let message = try sized(1945)
        #expect(try WebPushPayload(message: message, user: "u", bodySize: 2048).plaintext.count == 1945)
        var over = message
        over.data = [("pad", over.data[0].value + "a")]
        let tooLarge = PayloadTooLarge(platform: .web, limit: 1945, size: 1946)
        #expect(throws: WebPushPayloadError.payloadTooLarge(tooLarge)) {
            try WebPushPayload(message: over, user: "u", bodySize: 2048)
        }
        #expect(throws: WebPushPayloadError.invalidBodySize(50)) {
            try WebPushPayload(message: message, user: "u", bodySize: 50)
        }
        #expect(throws: WebPushPayloadError.invalidBodySize(5000)) {
            try WebPushPayload(message: message, user: "u", stepDownBodySize: 5000)
        }
    }

    @Test("minimal form keeps data while {kind,data} fits the step-down record, else kind only")
    func minimalForm() throws {
        let base = #"{"kind":"notification","data":{"pad":""}}"#.utf8.count
        func padded(_ size: Int) -> PushMessage {
            Fixture.message(.notification, data: [("pad", String(repeating: "a", count: size - base))], badge: 3)
        }
        let fits = try build(padded(1945))
        #expect(fits.minimalKeepsData)
        #expect(fits.minimalPlaintext.count == 1945)

        let tooBig = try build(padded(1946))
        #expect(!tooBig.minimalKeepsData)
        #expect(text(tooBig.minimalPlaintext) == #"{"kind":"notification"}"#)
        #expect(tooBig.plaintext.count > 1946)

        let ring = try WebPushPayload(
            message: Fixture.message(.callRing, data: [("call_id", "c1")]), user: "u", stepDownBodySize: 104)
        #expect(text(ring.minimalPlaintext) == #"{"kind":"call_ring"}"#)
    }

    // MARK: Headers

    static let topicOfThread = "m8255jqpsbx1fRpeMPgLsmfLJxaKtOM4"

    @Test("notification headers, exact")
    func headersCanonical() {
        let headers = WebPushHeaders(message: Fixture.notification())
        #expect(
            lines(headers.fields) == [
                "TTL: 86400",
                "Urgency: high",
                "Topic: \(Self.topicOfThread)",
                "Content-Encoding: aes128gcm",
                "Content-Type: application/octet-stream",
            ])
        #expect(headers.field("topic") == Self.topicOfThread)
        #expect(headers.field("authorization") == nil)
    }

    @Test("clear and call_ring headers: TTL and Urgency by kind, no Topic without a collapse key")
    func headersByKind() {
        #expect(
            map(WebPushHeaders(message: Fixture.message(.clear)).fields) == [
                "TTL": "3600", "Urgency": "low", "Content-Encoding": "aes128gcm",
                "Content-Type": "application/octet-stream",
            ])
        #expect(
            map(WebPushHeaders(message: Fixture.message(.callRing, collapseKey: "call-1")).fields) == [
                "TTL": "0", "Urgency": "high", "Topic": WebPushHeaders.topic(for: "call-1")!,
                "Content-Encoding": "aes128gcm", "Content-Type": "application/octet-stream",
            ])
        #expect(WebPushHeaders(ttl: 60, priority: .normal, collapseKey: "").field("Topic") == nil)
    }

    @Test("Urgency: high → high, normal → normal, low → low; very-low never", arguments: PushPriority.allCases)
    func urgency(priority: PushPriority) {
        let headers = WebPushHeaders(ttl: 60, priority: priority, collapseKey: nil)
        #expect(headers.field("Urgency") == priority.rawValue)
        #expect(headers.urgency != .veryLow)
    }

    @Test("TTL clamped to 0…2419200")
    func ttl() {
        #expect(WebPushHeaders(ttl: -1, priority: .high, collapseKey: nil).field("TTL") == "0")
        #expect(WebPushHeaders(ttl: 0, priority: .high, collapseKey: nil).field("TTL") == "0")
        #expect(WebPushHeaders(ttl: 2_419_200, priority: .high, collapseKey: nil).field("TTL") == "2419200")
        #expect(WebPushHeaders(ttl: Int.max, priority: .high, collapseKey: nil).ttlSeconds == 2_419_200)
    }

    @Test(
        "Topic: 32 chars of [A-Za-z0-9_-], stable, distinct per key",
        arguments: [
            "thread-t1", "", "a", String(repeating: "x", count: 65), "fil-é", "émoji 🚀 \u{2028}", "line\nbreak",
        ])
    func topicFormat(key: String) throws {
        guard !key.isEmpty else {
            #expect(WebPushHeaders.topic(for: key) == nil)
            return
        }
        let topic = try #require(WebPushHeaders.topic(for: key))
        #expect(topic.utf8.count == 32)
        #expect(isBase64URL(topic))
        #expect(WebPushHeaders.topic(for: key) == topic)
        #expect(WebPushHeaders.topic(for: key + " ") != topic)
    }

    @Test("Topic known values (SHA-256 prefix, base64url)")
    func topicVectors() {
        #expect(WebPushHeaders.topic(for: "thread-t1") == Self.topicOfThread)
        #expect(WebPushHeaders.topic(for: String(repeating: "x", count: 65)) == "lTfF_fEgSC99WNJentWD9SwCtOME6oFN")
        #expect(WebPushHeaders.topic(for: "fil-é") == "Ilr3GI1FKJDs2NDmVFs7LyWwIJW4SpxA")
        #expect(WebPushHeaders.topic(for: nil) == nil)
    }
}
