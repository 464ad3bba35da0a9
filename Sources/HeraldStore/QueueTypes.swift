public import HeraldCore

// The queue's values as every store backend takes and answers them
// (see `DeliveryStore`).

/// Who a message goes to.
public enum Recipients: Sendable {
    case users([String])
    case devices([String])
}

/// One accepted `push.send`, ready to commit.
public struct Enqueue: Sendable {
    public var app: String
    public var message: PushMessage
    public var recipients: Recipients
    public var idempotencyKey: String?
    /// Platforms whose transport is disabled for this app, with the reason.
    public var disabled: [Platform: String]
    /// Refuse the message when the deliveries waiting to be sent, with its
    /// own, would exceed this (`[delivery] max_queued`).
    public var pendingLimit: Int
    /// `live_activity_high_per_hour`: priority-10 Live Activity pushes an
    /// activity may send per hour (``MessageRules/budgeted(_:_:now:_:)``).
    public var activityHighPerHour = Int.max
    /// The apps configured, among which `pendingLimit` is shared (see
    /// ``QueueAdmission``); 1: the limit is the app's alone.
    public var pendingApps = 1
    /// The caller waits for every delivery's outcome (`push.send` with
    /// `wait: true`): a shared store may hold the commit a few milliseconds
    /// to write the results of early sends with the message (see
    /// ``EarlyResults``).
    public var awaitsResults = false

    public init(
        app: String, message: PushMessage, recipients: Recipients, idempotencyKey: String?,
        disabled: [Platform: String], pendingLimit: Int = .max
    ) {
        self.app = app
        self.message = message
        self.recipients = recipients
        self.idempotencyKey = idempotencyKey
        self.disabled = disabled
        self.pendingLimit = pendingLimit
    }
}

/// Why a message was not queued.
public enum EnqueueError: Error, Sendable, Equatable {
    /// It addresses more devices than one message may (10,000).
    case tooManyDevices(count: Int, limit: Int)
    /// The queue holds `pending` deliveries; this message would pass `limit`.
    case queueFull(pending: Int, limit: Int)
    /// `limit` sends with an idempotency key already wait for a message
    /// with that key that is being written in parts (SQLite): try again.
    case keyWaitersFull(limit: Int)
}

/// What `push.send` answers once the message is committed.
public struct Enqueued: Sendable, Equatable {
    public let messageID: String
    /// Deliveries that will be attempted.
    public let devices: Int
    /// Deliveries recorded as skipped (kind not for the platform, transport disabled).
    public let skipped: Int
    /// True when an idempotency key within 24 h named an earlier message.
    public let duplicate: Bool
    /// Deliveries written delivered with the message, their answers having
    /// come before its commit (see ``EarlyResults``): when it equals
    /// `devices`, the message was complete when it committed.
    public var delivered = 0
}

/// `push.status` for one message.
public struct MessageStatus: Sendable {
    public struct Device: Sendable {
        public let deviceID: String
        public let platform: Platform
        public let state: DeliveryState
        public let attempts: Int
        public let httpStatus: Int?
        public let reason: String?
        public let updatedAt: Int64
        /// The instance that made the latest attempt; nil before any.
        public let sentBy: String?
        /// The last shrink step the delivery's sealed `web_payload` needed;
        /// nil when none was (or nothing was sealed with one).
        public var shrunk: Int? = nil
        /// When a held delivery is (or was) due; nil: it was never held.
        public var heldUntil: Int64? = nil
        /// The notes of its timing (``TimingNote``), comma-separated.
        public var timing: String? = nil
    }

    /// One attempt a provider saw (or that failed on its way), as `attempts` records it.
    public struct Attempt: Sendable {
        public let deviceID: String
        public let platform: Platform
        /// 1 for the delivery's first attempt recorded.
        public let number: Int
        /// Unix ms the result was written.
        public let at: Int64
        /// What the attempt came to: a final state, or `retrying`.
        public let state: String
        public let httpStatus: Int?
        public let reason: String?
        /// The request id Herald set (the `apns-id`).
        public let requestID: String?
        /// The `apns-unique-id`, the FCM message `name`, the Web Push `Location`.
        public let providerID: String?
        public let origin: String?
        public let elapsedMs: Int64?
        public let sentBy: String?

        init(_ r: some StoreRow, number: Int) throws {
            deviceID = try r.text(1)
            platform = Platform(rawValue: try r.text(2)) ?? .apns
            self.number = number
            at = try r.int64(3)
            state = try r.text(4)
            httpStatus = try r.optionalInt64(5).map { Int($0) }
            reason = try r.optionalText(6)
            requestID = try r.optionalText(7)
            providerID = try r.optionalText(8)
            origin = try r.optionalText(9)
            elapsedMs = try r.optionalInt64(10)
            sentBy = try r.optionalText(11)
        }

        /// The query both backends run: every attempt of `message`, by delivery then in order.
        static func query(message: String) -> String {
            """
            SELECT a.delivery_id, d.device_id, d.platform, a.at, a.state, a.http_status, a.reason, a.request_id,
                a.provider_id, a.origin, a.elapsed_ms, a.sent_by
            FROM attempts a JOIN deliveries d ON d.delivery_id = a.delivery_id
            WHERE d.message_id = \(message) ORDER BY a.delivery_id, a.attempt_id
            """
        }

        /// Numbers the rows of ``query(message:)`` per delivery, in order.
        struct Numbering {
            private var last: Int64 = -1
            private var n = 0

            mutating func take(_ r: some StoreRow) throws -> Attempt {
                let id = try r.int64(0)
                n = id == last ? n + 1 : 1
                last = id
                return try Attempt(r, number: n)
            }
        }
    }

    public let messageID: String
    public let createdAt: Int64
    public let counts: [DeliveryState: Int]
    public let devices: [Device]?
    /// With `detail`: every attempt recorded, by device.
    public var attempts: [Attempt]? = nil
    /// With `detail`, a Live Activity message's event, activity and whether
    /// its priority was lowered (never its content).
    public var liveActivity: LiveActivity? = nil

    /// complete when every delivery is final.
    public var isComplete: Bool {
        counts.allSatisfy { state, count in state.isFinal || count == 0 }
    }
}

/// What one claim took from the queue.
public struct Claim: Sendable {
    /// Deliveries now in flight, with what they need to be sent.
    public let jobs: [DeliveryJob]
    /// Deliveries the claim found final instead (past their TTL, device gone).
    public let finished: [BatchKey]
    /// For every message the claim touched: its deliveries per platform that
    /// were still to be answered when the claim began. A message all of
    /// whose touched batches the claim was told are `counted` is left out.
    public let batchSizes: [BatchKey: Int]
    /// The earliest `next_attempt_at` still waiting (any lane), if any.
    public let nextDueAt: Int64?
    /// Deliveries of `finished` that failed because their device row does
    /// not open with the store key (`unreadable_row`), for the log.
    public var unreadable: [(deliveryID: Int64, deviceID: String)] = []
    /// Deliveries handed before their message's commit whose results the
    /// enqueue may write itself: every answer to them goes through
    /// ``EarlyResults/offer(_:)`` until the commit is known.
    public var earlyResults: EarlyResults?
}

/// What several deliveries' results can share: the stores write each
/// distinct one with one statement.
struct RecordedResult: Hashable {
    let state: DeliveryState
    let httpStatus: Int?
    let reason: RecordedReason?
    let nextAttemptAt: Int64?
    let counted: Bool
    let shrink: ShrinkOutcome?

    /// `records` grouped by their result, each group's delivery ids in the records' order.
    static func grouping(_ records: [DeliveryRecord]) -> [RecordedResult: [Int64]] {
        var groups: [RecordedResult: [Int64]] = [:]
        for r in records {
            let result = RecordedResult(
                state: r.state, httpStatus: r.httpStatus, reason: r.reason, nextAttemptAt: r.nextAttemptAt,
                counted: r.countsAsAttempt, shrink: r.shrink)
            groups[result, default: []].append(r.deliveryID)
        }
        return groups
    }
}

/// One attempt's result, for `DeliveryStore.record(_:completion:)`.
public struct DeliveryRecord: Sendable {
    public let deliveryID: Int64
    public let deviceID: String
    /// A final state, or `retrying` at `nextAttemptAt`.
    public let state: DeliveryState
    public let httpStatus: Int?
    public let reason: RecordedReason?
    public let nextAttemptAt: Int64?
    /// False for an attempt that must not count toward `max_retries` (a
    /// credential rejection): the attempt the claim counted is taken back.
    public let countsAsAttempt: Bool
    /// Set when the attempt sealed a record of `web_payload`: written to
    /// `deliveries.shrunk` (NULL for `.whole`). Nil leaves it as it was.
    public let shrink: ShrinkOutcome?
    /// Set when a provider was asked (or the request failed on its way):
    /// the attempt is written to `attempts` with what names it there.
    public let receipt: ProviderReceipt?

    public init(
        deliveryID: Int64, deviceID: String, state: DeliveryState, httpStatus: Int?, reason: RecordedReason?,
        nextAttemptAt: Int64?, countsAsAttempt: Bool = true, shrink: ShrinkOutcome? = nil,
        receipt: ProviderReceipt? = nil
    ) {
        self.shrink = shrink
        self.receipt = receipt
        self.deliveryID = deliveryID
        self.deviceID = deviceID
        self.state = state
        self.httpStatus = httpStatus
        self.reason = reason
        self.nextAttemptAt = nextAttemptAt
        self.countsAsAttempt = countsAsAttempt
    }

    /// Delivered, and nothing else to write: no reason, no next attempt, the
    /// attempt counted, no shrink step of a Web Push payload (none sealed,
    /// or sealed whole).
    var isPlainDelivery: Bool {
        state == .delivered && reason == nil && nextAttemptAt == nil && countsAsAttempt
            && (shrink == nil || shrink == .whole)
    }
}

/// Deliveries waiting and in flight, for `system.stats`.
public struct QueueDepth: Sendable, Equatable {
    public let waiting: Int
    public let inFlight: Int

    public init(waiting: Int, inFlight: Int) {
        self.waiting = waiting
        self.inFlight = inFlight
    }
}
