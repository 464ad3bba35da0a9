import HeraldCore

/// What one part of an enqueue leaves (see `Queue.begin`).
enum EnqueueStep: Sendable {
    /// The message is committed whole (or was found by its idempotency key).
    case whole(accepted: Enqueued, claim: Claim)
    /// More parts to write.
    case partial(Assembly)
    /// A message with the same idempotency key is being written in parts:
    /// this one is asked again once that one (named) is whole (or its part failed).
    case waitFor(String)
    /// Large: its devices are to be counted by platform (on the reader),
    /// and the message asked again with the count. Nothing was written.
    case needsCensus
}

/// The devices a message names: rows in all (skipped ones too), and per
/// platform those it will be sent to.
struct Census: Sendable {
    let rows: Int
    let sizes: [Platform: Int]
}

/// A message of many devices being written in parts on the SQLite store:
/// what its first part decided, which recipients are left, and what its
/// parts handed over. A value, passed from each part's completion to the
/// next part's job; only the store thread works on it.
struct Assembly: Sendable {
    let enqueue: Enqueue
    let messageID: String
    /// The message as stored (with its own collapse id).
    let message: PushMessage
    let acceptedAt: Int64
    let expiresAt: Int64
    /// The idempotency key's hash, taken at the last part.
    let idempotency: [UInt8]?
    /// Every recipient, each once; ``offset`` of them are written.
    let recipients: Recipients
    private(set) var offset = 0
    /// Recipients per part: users have many devices each, so the first
    /// part's count of rows per user sets the next parts' share.
    private var perPart: Int?
    /// The next row's id, and the end of the ids the first part took.
    var nextID: Int64 = 0
    var idsEnd: Int64 = 0
    /// The hand-over's room left, per lane and in all.
    var room: [QueueLane: Int]
    var roomLeft: Int
    /// How many handed deliveries go early in one call (``Queue/firstEarlyChunk``, then all).
    var earlyChunk: Int
    let early: (@Sendable (Claim) -> Void)?
    private(set) var sentEarly = false
    /// Deliveries handed over and not sent early: the answer's claim.
    var jobs: [DeliveryJob] = []
    var devices = 0
    var skipped = 0
    /// The message's batches (per platform), for the stale guard.
    var sizes: [BatchKey: Int] = [:]
    /// Parts written so far.
    var parts = 0

    init(
        enqueue: Enqueue, messageID: String, message: PushMessage, acceptedAt: Int64, expiresAt: Int64,
        idempotency: [UInt8]?, recipients: Recipients, room: [QueueLane: Int], roomLeft: Int, earlyChunk: Int,
        early: (@Sendable (Claim) -> Void)?
    ) {
        self.enqueue = enqueue
        self.messageID = messageID
        self.message = message
        self.acceptedAt = acceptedAt
        self.expiresAt = expiresAt
        self.idempotency = idempotency
        self.recipients = recipients
        self.room = room
        self.roomLeft = roomLeft
        self.earlyChunk = earlyChunk
        self.early = early
    }

    var done: Bool { offset >= recipients.count }

    /// As a part listed it before a stop: `written` recipients done, the
    /// next row's id and the end of the ids taken.
    mutating func restore(written: Int, nextID: Int64, idsEnd: Int64) {
        offset = written
        self.nextID = nextID
        self.idsEnd = idsEnd
    }

    /// Whether the next part (of ``Queue/partRows``) is the last.
    var nextIsLast: Bool { offset + share(rows: Queue.partRows) >= recipients.count }

    /// How many recipients make about `rows` devices.
    private func share(rows: Int) -> Int {
        switch recipients {
        case .devices: rows
        // The first part guesses 8 devices per user; what it finds
        // (``counted(rows:recipients:)``) sets the rest.
        case .users: perPart ?? max(1, rows / 8)
        }
    }

    /// The next part's recipients: about `rows` devices' worth (a user's
    /// devices are taken whole).
    mutating func next(rows: Int) -> Recipients {
        let end = min(recipients.count, offset + share(rows: rows))
        defer { offset = end }
        return switch recipients {
        case .users(let u): .users(Array(u[offset..<end]))
        case .devices(let d): .devices(Array(d[offset..<end]))
        }
    }

    /// The first part found `rows` devices for its recipients.
    mutating func counted(rows: Int, recipients taken: Int) {
        guard perPart == nil, case .users = recipients, taken > 0 else { return }
        let perUser = max(1, (rows + taken - 1) / taken)
        perPart = max(1, Queue.partRows / perUser)
    }

    /// Hands the deliveries taken since the last call to `early`.
    mutating func sendEarly(_ early: @Sendable (Claim) -> Void) {
        early(Claim(jobs: jobs, finished: [], batchSizes: sentEarly ? [:] : sizes, nextDueAt: nil))
        sentEarly = true
        jobs.removeAll(keepingCapacity: true)
    }

    var accepted: Enqueued {
        Enqueued(messageID: messageID, devices: devices, skipped: skipped, duplicate: false)
    }

    /// The answer's claim: the deliveries handed over and not sent early,
    /// with the batch sizes when nothing went early (otherwise the claim
    /// that takes the rest counts them, as for any message).
    var claim: Claim {
        Claim(jobs: jobs, finished: [], batchSizes: jobs.isEmpty || sentEarly ? [:] : sizes, nextDueAt: nil)
    }
}

extension Recipients {
    /// How many names (users or devices) it holds.
    var count: Int { names.count }

    /// The users' or the devices' names.
    var names: [String] {
        switch self {
        case .users(let u): u
        case .devices(let d): d
        }
    }

    var byDevice: Bool {
        if case .devices = self { true } else { false }
    }
}

/// Sends that wait for a message being written in parts because it holds
/// their idempotency key, by that message's id: each is asked again when the
/// message is whole (its answer is then the duplicate's) or its part failed.
/// Bounded in all: past ``limit`` a send is refused (the caller retries)
/// rather than held.
struct KeyWaiters {
    static let defaultLimit = 1024
    let limit: Int
    private(set) var count = 0
    private var waiting: [String: [@Sendable () -> Void]] = [:]

    init(limit: Int = Self.defaultLimit) {
        self.limit = limit
    }

    /// Holds `retry` until `messageID` is released; false (nothing held)
    /// when ``limit`` sends wait already.
    mutating func park(behind messageID: String, _ retry: @escaping @Sendable () -> Void) -> Bool {
        guard count < limit else { return false }
        waiting[messageID, default: []].append(retry)
        count += 1
        return true
    }

    /// The sends that waited for `messageID`, no longer held.
    mutating func release(_ messageID: String) -> [@Sendable () -> Void] {
        let released = waiting.removeValue(forKey: messageID) ?? []
        count -= released.count
        return released
    }
}
