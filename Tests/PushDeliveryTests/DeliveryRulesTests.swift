import Foundation
import HeraldTestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// One test per rule of SPEC "Delivery rules", through the socket against the gateways.
extension PushDelivery {
    @Suite("Delivery rules end to end")
    struct DeliveryRulesTests {
        @Test(
            "kinds: clear is a background push at priority 5; call_ring reaches VoIP only of these (legacy FCM, web and plain APNs skip it)"
        )
        func kinds() async throws {
            try await withHarness { h in
                let s = try await h.subscription()
                try h.registerAPNs("k", hex(1))
                try h.registerAPNs("k", hex(2), voip: true)
                try h.registerFCM("k", "fcm-k")
                try h.registerWeb("k", s)
                let clear = try h.sendAndWait(["to": ["users": ["k"]], "kind": "clear", "badge": 0])
                #expect(clear["devices"] as? Int == 3 && clear["skipped"] as? Int == 1)
                #expect(counts(clear)["delivered"] == 3)
                let apns = try #require(try await h.gateways.received("apns").first)
                let headers = apns["headers"] as? [String: String] ?? [:]
                #expect(headers["apns-push-type"] == "background" && headers["apns-priority"] == "5")
                let aps = (apns["body"] as? [String: Any])?["aps"] as? [String: Any] ?? [:]
                #expect(
                    aps["content-available"] as? Int == 1 && aps["alert"] == nil && aps["badge"] as? Int == 0)
                let fcm = try #require(try await h.gateways.received("fcm", query: "&kind=send").first)
                let android =
                    ((fcm["body"] as? [String: Any])?["message"] as? [String: Any])?["android"]
                    as? [String: Any] ?? [:]
                #expect(android["priority"] as? String == "NORMAL" && android["notification"] == nil)
                let web = try #require(try await h.gateways.received("webpush").first)
                #expect(web["urgency"] as? String == "low")
                #expect((web["ttl"] as? Int ?? 0) <= 3600)

                try await h.gateways.reset()
                let ring = try h.sendAndWait([
                    "to": ["users": ["k"]], "kind": "call_ring", "data": ["call": "c1"],
                ])
                #expect(ring["devices"] as? Int == 1 && ring["skipped"] as? Int == 3)
                let ringStatus = try h.status(ring["message_id"] as! String)
                #expect(counts(ring)["delivered"] == 1, "\(ringStatus)")
                let voip = try await h.gateways.received("apns")
                #expect(voip.count == 1)
                let vh = voip.first?["headers"] as? [String: String] ?? [:]
                #expect(
                    vh["apns-topic"] == topic + ".voip" && vh["apns-push-type"] == "voip"
                        && vh["apns-expiration"] == "0")
                #expect(voip.first?["token"] as? String == hex(2))
                #expect(try await h.gateways.received("fcm", query: "&kind=send").isEmpty)
                #expect(try await h.gateways.received("webpush").isEmpty)
                let status = try h.status(ring["message_id"] as! String)
                let skipped = deviceStates(status).filter { $0["state"] as? String == "skipped" }
                #expect(Set(skipped.compactMap { $0["platform"] as? String }) == ["apns", "fcm", "web"])
                #expect(skipped.allSatisfy { $0["reason"] as? String == "kind_not_for_platform" })
            }
        }

        @Test("push.status detail names the instance that sent each delivery (sent_by); null when never attempted")
        func sentBy() async throws {
            try await withHarness(server: "instance_id = edge-7") { h in
                let s = try await h.subscription()
                try h.registerAPNs("sb", hex(1))
                try h.registerAPNs("sb", hex(2), voip: true)
                try h.registerFCM("sb", "fcm-sb")
                try h.registerWeb("sb", s)
                let r = try h.sendAndWait(["to": ["users": ["sb"]]])
                #expect(counts(r)["delivered"] == 3)
                let devices = deviceStates(try h.status(r["message_id"] as! String))
                #expect(devices.count == 4)
                for d in devices {
                    if d["state"] as? String == "skipped" {
                        #expect(d["sent_by"] is NSNull, "\(d)")
                    } else {
                        #expect(d["sent_by"] as? String == "edge-7", "\(d)")
                    }
                }
            }
        }

        @Test("priority maps per transport: apns-priority, android.priority, Urgency; ttl reaches every provider")
        func priorityAndTTL() async throws {
            try await withHarness { h in
                let s = try await h.subscription()
                try h.registerAPNs("q", hex(1))
                try h.registerFCM("q", "fcm-q")
                try h.registerWeb("q", s)
                let r = try h.sendAndWait(["to": ["users": ["q"]], "priority": "normal", "ttl": 600])
                #expect(counts(r)["delivered"] == 3)
                let apns = try #require(try await h.gateways.received("apns").first)
                let headers = apns["headers"] as? [String: String] ?? [:]
                #expect(headers["apns-priority"] == "5")
                let expiration = Int(headers["apns-expiration"] ?? "") ?? 0
                #expect(abs(expiration - Int(Date().timeIntervalSince1970) - 600) < 30)
                let fcm = try #require(try await h.gateways.received("fcm", query: "&kind=send").first)
                let android =
                    ((fcm["body"] as? [String: Any])?["message"] as? [String: Any])?["android"] as? [String: Any] ?? [:]
                #expect(android["priority"] as? String == "NORMAL")
                #expect(android["ttl"] as? String == "600s")
                let web = try #require(try await h.gateways.received("webpush").first)
                #expect(web["urgency"] as? String == "normal")
                #expect(web["ttl"] as? Int == 600)
            }
        }

        @Test("bad sends: the right error, nothing stored, nothing sent, the connection still usable")
        func badSends() async throws {
            try await withHarness { h in
                let s = try await h.subscription()
                try h.registerWeb("b", s)
                try h.registerAPNs("b", hex(1))
                try h.registerFCM("b", "fcm-b")
                let c = try h.daemon.connect()
                defer { c.close() }
                let big = String(repeating: "x", count: 1000)
                let tooBig = try c.call(
                    "push.send", ["to": ["users": ["b"]], "data": ["a": big, "b": big, "c": big]])
                #expect(tooBig.errorCode == 1005)
                #expect(tooBig.errorData?["reason"] as? String == "payload_too_large")
                #expect(
                    tooBig.errorData?["platform"] as? String == "web"
                        && tooBig.errorData?["limit"] as? Int == 2713)
                let aps = try c.call("push.send", ["to": ["users": ["b"]], "data": ["aps": "x"]])
                #expect(aps.errorCode == -32602 && aps.errorData?["field"] as? String == "data.aps")
                let google = try c.call(
                    "push.send", ["to": ["users": ["b"]], "data": ["google.sent": "x"]])
                #expect(
                    google.errorCode == -32602 && google.errorData?["field"] as? String == "data.google.sent")
                let nonString = try c.call("push.send", ["to": ["users": ["b"]], "data": ["n": 1]])
                #expect(
                    nonString.errorCode == -32602 && nonString.errorData?["field"] as? String == "data.n")
                let both = try c.call(
                    "push.send", ["to": ["users": ["b"], "devices": [String(repeating: "a", count: 32)]]])
                #expect(both.errorCode == -32602 && both.errorData?["field"] as? String == "to.users")
                let noTo = try c.call("push.send", [:])
                #expect(noTo.errorCode == -32602 && noTo.errorData?["field"] as? String == "to")
                let badDevice = try c.call("push.send", ["to": ["devices": ["nope"]]])
                #expect(badDevice.errorData?["field"] as? String == "to.devices[0]")
                let badBadge = try c.call("push.send", ["to": ["users": ["b"]], "badge": ["b": -1]])
                #expect(badBadge.errorData?["field"] as? String == "badge.b")
                let timeoutAlone = try c.call("push.send", ["to": ["users": ["b"]], "timeout_ms": 10])
                #expect(timeoutAlone.errorData?["field"] as? String == "timeout_ms")
                let unknown = try c.call("push.send", ["to": ["users": ["b"]], "content": "hello"])
                #expect(unknown.errorData?["field"] as? String == "content")
                let badKind = try c.call("push.send", ["to": ["users": ["b"]], "kind": "shout"])
                #expect(badKind.errorData?["field"] as? String == "kind")
                let status = try c.call("push.status", ["message_id": String(repeating: "0", count: 32)])
                #expect(status.errorCode == 1003 && status.errorData?["reason"] as? String == "not_found")
                let cancel = try c.call("push.cancel", ["message_id": "xyz"])
                #expect(cancel.errorCode == -32602 && cancel.errorData?["field"] as? String == "message_id")
                // Still usable, and nothing was queued or sent.
                let stats = try #require(try c.call("system.stats").result)
                #expect((stats["queue"] as? [String: Int])?["depth"] == 0)
                // A good send afterwards: once it is complete, anything the bad
                // calls had queued would have gone out before or with it.
                let good = try #require(
                    try c.call("push.send", ["to": ["users": ["b"]], "data": ["probe": "good"]]).result)
                #expect(good["devices"] as? Int == 3)
                let id = try #require(good["message_id"] as? String)
                let done = try await h.waitComplete(id)
                #expect(done["state"] as? String == "complete")
                var received = 0
                for gateway in ["webpush", "apns", "fcm"] {
                    received += try await h.gateways.received(gateway, query: "&kind=send").count
                }
                #expect(received == 3, "only the good send reached the gateways: \(received) requests")
            }
        }

        @Test("the same idempotency key within 24 h returns the first message and sends nothing again")
        func idempotency() async throws {
            try await withHarness { h in
                try h.registerAPNs("i", hex(1))
                let first = try h.sendAndWait(["to": ["users": ["i"]], "idempotency_key": "order-42"])
                let again = try h.sendAndWait(["to": ["users": ["i"]], "idempotency_key": "order-42"])
                #expect(first["message_id"] as? String == again["message_id"] as? String)
                #expect(again["state"] as? String == "complete" && counts(again)["delivered"] == 1)
                #expect(try await h.gateways.received("apns").count == 1)
            }
        }

        @Test("a not-yet-sent delivery with the same collapse key is superseded by the newer message")
        func coalescing() async throws {
            try await withHarness(delivery: "max_retries = 3\nbackoff_base_ms = 50\nbackoff_max_ms = 200") { h in
                try h.registerFCM("c", "fcm-c")
                // The first attempt is answered 503 with Retry-After 30: the delivery waits.
                try await h.gateways.program(
                    "fcm", token: "fcm-c", [["error": "UNAVAILABLE", "retry_after": 30], ["status": 200]])
                let old = try h.ok("push.send", ["to": ["users": ["c"]], "collapse_key": "chat-1"])
                let oldID = old["message_id"] as! String
                var waiting = false
                for _ in 0..<100 where !waiting {
                    waiting = counts(try h.status(oldID))["retrying"] == 1
                    if !waiting { try await Task.sleep(for: .milliseconds(20)) }
                }
                #expect(waiting)
                let new = try h.sendAndWait(["to": ["users": ["c"]], "collapse_key": "chat-1"])
                #expect(counts(new)["delivered"] == 1)
                let s = try h.status(oldID)
                #expect(s["state"] as? String == "complete" && counts(s)["superseded"] == 1)
            }
        }

        @Test("push.cancel drops deliveries not yet sent")
        func cancel() async throws {
            try await withHarness { h in
                try h.registerFCM("x", "fcm-x1")
                try h.registerAPNs("x", hex(1))
                try await h.gateways.program(
                    "fcm", token: "fcm-x1", [["error": "UNAVAILABLE", "retry_after": 30]])
                let sent = try h.ok("push.send", ["to": ["users": ["x"]]])
                let id = sent["message_id"] as! String
                var retrying = false
                for _ in 0..<100 where !retrying {
                    retrying = counts(try h.status(id))["retrying"] == 1
                    if !retrying { try await Task.sleep(for: .milliseconds(20)) }
                }
                #expect(try h.ok("push.cancel", ["message_id": id])["cancelled"] as? Int == 1)
                let s = try h.status(id)
                #expect(s["state"] as? String == "complete")
                #expect(counts(s)["skipped"] == 1 && counts(s)["delivered"] == 1)
                #expect(deviceStates(s).contains { $0["reason"] as? String == "cancelled" })
            }
        }

        @Test("a transient answer is retried after the provider's Retry-After, then delivered")
        func retryAfter() async throws {
            try await withHarness { h in
                try h.registerFCM("r", "fcm-r")
                try await h.gateways.program(
                    "fcm", token: "fcm-r", [["error": "QUOTA_EXCEEDED", "retry_after": 1], ["status": 200]])
                let r = try h.sendAndWait(["to": ["users": ["r"]]])
                #expect(counts(r)["delivered"] == 1)
                let device = try #require(deviceStates(try h.status(r["message_id"] as! String)).first)
                #expect(device["attempts"] as? Int == 2 && device["http_status"] as? Int == 200)
                let sends = try await h.gateways.received("fcm", query: "&kind=send")
                #expect(sends.count == 2)
                let gap = (sends[1]["time"] as? Double ?? 0) - (sends[0]["time"] as? Double ?? 0)
                #expect(gap >= 0.95, "the retry waited for Retry-After (\(gap) s)")
                let t = try h.ok("system.stats")["transports"] as? [String: [String: Int]] ?? [:]
                #expect(t["fcm"]?["retried"] == 1 && t["fcm"]?["delivered"] == 1)
            }
        }

        @Test(
            "transient failures end failed once max_retries are spent; timeouts, resets and GOAWAY are transient"
        )
        func retriesExhausted() async throws {
            try await withHarness { h in
                try h.registerAPNs("e", hex(1))
                try h.registerAPNs("e", hex(2))
                try await h.gateways.program("apns", token: hex(1), [["status": 500]])
                try await h.gateways.program(
                    "apns", token: hex(2), [["reset": "CANCEL"], ["status": 503], ["status": 200]])
                let r = try h.sendAndWait(["to": ["users": ["e"]]])
                #expect(counts(r)["failed"] == 1 && counts(r)["delivered"] == 1)
                let devices = deviceStates(try h.status(r["message_id"] as! String))
                let failed = try #require(devices.first { $0["state"] as? String == "failed" })
                #expect(failed["attempts"] as? Int == 4, "the first send and max_retries = 3 retries")
                #expect(failed["reason"] as? String == "InternalServerError (retries exhausted)")
                #expect(failed["http_status"] as? Int == 500)
                let other = try #require(devices.first { $0["state"] as? String == "delivered" })
                #expect(other["attempts"] as? Int == 3)
                #expect(try h.devices("e").count == 2, "transient failures never delete a device")
            }
        }

        @Test("a retry never lands past the TTL: the delivery expires")
        func ttlExpiry() async throws {
            try await withHarness { h in
                let s = try await h.subscription()
                try h.registerWeb("t", s)
                try await h.gateways.program("webpush", token: s.id, [["status": 503, "retry_after": 3]])
                let r = try h.sendAndWait(["to": ["users": ["t"]], "ttl": 1])
                #expect(counts(r)["expired"] == 1)
                let d = try #require(deviceStates(try h.status(r["message_id"] as! String)).first)
                #expect((d["reason"] as? String)?.contains("ttl elapsed") == true)
                #expect(try await h.gateways.received("webpush").count == 1)
            }
        }

        @Test("other 4xx end failed with the provider's reason and the device is kept")
        func permanentFailures() async throws {
            try await withHarness { h in
                let s = try await h.subscription()
                try h.registerAPNs("p", hex(1))
                try h.registerFCM("p", "fcm-p")
                try h.registerWeb("p", s)
                try await h.gateways.program(
                    "apns", token: hex(1), [["status": 400, "reason": "BadDeviceToken"]])
                try await h.gateways.program("fcm", token: "fcm-p", [["error": "INVALID_ARGUMENT"]])
                try await h.gateways.program("webpush", token: s.id, [["status": 400]])
                let r = try h.sendAndWait(["to": ["users": ["p"]]])
                #expect(counts(r)["failed"] == 3)
                let reasons = Set(
                    deviceStates(try h.status(r["message_id"] as! String)).compactMap {
                        $0["reason"] as? String
                    })
                #expect(reasons == ["BadDeviceToken", "INVALID_ARGUMENT", "http_400"])
                let devices = try h.devices("p")
                #expect(devices.count == 3)
                #expect(
                    devices.allSatisfy {
                        $0["last_failure_reason"] is String && $0["last_failure_at"] is String
                    })
                #expect(try await h.gateways.received("apns").count == 1, "no retry of a permanent failure")
            }
        }

        @Test(
            "stale answers delete the device: APNs 410 only when not older than the registration, FCM UNREGISTERED, Web Push 404/410"
        )
        func staleDeletion() async throws {
            try await withHarness { h in
                let s404 = try await h.subscription()
                let s410 = try await h.subscription()
                try h.registerAPNs("s", hex(1))
                try h.registerAPNs("s", hex(2))
                try h.registerFCM("s", "fcm-s")
                try h.registerWeb("s", s404)
                try h.registerWeb("s", s410)
                let now = Int64(Date().timeIntervalSince1970 * 1000)
                try await h.gateways.program(
                    "apns", token: hex(1),
                    [["status": 410, "reason": "Unregistered", "timestamp": now + 1000]])
                try await h.gateways.program(
                    "apns", token: hex(2),
                    [["status": 410, "reason": "Unregistered", "timestamp": 1_700_000_000_000]])
                try await h.gateways.program("fcm", token: "fcm-s", [["error": "UNREGISTERED"]])
                try await h.gateways.program("webpush", token: s404.id, [["status": 404]])
                try await h.gateways.program("webpush", token: s410.id, [["status": 410]])
                let r = try h.sendAndWait(["to": ["users": ["s"]]])
                #expect(counts(r)["removed_stale"] == 4, "\(counts(r))")
                #expect(counts(r)["failed"] == 1, "a 410 older than the registration keeps the device")
                let left = try h.devices("s")
                #expect(left.count == 1 && left.first?["platform"] as? String == "apns")
                let t = try h.ok("system.stats")["transports"] as? [String: [String: Int]] ?? [:]
                #expect(
                    t["web"]?["removed_stale"] == 2 && t["fcm"]?["removed_stale"] == 1
                        && t["apns"]?["removed_stale"] == 1)
            }
        }

        @Test(
            "credential rejections degrade the transport and wait, uncounted, until a reload; a Web Push 403 degrades its origin only; no device is deleted"
        )
        func authRejections() async throws {
            // max_retries = 1: two rejections in a row would have failed the deliveries.
            try await withHarness(delivery: "max_retries = 1\nbackoff_base_ms = 50\nbackoff_max_ms = 100") { h in
                let s = try await h.subscription()
                try h.registerFCM("a", "fcm-a")
                try h.registerWeb("a", s)
                try h.registerAPNs("a", hex(1))
                try await h.gateways.program("fcm-token", [["status": 400, "error": "invalid_grant"]])
                try await h.gateways.program("webpush", token: s.id, [["status": 403], ["status": 201]])
                try await h.gateways.program(
                    "apns", token: hex(1),
                    [
                        ["status": 403, "reason": "InvalidProviderToken"],
                        ["status": 403, "reason": "InvalidProviderToken"], ["status": 200],
                    ])
                let sent = try h.ok("push.send", ["to": ["users": ["a"]]])
                let id = sent["message_id"] as! String
                func byPlatform() throws -> [String: [String: Any]] {
                    var out: [String: [String: Any]] = [:]
                    for d in deviceStates(try h.status(id)) { out[d["platform"] as! String] = d }
                    return out
                }
                func waitingForCredential(_ platforms: [String] = ["apns", "fcm"]) throws -> Bool {
                    let d = try byPlatform()
                    return platforms.allSatisfy {
                        d[$0]?["state"] as? String == "retrying" && d[$0]?["reason"] as? String == "credential_rejected"
                    }
                }
                var waited = false
                for _ in 0..<400 where !waited {
                    waited = try waitingForCredential() && (try byPlatform()["web"]?["state"] as? String) == "delivered"
                    if !waited { try await Task.sleep(for: .milliseconds(25)) }
                }
                let seen = try h.status(id)
                #expect(waited, "\(seen)")
                let states = try byPlatform()
                #expect(
                    states["apns"]?["attempts"] as? Int == 0 && states["fcm"]?["attempts"] as? Int == 0,
                    "a credential rejection is not counted toward max_retries: \(states)")
                let health = try h.ok("system.health")
                let transports = (health["transports"] as? [String: Any])?["default"] as? [String: String]
                #expect(health["status"] as? String == "degraded")
                #expect(transports?["fcm"] == "degraded:invalid_grant")
                #expect(transports?["apns"] == "degraded:InvalidProviderToken")
                #expect(transports?["web"] == "ready", "one push service's 403 never degrades Web Push: \(health)")
                // Waiting does not spin: no more sends while nothing changes.
                let apnsBefore = try await h.gateways.received("apns").count
                try await Task.sleep(for: .milliseconds(500))
                #expect(try await h.gateways.received("apns").count == apnsBefore)

                // A reload brings them back at once: APNs is refused once more (still
                // uncounted), then both go through.
                try await h.gateways.program("fcm-token", [])
                h.daemon.signal(SIGHUP)
                #expect(h.daemon.waitForLog("config_reloaded", count: 1))
                var second = false
                for _ in 0..<400 where !second {
                    second =
                        try await h.gateways.received("apns").count == apnsBefore + 1
                        && waitingForCredential(["apns"])
                    if !second { try await Task.sleep(for: .milliseconds(25)) }
                }
                let seenAgain = try h.status(id)
                #expect(second, "\(seenAgain)")
                h.daemon.signal(SIGHUP)
                #expect(h.daemon.waitForLog("config_reloaded", count: 2))
                // Well within the 60 s cadence: only the reload can have brought them back.
                let done = try await h.waitComplete(id, timeout: 20)
                #expect(counts(done)["delivered"] == 3, "\(done)")
                let after = try h.ok("system.health")
                #expect(after["status"] as? String == "ok", "\(after)")
                #expect(try h.devices("a").count == 3)
                // Web Push signed a new VAPID token after the 403.
                let web = try await h.gateways.received("webpush")
                #expect(web.count == 2)
                let hashes = web.compactMap { ($0["vapid"] as? [String: Any])?["jwt_hash"] as? String }
                #expect(Set(hashes).count == 2)
                let t = try h.ok("system.stats")["transports"] as? [String: [String: Int]] ?? [:]
                #expect(
                    (t["fcm"]?["auth_rejected"] ?? 0) >= 1 && t["web"]?["auth_rejected"] == 1
                        && t["apns"]?["auth_rejected"] == 2)
            }
        }

        @Test(
            "a Web Push service answering 403 for good: its delivery fails after max_retries, the app's Web Push stays ready"
        )
        func webPushOriginRejection() async throws {
            try await withHarness(transports: ["web"]) { h in
                let refused = try await h.subscription()
                let fine = try await h.subscription()
                try h.registerWeb("w", refused)
                try h.registerWeb("w", fine)
                try await h.gateways.program("webpush", token: refused.id, [["status": 403]])
                let r = try h.sendAndWait(["to": ["users": ["w"]]])
                #expect(counts(r)["delivered"] == 1 && counts(r)["failed"] == 1, "\(r)")
                let failed = deviceStates(try h.status(r["message_id"] as! String)).first {
                    $0["state"] as? String == "failed"
                }
                #expect(failed?["reason"] as? String == "http_403 (retries exhausted)", "\(failed ?? [:])")
                #expect(failed?["attempts"] as? Int == 4, "counted toward max_retries = 3")
                let health = try h.ok("system.health")
                #expect(health["status"] as? String == "ok", "\(health)")
                #expect(((health["transports"] as? [String: Any])?["default"] as? [String: String])?["web"] == "ready")
                #expect(try h.devices("w").count == 2)
            }
        }

        @Test("FCM: a 404 without an UNREGISTERED detail is failed and the device is kept")
        func fcmPlainNotFound() async throws {
            try await withHarness(transports: ["fcm"]) { h in
                try h.registerFCM("n", "fcm-n")
                try await h.gateways.program(
                    "fcm", token: "fcm-n",
                    [["status": 404, "body": ["error": ["code": 404, "message": "not found", "status": "NOT_FOUND"]]]])
                let r = try h.sendAndWait(["to": ["users": ["n"]]])
                #expect(counts(r)["failed"] == 1 && counts(r)["removed_stale"] == 0, "\(r)")
                let d = deviceStates(try h.status(r["message_id"] as! String)).first
                #expect(d?["reason"] as? String == "NOT_FOUND" && d?["http_status"] as? Int == 404, "\(d ?? [:])")
                #expect(try h.devices("n").count == 1, "the device is kept")
            }
        }

        @Test(
            "a message without a collapse key gets its own collapse id: apns-collapse-id and Topic, the same on a resend"
        )
        func ownCollapseID() async throws {
            try await withHarness(transports: ["apns", "web"]) { h in
                let s = try await h.subscription()
                try h.registerAPNs("o", hex(5))
                try h.registerWeb("o", s)
                // An ambiguous failure first: the resend must collapse onto the first.
                try await h.gateways.program("apns", token: hex(5), [["status": 503], ["status": 200]])
                try await h.gateways.program("webpush", token: s.id, [["status": 503], ["status": 201]])
                let first = try h.sendAndWait(["to": ["users": ["o"]]])
                #expect(counts(first)["delivered"] == 2, "\(first)")
                let apns = try await h.gateways.received("apns").compactMap {
                    ($0["headers"] as? [String: String])?["apns-collapse-id"]
                }
                let topics = try await h.gateways.received("webpush").compactMap { $0["topic"] as? String }
                #expect(apns.count == 2 && Set(apns).count == 1 && apns[0].utf8.count == 32, "\(apns)")
                #expect(topics.count == 2 && Set(topics).count == 1 && topics[0].utf8.count == 32, "\(topics)")
                // With an idempotency key the id comes from the key; another message gets another id.
                try await h.gateways.reset()
                _ = try h.sendAndWait(["to": ["users": ["o"]], "idempotency_key": "evt-1"])
                _ = try h.sendAndWait(["to": ["users": ["o"]]])
                let ids = try await h.gateways.received("apns").compactMap {
                    ($0["headers"] as? [String: String])?["apns-collapse-id"]
                }
                #expect(ids.count == 2 && Set(ids + [apns[0]]).count == 3, "\(ids)")
            }
        }

        @Test("a 410 storm on 1,000 devices deletes none: the batch breaker trips")
        func staleStorm() async throws {
            try await withHarness { h in
                var params: [[String: Any]] = []
                for i in 0..<1000 {
                    params.append(["user": "storm-\(i / 10)", "platform": "apns", "token": hex(i)])
                }
                _ = try h.registerMany(params)
                try await h.gateways.program("apns", [["status": 410, "reason": "Unregistered"]])
                let users = (0..<100).map { "storm-\($0)" }
                let r = try h.sendAndWait(["to": ["users": users]])
                #expect(r["devices"] as? Int == 1000)
                #expect(counts(r)["removed_stale"] == 0 && counts(r)["failed"] == 1000, "\(counts(r))")
                let s = try h.ok("system.stats")
                let apns = (s["transports"] as? [String: [String: Int]])?["apns"] ?? [:]
                #expect(apns["breaker_trips"] == 1 && apns["stale_refused"] == 1000)
                #expect((s["devices"] as? [String: Int])?["apns"] == 1000)
                let reason =
                    deviceStates(try h.status(r["message_id"] as! String)).first?["reason"] as? String
                #expect(reason == "Unregistered (stale; not deleted: breaker_tripped)")
            }
        }

        @Test("a slow trickle of stale answers stops at the per-platform window cap")
        func windowCap() async throws {
            try await withHarness(delivery: "stale_window_cap = 3\nbackoff_base_ms = 50") { h in
                for i in 0..<6 { try h.registerFCM("w\(i)", "fcm-w\(i)") }
                try await h.gateways.program("fcm", [["error": "UNREGISTERED"]])
                var removed = 0
                var refused = 0
                for i in 0..<6 {
                    let r = try h.sendAndWait(["to": ["users": ["w\(i)"]]])
                    removed += counts(r)["removed_stale"] ?? 0
                    refused += counts(r)["failed"] ?? 0
                }
                #expect(removed == 3 && refused == 3)
                let fcm =
                    (try h.ok("system.stats")["transports"] as? [String: [String: Int]])?["fcm"] ?? [:]
                #expect(fcm["removed_stale"] == 3 && fcm["stale_refused"] == 3 && fcm["breaker_trips"] == 0)
            }
        }

        @Test("a full queue answers overloaded with retry_after_ms, nothing stored")
        func backPressure() async throws {
            try await withHarness(delivery: "max_queued = 2") { h in
                try h.registerAPNs("o", hex(1))
                try h.registerAPNs("o", hex(2))
                try h.registerAPNs("o", hex(3))
                let r = try h.call("push.send", ["to": ["users": ["o"]]])
                #expect(r.errorCode == 1007 && r.errorData?["reason"] as? String == "overloaded")
                #expect(r.errorData?["retry_after_ms"] as? Int ?? 0 > 0)
                #expect(try await h.gateways.received("apns").isEmpty)
                try h.registerFCM("o2", "fcm-o2")
                #expect(try h.sendAndWait(["to": ["users": ["o2"]]])["devices"] as? Int == 1)
            }
        }

        @Test(
            "a transport without credentials: its devices are skipped with the reason, health says disabled"
        )
        func disabledTransport() async throws {
            try await withHarness(transports: ["apns"]) { h in
                try h.registerAPNs("d", hex(1))
                try h.registerFCM("d", "fcm-d")
                let r = try h.sendAndWait(["to": ["users": ["d"]]])
                #expect(r["devices"] as? Int == 1 && r["skipped"] as? Int == 1)
                let skipped = deviceStates(try h.status(r["message_id"] as! String)).first {
                    $0["platform"] as? String == "fcm"
                }
                #expect(
                    skipped?["reason"] as? String == "transport_disabled: no fcm_credentials configured")
                let health = try h.ok("system.health")
                let states = (health["transports"] as? [String: Any])?["default"] as? [String: String]
                #expect(
                    states == [
                        "apns": "ready", "fcm": "disabled:no fcm_credentials configured",
                        "web": "disabled:no vapid_key configured",
                    ])
                #expect(health["status"] as? String == "ok")
            }
        }

        @Test("wait answers at timeout_ms with the counts so far")
        func waitTimeout() async throws {
            try await withHarness { h in
                try h.registerAPNs("h", hex(1))
                try await h.gateways.knobs("apns", ["hang_tokens": [hex(1)]])
                let started = Date()
                let r = try h.sendAndWait(["to": ["users": ["h"]]], timeoutMs: 400)
                #expect(Date().timeIntervalSince(started) >= 0.35)
                #expect(r["state"] as? String == "pending" && counts(r)["in_flight"] == 1)
                h.daemon.kill9()  // a graceful stop would give the hung send its 10 s
            }
        }
    }
}
