import FCM
import Foundation
import HTTP2
import HeraldTestSupport
import HTTPClient
import HeraldCore
import HeraldTransport
import HeraldCrypto
import HeraldIO
import Testing

@Suite("FCM sender against the test gateway, over libcurl and over the HTTP/2 client", .serialized)
struct FCMSenderTests {
    @Test(arguments: Carrier.allCases)
    func sendIsDelivered(_ carrier: Carrier) async throws {
        try await withFCMGateways(carrier) { g in
            let sender = try g.sender()
            let (outcome, info) = await sender.send(body: fcmBody(token: "device-1"))
            #expect(outcome == .delivered)
            #expect(info?.status == 200)
            #expect(info?.messageName?.hasPrefix("projects/\(g.projectID)/messages/") == true)
            #expect(info?.httpVersion == "2", "libcurl negotiates h2 with the gateway too")
            #expect(try await g.tokenRequests() == 1)
            // The cached token serves the next send.
            #expect(await sender.send(body: fcmBody(token: "device-2")).0 == .delivered)
            #expect(try await g.tokenRequests() == 1)
            let sends = try await g.sends()
            try #require(sends.count == 2)
            for record in sends {
                #expect(record["valid"] as? Bool == true, "errors: \(record["errors"] ?? "")")
                #expect(record["path"] as? String == "/v1/projects/\(g.projectID)/messages:send")
                #expect(record["http_version"] as? String == "h2")
                let headers = record["headers"] as? [String: Any] ?? [:]
                #expect(headers["content-type"] as? String == "application/json; charset=UTF-8")
                #expect((headers["authorization"] as? String)?.hasPrefix("Bearer ya29.") == true)
            }
            #expect(sends[0]["conn"] as? Int == sends[1]["conn"] as? Int, "one connection carried both")
            #expect(!sender.usesHTTP1)
            if let http2 = g.http2 {
                #expect(sender.carriesHTTP2)
                #expect(http2.laneCount == 1)
                #expect(http2.stats.connectionsOpened == 1)
                #expect(http2.stats.connectionsOpen == 1, "the lane keeps its connection (120 s idle timeout)")
                #expect(FCMSender.idleTimeout == .seconds(120))
            } else {
                #expect(!sender.carriesHTTP2)
            }
        }
    }

    @Test(
        "an attempt's receipt carries the message name FCM answered with, the origin and the time taken",
        arguments: Carrier.allCases)
    func receiptCarriesTheMessageName(_ carrier: Carrier) async throws {
        try await withFCMGateways(carrier) { g in
            let transport = FCMTransport(sender: try g.sender(), settings: FCMAppSettings())
            let now = Int64(Date().timeIntervalSince1970 * 1000)
            let job = DeliveryJob(
                deliveryID: 1, messageID: "m1", app: "default", deviceID: "d1", user: "u", platform: .fcm,
                environment: nil, token: "device-r", keys: nil, tokenHash: "h", registeredAt: now - 1000,
                message: PushMessage(kind: .notification, badge: 1), acceptedAt: now, expiresAt: now + 60_000,
                previousAttempts: 0)
            let report = await withCheckedContinuation { (c: CheckedContinuation<AttemptReport, Never>) in
                transport.send(job) { c.resume(returning: $0) }
            }
            #expect(report.outcome == .delivered)
            let record = try #require(try await g.sends(token: "device-r").last)
            let name = ((record["response"] as? [String: Any])?["body"] as? [String: Any])?["name"] as? String
            #expect(name != nil)
            #expect(report.receipt?.fcmName == name)
            #expect(report.receipt?.origin == transport.sender.origin)
            #expect((report.receipt?.elapsedMs ?? -1) >= 0)
        }
    }

    @Test(arguments: Carrier.allCases)
    func fiftyConcurrentSendsShareOneTokenRequest(_ carrier: Carrier) async throws {
        try await withFCMGateways(carrier) { g in
            let sender = try g.sender()
            let outcomes = await withTaskGroup(of: Outcome.self) { group in
                for i in 0..<50 {
                    group.addTask { await sender.send(body: fcmBody(token: "device-\(i)")).0 }
                }
                var all: [Outcome] = []
                for await o in group { all.append(o) }
                return all
            }
            #expect(outcomes.count == 50)
            #expect(outcomes.allSatisfy { $0 == .delivered })
            #expect(try await g.tokenRequests() == 1)
            #expect(sender.tokens.exchangeCount == 1)
        }
    }

    @Test(arguments: Carrier.allCases)
    func unregisteredIsStale(_ carrier: Carrier) async throws {
        try await withFCMGateways(carrier) { g in
            try await g.program(token: "gone", [["error": "UNREGISTERED"]])
            let sender = try g.sender()
            let (outcome, info) = await sender.send(body: fcmBody(token: "gone"))
            #expect(outcome == .stale(reason: .fcmUnregistered))
            #expect(info?.status == 404)
            #expect(info?.errorCode == "UNREGISTERED")
        }
    }

    @Test(arguments: Carrier.allCases)
    func invalidArgumentIsFailed(_ carrier: Carrier) async throws {
        try await withFCMGateways(carrier) { g in
            try await g.program(token: "bad", [["error": "INVALID_ARGUMENT"]])
            let sender = try g.sender()
            let (outcome, info) = await sender.send(body: fcmBody(token: "bad"))
            #expect(outcome == .failed(reason: .fcmInvalidArgument))
            #expect(info?.status == 400)
        }
    }

    @Test(arguments: Carrier.allCases)
    func quotaExceededRetriesAfterHeader(_ carrier: Carrier) async throws {
        try await withFCMGateways(carrier) { g in
            try await g.program(token: "busy", [["error": "QUOTA_EXCEEDED", "retry_after": 7]])
            let sender = try g.sender()
            let (outcome, info) = await sender.send(body: fcmBody(token: "busy"))
            #expect(outcome == .retry(after: .seconds(7), reason: .fcmQuotaExceeded))
            #expect(info?.status == 429)
            #expect(info?.retryAfter == "7")
        }
    }

    @Test(arguments: Carrier.allCases)
    func unavailableRetries(_ carrier: Carrier) async throws {
        try await withFCMGateways(carrier) { g in
            try await g.program(token: "down", [["error": "UNAVAILABLE"]])
            let sender = try g.sender()
            let (outcome, _) = await sender.send(body: fcmBody(token: "down"))
            #expect(outcome == .retry(after: .seconds(1), reason: .fcmUnavailable))
        }
    }

    @Test(arguments: Carrier.allCases)
    func errorStatusIsTheFallbackCode(_ carrier: Carrier) async throws {
        try await withFCMGateways(carrier) { g in
            // No details: the top-level error.status is the code.
            try await g.program(
                token: "x",
                [
                    [
                        "status": 404, "body": ["error": ["code": 404, "message": "gone", "status": "NOT_FOUND"]],
                    ]
                ])
            let sender = try g.sender()
            let (outcome, info) = await sender.send(body: fcmBody(token: "x"))
            #expect(info?.errorCode == "NOT_FOUND")
            // A plain NOT_FOUND says nothing about the token: failed, the device kept.
            #expect(outcome == .failed(reason: ProviderReason("NOT_FOUND")))
        }
    }

    @Test(arguments: Carrier.allCases)
    func unregisteredOnlyFromTheFcmErrorDetail(_ carrier: Carrier) async throws {
        try await withFCMGateways(carrier) { g in
            // UNREGISTERED as the top-level status, with no FcmError detail: not stale.
            try await g.program(
                token: "x",
                [
                    [
                        "status": 404, "body": ["error": ["code": 404, "message": "gone", "status": "UNREGISTERED"]],
                    ]
                ])
            try await g.program(
                token: "y",
                [
                    [
                        "status": 404,
                        "body": [
                            "error": [
                                "code": 404, "message": "gone", "status": "NOT_FOUND",
                                "details": [
                                    [
                                        "@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError",
                                        "errorCode": "UNREGISTERED",
                                    ]
                                ],
                            ]
                        ],
                    ]
                ])
            let sender = try g.sender()
            #expect(await sender.send(body: fcmBody(token: "x")).0 == .failed(reason: .fcmUnregistered))
            #expect(await sender.send(body: fcmBody(token: "y")).0 == .stale(reason: .fcmUnregistered))
        }
    }

    @Test(arguments: Carrier.allCases)
    func thirdPartyAuthErrorInvalidatesTheToken(_ carrier: Carrier) async throws {
        try await withFCMGateways(carrier) { g in
            try await g.program(token: "auth", [["error": "THIRD_PARTY_AUTH_ERROR"]])
            let sender = try g.sender()
            let (outcome, _) = await sender.send(body: fcmBody(token: "auth"))
            #expect(outcome == .authRejected(reason: .fcmThirdPartyAuthError))
            #expect(try await g.tokenRequests() == 2, "the 401 was sent once more with a fresh token")
            #expect(sender.tokens.cachedToken == nil)
            #expect(await sender.send(body: fcmBody(token: "fine")).0 == .delivered)
            #expect(try await g.tokenRequests() == 3)
        }
    }

    @Test(arguments: Carrier.allCases)
    func revokedTokenIsRefreshedAndTheSendRepeatedOnce(_ carrier: Carrier) async throws {
        try await withFCMGateways(carrier) { g in
            let sender = try g.sender()
            #expect(await sender.send(body: fcmBody(token: "a")).0 == .delivered)
            try await g.controlPost("/control/fcm-revoke", ["all": true])
            // The 401 invalidates the access token and the push goes again with a fresh one.
            #expect(await sender.send(body: fcmBody(token: "a")).0 == .delivered)
            #expect(try await g.tokenRequests() == 2)
            // A 401 that persists is sent twice, then reported.
            try await g.program(token: "b", [["error": "THIRD_PARTY_AUTH_ERROR"]])
            let (outcome, info) = await sender.send(body: fcmBody(token: "b"))
            #expect(outcome.fcmIsAuthRejected)
            #expect(info?.status == 401)
            let sends = try await g.controlGet("/control/received?gateway=fcm&kind=send&token=b")["requests"] as? [Any]
            #expect(sends?.count == 2)
            #expect(try await g.tokenRequests() == 3)
        }
    }

    @Test(arguments: Carrier.allCases)
    func tokenNearExpiryByClockIsRefreshed(_ carrier: Carrier) async throws {
        try await withFCMGateways(carrier) { g in
            // The cache's clock starts 3500 s behind: the token it gets (expires_in 3600)
            // ends, by that clock, 100 s after real "now", inside the 5-minute margin.
            let clock = OffsetClock(offsetMs: -3_500_000)
            let sender = try g.sender(clock: clock)
            #expect(await sender.send(body: fcmBody(token: "a")).0 == .delivered)
            #expect(await sender.send(body: fcmBody(token: "a")).0 == .delivered)
            #expect(try await g.tokenRequests() == 1)
            clock.advance(ms: 3_500_000)
            #expect(await sender.send(body: fcmBody(token: "a")).0 == .delivered)
            #expect(try await g.tokenRequests() == 2)
        }
    }

    @Test(arguments: Carrier.allCases)
    func shortGatewayExpiryIsRefreshed(_ carrier: Carrier) async throws {
        try await withFCMGateways(carrier) { g in
            try await g.programTokenEndpoint([["status": 200, "expires_in": 2]])
            let sender = try g.sender(refreshMargin: .seconds(1))
            #expect(await sender.send(body: fcmBody(token: "a")).0 == .delivered)
            #expect(await sender.send(body: fcmBody(token: "a")).0 == .delivered)
            #expect(try await g.tokenRequests() == 1)
            try await Task.sleep(for: .milliseconds(1500))
            #expect(await sender.send(body: fcmBody(token: "a")).0 == .delivered)
            #expect(try await g.tokenRequests() == 2)
        }
    }

    @Test(arguments: Carrier.allCases)
    func tokenEndpointErrorReachesEveryWaiter(_ carrier: Carrier) async throws {
        try await withFCMGateways(carrier) { g in
            try await g.programTokenEndpoint([["status": 400, "error": "invalid_grant", "message": "nope"]])
            let cache = FCMAccessTokenCache(
                account: try g.account(), transport: OriginTransport(http1: g.client, clock: SystemClock()))
            let results = await withTaskGroup(of: Result<String, FCMAccessTokenError>.self) { group in
                for _ in 0..<10 {
                    group.addTask {
                        do throws(FCMAccessTokenError) { return .success(try await cache.token()) } catch {
                            return .failure(error)
                        }
                    }
                }
                var all: [Result<String, FCMAccessTokenError>] = []
                for await r in group { all.append(r) }
                return all
            }
            #expect(results.count == 10)
            for r in results {
                guard case .failure(.status(400, let error, _)) = r else {
                    Issue.record("unexpected \(r)")
                    continue
                }
                #expect(error == "invalid_grant")
            }
            let requests = try await g.tokenRequests()
            #expect(cache.exchangeCount == requests)
            #expect(cache.exchangeCount <= 10)
            // A sender turns it into authRejected; a 5xx would be a retry.
            let sender = try g.sender()
            #expect(
                await sender.send(body: fcmBody(token: "a")).0 == .authRejected(reason: ProviderReason("invalid_grant"))
            )
            try await g.programTokenEndpoint([["status": 503]])
            #expect(await sender.send(body: fcmBody(token: "a")).0.fcmIsRetry)
        }
    }

    @Test(arguments: Carrier.allCases)
    func transportErrorIsTransient(_ carrier: Carrier) async throws {
        try await withFCMGateways(carrier) { g in
            // Token from the gateway, send to a closed port.
            let sender = try g.sender(baseURL: "https://127.0.0.1:1")
            let (outcome, info) = await sender.send(body: fcmBody(token: "a"))
            #expect(outcome == .transient(reason: .connectFailure))
            #expect(info == nil)
            if let http2 = g.http2 {
                // A failed connection is not a refusal of HTTP/2: the origin stays on the HTTP/2 client.
                #expect(http2.stats.connectFailures == 1)
                #expect(!sender.usesHTTP1)
            }
        }
    }
}

// MARK: - The HTTP/2 carrier

@Suite("FCM sender over the HTTP/2 client", .serialized)
struct FCMSenderHTTP2Tests {
    @Test("50 concurrent sends share one HTTP/2 connection (ALPN h2) and one access token")
    func oneConnection() async throws {
        try await withFCMGateways(.http2) { g in
            let http2 = try #require(g.http2)
            // Answers are held for 200 ms, so the streams overlap on the connection.
            try await g.gateways.knobs("fcm", ["delay_ms": 200])
            let sender = try g.sender()
            let results = await withTaskGroup(of: (Outcome, HTTPStatusInfo?).self) { group in
                for i in 0..<50 { group.addTask { await sender.send(body: fcmBody(token: "device-\(i)")) } }
                var all: [(Outcome, HTTPStatusInfo?)] = []
                for await result in group { all.append(result) }
                return all
            }
            #expect(results.count == 50)
            #expect(results.allSatisfy { $0.0 == .delivered && $0.1?.status == 200 && $0.1?.httpVersion == "2" })

            let sends = try await g.sends()
            #expect(sends.count == 50)
            #expect(Set(sends.compactMap { $0["token"] as? String }).count == 50)
            #expect(sends.allSatisfy { $0["valid"] as? Bool == true && $0["http_version"] as? String == "h2" })
            let conns = Set(sends.compactMap { $0["conn"] as? Int })
            try #require(conns.count == 1)
            let connections = try await g.gateways.connections("fcm")
            // The HTTP/2 client's connection, and libcurl's for the one token request.
            #expect(connections.count == 2)
            let connection = try #require(connections.first { $0["id"] as? Int == conns.first })
            #expect(connection["alpn"] as? String == "h2")
            #expect(connection["requests"] as? Int == 50)
            #expect((connection["peak_open_streams"] as? Int ?? 0) > 1, "the streams were concurrent")
            #expect(connection["stream_violations"] as? Int == 0)
            #expect(connection["closed"] is NSNull)
            #expect(http2.laneCount == 1)
            #expect(http2.stats.connectionsOpened == 1)
            #expect(http2.stats.requestsSent == 50)
            #expect(try await g.tokenRequests() == 1)
            #expect(sender.tokens.exchangeCount == 1)
        }
    }

    @Test(
        "An FCM origin without ALPN h2 is sent through libcurl over HTTP/1.1, the first request included, and remembered"
    )
    func http1OnlyOrigin() async throws {
        try await withFCMGateways(.http2) { g in
            let http2 = try #require(g.http2)
            #expect(g.gateways.fcmH1 != 0 && g.gateways.fcmH1 != g.gateways.fcm)
            // The token endpoint (token_uri) stays on the h2 listener; the sends go to the HTTP/1.1-only one.
            let sender = try g.sender(baseURL: g.fcmH1Base)
            #expect(!sender.usesHTTP1)

            let (first, firstInfo) = await sender.send(body: fcmBody(token: "a"))
            #expect(first == .delivered)
            #expect(firstInfo?.status == 200)
            #expect(firstInfo?.httpVersion == "1.1")
            #expect(sender.usesHTTP1)
            #expect(http2.stats.connectFailures == 1, "one HTTP/2 attempt, refused in ALPN")
            // Classification is the same through the fallback.
            try await g.program(token: "gone", [["error": "UNREGISTERED"]])
            let (gone, goneInfo) = await sender.send(body: fcmBody(token: "gone"))
            #expect(gone == .stale(reason: .fcmUnregistered))
            #expect(goneInfo?.errorCode == "UNREGISTERED")

            let sends = try await g.sends(listener: "fcm_h1")
            try #require(sends.count == 2)
            #expect(sends.allSatisfy { $0["valid"] as? Bool == true && $0["http_version"] as? String == "http/1.1" })
            let connections = try await g.gateways.connections("fcm_h1")
            // The HTTP/2 client's attempt, which got no ALPN protocol, and libcurl's HTTP/1.1 connection(s).
            let refused = connections.filter { $0["alpn"] is NSNull }
            let carried = connections.filter { $0["alpn"] as? String == "http/1.1" }
            #expect(refused.count == 1, "the second send did not try HTTP/2 again")
            #expect(refused.allSatisfy { $0["requests"] as? Int == 0 })
            #expect(carried.reduce(0) { $0 + ($1["requests"] as? Int ?? 0) } == 2)
            #expect(connections.count == refused.count + carried.count)
            #expect(http2.stats.connectFailures == 1)
            #expect(http2.stats.requestsSent == 0)
            #expect(try await g.tokenRequests() == 1)

            // A sender for the h2 origin on the same client still gets HTTP/2.
            let other = try g.sender()
            #expect(await other.send(body: fcmBody(token: "b")).0 == .delivered)
            #expect(!other.usesHTTP1)
            #expect(http2.stats.requestsSent == 1)
            let h2Sends = try await g.sends()
            #expect(h2Sends.count == 1)
            let h2Connections = try await g.gateways.connections("fcm").filter {
                $0["id"] as? Int == h2Sends.first?["conn"] as? Int
            }
            #expect(h2Connections.map { $0["alpn"] as? String } == ["h2"])
        }
    }
}

extension Outcome {
    var fcmIsAuthRejected: Bool { if case .authRejected = self { true } else { false } }
    var fcmIsRetry: Bool { if case .retry = self { true } else { false } }
}
