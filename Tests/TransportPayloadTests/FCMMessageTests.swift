import FCM
import HeraldCore
import HeraldJSON
import Testing

@Suite("FCM v1 messages")
struct FCMMessageTests {
    static let settings = FCMAppSettings(channelID: "new_messages", defaultAlertLocKey: "DEFAULT_KEY")

    func build(
        _ message: PushMessage, user: String = "alice", settings: FCMAppSettings = FCMMessageTests.settings
    ) throws(FCMMessageError) -> FCMMessage {
        try FCMMessage(message: message, token: "tok-1", user: user, settings: settings)
    }

    // MARK: Canonical bodies, exact bytes

    @Test("notification: exact body")
    func notificationCanonical() throws {
        let message = try build(Fixture.notification())
        #expect(
            text(message.body)
                == #"{"message":{"token":"tok-1","data":{"kind":"notification","badge":"3","thread_id":"t1","message_id":"m9"},"android":{"priority":"HIGH","ttl":"86400s","collapse_key":"thread-t1","notification":{"channel_id":"new_messages","title_loc_key":"NEW_TITLE","body_loc_key":"NEW_MESSAGE","body_loc_args":["Alice"]}}}}"#
        )
        #expect(message.priority == .high)
        #expect(message.ttlSeconds == 86_400)
    }

    @Test("clear: data-only, NORMAL, 3600s")
    func clearCanonical() throws {
        let message = try build(Fixture.message(.clear, data: [("thread_id", "t1")], collapseKey: "thread-t1"))
        #expect(
            text(message.body)
                == #"{"message":{"token":"tok-1","data":{"kind":"clear","thread_id":"t1"},"android":{"priority":"NORMAL","ttl":"3600s","collapse_key":"thread-t1"}}}"#
        )
    }

    @Test("call_ring: data-only, HIGH, 0s")
    func callRingCanonical() throws {
        let message = try build(Fixture.message(.callRing, data: [("call_id", "c1")], badge: 2))
        #expect(
            text(message.body)
                == #"{"message":{"token":"tok-1","data":{"kind":"call_ring","badge":"2","call_id":"c1"},"android":{"priority":"HIGH","ttl":"0s"}}}"#
        )
    }

    @Test(
        "every kind but the APNs-only ones reaches FCM (a ring only a Web Push-form registration); only notification has a notification block",
        arguments: PushKind.allCases.filter { $0.ownPlatform == nil })
    func kinds(kind: PushKind) throws {
        #expect(kind.reaches(.fcm, webPushForm: true))
        #expect(kind.reaches(.fcm, webPushForm: false) == (kind != .callRing))
        let json = try parsed(build(Fixture.message(kind, data: [("k", "v")])).body)
        #expect(json["message"]?["data"]?["kind"] == .string(kind.rawValue))
        #expect((json["message"]?["android"]?["notification"] != nil) == (kind == .notification))
        #expect(json["message"]?["notification"] == nil)
    }

    @Test("widgets, location and pushtotalk go to their own APNs tokens only, never to FCM or Web Push")
    func ownKinds() {
        for kind in PushKind.allCases {
            guard let own = kind.ownPlatform else { continue }
            for platform in Platform.allCases {
                // A Live Activity goes to its tokens and to broadcast channels.
                let reached = platform == own || (kind == .liveActivity && platform == .apnsChannel)
                #expect(kind.reaches(platform, webPushForm: false) == reached, "\(kind) \(platform)")
                #expect(!kind.reaches(platform, webPushForm: true), "\(kind) \(platform)")
            }
        }
    }

    // MARK: Badge, alert, data

    @Test("per-user badge as a string; no badge key when the user has none")
    func perUserBadge() throws {
        let message = Fixture.notification(data: [], badge: nil, badgePerUser: ["alice": 12, "bob": 0])
        #expect(try parsed(build(message, user: "alice").body)["message"]?["data"]?["badge"] == "12")
        #expect(try parsed(build(message, user: "bob").body)["message"]?["data"]?["badge"] == "0")
        #expect(try parsed(build(message, user: "carol").body)["message"]?["data"]?["badge"] == nil)
        let both = Fixture.notification(data: [], badge: 9, badgePerUser: ["alice": 1])
        #expect(try parsed(build(both, user: "carol").body)["message"]?["data"]?["badge"] == "9")
    }

    @Test("notification block: body_loc_key from body_loc_key, loc_key, then the app default")
    func notificationBlock() throws {
        func block(_ alert: PushAlert?, settings: FCMAppSettings = FCMMessageTests.settings) throws -> JSON? {
            try parsed(build(Fixture.notification(data: [], alert: alert), settings: settings).body)["message"]?[
                "android"]?["notification"]
        }
        #expect(
            try block(PushAlert(locKey: "L", bodyLocKey: "B"))
                == ["channel_id": "new_messages", "body_loc_key": "B"])
        #expect(try block(PushAlert(locKey: "L")) == ["channel_id": "new_messages", "body_loc_key": "L"])
        #expect(try block(nil) == ["channel_id": "new_messages", "body_loc_key": "DEFAULT_KEY"])
        #expect(
            try block(PushAlert(locArgs: ["a", "b"], titleLocKey: "T"))
                == [
                    "channel_id": "new_messages", "title_loc_key": "T", "body_loc_key": "DEFAULT_KEY",
                    "body_loc_args": ["a", "b"],
                ])
        #expect(try block(nil, settings: FCMAppSettings()) == nil)
        #expect(try block(PushAlert(titleLocKey: "T"), settings: FCMAppSettings()) == ["title_loc_key": "T"])
    }

    @Test("data with unicode and U+2028 is escaped and round-trips; values stay strings")
    func unicodeData() throws {
        let message = try build(
            Fixture.notification(
                data: [("ü", Fixture.awkward), ("n", "42")], alert: nil, badge: nil, collapseKey: nil))
        let body = text(message.body)
        #expect(body.contains(#""ü":""# + Fixture.awkwardEscaped + #"","n":"42""#))
        #expect(!body.contains("\u{2028}"))
        let data = try parsed(message.body)["message"]?["data"]
        #expect(data == ["kind": "notification", "ü": .string(Fixture.awkward), "n": "42"])
    }

    @Test(
        "reserved data keys are refused",
        arguments: [
            "kind", "badge", "from", "message_type", "collapse_key", "google.sent_time", "google", "gcm.n.e", "gcm",
        ])
    func reservedKeys(key: String) {
        #expect(FCMMessage.isReservedDataKey(key))
        #expect(throws: FCMMessageError.reservedDataKey(key)) {
            try build(Fixture.message(.notification, data: [("ok", "1"), (key, "x")]))
        }
    }

    @Test("ordinary keys, aps included, are not reserved")
    func ordinaryKeys() throws {
        for key in ["aps", "thread_id", "Kind", "fromage", "type", "message_id", "data"] {
            #expect(!FCMMessage.isReservedDataKey(key), "\(key)")
        }
        _ = try build(Fixture.message(.notification, data: [("aps", "x"), ("fromage", "brie")]))
        #expect(throws: FCMMessageError.duplicateDataKey("a")) {
            try build(Fixture.message(.clear, data: [("a", "1"), ("a", "1")]))
        }
    }

    // MARK: Priority and TTL

    @Test(
        "android.priority: HIGH for high, NORMAL for normal and low, NORMAL for every clear",
        arguments: [
            (PushKind.notification, PushPriority.high, FCMAndroidPriority.high),
            (.notification, .normal, .normal),
            (.notification, .low, .normal),
            (.clear, .high, .normal),
            (.clear, .normal, .normal),
            (.clear, .low, .normal),
            (.callRing, .high, .high),
            (.callRing, .normal, .normal),
            (.callRing, .low, .normal),
        ])
    func priorityTable(kind: PushKind, priority: PushPriority, expected: FCMAndroidPriority) throws {
        let message = try build(Fixture.message(kind, priority: priority))
        #expect(message.priority == expected)
        #expect(try parsed(message.body)["message"]?["android"]?["priority"] == .string(expected.rawValue))
    }

    @Test("ttl as \"Ns\", clamped to 0…2419200")
    func ttl() throws {
        func ttl(_ seconds: Int?) throws -> JSON? {
            try parsed(build(Fixture.message(.notification, ttl: seconds)).body)["message"]?["android"]?["ttl"]
        }
        #expect(try ttl(nil) == "86400s")
        #expect(try ttl(0) == "0s")
        #expect(try ttl(-5) == "0s")
        #expect(try ttl(2_419_200) == "2419200s")
        #expect(try ttl(2_419_201) == "2419200s")
    }

    @Test("collapse_key goes as it is, long or not; absent when there is none")
    func collapseKey() throws {
        let long = String(repeating: "x", count: 100)
        let json = try parsed(build(Fixture.notification(collapseKey: long)).body)
        #expect(json["message"]?["android"]?["collapse_key"] == .string(long))
        let none = try parsed(build(Fixture.notification(collapseKey: nil)).body)
        #expect(none["message"]?["android"]?["collapse_key"] == nil)
        let empty = try parsed(build(Fixture.notification(collapseKey: "")).body)
        #expect(empty["message"]?["android"]?["collapse_key"] == nil)
    }

    // MARK: Size

    @Test("payloadSize counts data and notification keys and values")
    func measured() throws {
        let message = try build(Fixture.notification())
        let data =
            "kind".count + "notification".count + "badge".count + 1 + "thread_id".count + 2
            + "message_id".count + 2
        let notification =
            "channel_id".count + "new_messages".count + "title_loc_key".count + "NEW_TITLE".count
            + "body_loc_key".count + "NEW_MESSAGE".count + "body_loc_args".count + "Alice".count
        #expect(message.payloadSize == data + notification)

        let ring = try build(Fixture.message(.callRing, data: [("é", "ü")]))
        #expect(ring.payloadSize == 4 + 9 + 2 + 2)
    }

    func sized(_ kind: PushKind, _ size: Int) throws -> PushMessage {
        let base = try build(Fixture.message(kind, data: [("pad", "")])).payloadSize
        // Two-byte characters, so that bytes (not characters) are what is counted.
        let room = size - base
        let pad = String(repeating: "ü", count: room / 2) + String(repeating: "a", count: room % 2)
        return Fixture.message(kind, data: [("pad", pad)])
    }

    @Test("4096 bytes: accepted at exactly the limit, refused one byte over", arguments: PushKind.allCases)
    func sizeLimit(kind: PushKind) throws {
        let atLimit = try build(sized(kind, 4096))
        #expect(atLimit.payloadSize == 4096)
        #expect(atLimit.body.count > 4096)  // the JSON around it is not counted
        let over = try sized(kind, 4097)
        #expect(throws: FCMMessageError.payloadTooLarge(PayloadTooLarge(platform: .fcm, limit: 4096, size: 4097))) {
            try build(over)
        }
    }

    @Test("the notification block counts toward the limit")
    func notificationCounts() throws {
        // At the limit with the app's default loc key (DEFAULT_KEY) ...
        let message = try sized(.notification, 4096)
        #expect(try build(message).payloadSize == 4096)
        // ... and one byte over when the message names a key one byte longer.
        var longer = message
        longer.alert = PushAlert(locKey: "DEFAULT_KEY1")
        #expect(throws: FCMMessageError.payloadTooLarge(PayloadTooLarge(platform: .fcm, limit: 4096, size: 4097))) {
            try build(longer)
        }
        // The same data as a clear has no notification block and fits easily.
        var clear = message
        clear.kind = .clear
        #expect(try build(clear).payloadSize < 4096)
    }
}

@Suite("FCM templates")
struct FCMTemplateTests {
    /// A template made once per message gives each device the body a
    /// whole build would, whatever its token holds.
    @Test func aTemplatesBodyIsTheWholeBuildsForAnyToken() throws {
        let settings = FCMAppSettings(channelID: "c", defaultAlertLocKey: "K")
        let template = try FCMMessage.Template(message: Fixture.notification(), user: "alice", settings: settings)
        for token in [
            "tok-1", "", "a\"b\\c", "line\u{2028}sep\u{2029}", "ü/é:APA91b-_", String(repeating: "x", count: 300),
        ] {
            let whole = try FCMMessage(message: Fixture.notification(), token: token, user: "alice", settings: settings)
            let fromTemplate = FCMMessage(template, token: token)
            #expect(fromTemplate.body == whole.body, "token \(token)")
            #expect(try JSONParser.parse(fromTemplate.body)["message"]?["token"]?.stringValue == token)
            #expect(fromTemplate.ttlSeconds == whole.ttlSeconds && fromTemplate.payloadSize == whole.payloadSize)
        }
    }

    @Test func theSizeIsCheckedOnceForTheTemplate() {
        let m = Fixture.notification(data: [("blob", String(repeating: "b", count: 5000))])
        #expect(throws: FCMMessageError.self) {
            try FCMMessage.Template(message: m, user: "alice", settings: FCMAppSettings())
        }
    }
}
