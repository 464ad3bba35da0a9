import HeraldCore
import HeraldDelivery
import HeraldIO
import HeraldStore

/// A device a provider called stale, held until its batch's verdict.
struct HeldStale {
    let job: DeliveryJob
    let httpStatus: Int?
    let reason: ProviderReason
    /// What named the attempt at the provider (written with its result).
    var receipt: ProviderReceipt? = nil
}

/// Stale devices held for the ``StaleGuard``'s verdict (batch breaker,
/// window cap), then deleted if they still hold the token sent, or kept
/// with their delivery failed (engine queue only).
final class StaleHolding {
    private struct Key: Hashable {
        let messageID: String
        let deviceID: String
    }

    private unowned let s: Scheduler
    private var guardState: StaleGuard
    private var batchActivity: [BatchKey: Int64] = [:]
    private var held: [Key: HeldStale] = [:]

    init(_ s: Scheduler, settings: StaleGuard.Settings, apps: Int) {
        self.s = s
        guardState = StaleGuard(settings: settings)
        guardState.apps = apps
    }

    var heldCount: Int {
        s.owner.check()
        return held.count
    }

    /// The apps with a lane, for their shares of the window cap.
    func setApps(_ n: Int) {
        s.owner.check()
        guardState.apps = n
    }

    func counters(for platform: Platform) -> (staleRefused: Int, breakerTrips: Int) {
        s.owner.check()
        let g = guardState.counters(for: platform)
        return (g.staleRefused, g.breakerTrips)
    }

    /// Opens the batches of a claim or hand-over (a message's deliveries of one platform).
    func open(_ batchSizes: [BatchKey: Int]) {
        s.owner.check()
        let mono = monotonicMilliseconds()
        for (key, size) in batchSizes
        where guardState.register(messageID: key.messageID, platform: key.platform, size: size) {
            batchActivity[key] = mono
        }
    }

    /// Opens the batches of a claim: by the sizes it counted, and a batch
    /// it left uncounted (open when the claim was asked, see ``counted``)
    /// that closed meanwhile by its rows in this claim, as a count would
    /// have found them had those rows been all that was left (a retry's).
    func open(_ batchSizes: [BatchKey: Int], claimed jobs: [DeliveryJob]) {
        s.owner.check()
        open(batchSizes)
        var late: [BatchKey: Int] = [:]
        for job in jobs
        where batchSizes[job.batch] == nil && !guardState.isOpen(messageID: job.messageID, platform: job.platform) {
            late[job.batch, default: 0] += 1
        }
        if !late.isEmpty { open(late) }
    }

    /// The batches open now, for a claim to leave uncounted: a message's
    /// later claims do not count its rows again. None past
    /// ``countedLimit``: the set is copied into every claim.
    var counted: Set<BatchKey> {
        s.owner.check()
        return guardState.openBatchKeys(limit: Self.countedLimit)
    }

    static let countedLimit = 256

    /// Batches the store finished at the claim (expired deliveries): none of
    /// them is stale.
    func finishedAtClaim(_ keys: [BatchKey], now: Int64) {
        s.owner.check()
        for key in keys {
            apply(guardState.reportNotStale(messageID: key.messageID, platform: key.platform, now: now))
            s.progress.unknown(key.messageID)
        }
    }

    func reportNotStale(_ job: DeliveryJob, now: Int64) {
        s.owner.check()
        touch(job)
        apply(guardState.reportNotStale(messageID: job.messageID, platform: job.platform, now: now))
    }

    /// The provider called the device stale: it waits for the batch's
    /// verdict outside the in-flight count, so that a large stale batch
    /// cannot starve the claims that will settle it.
    func hold(
        _ job: DeliveryJob, httpStatus: Int?, reason: ProviderReason, now: Int64, receipt: ProviderReceipt? = nil
    ) {
        s.owner.check()
        s.slots.release(job)
        held[Key(messageID: job.messageID, deviceID: job.deviceID)] = HeldStale(
            job: job, httpStatus: httpStatus, reason: reason, receipt: receipt)
        // Answered, but not a result its enqueue could write.
        s.recorder.offerNothing(job.messageID)
        touch(job)
        apply(
            guardState.reportStale(
                StaleCandidate(deviceID: job.deviceID, tokenHash: job.tokenHash), messageID: job.messageID,
                platform: job.platform, app: job.app, now: now))
    }

    private func touch(_ job: DeliveryJob) {
        let key = BatchKey(messageID: job.messageID, platform: job.platform)
        if batchActivity[key] != nil { batchActivity[key] = monotonicMilliseconds() }
    }

    private func apply(_ verdicts: [StaleVerdict]) {
        s.owner.check()
        for verdict in verdicts {
            let key = Key(messageID: verdict.messageID, deviceID: verdict.candidate.deviceID)
            switch verdict.disposition {
            case .held:
                continue
            case .delete:
                guard let h = held.removeValue(forKey: key) else { continue }
                if s.recorder.awaitsCommit(h.job.messageID) {
                    s.recorder.awaitCommit(stale: h)
                } else if s.held.isEmpty {
                    remove(h, retried: false)
                } else {
                    // Behind results the store has not taken yet: in order, by the retry.
                    s.held.hold([.stale(h)])
                }
            case .refused(let why):
                guard let h = held.removeValue(forKey: key) else { continue }
                s.log?.info(
                    "stale_deletion_refused",
                    ["device": h.job.deviceID, "platform": h.job.platform.rawValue, "why": why.rawValue])
                s.recorder.finish(
                    h.job, state: .failed, httpStatus: h.httpStatus,
                    reason: RecordedReason(h.reason, .staleNotDeleted(why.rawValue)), inFlight: false,
                    receipt: h.receipt)
            }
        }
    }

    /// Deletes a stale device (if it still holds the token sent) and records
    /// its delivery; a removal the store fails is held and tried again.
    func remove(_ h: HeldStale, retried: Bool) {
        s.owner.check()
        let job = h.job
        s.store.removeStale(
            deliveryID: job.deliveryID, deviceID: job.deviceID, tokenHash: job.tokenHash,
            httpStatus: h.httpStatus, reason: h.reason, windowCap: s.settings.stale.windowCap, receipt: h.receipt
        ) { [s] result in
            switch result {
            case .success(.refusedWindowCap):
                s.log?.info(
                    "stale_deletion_refused",
                    [
                        "device": job.deviceID, "platform": job.platform.rawValue,
                        "why": StaleRefusal.windowCapReached.rawValue, "shared": "true",
                    ])
            case .success(let removal):
                s.log?.info(
                    removal == .removed ? "device_removed_stale" : "stale_device_kept",
                    [
                        "device": job.deviceID, "platform": job.platform.rawValue, "reason": h.reason.rawValue,
                        "token_hash": String(job.tokenHash.prefix(12)),
                    ])
            case .failure(let error):
                if !retried {
                    s.log?.error(
                        "record_failed", ["message": job.messageID, "error": String(describing: error), "held": "true"])
                }
            }
            s.owner.async { s.stale.removed(h, result, retried: retried) }
        }
    }

    private func removed(_ h: HeldStale, _ result: Result<StaleRemoval, any Error>, retried: Bool) {
        s.owner.check()
        if case .success(.removed) = result { s.tally.add(h.job.platform, \.removedStale) }
        if case .success = result {
            s.progress.unknown(h.job.messageID)
            s.progress.schedule()
        }
        if retried {
            s.held.retried(result.map { _ in () }, records: [])
        } else if case .failure = result {
            s.held.hold([.stale(h)])
        } else {
            s.publish()
        }
    }

    /// Closes batches that heard nothing for `batchIdleTimeout` (cancelled or
    /// superseded deliveries are never reported) and forgets finished ones.
    func sweep() {
        s.owner.check()
        let mono = monotonicMilliseconds()
        for (key, last) in batchActivity {
            if !guardState.isOpen(messageID: key.messageID, platform: key.platform) {
                batchActivity[key] = nil
            } else if mono - last >= s.settings.batchIdleTimeout.wholeMilliseconds {
                batchActivity[key] = nil
                apply(guardState.finish(messageID: key.messageID, platform: key.platform))
            }
        }
        s.publish()
    }
}
