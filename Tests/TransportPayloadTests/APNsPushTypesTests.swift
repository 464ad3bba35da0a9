import APNs
import HeraldCore
import HeraldJSON
import Testing

/// The APNs push types with tokens of their own (issue 32): each kind's
/// topic suffix, priority, expiration and exact body.
@Suite("APNs widgets, location, pushtotalk and liveactivity requests")
struct APNsPushTypesTests {
    static let settings = APNsAppSettings(topic: "com.example.app")

    func build(_ m: PushMessage, _ platform: Platform) throws -> APNsRequest {
        try APNsRequest(message: m, platform: platform, user: "u", settings: Self.settings, now: Fixture.now)
    }

    @Test("widgets: exactly {aps: {content-changed: true}}, data left out, topic .push-type.widgets")
    func widgets() throws {
        let r = try build(Fixture.message(.widgets, data: [("a", "b")]), .apnsWidgets)
        #expect(text(r.payload) == #"{"aps":{"content-changed":true}}"#)
        let h = map(r.headers)
        #expect(h["apns-push-type"] == "widgets" && h["apns-topic"] == "com.example.app.push-type.widgets")
        #expect(h["apns-priority"] == "10" && h["apns-expiration"] == String(Fixture.now + 3600))
    }

    @Test("location: data at the top, priority follows the message, topic .location-query")
    func location() throws {
        let r = try build(Fixture.message(.location, data: [("q", "1")], priority: .normal), .apnsLocation)
        #expect(text(r.payload) == #"{"aps":{},"q":"1"}"#)
        let h = map(r.headers)
        #expect(h["apns-push-type"] == "location" && h["apns-topic"] == "com.example.app.location-query")
        #expect(h["apns-priority"] == "5" && h["apns-expiration"] == String(Fixture.now + 60))
    }

    @Test("pushtotalk: always priority 10 and expiration 0, topic .voip-ptt")
    func pushToTalk() throws {
        let r = try build(
            Fixture.message(.pushToTalk, data: [("speaker", "zoe")], priority: .low, ttl: 30), .apnsPushToTalk)
        #expect(text(r.payload) == #"{"aps":{},"speaker":"zoe"}"#)
        let h = map(r.headers)
        #expect(h["apns-push-type"] == "pushtotalk" && h["apns-topic"] == "com.example.app.voip-ptt")
        #expect(h["apns-priority"] == "10" && h["apns-expiration"] == "0")
    }

    @Test("liveactivity: the event's aps members in Apple's order, a localised alert, no collapse id")
    func liveActivity() throws {
        var start = Fixture.message(.liveActivity, collapseKey: nil)
        start.alert = PushAlert(locKey: "STARTED", locArgs: ["7"], titleLocKey: "TITLE")
        start.liveActivity = LiveActivity(
            event: .start, activityID: "ride-7", attributesType: "RideAttributes", attributes: #"{"driver":"Zoë"}"#,
            contentState: #"{"eta":9}"#, timestamp: 1_800_000_000, staleDate: 1_800_000_600)
        start.collapseID = "own-collapse-id-that-is-not-sent"
        let r = try build(start, .apnsLiveActivity)
        #expect(
            text(r.payload)
                == #"{"aps":{"timestamp":1800000000,"event":"start","content-state":{"eta":9},"stale-date":1800000600,"alert":{"title":{"loc-key":"TITLE"},"body":{"loc-key":"STARTED","loc-args":["7"]},"sound":"default"},"attributes-type":"RideAttributes","attributes":{"driver":"Zoë"},"input-push-token":1}}"#
        )
        let h = map(r.headers)
        #expect(h["apns-push-type"] == "liveactivity" && h["apns-topic"] == "com.example.app.push-type.liveactivity")
        #expect(h["apns-priority"] == "5" && h["apns-collapse-id"] == nil)

        var end = Fixture.message(.liveActivity, priority: .high)
        var activity = LiveActivity(
            event: .end, activityID: "ride-7", timestamp: 1_800_000_900, dismissalDate: 1_800_001_000)
        activity.relevanceScore = 100
        end.liveActivity = activity
        end.collapseKey = activity.supersedeKey
        let e = try build(end, .apnsLiveActivity)
        #expect(
            text(e.payload)
                == #"{"aps":{"timestamp":1800000900,"event":"end","dismissal-date":1800001000,"relevance-score":100.0}}"#
        )
        #expect(map(e.headers)["apns-priority"] == "10" && map(e.headers)["apns-collapse-id"] == nil)
        #expect(activity.supersedeKey == "herald-activity:ride-7")
        #expect(LiveActivity(event: .start, activityID: "x", timestamp: 0).supersedeKey == nil)
    }

    @Test("each kind goes to its own platform only: another pairing is not built")
    func routing() {
        for kind in [PushKind.widgets, .location, .pushToTalk, .liveActivity] {
            for platform in Platform.allCases where platform.isAPNs && platform != kind.ownPlatform {
                #expect(throws: APNsRequestError.kindNotRouted(kind: kind, platform: platform)) {
                    _ = try build(Fixture.message(kind), platform)
                }
            }
        }
    }
}
