import HeraldCore
import HeraldDelivery
import HeraldStore

/// Web Push sends per push service origin, every app and lane together: at
/// most `originInflight` at once, the rest waiting in order; an origin that
/// times out `originTimeoutLimit` times in a row is unresponsive, probed
/// one send at a time while what waits for it goes back to the store
/// (engine queue only).
final class OriginSlots {
    private unowned let s: Scheduler
    /// Web Push sends in flight per push service origin, every lane's.
    private var sending: [String: Int] = [:]
    /// Web Push deliveries waiting for a slot of their origin, in order.
    private var waiting: [String: FIFO<(job: DeliveryJob, lane: QueueLane)>] = [:]
    private(set) var waitingTotal = 0
    /// Timeouts in a row per origin (an answer resets it).
    private var timeouts: [String: Int] = [:]
    /// Origins that stopped answering: one send at a time probes them.
    private var unresponsive: Set<String> = []
    private(set) var deferred = 0

    init(_ s: Scheduler) {
        self.s = s
    }

    var unresponsiveCount: Int { unresponsive.count }

    func isUnresponsive(_ origin: String) -> Bool { unresponsive.contains(origin) }

    /// Takes a slot of `origin` for the job: false when the job waits for
    /// one instead, or (the origin unresponsive and probed) goes back to the store.
    func take(_ origin: String, job: DeliveryJob, lane: QueueLane, now: Int64) -> Bool {
        s.owner.check()
        if unresponsive.contains(origin) && (sending[origin] ?? 0) > 0 {
            deferJob(job, now: now)
            return false
        }
        if (sending[origin] ?? 0) >= s.settings.originInflight {
            waiting[origin, default: FIFO()].append((job, lane))
            waitingTotal += 1
            return false
        }
        sending[origin, default: 0] += 1
        return true
    }

    /// A send to `origin` was answered (or gave up): its slot is free, and
    /// the answer judged.
    func completed(_ origin: String, job: DeliveryJob, lane: QueueLane, _ report: AttemptReport) {
        s.owner.check()
        let left = (sending[origin] ?? 1) - 1
        sending[origin] = left > 0 ? left : nil
        judge(origin, job: job, lane: lane, report)
    }

    /// Deliveries waiting for an origin whose lane lost its transport end as skipped.
    func replace(_ new: [QueueLane: any PushTransport]) {
        s.owner.check()
        for (origin, list) in waiting where list.elements.contains(where: { new[$0.lane] == nil }) {
            let gone = list.elements.filter { new[$0.lane] == nil }
            var kept = list
            kept.removeAll { new[$0.lane] == nil }
            waiting[origin] = kept.isEmpty ? nil : kept
            waitingTotal -= gone.count
            for (job, _) in gone { s.slots.skip(job) }
        }
    }

    /// A slot of `origin` freed: its first waiting job goes, or joins its
    /// lane's wait when the lane is full; an unresponsive origin's wait goes
    /// back to the store (its probes come from there, one at a time).
    func fill(_ origin: String) {
        s.owner.check()
        if unresponsive.contains(origin) {
            let now = s.clock.nowMilliseconds()
            for (job, _) in waiting.removeValue(forKey: origin)?.elements ?? [] {
                waitingTotal -= 1
                deferJob(job, now: now)
            }
            return
        }
        while (sending[origin] ?? 0) < s.settings.originInflight, let (next, lane) = waiting[origin]?.popFirst() {
            if waiting[origin]?.isEmpty == true { waiting[origin] = nil }
            waitingTotal -= 1
            if !s.slots.hasRoom(lane) {
                s.slots.wait(next, lane: lane)
                continue
            }
            s.slots.send(next, lane: lane)
        }
    }

    /// Counts an origin's timeouts in a row: past `originTimeoutLimit` the
    /// origin is unresponsive (shown with the degraded origins, reason
    /// `timeout`), and what waits for it goes back to the store. Any answer
    /// of the origin ends that.
    private func judge(_ origin: String, job: DeliveryJob, lane: QueueLane, _ report: AttemptReport) {
        if case .retry(_, let reason) = report.outcome, reason == .timeout, report.httpStatus == nil {
            // Past its send deadline the sender gives up unsent, also as a
            // timeout: that says nothing of the origin.
            if s.clock.nowMilliseconds() > job.sendDeadline { return }
            let n = (timeouts[origin] ?? 0) + 1
            timeouts[origin] = n
            if timeouts.count > s.settings.degradedOriginLimit {
                timeouts = [origin: n]
            }
            guard n >= max(1, s.settings.originTimeoutLimit), !unresponsive.contains(origin) else { return }
            if unresponsive.count >= max(1, s.settings.degradedOriginLimit), let any = unresponsive.first {
                unresponsive.remove(any)
            }
            unresponsive.insert(origin)
            s.health.markOriginDegraded(origin, lane: lane, reason: .timeout)
            s.log?.warning(
                "webpush_origin_unresponsive",
                ["origin": origin, "timeouts": String(n), "waiting": String(waiting[origin]?.count ?? 0)])
            return
        }
        timeouts[origin] = nil
        guard report.httpStatus != nil, unresponsive.remove(origin) != nil else { return }
        s.health.clearOriginTimeouts(origin)
    }

    /// `originRetry` with jitter: between half and all of it, in ms.
    func retryDelay() -> Int64 {
        let cadence = max(2, s.settings.originRetry.wholeMilliseconds)
        return cadence / 2 + Int64.random(in: 0...(cadence / 2), using: &s.rng)
    }

    /// A delivery to an unresponsive origin waits in the store, not in a
    /// slot: due again after `originRetry` (jittered), never past its send
    /// deadline; not counted as an attempt.
    private func deferJob(_ job: DeliveryJob, now: Int64) {
        let at = min(now + retryDelay(), job.sendDeadline + 1)
        deferred += 1
        s.tally.add(job.platform, \.retried)
        s.recorder.finish(
            job, state: .retrying, httpStatus: nil, reason: RecordedReason(.originUnresponsive), nextAttemptAt: at,
            countsAsAttempt: false)
        s.claims.arm(afterMs: at - now)
    }
}
