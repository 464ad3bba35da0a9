import Foundation
import HeraldTestSupport
import Testing

/// Where registration forms meet encrypted content: a Web Push-form
/// registration of any platform carries `web_payload`, fitted by the shrink
/// steps as for `web`, with `shrunk` in push.status; legacy-form ones stay
/// content-free; a ring and its notification share the collapse id; each
/// client build of one registration is its own delivery.
extension PushDelivery {
    @Suite("Registration forms with web_payload end to end")
    struct FormsWebContentTests {
        static let ringMarker = "RING-BODY-7731"
        static let noteMarker = "NOTE-BODY-7731"

        /// The Web Push records the gateway took, each checked valid.
        static func records(_ h: PushHarness) async throws -> [[String: Any]] {
            let all = try await h.gateways.received("webpush")
            for r in all { #expect(r["valid"] as? Bool == true, "\(r)") }
            return all
        }

        /// The bodies of the FCM sends the gateway took (a reset revokes the
        /// access token: a 401 and a new token may come first).
        static func fcmSends(_ h: PushHarness) async throws -> [[String: Any]] {
            try await h.gateways.received("fcm", query: "&kind=send").filter { $0["valid"] as? Int == 1 }
        }

        @Test(
            "a ring with web_payload reaches the VoIP and Web Push-form fcm registrations shrunk, not legacy fcm or web; its notification reaches the alert ones with one Topic; a second build is its own delivery"
        )
        func ringAndNotification() async throws {
            try await withHarness { h in
                let voipSub = try await h.subscription()
                let fcmSub = try await h.subscription()
                let webSub = try await h.subscription()
                let voip = try FormsAndRoutingTests.registerWebPush(h, "m", "apns_voip", voipSub)
                let webFCM = try FormsAndRoutingTests.registerWebPush(h, "m", "fcm", fcmSub)
                let legacyFCM = try h.registerFCM("m", "fcm-legacy-m")
                let web = try h.registerWeb("m", webSub)
                let key = "call:chan-7:msg-31"

                // The ring: media too big for the record, so step 0 drops it.
                try await h.gateways.reset()
                let ring = try h.sendAndWait([
                    "to": ["users": ["m"]], "kind": "call_ring", "collapse_key": key,
                    "web_payload": WebContentTests.payload(body: Self.ringMarker, media: 3000, icon: 100),
                    "shrink": WebContentTests.shrink,
                ])
                #expect(ring["devices"] as? Int == 2 && ring["skipped"] as? Int == 2, "\(ring)")
                #expect(counts(ring)["delivered"] == 2, "\(ring)")
                let ringRecords = try await Self.records(h)
                #expect(Set(ringRecords.compactMap { $0["token"] as? String }) == [voipSub.id, fcmSub.id])
                #expect(ringRecords.count == 2)
                for rec in ringRecords {
                    let plain = rec["plaintext_json"] as? [String: Any] ?? [:]
                    #expect(plain["body"] as? String == Self.ringMarker, "\(rec)")
                    #expect(plain["media"] == nil && plain["attachments"] == nil, "step 0 applied: \(plain)")
                    #expect(plain["icon"] as? String == String(repeating: "j", count: 100), "\(plain)")
                    #expect(rec["ttl"] as? Int == 0 && rec["urgency"] as? String == "high", "\(rec)")
                }
                let ringTopics = Set(ringRecords.compactMap { $0["topic"] as? String })
                #expect(ringTopics.count == 1, "\(ringTopics)")
                #expect(try await Self.fcmSends(h).isEmpty, "legacy fcm gets nothing for a ring")
                #expect(try await h.gateways.received("apns").isEmpty, "no legacy VoIP registration here")
                let ringStates = Dictionary(
                    uniqueKeysWithValues: deviceStates(try h.status(ring["message_id"] as! String)).map {
                        ($0["device_id"] as! String, $0)
                    })
                for id in [voip, webFCM] {
                    #expect(ringStates[id]?["state"] as? String == "delivered", "\(ringStates)")
                    #expect(ringStates[id]?["shrunk"] as? Int == 0, "\(ringStates)")
                }
                for id in [legacyFCM, web] {
                    #expect(ringStates[id]?["state"] as? String == "skipped", "\(ringStates)")
                    #expect(ringStates[id]?["reason"] as? String == "kind_not_for_platform")
                    #expect(ringStates[id]?["shrunk"] is NSNull, "\(ringStates)")
                }

                // The notification announcing the call: it fits whole.
                try await h.gateways.reset()
                let note = try h.sendAndWait([
                    "to": ["users": ["m"]], "collapse_key": key, "data": ["m": "31"],
                    "web_payload": WebContentTests.payload(body: Self.noteMarker),
                    "shrink": WebContentTests.shrink,
                ])
                #expect(note["devices"] as? Int == 3 && note["skipped"] as? Int == 1, "\(note)")
                #expect(counts(note)["delivered"] == 3, "\(note)")
                let noteRecords = try await Self.records(h)
                #expect(Set(noteRecords.compactMap { $0["token"] as? String }) == [webSub.id, fcmSub.id])
                #expect(noteRecords.count == 2)
                for rec in noteRecords {
                    let plain = rec["plaintext_json"] as? [String: Any] ?? [:]
                    #expect(plain["body"] as? String == Self.noteMarker, "\(rec)")
                    #expect(rec["urgency"] as? String == "high", "\(rec)")
                }
                #expect(
                    Set(noteRecords.compactMap { $0["topic"] as? String }) == ringTopics,
                    "the notification's records share the ring's Topic")
                let fcm = try await Self.fcmSends(h)
                #expect(fcm.compactMap { $0["token"] as? String } == ["fcm-legacy-m"], "\(fcm)")
                for send in fcm {
                    let body = send["body_text"] as? String ?? ""
                    #expect(!body.contains(Self.noteMarker) && !body.contains("Zoë"), "content-free: \(body)")
                    let android =
                        ((send["body"] as? [String: Any])?["message"] as? [String: Any])?["android"]
                        as? [String: Any]
                    #expect(android?["collapse_key"] as? String == key, "\(send)")
                }
                let noteStates = deviceStates(try h.status(note["message_id"] as! String))
                #expect(noteStates.allSatisfy { $0["shrunk"] is NSNull }, "whole: \(noteStates)")

                // Another build of the Web Push-form fcm registration: its own device and delivery.
                let beta = try FormsAndRoutingTests.registerWebPush(h, "m", "fcm", fcmSub, extra: ["app_id": "beta"])
                #expect(beta != webFCM)
                try await h.gateways.reset()
                let both = try h.sendAndWait([
                    "to": ["users": ["m"]], "collapse_key": "k-builds",
                    "web_payload": WebContentTests.payload(body: Self.noteMarker, media: 3000),
                    "shrink": WebContentTests.shrink,
                ])
                #expect(both["devices"] as? Int == 4 && counts(both)["delivered"] == 4, "\(both)")
                let toFCMSub = try await Self.records(h).filter { $0["token"] as? String == fcmSub.id }
                #expect(toFCMSub.count == 2, "one record per build: \(toFCMSub.count)")
                let bothStates = Dictionary(
                    uniqueKeysWithValues: deviceStates(try h.status(both["message_id"] as! String)).map {
                        ($0["device_id"] as! String, $0)
                    })
                for id in [webFCM, beta, web] {
                    #expect(bothStates[id]?["state"] as? String == "delivered", "\(bothStates)")
                    #expect(bothStates[id]?["shrunk"] as? Int == 0, "\(bothStates)")
                }
                #expect(bothStates[legacyFCM]?["shrunk"] is NSNull, "\(bothStates)")
            }
        }
        @Test(
            "push.send refuses up front a web_payload no step fits when the only recipient is a Web Push-form apns_voip one"
        )
        func refusedUpFront() async throws {
            try await withHarness { h in
                let s = try await h.subscription()
                try FormsAndRoutingTests.registerWebPush(h, "p", "apns_voip", s)
                let c = try h.daemon.connect()
                defer { c.close() }
                let r = try c.call(
                    "push.send",
                    [
                        "to": ["users": ["p"]], "kind": "call_ring",
                        "web_payload": ["type": "call_ring", "caller": String(repeating: "z", count: 3000)],
                        "shrink": [["drop": ["/avatar"]]],
                    ])
                #expect(r.errorCode == 1005, "\(r)")
                #expect(r.errorData?["limit"] as? Int == 2713 && r.errorData?["platform"] as? String == "web", "\(r)")
                #expect(try await h.gateways.received("webpush").isEmpty)
                // The same ring with a step that fits goes out, shrunk at that step.
                let ok = try h.sendAndWait([
                    "to": ["users": ["p"]], "kind": "call_ring",
                    "web_payload": ["type": "call_ring", "caller": String(repeating: "z", count: 3000)],
                    "shrink": [["drop": ["/avatar"]], ["shorten": "/caller"]],
                ])
                #expect(counts(ok)["delivered"] == 1, "\(ok)")
                #expect(deviceStates(try h.status(ok["message_id"] as! String)).first?["shrunk"] as? Int == 1)
            }
        }
    }
}
