import FCM
import Foundation
import HeraldCore
import HeraldCrypto
import HeraldIO
import HeraldNet
import HeraldTransport
import Testing

@Suite("FCM credential probe")
struct FCMCredentialProbeVerdictTests {
    @Test("the token endpoint: a 4xx rejects the credential, a 429/5xx or no answer proves nothing")
    func tokenEndpoint() {
        #expect(
            FCMCredentialProbe.verdict(tokenError: .status(400, error: "invalid_grant", retryAfter: nil))
                == .rejected("invalid_grant"))
        #expect(
            FCMCredentialProbe.verdict(tokenError: .status(401, error: nil, retryAfter: nil)) == .rejected("http_401"))
        #expect(
            FCMCredentialProbe.verdict(tokenError: .status(503, error: nil, retryAfter: "1"))
                == .unreachable("http_503"))
        #expect(
            FCMCredentialProbe.verdict(tokenError: .status(429, error: "rate_limited", retryAfter: nil))
                == .unreachable("rate_limited"))
        #expect(
            FCMCredentialProbe.verdict(tokenError: .transport(.http1(.connectFailed("refused"))))
                == .unreachable("connect_failure"))
        #expect(FCMCredentialProbe.verdict(tokenError: .badResponse("x")) == .unreachable("token_bad_response"))
    }

    @Test("the validate_only send: 200 proves it, 401/403/404 reject it, 429/5xx prove nothing")
    func send() {
        #expect(FCMCredentialProbe.verdict(status: 200, errorCode: nil) == .ok)
        #expect(FCMCredentialProbe.verdict(status: 400, errorCode: "INVALID_ARGUMENT") == .ok)
        #expect(FCMCredentialProbe.verdict(status: 401, errorCode: "UNAUTHENTICATED") == .rejected("UNAUTHENTICATED"))
        #expect(
            FCMCredentialProbe.verdict(status: 403, errorCode: "PERMISSION_DENIED") == .rejected("PERMISSION_DENIED"))
        #expect(
            FCMCredentialProbe.verdict(status: 403, errorCode: "SENDER_ID_MISMATCH") == .rejected("SENDER_ID_MISMATCH"))
        #expect(FCMCredentialProbe.verdict(status: 404, errorCode: "NOT_FOUND") == .rejected("NOT_FOUND"))
        #expect(FCMCredentialProbe.verdict(status: 503, errorCode: "UNAVAILABLE") == .unreachable("UNAVAILABLE"))
        #expect(FCMCredentialProbe.verdict(status: 500, errorCode: nil) == .unreachable("http_500"))
    }

    @Test("the probe's body is a validate_only message to a topic")
    func body() throws {
        let json = try #require(
            try JSONSerialization.jsonObject(with: Data(FCMCredentialProbe.body)) as? [String: Any])
        #expect(json["validate_only"] as? Bool == true)
        #expect((json["message"] as? [String: Any])?["topic"] as? String == FCMCredentialProbe.topic)
        #expect((json["message"] as? [String: Any])?["token"] == nil)
    }
}

@Suite("FCM credential probe against the test gateway", .serialized)
struct FCMCredentialProbeTests {
    private func probe(_ sender: FCMSender) async -> CredentialVerdict {
        await withCheckedContinuation { c in sender.probeCredential(timeout: .seconds(5)) { c.resume(returning: $0) } }
    }

    @Test(
        "a good account is ok through a fresh exchange and a dry run; a revoked key, invalid_grant; another project, PERMISSION_DENIED; no user push",
        arguments: Carrier.allCases)
    func probes(_ carrier: Carrier) async throws {
        let g = try await FCMGateways(carrier)
        defer { g.stop() }
        let sender = try g.sender()
        #expect(await probe(sender) == .ok)
        #expect(await probe(sender) == .ok)
        #expect(try await g.tokenRequests() == 2, "each check exchanges afresh")
        #expect(sender.tokens.cachedToken == nil, "the check's token is its own: the sends' cache is untouched")
        #expect(sender.tokens.exchangeCount == 0)
        #expect(await sender.send(body: fcmBody(token: "device-1")).0 == .delivered)
        #expect(sender.tokens.cachedToken != nil)

        // Another project than the key's: authenticated, not allowed.
        let other = FCMSender(
            account: try g.account(projectID: "someone-else"), baseURL: try HTTPURL(parsing: g.fcmBase),
            transport: OriginTransport(http1: g.client, http2: g.http2, clock: SystemClock()))
        #expect(await probe(other) == .rejected("PERMISSION_DENIED"))

        // The key deleted at Google: refused at the token endpoint, whatever is cached.
        try await g.controlPost("/control/fcm-revoke", ["client_email": g.clientEmail, "key": true])
        #expect(await probe(sender) == .rejected("invalid_grant"))
        #expect(sender.tokens.cachedToken != nil, "a failed check leaves the cached token alone")

        let dryRuns = try await g.gateways.received("fcm", query: "&kind=send&probes=only")
        #expect(dryRuns.count == 3)
        #expect(try await g.sends().count == 1, "the one send; a probe is never a push to a device")
    }

    @Test("the token endpoint unreachable: unreachable")
    func unreachable() async throws {
        let g = try await FCMGateways(.curl)
        defer { g.stop() }
        try await g.programTokenEndpoint([["status": 503, "error": "temporarily_unavailable"]])
        #expect(await probe(try g.sender()) == .unreachable("temporarily_unavailable"))
    }
}
