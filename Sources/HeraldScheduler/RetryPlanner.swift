import HeraldCore
import HeraldDelivery
import HeraldNet
import HeraldStore

/// Decides what an answer means for its delivery, per SPEC "Delivery
/// rules": delivered, failed, retried with backoff, waiting for a
/// credential, or held as stale (engine queue only).
final class RetryPlanner {
    private unowned let s: Scheduler

    init(_ s: Scheduler) {
        self.s = s
    }

    func decide(_ job: DeliveryJob, lane: QueueLane, _ report: AttemptReport) {
        s.owner.check()
        let now = s.clock.nowMilliseconds()
        let status = report.httpStatus
        let shrink = report.shrink
        let receipt = report.receipt
        let webForm = job.platform == .web || job.keys != nil
        switch report.outcome {
        case .delivered:
            s.tally.add(job.platform, \.delivered)
            // A Web Push-form delivery on an fcm or apns_voip lane went through
            // the Web Push sender: it says nothing of FCM's or APNs' credential.
            if job.keys == nil || job.platform.requiresWebPushForm { s.clearDegraded(lane) }
            if webForm, let origin = Origin.text(ofEndpoint: job.token) {
                s.health.clearOriginDegraded(origin, lane: lane)
            }
            s.recorder.finish(job, state: .delivered, httpStatus: status, reason: nil, shrink: shrink, receipt: receipt)
            s.stale.reportNotStale(job, now: now)
            if job.message.liveActivity?.event == .end {
                // The activity is over: its update token goes with it.
                let log = s.log
                s.store.letGoActivityTokens(ids: [job.deviceID]) { result in
                    if case .failure(let error) = result {
                        log?.warning("activity_token_kept", ["device": job.deviceID, "error": "\(error)"])
                    }
                }
            }
        case .retry(let after, let reason):
            // A probe of an unresponsive origin that timed out again: tried
            // again at the origin's cadence, not the backoff's.
            var after = after
            if reason == .timeout, let origin = Scheduler.webPushOrigin(of: job), s.origins.isUnresponsive(origin) {
                after = max(after ?? .zero, .milliseconds(s.origins.retryDelay()))
            }
            retry(job, after: after, reason: reason, httpStatus: status, now: now, shrink: shrink, receipt: receipt)
        case .authRejected(let reason):
            s.tally.add(job.platform, \.authRejected)
            if webForm {
                // A Web Push service refused Herald: that origin's concern
                // (an end user chose it), not the app's transport. Retried with
                // backoff, counted toward max_retries: it is not Herald's
                // credential that a reload could fix.
                if let origin = Origin.text(ofEndpoint: job.token) {
                    s.health.markOriginDegraded(origin, lane: lane, reason: reason)
                }
                retry(job, after: nil, reason: reason, httpStatus: status, now: now, shrink: shrink, receipt: receipt)
            } else {
                let first = !s.health.isDegraded(lane)
                s.health.markDegraded(lane, reason: reason)
                waitForCredential(
                    job, reason: reason, httpStatus: status, now: now, soon: first, shrink: shrink, receipt: receipt)
            }
        case .failed(let reason):
            s.tally.add(job.platform, \.failed)
            s.recorder.finish(
                job, state: .failed, httpStatus: status, reason: RecordedReason(reason), shrink: shrink,
                receipt: receipt)
            s.stale.reportNotStale(job, now: now)
        case .tooLarge:
            s.tally.add(job.platform, \.failed)
            s.recorder.finish(
                job, state: .failed, httpStatus: status, reason: RecordedReason(.payloadTooLarge), shrink: shrink,
                receipt: receipt
            )
            s.stale.reportNotStale(job, now: now)
        case .stale(let reason):
            s.stale.hold(job, httpStatus: status, reason: reason, now: now, receipt: receipt)
        }
    }

    private func retry(
        _ job: DeliveryJob, after: Duration?, reason: ProviderReason, httpStatus: Int?, now: Int64,
        shrink: ShrinkOutcome? = nil, receipt: ProviderReceipt? = nil
    ) {
        let decision = s.settings.backoff.next(
            attempt: job.previousAttempts, retryAfter: after, now: now, deadline: job.expiresAt, random: &s.rng)
        switch decision {
        case .retry(let at):
            s.tally.add(job.platform, \.retried)
            s.recorder.finish(
                job, state: .retrying, httpStatus: httpStatus, reason: RecordedReason(reason), nextAttemptAt: at,
                shrink: shrink, receipt: receipt)
            s.claims.arm(afterMs: at - now)
        case .giveUp(.exhausted):
            s.tally.add(job.platform, \.failed)
            s.recorder.finish(
                job, state: .failed, httpStatus: httpStatus, reason: RecordedReason(reason, .retriesExhausted),
                shrink: shrink, receipt: receipt)
            s.stale.reportNotStale(job, now: now)
        case .giveUp(.expired):
            s.tally.add(job.platform, \.expired)
            s.recorder.finish(
                job, state: .expired, httpStatus: httpStatus, reason: RecordedReason(reason, .ttlElapsed),
                shrink: shrink, receipt: receipt
            )
            s.stale.reportNotStale(job, now: now)
        }
    }

    /// The provider rejected Herald's credential: the delivery waits in
    /// `retrying` (reason `credential_rejected`), this attempt not counted
    /// toward `max_retries`, due again after `credentialRetry` or at once when
    /// a reload brings new credentials, and never past its send deadline
    /// (the claim after it finds it expired).
    private func waitForCredential(
        _ job: DeliveryJob, reason: ProviderReason, httpStatus: Int?, now: Int64, soon: Bool = false,
        shrink: ShrinkOutcome? = nil, receipt: ProviderReceipt? = nil
    ) {
        let deadline = job.sendDeadline
        guard now <= deadline else {
            s.tally.add(job.platform, \.expired)
            s.recorder.finish(
                job, state: .expired, httpStatus: httpStatus, reason: RecordedReason(reason, .ttlElapsed),
                shrink: shrink, receipt: receipt
            )
            s.stale.reportNotStale(job, now: now)
            return
        }
        let cadence = max(1, (soon ? s.settings.credentialFirstRetry : s.settings.credentialRetry).wholeMilliseconds)
        let at = min(now + cadence, deadline + 1)
        s.tally.add(job.platform, \.retried)
        s.recorder.finish(
            job, state: .retrying, httpStatus: httpStatus, reason: RecordedReason(.credentialRejected),
            nextAttemptAt: at, countsAsAttempt: false, shrink: shrink, receipt: receipt)
        s.claims.arm(afterMs: at - now)
    }
}
