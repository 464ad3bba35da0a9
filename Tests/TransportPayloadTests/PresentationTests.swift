import HeraldCore
import HeraldJSON
import Testing

@testable import APNs
@testable import FCM
@testable import WebPush

/// Graded intrusiveness (interruption level, relevance score, thread id,
/// category, Android channel) and per-device bundle ids, as each transport
/// builds them.
@Suite("Presentation fields and bundle ids per transport")
struct PresentationTests {
    static let apnsSettings = APNsAppSettings(topic: "com.example.app", defaultAlertLocKey: "DEFAULT_KEY")
    static let fcmSettings = FCMAppSettings(channelID: "new_messages", defaultAlertLocKey: "DEFAULT_KEY")

    static func graded(_ kind: PushKind = .notification) -> PushMessage {
        var m = PushMessage(
            kind: kind, data: [("message_id", "m9")], alert: kind == .notification ? PushAlert(locKey: "NEW") : nil)
        m.interruptionLevel = .timeSensitive
        m.relevanceScore = 0.75
        m.threadID = "mailbox-7"
        m.category = "MESSAGE_ACTIONS"
        m.androidChannelID = "important"
        return m
    }

    @Test("APNs: the four members follow sound in aps, exact bytes")
    func apnsExact() throws {
        let r = try APNsRequest(
            message: Self.graded(), platform: .apns, user: "u", settings: Self.apnsSettings, now: Fixture.now)
        #expect(
            text(r.payload)
                == #"{"aps":{"alert":{"loc-key":"NEW"},"mutable-content":1,"sound":"default","interruption-level":"time-sensitive","relevance-score":0.75,"thread-id":"mailbox-7","category":"MESSAGE_ACTIONS"},"message_id":"m9"}"#
        )
        #expect(!text(r.payload).contains("important"), "the Android channel has no APNs field")
    }

    @Test("APNs: each interruption level is spelled as Apple's")
    func levels() throws {
        for level in InterruptionLevel.allCases {
            var m = PushMessage(kind: .notification)
            m.interruptionLevel = level
            let r = try APNsRequest(
                message: m, platform: .apns, user: "u", settings: Self.apnsSettings, now: Fixture.now)
            let aps = try parsed(r.payload)["aps"]
            #expect(aps?["interruption-level"]?.stringValue == level.rawValue)
        }
        #expect(InterruptionLevel.allCases.map(\.rawValue) == ["passive", "active", "time-sensitive", "critical"])
    }

    @Test("APNs: a message without them has none of the members")
    func apnsAbsent() throws {
        let r = try APNsRequest(
            message: PushMessage(kind: .notification), platform: .apns, user: "u", settings: Self.apnsSettings,
            now: Fixture.now)
        for member in ["interruption-level", "relevance-score", "thread-id", "category"] {
            #expect(!text(r.payload).contains(member))
        }
    }

    @Test("APNs: background and VoIP pushes leave them out")
    func apnsOtherKinds() throws {
        let clear = try APNsRequest(
            message: Self.graded(.clear), platform: .apns, user: "u", settings: Self.apnsSettings, now: Fixture.now)
        #expect(text(clear.payload) == #"{"aps":{"content-available":1},"message_id":"m9"}"#)
        let ring = try APNsRequest(
            message: Self.graded(.callRing), platform: .apnsVoIP, user: "u", settings: Self.apnsSettings,
            now: Fixture.now)
        #expect(text(ring.payload) == #"{"aps":{},"message_id":"m9"}"#)
    }

    @Test("APNs: a device's bundle id is its topic; VoIP adds .voip; none: the app's default")
    func topics() throws {
        func topic(_ platform: Platform, _ bundle: String?) throws -> String? {
            let kind: PushKind = platform == .apnsVoIP ? .callRing : .notification
            return try APNsRequest(
                message: PushMessage(kind: kind), platform: platform, user: "u", settings: Self.apnsSettings,
                now: Fixture.now, bundleID: bundle
            ).header("apns-topic")
        }
        #expect(try topic(.apns, nil) == "com.example.app")
        #expect(try topic(.apns, "com.example.app.dev") == "com.example.app.dev")
        #expect(try topic(.apnsVoIP, nil) == "com.example.app.voip")
        #expect(try topic(.apnsVoIP, "com.example.app.dev") == "com.example.app.dev.voip")
    }

    @Test("FCM: android_channel_id replaces the app's channel; nothing else of them is sent")
    func fcmExact() throws {
        let m = try FCMMessage(message: Self.graded(), token: "tok", user: "u", settings: Self.fcmSettings)
        #expect(
            text(m.body)
                == #"{"message":{"token":"tok","data":{"kind":"notification","message_id":"m9"},"android":{"priority":"HIGH","ttl":"86400s","notification":{"channel_id":"important","body_loc_key":"NEW"}}}}"#
        )
        for leaked in ["time-sensitive", "interruption", "0.75", "mailbox-7", "MESSAGE_ACTIONS"] {
            #expect(!text(m.body).contains(leaked), "\(leaked) has no FCM field")
        }
        let plain = try FCMMessage(
            message: PushMessage(kind: .notification), token: "tok", user: "u", settings: Self.fcmSettings)
        #expect(text(plain.body).contains(#""channel_id":"new_messages""#))
    }

    @Test("FCM: the channel override counts towards the payload limit")
    func fcmSize() throws {
        var m = PushMessage(kind: .notification)
        let base = try FCMMessage(message: m, token: "t", user: "u", settings: Self.fcmSettings).payloadSize
        m.androidChannelID = String(repeating: "c", count: 100)
        let bigger = try FCMMessage(message: m, token: "t", user: "u", settings: Self.fcmSettings).payloadSize
        #expect(bigger - base == 100 - "new_messages".utf8.count)
    }

    @Test("Web Push: the record carries none of them")
    func webPush() throws {
        let p = try WebPushPayload(message: Self.graded(), user: "u")
        for leaked in ["time-sensitive", "0.75", "mailbox-7", "MESSAGE_ACTIONS", "important"] {
            #expect(!text(p.plaintext).contains(leaked))
        }
    }
}
