import Foundation
import HeraldTestSupport
import Testing

/// The APNs push types with tokens of their own (issue 32): widget reloads,
/// location queries and PushToTalk pushes go to `apns_widgets`,
/// `apns_location` and `apns_pushtotalk` registrations with Apple's topic,
/// priority, expiration and body, and nothing else goes there. The test
/// gateway refuses what APNs refuses and knows each token's kind.
extension PushDelivery {
    @Suite("widgets, location and pushtotalk: their own tokens, topics and bodies")
    struct OwnKindsTests {
        static let kinds: [(kind: String, platform: String, pushType: String, suffix: String)] = [
            ("widgets", "apns_widgets", "widgets", ".push-type.widgets"),
            ("location", "apns_location", "location", ".location-query"),
            ("pushtotalk", "apns_pushtotalk", "pushtotalk", ".voip-ptt"),
        ]

        @Test("each kind reaches its own tokens with Apple's headers and body; a notification skips them")
        func routing() async throws {
            try await withHarness(transports: ["apns"]) { h in
                let phone = hex(1, prefix: 0x0c1)
                try h.registerAPNs("k", phone)
                var tokens: [String: String] = [:]
                for (i, k) in Self.kinds.enumerated() {
                    let token = hex(10 + i, prefix: 0x0c2)
                    tokens[k.kind] = token
                    // The gateway knows what each token is for, as APNs does.
                    _ = try await h.gateways.post("/control/apns-devices", ["tokens": [token], "kind": k.pushType])
                    // bundle_id with the platform's suffix is the same registration's base id.
                    let r = try h.ok(
                        "device.register",
                        ["user": "k", "platform": k.platform, "token": token, "bundle_id": topic + k.suffix])
                    #expect(r["created"] as? Bool == true)
                }
                _ = try await h.gateways.post("/control/apns-devices", ["tokens": [phone], "kind": "alert"])
                let listed = try h.devices("k")
                #expect(
                    Set(listed.compactMap { $0["platform"] as? String }) == Set(["apns"] + Self.kinds.map(\.platform)))
                #expect(listed.allSatisfy { $0["bundle_id"] as? String == topic }, "\(listed)")

                for k in Self.kinds {
                    try await h.gateways.reset()
                    let data: [String: Any] = k.kind == "widgets" ? [:] : ["data": ["speaker": "zoe"]]
                    let r = try h.sendAndWait(["to": ["users": ["k"]], "kind": k.kind].merging(data) { $1 })
                    #expect(counts(r)["delivered"] == 1, "\(k.kind): \(r)")
                    #expect(r["skipped"] as? Int == 3, "the phone and the two other kinds' tokens: \(r)")
                    let recs = try await h.gateways.received("apns")
                    #expect(recs.count == 1, "\(k.kind): \(recs)")
                    let rec = try #require(recs.first)
                    #expect(rec["valid"] as? Bool == true, "\(k.kind): \(rec)")
                    #expect(rec["token"] as? String == tokens[k.kind])
                    let headers = try #require(rec["headers"] as? [String: String])
                    #expect(headers["apns-push-type"] == k.pushType)
                    #expect(headers["apns-topic"] == topic + k.suffix)
                    #expect(headers["apns-priority"] == "10")
                    let body = try #require(rec["body"] as? [String: Any])
                    switch k.kind {
                    case "widgets":
                        #expect(NSDictionary(dictionary: body) == ["aps": ["content-changed": true]] as NSDictionary)
                    case "pushtotalk":
                        #expect(headers["apns-expiration"] == "0")
                        #expect(body["speaker"] as? String == "zoe")
                        #expect((body["aps"] as? [String: Any])?.isEmpty == true)
                    default:
                        #expect(body["speaker"] as? String == "zoe")
                        #expect(headers["apns-expiration"] != "0", "location keeps its TTL: \(headers)")
                    }
                    let status = try h.status(try #require(r["message_id"] as? String))
                    let skipped = deviceStates(status).filter { $0["state"] as? String == "skipped" }
                    #expect(skipped.allSatisfy { $0["reason"] as? String == "kind_not_for_platform" }, "\(skipped)")
                }

                // A notification goes to the phone only.
                try await h.gateways.reset()
                let n = try h.sendAndWait(["to": ["users": ["k"]], "alert": ["loc_key": "HELLO"]])
                #expect(counts(n)["delivered"] == 1 && n["skipped"] as? Int == 3, "\(n)")
                let recs = try await h.gateways.received("apns")
                #expect(recs.map { $0["token"] as? String } == [phone])

                // A location query asked at normal priority goes at 5.
                try await h.gateways.reset()
                let low = try h.sendAndWait(["to": ["users": ["k"]], "kind": "location", "priority": "normal"])
                #expect(counts(low)["delivered"] == 1, "\(low)")
                let lowHeaders = try await h.gateways.received("apns").first?["headers"] as? [String: String]
                #expect(lowHeaders?["apns-priority"] == "5")
            }
        }

        @Test("what APNs would refuse is refused at push.send with the param named, and nothing is stored")
        func validation() async throws {
            try await withHarness(transports: ["apns", "web"]) { h in
                try h.ok("device.register", ["user": "v", "platform": "apns_pushtotalk", "token": hex(1, prefix: 7)])
                let bad: [([String: Any], String, String)] = [
                    (["kind": "widgets", "data": ["a": "b"]], "data", "carries no data"),
                    (["kind": "widgets", "alert": ["loc_key": "X"]], "alert", "apns_widgets tokens only"),
                    (["kind": "location", "badge": 3], "badge", "apns_location tokens only"),
                    (["kind": "location", "web_payload": ["a": 1]], "web_payload", "never to a Web Push record"),
                    (
                        ["kind": "widgets", "notification": ["title": "t", "navigate": "https://a.example/"]],
                        "notification", "never to a Web Push record"
                    ),
                    (["kind": "pushtotalk", "priority": "normal"], "priority", "priority 10"),
                    (["kind": "pushtotalk", "ttl": 30], "ttl", "must be 0"),
                    (["kind": "pushtotalk", "interruption_level": "active"], "interruption_level", "only for kind"),
                ]
                for (extra, field, reason) in bad {
                    let r = try h.call("push.send", (["to": ["users": ["v"]]] as [String: Any]).merging(extra) { $1 })
                    #expect(r.errorCode == -32602, "\(field): \(r)")
                    #expect(r.errorData?["field"] as? String == field, "\(field): \(r)")
                    #expect((r.errorData?["reason"] as? String)?.contains(reason) == true, "\(field): \(r)")
                }
                // These platforms take a hex token in the legacy form only.
                for platform in ["apns_widgets", "apns_location", "apns_pushtotalk"] {
                    let r = try h.call(
                        "device.register",
                        [
                            "user": "v", "platform": platform, "token": "https://push.example/x",
                            "keys": ["p256dh": "x", "auth": "y"],
                        ])
                    #expect(r.errorCode == -32602, "\(platform): \(r)")
                    let raw = try h.call("device.register", ["user": "v", "platform": platform, "token": "not-hex"])
                    #expect(raw.errorData?["field"] as? String == "token", "\(platform): \(raw)")
                    let bundle = try h.call(
                        "device.register",
                        ["user": "v", "platform": platform, "token": hex(2, prefix: 7), "bundle_id": topic + ".voip"])
                    #expect(bundle.errorData?["field"] as? String == "bundle_id", "\(platform): \(bundle)")
                }
            }
        }
    }
}
