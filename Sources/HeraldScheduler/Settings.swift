public import HeraldCore
public import HeraldDelivery

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

/// A lane's change of health, as ``Scheduler/observeLaneHealth(_:)`` reports it.
public enum LaneChange: Sendable, Hashable {
    /// Marked degraded: the provider refused the credential (its reason).
    case degraded(ProviderReason)
    /// Its provider took a send again.
    case recovered
}
