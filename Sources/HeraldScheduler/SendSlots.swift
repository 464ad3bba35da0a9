import HeraldCore
import HeraldDelivery
import HeraldIO
import HeraldStore

/// The send slots: `maxInflight` claimed deliveries at most, each lane's
/// transport at most its `concurrencyLimit` sending, each lane keeping a
/// floor no other lane takes. Hands jobs to their transport, holds those
/// whose lane is full, and passes each answer on (engine queue only).
final class SendSlots {
    private unowned let s: Scheduler
    private(set) var transports: [QueueLane: any PushTransport]
    /// Deliveries claimed and not yet recorded.
    private(set) var inFlight = 0
    private var sending: [QueueLane: Int] = [:]
    private var waiting: [QueueLane: FIFO<DeliveryJob>] = [:]
    /// Claimed deliveries of each lane not yet recorded: sending, waiting
    /// for the lane, or waiting for their origin.
    private var laneUse: [QueueLane: Int] = [:]
    /// The slots each lane keeps (``SchedulerSettings/laneFloor``), for the current lanes.
    private(set) var laneFloor = 0

    init(_ s: Scheduler, transports: [QueueLane: any PushTransport]) {
        self.s = s
        self.transports = transports
        laneFloor = Self.floor(s.settings, lanes: transports.count)
    }

    /// Half of `maxInflight` kept as floors, evenly among the lanes, unless set.
    static func floor(_ settings: SchedulerSettings, lanes: Int) -> Int {
        max(0, settings.laneFloor ?? settings.maxInflight / (2 * max(1, lanes)))
    }

    /// The apps with a lane, for their shares of the stale window cap.
    static func appCount(_ transports: [QueueLane: any PushTransport]) -> Int {
        max(1, Set(transports.keys.map(\.app)).count)
    }

    func limit(of lane: QueueLane) -> Int {
        max(1, min(s.settings.maxInflight, transports[lane]?.concurrencyLimit ?? s.settings.maxInflight))
    }

    /// What the lane may still take: its limit less what it uses.
    func free(_ lane: QueueLane) -> Int {
        s.owner.check()
        return limit(of: lane) - (laneUse[lane] ?? 0)
    }

    /// Swaps in new transports: deliveries waiting for a lane that no longer
    /// has one end as skipped.
    func replace(_ new: [QueueLane: any PushTransport]) {
        s.owner.check()
        transports = new
        laneFloor = Self.floor(s.settings, lanes: new.count)
        for (lane, jobs) in waiting where new[lane] == nil {
            waiting[lane] = nil
            for job in jobs.elements { skip(job) }
        }
    }

    func skip(_ job: DeliveryJob) {
        s.recorder.finish(job, state: .skipped, httpStatus: nil, reason: RecordedReason(.noTransport))
    }

    /// What each lane's floor has unused (nothing claimed or promised in
    /// it), and the sum: the room no other lane may take.
    func unusedFloors(reserved: [QueueLane: Int]) -> (floors: [QueueLane: Int], total: Int) {
        s.owner.check()
        guard laneFloor > 0 else { return ([:], 0) }
        var floors: [QueueLane: Int] = [:]
        var total = 0
        for lane in transports.keys {
            let unused = min(laneFloor, limit(of: lane)) - (laneUse[lane] ?? 0) - (reserved[lane] ?? 0)
            if unused > 0 {
                floors[lane] = unused
                total += unused
            }
        }
        return (floors, total)
    }

    /// A claimed job takes a slot: sent now, or held until its lane has room.
    func dispatch(_ job: DeliveryJob) {
        s.owner.check()
        inFlight += 1
        let lane = QueueLane(app: job.app, platform: job.platform)
        laneUse[lane, default: 0] += 1
        guard transports[lane] != nil else { return skip(job) }
        if (sending[lane] ?? 0) >= limit(of: lane) {
            waiting[lane, default: FIFO()].append(job)
            return
        }
        send(job, lane: lane)
    }

    /// The job's result is recorded (or it is held as stale): its slot is free.
    func release(_ job: DeliveryJob) {
        s.owner.check()
        inFlight -= 1
        let lane = QueueLane(app: job.app, platform: job.platform)
        let left = (laneUse[lane] ?? 1) - 1
        laneUse[lane] = left > 0 ? left : nil
    }

    /// Whether the lane has a sending slot free.
    func hasRoom(_ lane: QueueLane) -> Bool {
        (sending[lane] ?? 0) < limit(of: lane)
    }

    /// Holds the job until its lane has a sending slot.
    func wait(_ job: DeliveryJob, lane: QueueLane) {
        s.owner.check()
        waiting[lane, default: FIFO()].append(job)
    }

    /// Hands the job to its lane's transport, unless its send deadline
    /// (`accepted_at + ttl + 2 s`) passed while it waited for a slot: it then
    /// ends `expired` there. A Web Push job whose origin has all its slots
    /// waits for one of them (or, the origin unresponsive, waits in the store).
    /// Returns whether it was handed over.
    @discardableResult
    func send(_ job: DeliveryJob, lane: QueueLane) -> Bool {
        s.owner.check()
        guard let transport = transports[lane] else {
            skip(job)
            return false
        }
        let now = s.clock.nowMilliseconds()
        if now > job.sendDeadline {
            s.tally.add(job.platform, \.expired)
            s.recorder.finish(job, state: .expired, httpStatus: nil, reason: RecordedReason(.ttlElapsed))
            s.stale.reportNotStale(job, now: now)
            return false
        }
        let origin = Scheduler.webPushOrigin(of: job)
        if let origin, !s.origins.take(origin, job: job, lane: lane, now: now) { return false }
        sending[lane, default: 0] += 1
        s.tally.add(job.platform, \.sent)
        let started = monotonicMicroseconds()
        let answers = s.answers
        transport.send(job) { [s] report in
            let answer = Answer(
                job: job, lane: lane, origin: origin, report: report, elapsed: monotonicMicroseconds() - started)
            if answers.post(answer) { s.owner.async { s.slots.takeAnswers() } }
        }
        return true
    }

    /// The answers posted since the last turn, taken in one: each frees its
    /// slot and is judged; then the freed lanes claim again, once each.
    func takeAnswers() {
        s.owner.check()
        let batch = s.answers.take()
        var freed: [QueueLane] = []
        for a in batch {
            completed(a)
            if !freed.contains(a.lane) { freed.append(a.lane) }
        }
        // The figures once per batch, in this turn: a dispatch of its own
        // would cost more than the refresh.
        s.publish()
        for lane in freed { s.claims.pump(freed: lane) }
    }

    private func completed(_ a: Answer) {
        sending[a.lane, default: 1] -= 1
        if let origin = a.origin { s.origins.completed(origin, job: a.job, lane: a.lane, a.report) }
        s.tally.sendLatency(a.job.platform, microseconds: a.elapsed)
        s.planner.decide(a.job, lane: a.lane, a.report)
        // The slot goes to the next waiting job still within its deadline;
        // the ones past it end expired on the way (and those of a busy origin
        // wait for it).
        fillLane(a.lane)
        if let origin = a.origin { s.origins.fill(origin) }
    }

    private func fillLane(_ lane: QueueLane) {
        while hasRoom(lane), let next = waiting[lane]?.popFirst() {
            if waiting[lane]?.isEmpty == true { waiting[lane] = nil }
            if send(next, lane: lane) { break }
        }
    }
}
