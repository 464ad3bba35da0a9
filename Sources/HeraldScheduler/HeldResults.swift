import HeraldCore
import HeraldStore

/// A write the store failed: an attempt's result, or a stale device's removal.
enum HeldWrite {
    case record(DeliveryRecord, final: Bool)
    case stale(HeldStale)

    var deliveryID: Int64 {
        switch self {
        case .record(let r, _): r.deliveryID
        case .stale(let h): h.job.deliveryID
        }
    }
}

/// Results the store failed to take, held in memory (bounded) and written
/// again in order with backoff until it takes them (engine queue only).
final class HeldResults {
    private unowned let s: Scheduler
    /// Oldest first; written again with backoff until the store takes them.
    private var writes: [HeldWrite] = []
    /// Taken from the front of `writes` by the retry under way; put back
    /// in front if it fails.
    private var inTransit: [HeldWrite] = []
    private var retryScheduled = false
    private var retryDelay: Duration?
    private(set) var dropped = 0
    /// Set by `drain`: the store is about to close, nothing more is retried.
    private var stopped = false

    init(_ s: Scheduler) {
        self.s = s
    }

    /// Nothing held and no retry under way: new results may be written
    /// directly (else they queue behind, in order).
    var isEmpty: Bool {
        s.owner.check()
        return writes.isEmpty && inTransit.isEmpty
    }

    var count: Int {
        s.owner.check()
        return writes.count + inTransit.count
    }

    /// Holds writes the store failed, drops the oldest past the bound, and
    /// makes sure a retry is coming.
    func hold(_ new: [HeldWrite]) {
        s.owner.check()
        writes.append(contentsOf: new)
        let limit = s.settings.effectiveHeldResultLimit
        let excess = writes.count + inTransit.count - limit
        if excess > 0 {
            let n = min(excess, writes.count)
            let gone = writes.prefix(n).map(\.deliveryID)
            writes.removeFirst(n)
            dropped += n
            s.recorder.forget(gone)
            s.store.forget(deliveryIDs: gone)
            s.log?.warning(
                "held_results_dropped",
                [
                    "count": String(n), "limit": String(limit),
                    "why": "the store is not taking results; these deliveries stay in flight and will be sent again",
                ])
        }
        s.publish()
        scheduleRetry()
    }

    private func scheduleRetry() {
        s.owner.check()
        guard !retryScheduled, !stopped, inTransit.isEmpty, !writes.isEmpty else { return }
        retryScheduled = true
        let delay = retryDelay ?? s.settings.heldRetryFirst
        let next = delay + delay
        retryDelay = next > s.settings.heldRetryMax ? s.settings.heldRetryMax : next
        s.owner.async(afterMs: max(1, Int(delay.wholeMilliseconds))) { [s] in
            s.held.retryScheduled = false
            s.held.retry()
        }
    }

    /// Writes the oldest held results (up to a batch, or one stale removal);
    /// on success the next go at once, on failure they wait longer.
    private func retry() {
        s.owner.check()
        guard inTransit.isEmpty, let first = writes.first else { return }
        if case .stale(let h) = first {
            inTransit = [first]
            writes.removeFirst()
            s.stale.remove(h, retried: true)
            return
        }
        var records: [DeliveryRecord] = []
        var n = 0
        while n < writes.count, records.count < ResultRecorder.batch, case .record(let r, _) = writes[n] {
            records.append(r)
            n += 1
        }
        inTransit = Array(writes.prefix(n))
        writes.removeFirst(n)
        let batch = records
        s.store.record(batch) { [s] result in
            s.owner.async { s.held.retried(result.map { _ in () }, records: batch) }
        }
    }

    /// The end of a retry: written (the rest follow at once) or held again.
    func retried(_ result: Result<Void, any Error>, records: [DeliveryRecord]) {
        s.owner.check()
        let transit = inTransit
        inTransit = []
        switch result {
        case .success:
            retryDelay = nil
            if !records.isEmpty { s.recorder.wrote(records) }
            if writes.isEmpty {
                s.log?.info("held_results_written", ["dropped_total": String(dropped)])
                s.recorder.flush()
            } else {
                retry()
            }
            s.publish()
        case .failure(let error):
            writes.insert(contentsOf: transit, at: 0)
            if retryDelay == s.settings.heldRetryMax {
                s.log?.debug("held_results_retry_failed", ["error": String(describing: error)])
            } else {
                s.log?.warning(
                    "held_results_retry_failed", ["held": String(writes.count), "error": String(describing: error)])
            }
            hold([])
        }
    }

    /// The store is about to close: one last try of what is held, and no
    /// more retries. What it does not take stays in flight in the store and
    /// is sent again after the restart.
    func drain() {
        s.owner.check()
        stopped = true
        guard !writes.isEmpty || !inTransit.isEmpty else { return }
        let records = writes.compactMap { write -> DeliveryRecord? in
            if case .record(let r, _) = write { return r }
            return nil
        }
        let left = writes.count + inTransit.count - records.count
        let log = s.log
        s.store.record(records) { result in
            let unwritten: Int
            if case .failure = result { unwritten = left + records.count } else { unwritten = left }
            if unwritten > 0 {
                log?.warning(
                    "held_results_unwritten",
                    ["count": String(unwritten), "why": "their deliveries stay in flight and are sent again"])
            }
        }
    }
}
