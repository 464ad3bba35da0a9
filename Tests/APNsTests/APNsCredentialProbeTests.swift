import APNs
import HeraldCore
import HeraldCrypto
import HeraldTestSupport
import Testing

@Suite("APNs credential probe")
struct APNsCredentialProbeVerdictTests {
    @Test("an answer that judged the device token proves the key; a 403 rejects it; the rest proves nothing")
    func verdicts() {
        let cases: [(Int, String?, CredentialVerdict)] = [
            (400, "BadDeviceToken", .ok),
            (200, nil, .ok),
            (410, "Unregistered", .ok),
            (400, "BadPriority", .ok),
            (403, "InvalidProviderToken", .rejected("InvalidProviderToken")),
            (403, "ExpiredProviderToken", .rejected("ExpiredProviderToken")),
            (403, "MissingProviderToken", .rejected("MissingProviderToken")),
            (403, nil, .rejected("http_403")),
            (400, "TopicDisallowed", .rejected("TopicDisallowed")),
            (429, "TooManyProviderTokenUpdates", .unreachable("TooManyProviderTokenUpdates")),
            (503, "ServiceUnavailable", .unreachable("ServiceUnavailable")),
            (500, nil, .unreachable("http_500")),
            (404, "BadPath", .unreachable("BadPath")),
        ]
        for (status, reason, want) in cases {
            #expect(APNsCredentialProbe.verdict(status: status, reason: reason) == want, "\(status) \(reason ?? "-")")
        }
    }

    @Test("no answer: unreachable, with Herald's transport reason")
    func failures() {
        #expect(APNsCredentialProbe.verdict(error: .connectFailed("refused")) == .unreachable("connect_failure"))
        #expect(APNsCredentialProbe.verdict(error: .timeout("late")) == .unreachable("timeout"))
        #expect(APNsCredentialProbe.verdict(error: .tls("bad cert")) == .unreachable("tls_failure"))
        #expect(APNsCredentialProbe.verdict(error: .dnsFailure("nx")) == .unreachable("dns_failure"))
    }

    @Test("the probe is a silent push to a token of zeros that expires at once")
    func request() {
        let push = APNsCredentialProbe.push(topic: "com.example.app", notAfter: nil)
        #expect(push.deviceToken == String(repeating: "0", count: 64))
        let headers = Dictionary(uniqueKeysWithValues: push.headers.map { ($0.name, $0.value) })
        #expect(headers["apns-push-type"] == "background")
        #expect(headers["apns-priority"] == "5")
        #expect(headers["apns-expiration"] == "0")
        #expect(headers["apns-topic"] == "com.example.app")
        #expect(String(decoding: push.payload, as: UTF8.self) == #"{"aps":{"content-available":1}}"#)
    }
}

extension APNsClientTests {
    private func transport(
        _ h: APNsHarness, app: String = "probe", key: P256PrivateKey = SharedGateways.shared.key, port: Int? = nil,
        clock: any WallClock = SystemClock()
    ) -> APNsTransport {
        let endpoint = APNsEndpoint(host: "127.0.0.1", port: port ?? h.gateways.apns)
        return APNsTransport(
            client: h.client, app: app, signer: APNsSigner(key: key, keyID: apnsKeyID, teamID: apnsTeamID),
            settings: APNsAppSettings(topic: apnsTopic), production: endpoint, development: endpoint, clock: clock)
    }

    private func probe(_ t: APNsTransport) async -> CredentialVerdict {
        await withCheckedContinuation { c in t.probeCredential(timeout: .seconds(5)) { c.resume(returning: $0) } }
    }

    @Test(
        "probes against the gateway: a good key is ok (BadDeviceToken), a wrong or stale one rejected, a closed port unreachable; no user push"
    )
    func credentialProbe() async throws {
        let h = try await APNsHarness.make()
        defer { h.client.shutdown() }
        #expect(await probe(transport(h)) == .ok)
        #expect(await probe(transport(h, key: try P256PrivateKey.generate())) == .rejected("InvalidProviderToken"))
        #expect(await probe(transport(h, app: "closed", port: 1)) == .unreachable("connect_failure"))
        let probes = try await h.gateways.received("apns", query: "&probes=only")
        #expect(probes.map { $0["response"].flatMap { ($0 as? [String: Any])?["status"] as? Int } } == [400, 403])
        #expect(try await h.gateways.received("apns").isEmpty, "a probe is never a push to a device")
    }

    @Test("a provider token older than an hour: ExpiredProviderToken, rejected")
    func expiredCredentialProbe() async throws {
        let h = try await APNsHarness.make(clockOffsetMs: -2 * 3600 * 1000)
        defer { h.client.shutdown() }
        #expect(await probe(transport(h, clock: h.clock)) == .rejected("ExpiredProviderToken"))
    }
}
