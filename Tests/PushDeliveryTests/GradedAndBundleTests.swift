import Foundation
import HeraldTestSupport
import Testing

let devTopic = "com.example.app.dev"
let bundleLines = "apns_topics = \(topic), \(devTopic)"

/// Lets the gateways' APNs key push to the development bundle too.
func allowDevBundle(_ g: TestGateways) async throws {
    try await g.post(
        "/control/apns-key",
        [
            "key_id": keyID, "team_id": teamID, "public_key_pem": spkiPEM(ProviderKeys.shared.apns.publicKey),
            "topics": [topic, topic + ".voip", devTopic, devTopic + ".voip"],
        ])
}

/// push.send's graded-intrusiveness params and device.register's bundle_id,
/// through the socket against the test gateways.
extension PushDelivery {
    @Suite("Graded intrusiveness and bundle ids end to end")
    struct GradedAndBundleTests {
        static var graded: [String: Any] {
            [
                "interruption_level": "time-sensitive", "relevance_score": 0.5, "thread_id": "conv-1",
                "category": "MSG", "android_channel_id": "urgent",
            ]
        }

        @Test("the exact JSON at the APNs and FCM gateways; Web Push carries none of the fields")
        func exactJSON() async throws {
            try await withHarness { h in
                let s = try await h.subscription()
                try h.registerAPNs("g", hex(1))
                try h.registerFCM("g", "fcm-g")
                try h.registerWeb("g", s)
                var params = Self.graded
                params["to"] = ["users": ["g"]]
                params["data"] = ["id": "1"]
                let r = try h.sendAndWait(params)
                #expect(counts(r)["delivered"] == 3, "\(r)")

                let apns = try #require(try await h.gateways.received("apns").first)
                #expect(
                    apns["body_text"] as? String
                        == #"{"aps":{"alert":{"loc-key":"NEW_MESSAGE"},"mutable-content":1,"sound":"default","interruption-level":"time-sensitive","relevance-score":0.5,"thread-id":"conv-1","category":"MSG"},"id":"1"}"#
                )
                #expect((apns["headers"] as? [String: String])?["apns-topic"] == topic)
                let fcm = try #require(try await h.gateways.received("fcm", query: "&kind=send").first)
                #expect(
                    fcm["body_text"] as? String
                        == #"{"message":{"token":"fcm-g","data":{"kind":"notification","id":"1"},"android":{"priority":"HIGH","ttl":"86400s","notification":{"channel_id":"urgent","body_loc_key":"NEW_MESSAGE"}}}}"#
                )
                let web = try #require(try await h.gateways.received("webpush").first)
                let plaintext = try #require(web["plaintext"] as? String)
                #expect(plaintext == #"{"kind":"notification","data":{"id":"1"}}"#)

                // Without the params: no aps members, and the app's channel.
                try await h.gateways.reset()
                _ = try h.sendAndWait(["to": ["users": ["g"]], "data": ["id": "2"]])
                let plainAPNs = try #require(try await h.gateways.received("apns").first)
                #expect(
                    plainAPNs["body_text"] as? String
                        == #"{"aps":{"alert":{"loc-key":"NEW_MESSAGE"},"mutable-content":1,"sound":"default"},"id":"2"}"#
                )
                let plainFCM = try #require(try await h.gateways.received("fcm", query: "&kind=send").first)
                #expect((plainFCM["body_text"] as? String)?.contains(#""channel_id":"new_messages""#) == true)
            }
        }

        @Test("each param refused with -32602 naming it; nothing is queued and the connection stays usable")
        func validation() async throws {
            try await withHarness { h in
                try h.registerAPNs("v", hex(1))
                let long = { (n: Int) in String(repeating: "x", count: n) }
                let bad: [(String, Any, String)] = [
                    ("interruption_level", "loud", "must be one of"),
                    ("interruption_level", 1, "must be one of"),
                    ("relevance_score", 1.5, "from 0 to 1"),
                    ("relevance_score", -0.1, "from 0 to 1"),
                    ("relevance_score", "0.5", "from 0 to 1"),
                    ("thread_id", long(129), "at most 128 bytes"),
                    ("thread_id", "", "must not be empty"),
                    ("thread_id", "a\nb", "control characters"),
                    ("category", long(65), "at most 64 bytes"),
                    ("category", 5, "must be a string"),
                    ("android_channel_id", long(129), "at most 128 bytes"),
                    ("android_channel_id", "a\u{7}b", "control characters"),
                ]
                let c = try h.daemon.connect()
                defer { c.close() }
                for (i, (field, value, reason)) in bad.enumerated() {
                    let r = try c.call("push.send", ["to": ["users": ["v"]], field: value])
                    #expect(r.errorCode == -32602, "\(field) = \(value): \(r)")
                    #expect(r.errorData?["field"] as? String == field)
                    #expect((r.errorData?["reason"] as? String)?.contains(reason) == true, "\(field): \(r)")
                }
                // A number with an exponent, even one in range.
                for raw in ["4.9e-324", "1E-1", "1e0"] {
                    try c.send(
                        #"{"jsonrpc":"2.0","id":7,"method":"push.send","params":{"to":{"users":["v"]},"relevance_score":"#
                            + raw + "}}\n")
                    let line = try #require(c.readLine())
                    let r = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
                    #expect(r.errorData?["field"] as? String == "relevance_score", "\(raw): \(r)")
                }
                // Not for kinds that show nothing.
                for kind in ["clear", "call_ring"] {
                    for field in [
                        "interruption_level", "relevance_score", "thread_id", "category", "android_channel_id",
                    ] {
                        let value: Any =
                            field == "interruption_level" ? "passive" : field == "relevance_score" ? 0.5 : "x"
                        let r = try c.call("push.send", ["to": ["users": ["v"]], "kind": kind, field: value])
                        #expect(r.errorData?["field"] as? String == field, "\(kind) \(field): \(r)")
                        #expect(r.errorData?["reason"] as? String == "is only for kind notification")
                    }
                }
                // At the limits they pass, on the same connection; the refused calls sent nothing.
                let limits = try h.sendAndWait([
                    "to": ["users": ["v"]], "thread_id": long(128), "category": long(64),
                    "android_channel_id": long(128), "relevance_score": 0, "interruption_level": "critical",
                ])
                #expect(counts(limits)["delivered"] == 1, "\(limits)")
                let one = try c.call("push.send", ["to": ["users": ["v"]], "relevance_score": 1, "wait": true])
                #expect(one.result != nil, "\(one)")
                let received = try await h.gateways.received("apns")
                #expect(received.count == 2, "only the two accepted sends reached the gateway")
                let aps = (received.first?["body"] as? [String: Any])?["aps"] as? [String: Any] ?? [:]
                #expect(aps["thread-id"] as? String == long(128) && aps["category"] as? String == long(64))
                #expect(aps["interruption-level"] as? String == "critical")
            }
        }

        @Test("a retry after a restart carries the params")
        func retryAfterRestart() async throws {
            try await withHarness { h in
                try h.registerAPNs("r", hex(1))
                try h.registerFCM("r", "fcm-r")
                try await h.gateways.program(
                    "apns", token: hex(1), [["status": 503, "retry_after": 2], ["status": 200]])
                try await h.gateways.program(
                    "fcm", token: "fcm-r", [["error": "UNAVAILABLE", "retry_after": 2], ["status": 200]])
                var params = Self.graded
                params["to"] = ["users": ["r"]]
                let id = try h.ok("push.send", params)["message_id"] as! String
                for _ in 0..<300 {
                    let a = try await h.gateways.received("apns").count
                    let f = try await h.gateways.received("fcm", query: "&kind=send").count
                    if a >= 1 && f >= 1 { break }
                    try await Task.sleep(for: .milliseconds(10))
                }
                // Retry-After: 2 holds both retries past the stop.
                #expect(h.daemon.stop() == 0)
                #expect(try await h.gateways.received("apns").count == 1, "stopped before the retry")
                try h.daemon.start()
                let s = try await h.waitComplete(id)
                #expect(counts(s)["delivered"] == 2, "\(s)")
                let apns = try await h.gateways.received("apns")
                #expect(apns.count == 2)
                for rec in apns {
                    let aps = (rec["body"] as? [String: Any])?["aps"] as? [String: Any] ?? [:]
                    #expect(aps["interruption-level"] as? String == "time-sensitive", "\(rec)")
                    #expect(aps["relevance-score"] as? Double == 0.5)
                    #expect(aps["thread-id"] as? String == "conv-1")
                    #expect(aps["category"] as? String == "MSG")
                }
                let fcm = try await h.gateways.received("fcm", query: "&kind=send")
                #expect(fcm.count == 2)
                for rec in fcm {
                    let notification =
                        (((rec["body"] as? [String: Any])?["message"] as? [String: Any])?["android"]
                        as? [String: Any])?["notification"] as? [String: Any] ?? [:]
                    #expect(notification["channel_id"] as? String == "urgent", "\(rec)")
                }
            }
        }

        @Test("devices on two bundles: one send reaches both, each with its own apns-topic; VoIP adds .voip")
        func twoBundles() async throws {
            try await withHarness(appLines: bundleLines) { h in
                try await allowDevBundle(h.gateways)
                func register(_ token: String, _ platform: String, _ bundle: String?) throws -> [String: Any] {
                    var p: [String: Any] = ["user": "b", "platform": platform, "token": token]
                    if let bundle { p["bundle_id"] = bundle }
                    return try h.call("device.register", p)
                }
                #expect(try register(hex(1), "apns", topic).result != nil)
                #expect(try register(hex(2), "apns", devTopic).result != nil)
                #expect(try register(hex(3), "apns", nil).result != nil)
                // A VoIP device may name the bundle id or its VoIP topic.
                #expect(try register(hex(4), "apns_voip", devTopic + ".voip").result != nil)
                #expect(try register(hex(5), "apns_voip", devTopic).result != nil)

                let r = try h.sendAndWait(["to": ["users": ["b"]]])
                #expect(counts(r)["delivered"] == 3, "\(r)")
                var topics: [String: String] = [:]
                for rec in try await h.gateways.received("apns") {
                    topics[rec["token"] as? String ?? ""] = (rec["headers"] as? [String: String])?["apns-topic"]
                }
                #expect(topics == [hex(1): topic, hex(2): devTopic, hex(3): topic])
                // One connection and one provider token serve every bundle id.
                let open = try await h.gateways.connections("apns").filter {
                    $0["closed"] is NSNull && ($0["requests"] as? Int ?? 0) > 0
                }
                #expect(open.count == 1, "\(open)")
                #expect(open.first?["distinct_jwts"] as? Int == 1)

                try await h.gateways.reset()
                let ring = try h.sendAndWait(["to": ["users": ["b"]], "kind": "call_ring"])
                #expect(counts(ring)["delivered"] == 2, "\(ring)")
                let voipTopics = Set(
                    try await h.gateways.received("apns").compactMap {
                        ($0["headers"] as? [String: String])?["apns-topic"]
                    })
                #expect(voipTopics == [devTopic + ".voip"])

                let listed = try h.devices("b")
                let bundles = listed.compactMap { $0["bundle_id"] as? String }.sorted()
                #expect(bundles == [topic, topic, devTopic, devTopic, devTopic], "\(listed)")
            }
        }

        @Test("a bundle_id not listed, or on FCM or Web Push, is refused with -32602 and nothing is stored")
        func badBundle() async throws {
            try await withHarness(appLines: bundleLines) { h in
                let cases: [([String: Any], String)] = [
                    (["platform": "apns", "token": hex(1), "bundle_id": "com.other.app"], "must be one of"),
                    (["platform": "apns", "token": hex(1), "bundle_id": devTopic + ".voip"], "must be one of"),
                    (["platform": "apns_voip", "token": hex(1), "bundle_id": "com.other.app.voip"], "must be one of"),
                    (["platform": "apns", "token": hex(1), "bundle_id": ""], "must not be empty"),
                    (["platform": "fcm", "token": "f1", "bundle_id": topic], "is only for the APNs platforms"),
                ]
                for (params, reason) in cases {
                    var p = params
                    p["user"] = "x"
                    let r = try h.call("device.register", p)
                    #expect(r.errorCode == -32602, "\(p): \(r)")
                    #expect(r.errorData?["field"] as? String == "bundle_id")
                    #expect((r.errorData?["reason"] as? String)?.contains(reason) == true, "\(p): \(r)")
                }
                #expect(try h.devices("x").isEmpty)
                let listed = try h.call(
                    "device.register", ["user": "x", "platform": "apns", "token": hex(1), "bundle_id": "nope"])
                #expect((listed.errorData?["reason"] as? String)?.contains("\(topic), \(devTopic)") == true)
            }
        }

        @Test("an app with one apns_topic takes that bundle id and no other; FCM and web devices list null")
        func singleTopic() async throws {
            try await withHarness { h in
                let s = try await h.subscription()
                #expect(
                    try h.call(
                        "device.register", ["user": "o", "platform": "apns", "token": hex(1), "bundle_id": topic]
                    ).result != nil)
                let r = try h.call(
                    "device.register", ["user": "o", "platform": "apns", "token": hex(2), "bundle_id": devTopic])
                #expect(r.errorData?["field"] as? String == "bundle_id")
                try h.registerFCM("o", "fcm-o")
                try h.registerWeb("o", s)
                let listed = try h.devices("o")
                #expect(listed.count == 3)
                for d in listed {
                    let expected: String? = (d["platform"] as? String) == "apns" ? topic : nil
                    #expect(d["bundle_id"] as? String == expected, "\(d)")
                    #expect(d.keys.contains("bundle_id"))
                }
            }
        }

        @Test("herald register --bundle-id and herald send with the graded options")
        func commandLine() async throws {
            try await withHarness(appLines: bundleLines) { h in
                try await allowDevBundle(h.gateways)
                let socket = ["--socket", h.daemon.socketPath]
                let (rs, _, rerr) = try runHerald(
                    ["register", "--user", "c", "--platform", "apns", "--token", hex(1), "--bundle-id", devTopic]
                        + socket)
                #expect(rs == 0, "\(rerr)")
                let (ss, sout, serr) = try runHerald(
                    [
                        "send", "--user", "c", "--interruption-level", "passive", "--relevance-score", "0.25",
                        "--thread-id", "t", "--category", "C", "--android-channel-id", "ch", "--wait",
                    ] + socket)
                #expect(ss == 0, "\(serr)")
                let r = try JSONSerialization.jsonObject(with: Data(sout.utf8)) as? [String: Any] ?? [:]
                #expect(counts(r)["delivered"] == 1, "\(sout)")
                let rec = try #require(try await h.gateways.received("apns").first)
                #expect((rec["headers"] as? [String: String])?["apns-topic"] == devTopic)
                let aps = (rec["body"] as? [String: Any])?["aps"] as? [String: Any] ?? [:]
                #expect(aps["interruption-level"] as? String == "passive" && aps["relevance-score"] as? Double == 0.25)
                #expect(aps["thread-id"] as? String == "t" && aps["category"] as? String == "C")
                let (bs, _, berr) = try runHerald(["send", "--user", "c", "--relevance-score", "2"] + socket)
                #expect(bs != 0 && berr.contains("--relevance-score"), "\(berr)")
            }
        }

        @Test("a reload that adds apns_topics: the new bundle id is taken for registrations and sends")
        func reloadAddsBundle() async throws {
            try await withHarness { h in
                try await allowDevBundle(h.gateways)
                let params: [String: Any] = [
                    "user": "l", "platform": "apns", "token": hex(2), "bundle_id": devTopic,
                ]
                #expect(try h.call("device.register", params).errorData?["field"] as? String == "bundle_id")
                try ReloadTests.reload(h, count: 1) {
                    $0.replacingOccurrences(of: "device_cap = 20", with: "device_cap = 20\n\(bundleLines)")
                }
                #expect(try h.call("device.register", params).result != nil)
                try h.registerAPNs("l", hex(1))
                let r = try h.sendAndWait(["to": ["users": ["l"]]])
                #expect(counts(r)["delivered"] == 2, "\(r)")
                var topics: [String: String] = [:]
                for rec in try await h.gateways.received("apns") {
                    topics[rec["token"] as? String ?? ""] = (rec["headers"] as? [String: String])?["apns-topic"]
                }
                #expect(topics == [hex(1): topic, hex(2): devTopic])
            }
        }
    }
}
