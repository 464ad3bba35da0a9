import Foundation
import HeraldCore
import HeraldCrypto
import HeraldIO
import HeraldStore
import Testing

@testable import HeraldDaemon

/// A probe that answers what the test says, when it says.
private final class ScriptedProbe: CredentialProbe, @unchecked Sendable {
    private let lock = NSLock()
    private var answers: [CredentialVerdict?]
    private var pending: [@Sendable (CredentialVerdict) -> Void] = []
    private(set) var calls = 0

    /// nil: never answers on its own (``answer(_:)`` does).
    init(_ answers: [CredentialVerdict?]) { self.answers = answers }

    func probeCredential(timeout: Duration, completion: @escaping @Sendable (CredentialVerdict) -> Void) {
        let next: CredentialVerdict? = lock.withLock {
            calls += 1
            let a = answers.count > 1 ? answers.removeFirst() : answers.first ?? nil
            if a == nil { pending.append(completion) }
            return a
        }
        if let next { completion(next) }
    }

    func answer(_ verdict: CredentialVerdict) {
        let waiting = lock.withLock {
            defer { pending = [] }
            return pending
        }
        for w in waiting { w(verdict) }
    }

    var callCount: Int { lock.withLock { calls } }
}

/// The events a monitor wrote.
private final class EventSink: @unchecked Sendable {
    private let lock = NSLock()
    private var written: [NewEvent] = []
    var fail = false

    var events: [NewEvent] { lock.withLock { written } }

    func append(_ events: [NewEvent], _ done: @escaping @Sendable (Result<Void, any Error>) -> Void) {
        lock.withLock { written += events }
        done(fail ? .failure(CocoaError(.fileWriteUnknown)) : .success(()))
    }
}

private func eventually(_ what: String, _ condition: () -> Bool) async throws {
    for _ in 0..<400 {
        if condition() { return }
        try await Task.sleep(for: .milliseconds(10))
    }
    Issue.record("never: \(what)")
}

@Suite("Credential checks")
struct CredentialHealthTests {
    let key = CredentialKey(app: "default", platform: "apns")

    @Test("a VAPID subject must be mailto: or https:")
    func vapidSubject() {
        #expect(VAPIDProbe.verdict(subject: "mailto:ops@example.com") == .ok)
        #expect(VAPIDProbe.verdict(subject: "https://example.com/contact") == .ok)
        #expect(VAPIDProbe.verdict(subject: "ops@example.com") == .rejected("subject must be mailto: or https:"))
        #expect(VAPIDProbe.verdict(subject: "http://example.com") == .rejected("subject must be mailto: or https:"))
    }

    @Test("a VAPID probe with a good subject signs a token with the key")
    func vapidProbe() async throws {
        let probe = VAPIDProbe(key: try P256PrivateKey.generate(), subject: "mailto:ops@example.com")
        let verdict = await withCheckedContinuation { c in
            probe.probeCredential(timeout: .seconds(1)) { c.resume(returning: $0) }
        }
        #expect(verdict == .ok)
    }

    @Test("verdicts are kept with the last success; an event is written on the first and on each change only")
    func verdictsAndEvents() async throws {
        let sink = EventSink()
        let monitor = CredentialMonitor(events: sink.append, log: Logger(level: .error))
        defer { monitor.stop() }
        let probe = ScriptedProbe([
            .ok, .ok, .rejected("InvalidProviderToken"), .rejected("InvalidProviderToken"), .unreachable("timeout"),
        ])
        monitor.replace(probes: [key: probe])
        #expect(monitor.states[key]?.status == "unknown")
        #expect(monitor.states[key]?.checkedAt == nil)

        monitor.checkAll()
        try await eventually("ok") { monitor.states[key]?.status == "ok" }
        let success = try #require(monitor.states[key]?.lastSuccessAt)
        #expect(sink.events.count == 1)
        monitor.checkAll()
        try await eventually("second check") { probe.callCount == 2 && monitor.states[key]?.checkedAt != nil }
        try await Task.sleep(for: .milliseconds(50))
        #expect(sink.events.count == 1, "the same verdict again writes no event")

        monitor.checkAll()
        try await eventually("rejected") { monitor.states[key]?.status == "rejected" }
        let rejected = try #require(monitor.states[key])
        #expect(rejected.reason == "InvalidProviderToken")
        #expect(rejected.lastSuccessAt != nil && rejected.lastSuccessAt! >= success, "the last success is kept")
        try await eventually("the rejection's event") { sink.events.count == 2 }
        let event = sink.events[1]
        #expect(event.kind == .credential && event.app == "default" && event.platform == "apns")
        #expect(event.state == "rejected" && event.reason == "InvalidProviderToken")
        let detail = try #require(
            try JSONSerialization.jsonObject(with: Data((event.detail ?? "").utf8)) as? [String: Any])
        #expect(detail["checked_at"] is String && detail["last_success_at"] is String)

        monitor.checkAll()
        try await Task.sleep(for: .milliseconds(50))
        monitor.checkAll()
        try await eventually("unreachable") { monitor.states[key]?.status == "unreachable" }
        try await eventually("its event") { sink.events.count == 3 }
        #expect(sink.events.map { $0.state ?? "" } == ["ok", "rejected", "unreachable"])
    }

    @Test("one check at a time per credential; a check that does not answer ends unreachable (timeout)")
    func boundedChecks() async throws {
        let sink = EventSink()
        sink.fail = true  // a failed event write is only logged
        let monitor = CredentialMonitor(
            events: sink.append, log: Logger(level: .error), timeout: .milliseconds(50), grace: .milliseconds(50))
        defer { monitor.stop() }
        let probe = ScriptedProbe([nil])
        monitor.replace(probes: [key: probe])
        monitor.checkAll()
        monitor.checkAll()
        monitor.checkAll()
        #expect(probe.callCount == 1)
        try await eventually("timed out") { monitor.states[key]?.status == "unreachable" }
        #expect(monitor.states[key]?.reason == "timeout")
        probe.answer(.ok)  // too late: dropped
        try await Task.sleep(for: .milliseconds(50))
        #expect(monitor.states[key]?.status == "unreachable")
        monitor.checkAll()
        try await eventually("checked again") { probe.callCount == 2 }
    }

    @Test("a reload's probe replaces one being checked: the old verdict is dropped and the new probe asked")
    func replacedWhileChecking() async throws {
        let monitor = CredentialMonitor(events: EventSink().append, log: Logger(level: .error))
        defer { monitor.stop() }
        let old = ScriptedProbe([nil])
        monitor.replace(probes: [key: old])
        monitor.checkAll()
        #expect(old.callCount == 1)
        let new = ScriptedProbe([.ok])
        monitor.replace(probes: [key: new])
        monitor.checkAll()
        #expect(new.callCount == 0, "one check at a time")
        old.answer(.rejected("InvalidProviderToken"))
        try await eventually("the new probe's verdict") { monitor.states[key]?.status == "ok" }
        #expect(new.callCount == 1)

        // A credential no longer configured is forgotten.
        monitor.replace(probes: [:])
        #expect(monitor.states.isEmpty)
    }

    @Test("the periodic checks run every interval")
    func periodic() async throws {
        let monitor = CredentialMonitor(events: EventSink().append, log: Logger(level: .error))
        defer { monitor.stop() }
        let probe = ScriptedProbe([.ok])
        monitor.replace(probes: [key: probe])
        monitor.setInterval(.milliseconds(30))
        try await eventually("three checks") { probe.callCount >= 3 }
        monitor.setInterval(.zero)
        try await Task.sleep(for: .milliseconds(100))
        let n = probe.callCount
        try await Task.sleep(for: .milliseconds(150))
        #expect(probe.callCount == n, "0 stops the periodic checks")
    }

    @Test("the metrics: per app, or per platform over the apps; absent before a verdict")
    func metrics() {
        let checked: [CredentialKey: CredentialState] = [
            CredentialKey(app: "a", platform: "apns"): CredentialState(
                status: "ok", checkedAt: 2_000_000, lastSuccessAt: 2_000_000),
            CredentialKey(app: "b", platform: "apns"): CredentialState(
                status: "rejected", reason: "InvalidProviderToken", checkedAt: 3_000_000, lastSuccessAt: 1_000_000),
            CredentialKey(app: "b", platform: "fcm"): CredentialState(),
        ]
        var m = PrometheusText()
        HeraldService.credentialMetrics(checked, perApp: true, into: &m)
        #expect(m.text.contains("# TYPE herald_credential_ok gauge"))
        #expect(m.text.contains("# TYPE herald_credential_last_success_seconds gauge"))
        #expect(m.text.contains(#"herald_credential_ok{app="a",platform="apns"} 1"#))
        #expect(m.text.contains(#"herald_credential_ok{app="b",platform="apns"} 0"#))
        #expect(!m.text.contains(#"platform="fcm""#))
        #expect(m.text.contains(#"herald_credential_last_success_seconds{app="b",platform="apns"} 1000"#))
        var agg = PrometheusText()
        HeraldService.credentialMetrics(checked, perApp: false, into: &agg)
        #expect(agg.text.contains(#"herald_credential_ok{platform="apns"} 0"#))
        #expect(agg.text.contains(#"herald_credential_last_success_seconds{platform="apns"} 1000"#))
        #expect(!agg.text.contains("app="))
        var empty = PrometheusText()
        HeraldService.credentialMetrics([:], perApp: true, into: &empty)
        #expect(empty.text.contains("# HELP herald_credential_ok "))
        #expect(empty.text.contains("# HELP herald_credential_last_success_seconds "))
    }
}
