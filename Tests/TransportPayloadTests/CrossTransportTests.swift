import APNs
import FCM
import HeraldCore
import Testing
import WebPush

/// Rules that hold across the three transports.
@Suite("Across transports")
struct CrossTransportTests {
    @Test(
        "priority mapping table",
        arguments: [
            // kind, priority, apns-priority, android.priority, Urgency
            (PushKind.notification, PushPriority.high, 10, FCMAndroidPriority.high, "high"),
            (.notification, .normal, 5, .normal, "normal"),
            (.notification, .low, 5, .normal, "low"),
            (.clear, .high, 5, .normal, "high"),
            (.clear, .normal, 5, .normal, "normal"),
            (.clear, .low, 5, .normal, "low"),
            (.callRing, .high, 10, .high, "high"),
            (.callRing, .normal, 5, .normal, "normal"),
            (.callRing, .low, 5, .normal, "low"),
        ])
    func priorityTable(
        kind: PushKind, priority: PushPriority, apns: Int, fcm: FCMAndroidPriority, urgency: String
    ) throws {
        let message = Fixture.message(kind, priority: priority)
        let platform: Platform = kind == .callRing ? .apnsVoIP : .apns
        let request = try APNsRequest(
            message: message, platform: platform, user: "u", settings: APNsAppSettings(topic: "t"), now: 0)
        #expect(request.header("apns-priority") == String(apns))
        #expect(try FCMMessage(message: message, token: "x", user: "u", settings: FCMAppSettings()).priority == fcm)
        #expect(WebPushHeaders(message: message).field("Urgency") == urgency)
    }

    @Test("kind defaults: TTL and priority reach every transport")
    func kindDefaults() throws {
        for kind in PushKind.allCases where kind.ownPlatform == nil {
            let message = Fixture.message(kind)
            let platform: Platform = kind == .callRing ? .apnsVoIP : .apns
            let request = try APNsRequest(
                message: message, platform: platform, user: "u", settings: APNsAppSettings(topic: "t"), now: 100)
            let ttl = kind.defaultTTLSeconds
            #expect(request.expiration == (ttl == 0 ? 0 : 100 + Int64(ttl)))
            let fcm = try FCMMessage(message: message, token: "x", user: "u", settings: FCMAppSettings())
            #expect(fcm.ttlSeconds == ttl)
            #expect(WebPushHeaders(message: message).field("TTL") == String(ttl))
        }
    }

    @Test(
        "a long collapse key hashes to the same 32 chars on APNs as the Web Push Topic",
        arguments: [
            String(repeating: "thread/", count: 20), "ünïcödé", " padded ", String(repeating: "é", count: 40),
        ])
    func collapseAgreement(key: String) {
        #expect(APNsRequest.collapseID(for: key) == WebPushHeaders.topic(for: key))
    }

    @Test("size errors carry platform, limit and size")
    func sizeErrorShape() {
        let apns = PayloadTooLarge(platform: .apnsVoIP, limit: 5120, size: 5121)
        let fcm = PayloadTooLarge(platform: .fcm, limit: 4096, size: 4100)
        let web = PayloadTooLarge(platform: .web, limit: 2713, size: 2714)
        #expect(apns.description == "apns_voip payload is 5121 bytes, over the limit of 5120")
        #expect(fcm.description == "fcm payload is 4100 bytes, over the limit of 4096")
        #expect(web.description == "web payload is 2714 bytes, over the limit of 2713")
    }

    @Test("a message's own collapse id is its apns-collapse-id and its Topic when it has no collapse key")
    func ownCollapseID() throws {
        var message = Fixture.message(.notification)
        message.collapseID = "AbCdEfGhIjKlMnOpQrStUvWxYz012-_9"
        let request = try APNsRequest(
            message: message, platform: .apns, user: "u", settings: APNsAppSettings(topic: "t"), now: 0)
        #expect(request.collapseID == "AbCdEfGhIjKlMnOpQrStUvWxYz012-_9")
        #expect(WebPushHeaders(message: message).topic == "AbCdEfGhIjKlMnOpQrStUvWxYz012-_9")
        // A collapse key wins over it.
        message.collapseKey = "thread-1"
        #expect(
            try APNsRequest(message: message, platform: .apns, user: "u", settings: APNsAppSettings(topic: "t"), now: 0)
                .collapseID == "thread-1")
        #expect(WebPushHeaders(message: message).topic == WebPushHeaders.topic(for: "thread-1"))
        // Anything but 32 base64url characters is not sent as one.
        message.collapseKey = nil
        for bad in ["short", String(repeating: "a", count: 33), "AbCdEfGhIjKlMnOpQrStUvWxYz012-_ ", ""] {
            message.collapseID = bad
            #expect(message.ownCollapseID == nil)
            #expect(WebPushHeaders(message: message).topic == nil)
        }
    }
}
