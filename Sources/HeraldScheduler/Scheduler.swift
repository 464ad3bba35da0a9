import Foundation
public import HeraldCore
public import HeraldDelivery
public import HeraldIO
public import HeraldStore
import Dispatch

/// How the scheduler paces and judges deliveries (`[server] max_inflight`, `[delivery]`).
public struct SchedulerSettings: Sendable {
    /// Sends in flight at once, every lane together.
    public var maxInflight: Int
    public var backoff: BackoffPolicy
    public var stale: StaleGuard.Settings
    /// A stale batch that hears nothing for this long is closed; devices it
    /// still holds are kept (fail-safe).
    public var batchIdleTimeout: Duration = .seconds(900)
    /// The longest the scheduler sleeps with nothing due.
    public var idlePoll: Duration = .seconds(1)
    /// How often a delivery whose provider rejected Herald's credential (APNs
    /// 403 token reasons, FCM 401/403) is tried again while no reload brings
    /// a new one: it waits in `retrying` (reason `credential_rejected`),
    /// without counting toward `max_retries`, until then or its TTL.
    public var credentialRetry: Duration = .seconds(60)
    /// The first rejection of a lane that was not degraded is tried again
    /// this soon: the transport signs a fresh token when the provider refuses
    /// one (APNs `ExpiredProviderToken`, a revoked FCM access token), and a
    /// one-off refusal must not hold a push for `credentialRetry`. A lane
    /// that keeps refusing waits at `credentialRetry`; its first success
    /// releases every delivery waiting on it.
    public var credentialFirstRetry: Duration = .seconds(1)
    /// Web Push origins remembered as rejecting Herald (401/403), or as not
    /// answering, at most.
    public var degradedOriginLimit = 4096
    /// Web Push sends in flight to one push service origin at once, every
    /// app and lane together (`[delivery] webpush_origin_inflight`); more
    /// wait for the origin's slot, in memory, counted in their lane.
    public var originInflight = 200
    /// Timeouts in a row that mark a Web Push origin unresponsive
    /// (`[delivery] webpush_origin_timeouts`): its deliveries then wait in
    /// `retrying` (``DeliveryReason/originUnresponsive``, not counted toward
    /// `max_retries`) while one at a time probes it, until it answers.
    public var originTimeoutLimit = 5
    /// How long a delivery to an unresponsive origin waits before it is
    /// tried again (full jitter between half and all of it).
    public var originRetry: Duration = .seconds(30)
    /// Slots each lane keeps for itself, that no other lane can take; nil:
    /// half of `maxInflight` shared evenly among the lanes
    /// (`maxInflight / (2 × lanes)`). Never more than the lane's own limit.
    public var laneFloor: Int?
    /// Results the store failed to write (a database outage) held in memory
    /// at most; nil: `max(4096, 4 × maxInflight)`. Past it the oldest are
    /// dropped: their deliveries stay in flight in the store, which queues
    /// them again (at a restart, or when their lease runs out), so they are
    /// sent again rather than lost.
    public var heldResultLimit: Int?
    /// The first wait before held results are written again; it doubles
    /// after each failure, up to `heldRetryMax`.
    public var heldRetryFirst: Duration = .milliseconds(100)
    public var heldRetryMax: Duration = .seconds(5)

    /// `heldResultLimit`, or its default.
    public var effectiveHeldResultLimit: Int { max(1, heldResultLimit ?? max(4096, 4 * maxInflight)) }

    public init(maxInflight: Int = 2000, backoff: BackoffPolicy = BackoffPolicy(), stale: StaleGuard.Settings = .init())
    {
        self.maxInflight = maxInflight
        self.backoff = backoff
        self.stale = stale
    }
}

/// Counters of one platform, for `system.stats`.
public struct PlatformCounters: Sendable, Hashable {
    /// Attempts handed to the transport.
    public var sent = 0
    public var delivered = 0
    public var failed = 0
    /// Attempts that ended in a retry being scheduled.
    public var retried = 0
    public var expired = 0
    /// Auth/config rejections (the transport was marked degraded).
    public var authRejected = 0
    public var removedStale = 0
    public var staleRefused = 0
    public var breakerTrips = 0
    /// From handing an attempt to the transport to its answer.
    public var sendLatency = LatencyHistogram()

    public init() {}
}

/// Send latencies in fixed buckets (Prometheus histogram buckets, in seconds).
public struct LatencyHistogram: Sendable, Hashable {
    /// Upper bounds of the buckets, in seconds; one more bucket holds the rest.
    public static let bounds: [Double] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]
    /// Observations per bucket (not cumulative); the last is above every bound.
    public private(set) var counts = [Int](repeating: 0, count: LatencyHistogram.bounds.count + 1)
    public private(set) var count = 0
    public private(set) var sumMicroseconds: Int64 = 0

    public init() {}

    public mutating func record(microseconds: Int64) {
        let seconds = Double(microseconds) / 1_000_000
        let bucket = Self.bounds.firstIndex { seconds <= $0 } ?? Self.bounds.count
        counts[bucket] += 1
        count += 1
        sumMicroseconds += max(0, microseconds)
    }
}

/// What the scheduler reports for `system.stats`.
public struct SchedulerStats: Sendable {
    public var platforms: [Platform: PlatformCounters] = [:]
    /// Deliveries claimed and not yet recorded (sending, or waiting for a lane).
    public var inFlight = 0
    /// Stale devices waiting for their batch's verdict.
    public var staleHeld = 0
    /// Deliveries handed over at their message's commit (sent without a claim).
    public var handedOver = 0
    /// Results (and stale-device removals) the store failed to take, held
    /// in memory and written again with backoff.
    public var heldResults = 0
    /// Held results dropped past the bound since start; their deliveries
    /// stay in flight in the store and are sent again.
    public var heldResultsDropped = 0
    /// Web Push deliveries claimed and waiting for a slot of their origin
    /// (`[delivery] webpush_origin_inflight`).
    public var originWaiting = 0
    /// Web Push origins marked unresponsive (timeouts in a row) now.
    public var originsUnresponsive = 0
    /// Deliveries put back to wait for an unresponsive origin, since start.
    public var originDeferred = 0
    /// The slots each lane keeps for itself (see ``SchedulerSettings/laneFloor``).
    public var laneFloor = 0

    public init() {}
}

/// The delivery engine: takes due deliveries from the store, hands each to
/// its lane's transport, and records what came of it.
///
/// - A lane is one app's transport for one platform. At most `maxInflight`
///   deliveries are claimed at once, and a lane never has more than its
///   transport's `concurrencyLimit` sending: claims skip full lanes, and a
///   claim that brings a lane more than it may take holds the rest in memory
///   until room frees up.
/// - No delivery is handed to a transport past `accepted_at + ttl + 2 s`
///   (checked at the claim and again when a held job gets its lane's slot);
///   it ends `expired` instead.
/// - Outcomes follow SPEC "Delivery rules": `retry` goes through the backoff
///   policy (full jitter, `Retry-After`, `max_retries`, never past the TTL);
///   `authRejected` of APNs or FCM marks the lane degraded until a send
///   succeeds and the delivery waits for the credential (`credential_rejected`,
///   not counted toward `max_retries`, due again after `credentialRetry` or at
///   a reload); a Web Push `authRejected` degrades only the push service's
///   origin and is retried with backoff; `stale` goes through the ``StaleGuard`` (batch breaker,
///   window cap) and then deletes the device only if it still holds the token
///   that was sent.
/// - Every claimed delivery ends recorded; a stop or crash before that leaves
///   it in flight in the store, which queues it again at the next open.
///
/// All state lives on one serial queue (asserted in debug builds); the
/// figures other threads read are under a lock (`shared`).
// @unchecked: every mutable field is touched on `queue` only (assertOnQueue) or under `shared`'s lock.
public final class Scheduler: @unchecked Sendable {
    private let store: any DeliveryStore
    private var transports: [QueueLane: any PushTransport]
    private let settings: SchedulerSettings
    private let clock: any WallClock
    private let log: Logger?
    private let queue = DispatchQueue(label: "herald.scheduler")
    private var rng: any RandomNumberGenerator
    private var timer: (any DispatchSourceTimer)?

    // Scheduler queue only:
    private var running = false
    private var claiming = false
    private var claimAgain = false
    private var inFlight = 0
    private var sending: [QueueLane: Int] = [:]
    private var waiting: [QueueLane: [DeliveryJob]] = [:]
    /// Claimed deliveries of each lane not yet recorded: sending, waiting
    /// for the lane, or waiting for their origin.
    private var laneUse: [QueueLane: Int] = [:]
    /// Web Push sends in flight per push service origin, every lane's.
    private var originSending: [String: Int] = [:]
    /// Web Push deliveries waiting for a slot of their origin, in order.
    private var originWaiting: [String: [(job: DeliveryJob, lane: QueueLane)]] = [:]
    private var originWaitingTotal = 0
    /// Timeouts in a row per origin (an answer resets it).
    private var originTimeouts: [String: Int] = [:]
    /// Origins that stopped answering: one send at a time probes them.
    private var unresponsive: Set<String> = []
    private var originDeferred = 0
    /// The slots each lane keeps (``SchedulerSettings/laneFloor``), for the current lanes.
    private var laneFloor = 0
    private var guardState: StaleGuard
    private var batchActivity: [BatchKey: Int64] = [:]
    private var held: [HeldKey: Held] = [:]
    /// Messages whose deliveries changed since the last progress report, with
    /// how many of them became final (`Scheduler.unknownProgress`: read them).
    private var touched: [String: Int] = [:]
    private var progressScheduled = false
    private var counters: [Platform: PlatformCounters] = [:]
    private var sweeper: (any DispatchSourceTimer)?
    /// The last claim found nothing due now: no claim until something is
    /// (a wake, the timer for the next retry), however many sends complete.
    private var idle = false
    /// The claim under way is the idle timer's look for due work, not a
    /// claim for work known to be due: a new message may be handed over
    /// meanwhile, as while idle.
    private var polling = false
    /// The lanes the claim under way asked nothing of (full when it began).
    private var unasked: Set<QueueLane> = []
    private var handedOverTotal = 0
    /// Room promised to hand-overs whose commit has not come back yet.
    private var reserved: [QueueLane: Int] = [:]
    private var reservedTotal = 0
    /// Hand-overs numbered, so that an early one (sent before its commit)
    /// is matched with its commit.
    private var nextHandoff = 0
    /// Hand-overs sent early whose commit has not come back: their message
    /// and how many deliveries went (in one or more parts).
    private var sentEarly: [Int: (messageID: String, jobs: Int)] = [:]
    /// Messages sent before their commit: their results wait here until the commit is known.
    private var uncommitted: [String: Uncommitted] = [:]
    private var turn = 0
    private var othersClaimedAt: Int64 = .min / 2
    private var armedAt: DispatchTime?
    private var publishScheduled = false
    private var pendingRecords: [DeliveryRecord] = []
    private var flushScheduled = false
    /// Result writes the store has not answered yet. On a shared store the
    /// next write waits for the last: the results of a fan-out gather while
    /// one is on its way, so a message costs a few statements, not one a millisecond.
    private var writesInTransit = 0
    /// Monotonic ms at which the last result write started.
    private var lastWriteStartedAt: Int64 = .min / 2
    /// Oldest first; written again with backoff until the store takes them.
    private var heldWrites: [HeldWrite] = []
    /// Taken from the front of `heldWrites` by the retry under way; put back
    /// in front if it fails.
    private var heldInTransit: [HeldWrite] = []
    private var heldRetryScheduled = false
    private var heldRetryDelay: Duration?
    private var heldDropped = 0
    /// Set by `drain`: the store is about to close, nothing more is retried.
    private var heldStopped = false
    /// The message of each delivery whose result is pending or held, so the
    /// waiters of a message hear when its results are written.
    private var messageOf: [Int64: String] = [:]

    private let shared = Locked(Shared())
    private struct Shared {
        var stats = SchedulerStats()
        var degraded: [QueueLane: String] = [:]
        /// Web Push origins (per lane) whose service answered 401/403, with
        /// the reason; oldest first in `originOrder`, bounded.
        var degradedOrigins: [QueueLane: [String: String]] = [:]
        var originOrder: [(lane: QueueLane, origin: String)] = []
    }

    /// The results of a message sent ahead of its commit: written once it
    /// commits, dropped if it does not (its delivery ids then name nothing,
    /// or later another message's rows).
    private struct Uncommitted {
        /// Deliveries sent whose result (or stale removal) has not come back.
        var outstanding: Int
        /// The commit failed: results still to come are dropped.
        var failed = false
        var records: [DeliveryRecord] = []
        var stale: [Held] = []
        /// Where its answers go first: the enqueue writes those it takes
        /// with the message's rows (see ``EarlyResults``).
        var box: EarlyResults?
        /// Results the enqueue took: final once the commit is known.
        var written = 0
    }

    private struct HeldKey: Hashable {
        let messageID: String
        let deviceID: String
    }

    private struct Held {
        let job: DeliveryJob
        let httpStatus: Int?
        let reason: String
    }

    /// Traps in debug builds when state that belongs to the scheduler's queue
    /// is touched from elsewhere.
    @inline(__always)
    private func assertOnQueue() {
        assert(
            {
                dispatchPrecondition(condition: .onQueue(queue))
                return true
            }())
    }

    /// Called (on the scheduler's queue) with the messages whose deliveries
    /// were just recorded, each with how many of them became final, or
    /// ``unknownProgress`` when the store finished some by itself (expired at
    /// claim, a stale device removed); set before `start`.
    public var onProgress: (@Sendable ([String: Int]) -> Void)?

    /// A progress count meaning "changed by an unknown number: read the message".
    public static let unknownProgress = Int.max

    public init(
        store: any DeliveryStore, transports: [QueueLane: any PushTransport], settings: SchedulerSettings,
        clock: any WallClock = SystemClock(), log: Logger? = nil,
        random: any RandomNumberGenerator = SystemRandomNumberGenerator()
    ) {
        self.store = store
        self.transports = transports
        self.settings = settings
        self.clock = clock
        self.log = log
        self.rng = random
        self.guardState = StaleGuard(settings: settings.stale)
        guardState.apps = Self.appCount(transports)
        laneFloor = Self.floor(settings, lanes: transports.count)
    }

    /// The apps with a lane, for their shares of the stale window cap.
    static func appCount(_ transports: [QueueLane: any PushTransport]) -> Int {
        max(1, Set(transports.keys.map(\.app)).count)
    }

    /// Half of `maxInflight` kept as floors, evenly among the lanes, unless set.
    static func floor(_ settings: SchedulerSettings, lanes: Int) -> Int {
        max(0, settings.laneFloor ?? settings.maxInflight / (2 * max(1, lanes)))
    }

    // MARK: Lifecycle

    /// Starts claiming (what the store recovered at open is due at once).
    public func start() {
        // Work another instance queued (or a dead one's expired leases): claim.
        store.setWorkObserver { [weak self] in self?.wake() }
        queue.async { [self] in
            running = true
            let t = DispatchSource.makeTimerSource(queue: queue)
            t.setEventHandler { [self] in
                armedAt = nil
                // From idle, the claim only looks for due work: a message
                // meanwhile is still handed over (see `handoffAsks`).
                let poll = idle
                idle = false
                pump(poll: poll)
                if poll && !claiming {
                    // No room to look (a hand-over holds it until its sends
                    // start, or every lane is full): still idle, look again
                    // shortly. Left not idle, the next answer would start a
                    // claim that is not a look.
                    idle = true
                    arm(afterMs: 50)
                }
            }
            t.schedule(deadline: .now())
            t.resume()
            timer = t
            let sweeper = DispatchSource.makeTimerSource(queue: queue)
            sweeper.setEventHandler { [self] in sweepBatches() }
            sweeper.schedule(deadline: .now() + .seconds(60), repeating: .seconds(60))
            sweeper.resume()
            self.sweeper = sweeper
        }
    }

    /// Tells a shared store the lanes whose raw-token registrations this
    /// instance can send (see ``DeliveryStore/publish(lanes:)``).
    public func publish(lanes: Set<QueueLane>) {
        store.publish(lanes: lanes)
    }

    /// New deliveries were committed: claim now.
    public func wake() {
        queue.async { [self] in
            idle = false
            polling = false
            pump()
        }
    }

    /// Stops claiming; sends in flight go on and are recorded as they finish.
    public func stopClaiming() {
        queue.sync {
            running = false
            timer?.cancel()
            sweeper?.cancel()
        }
    }

    /// Swaps in the transports of a reloaded configuration. Sends already
    /// handed to a transport finish on it; from now on every send goes to the
    /// new one of its lane. Deliveries waiting for a lane that no longer has a
    /// transport end as skipped, as at startup. Deliveries waiting for a
    /// credential (`credential_rejected`) become due at once: the reload read
    /// every credential again. Returns once the swap is done (the release of
    /// credential waits follows on the store's thread).
    public func replaceTransports(_ new: [QueueLane: any PushTransport]) {
        queue.sync {
            transports = new
            laneFloor = Self.floor(settings, lanes: new.count)
            guardState.apps = Self.appCount(new)
            for (lane, jobs) in waiting where new[lane] == nil {
                waiting[lane] = nil
                for job in jobs {
                    finish(job, state: .skipped, httpStatus: nil, reason: "transport_disabled: no transport configured")
                }
            }
            for (origin, list) in originWaiting where list.contains(where: { new[$0.lane] == nil }) {
                let (gone, kept) = (list.filter { new[$0.lane] == nil }, list.filter { new[$0.lane] != nil })
                originWaiting[origin] = kept.isEmpty ? nil : kept
                originWaitingTotal -= gone.count
                for (job, _) in gone {
                    finish(job, state: .skipped, httpStatus: nil, reason: "transport_disabled: no transport configured")
                }
            }
            // Lanes that gained a transport (or room) may have deliveries due.
            idle = false
            pump()
            let lanes = new.keys.filter { !$0.platform.requiresWebPushForm }
            guard !lanes.isEmpty else { return }
            store.releaseCredentialWaits(lanes: Array(lanes)) { [self] result in
                switch result {
                case .success(let n):
                    if n > 0 { log?.info("credential_waits_released", ["deliveries": String(n)]) }
                case .failure(let error):
                    log?.error("release_failed", ["error": String(describing: error)])
                }
                wake()
            }
        }
    }

    /// Deliveries claimed and not yet handed back to the store.
    public var inFlightCount: Int { queue.sync { inFlight } }

    /// Whether the claim loop rests: running, its last claim found nothing due
    /// now and no claim is under way. A message accepted now is handed over at
    /// its commit. For tests and diagnostics, which wait for this instead of
    /// guessing how long the start-up claim takes.
    public var isIdle: Bool { queue.sync { running && idle && !claiming } }

    /// The degraded reason of each lane that has one.
    public var degradedLanes: [QueueLane: String] { shared.withLock { $0.degraded } }

    /// Web Push origins whose push service rejected Herald (401/403), per
    /// lane, with the reason: each degrades only its own origin, never the
    /// lane (see ``degradedLanes``).
    public var degradedOrigins: [QueueLane: [String: String]] { shared.withLock { $0.degradedOrigins } }

    public var stats: SchedulerStats { shared.withLock { $0.stats } }

    // MARK: Accepting

    /// Commits a message through the store (`completion` runs on the store's
    /// thread once the commit is durable). When the scheduler is idle (its
    /// last claim found nothing due and none is running), the store hands the
    /// message's deliveries over at the commit, up to each lane's free room,
    /// and they are sent at once without a claim; whatever does not fit is
    /// claimed as usual. With work already due the message queues behind it.
    public func enqueue(_ e: Enqueue, completion: @escaping @Sendable (Result<Enqueued, any Error>) -> Void) {
        queue.async { [self] in
            let (asks, limit) = handoffAsks(app: e.app)
            guard !asks.isEmpty else {
                store.enqueue(e) { [self] result in
                    completion(result)
                    if case .success(let accepted) = result, !accepted.duplicate, accepted.devices > 0 { wake() }
                }
                return
            }
            // Until the deliveries come (early, or at the commit), the room
            // stays promised: a claim meanwhile cannot take it.
            for (lane, n) in asks { reserved[lane, default: 0] += n }
            reservedTotal += limit
            let handoff = nextHandoff
            nextHandoff += 1
            store.enqueue(
                e, handoff: asks, limit: limit,
                early: { [self] claim in
                    queue.async { [self] in sendEarly(claim, handoff: handoff, asked: asks, limit: limit) }
                }
            ) { [self] result in
                completion(result.map(\.accepted))
                queue.async { [self] in handedOver(result, handoff: handoff, asked: asks, limit: limit) }
            }
        }
    }

    private func release(asked: [QueueLane: Int], limit: Int) {
        assertOnQueue()
        for (lane, n) in asked {
            let left = (reserved[lane] ?? 0) - n
            reserved[lane] = left > 0 ? left : nil
        }
        reservedTotal -= limit
    }

    /// A message's deliveries handed over before its commit: sent now, their
    /// results held until the commit is known (``handedOver``).
    private func sendEarly(_ claim: Claim, handoff: Int, asked: [QueueLane: Int], limit: Int) {
        assertOnQueue()
        guard let messageID = claim.jobs.first?.messageID else { return }
        if let earlier = sentEarly[handoff] {
            // A later part: the room was released at the first.
            sentEarly[handoff] = (messageID, earlier.jobs + claim.jobs.count)
            uncommitted[messageID]?.outstanding += claim.jobs.count
        } else {
            release(asked: asked, limit: limit)
            sentEarly[handoff] = (messageID, claim.jobs.count)
            uncommitted[messageID] = Uncommitted(outstanding: claim.jobs.count, box: claim.earlyResults)
        }
        dispatchHanded(claim)
    }

    private func dispatchHanded(_ claim: Claim) {
        assertOnQueue()
        let mono = monotonicMilliseconds()
        for (key, size) in claim.batchSizes
        where guardState.register(messageID: key.messageID, platform: key.platform, size: size) {
            batchActivity[key] = mono
        }
        handedOverTotal += claim.jobs.count
        for job in claim.jobs { dispatch(job) }
        publish()
    }

    /// Room to take a new message's deliveries at its commit: each lane of
    /// the app its free room, `limit` in all (which lanes the message reaches
    /// is known only at the commit). Only while idle (or while the idle
    /// timer's claim looks for due work): nothing known to be due waits in
    /// the store, so no older delivery is overtaken; what the look finds is
    /// sent beside the message.
    private func handoffAsks(app: String) -> (asks: [QueueLane: Int], limit: Int) {
        assertOnQueue()
        let room = settings.maxInflight - inFlight - reservedTotal
        guard running, (idle && !claiming) || (claiming && polling), room > 0 else { return ([:], 0) }
        let (floors, unused) = unusedFloors()
        let shared = max(0, room - unused)
        var asks: [QueueLane: Int] = [:]
        var own = 0
        for lane in transports.keys where lane.app == app {
            let free = limit(of: lane) - (laneUse[lane] ?? 0) - (reserved[lane] ?? 0)
            let floor = floors[lane] ?? 0
            own += floor
            if free > 0 && floor + shared > 0 { asks[lane] = min(free, floor + shared) }
        }
        let limit = min(room, shared + own)
        return limit > 0 ? (asks, limit) : ([:], 0)
    }

    /// What each lane's floor has unused (nothing claimed or promised in
    /// it), and the sum: the room no other lane may take.
    private func unusedFloors() -> (floors: [QueueLane: Int], total: Int) {
        assertOnQueue()
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

    private func handedOver(
        _ result: Result<(accepted: Enqueued, claim: Claim), any Error>, handoff: Int, asked: [QueueLane: Int],
        limit: Int
    ) {
        assertOnQueue()
        var handed = 0
        if let early = sentEarly.removeValue(forKey: handoff) {
            handed = early.jobs
            committed(early.messageID, sent: early.jobs, result.map { _ in () })
        } else {
            release(asked: asked, limit: limit)
        }
        guard case .success(let (accepted, claim)) = result else { return }
        dispatchHanded(claim)
        handed += claim.jobs.count
        if !accepted.duplicate && handed < accepted.devices {
            // Some did not fit (or went to a lane without a transport): claim them.
            idle = false
            pump()
        }
    }

    // MARK: Claiming

    /// Claims what is due. `poll`: the idle timer's look for due work.
    /// `freed`: called because a send of this lane finished; while a claim
    /// is under way that asks only for another claim after it when the claim
    /// asked nothing of the lane (it was full): a lane the claim asked of
    /// and filled is claimed again anyway (see `claimed`), and one it did
    /// not fill has nothing more due. (Every answer asking again made one
    /// claim follow another for as long as answers came, a claim always
    /// under way, and no message handed over meanwhile.)
    private func pump(poll: Bool = false, freed: QueueLane? = nil) {
        assertOnQueue()
        guard running, !idle else { return }
        if claiming {
            if let freed {
                if unasked.contains(freed) { claimAgain = true }
                return
            }
            polling = false
            claimAgain = true
            return
        }
        var room = settings.maxInflight - inFlight - reservedTotal
        guard room > 0 else { return }
        // Each lane's floor is its own; the rest is shared.
        let (floors, unused) = unusedFloors()
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
        let lanes = transports.keys.sorted { ($0.app, $0.platform.rawValue) < ($1.app, $1.platform.rawValue) }
        var asks: [QueueLane: Int] = [:]
        for i in lanes.indices {
            let lane = lanes[(i + turn) % lanes.count]
            let free = limit(of: lane) - (laneUse[lane] ?? 0) - (reserved[lane] ?? 0)
            let floor = floors[lane] ?? 0
            let share = shared > 0 ? max(1, shared / (lanes.count - i)) : 0
            // Every lane is named, with 0 when it has no room, so that the
            // "others" claim never takes a lane's deliveries past its limit.
            let ask = min(max(0, free), floor + share, room, Self.claimBatch)
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
        let asked = asks
        let otherLimit = others
        store.claimDue(lanes: asked, others: otherLimit) { [self] result in
            queue.async { [self] in claimed(result, asked: asked, others: otherLimit) }
        }
    }

    /// The most one lane takes in one claim.
    static let claimBatch = 1000

    private func limit(of lane: QueueLane) -> Int {
        max(1, min(settings.maxInflight, transports[lane]?.concurrencyLimit ?? settings.maxInflight))
    }

    private func claimed(_ result: Result<Claim, any Error>, asked: [QueueLane: Int], others: Int) {
        assertOnQueue()
        claiming = false
        polling = false
        let claim: Claim
        switch result {
        case .failure(let error):
            log?.error("claim_failed", ["error": String(describing: error)])
            arm(afterMs: 1000)
            return
        case .success(let c):
            claim = c
        }
        let now = clock.nowMilliseconds()
        let mono = monotonicMilliseconds()
        for (key, size) in claim.batchSizes
        where guardState.register(messageID: key.messageID, platform: key.platform, size: size) {
            batchActivity[key] = mono
        }
        for key in claim.finished {
            apply(guardState.reportNotStale(messageID: key.messageID, platform: key.platform, now: now))
            touched[key.messageID] = Self.unknownProgress
        }
        for row in claim.unreadable {
            log?.warning("device_row_unreadable", ["device": row.deviceID, "delivery": String(row.deliveryID)])
        }
        for job in claim.jobs { dispatch(job) }
        publish()
        scheduleProgress()
        // A lane that got all it asked for may have more due: claim again.
        var got: [QueueLane: Int] = [:]
        for job in claim.jobs { got[QueueLane(app: job.app, platform: job.platform), default: 0] += 1 }
        let filled = asked.contains { lane, ask in ask > 0 && (got[lane] ?? 0) >= ask }
        let othersFilled = claim.jobs.count - got.filter { asked[$0.key] != nil }.values.reduce(0, +) >= others
        if claimAgain || !claim.finished.isEmpty || (filled && inFlight < settings.maxInflight)
            || (others > 0 && othersFilled)
        {
            pump()
        } else if let next = claim.nextDueAt, next <= now {
            // Due now, but for a full lane: its completions will pump; poll
            // gently meanwhile.
            arm(afterMs: 50)
        } else {
            idle = true
            arm(afterMs: claim.nextDueAt.map { $0 - now } ?? settings.idlePoll.wholeMilliseconds)
        }
    }

    /// Wakes the claim loop after `delay` ms (at most `idlePoll`), unless it is
    /// already due to wake sooner.
    private func arm(afterMs delay: Int64) {
        assertOnQueue()
        guard running, let timer else { return }
        let ms = Int(max(1, min(delay, settings.idlePoll.wholeMilliseconds)))
        let at = DispatchTime.now() + .milliseconds(ms)
        if let armedAt, armedAt <= at { return }
        armedAt = at
        timer.schedule(deadline: at)
    }

    // MARK: Sending

    private func dispatch(_ job: DeliveryJob) {
        assertOnQueue()
        inFlight += 1
        let lane = QueueLane(app: job.app, platform: job.platform)
        laneUse[lane, default: 0] += 1
        guard transports[lane] != nil else {
            finish(job, state: .skipped, httpStatus: nil, reason: "transport_disabled: no transport configured")
            return
        }
        if (sending[lane] ?? 0) >= limit(of: lane) {
            waiting[lane, default: []].append(job)
            return
        }
        send(job, lane: lane)
    }

    /// Hands the job to its lane's transport, unless its send deadline
    /// (`accepted_at + ttl + 2 s`) passed while it waited for a slot: it then
    /// ends `expired` there. A Web Push job whose origin has all its slots
    /// waits for one of them (or, the origin unresponsive, waits in the store).
    /// Returns whether it was handed over.
    @discardableResult
    private func send(_ job: DeliveryJob, lane: QueueLane) -> Bool {
        assertOnQueue()
        guard let transport = transports[lane] else {
            finish(job, state: .skipped, httpStatus: nil, reason: "transport_disabled: no transport configured")
            return false
        }
        let now = clock.nowMilliseconds()
        if now > job.sendDeadline {
            counters[job.platform, default: PlatformCounters()].expired += 1
            finish(job, state: .expired, httpStatus: nil, reason: "ttl elapsed")
            reportNotStale(job, now: now)
            return false
        }
        let origin = Self.webPushOrigin(of: job)
        if let origin {
            if unresponsive.contains(origin) && (originSending[origin] ?? 0) > 0 {
                deferForOrigin(job, now: now)
                return false
            }
            if (originSending[origin] ?? 0) >= settings.originInflight {
                originWaiting[origin, default: []].append((job, lane))
                originWaitingTotal += 1
                return false
            }
            originSending[origin, default: 0] += 1
        }
        sending[lane, default: 0] += 1
        counters[job.platform, default: PlatformCounters()].sent += 1
        let started = monotonicMicroseconds()
        transport.send(job) { [self] report in
            let elapsed = monotonicMicroseconds() - started
            queue.async { [self] in completed(job, lane: lane, origin: origin, report, elapsed: elapsed) }
        }
        return true
    }

    /// The origin of a job sent through the Web Push sender; nil for the others.
    static func webPushOrigin(of job: DeliveryJob) -> String? {
        job.platform == .web || job.keys != nil ? origin(ofEndpoint: job.token) : nil
    }

    private func completed(
        _ job: DeliveryJob, lane: QueueLane, origin: String?, _ report: AttemptReport, elapsed: Int64
    ) {
        assertOnQueue()
        sending[lane, default: 1] -= 1
        if let origin {
            let left = (originSending[origin] ?? 1) - 1
            originSending[origin] = left > 0 ? left : nil
            judgeOrigin(origin, job: job, lane: lane, report)
        }
        counters[job.platform, default: PlatformCounters()].sendLatency.record(microseconds: elapsed)
        decide(job, lane: lane, report)
        // The slot goes to the next waiting job still within its deadline;
        // the ones past it end expired on the way (and those of a busy origin
        // wait for it).
        fillLane(lane)
        if let origin { fillOrigin(origin) }
        schedulePublish()
        pump(freed: lane)
    }

    private func fillLane(_ lane: QueueLane) {
        assertOnQueue()
        while var list = waiting[lane], !list.isEmpty, (sending[lane] ?? 0) < limit(of: lane) {
            let next = list.removeFirst()
            waiting[lane] = list.isEmpty ? nil : list
            if send(next, lane: lane) { break }
        }
    }

    /// A slot of `origin` freed: its first waiting job goes, or joins its
    /// lane's wait when the lane is full; an unresponsive origin's wait goes
    /// back to the store (its probes come from there, one at a time).
    private func fillOrigin(_ origin: String) {
        assertOnQueue()
        if unresponsive.contains(origin) {
            let now = clock.nowMilliseconds()
            for (job, _) in originWaiting.removeValue(forKey: origin) ?? [] {
                originWaitingTotal -= 1
                deferForOrigin(job, now: now)
            }
            return
        }
        while var list = originWaiting[origin], !list.isEmpty,
            (originSending[origin] ?? 0) < settings.originInflight
        {
            let (next, lane) = list.removeFirst()
            originWaiting[origin] = list.isEmpty ? nil : list
            originWaitingTotal -= 1
            if (sending[lane] ?? 0) >= limit(of: lane) {
                waiting[lane, default: []].append(next)
                continue
            }
            send(next, lane: lane)
        }
    }

    /// Counts an origin's timeouts in a row: past `originTimeoutLimit` the
    /// origin is unresponsive (shown with the degraded origins, reason
    /// `timeout`), and what waits for it goes back to the store. Any answer
    /// of the origin ends that.
    private func judgeOrigin(_ origin: String, job: DeliveryJob, lane: QueueLane, _ report: AttemptReport) {
        assertOnQueue()
        if case .retry(_, let reason) = report.outcome, reason == .timeout, report.httpStatus == nil {
            // Past its send deadline the sender gives up unsent, also as a
            // timeout: that says nothing of the origin.
            if clock.nowMilliseconds() > job.sendDeadline { return }
            let n = (originTimeouts[origin] ?? 0) + 1
            originTimeouts[origin] = n
            if originTimeouts.count > settings.degradedOriginLimit {
                originTimeouts = [origin: n]
            }
            guard n >= max(1, settings.originTimeoutLimit), !unresponsive.contains(origin) else { return }
            if unresponsive.count >= max(1, settings.degradedOriginLimit), let any = unresponsive.first {
                unresponsive.remove(any)
            }
            unresponsive.insert(origin)
            markOriginDegraded(job, lane: lane, reason: .timeout)
            log?.warning(
                "webpush_origin_unresponsive",
                ["origin": origin, "timeouts": String(n), "waiting": String(originWaiting[origin]?.count ?? 0)])
            return
        }
        originTimeouts[origin] = nil
        guard report.httpStatus != nil, unresponsive.remove(origin) != nil else { return }
        clearOriginTimeouts(origin)
    }

    /// Forgets the origin's `timeout` degradation on every lane (it was
    /// marked on the lane whose send tipped it; any lane's answer ends it).
    private func clearOriginTimeouts(_ origin: String) {
        let lanes = shared.withLock { s -> [QueueLane] in
            let lanes = s.degradedOrigins.compactMap { lane, origins in
                origins[origin] == ProviderReason.timeout.rawValue ? lane : nil
            }
            for lane in lanes {
                s.degradedOrigins[lane]?[origin] = nil
                if s.degradedOrigins[lane]?.isEmpty == true { s.degradedOrigins[lane] = nil }
            }
            s.originOrder.removeAll { $0.origin == origin && lanes.contains($0.lane) }
            return lanes
        }
        for lane in lanes {
            log?.info(
                "webpush_origin_recovered", ["app": lane.app, "platform": lane.platform.rawValue, "origin": origin])
        }
    }

    /// `originRetry` with jitter: between half and all of it, in ms.
    private func originDelay() -> Int64 {
        let cadence = max(2, settings.originRetry.wholeMilliseconds)
        return cadence / 2 + Int64.random(in: 0...(cadence / 2), using: &rng)
    }

    /// A delivery to an unresponsive origin waits in the store, not in a
    /// slot: due again after `originRetry` (jittered), never past its send
    /// deadline; not counted as an attempt.
    private func deferForOrigin(_ job: DeliveryJob, now: Int64) {
        assertOnQueue()
        let at = min(now + originDelay(), job.sendDeadline + 1)
        originDeferred += 1
        counters[job.platform, default: PlatformCounters()].retried += 1
        finish(
            job, state: .retrying, httpStatus: nil, reason: DeliveryReason.originUnresponsive, nextAttemptAt: at,
            countsAsAttempt: false)
        arm(afterMs: at - now)
    }

    /// Answers come hundreds at a time: the shared stats are refreshed once
    /// per burst, after the queue has worked through what is waiting.
    private func schedulePublish() {
        assertOnQueue()
        guard !publishScheduled else { return }
        publishScheduled = true
        queue.async { [self] in
            publishScheduled = false
            publish()
        }
    }

    private func decide(_ job: DeliveryJob, lane: QueueLane, _ report: AttemptReport) {
        assertOnQueue()
        let now = clock.nowMilliseconds()
        let status = report.httpStatus
        let shrink = report.shrink
        switch report.outcome {
        case .delivered:
            counters[job.platform, default: PlatformCounters()].delivered += 1
            // A Web Push-form delivery on an fcm or apns_voip lane went through
            // the Web Push sender: it says nothing of FCM's or APNs' credential.
            if job.keys == nil || job.platform.requiresWebPushForm { clearDegraded(lane) }
            if job.platform == .web || job.keys != nil { clearOriginDegraded(job, lane: lane) }
            finish(job, state: .delivered, httpStatus: status, reason: nil, shrink: shrink)
            reportNotStale(job, now: now)
        case .retry(let after, let reason):
            // A probe of an unresponsive origin that timed out again: tried
            // again at the origin's cadence, not the backoff's.
            var after = after
            if reason == .timeout, let origin = Self.webPushOrigin(of: job), unresponsive.contains(origin) {
                after = max(after ?? .zero, .milliseconds(originDelay()))
            }
            retry(job, after: after, reason: reason, httpStatus: status, now: now, shrink: shrink)
        case .authRejected(let reason):
            counters[job.platform, default: PlatformCounters()].authRejected += 1
            if job.platform == .web || job.keys != nil {
                // A Web Push service refused Herald: that origin's concern
                // (an end user chose it), not the app's transport. Retried with
                // backoff, counted toward max_retries: it is not Herald's
                // credential that a reload could fix.
                markOriginDegraded(job, lane: lane, reason: reason)
                retry(job, after: nil, reason: reason, httpStatus: status, now: now, shrink: shrink)
            } else {
                let first = shared.withLock { $0.degraded[lane] == nil }
                markDegraded(lane, reason: reason)
                waitForCredential(job, reason: reason, httpStatus: status, now: now, soon: first, shrink: shrink)
            }
        case .failed(let reason):
            counters[job.platform, default: PlatformCounters()].failed += 1
            finish(job, state: .failed, httpStatus: status, reason: reason.rawValue, shrink: shrink)
            reportNotStale(job, now: now)
        case .tooLarge:
            counters[job.platform, default: PlatformCounters()].failed += 1
            finish(
                job, state: .failed, httpStatus: status, reason: ProviderReason.payloadTooLarge.rawValue, shrink: shrink
            )
            reportNotStale(job, now: now)
        case .stale(let reason):
            let candidate = StaleCandidate(deviceID: job.deviceID, tokenHash: job.tokenHash)
            let key = HeldKey(messageID: job.messageID, deviceID: job.deviceID)
            // Held devices wait outside the in-flight count, so that a large
            // stale batch cannot starve the claims that will settle it.
            inFlight -= 1
            releaseLane(job)
            held[key] = Held(job: job, httpStatus: status, reason: reason.rawValue)
            // Answered, but not a result its enqueue could write.
            _ = uncommitted[job.messageID]?.box?.offer(nil)
            touchBatch(job)
            apply(
                guardState.reportStale(
                    candidate, messageID: job.messageID, platform: job.platform, app: job.app, now: now))
        }
    }

    private func retry(
        _ job: DeliveryJob, after: Duration?, reason: ProviderReason, httpStatus: Int?, now: Int64,
        shrink: ShrinkOutcome? = nil
    ) {
        assertOnQueue()
        let decision = settings.backoff.next(
            attempt: job.previousAttempts, retryAfter: after, now: now, deadline: job.expiresAt, random: &rng)
        switch decision {
        case .retry(let at):
            counters[job.platform, default: PlatformCounters()].retried += 1
            finish(
                job, state: .retrying, httpStatus: httpStatus, reason: reason.rawValue, nextAttemptAt: at,
                shrink: shrink)
            arm(afterMs: at - now)
        case .giveUp(.exhausted):
            counters[job.platform, default: PlatformCounters()].failed += 1
            finish(
                job, state: .failed, httpStatus: httpStatus, reason: "\(reason.rawValue) (retries exhausted)",
                shrink: shrink)
            reportNotStale(job, now: now)
        case .giveUp(.expired):
            counters[job.platform, default: PlatformCounters()].expired += 1
            finish(
                job, state: .expired, httpStatus: httpStatus, reason: "\(reason.rawValue) (ttl elapsed)", shrink: shrink
            )
            reportNotStale(job, now: now)
        }
    }

    /// The provider rejected Herald's credential: the delivery waits in
    /// `retrying` (reason `credential_rejected`), this attempt not counted
    /// toward `max_retries`, due again after `credentialRetry` or at once when
    /// a reload brings new credentials, and never past its send deadline
    /// (the claim after it finds it expired).
    private func waitForCredential(
        _ job: DeliveryJob, reason: ProviderReason, httpStatus: Int?, now: Int64, soon: Bool = false,
        shrink: ShrinkOutcome? = nil
    ) {
        assertOnQueue()
        let deadline = job.sendDeadline
        guard now <= deadline else {
            counters[job.platform, default: PlatformCounters()].expired += 1
            finish(
                job, state: .expired, httpStatus: httpStatus, reason: "\(reason.rawValue) (ttl elapsed)", shrink: shrink
            )
            reportNotStale(job, now: now)
            return
        }
        let cadence = max(1, (soon ? settings.credentialFirstRetry : settings.credentialRetry).wholeMilliseconds)
        let at = min(now + cadence, deadline + 1)
        counters[job.platform, default: PlatformCounters()].retried += 1
        finish(
            job, state: .retrying, httpStatus: httpStatus, reason: DeliveryReason.credentialRejected,
            nextAttemptAt: at, countsAsAttempt: false, shrink: shrink)
        arm(afterMs: at - now)
    }

    /// Hands a delivery's result to the store; it stops counting as in flight.
    private func finish(
        _ job: DeliveryJob, state: DeliveryState, httpStatus: Int?, reason: String?, nextAttemptAt: Int64? = nil,
        countsAsAttempt: Bool = true, inFlight counted: Bool = true, shrink: ShrinkOutcome? = nil
    ) {
        assertOnQueue()
        if counted {
            inFlight -= 1
            releaseLane(job)
        }
        if let log, log.enabled(.debug) {
            log.debug(
                "delivery",
                [
                    "message": job.messageID, "device": job.deviceID, "platform": job.platform.rawValue,
                    "state": state.rawValue, "http": httpStatus.map(String.init) ?? "", "reason": reason ?? "",
                ])
        }
        let record = DeliveryRecord(
            deliveryID: job.deliveryID, deviceID: job.deviceID, state: state, httpStatus: httpStatus,
            reason: reason, nextAttemptAt: nextAttemptAt, countsAsAttempt: countsAsAttempt, shrink: shrink)
        if let entry = uncommitted[job.messageID] {
            if entry.box?.offer(record) == true {
                awaitCommit(job.messageID) { $0.written += 1 }
            } else {
                awaitCommit(job.messageID) { $0.records.append(record) }
            }
            return
        }
        pendingRecords.append(record)
        messageOf[job.deliveryID] = job.messageID
        if pendingRecords.count >= Self.recordBatch || inFlight == 0 {
            // A full batch, or the last answer out: nothing more is coming to
            // gather, and a waiting `push.send` is answered a millisecond sooner.
            flushRecords()
        } else if !flushScheduled {
            // Answers trickle in one by one: gather those of the next
            // millisecond into the same store job.
            flushScheduled = true
            queue.asyncAfter(deadline: .now() + .milliseconds(1)) { [self] in flushRecords() }
        }
    }

    private func releaseLane(_ job: DeliveryJob) {
        let lane = QueueLane(app: job.app, platform: job.platform)
        let left = (laneUse[lane] ?? 1) - 1
        laneUse[lane] = left > 0 ? left : nil
    }

    /// Results gathered during this turn of the queue go to the store as one
    /// job. While earlier results wait to be written again (the store failed
    /// them), these join them instead, in order, for the retry to write.
    ///
    /// On a shared store a write waits for the one in transit, and starts
    /// at most every ``sharedRecordGapMs`` while more than
    /// ``sharedRecordGapInFlight`` sends are out: each statement costs the
    /// database a fixed part (a round trip, planning, its commit) besides its
    /// rows. Near the end of a fan-out, a full batch, and `force` (draining)
    /// write at once, so that the last write is small and a waiting
    /// `push.send` is answered soon after its last answer.
    private func flushRecords(force: Bool = false) {
        assertOnQueue()
        flushScheduled = false
        guard !pendingRecords.isEmpty else { return }
        if store.isShared && !force && pendingRecords.count < Self.recordBatch {
            // Written when the one in transit returns (see `write`).
            if writesInTransit > 0 { return }
            let wait = lastWriteStartedAt + Self.sharedRecordGapMs - monotonicMilliseconds()
            if wait > 0 && inFlight > Self.sharedRecordGapInFlight {
                flushScheduled = true
                queue.asyncAfter(deadline: .now() + .milliseconds(Int(wait))) { [self] in flushRecords() }
                return
            }
        }
        let records = pendingRecords
        pendingRecords.removeAll(keepingCapacity: true)
        guard heldWrites.isEmpty && heldInTransit.isEmpty else {
            hold(records.map { .record($0, final: $0.state.isFinal) })
            return
        }
        write(records)
    }

    /// Writes results; those the store fails are held and written again.
    private func write(_ records: [DeliveryRecord]) {
        assertOnQueue()
        writesInTransit += 1
        lastWriteStartedAt = monotonicMilliseconds()
        store.record(records) { [self] result in
            queue.async { [self] in
                writesInTransit -= 1
                defer { if writesInTransit == 0 && !pendingRecords.isEmpty { flushRecords() } }
                switch result {
                case .success:
                    wrote(records)
                case .failure(let error):
                    log?.error(
                        "record_failed",
                        ["deliveries": String(records.count), "error": String(describing: error), "held": "true"])
                    hold(records.map { .record($0, final: $0.state.isFinal) })
                }
            }
        }
    }

    /// The store took these results: the waiters of their messages hear of it.
    private func wrote(_ records: [DeliveryRecord]) {
        assertOnQueue()
        for record in records {
            guard let messageID = messageOf[record.deliveryID] else { continue }
            touched[messageID] = (touched[messageID] ?? 0).addingFinal(record.state.isFinal)
        }
        forgetMessages(of: records.map(\.deliveryID))
        scheduleProgress()
    }

    /// Results handed to the store in one job at the most.
    static let recordBatch = 512

    /// On a shared store, the least time between the starts of two result
    /// writes while many sends are out (see ``flushRecords(force:)``).
    public static let sharedRecordGapMs: Int64 = 5
    /// The gap holds only while more sends than this are out.
    public static let sharedRecordGapInFlight = 64

    // MARK: Results of messages sent before their commit

    /// Keeps one result of a message sent early until its commit is known
    /// (dropped if it failed).
    private func awaitCommit(_ messageID: String, _ add: (inout Uncommitted) -> Void) {
        assertOnQueue()
        guard var entry = uncommitted[messageID] else { return }
        entry.outstanding -= 1
        if !entry.failed { add(&entry) }
        uncommitted[messageID] = entry.failed && entry.outstanding <= 0 ? nil : entry
    }

    /// The commit of a message sent early came back: its results so far go
    /// to the store (behind any held ones), and later ones as they come; or,
    /// the commit failed, they are dropped: the deliveries were sent but
    /// nothing of the message exists (the caller was told it failed).
    private func committed(_ messageID: String, sent: Int, _ outcome: Result<Void, any Error>) {
        assertOnQueue()
        guard var entry = uncommitted.removeValue(forKey: messageID) else { return }
        switch outcome {
        case .success:
            if entry.written > 0 {
                // Written final with the message: its waiters hear of them now.
                let n = touched[messageID] ?? 0
                touched[messageID] = n == Self.unknownProgress ? n : n + entry.written
                scheduleProgress()
            }
            for record in entry.records {
                pendingRecords.append(record)
                messageOf[record.deliveryID] = messageID
            }
            if !entry.records.isEmpty { flushRecords() }
            for h in entry.stale {
                if heldWrites.isEmpty && heldInTransit.isEmpty {
                    removeStale(h, retried: false)
                } else {
                    hold([.stale(h)])
                }
            }
        case .failure(let error):
            log?.warning(
                "early_sends_uncommitted",
                [
                    "message": messageID, "sent": String(sent), "error": String(describing: error),
                ])
            entry.failed = true
            entry.records = []
            entry.stale = []
            if entry.outstanding > 0 { uncommitted[messageID] = entry }
        }
    }

    // MARK: Results the store failed to take

    /// A write the store failed: an attempt's result, or a stale device's removal.
    private enum HeldWrite {
        case record(DeliveryRecord, final: Bool)
        case stale(Held)

        var deliveryID: Int64 {
            switch self {
            case .record(let r, _): r.deliveryID
            case .stale(let h): h.job.deliveryID
            }
        }
    }

    private func forgetMessages(of deliveryIDs: [Int64]) {
        assertOnQueue()
        for id in deliveryIDs { messageOf[id] = nil }
    }

    /// Holds writes the store failed, drops the oldest past the bound, and
    /// makes sure a retry is coming.
    private func hold(_ writes: [HeldWrite]) {
        assertOnQueue()
        heldWrites.append(contentsOf: writes)
        let limit = settings.effectiveHeldResultLimit
        let excess = heldWrites.count + heldInTransit.count - limit
        if excess > 0 {
            let n = min(excess, heldWrites.count)
            let dropped = heldWrites.prefix(n).map(\.deliveryID)
            heldWrites.removeFirst(n)
            heldDropped += n
            forgetMessages(of: dropped)
            store.forget(deliveryIDs: dropped)
            log?.warning(
                "held_results_dropped",
                [
                    "count": String(n), "limit": String(limit),
                    "why": "the store is not taking results; these deliveries stay in flight and will be sent again",
                ])
        }
        publish()
        scheduleHeldRetry()
    }

    private func scheduleHeldRetry() {
        assertOnQueue()
        guard !heldRetryScheduled, !heldStopped, heldInTransit.isEmpty, !heldWrites.isEmpty else { return }
        heldRetryScheduled = true
        let delay = heldRetryDelay ?? settings.heldRetryFirst
        let next = delay + delay
        heldRetryDelay = next > settings.heldRetryMax ? settings.heldRetryMax : next
        let ms = max(1, Int(delay.wholeMilliseconds))
        queue.asyncAfter(deadline: .now() + .milliseconds(ms)) { [self] in
            heldRetryScheduled = false
            retryHeld()
        }
    }

    /// Writes the oldest held results (up to a batch, or one stale removal);
    /// on success the next go at once, on failure they wait longer.
    private func retryHeld() {
        assertOnQueue()
        guard heldInTransit.isEmpty, let first = heldWrites.first else { return }
        if case .stale(let h) = first {
            heldInTransit = [first]
            heldWrites.removeFirst()
            removeStale(h, retried: true)
            return
        }
        var records: [DeliveryRecord] = []
        var n = 0
        while n < heldWrites.count, records.count < Self.recordBatch, case .record(let r, _) = heldWrites[n] {
            records.append(r)
            n += 1
        }
        heldInTransit = Array(heldWrites.prefix(n))
        heldWrites.removeFirst(n)
        let batch = records
        store.record(batch) { [self] result in
            queue.async { [self] in heldRetried(result.map { _ in () }, records: batch) }
        }
    }

    /// The end of a retry: written (the rest follow at once) or held again.
    private func heldRetried(_ result: Result<Void, any Error>, records: [DeliveryRecord]) {
        assertOnQueue()
        let transit = heldInTransit
        heldInTransit = []
        switch result {
        case .success:
            heldRetryDelay = nil
            if !records.isEmpty { wrote(records) }
            if heldWrites.isEmpty {
                log?.info("held_results_written", ["dropped_total": String(heldDropped)])
                flushRecords()
            } else {
                retryHeld()
            }
            publish()
        case .failure(let error):
            heldWrites.insert(contentsOf: transit, at: 0)
            if heldRetryDelay == settings.heldRetryMax {
                log?.debug("held_results_retry_failed", ["error": String(describing: error)])
            } else {
                log?.warning(
                    "held_results_retry_failed",
                    ["held": String(heldWrites.count), "error": String(describing: error)])
            }
            hold([])
        }
    }

    // MARK: Stale guards

    private func reportNotStale(_ job: DeliveryJob, now: Int64) {
        assertOnQueue()
        touchBatch(job)
        apply(guardState.reportNotStale(messageID: job.messageID, platform: job.platform, now: now))
    }

    private func touchBatch(_ job: DeliveryJob) {
        assertOnQueue()
        let key = BatchKey(messageID: job.messageID, platform: job.platform)
        if batchActivity[key] != nil { batchActivity[key] = monotonicMilliseconds() }
    }

    private func apply(_ verdicts: [StaleVerdict]) {
        assertOnQueue()
        for verdict in verdicts {
            let key = HeldKey(messageID: verdict.messageID, deviceID: verdict.candidate.deviceID)
            switch verdict.disposition {
            case .held:
                continue
            case .delete:
                guard let h = held.removeValue(forKey: key) else { continue }
                if uncommitted[h.job.messageID] != nil {
                    awaitCommit(h.job.messageID) { $0.stale.append(h) }
                } else if heldWrites.isEmpty && heldInTransit.isEmpty {
                    removeStale(h, retried: false)
                } else {
                    // Behind results the store has not taken yet: in order, by the retry.
                    hold([.stale(h)])
                }
            case .refused(let why):
                guard let h = held.removeValue(forKey: key) else { continue }
                log?.info(
                    "stale_deletion_refused",
                    ["device": h.job.deviceID, "platform": h.job.platform.rawValue, "why": why.rawValue])
                finish(
                    h.job, state: .failed, httpStatus: h.httpStatus,
                    reason: "\(h.reason) (stale; not deleted: \(why.rawValue))", inFlight: false)
            }
        }
    }

    /// Deletes a stale device (if it still holds the token sent) and records
    /// its delivery; a removal the store fails is held and tried again.
    private func removeStale(_ h: Held, retried: Bool) {
        assertOnQueue()
        let job = h.job
        store.removeStale(
            deliveryID: job.deliveryID, deviceID: job.deviceID, tokenHash: job.tokenHash,
            httpStatus: h.httpStatus, reason: h.reason, windowCap: settings.stale.windowCap
        ) { [self] result in
            switch result {
            case .success(.refusedWindowCap):
                log?.info(
                    "stale_deletion_refused",
                    [
                        "device": job.deviceID, "platform": job.platform.rawValue,
                        "why": StaleRefusal.windowCapReached.rawValue, "shared": "true",
                    ])
            case .success(let removal):
                log?.info(
                    removal == .removed ? "device_removed_stale" : "stale_device_kept",
                    [
                        "device": job.deviceID, "platform": job.platform.rawValue, "reason": h.reason,
                        "token_hash": String(job.tokenHash.prefix(12)),
                    ])
            case .failure(let error):
                if !retried {
                    log?.error(
                        "record_failed", ["message": job.messageID, "error": String(describing: error), "held": "true"])
                }
            }
            queue.async { [self] in
                if case .success(.removed) = result {
                    counters[job.platform, default: PlatformCounters()].removedStale += 1
                }
                if case .success = result {
                    touched[job.messageID] = Self.unknownProgress
                    scheduleProgress()
                }
                if retried {
                    heldRetried(result.map { _ in () }, records: [])
                } else if case .failure = result {
                    hold([.stale(h)])
                } else {
                    publish()
                }
            }
        }
    }

    /// Closes batches that heard nothing for `batchIdleTimeout` (cancelled or
    /// superseded deliveries are never reported) and forgets finished ones.
    private func sweepBatches() {
        assertOnQueue()
        let mono = monotonicMilliseconds()
        for (key, last) in batchActivity {
            if !guardState.isOpen(messageID: key.messageID, platform: key.platform) {
                batchActivity[key] = nil
            } else if mono - last >= settings.batchIdleTimeout.wholeMilliseconds {
                batchActivity[key] = nil
                apply(guardState.finish(messageID: key.messageID, platform: key.platform))
            }
        }
        publish()
    }

    // MARK: Health and progress

    private func markDegraded(_ lane: QueueLane, reason: ProviderReason) {
        let changed = shared.withLock { s -> Bool in
            let before = s.degraded[lane]
            s.degraded[lane] = reason.rawValue
            return before != reason.rawValue
        }
        if changed {
            log?.warning(
                "transport_degraded", ["app": lane.app, "platform": lane.platform.rawValue, "reason": reason.rawValue])
        }
    }

    /// `scheme://host[:port]` of a Web Push endpoint; nil if it has none.
    static func origin(ofEndpoint endpoint: String) -> String? {
        guard let schemeEnd = endpoint.range(of: "://") else { return nil }
        let rest = endpoint[schemeEnd.upperBound...]
        let authority = rest.prefix { $0 != "/" && $0 != "?" && $0 != "#" }
        guard !authority.isEmpty else { return nil }
        return endpoint[..<schemeEnd.upperBound].lowercased() + authority.lowercased()
    }

    private func markOriginDegraded(_ job: DeliveryJob, lane: QueueLane, reason: ProviderReason) {
        guard let origin = Self.origin(ofEndpoint: job.token) else { return }
        let limit = max(1, settings.degradedOriginLimit)
        let changed = shared.withLock { s -> Bool in
            let before = s.degradedOrigins[lane]?[origin]
            if before == nil {
                s.originOrder.append((lane, origin))
                while s.originOrder.count > limit {
                    let (oldLane, oldOrigin) = s.originOrder.removeFirst()
                    s.degradedOrigins[oldLane]?[oldOrigin] = nil
                    if s.degradedOrigins[oldLane]?.isEmpty == true { s.degradedOrigins[oldLane] = nil }
                }
            }
            s.degradedOrigins[lane, default: [:]][origin] = reason.rawValue
            return before != reason.rawValue
        }
        if changed {
            log?.warning(
                "webpush_origin_degraded",
                ["app": lane.app, "platform": lane.platform.rawValue, "origin": origin, "reason": reason.rawValue])
        }
    }

    private func clearOriginDegraded(_ job: DeliveryJob, lane: QueueLane) {
        guard let origin = Self.origin(ofEndpoint: job.token) else { return }
        let was = shared.withLock { s -> String? in
            guard let was = s.degradedOrigins[lane]?.removeValue(forKey: origin) else { return nil }
            if s.degradedOrigins[lane]?.isEmpty == true { s.degradedOrigins[lane] = nil }
            s.originOrder.removeAll { $0.lane == lane && $0.origin == origin }
            return was
        }
        if was != nil {
            log?.info(
                "webpush_origin_recovered", ["app": lane.app, "platform": lane.platform.rawValue, "origin": origin])
        }
    }

    private func clearDegraded(_ lane: QueueLane) {
        let was = shared.withLock { $0.degraded.removeValue(forKey: lane) }
        guard was != nil else { return }
        log?.info("transport_recovered", ["app": lane.app, "platform": lane.platform.rawValue])
        // The provider takes the credential again: what waited on it is due now.
        store.releaseCredentialWaits(lanes: [lane]) { [self] result in
            switch result {
            case .success(let n):
                if n > 0 { log?.info("credential_waits_released", ["deliveries": String(n)]) }
            case .failure(let error):
                log?.error("release_failed", ["error": String(describing: error)])
            }
            wake()
        }
    }

    private func scheduleProgress() {
        assertOnQueue()
        guard !progressScheduled, !touched.isEmpty else { return }
        progressScheduled = true
        queue.async { [self] in
            progressScheduled = false
            let ids = touched
            touched.removeAll()
            if !ids.isEmpty { onProgress?(ids) }
        }
    }

    private func publish() {
        assertOnQueue()
        var platforms = counters
        for p in Platform.allCases {
            let g = guardState.counters(for: p)
            platforms[p, default: PlatformCounters()].staleRefused = g.staleRefused
            platforms[p, default: PlatformCounters()].breakerTrips = g.breakerTrips
        }
        let inFlight = self.inFlight
        let heldCount = held.count
        let handed = handedOverTotal
        let heldResults = heldWrites.count + heldInTransit.count
        let dropped = heldDropped
        let (originWaiting, unresponsive, deferred, floor) = (
            originWaitingTotal, self.unresponsive.count, originDeferred, laneFloor
        )
        shared.withLock {
            $0.stats.originWaiting = originWaiting
            $0.stats.originsUnresponsive = unresponsive
            $0.stats.originDeferred = deferred
            $0.stats.laneFloor = floor
            $0.stats.heldResults = heldResults
            $0.stats.heldResultsDropped = dropped
            $0.stats.handedOver = handed
            $0.stats.platforms = platforms
            $0.stats.inFlight = inFlight
            $0.stats.staleHeld = heldCount
        }
    }
}

extension Scheduler {
    /// Waits until the scheduler has handed every result it has received to
    /// the store (call after the transports are shut down, before the store closes).
    public func drain() {
        queue.sync {
            flushRecords(force: true)
            heldStopped = true
            guard !heldWrites.isEmpty || !heldInTransit.isEmpty else { return }
            // One last try before the store closes; what it does not take
            // stays in flight in the store and is sent again after the restart.
            let records = heldWrites.compactMap { write -> DeliveryRecord? in
                if case .record(let r, _) = write { return r }
                return nil
            }
            let left = heldWrites.count + heldInTransit.count - records.count
            let log = self.log
            store.record(records) { result in
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
}

extension Int {
    /// A message's progress count after one more result, final or not
    /// (``Scheduler/unknownProgress`` stays unknown).
    fileprivate func addingFinal(_ final: Bool) -> Int {
        self == Scheduler.unknownProgress ? self : self + (final ? 1 : 0)
    }
}
