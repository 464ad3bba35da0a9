import Foundation
import HeraldTestSupport
import Testing

extension PushDelivery {
    @Suite("Fan-out through the socket to the provider gateways")
    struct FanOutTests {
        @Test("one message to 500 devices of every platform: every body checked at the gateways")
        func fiveHundredMixed() async throws {
            try await withHarness { h in
                // 100 users: 2 Web Push, 1 APNs, 1 VoIP (rings only, so skipped here), 1 FCM each.
                var params: [[String: Any]] = []
                var subscriptions: [String: String] = [:]  // gateway subscription id -> user
                for u in 0..<100 {
                    let user = "user-\(u)"
                    for k in 0..<2 {
                        let s = try await h.subscription()
                        subscriptions[s.id] = user
                        params.append([
                            "user": user, "platform": "web", "token": s.endpoint,
                            "keys": ["p256dh": s.p256dh, "auth": s.auth],
                        ])
                        _ = k
                    }
                    params.append(["user": user, "platform": "apns", "token": hex(u)])
                    params.append([
                        "user": user, "platform": "apns", "token": hex(u, prefix: 1),
                        "environment": "development",
                    ])
                    params.append(["user": user, "platform": "apns_voip", "token": hex(u, prefix: 2)])
                    params.append(["user": user, "platform": "fcm", "token": "fcm-token-\(u)"])
                }
                _ = try h.registerMany(params)
                // The gateways know which environment issued each token: one sent to the other
                // environment's host is refused (BadDeviceToken), as at Apple.
                try await h.gateways.post(
                    "/control/apns-devices", ["gateway": "apns", "tokens": (0..<100).map { hex($0) }])
                try await h.gateways.post(
                    "/control/apns-devices", ["gateway": "apns_dev", "tokens": (0..<100).map { hex($0, prefix: 1) }])
                let users = (0..<100).map { "user-\($0)" }
                var badges: [String: Int] = [:]
                for (i, u) in users.enumerated() { badges[u] = i }
                let r = try h.sendAndWait([
                    "to": ["users": users], "data": ["thread": "t-1", "msg": "m-9"], "badge": badges,
                    "collapse_key": "thread-t-1", "alert": ["loc_key": "NEW_MESSAGE", "loc_args": ["x"]],
                ])
                #expect(r["devices"] as? Int == 500)
                #expect(r["skipped"] as? Int == 100, "VoIP devices get rings only")
                #expect(r["state"] as? String == "complete")
                #expect(counts(r)["delivered"] == 500, "\(counts(r))")

                let web = try await h.gateways.received("webpush")
                #expect(web.count == 200)
                for rec in web {
                    #expect(rec["valid"] as? Bool == true, "\(rec["errors"] ?? "")")
                    #expect(rec["body_len"] as? Int == 2816)
                    #expect(rec["ttl"] as? Int ?? 0 > 86_000)
                    #expect(rec["urgency"] as? String == "high")
                    #expect((rec["topic"] as? String)?.count == 32)
                    let plain = rec["plaintext_json"] as? [String: Any] ?? [:]
                    let user = subscriptions[rec["token"] as? String ?? ""] ?? "?"
                    #expect(plain["kind"] as? String == "notification")
                    #expect(plain["badge"] as? Int == badges[user])
                    #expect(plain["data"] as? [String: String] == ["thread": "t-1", "msg": "m-9"])
                }
                // Each device went to its environment's host, and no token crossed over.
                let apnsProduction = try await h.gateways.received("apns")
                let apnsDevelopment = try await h.gateways.received("apns_dev")
                #expect(apnsProduction.count == 100 && apnsDevelopment.count == 100)
                #expect(Set(apnsProduction.compactMap { $0["token"] as? String }) == Set((0..<100).map { hex($0) }))
                #expect(
                    Set(apnsDevelopment.compactMap { $0["token"] as? String })
                        == Set((0..<100).map { hex($0, prefix: 1) }))
                let apns = apnsProduction + apnsDevelopment
                for rec in apns {
                    #expect(rec["valid"] as? Bool == true, "\(rec["errors"] ?? "")")
                    let body = rec["body"] as? [String: Any] ?? [:]
                    let aps = body["aps"] as? [String: Any] ?? [:]
                    #expect((aps["alert"] as? [String: Any])?["loc-key"] as? String == "NEW_MESSAGE")
                    #expect(aps["mutable-content"] as? Int == 1)
                    #expect(body["thread"] as? String == "t-1")
                    let headers = rec["headers"] as? [String: String] ?? [:]
                    #expect(headers["apns-topic"] == topic)
                    #expect(headers["apns-push-type"] == "alert")
                    #expect(headers["apns-collapse-id"] == "thread-t-1")
                }
                let fcm = try await h.gateways.received("fcm", query: "&kind=send")
                #expect(fcm.count == 100)
                for rec in fcm {
                    #expect(rec["valid"] as? Bool == true, "\(rec["errors"] ?? "")")
                    let message = (rec["body"] as? [String: Any])?["message"] as? [String: Any] ?? [:]
                    let data = message["data"] as? [String: String] ?? [:]
                    #expect(data["kind"] == "notification" && data["thread"] == "t-1")
                    let android = message["android"] as? [String: Any] ?? [:]
                    #expect(android["priority"] as? String == "HIGH")
                    #expect(android["collapse_key"] as? String == "thread-t-1")
                }
                // The sends went over the daemon's FCM HTTP/2 client (its lane's connections, ALPN h2),
                // never on libcurl's connection, which carried the token request.
                let tokenConns = Set(
                    try await h.gateways.received("fcm", query: "&kind=token").compactMap { $0["conn"] as? Int })
                let sendConns = Set(fcm.compactMap { $0["conn"] as? Int })
                #expect(tokenConns.count == 1)
                #expect((1...2).contains(sendConns.count))
                #expect(sendConns.isDisjoint(with: tokenConns))
                #expect(
                    try await h.gateways.connections("fcm").filter { sendConns.contains($0["id"] as? Int ?? -1) }
                        .allSatisfy { $0["alpn"] as? String == "h2" })
                // Provider tokens were reused, not minted per push.
                // One access token for every send; the token endpoint was asked once for them and once
                // by the credential check at start (its token is its own).
                let bearers = Set(fcm.compactMap { ($0["headers"] as? [String: Any])?["authorization"] as? String })
                #expect(bearers.count == 1)
                let stats = try await h.gateways.get("/control/stats")
                #expect((1...2).contains(stats["fcm_token_requests"] as? Int ?? 0))
                let apnsConnections = try await h.gateways.connections("apns") + h.gateways.connections("apns_dev")
                for c in apnsConnections where (c["requests"] as? Int ?? 0) > 0 {
                    #expect(c["distinct_jwts"] as? Int == 1)
                    #expect(c["stream_violations"] as? Int == 0)
                }
                let vapidTokens = Set(
                    web.compactMap { ($0["vapid"] as? [String: Any])?["jwt_hash"] as? String })
                #expect(vapidTokens.count == 1, "one VAPID token per origin")
                let s = try h.ok("system.stats")
                let transports = s["transports"] as? [String: [String: Int]] ?? [:]
                #expect(transports["web"]?["delivered"] == 200)
                #expect(transports["apns"]?["delivered"] == 200)
                #expect(transports["fcm"]?["delivered"] == 100)
                #expect(
                    (s["apns"] as? [String: Any])?["tokens_signed"] as? Int == 2,
                    "one per lane: production and development")
                // The device registry records the success.
                #expect(
                    try h.devices("user-3").allSatisfy {
                        $0["last_success_at"] is String || $0["platform"] as? String == "apns_voip"
                    })
            }
        }
    }
}

extension PushDelivery {
    @Suite("herald send and herald status")
    struct CommandLineTests {
        @Test("send --wait prints the final counts; status --watch shows progress, then the final status")
        func sendAndWatch() async throws {
            try await withHarness { h in
                let socket = ["--socket", h.daemon.socketPath]
                for i in 0..<5 { try h.registerAPNs("cli", hex(i)) }
                let (s1, out1, err1) = try runHerald(
                    ["send", "--user", "cli", "--data", "thread=t9", "--badge", "2", "--collapse-key", "t9", "--wait"]
                        + socket)
                #expect(s1 == 0, "\(err1)")
                let r1 = try JSONSerialization.jsonObject(with: Data(out1.utf8)) as? [String: Any] ?? [:]
                #expect(r1["state"] as? String == "complete" && counts(r1)["delivered"] == 5)
                let body = try await h.gateways.received("apns").first?["body"] as? [String: Any]
                #expect(body?["thread"] as? String == "t9")

                try await h.gateways.knobs("apns", ["delay_ms": 300])
                let (s2, out2, _) = try runHerald(["send", "--user", "cli"] + socket)
                #expect(s2 == 0)
                let id = try #require(
                    (try JSONSerialization.jsonObject(with: Data(out2.utf8)) as? [String: Any])?["message_id"]
                        as? String)
                let (s3, out3, err3) = try runHerald(["status", id, "--watch", "--interval-ms", "50"] + socket)
                #expect(s3 == 0)
                #expect(err3.contains("pending") && err3.contains("complete 5/5: delivered 5"), "\(err3)")
                let final = try JSONSerialization.jsonObject(with: Data(out3.utf8)) as? [String: Any] ?? [:]
                #expect(final["state"] as? String == "complete")

                let (s4, _, err4) = try runHerald(
                    ["send", "--user", "cli", "--device", String(repeating: "a", count: 32)] + socket)
                #expect(s4 == 2 && err4.contains("not both"))
                let (s5, _, err5) = try runHerald(["status", String(repeating: "0", count: 32)] + socket)
                #expect(s5 == 1 && err5.contains("1003"))
            }
        }
    }
}
