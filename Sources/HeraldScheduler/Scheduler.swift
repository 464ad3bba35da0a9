import Dispatch
public import HeraldCore
import Synchronization
import HeraldDelivery
import HeraldNet
public import HeraldIO
public import HeraldStore

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
/// The engine is in parts, each with one job and its own state, all on one
/// serial queue (``EngineQueue``, checked by every part in debug builds):
/// ``Admission`` (a message's deliveries at its commit), ``Claims`` (due
/// work from the store), ``SendSlots`` and ``OriginSlots`` (who may send
/// now), ``RetryPlanner`` (what an answer means), ``ResultRecorder`` and
/// ``HeldResults`` (results to the store), ``StaleHolding`` (stale devices
/// and their batches), ``Progress`` (who waits for which message). The
/// figures other threads read are in ``Health``, under its lock.
// @unchecked: `rng` and the parts are touched on `owner`'s queue only (each part's functions check it); the rest is immutable or `Health`'s, under its lock.
public final class Scheduler: @unchecked Sendable {
    let store: any DeliveryQueue & StoreInstances
    let settings: SchedulerSettings
    let clock: any WallClock
    let log: Logger?
    let owner = EngineQueue(label: "herald.scheduler")
    let health: Health
    /// The transports' answers, taken in batches on `owner`'s queue.
    let answers = AnswerInbox()
    var rng: any RandomNumberGenerator

    // The parts (engine queue only), set once at the end of `init`.
    private(set) var admission: Admission!
    private(set) var claims: Claims!
    private(set) var slots: SendSlots!
    private(set) var origins: OriginSlots!
    private(set) var planner: RetryPlanner!
    private(set) var recorder: ResultRecorder!
    private(set) var held: HeldResults!
    private(set) var stale: StaleHolding!
    private(set) var progress: Progress!
    private(set) var tally: Tally!
    private var publishScheduled = false
    /// ``Claims/resting``, for `enqueue` on its caller's thread.
    let resting = Atomic<Bool>(false)

    /// Called (on the scheduler's queue) with the messages whose deliveries
    /// were just recorded, each with how many of them became final, or
    /// ``unknownProgress`` when the store finished some by itself (expired at
    /// claim, a stale device removed); set before `start`.
    public var onProgress: (@Sendable ([String: Int]) -> Void)?

    /// Tells `observer` of each lane that is marked degraded (a credential
    /// rejected) or recovers, once per change, on any thread; it must not block.
    public func observeLaneHealth(_ observer: @escaping @Sendable (QueueLane, LaneChange) -> Void) {
        health.observer.withLock { $0 = observer }
    }

    /// A progress count meaning "changed by an unknown number: read the message".
    public static let unknownProgress = Int.max

    /// On a shared store, the least time between the starts of two result
    /// writes while many sends are out (see ``ResultRecorder/flush(force:)``).
    public static let sharedRecordGapMs: Int64 = 5
    /// The gap holds only while more sends than this are out.
    public static let sharedRecordGapInFlight = 64

    public init(
        store: any DeliveryQueue & StoreInstances, transports: [QueueLane: any PushTransport],
        settings: SchedulerSettings,
        clock: any WallClock = SystemClock(), log: Logger? = nil,
        random: any RandomNumberGenerator = SystemRandomNumberGenerator()
    ) {
        self.store = store
        self.settings = settings
        self.clock = clock
        self.log = log
        self.rng = random
        health = Health(log: log, originLimit: settings.degradedOriginLimit)
        tally = Tally(owner: owner)
        progress = Progress(self)
        slots = SendSlots(self, transports: transports)
        origins = OriginSlots(self)
        admission = Admission(self)
        claims = Claims(self)
        planner = RetryPlanner(self)
        recorder = ResultRecorder(self)
        held = HeldResults(self)
        stale = StaleHolding(self, settings: settings.stale, apps: SendSlots.appCount(transports))
    }

    // MARK: Lifecycle

    /// Starts claiming (what the store recovered at open is due at once).
    public func start() {
        // Work another instance queued (or a dead one's expired leases): claim.
        store.setWorkObserver { [weak self] in self?.wake() }
        owner.async { [self] in claims.start() }
    }

    /// Tells a shared store the lanes whose raw-token registrations this
    /// instance can send (see ``StoreInstances/publish(lanes:)``).
    public func publish(lanes: Set<QueueLane>) {
        store.publish(lanes: lanes)
    }

    /// New deliveries were committed: claim now.
    public func wake() {
        owner.async { [self] in claims.wake() }
    }

    /// Stops claiming; sends in flight go on and are recorded as they finish.
    public func stopClaiming() {
        owner.sync { claims.stop() }
    }

    /// Swaps in the transports of a reloaded configuration. Sends already
    /// handed to a transport finish on it; from now on every send goes to the
    /// new one of its lane. Deliveries waiting for a lane that no longer has a
    /// transport end as skipped, as at startup. Deliveries waiting for a
    /// credential (`credential_rejected`) become due at once: the reload read
    /// every credential again. Returns once the swap is done (the release of
    /// credential waits follows on the store's thread).
    public func replaceTransports(_ new: [QueueLane: any PushTransport]) {
        owner.sync {
            slots.replace(new)
            stale.setApps(SendSlots.appCount(new))
            origins.replace(new)
            // Lanes that gained a transport (or room) may have deliveries due.
            claims.resume()
            let lanes = new.keys.filter { !$0.platform.requiresWebPushForm }
            guard !lanes.isEmpty else { return }
            releaseCredentialWaits(Array(lanes))
        }
    }

    /// Deliveries claimed and not yet handed back to the store.
    public var inFlightCount: Int { owner.sync { slots.inFlight } }

    /// Whether the claim loop rests: running, its last claim found nothing due
    /// now and no claim is under way. A message accepted now is handed over at
    /// its commit. For tests and diagnostics, which wait for this instead of
    /// guessing how long the start-up claim takes.
    public var isIdle: Bool { owner.sync { claims.running && claims.idle && !claims.claiming } }

    /// The degraded reason of each lane that has one.
    public var degradedLanes: [QueueLane: String] { health.degradedLanes }

    /// Web Push origins whose push service rejected Herald (401/403), per
    /// lane, with the reason: each degrades only its own origin, never the
    /// lane (see ``degradedLanes``).
    public var degradedOrigins: [QueueLane: [String: String]] { health.degradedOrigins }

    public var stats: SchedulerStats { health.stats }

    // MARK: Accepting

    /// Commits a message through the store (`completion` runs on the store's
    /// thread once the commit is durable). When the scheduler is idle (its
    /// last claim found nothing due and none is running), the store hands the
    /// message's deliveries over at the commit, up to each lane's free room,
    /// and they are sent at once without a claim; whatever does not fit is
    /// claimed as usual. With work already due the message queues behind it,
    /// and goes to the store without passing through the engine's queue:
    /// accepting a message never waits behind the answers of a fan-out.
    public func enqueue(_ e: Enqueue, completion: @escaping @Sendable (Result<Enqueued, any Error>) -> Void) {
        guard resting.load(ordering: .relaxed) else { return commit(e, completion: completion) }
        owner.async { [self] in admission.enqueue(e, completion: completion) }
    }

    /// Commits the message (no hand-over); the engine hears of it at the commit.
    func commit(_ e: Enqueue, completion: @escaping @Sendable (Result<Enqueued, any Error>) -> Void) {
        store.enqueue(e) { [self] result in
            completion(result)
            if case .success(let accepted) = result, !accepted.duplicate, accepted.devices > 0 { wake() }
        }
    }

    /// Waits until the scheduler has handed every result it has received to
    /// the store (call after the transports are shut down, before the store closes).
    public func drain() {
        owner.sync {
            recorder.flush(force: true)
            held.drain()
        }
    }

    // MARK: Shared by the parts

    /// The lane's provider takes the credential again: what waited on it is due now.
    func clearDegraded(_ lane: QueueLane) {
        if health.clearDegraded(lane) { releaseCredentialWaits([lane]) }
    }

    private func releaseCredentialWaits(_ lanes: [QueueLane]) {
        store.releaseCredentialWaits(lanes: lanes) { [self] result in
            switch result {
            case .success(let n):
                if n > 0 { log?.info("credential_waits_released", ["deliveries": String(n)]) }
            case .failure(let error):
                log?.error("release_failed", ["error": String(describing: error)])
            }
            wake()
        }
    }

    /// Answers come hundreds at a time: the shared stats are refreshed once
    /// per burst, after the queue has worked through what is waiting.
    func schedulePublish() {
        owner.check()
        guard !publishScheduled else { return }
        publishScheduled = true
        owner.async { [self] in
            publishScheduled = false
            publish()
        }
    }

    /// Refreshes the figures other threads read.
    func publish() {
        owner.check()
        var platforms = tally.platforms
        for p in Platform.allCases {
            let g = stale.counters(for: p)
            platforms[p, default: PlatformCounters()].staleRefused = g.staleRefused
            platforms[p, default: PlatformCounters()].breakerTrips = g.breakerTrips
        }
        let (inFlight, staleHeld, handed) = (slots.inFlight, stale.heldCount, admission.handedOverTotal)
        let (heldResults, dropped) = (held.count, held.dropped)
        let (originWaiting, unresponsive, deferred, floor) = (
            origins.waitingTotal, origins.unresponsiveCount, origins.deferred, slots.laneFloor
        )
        health.publish {
            $0.originWaiting = originWaiting
            $0.originsUnresponsive = unresponsive
            $0.originDeferred = deferred
            $0.laneFloor = floor
            $0.heldResults = heldResults
            $0.heldResultsDropped = dropped
            $0.handedOver = handed
            $0.platforms = platforms
            $0.inFlight = inFlight
            $0.staleHeld = staleHeld
        }
    }

    /// The origin of a job sent through the Web Push sender; nil for the others.
    static func webPushOrigin(of job: DeliveryJob) -> String? {
        job.platform == .web || job.keys != nil ? Origin.text(ofEndpoint: job.token) : nil
    }
}
