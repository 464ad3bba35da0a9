import Dispatch
import HeraldCore
import HeraldIO
import HeraldStore

/// Writes what came of each attempt to the store, gathered in batches, and
/// keeps the results of a message sent before its commit until the commit
/// is known (engine queue only).
final class ResultRecorder {
    private unowned let s: Scheduler
    private var pending: [DeliveryRecord] = []
    private var flushScheduled = false
    /// Result writes the store has not answered yet. On a shared store the
    /// next write waits for the last: the results of a fan-out gather while
    /// one is on its way, so a message costs a few statements, not one a millisecond.
    private var writesInTransit = 0
    /// Monotonic ms at which the last result write started.
    private var lastWriteStartedAt: Int64 = .min / 2
    /// The message of each delivery whose result is pending or held, so the
    /// waiters of a message hear when its results are written.
    private var messageOf: [Int64: String] = [:]
    /// Messages sent before their commit: their results wait here until the commit is known.
    private var uncommitted: [String: Uncommitted] = [:]

    /// The results of a message sent ahead of its commit: written once it
    /// commits, dropped if it does not (its delivery ids then name nothing,
    /// or later another message's rows).
    private struct Uncommitted {
        /// Deliveries sent whose result (or stale removal) has not come back.
        var outstanding: Int
        /// The commit failed: results still to come are dropped.
        var failed = false
        var records: [DeliveryRecord] = []
        var stale: [HeldStale] = []
        /// Where its answers go first: the enqueue writes those it takes
        /// with the message's rows (see ``EarlyResults``).
        var box: EarlyResults?
        /// Results the enqueue took: final once the commit is known.
        var written = 0
    }

    /// Results handed to the store in one job at the most.
    static let batch = 512

    init(_ s: Scheduler) {
        self.s = s
    }

    /// Hands a delivery's result to the store; it stops counting as in
    /// flight (unless `inFlight` is false: a held stale device no longer
    /// counted).
    func finish(
        _ job: DeliveryJob, state: DeliveryState, httpStatus: Int?, reason: RecordedReason?,
        nextAttemptAt: Int64? = nil,
        countsAsAttempt: Bool = true, inFlight counted: Bool = true, shrink: ShrinkOutcome? = nil,
        receipt: ProviderReceipt? = nil
    ) {
        s.owner.check()
        if counted { s.slots.release(job) }
        if let log = s.log, log.enabled(.debug) {
            log.debug(
                "delivery",
                [
                    "message": job.messageID, "device": job.deviceID, "platform": job.platform.rawValue,
                    "state": state.rawValue, "http": httpStatus.map(String.init) ?? "", "reason": reason?.text ?? "",
                ])
        }
        let record = DeliveryRecord(
            deliveryID: job.deliveryID, deviceID: job.deviceID, state: state, httpStatus: httpStatus,
            reason: reason, nextAttemptAt: nextAttemptAt, countsAsAttempt: countsAsAttempt, shrink: shrink,
            receipt: receipt)
        if let entry = uncommitted[job.messageID] {
            if entry.box?.offer(record) == true {
                awaitCommit(job.messageID) { $0.written += 1 }
            } else {
                awaitCommit(job.messageID) { $0.records.append(record) }
            }
            return
        }
        pending.append(record)
        messageOf[job.deliveryID] = job.messageID
        if pending.count >= Self.batch || s.slots.inFlight == 0 {
            // A full batch, or the last answer out: nothing more is coming to
            // gather, and a waiting `push.send` is answered a millisecond sooner.
            flush()
        } else if !flushScheduled {
            // Answers trickle in one by one: gather those of the next
            // millisecond into the same store job.
            flushScheduled = true
            s.owner.async(afterMs: 1) { [s] in s.recorder.flush() }
        }
    }

    /// Results gathered during this turn of the queue go to the store as one
    /// job. While earlier results wait to be written again (the store failed
    /// them), these join them instead, in order, for the retry to write.
    ///
    /// On a shared store a write waits for the one in transit, and starts
    /// at most every ``Scheduler/sharedRecordGapMs`` while more than
    /// ``Scheduler/sharedRecordGapInFlight`` sends are out: each statement
    /// costs the database a fixed part (a round trip, planning, its commit)
    /// besides its rows. Near the end of a fan-out, a full batch, and
    /// `force` (draining) write at once, so that the last write is small and
    /// a waiting `push.send` is answered soon after its last answer.
    func flush(force: Bool = false) {
        s.owner.check()
        flushScheduled = false
        guard !pending.isEmpty else { return }
        if s.store.isShared && !force && pending.count < Self.batch {
            // Written when the one in transit returns (see `write`).
            if writesInTransit > 0 { return }
            let wait = lastWriteStartedAt + Scheduler.sharedRecordGapMs - monotonicMilliseconds()
            if wait > 0 && s.slots.inFlight > Scheduler.sharedRecordGapInFlight {
                flushScheduled = true
                s.owner.async(afterMs: Int(wait)) { [s] in s.recorder.flush() }
                return
            }
        }
        let records = pending
        pending.removeAll(keepingCapacity: true)
        guard s.held.isEmpty else {
            s.held.hold(records.map { .record($0, final: $0.state.isFinal) })
            return
        }
        write(records)
    }

    /// Writes results; those the store fails are held and written again.
    private func write(_ records: [DeliveryRecord]) {
        s.owner.check()
        writesInTransit += 1
        lastWriteStartedAt = monotonicMilliseconds()
        s.store.record(records) { [s] result in
            s.owner.async { s.recorder.written(records, result) }
        }
    }

    private func written(_ records: [DeliveryRecord], _ result: Result<Void, any Error>) {
        s.owner.check()
        writesInTransit -= 1
        defer { if writesInTransit == 0 && !pending.isEmpty { flush() } }
        switch result {
        case .success:
            wrote(records)
        case .failure(let error):
            s.log?.error(
                "record_failed",
                ["deliveries": String(records.count), "error": String(describing: error), "held": "true"])
            s.held.hold(records.map { .record($0, final: $0.state.isFinal) })
        }
    }

    /// The store took these results: the waiters of their messages hear of it.
    func wrote(_ records: [DeliveryRecord]) {
        s.owner.check()
        for record in records {
            guard let messageID = messageOf[record.deliveryID] else { continue }
            s.progress.add(messageID, final: record.state.isFinal)
        }
        forget(records.map(\.deliveryID))
        s.progress.schedule()
    }

    func forget(_ deliveryIDs: [Int64]) {
        s.owner.check()
        for id in deliveryIDs { messageOf[id] = nil }
    }

    // MARK: Results of messages sent before their commit

    /// A message's deliveries go out before its commit: their results wait
    /// for it (the first part of a hand-over), or `count` more do (a later part).
    func sentEarly(_ messageID: String, count: Int, box: EarlyResults?, first: Bool) {
        s.owner.check()
        if first {
            uncommitted[messageID] = Uncommitted(outstanding: count, box: box)
        } else {
            uncommitted[messageID]?.outstanding += count
        }
    }

    /// Whether the message was sent before its commit and the commit is not known yet.
    func awaitsCommit(_ messageID: String) -> Bool {
        s.owner.check()
        return uncommitted[messageID] != nil
    }

    /// An answer of a message sent early that its enqueue could not write
    /// (a stale device): offered nothing, counted.
    func offerNothing(_ messageID: String) {
        s.owner.check()
        _ = uncommitted[messageID]?.box?.offer(nil)
    }

    /// A stale device of a message sent early, to delete once it commits.
    func awaitCommit(stale h: HeldStale) {
        awaitCommit(h.job.messageID) { $0.stale.append(h) }
    }

    /// Keeps one result of a message sent early until its commit is known
    /// (dropped if it failed).
    private func awaitCommit(_ messageID: String, _ add: (inout Uncommitted) -> Void) {
        s.owner.check()
        guard var entry = uncommitted[messageID] else { return }
        entry.outstanding -= 1
        if !entry.failed { add(&entry) }
        uncommitted[messageID] = entry.failed && entry.outstanding <= 0 ? nil : entry
    }

    /// The commit of a message sent early came back: its results so far go
    /// to the store (behind any held ones), and later ones as they come; or,
    /// the commit failed, they are dropped: the deliveries were sent but
    /// nothing of the message exists (the caller was told it failed).
    func committed(_ messageID: String, sent: Int, _ outcome: Result<Void, any Error>) {
        s.owner.check()
        guard var entry = uncommitted.removeValue(forKey: messageID) else { return }
        switch outcome {
        case .success:
            if entry.written > 0 {
                // Written final with the message: its waiters hear of them now.
                s.progress.add(messageID, finals: entry.written)
                s.progress.schedule()
            }
            for record in entry.records {
                pending.append(record)
                messageOf[record.deliveryID] = messageID
            }
            if !entry.records.isEmpty { flush() }
            for h in entry.stale {
                if s.held.isEmpty {
                    s.stale.remove(h, retried: false)
                } else {
                    s.held.hold([.stale(h)])
                }
            }
        case .failure(let error):
            s.log?.warning(
                "early_sends_uncommitted",
                ["message": messageID, "sent": String(sent), "error": String(describing: error)])
            entry.failed = true
            entry.records = []
            entry.stale = []
            if entry.outstanding > 0 { uncommitted[messageID] = entry }
        }
    }
}
