import HeraldCore
import HeraldJSON
import Testing

@testable import APNs

@Suite("APNs requests")
struct APNsRequestTests {
    static let settings = APNsAppSettings(topic: "com.example.app", defaultAlertLocKey: "DEFAULT_KEY")

    func build(
        _ message: PushMessage, _ platform: Platform = .apns, user: String = "alice",
        settings: APNsAppSettings = APNsRequestTests.settings
    ) throws(APNsRequestError) -> APNsRequest {
        try APNsRequest(message: message, platform: platform, user: user, settings: settings, now: Fixture.now)
    }

    // MARK: Canonical requests, exact bytes

    @Test("notification: exact headers and body")
    func notificationCanonical() throws {
        let request = try build(Fixture.notification())
        #expect(
            lines(request.headers) == [
                "apns-push-type: alert",
                "apns-topic: com.example.app",
                "apns-priority: 10",
                "apns-expiration: 1700086400",
                "apns-collapse-id: thread-t1",
            ])
        #expect(
            text(request.payload)
                == #"{"aps":{"alert":{"loc-key":"NEW_MESSAGE","loc-args":["Alice"],"title-loc-key":"NEW_TITLE"},"badge":3,"mutable-content":1,"sound":"default"},"thread_id":"t1","message_id":"m9"}"#
        )
        #expect(request.pushType == .alert)
        #expect(request.platform == .apns)
        #expect(request.header("APNS-Topic") == "com.example.app")
        #expect(request.header("authorization") == nil)
    }

    @Test("clear: background push, content-available, badge, priority 5")
    func clearCanonical() throws {
        let message = Fixture.message(.clear, data: [("thread_id", "t1")], badge: 0, collapseKey: "thread-t1")
        let request = try build(message)
        #expect(
            map(request.headers) == [
                "apns-push-type": "background",
                "apns-topic": "com.example.app",
                "apns-priority": "5",
                "apns-expiration": "1700003600",
                "apns-collapse-id": "thread-t1",
            ])
        #expect(text(request.payload) == #"{"aps":{"content-available":1,"badge":0},"thread_id":"t1"}"#)
    }

    @Test("clear without a badge has content-available only")
    func clearWithoutBadge() throws {
        let request = try build(Fixture.message(.clear, data: [("thread_id", "t1")]))
        #expect(text(request.payload) == #"{"aps":{"content-available":1},"thread_id":"t1"}"#)
        #expect(request.header("apns-collapse-id") == nil)
    }

    @Test("call_ring on VoIP: data only, .voip topic, voip push type, expiration 0")
    func voipRingCanonical() throws {
        let message = Fixture.message(
            .callRing, data: [("call_id", "c1"), ("channel_id", "ch7")], badge: 4, collapseKey: "call-c1")
        let request = try build(message, .apnsVoIP)
        #expect(
            lines(request.headers) == [
                "apns-push-type: voip",
                "apns-topic: com.example.app.voip",
                "apns-priority: 10",
                "apns-expiration: 0",
                "apns-collapse-id: call-c1",
            ])
        #expect(text(request.payload) == #"{"aps":{},"call_id":"c1","channel_id":"ch7"}"#)
    }

    @Test("the VoIP topic suffix is added to whatever the app's topic is")
    func voipTopicSuffix() throws {
        let settings = APNsAppSettings(topic: "org.example.Chat")
        let ring = try build(Fixture.message(.callRing), .apnsVoIP, settings: settings)
        let note = try build(Fixture.notification(), .apns, settings: settings)
        #expect(ring.topic == "org.example.Chat.voip")
        #expect(ring.header("apns-topic") == "org.example.Chat.voip")
        #expect(note.topic == "org.example.Chat")
    }

    // MARK: Kind routing

    static let routing: [(PushKind, Platform, APNsPushType?)] = [
        (.notification, .apns, .alert),
        (.clear, .apns, .background),
        (.callRing, .apns, nil),
        (.notification, .apnsVoIP, nil),
        (.clear, .apnsVoIP, nil),
        (.callRing, .apnsVoIP, .voip),
    ]

    @Test("VoIP gets only call_ring; apns never gets call_ring", arguments: routing)
    func routingTable(kind: PushKind, platform: Platform, pushType: APNsPushType?) throws {
        #expect(kind.reaches(platform) == (pushType != nil))
        let message = Fixture.message(kind, data: [("k", "v")])
        if let pushType {
            #expect(try build(message, platform).pushType == pushType)
        } else {
            #expect(throws: APNsRequestError.kindNotRouted(kind: kind, platform: platform)) {
                try build(message, platform)
            }
        }
    }

    @Test("FCM and Web devices are refused", arguments: PushKind.allCases, [Platform.fcm, .web])
    func notAPNs(kind: PushKind, platform: Platform) {
        #expect(throws: APNsRequestError.notAPNs(platform)) {
            try build(Fixture.message(kind), platform)
        }
    }

    // MARK: Badge, alert, data

    @Test("per-user badge wins over the message badge; no badge member when the user has none")
    func perUserBadge() throws {
        let message = Fixture.notification(
            data: [], alert: nil, badge: 5, badgePerUser: ["alice": 2, "carol": 0], collapseKey: nil)
        #expect(try parsed(build(message, user: "alice").payload)["aps"]?["badge"] == 2)
        #expect(try parsed(build(message, user: "carol").payload)["aps"]?["badge"] == 0)
        #expect(try parsed(build(message, user: "bob").payload)["aps"]?["badge"] == 5)

        let perUserOnly = Fixture.notification(data: [], alert: nil, badge: nil, badgePerUser: ["alice": 7])
        #expect(try parsed(build(perUserOnly, user: "alice").payload)["aps"]?["badge"] == 7)
        #expect(try parsed(build(perUserOnly, user: "bob").payload)["aps"]?["badge"] == nil)

        let clear = Fixture.message(.clear)
        var clearPerUser = clear
        clearPerUser.badgePerUser = ["alice": 1]
        #expect(text(try build(clearPerUser).payload) == #"{"aps":{"content-available":1,"badge":1}}"#)
    }

    @Test("loc keys: message keys, then body_loc_key, then the app default; loc-args as given")
    func locKeys() throws {
        let own = try build(Fixture.notification(data: [], alert: PushAlert(locKey: "A", locArgs: ["x", "y"])))
        #expect(
            try sameJSON(
                own.payload,
                [
                    "aps": [
                        "alert": ["loc-key": "A", "loc-args": ["x", "y"]], "badge": 3, "mutable-content": 1,
                        "sound": "default",
                    ]
                ]
            ))

        let bodyOnly = try build(Fixture.notification(data: [], alert: PushAlert(bodyLocKey: "B")))
        #expect(try parsed(bodyOnly.payload)["aps"]?["alert"] == ["loc-key": "B"])

        let defaulted = try build(Fixture.notification(data: [], alert: PushAlert(titleLocKey: "T")))
        #expect(try parsed(defaulted.payload)["aps"]?["alert"] == ["loc-key": "DEFAULT_KEY", "title-loc-key": "T"])

        let noAlert = try build(Fixture.notification(data: [], alert: nil))
        #expect(try parsed(noAlert.payload)["aps"]?["alert"] == ["loc-key": "DEFAULT_KEY"])

        let unicodeArgs = try build(
            Fixture.notification(data: [], alert: PushAlert(locKey: "K", locArgs: ["Zoë", "\u{2028}"])))
        #expect(text(unicodeArgs.payload).contains(#""loc-args":["Zoë","\u2028"]"#))

        let settings = APNsAppSettings(topic: "com.example.app")
        let nothing = try build(Fixture.notification(data: [], alert: nil, badge: nil), settings: settings)
        #expect(text(nothing.payload) == #"{"aps":{"mutable-content":1,"sound":"default"}}"#)
    }

    @Test("data with unicode and U+2028/U+2029 is escaped and round-trips")
    func unicodeData() throws {
        let message = Fixture.notification(
            data: [("ü-key", Fixture.awkward), ("emoji", "🚀")], alert: nil, badge: nil, collapseKey: nil)
        let request = try build(message)
        let body = text(request.payload)
        #expect(body.hasSuffix(#","ü-key":""# + Fixture.awkwardEscaped + #"","emoji":"🚀"}"#))
        #expect(!body.contains("\u{2028}") && !body.contains("\u{2029}"))
        let json = try parsed(request.payload)
        #expect(json["ü-key"] == .string(Fixture.awkward))
        #expect(json["emoji"] == "🚀")
        #expect(json.objectValue?.keys == ["aps", "ü-key", "emoji"])
    }

    @Test("data may not override aps, nor repeat a key")
    func reservedAndDuplicateKeys() {
        #expect(throws: APNsRequestError.reservedDataKey("aps")) {
            try build(Fixture.notification(data: [("aps", "{}")]))
        }
        #expect(throws: APNsRequestError.reservedDataKey("aps")) {
            try build(Fixture.message(.callRing, data: [("aps", "x")]), .apnsVoIP)
        }
        #expect(throws: APNsRequestError.duplicateDataKey("a")) {
            try build(Fixture.notification(data: [("a", "1"), ("b", "2"), ("a", "3")]))
        }
        #expect(APNsRequest.isReservedDataKey("aps"))
        #expect(!APNsRequest.isReservedDataKey("APS"))
        #expect(!APNsRequest.isReservedDataKey("kind"))
    }

    // MARK: Priority and expiration

    @Test(
        "apns-priority: 10 for high, 5 for normal and low, 5 for every background push",
        arguments: [
            (PushKind.notification, Platform.apns, PushPriority.high, 10),
            (.notification, .apns, .normal, 5),
            (.notification, .apns, .low, 5),
            (.clear, .apns, .high, 5),
            (.clear, .apns, .normal, 5),
            (.clear, .apns, .low, 5),
            (.callRing, .apnsVoIP, .high, 10),
            (.callRing, .apnsVoIP, .normal, 5),
            (.callRing, .apnsVoIP, .low, 5),
        ])
    func priorityTable(kind: PushKind, platform: Platform, priority: PushPriority, expected: Int) throws {
        let request = try build(Fixture.message(kind, priority: priority), platform)
        #expect(request.priority == expected)
        #expect(request.header("apns-priority") == String(expected))
    }

    @Test("default priorities per kind: notification 10, clear 5, call_ring 10")
    func defaultPriorities() throws {
        #expect(try build(Fixture.message(.notification)).priority == 10)
        #expect(try build(Fixture.message(.clear)).priority == 5)
        #expect(try build(Fixture.message(.callRing), .apnsVoIP).priority == 10)
    }

    @Test("apns-expiration: now + ttl; 0 for TTL 0 and below; clamped at 28 days")
    func expiration() throws {
        #expect(try build(Fixture.message(.notification)).header("apns-expiration") == "1700086400")
        #expect(try build(Fixture.message(.notification, ttl: 0)).header("apns-expiration") == "0")
        #expect(try build(Fixture.message(.notification, ttl: -30)).expiration == 0)
        #expect(try build(Fixture.message(.clear, ttl: 60)).expiration == Fixture.now + 60)
        #expect(try build(Fixture.message(.callRing), .apnsVoIP).header("apns-expiration") == "0")
        #expect(try build(Fixture.message(.callRing, ttl: 30), .apnsVoIP).expiration == Fixture.now + 30)
        #expect(try build(Fixture.message(.notification, ttl: Int.max)).expiration == Fixture.now + 2_419_200)
    }

    // MARK: Collapse ids

    @Test("collapse ids: short keys as they are, long or unsafe keys hashed to 32 base64url chars")
    func collapseIDs() throws {
        #expect(APNsRequest.collapseID(for: nil) == nil)
        #expect(APNsRequest.collapseID(for: "") == nil)
        #expect(APNsRequest.collapseID(for: "thread-t1") == "thread-t1")

        let exactly64 = String(repeating: "k", count: 64)
        #expect(APNsRequest.collapseID(for: exactly64) == exactly64)
        let spaced = "a b c"
        #expect(APNsRequest.collapseID(for: spaced) == spaced)

        let long = String(repeating: "x", count: 65)
        #expect(APNsRequest.collapseID(for: long) == "lTfF_fEgSC99WNJentWD9SwCtOME6oFN")
        #expect(APNsRequest.collapseID(for: "fil-é") == "Ilr3GI1FKJDs2NDmVFs7LyWwIJW4SpxA")
        for unsafe in [" lead", "trail ", "line\nbreak", "nul\u{0}", "tab\t", "del\u{7F}"] {
            let id = try #require(APNsRequest.collapseID(for: unsafe))
            #expect(id.utf8.count == 32 && isBase64URL(id), "\(unsafe.debugDescription)")
        }
        // Stable, and distinct for distinct keys.
        #expect(APNsRequest.collapseID(for: long) == APNsRequest.collapseID(for: String(repeating: "x", count: 65)))
        #expect(APNsRequest.collapseID(for: long) != APNsRequest.collapseID(for: String(repeating: "x", count: 66)))

        let request = try build(Fixture.notification(collapseKey: long))
        #expect(request.header("apns-collapse-id") == "lTfF_fEgSC99WNJentWD9SwCtOME6oFN")
        let multibyte = String(repeating: "é", count: 32)  // 32 characters, 64 bytes
        #expect(APNsRequest.collapseID(for: multibyte)?.utf8.count == 32)
    }

    // MARK: Size limits

    /// A message whose body is exactly `size` bytes, padded through one data value.
    func sized(_ kind: PushKind, _ platform: Platform, _ size: Int) throws -> PushMessage {
        let base = try build(Fixture.message(kind, data: [("pad", "")]), platform).payload.count
        return Fixture.message(kind, data: [("pad", String(repeating: "a", count: size - base))])
    }

    @Test(
        "body limit: accepted at exactly the limit, refused one byte over",
        arguments: [
            (PushKind.notification, Platform.apns, 4096),
            (.clear, .apns, 4096),
            (.callRing, .apnsVoIP, 5120),
        ])
    func sizeLimits(kind: PushKind, platform: Platform, limit: Int) throws {
        #expect(APNsRequest.payloadLimit(for: platform) == limit)
        let atLimit = try build(sized(kind, platform, limit), platform)
        #expect(atLimit.payload.count == limit)
        let over = try sized(kind, platform, limit + 1)
        let tooLarge = PayloadTooLarge(platform: platform, limit: limit, size: limit + 1)
        #expect(throws: APNsRequestError.payloadTooLarge(tooLarge)) {
            try build(over, platform)
        }
    }

    @Test("a multi-byte character counts by its UTF-8 bytes")
    func sizeCountsBytes() throws {
        let base = try build(Fixture.message(.notification, data: [("pad", "")])).payload.count
        let room = 4096 - base
        // "é" is 2 bytes: room/2 of them fit exactly when room is even.
        let fill = String(repeating: "é", count: room / 2) + String(repeating: "a", count: room % 2)
        #expect(try build(Fixture.message(.notification, data: [("pad", fill)])).payload.count == 4096)
        do {
            _ = try build(Fixture.message(.notification, data: [("pad", fill + "é")]))
            Issue.record("expected payload_too_large")
        } catch {
            guard case .payloadTooLarge(let tooLarge) = error else { throw error }
            #expect(tooLarge.platform == .apns && tooLarge.limit == 4096 && tooLarge.size == 4098)
            #expect(tooLarge.description == "apns payload is 4098 bytes, over the limit of 4096")
        }
    }

    @Test("an escaped U+2028 counts as the six bytes it takes on the wire")
    func sizeCountsEscapes() throws {
        let base = try build(Fixture.message(.notification, data: [("pad", "")])).payload.count
        let room = 4096 - base
        let fill = String(repeating: "\u{2028}", count: room / 6) + String(repeating: "a", count: room % 6)
        #expect(try build(Fixture.message(.notification, data: [("pad", fill)])).payload.count == 4096)
        #expect(throws: APNsRequestError.self) {
            try build(Fixture.message(.notification, data: [("pad", fill + "\u{2029}")]))
        }
    }

    @Test("a ring over 4096 bytes is still fine on VoIP (5120)")
    func voipLimitIsLarger() throws {
        let ring = try sized(.callRing, .apnsVoIP, 5000)
        #expect(try build(ring, .apnsVoIP).payload.count == 5000)
    }
}
