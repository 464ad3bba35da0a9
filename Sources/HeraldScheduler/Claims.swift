import Dispatch
import HeraldCore
import HeraldIO
import HeraldStore

/// Takes due deliveries from the store when there is room, sharing the room
/// fairly among the lanes, and sleeps until the next is due when nothing is
/// (engine queue only).
final class Claims {
    private unowned let s: Scheduler
    private(set) var running = false
    private(set) var claiming = false
    private var claimAgain = false
    /// The last claim found nothing due now: no claim until something is
    /// (a wake, the timer for the next retry), however many sends complete.
    private(set) var idle = false
    /// The claim under way is the idle timer's look for due work, not a
    /// claim for work known to be due: a new message may be handed over
    /// meanwhile, as while idle.
    private(set) var polling = false
    /// The lanes the claim under way asked nothing of (full when it began).
    private var unasked: Set<QueueLane> = []
    private var turn = 0
    private var othersClaimedAt: Int64 = .min / 2
    private var timer: (any DispatchSourceTimer)?
    private var armedAt: DispatchTime?
    private var sweeper: (any DispatchSourceTimer)?

    /// The most one lane takes in one claim.
    static let batch = 1000

    init(_ s: Scheduler) {
        self.s = s
    }

    /// Whether a message committed now could be handed over: nothing known
    /// to be due waits in the store (see ``Admission``).
    var resting: Bool { running && ((idle && !claiming) || (claiming && polling)) }

    /// Tells `enqueue`, on its caller's thread, whether to come through the
    /// engine's queue for a hand-over or go to the store directly. Said at
    /// the end of each turn that may change it, never half way through one
    /// (a look for due work passes through "not idle" to "looking").
    private func publishResting() {
        s.resting.store(resting, ordering: .relaxed)
    }

    /// Starts the claim timer (due at once: what the store recovered at
    /// open) and the minute's sweep of stale batches.
    func start() {
        s.owner.check()
        running = true
        let t = DispatchSource.makeTimerSource(queue: s.owner.queue)
        t.setEventHandler { [s] in s.claims.timerFired() }
        t.schedule(deadline: .now())
        t.resume()
        timer = t
        let sweeper = DispatchSource.makeTimerSource(queue: s.owner.queue)
        sweeper.setEventHandler { [s] in s.stale.sweep() }
        sweeper.schedule(deadline: .now() + .seconds(60), repeating: .seconds(60))
        sweeper.resume()
        self.sweeper = sweeper
        publishResting()
    }

    func stop() {
        s.owner.check()
        running = false
        timer?.cancel()
        sweeper?.cancel()
        publishResting()
    }

    private func timerFired() {
        s.owner.check()
        armedAt = nil
        // From idle, the claim only looks for due work: a message meanwhile
        // is still handed over (see `Admission.asks`).
        let poll = idle
        idle = false
        pump(poll: poll)
        if poll && !claiming {
            // No room to look (a hand-over holds it until its sends start,
            // or every lane is full): still idle, look again shortly. Left
            // not idle, the next answer would start a claim that is not a look.
            idle = true
            arm(afterMs: 50)
        }
        publishResting()
    }

    /// New deliveries were committed (or room appeared): claim now.
    func wake() {
        s.owner.check()
        idle = false
        polling = false
        pump()
        publishResting()
    }

    /// Something may be due: leave idle and claim.
    func resume() {
        s.owner.check()
        idle = false
        pump()
        publishResting()
    }

    /// Claims what is due. `poll`: the idle timer's look for due work.
    /// `freed`: called because a send of this lane finished; while a claim
    /// is under way that asks only for another claim after it when the claim
    /// asked nothing of the lane (it was full): a lane the claim asked of
    /// and filled is claimed again anyway (see `claimed`), and one it did
    /// not fill has nothing more due. (Every answer asking again made one
    /// claim follow another for as long as answers came, a claim always
    /// under way, and no message handed over meanwhile.)
    func pump(poll: Bool = false, freed: QueueLane? = nil) {
        s.owner.check()
        guard running, !idle else { return }
        if claiming {
            if let freed {
                if unasked.contains(freed) { claimAgain = true }
                return
            }
            polling = false
            claimAgain = true
            publishResting()
            return
        }
        let reserved = s.admission.reserved
        var room = s.settings.maxInflight - s.slots.inFlight - s.admission.reservedTotal
        guard room > 0 else { return }
        // Each lane's floor is its own; the rest is shared.
        let (floors, unused) = s.slots.unusedFloors(reserved: reserved)
        var shared = max(0, room - unused)
        // Deliveries of lanes without a transport (configuration changed) are
        // claimed too, to be recorded as skipped: now and then, as finding
        // them means scanning past every other lane's backlog.
        let mono = monotonicMilliseconds()
        var others = 0
        if mono - othersClaimedAt >= 5000 && shared > 0 {
            others = min(shared, 100)
            room -= others
            shared -= others
            othersClaimedAt = mono
        }
        // The shared room is shared fairly: each lane asks for its floor and
        // at most an equal part of the rest (what a lane leaves unused goes
        // to those after it), the lanes taking turns at going first. A lane
        // that gets all it asked for is claimed for again at once.
        let lanes = s.slots.transports.keys.sorted {
            ($0.app, $0.platform.rawValue) < ($1.app, $1.platform.rawValue)
        }
        var asks: [QueueLane: Int] = [:]
        for i in lanes.indices {
            let lane = lanes[(i + turn) % lanes.count]
            let free = s.slots.free(lane) - (reserved[lane] ?? 0)
            let floor = floors[lane] ?? 0
            let share = shared > 0 ? max(1, shared / (lanes.count - i)) : 0
            // Every lane is named, with 0 when it has no room, so that the
            // "others" claim never takes a lane's deliveries past its limit.
            let ask = min(max(0, free), floor + share, room, Self.batch)
            asks[lane] = ask
            room -= ask
            shared -= max(0, ask - floor)
        }
        turn += 1
        guard asks.values.contains(where: { $0 > 0 }) || others > 0 else { return }
        polling = poll
        unasked = Set(asks.filter { $0.value == 0 }.map(\.key))
        claiming = true
        claimAgain = false
        publishResting()
        let asked = asks
        let otherLimit = others
        s.store.claimDue(lanes: asked, others: otherLimit, counted: s.stale.counted) { [s] result in
            s.owner.async { s.claims.claimed(result, asked: asked, others: otherLimit) }
        }
    }

    private func claimed(_ result: Result<Claim, any Error>, asked: [QueueLane: Int], others: Int) {
        s.owner.check()
        claiming = false
        polling = false
        let claim: Claim
        switch result {
        case .failure(let error):
            s.log?.error("claim_failed", ["error": String(describing: error)])
            arm(afterMs: 1000)
            publishResting()
            return
        case .success(let c):
            claim = c
        }
        let now = s.clock.nowMilliseconds()
        s.stale.open(claim.batchSizes, claimed: claim.jobs)
        s.stale.finishedAtClaim(claim.finished, now: now)
        for row in claim.unreadable {
            s.log?.warning("device_row_unreadable", ["device": row.deviceID, "delivery": String(row.deliveryID)])
        }
        for job in claim.jobs { s.slots.dispatch(job) }
        s.publish()
        s.progress.schedule()
        // A lane that got all it asked for may have more due: claim again.
        var got: [QueueLane: Int] = [:]
        for job in claim.jobs { got[QueueLane(app: job.app, platform: job.platform), default: 0] += 1 }
        let filled = asked.contains { lane, ask in ask > 0 && (got[lane] ?? 0) >= ask }
        let othersFilled = claim.jobs.count - got.filter { asked[$0.key] != nil }.values.reduce(0, +) >= others
        if claimAgain || !claim.finished.isEmpty || (filled && s.slots.inFlight < s.settings.maxInflight)
            || (others > 0 && othersFilled)
        {
            pump()
        } else if let next = claim.nextDueAt, next <= now {
            // Due now, but for a full lane: its completions will pump; poll
            // gently meanwhile.
            arm(afterMs: 50)
        } else {
            idle = true
            arm(afterMs: claim.nextDueAt.map { $0 - now } ?? s.settings.idlePoll.wholeMilliseconds)
        }
        publishResting()
    }

    /// Wakes the claim loop after `delay` ms (at most `idlePoll`), unless it is
    /// already due to wake sooner.
    func arm(afterMs delay: Int64) {
        s.owner.check()
        guard running, let timer else { return }
        let ms = Int(max(1, min(delay, s.settings.idlePoll.wholeMilliseconds)))
        let at = DispatchTime.now() + .milliseconds(ms)
        if let armedAt, armedAt <= at { return }
        armedAt = at
        timer.schedule(deadline: at)
    }
}
