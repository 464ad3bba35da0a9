import Foundation
import HeraldTestSupport
import Testing

/// Declarative Web Push (issue 32): the `notification` shorthand builds the
/// `{"web_push": 8030, …}` record Safari shows without a service worker; a
/// declarative `web_payload` is checked at `push.send`; shrink steps keep
/// it in its form; APNs devices of the same message stay content-free.
extension PushDelivery {
    @Suite("Declarative Web Push: the notification shorthand, its checks and its shrinking")
    struct DeclarativeWebPushTests {
        @Test("one message: Web Push records carry the declarative form, an APNs device its own content-free body")
        func shorthandEndToEnd() async throws {
            try await withHarness(transports: ["apns", "web"]) { h in
                let safari = try await h.subscription()
                let chrome = try await h.subscription()
                try h.registerWeb("d", safari)
                try h.registerWeb("d", chrome)
                try h.registerAPNs("d", hex(1, prefix: 0xd1))
                let r = try h.sendAndWait([
                    "to": ["users": ["d"]], "data": ["channel_id": "c-7", "message_id": "m-9"],
                    "notification": [
                        "title": "Zoë in #design", "body": "the whole message text",
                        "navigate": "https://chat.example/c/c-7#m-9", "lang": "en", "app_badge": 3, "mutable": true,
                    ],
                ])
                #expect(counts(r)["delivered"] == 3, "\(r)")
                let records = try await h.gateways.received("webpush")
                #expect(records.count == 2)
                for rec in records {
                    let json = try #require(rec["plaintext_json"] as? [String: Any], "\(rec)")
                    #expect(json["web_push"] as? Int == 8030)
                    let n = try #require(json["notification"] as? [String: Any])
                    #expect(n["title"] as? String == "Zoë in #design")
                    #expect(n["navigate"] as? String == "https://chat.example/c/c-7#m-9")
                    #expect(n["body"] as? String == "the whole message text")
                    #expect(n["lang"] as? String == "en")
                    #expect(n["app_badge"] as? Int == 3)
                    #expect(n["mutable"] as? Bool == true)
                    #expect(n["data"] as? [String: String] == ["channel_id": "c-7", "message_id": "m-9"])
                    #expect(Set(json.keys) == ["web_push", "notification"])
                }
                // The APNs body has nothing of the notification's text.
                let apns = try #require(try await h.gateways.received("apns").last)
                let body = try #require(apns["body"] as? [String: Any], "\(apns)")
                #expect(body["channel_id"] as? String == "c-7")
                #expect(!"\(body)".contains("Zoë") && !"\(body)".contains("message text"))
            }
        }

        @Test("a declarative payload too big for a record is shortened where the steps say; title and navigate stay")
        func shrinking() async throws {
            try await withHarness(transports: ["web"]) { h in
                let s = try await h.subscription()
                try h.registerWeb("k", s)
                let r = try h.sendAndWait([
                    "to": ["users": ["k"]],
                    "web_payload": [
                        "web_push": 8030,
                        "notification": [
                            "title": "Long read", "navigate": "https://news.example/a/1",
                            "body": String(repeating: "word ", count: 1000),
                        ],
                        "extra": ["kept": "as given"],
                    ],
                    "shrink": [["shorten": "/notification/body"]],
                ])
                #expect(counts(r)["delivered"] == 1, "\(r)")
                let rec = try #require(try await h.gateways.received("webpush").last)
                let json = try #require(rec["plaintext_json"] as? [String: Any], "\(rec)")
                let n = try #require(json["notification"] as? [String: Any])
                #expect(n["title"] as? String == "Long read")
                #expect(n["navigate"] as? String == "https://news.example/a/1")
                let body = try #require(n["body"] as? String)
                #expect(body.hasSuffix("…") && body.utf8.count < 2713)
                #expect(
                    (json["extra"] as? [String: String]) == ["kept": "as given"], "unknown members pass as they are")
                let status = try h.status(try #require(r["message_id"] as? String))
                #expect(deviceStates(status).first?["shrunk"] as? Int == 0)
            }
        }

        @Test(
            "a declarative payload WebKit would drop, and a shrink step that would break one, are refused at the field")
        func validation() async throws {
            try await withHarness(transports: ["web"]) { h in
                let s = try await h.subscription()
                try h.registerWeb("v", s)
                let good: [String: Any] = ["title": "t", "navigate": "https://a.example/x"]
                func declarative(_ n: Any, marker: Any = 8030) -> [String: Any] {
                    ["web_payload": ["web_push": marker, "notification": n]]
                }
                func with(_ change: [String: Any]) -> [String: Any] { good.merging(change) { $1 } }
                let bad: [([String: Any], String, String)] = [
                    (declarative(good, marker: 8031), "web_payload.web_push", "must be 8030"),
                    (declarative(good, marker: "8030"), "web_payload.web_push", "must be 8030"),
                    (["web_payload": ["web_push": 8030]], "web_payload.notification", "is required"),
                    (declarative("t"), "web_payload.notification", "is required"),
                    (declarative(["navigate": "https://a.example/"]), "web_payload.notification.title", "is required"),
                    (declarative(with(["title": ""])), "web_payload.notification.title", "must not be empty"),
                    (declarative(["title": "t"]), "web_payload.notification.navigate", "is required"),
                    (
                        declarative(with(["navigate": "http://a.example/"])), "web_payload.notification.navigate",
                        "absolute https URL"
                    ),
                    (declarative(with(["navigate": "/inbox"])), "web_payload.notification.navigate", "absolute https"),
                    (
                        declarative(with(["navigate": "https://a.example/a b"])), "web_payload.notification.navigate",
                        "without spaces"
                    ),
                    (declarative(with(["dir": "up"])), "web_payload.notification.dir", "must be one of"),
                    (declarative(with(["silent": "yes"])), "web_payload.notification.silent", "must be a boolean"),
                    (declarative(with(["mutable": 1])), "web_payload.notification.mutable", "must be a boolean"),
                    (declarative(with(["app_badge": 0])), "web_payload.notification.app_badge", "from 1"),
                    (declarative(with(["app_badge": "3a"])), "web_payload.notification.app_badge", "digits"),
                    (declarative(with(["body": 5])), "web_payload.notification.body", "must be a string"),
                    (
                        declarative(with(["icon": "file:///etc/passwd"])), "web_payload.notification.icon",
                        "absolute https URL"
                    ),
                    (
                        ["web_payload": ["a": 1], "notification": good], "notification",
                        "give web_payload or notification, not both"
                    ),
                    (
                        ["notification": good, "shrink": [["drop": ["/notification/navigate"]]]], "shrink[0].drop",
                        "out of its form"
                    ),
                    (
                        ["notification": good, "shrink": [["drop": ["/notification"]]]], "shrink[0].drop",
                        "out of its form"
                    ),
                    (
                        ["notification": good, "shrink": [["shorten": "/notification/title"]]], "shrink[0].shorten",
                        "out of its form"
                    ),
                    (
                        ["notification": good, "shrink": [["keep": ["/web_push", "/notification/title"]]]],
                        "shrink[0].keep", "out of its form"
                    ),
                    (["notification": ["title": "t"]], "notification.navigate", "is required"),
                    (["notification": ["navigate": "https://a.example/"]], "notification.title", "is required"),
                    (["notification": with(["navigate": "ftp://a.example/"])], "notification.navigate", "https URL"),
                    (["notification": with(["app_badge": -1])], "notification.app_badge", "between 0"),
                    (["notification": with(["dir": "down"])], "notification.dir", "must be one of"),
                    (["notification": with(["image": "https://a.example/i.png"])], "notification.image", "unknown"),
                ]
                let c = try h.daemon.connect()
                defer { c.close() }
                for (extra, field, reason) in bad {
                    var p: [String: Any] = ["to": ["users": ["v"]]]
                    p.merge(extra) { $1 }
                    let r = try c.call("push.send", p)
                    #expect(r.errorCode == -32602, "\(field): \(r)")
                    #expect(r.errorData?["field"] as? String == field, "\(field): \(r)")
                    #expect((r.errorData?["reason"] as? String)?.contains(reason) == true, "\(field): \(r)")
                }
                // Steps that keep the form are fine; nothing above was stored.
                let fine = try c.call(
                    "push.send",
                    [
                        "to": ["users": ["v"]], "notification": with(["app_badge": 0, "body": "b"]),
                        "shrink": [
                            ["shorten": "/notification/body"], ["keep": ["/web_push", "/notification"]],
                            ["keep": ["/web_push", "/notification/title", "/notification/navigate"]],
                        ],
                    ])
                #expect(fine.result?["devices"] as? Int == 1, "\(fine)")
                let id = try #require(fine.result?["message_id"] as? String)
                #expect(try await h.waitComplete(id)["state"] as? String == "complete")
                let rec = try #require(try await h.gateways.received("webpush").last)
                let n = (rec["plaintext_json"] as? [String: Any])?["notification"] as? [String: Any]
                #expect(n?["app_badge"] as? String == "0", "a badge of 0 goes as a string, which WebKit reads")
                #expect(try await h.gateways.received("webpush").count == 1)
            }
        }
    }
}
