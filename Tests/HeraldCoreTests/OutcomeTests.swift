import HeraldCore
import Testing

@Suite("transport failures and reasons")
struct OutcomeTests {
    @Test(
        "transport-level failures retry with no provider delay",
        arguments: [
            ProviderReason.timeout, .connectionReset, .goAway, .refusedStream, .dnsFailure, .tlsFailure,
            .connectFailure, .shutdown,
        ])
    func transient(_ reason: ProviderReason) {
        #expect(ProviderReason.transportFailures.contains(reason))
        let outcome = Outcome.transient(reason: reason)
        #expect(outcome == .retry(after: nil, reason: reason))
        #expect(outcome.isRetryable)
        #expect(outcome.reason == reason)
    }

    @Test("an unknown reason is kept verbatim")
    func unknown() {
        let reason = ProviderReason.unknown("BrandNewReason")
        #expect(reason.rawValue == "BrandNewReason")
        #expect(reason.description == "BrandNewReason")
        #expect(!ProviderReason.transportFailures.contains(reason))
        #expect(ProviderReason.httpStatus(418).rawValue == "http_418")
    }

    @Test("only retry, auth rejection and the Web Push step-down lead to another attempt")
    func retryable() {
        #expect(!Outcome.delivered.isRetryable)
        #expect(Outcome.authRejected(reason: ProviderReason("ExpiredProviderToken")).isRetryable)
        #expect(Outcome.tooLarge.isRetryable)
        #expect(Outcome.tooLarge.reason == .payloadTooLarge)
        #expect(!Outcome.failed(reason: ProviderReason("BadDeviceToken")).isRetryable)
        #expect(!Outcome.stale(reason: ProviderReason("Unregistered")).isRetryable)
        #expect(Outcome.delivered.reason == nil)
    }
}
