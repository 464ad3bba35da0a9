import Foundation
import HeraldTestSupport
import Testing

/// `web_payload` and `shrink` end to end: the records the Web Push gateway
/// decrypts, `shrunk` in push.status, the legacy-form APNs and FCM bodies,
/// and the collapse id a ring shares with its announcing notification.
extension PushDelivery {
    @Suite("web_payload, shrink and shrunk end to end")
    struct WebContentTests {
        /// The seed's order: media, then icon, then the body, then a minimal payload.
        static var shrink: [[String: Any]] {
            [
                ["drop": ["/media", "/attachments"]],
                ["drop": ["/icon", "/sender/icon"]],
                ["shorten": "/body"],
                ["keep": ["/type", "/channel_id", "/sender/name"]],
            ]
        }

        static func payload(body: String, media: Int = 0, icon: Int = 0, extra: Int = 0) -> [String: Any] {
            var p: [String: Any] = [
                "type": "message", "channel_id": "c-1",
                "sender": ["name": "Zoë", "icon": String(repeating: "i", count: icon)],
                "body": body,
            ]
            if media > 0 {
                p["media"] = [["url": String(repeating: "m", count: media)]]
                p["attachments"] = ["a1"]
            }
            if icon > 0 { p["icon"] = String(repeating: "j", count: icon) }
            if extra > 0 { p["extra"] = String(repeating: "x", count: extra) }
            return p
        }

        /// Sends one message to the user's devices; the decrypted record of
        /// `subscription` and the delivery's `shrunk`.
        static func sendOne(
            _ h: PushHarness, _ user: String, _ s: Subscription, _ payload: [String: Any],
            program: [[String: Any]]? = nil
        ) async throws -> (plaintext: [String: Any], text: String, shrunk: Any?, record: [String: Any]) {
            try await h.gateways.reset()
            if let program { try await h.gateways.program("webpush", token: s.id, program) }
            let r = try h.sendAndWait(["to": ["users": [user]], "web_payload": payload, "shrink": Self.shrink])
            #expect(counts(r)["delivered"] == 1, "\(r)")
            let status = try h.status(try #require(r["message_id"] as? String))
            let device = try #require(deviceStates(status).first)
            let rec = try #require(try await h.gateways.received("webpush").last)
            let text = try #require(rec["plaintext"] as? String, "\(rec)")
            let json = try #require(rec["plaintext_json"] as? [String: Any], "\(rec)")
            return (json, text, device["shrunk"], rec)
        }

        @Test(
            "a payload that fits goes whole; a bigger one loses media, then icons, then body text, then all but the minimum"
        )
        func shrinkOrder() async throws {
            try await withHarness(transports: ["web"]) { h in
                let s = try await h.subscription()
                try h.registerWeb("s", s)

                // Fits: exactly the caller's JSON, compact; shrunk null.
                let small = try await Self.sendOne(h, "s", s, Self.payload(body: "hi", media: 10, icon: 10))
                #expect(small.shrunk is NSNull, "\(small.shrunk as Any)")
                #expect(small.plaintext["media"] != nil && small.plaintext["icon"] != nil)
                #expect(small.plaintext["body"] as? String == "hi")
                #expect(small.record["body_len"] as? Int == 2816, "\(small.record)")

                // Media too big: step 0 drops it, icons and body stay.
                let media = try await Self.sendOne(h, "s", s, Self.payload(body: "hello", media: 3000, icon: 100))
                #expect(media.shrunk as? Int == 0)
                #expect(media.plaintext["media"] == nil && media.plaintext["attachments"] == nil)
                #expect(media.plaintext["icon"] as? String == String(repeating: "j", count: 100))
                #expect(media.plaintext["body"] as? String == "hello")
                #expect(media.record["body_len"] as? Int == 2816)

                // Media and icons too big together: step 1.
                let icon = try await Self.sendOne(h, "s", s, Self.payload(body: "hello", media: 1500, icon: 1500))
                #expect(icon.shrunk as? Int == 1)
                #expect(icon.plaintext["media"] == nil && icon.plaintext["icon"] == nil)
                #expect((icon.plaintext["sender"] as? [String: Any])?["icon"] == nil)
                #expect((icon.plaintext["sender"] as? [String: Any])?["name"] as? String == "Zoë")
                #expect(icon.plaintext["body"] as? String == "hello")

                // A long body (multi-byte characters): step 2 cuts it to fit, at a character boundary.
                let long = String(repeating: "é🙂a", count: 600)  // 4,200 bytes
                let body = try await Self.sendOne(h, "s", s, Self.payload(body: long, media: 500, icon: 500))
                #expect(body.shrunk as? Int == 2)
                let cut = try #require(body.plaintext["body"] as? String)
                #expect(cut.hasSuffix("…"))
                #expect(long.hasPrefix(String(cut.dropLast())))
                #expect(body.text.utf8.count <= 2713 && body.text.utf8.count > 2600, "\(body.text.utf8.count)")
                #expect(body.plaintext["media"] == nil && body.plaintext["icon"] == nil)

                // Something no earlier step touches: step 3 keeps the minimum.
                let minimal = try await Self.sendOne(h, "s", s, Self.payload(body: "hello", extra: 3000))
                #expect(minimal.shrunk as? Int == 3)
                #expect(Set(minimal.plaintext.keys) == ["type", "channel_id", "sender"], "\(minimal.text)")
                #expect(minimal.plaintext["type"] as? String == "message")
                #expect((minimal.plaintext["sender"] as? [String: Any])?.count == 1)
                #expect((minimal.plaintext["sender"] as? [String: Any])?["name"] as? String == "Zoë")
            }
        }

        @Test("a 413 applies the steps again for the smaller record; none fitting fails web_payload_too_large")
        func stepDown() async throws {
            try await withHarness(transports: ["web"]) { h in
                let s = try await h.subscription()
                try h.registerWeb("d", s)
                // 2,400 bytes fit 2816 whole but not the 2048-byte record: the body is cut.
                let r = try await Self.sendOne(
                    h, "d", s, Self.payload(body: String(repeating: "b", count: 2300)),
                    program: [["status": 413], ["status": 201]])
                #expect(r.shrunk as? Int == 2, "\(r.shrunk as Any)")
                #expect(r.record["body_len"] as? Int == 2048)
                #expect((r.plaintext["body"] as? String)?.hasSuffix("…") == true)

                // Without a step that fits the smaller record: failed, with the reason.
                try await h.gateways.reset()
                try await h.gateways.program("webpush", token: s.id, [["status": 413]])
                let big = try h.sendAndWait([
                    "to": ["users": ["d"]], "web_payload": ["body": String(repeating: "b", count: 2300)],
                ])
                #expect(counts(big)["failed"] == 1, "\(big)")
                let st = try h.status(try #require(big["message_id"] as? String))
                #expect(deviceStates(st).first?["reason"] as? String == "web_payload_too_large", "\(st)")
                #expect(!h.daemon.log(tail: 400).contains("bbbbbbbb"))
            }
        }

        @Test("legacy-form APNs and FCM devices get byte-for-byte the body they get without web_payload")
        func legacyFormsContentFree() async throws {
            try await withHarness { h in
                let s = try await h.subscription()
                try h.registerAPNs("l", hex(1))
                try h.registerAPNs("l", hex(2), voip: true)
                try h.registerFCM("l", "fcm-l")
                try h.registerWeb("l", s)
                // A ring's Web Push record goes to a Web Push-form fcm registration.
                try FormsAndRoutingTests.registerWebPush(h, "l", "fcm", try await h.subscription())
                let marker = "SECRET-CONTENT-4411"
                for kind in ["notification", "call_ring", "clear"] {
                    var bodies: [Set<String>] = []
                    for withContent in [true, false] {
                        try await h.gateways.reset()
                        var p: [String: Any] = [
                            "to": ["users": ["l"]], "kind": kind, "data": ["m": "1"], "collapse_key": "k-\(kind)",
                        ]
                        if withContent {
                            p["web_payload"] = ["text": marker, "nested": ["deep": [marker]]]
                            p["shrink"] = Self.shrink
                        }
                        let r = try h.sendAndWait(p)
                        #expect(counts(r)["failed"] == 0, "\(r)")
                        let apns = try await h.gateways.received("apns").compactMap { $0["body_text"] as? String }
                        let fcm = try await h.gateways.received("fcm", query: "&kind=send").compactMap {
                            $0["body_text"] as? String
                        }
                        #expect(!apns.isEmpty, "\(kind): \(apns)")
                        // A legacy fcm registration takes no ring.
                        #expect(kind == "call_ring" ? fcm.isEmpty : !fcm.isEmpty, "\(kind): \(fcm)")
                        for body in apns + fcm { #expect(!body.contains(marker), "\(kind): \(body)") }
                        let web = try await h.gateways.received("webpush")
                        if withContent {
                            #expect(!web.isEmpty, "\(kind)")
                            for record in web {
                                #expect((record["plaintext"] as? String)?.contains(marker) == true, "\(kind)")
                            }
                        }
                        bodies.append(Set(apns + fcm))
                    }
                    #expect(bodies[0] == bodies[1], "\(kind)")
                }
                #expect(!h.daemon.log(tail: 400).contains(marker))
            }
        }

        @Test(
            "a ring and its announcing notification with one collapse_key share apns-collapse-id, Topic and FCM collapse_key"
        )
        func sharedCollapse() async throws {
            try await withHarness { h in
                let s = try await h.subscription()
                try h.registerAPNs("c", hex(3))
                try h.registerAPNs("c", hex(4), voip: true)
                try h.registerFCM("c", "fcm-c")
                try h.registerWeb("c", s)
                try FormsAndRoutingTests.registerWebPush(h, "c", "fcm", try await h.subscription())
                let key = "call:chan-1:msg-9"
                var apnsIDs: [String] = []
                var topics: [String] = []
                var fcmKeys: [String] = []
                for kind in ["call_ring", "notification"] {
                    let r = try h.sendAndWait([
                        "to": ["users": ["c"]], "kind": kind, "collapse_key": key,
                        "web_payload": ["type": kind, "message_id": "msg-9"],
                    ])
                    #expect(counts(r)["delivered"] ?? 0 >= 2, "\(r)")
                }
                apnsIDs = try await h.gateways.received("apns").compactMap {
                    ($0["headers"] as? [String: String])?["apns-collapse-id"]
                }
                topics = try await h.gateways.received("webpush").compactMap { $0["topic"] as? String }
                fcmKeys = try await h.gateways.received("fcm", query: "&kind=send").compactMap {
                    ((($0["body"] as? [String: Any])?["message"] as? [String: Any])?["android"] as? [String: Any])?[
                        "collapse_key"] as? String
                }
                // The VoIP ring and the alert notification; the Web Push-form fcm
                // ring, then the web and Web Push-form fcm notification records.
                #expect(apnsIDs.count == 2 && Set(apnsIDs) == [key], "\(apnsIDs)")
                #expect(topics.count == 3 && Set(topics).count == 1 && topics[0].utf8.count == 32, "\(topics)")
                #expect(!fcmKeys.isEmpty && Set(fcmKeys) == [key], "\(fcmKeys)")
            }
        }

        @Test("retried after a restart, the record carries the same content, shrunk the same")
        func durableAcrossRestart() async throws {
            try await withHarness(transports: ["web"]) { h in
                let s = try await h.subscription()
                try h.registerWeb("r", s)
                try await h.gateways.program(
                    "webpush", token: s.id, [["status": 503, "retry_after": 2], ["status": 201]])
                let id =
                    try h.ok(
                        "push.send",
                        [
                            "to": ["users": ["r"]], "web_payload": Self.payload(body: "persist", media: 3000),
                            "shrink": Self.shrink,
                        ])["message_id"] as! String
                for _ in 0..<300 {
                    if try await h.gateways.received("webpush").count >= 1 { break }
                    try await Task.sleep(for: .milliseconds(10))
                }
                #expect(h.daemon.stop() == 0)
                // At rest the content is sealed: not in any file of the daemon's directory.
                var files: [UInt8] = []
                for name in (try? FileManager.default.contentsOfDirectory(atPath: h.daemon.dir.path)) ?? [] {
                    let path = h.daemon.dir.appendingPathComponent(name).path
                    let size = (try? FileManager.default.attributesOfItem(atPath: path)[.size] as? Int) ?? 0
                    if size > 0, name != "stderr.log",
                        let data = FileManager.default.contents(atPath: path)
                    {
                        files += [UInt8](data)
                    }
                }
                #expect(!files.isEmpty)
                #expect(!String(decoding: files, as: UTF8.self).contains("persist"))
                try h.daemon.start()
                let st = try await h.waitComplete(id)
                #expect(counts(st)["delivered"] == 1, "\(st)")
                #expect(deviceStates(st).first?["shrunk"] as? Int == 0)
                let texts = try await h.gateways.received("webpush").compactMap { $0["plaintext"] as? String }
                #expect(texts.count == 2 && texts[0] == texts[1] && texts[0].contains("persist"), "\(texts)")
            }
        }

        @Test("bad web_payload and shrink are refused at the field; one no step can fit is payload_too_large")
        func validation() async throws {
            try await withHarness(transports: ["web"]) { h in
                let s = try await h.subscription()
                try h.registerWeb("v", s)
                let ok: [String: Any] = ["a": "b"]
                let deep: Any = (0..<40).reduce(["x": 1] as Any) { inner, _ in ["n": inner] }
                let bad: [([String: Any], String, String)] = [
                    (["web_payload": "text"], "web_payload", "must be an object"),
                    (["web_payload": [1, 2]], "web_payload", "must be an object"),
                    (
                        ["web_payload": ["big": String(repeating: "x", count: 16_400)]], "web_payload",
                        "at most 16384 bytes"
                    ),
                    (["web_payload": deep], "web_payload", "nested at most 32"),
                    (["shrink": [["drop": ["/a"]]]], "shrink", "requires web_payload"),
                    (["web_payload": ok, "shrink": ["drop"]], "shrink[0]", "exactly one of"),
                    (
                        ["web_payload": ok, "shrink": [["drop": ["/a"], "keep": ["/a"]]]], "shrink[0]", "exactly one of"
                    ),
                    (["web_payload": ok, "shrink": [["squash": "/a"]]], "shrink[0]", "exactly one of"),
                    (["web_payload": ok, "shrink": [["drop": "/a"]]], "shrink[0].drop", "must be an array"),
                    (["web_payload": ok, "shrink": [["drop": []]]], "shrink[0].drop", "must not be empty"),
                    (["web_payload": ok, "shrink": [["drop": ["/a", "b"]]]], "shrink[0].drop[1]", "JSON pointer"),
                    (["web_payload": ok, "shrink": [["keep": ["/a~2"]]]], "shrink[0].keep[0]", "JSON pointer"),
                    (["web_payload": ok, "shrink": [["keep": [""]]]], "shrink[0].keep[0]", "JSON pointer"),
                    (
                        ["web_payload": ok, "shrink": [["drop": ["/a"]], ["drop": ["/b"]], ["shorten": "x~"]]],
                        "shrink[2].shorten", "JSON pointer"
                    ),
                    (["web_payload": ok, "shrink": [["shorten": 5]]], "shrink[0].shorten", "must be a string"),
                    (
                        ["web_payload": ok, "shrink": [["shorten": "/" + String(repeating: "p", count: 256)]]],
                        "shrink[0].shorten", "at most 256 bytes"
                    ),
                    (
                        ["web_payload": ok, "shrink": Array(repeating: ["drop": ["/a"]], count: 17)], "shrink",
                        "at most 16 items"
                    ),
                    (
                        ["web_payload": ok, "shrink": [["drop": Array(repeating: "/a", count: 65)]]], "shrink[0].drop",
                        "at most 64 items"
                    ),
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
                // A duplicate name anywhere (a pointer could not say which it means).
                try c.send(
                    #"{"jsonrpc":"2.0","id":9,"method":"push.send","params":{"to":{"users":["v"]},"web_payload":{"a":{"b":1,"b":2}}}}"#
                        + "\n")
                let line = try #require(c.readLine())
                let dup = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
                #expect(dup.errorData?["field"] as? String == "web_payload", "\(dup)")

                // No step brings it under 2713: refused up front, with the size it came to.
                let tooBig = try c.call(
                    "push.send",
                    [
                        "to": ["users": ["v"]],
                        "web_payload": ["type": "m", "body": String(repeating: "z", count: 3000)],
                        "shrink": [["drop": ["/media"]]],
                    ])
                #expect(tooBig.errorCode == 1005, "\(tooBig)")
                #expect(tooBig.errorData?["limit"] as? Int == 2713, "\(tooBig)")
                #expect(tooBig.errorData?["platform"] as? String == "web", "\(tooBig)")
                #expect(!"\(tooBig)".contains("zzzz"))
                // Exactly at the limits it passes, on the same connection; nothing refused was sent.
                #expect(try await h.gateways.received("webpush").isEmpty)
                let edge = String(repeating: "e", count: 16_384 - 8)  // {"e":"…"} is 16,384 bytes
                let r = try h.sendAndWait([
                    "to": ["users": ["v"]], "web_payload": ["e": edge],
                    "shrink": Array(repeating: ["shorten": "/e"], count: 16),
                ])
                #expect(counts(r)["delivered"] == 1, "\(r)")
                let st = try h.status(try #require(r["message_id"] as? String))
                #expect(deviceStates(st).first?["shrunk"] as? Int == 0)
                // 32 objects deep is the deepest taken; one byte more is refused.
                let deepest: Any = (0..<31).reduce(["x": 1] as Any) { inner, _ in ["n": inner] }
                let atDepth = try h.sendAndWait(["to": ["users": ["v"]], "web_payload": deepest])
                #expect(counts(atDepth)["delivered"] == 1, "\(atDepth)")
                let over = try c.call(
                    "push.send",
                    ["to": ["users": ["v"]], "web_payload": ["e": edge + "e"], "shrink": [["shorten": "/e"]]])
                #expect(over.errorData?["field"] as? String == "web_payload", "\(over)")
            }
        }
    }
}
