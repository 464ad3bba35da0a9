import Dispatch
import HeraldConfiguration
import HeraldCore
import HeraldCrypto
import HeraldIO
import HeraldJSON
import HeraldStore

/// One app's credential for one platform, as the checks name it: `apns`
/// (its key serves `apns_voip` too), `fcm`, `web`.
struct CredentialKey: Hashable, Sendable, Comparable {
    let app: String
    let platform: String

    static func < (a: CredentialKey, b: CredentialKey) -> Bool { (a.app, a.platform) < (b.app, b.platform) }
}

/// What the checks know of one credential.
struct CredentialState: Sendable, Equatable {
    /// `unknown` until the first check answers, then the last verdict's status.
    var status = "unknown"
    var reason: String?
    /// Unix ms of the last verdict, and of the last `ok` (kept across verdicts).
    var checkedAt: Int64?
    var lastSuccessAt: Int64?
}

/// Proves a VAPID key and subject: nothing to ask a push service (each
/// judges a token only when it gets a push), so the subject's form
/// (`mailto:` or `https:`, RFC 8292) and a token signed with the key.
final class VAPIDProbe: CredentialProbe {
    private let key: P256PrivateKey
    private let subject: String

    init(key: P256PrivateKey, subject: String) {
        self.key = key
        self.subject = subject
    }

    /// The subject's verdict.
    static func verdict(subject: String) -> CredentialVerdict {
        VAPIDSubject.isValid(subject) ? .ok : .rejected("subject must be mailto: or https:")
    }

    func probeCredential(timeout: Duration, completion: @escaping @Sendable (CredentialVerdict) -> Void) {
        let verdict = Self.verdict(subject: subject)
        guard verdict.status == .ok else {
            completion(verdict)
            return
        }
        let now = SystemClock().nowMilliseconds() / 1000
        do {
            _ = try VAPID.token(
                key: key, audience: "https://push.example", subject: subject, expiresAt: now + 3600, now: now)
            completion(.ok)
        } catch {
            completion(.rejected("vapid_key_unusable"))
        }
    }
}

/// Proves every app's credentials without sending to a user: at start, after
/// each reload and every `[delivery] credential_check_interval`. At most one
/// check per app and platform is out at a time, each ends within its
/// timeout, and a verdict that changes (or the first after start) is
/// written to the event log as a `credential` event. `system.health` and the
/// metrics read ``states`` from any thread.
final class CredentialMonitor: Sendable {
    private struct State {
        var probes: [CredentialKey: any CredentialProbe] = [:]
        var states: [CredentialKey: CredentialState] = [:]
        /// Checks out now, each with the probe's generation.
        var inFlight: [CredentialKey: Int] = [:]
        /// Bumped when a key's probe is replaced: an older check's verdict is dropped.
        var generation: [CredentialKey: Int] = [:]
        /// Keys to check again as soon as their check out now ends (a reload came meanwhile).
        var again: Set<CredentialKey> = []
        /// Keys whose verdict was written to the event log since start.
        var reported: Set<CredentialKey> = []
        var timer: (any DispatchSourceTimer)?
        var stopped = false
    }

    private let state = Locked(State())
    private let queue = DispatchQueue(label: "herald.credentials")
    /// Writes events (the store's ``EventLog/append(_:completion:)``).
    typealias AppendEvents = @Sendable ([NewEvent], @escaping @Sendable (Result<Void, any Error>) -> Void) -> Void
    private let events: AppendEvents
    private let clock: any WallClock
    private let log: Logger
    /// A check's own budget (its request's deadline)…
    let timeout: Duration
    /// …and the monitor's, past which a check that has not answered is `unreachable` (`timeout`).
    private let grace: Duration

    init(
        events: @escaping AppendEvents, clock: any WallClock = SystemClock(), log: Logger,
        timeout: Duration = .seconds(10),
        grace: Duration = .seconds(5)
    ) {
        self.events = events
        self.clock = clock
        self.log = log
        self.timeout = timeout
        self.grace = grace
    }

    /// What the checks know, per app and platform.
    var states: [CredentialKey: CredentialState] { state.withLock { $0.states } }

    /// Takes the probes of a (re)loaded configuration: a credential no longer
    /// configured is forgotten, a new one is `unknown` until checked; the
    /// last success of one still configured is kept.
    func replace(probes: [CredentialKey: any CredentialProbe]) {
        state.withLock { s in
            for key in s.probes.keys where probes[key] == nil {
                s.states[key] = nil
                s.reported.remove(key)
                s.again.remove(key)
            }
            for (key, probe) in probes {
                if s.probes[key] !== probe {
                    s.generation[key, default: 0] += 1
                    if s.inFlight[key] != nil { s.again.insert(key) }
                }
                if s.states[key] == nil { s.states[key] = CredentialState() }
            }
            s.probes = probes
        }
    }

    /// Checks every credential not being checked now (one being checked with
    /// a replaced probe is checked again when it ends).
    func checkAll() {
        let keys = state.withLock { $0.probes.keys.sorted() }
        for key in keys { check(key) }
    }

    /// Checks every `interval` from now on (zero: no periodic checks).
    func setInterval(_ interval: Duration) {
        let timer: (any DispatchSourceTimer)? =
            interval > .zero ? DispatchSource.makeTimerSource(queue: queue) : nil
        if let timer {
            let ms = Int(interval.wholeMilliseconds)
            timer.schedule(deadline: .now() + .milliseconds(ms), repeating: .milliseconds(ms), leeway: .seconds(1))
            timer.setEventHandler { [weak self] in self?.checkAll() }
        }
        let (old, taken) = state.withLock { s -> ((any DispatchSourceTimer)?, Bool) in
            let old = s.timer
            s.timer = s.stopped ? nil : timer
            return (old, !s.stopped)
        }
        old?.cancel()
        if taken { timer?.resume() }
    }

    /// No more checks; verdicts still out are dropped.
    func stop() {
        let timer = state.withLock { s -> (any DispatchSourceTimer)? in
            s.stopped = true
            s.probes = [:]
            defer { s.timer = nil }
            return s.timer
        }
        timer?.cancel()
    }

    private func check(_ key: CredentialKey) {
        let started: (probe: any CredentialProbe, generation: Int)? = state.withLock { s in
            guard !s.stopped, let probe = s.probes[key], s.inFlight[key] == nil else { return nil }
            let generation = s.generation[key, default: 0]
            s.inFlight[key] = generation
            return (probe, generation)
        }
        guard let started else { return }
        // The first of the verdict and the monitor's deadline counts.
        let once = Locked(false)
        let finish: @Sendable (CredentialVerdict) -> Void = { [weak self] verdict in
            let first = once.withLock { done -> Bool in
                defer { done = true }
                return !done
            }
            guard first, let self else { return }
            self.queue.async { self.record(key, verdict, generation: started.generation) }
        }
        let budget = timeout + grace
        queue.asyncAfter(deadline: .now() + .milliseconds(Int(budget.wholeMilliseconds))) {
            finish(.unreachable(ProviderReason.timeout.rawValue))
        }
        started.probe.probeCredential(timeout: timeout, completion: finish)
    }

    /// Takes a verdict (on the monitor's queue).
    private func record(_ key: CredentialKey, _ verdict: CredentialVerdict, generation: Int) {
        let now = clock.nowMilliseconds()
        enum Next {
            case dropped(again: Bool)
            case recorded(CredentialState, changed: Bool)
        }
        let next: Next = state.withLock { s in
            s.inFlight[key] = nil
            let again = s.again.remove(key) != nil
            guard !s.stopped, s.generation[key, default: 0] == generation, var entry = s.states[key] else {
                return .dropped(again: again)
            }
            let before = entry
            entry.status = verdict.status.rawValue
            entry.reason = verdict.reason
            entry.checkedAt = now
            if verdict.status == .ok { entry.lastSuccessAt = now }
            s.states[key] = entry
            let changed =
                !s.reported.contains(key) || before.status != entry.status || before.reason != entry.reason
            s.reported.insert(key)
            return .recorded(entry, changed: changed)
        }
        switch next {
        case .dropped(let again):
            if again { check(key) }
        case .recorded(let entry, let changed):
            guard changed else { return }
            let reason = entry.reason ?? ""
            switch verdict.status {
            case .ok: log.info("credential_ok", ["app": key.app, "platform": key.platform])
            case .rejected:
                log.error("credential_rejected", ["app": key.app, "platform": key.platform, "reason": reason])
            case .unreachable:
                log.warning("credential_unreachable", ["app": key.app, "platform": key.platform, "reason": reason])
            }
            let event = NewEvent(
                app: key.app, kind: .credential, platform: key.platform, state: entry.status, reason: entry.reason,
                detail: Self.detail(entry))
            let log = self.log
            events([event]) { result in
                if case .failure(let error) = result {
                    log.warning(
                        "event_write_failed",
                        ["kind": "credential", "app": key.app, "platform": key.platform, "error": "\(error)"])
                }
            }
        }
    }

    /// A `credential` event's detail: `{"checked_at": …, "last_success_at": …}`.
    static func detail(_ entry: CredentialState) -> String {
        let json: JSON = [
            "checked_at": entry.checkedAt.map { .string(Timestamp.rfc3339($0)) } ?? .null,
            "last_success_at": entry.lastSuccessAt.map { .string(Timestamp.rfc3339($0)) } ?? .null,
        ]
        return String(decoding: json.serialized(), as: UTF8.self)
    }

    /// One credential as `system.health` shows it.
    static func json(_ entry: CredentialState) -> JSON {
        var object: JSONObject = ["status": .string(entry.status)]
        if let reason = entry.reason { object.append("reason", .string(reason)) }
        object.append("checked_at", entry.checkedAt.map { .string(Timestamp.rfc3339($0)) } ?? .null)
        object.append("last_success_at", entry.lastSuccessAt.map { .string(Timestamp.rfc3339($0)) } ?? .null)
        return .object(object)
    }
}
