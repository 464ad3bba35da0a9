import HeraldCore
import Testing

@Suite("delivery state")
struct DeliveryStateTests {
    @Test("raw values are push.status's strings")
    func rawValues() {
        #expect(
            DeliveryState.allCases.map(\.rawValue) == [
                "queued", "held", "in_flight", "delivered", "retrying", "failed", "expired", "superseded", "skipped",
                "removed_stale",
            ])
        #expect(DeliveryState(rawValue: "removed_stale") == .removedStale)
        #expect(DeliveryState(rawValue: "in-flight") == nil)
    }

    @Test("only queued, held, in_flight and retrying are not final")
    func final() {
        #expect(DeliveryState.allCases.filter { !$0.isFinal } == [.queued, .held, .inFlight, .retrying])
    }
}
