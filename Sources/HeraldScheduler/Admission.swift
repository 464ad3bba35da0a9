import HeraldCore
import HeraldStore

/// Takes a new message's deliveries at its commit, without a claim, when
/// the engine rests: the room they may take is promised before the commit
/// and released when they come (engine queue only).
final class Admission {
    private unowned let s: Scheduler
    /// Room promised to hand-overs whose commit has not come back yet.
    private(set) var reserved: [QueueLane: Int] = [:]
    private(set) var reservedTotal = 0
    /// Hand-overs numbered, so that an early one (sent before its commit)
    /// is matched with its commit.
    private var nextHandoff = 0
    /// Hand-overs sent early whose commit has not come back: their message
    /// and how many deliveries went (in one or more parts).
    private var sentEarly: [Int: (messageID: String, jobs: Int)] = [:]
    private(set) var handedOverTotal = 0

    init(_ s: Scheduler) {
        self.s = s
    }

    /// Commits the message through the store, asking for its deliveries at
    /// the commit when there is room (see ``Scheduler/enqueue(_:completion:)``).
    func enqueue(_ e: Enqueue, completion: @escaping @Sendable (Result<Enqueued, any Error>) -> Void) {
        s.owner.check()
        let (asks, limit) = self.asks(app: e.app)
        guard !asks.isEmpty else { return s.commit(e, completion: completion) }
        // Until the deliveries come (early, or at the commit), the room
        // stays promised: a claim meanwhile cannot take it.
        for (lane, n) in asks { reserved[lane, default: 0] += n }
        reservedTotal += limit
        let handoff = nextHandoff
        nextHandoff += 1
        s.store.enqueue(
            e, handoff: asks, limit: limit,
            early: { [s] claim in
                s.owner.async { s.admission.sendEarly(claim, handoff: handoff, asked: asks, limit: limit) }
            }
        ) { [s] result in
            completion(result.map(\.accepted))
            s.owner.async { s.admission.handedOver(result, handoff: handoff, asked: asks, limit: limit) }
        }
    }

    /// Room to take a new message's deliveries at its commit: each lane of
    /// the app its free room, `limit` in all (which lanes the message reaches
    /// is known only at the commit). Only while idle (or while the idle
    /// timer's claim looks for due work): nothing known to be due waits in
    /// the store, so no older delivery is overtaken; what the look finds is
    /// sent beside the message.
    private func asks(app: String) -> (asks: [QueueLane: Int], limit: Int) {
        let c: Claims = s.claims
        let room = s.settings.maxInflight - s.slots.inFlight - reservedTotal
        guard c.resting, room > 0 else { return ([:], 0) }
        let (floors, unused) = s.slots.unusedFloors(reserved: reserved)
        let shared = max(0, room - unused)
        var asks: [QueueLane: Int] = [:]
        var own = 0
        for lane in s.slots.transports.keys where lane.app == app {
            let free = s.slots.free(lane) - (reserved[lane] ?? 0)
            let floor = floors[lane] ?? 0
            own += floor
            if free > 0 && floor + shared > 0 { asks[lane] = min(free, floor + shared) }
        }
        let limit = min(room, shared + own)
        return limit > 0 ? (asks, limit) : ([:], 0)
    }

    private func release(asked: [QueueLane: Int], limit: Int) {
        for (lane, n) in asked {
            let left = (reserved[lane] ?? 0) - n
            reserved[lane] = left > 0 ? left : nil
        }
        reservedTotal -= limit
    }

    /// A message's deliveries handed over before its commit: sent now, their
    /// results held until the commit is known (``handedOver``).
    private func sendEarly(_ claim: Claim, handoff: Int, asked: [QueueLane: Int], limit: Int) {
        s.owner.check()
        guard let messageID = claim.jobs.first?.messageID else { return }
        if let earlier = sentEarly[handoff] {
            // A later part: the room was released at the first.
            sentEarly[handoff] = (messageID, earlier.jobs + claim.jobs.count)
            s.recorder.sentEarly(messageID, count: claim.jobs.count, box: nil, first: false)
        } else {
            release(asked: asked, limit: limit)
            sentEarly[handoff] = (messageID, claim.jobs.count)
            s.recorder.sentEarly(messageID, count: claim.jobs.count, box: claim.earlyResults, first: true)
        }
        dispatch(claim)
    }

    private func dispatch(_ claim: Claim) {
        s.stale.open(claim.batchSizes)
        handedOverTotal += claim.jobs.count
        for job in claim.jobs { s.slots.dispatch(job) }
        s.publish()
    }

    private func handedOver(
        _ result: Result<(accepted: Enqueued, claim: Claim), any Error>, handoff: Int, asked: [QueueLane: Int],
        limit: Int
    ) {
        s.owner.check()
        var handed = 0
        if let early = sentEarly.removeValue(forKey: handoff) {
            handed = early.jobs
            s.recorder.committed(early.messageID, sent: early.jobs, result.map { _ in () })
        } else {
            release(asked: asked, limit: limit)
        }
        guard case .success(let (accepted, claim)) = result else { return }
        dispatch(claim)
        handed += claim.jobs.count
        if !accepted.duplicate && handed < accepted.devices {
            // Some did not fit (or went to a lane without a transport): claim them.
            s.claims.resume()
        }
    }
}
