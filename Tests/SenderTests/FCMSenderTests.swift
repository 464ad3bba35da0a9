import FCM
import Foundation
import HeraldTestSupport
import HTTPClient
import HeraldCore
import HeraldCrypto
import HeraldDelivery
import Synchronization
import Testing

@Suite("FCM sender against the test gateway", .serialized)
struct FCMSenderTests {
    @Test func sendIsDelivered() async throws {
        try await withFCMGateways { g in
            let sender = FCMSender(account: try g.account(), baseURL: g.fcmBase, client: g.client)
            let (outcome, info) = await sender.send(body: fcmBody(token: "device-1"))
            #expect(outcome == .delivered)
            #expect(info?.status == 200)
            #expect(info?.messageName?.hasPrefix("projects/\(g.projectID)/messages/") == true)
            #expect(try await g.tokenRequests() == 1)
            // The cached token serves the next send.
            #expect(await sender.send(body: fcmBody(token: "device-2")).0 == .delivered)
            #expect(try await g.tokenRequests() == 1)
        }
    }

    @Test func fiftyConcurrentSendsShareOneTokenRequest() async throws {
        try await withFCMGateways { g in
            let sender = FCMSender(account: try g.account(), baseURL: g.fcmBase, client: g.client)
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

    @Test func unregisteredIsStale() async throws {
        try await withFCMGateways { g in
            try await g.program(token: "gone", [["error": "UNREGISTERED"]])
            let sender = FCMSender(account: try g.account(), baseURL: g.fcmBase, client: g.client)
            let (outcome, info) = await sender.send(body: fcmBody(token: "gone"))
            #expect(outcome == .stale(reason: .fcmUnregistered))
            #expect(info?.status == 404)
            #expect(info?.errorCode == "UNREGISTERED")
        }
    }

    @Test func invalidArgumentIsFailed() async throws {
        try await withFCMGateways { g in
            try await g.program(token: "bad", [["error": "INVALID_ARGUMENT"]])
            let sender = FCMSender(account: try g.account(), baseURL: g.fcmBase, client: g.client)
            let (outcome, info) = await sender.send(body: fcmBody(token: "bad"))
            #expect(outcome == .failed(reason: .fcmInvalidArgument))
            #expect(info?.status == 400)
        }
    }

    @Test func quotaExceededRetriesAfterHeader() async throws {
        try await withFCMGateways { g in
            try await g.program(token: "busy", [["error": "QUOTA_EXCEEDED", "retry_after": 7]])
            let sender = FCMSender(account: try g.account(), baseURL: g.fcmBase, client: g.client)
            let (outcome, info) = await sender.send(body: fcmBody(token: "busy"))
            #expect(outcome == .retry(after: .seconds(7), reason: .fcmQuotaExceeded))
            #expect(info?.status == 429)
            #expect(info?.retryAfter == "7")
        }
    }

    @Test func unavailableRetries() async throws {
        try await withFCMGateways { g in
            try await g.program(token: "down", [["error": "UNAVAILABLE"]])
            let sender = FCMSender(account: try g.account(), baseURL: g.fcmBase, client: g.client)
            let (outcome, _) = await sender.send(body: fcmBody(token: "down"))
            #expect(outcome == .retry(after: .seconds(1), reason: .fcmUnavailable))
        }
    }

    @Test func errorStatusIsTheFallbackCode() async throws {
        try await withFCMGateways { g in
            // No details: the top-level error.status is the code.
            try await g.program(token: "x", [[
                "status": 404, "body": ["error": ["code": 404, "message": "gone", "status": "NOT_FOUND"]],
            ]])
            let sender = FCMSender(account: try g.account(), baseURL: g.fcmBase, client: g.client)
            let (outcome, info) = await sender.send(body: fcmBody(token: "x"))
            #expect(info?.errorCode == "NOT_FOUND")
            #expect(outcome == .stale(reason: ProviderReason("NOT_FOUND")))
        }
    }

    @Test func thirdPartyAuthErrorInvalidatesTheToken() async throws {
        try await withFCMGateways { g in
            try await g.program(token: "auth", [["error": "THIRD_PARTY_AUTH_ERROR"]])
            let sender = FCMSender(account: try g.account(), baseURL: g.fcmBase, client: g.client)
            let (outcome, _) = await sender.send(body: fcmBody(token: "auth"))
            #expect(outcome == .authRejected(reason: .fcmThirdPartyAuthError))
            #expect(try await g.tokenRequests() == 2, "the 401 was sent once more with a fresh token")
            #expect(sender.tokens.cachedToken == nil)
            #expect(await sender.send(body: fcmBody(token: "fine")).0 == .delivered)
            #expect(try await g.tokenRequests() == 3)
        }
    }

    @Test func revokedTokenIsRefreshedAndTheSendRepeatedOnce() async throws {
        try await withFCMGateways { g in
            let sender = FCMSender(account: try g.account(), baseURL: g.fcmBase, client: g.client)
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

    @Test func tokenNearExpiryByClockIsRefreshed() async throws {
        try await withFCMGateways { g in
            // The cache's clock starts 3500 s behind: the token it gets (expires_in 3600)
            // ends, by that clock, 100 s after real "now", inside the 5-minute margin.
            let clock = OffsetClock(offsetMs: -3_500_000)
            let sender = FCMSender(account: try g.account(), baseURL: g.fcmBase, client: g.client, clock: clock)
            #expect(await sender.send(body: fcmBody(token: "a")).0 == .delivered)
            #expect(await sender.send(body: fcmBody(token: "a")).0 == .delivered)
            #expect(try await g.tokenRequests() == 1)
            clock.advance(ms: 3_500_000)
            #expect(await sender.send(body: fcmBody(token: "a")).0 == .delivered)
            #expect(try await g.tokenRequests() == 2)
        }
    }

    @Test func shortGatewayExpiryIsRefreshed() async throws {
        try await withFCMGateways { g in
            try await g.programTokenEndpoint([["status": 200, "expires_in": 2]])
            let sender = FCMSender(
                account: try g.account(), baseURL: g.fcmBase, client: g.client, refreshMargin: .seconds(1))
            #expect(await sender.send(body: fcmBody(token: "a")).0 == .delivered)
            #expect(await sender.send(body: fcmBody(token: "a")).0 == .delivered)
            #expect(try await g.tokenRequests() == 1)
            try await Task.sleep(for: .milliseconds(1500))
            #expect(await sender.send(body: fcmBody(token: "a")).0 == .delivered)
            #expect(try await g.tokenRequests() == 2)
        }
    }

    @Test func tokenEndpointErrorReachesEveryWaiter() async throws {
        try await withFCMGateways { g in
            try await g.programTokenEndpoint([["status": 400, "error": "invalid_grant", "message": "nope"]])
            let cache = FCMAccessTokenCache(account: try g.account(), client: g.client)
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
            let sender = FCMSender(account: try g.account(), baseURL: g.fcmBase, client: g.client)
            #expect(await sender.send(body: fcmBody(token: "a")).0 == .authRejected(reason: ProviderReason("invalid_grant")))
            try await g.programTokenEndpoint([["status": 503]])
            #expect(await sender.send(body: fcmBody(token: "a")).0.fcmIsRetry)
        }
    }

    @Test func transportErrorIsTransient() async throws {
        try await withFCMGateways { g in
            // Token from the gateway, send to a closed port.
            let sender = FCMSender(account: try g.account(), baseURL: "https://127.0.0.1:1", client: g.client)
            let (outcome, info) = await sender.send(body: fcmBody(token: "a"))
            #expect(outcome == .transient(reason: .connectFailure))
            #expect(info == nil)
        }
    }

    @Test func transportErrorMapping() {
        #expect(FCMSender.outcome(for: .timeout("t")) == .transient(reason: .timeout))
        #expect(FCMSender.outcome(for: .dnsFailure("d")) == .transient(reason: .dnsFailure))
        #expect(FCMSender.outcome(for: .tls("x")) == .transient(reason: .tlsFailure))
        #expect(FCMSender.outcome(for: .connectFailed("c")) == .transient(reason: .connectFailure))
        #expect(FCMSender.outcome(for: .shutdown) == .transient(reason: .shutdown))
    }
}

extension Outcome {
    var fcmIsAuthRejected: Bool { if case .authRejected = self { true } else { false } }
    var fcmIsRetry: Bool { if case .retry = self { true } else { false } }
}
