import Foundation
import HeraldCore
import HeraldCrypto
import Postgres
import HeraldIO

/// The durable delivery queue on PostgreSQL: the rules of ``Queue`` (SQLite)
/// for several instances at once. Claims are leases: `FOR UPDATE SKIP LOCKED`
/// takes due rows no other instance is taking, and a claimed row records its
/// instance (`sent_by`) and when its lease runs out (`lease_expires_at`). A
/// live instance renews its leases; rows whose lease ran out go back to the
/// queue at the next claim of any instance. Idempotency keys and coalescing
/// hold across instances through unique indexes: a job that loses a race
/// fails its statement, and the store runs it again (see ``PostgresStore``),
/// now seeing the winner's row.
final class PostgresQueue: Sendable {
    private let key: StoreKey
    let instance: String
    let leaseMs: Int64
    /// The longest a delivery stays in flight after its claim, renewed or
    /// not: past it any instance takes it back (a live but stuck instance
    /// cannot hold work for ever).
    let maxAgeMs: Int64
    /// What this instance knows of the queue and of the lanes, between statements.
    private struct Known {
        /// Never below the waiting deliveries this instance knows of; counted
        /// again when an admission would pass the limit or the count is older
        /// than `boundAgeMs` (other instances add to the queue too).
        var pendingBound = 0
        /// `pendingBound` per app, counted (when the apps contend for
        /// `max_queued`, see ``QueueAdmission``) and raised with it.
        var pendingByApp: [String: Int] = [:]
        var byAppCountedAt: Int64 = .min / 2
        var boundCountedAt: Int64 = .min / 2
        /// The lanes (`app` U+001F `platform`) that another live instance can
        /// send, as the listener last read them: this instance neither skips
        /// nor claims their deliveries when it cannot send them itself.
        var othersLanes: Set<String> = []
        /// Whether the listener has read the others' lanes at least once.
        var othersKnown = false
        /// The last depth counted, and when (on the monotonic clock, ms).
        var cachedDepth: (depth: QueueDepth, at: Int64)?
        /// The lanes this instance can send raw-token registrations of (nil:
        /// not published, every lane with a transport).
        var ownLanes: Set<String>?
    }

    private let known = Locked(Known())
    static let boundAgeMs: Int64 = 1000
    static let depthCacheMs: Int64 = 1000

    /// The database's clock in milliseconds since the epoch, at the moment a
    /// statement reads it (`clock_timestamp()`, not the transaction's start):
    /// leases are written from it, so a batch that waited on a lock never
    /// writes a lease already partly spent. Every time several instances
    /// compare is the database's (SPEC Revision 3, "One clock").
    static let databaseNow = "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
    /// The same read once per statement (an init plan), not once per row:
    /// the numeric arithmetic costs about half a microsecond a row.
    static let databaseNowOnce = "(SELECT \(databaseNow))"

    /// The name of a lane in the instances table and the claim's exclusions.
    static func laneName(_ lane: QueueLane) -> String { lane.app + "\u{1F}" + lane.platform.rawValue }

    func setOthersLanes(_ lanes: Set<String>) {
        known.withLock {
            $0.othersLanes = lanes
            $0.othersKnown = true
        }
    }

    /// A live instance: its identity lock (see ``InstanceIdentity``) is held.
    static let instanceAlive = """
        EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
            AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
            AND l.classid::bigint = ((i.lock_key >> 32) & 4294967295)
            AND l.objid::bigint = (i.lock_key & 4294967295))
        """

    /// The lanes the other live instances can send, read now (an enqueue
    /// that would skip for want of a transport asks the database, not a
    /// cache a second old).
    func liveLanesOfOthers(_ c: PostgresConnection) throws -> Set<String> {
        var out = Set<String>()
        for r in try c.execute(
            "SELECT array_to_string(i.lanes, chr(30)) FROM instances i WHERE i.instance_id <> $1 AND \(Self.instanceAlive)",
            [.text(instance)]
        ).rows {
            for lane in try r.text(0).split(separator: "\u{1E}") { out.insert(String(lane)) }
        }
        return out
    }
    func setOwnLanes(_ lanes: Set<String>) { known.withLock { $0.ownLanes = lanes } }

    static let channel = "herald_work"

    /// What a test's injected clock adds to the database's (0 in service):
    /// leases are written at the database's time plus this.
    let shift: @Sendable () -> Int64

    /// A lease's end relative to the database's clock at the write.
    private var leaseParameter: PostgresValue { .int(leaseMs + shift()) }

    /// The devices whose last success this instance wrote lately: a result
    /// sets `devices.last_success_at` again only once its resolution
    /// (``Queue/successResolutionMs``) has passed, so that most results do
    /// not touch `devices` at all. (Noted when the statement succeeds: a
    /// batch rolled back after it leaves a device's last success up to one
    /// resolution old, no more.)
    let recentSuccesses = RecentSuccesses()

    init(
        key: StoreKey, instance: String, leaseMs: Int64, maxAgeMs: Int64, shift: @escaping @Sendable () -> Int64 = { 0 }
    ) {
        self.shift = shift
        self.key = key
        self.instance = instance
        self.leaseMs = leaseMs
        self.maxAgeMs = max(maxAgeMs, leaseMs)
    }

    // MARK: Array parameters

    /// A PostgreSQL array literal of texts (every element quoted; nil is NULL).
    static func textArray(_ values: [String?]) -> String {
        // Built as UTF-8 bytes: a message's arrays hold hundreds of values,
        // and appending to a String scalar by scalar stood out in profiles of
        // a fan-out on PostgreSQL.
        var out: [UInt8] = []
        out.reserveCapacity(2 + values.count * 24)
        out.append(UInt8(ascii: "{"))
        for (i, value) in values.enumerated() {
            if i > 0 { out.append(UInt8(ascii: ",")) }
            guard let value else {
                out.append(contentsOf: "NULL".utf8)
                continue
            }
            out.append(UInt8(ascii: "\""))
            for byte in value.utf8 {
                switch byte {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"):
                    out.append(UInt8(ascii: "\\"))
                    out.append(byte)
                case 0:
                    // PostgreSQL text cannot hold a NUL: U+FFFD, as `clean`.
                    out.append(contentsOf: [0xEF, 0xBF, 0xBD])
                default: out.append(byte)
                }
            }
            out.append(UInt8(ascii: "\""))
        }
        out.append(UInt8(ascii: "}"))
        return String(decoding: out, as: UTF8.self)
    }

    /// A PostgreSQL array literal of `bytea` values (hex input form).
    static func byteaArray(_ values: [[UInt8]?]) -> String {
        "{" + values.map { value in value.map { "\"\\\\x" + $0.hexString + "\"" } ?? "NULL" }.joined(separator: ",")
            + "}"
    }

    static func bigintArray(_ values: [Int64]) -> String {
        "{" + values.map(String.init).joined(separator: ",") + "}"
    }

    /// A PostgreSQL array literal of integers, nil as NULL.
    static func bigintArray(_ values: [Int64?]) -> String {
        "{" + values.map { $0.map(String.init) ?? "NULL" }.joined(separator: ",") + "}"
    }

    /// Free text Herald writes (reasons): PostgreSQL text cannot hold a NUL.
    static func clean(_ text: String?) -> PostgresValue {
        guard let text else { return .null }
        return .text(text.utf8.contains(0) ? text.replacingOccurrences(of: "\0", with: "\u{FFFD}") : text)
    }

    // MARK: Enqueue

    /// Commits the message and its deliveries, handing up to `handoff[lane]`
    /// of each lane (`handoffLimit` in all) straight to the caller, written in
    /// flight: as `Queue.begin` does on SQLite (here a message is always written whole).
    ///
    /// With `early` (and `earlyAllowed()` true: time is left before the
    /// call's deadline), the handed deliveries of a message without a
    /// collapse key go to `early` as soon as their tokens are open, before
    /// their rows are written: once the message row is written and the
    /// table's lock taken, their ids are taken from the sequence ahead, the
    /// first ``Queue/firstEarlyChunk`` with the batch sizes, the rest in one
    /// more call, and the returned claim holds none of them. The caller may
    /// send them at once but must not record their results before the
    /// transaction commits. Should the job run again (a lost race), it runs
    /// with the same `plan`: the same message id and delivery ids, and the
    /// deliveries sent early are written in flight, not handed again.
    func enqueue(
        _ c: PostgresConnection, _ e: Enqueue, now: Int64, handoff: [QueueLane: Int], handoffLimit: Int = .max,
        early: ((Claim) -> Void)? = nil, earlyAllowed: () -> Bool = { true }, plan: EarlyPlan = EarlyPlan(),
        holds: ResultHolds? = nil, holdLatest: UInt64 = 0
    ) throws -> (accepted: Enqueued, claim: Claim) {
        var idempotency: PostgresValue = .null
        if let k = e.idempotencyKey {
            let hash = MessageRules.idempotencyHash(k)
            idempotency = .bytes(hash)
            // Taken in turn with any instance sending the same key: the
            // second finds the first's message once it commits.
            try PostgresRegistry.lock(c, PostgresRegistry.lockKey("idem", e.app, hash.hexString))
            if let accepted = try Rows(queue: self, c: c).duplicate(app: e.app, idempotencyHash: hash, now: now) {
                return (accepted, Claim(jobs: [], finished: [], batchSizes: [:], nextDueAt: nil))
            }
        }
        let messageID = try plan.messageID ?? SecureRandom.bytes(16).hexString
        let expires = MessageRules.expiresAt(e, now: now)
        var message = MessageRules.stored(e, messageID: messageID)
        if message.liveActivity != nil {
            message = try MessageRules.budgeted(message, e, now: now, PostgresActivityBudget(c: c))
        }
        // Early sends only where nothing after them can wait on another
        // transaction: a message without a collapse key (whose queued rows
        // another instance's uncommitted message could hold up in the unique
        // index), once the table's lock is held (a session holding it makes
        // the call fail before anything is sent), with time left before the
        // call's deadline. What follows is one insert that waits on no one:
        // a caller told `store_unavailable` was sent nothing.
        let sendsEarly =
            early != nil && !plan.started && handoffLimit > 0 && !handoff.isEmpty && e.message.collapseKey == nil
            && earlyAllowed()
        let messageRow: [PostgresValue] = [
            .text(messageID), .text(e.app), idempotency,
            .text(try MessageCodec.encode(message, messageID: messageID, key: key)), .int(now), .int(expires),
        ]
        // Sent early: the devices, the message's row and the ids of its
        // deliveries (taken ahead, under the table's lock) in one round trip.
        let (targets, taken) = try resolve(
            c, e.recipients, app: e.app, rows: MessageRules.targetRows(e.message),
            writing: sendsEarly ? messageRow : nil)
        try MessageRules.checkSize(targets.count)
        try admit(c, e, adding: targets.count, now: now)

        struct Row {
            let target: DeviceTarget
            var state: DeliveryState
            var reason: String?
            var timing = DeliveryTiming.now
            var secrets: (token: String, keys: WebPushKeys?)?
            var id: Int64?
        }
        // First what becomes of each device (and so the batch sizes), then
        // the handed deliveries, then the rows.
        var rows: [Row] = []
        rows.reserveCapacity(targets.count)
        var room = handoff
        var roomLeft = handoffLimit
        var sizes: [BatchKey: Int] = [:]
        var devices = 0
        var skipped = 0
        let sendableElsewhere = e.disabled.isEmpty ? [] : try liveLanesOfOthers(c)
        for target in targets {
            var row = Row(target: target, state: .queued, reason: nil, secrets: nil, id: plan.id(of: target.deviceID))
            if plan.wasSent(target.deviceID) {
                // Sent early by an earlier run of this job: in flight, in the
                // room it took then, whatever this run's rules would say now
                // (a quiet period begun or a device turned off in between).
                devices += 1
                sizes[BatchKey(messageID: messageID, platform: target.platform), default: 0] += 1
                row.state = .inFlight
                room[QueueLane(app: e.app, platform: target.platform), default: 0] -= 1
                roomLeft -= 1
                rows.append(row)
                continue
            }
            if let why = MessageRules.skipReason(
                enabled: target.enabled, platform: target.platform, webPushForm: target.keysSealed != nil, e,
                sentElsewhere: { sendableElsewhere.contains(Self.laneName(QueueLane(app: e.app, platform: $0))) })
            {
                row.state = .skipped
                row.reason = why
            } else {
                row.timing = TimingRules.decide(message, target.preferences, now: now)
                if let why = row.timing.skip {
                    row.state = .skipped
                    row.reason = why
                }
            }
            if row.state == .skipped {
                skipped += 1
            } else if row.timing.heldUntil != nil {
                // Held: it joins its batch when it is claimed.
                devices += 1
            } else {
                devices += 1
                sizes[BatchKey(messageID: messageID, platform: target.platform), default: 0] += 1
            }
            rows.append(row)
        }

        if sendsEarly {
            for i in rows.indices { rows[i].id = taken[i] }
            if e.awaitsResults, holds != nil { plan.results = EarlyResults() }
            plan.start(messageID: messageID, ids: rows.compactMap { r in r.id.map { (r.target.deviceID, $0) } })
        } else {
            try c.execute(Statements.insertMessage, messageRow)
        }

        var jobs: [DeliveryJob] = []
        var earlyChunk = sendsEarly ? Queue.firstEarlyChunk : Int.max
        var sentEarly = false
        for i in rows.indices where rows[i].state == .queued && rows[i].timing.heldUntil == nil && roomLeft > 0 {
            let target = rows[i].target
            let lane = QueueLane(app: e.app, platform: target.platform)
            // Handed to this instance only what it can send itself; what only
            // another instance can send stays queued for it.
            guard (room[lane] ?? 0) > 0, e.disabled[target.keysSealed != nil ? .web : target.platform] == nil,
                let secrets = DeviceSecrets.open(
                    token: target.tokenSealed, keys: target.keysSealed, deviceID: target.deviceID, key: key)
            else { continue }
            rows[i].secrets = secrets
            rows[i].state = .inFlight
            room[lane]! -= 1
            roomLeft -= 1
            guard sendsEarly, let id = rows[i].id else { continue }
            jobs.append(
                job(
                    id, target, secrets, app: e.app, messageID: messageID, message: message, now: now,
                    expires: expires, silent: rows[i].timing.silent)
            )
            plan.sent(target.deviceID)
            if let early, jobs.count >= earlyChunk {
                early(
                    Claim(
                        jobs: jobs, finished: [], batchSizes: sentEarly ? [:] : sizes, nextDueAt: nil,
                        earlyResults: plan.results))
                sentEarly = true
                jobs.removeAll(keepingCapacity: true)
                // Results written with the message come in parts as they
                // come: handed in several claims, answers reach the enqueue
                // between them rather than all at once at the end.
                earlyChunk = plan.results != nil ? Self.heldEarlyChunk : .max
            }
        }
        if let early, !jobs.isEmpty {
            early(
                Claim(
                    jobs: jobs, finished: [], batchSizes: sentEarly ? [:] : sizes, nextDueAt: nil,
                    earlyResults: plan.results))
            sentEarly = true
            jobs.removeAll()
        }

        if let collapse = e.message.collapseKey {
            // A newer message with the same collapse key replaces one not yet
            // sent; the unique index on queued rows makes this hold when two
            // instances queue for the same device at once.
            let ids = rows.filter { $0.state != .skipped }.map { Optional($0.target.deviceID) }
            if !ids.isEmpty {
                try c.execute(
                    Statements.supersede,
                    [
                        .text("superseded by \(messageID)"), .int(now), .text(Self.textArray(ids)),
                        .bytes(Array(collapse.utf8)),
                    ])
            }
        }
        // `final`: the results written with their rows, by delivery id (their HTTP status).
        func insert(_ rows: [Row], final: [Int64: DeliveryRecord]) throws -> PostgresResult {
            let idsKnown = rows.allSatisfy { $0.id != nil }
            let http =
                final.isEmpty
                ? [] : rows.map { r in r.id.flatMap { final[$0]?.httpStatus }.map { Int32(clamping: $0) } }
            return try c.execute(
                idsKnown ? Statements.insertDeliveriesWithIDs : Statements.insertDeliveries,
                [
                    .text(messageID), .text(e.app), PostgresRegistry.bytes(e.message.collapseKey), .int(now),
                    .text(instance), leaseParameter,
                    .array(.text(rows.map { $0.target.deviceID })),
                    .array(.bytea(rows.map { Array($0.target.user.utf8) })),
                    .array(.text(rows.map { $0.target.platform.rawValue })),
                    .array(.text(rows.map { $0.target.tokenHash })),
                    .array(.text(rows.map { $0.state.rawValue })),
                    .array(.text(rows.map(\.reason))),
                    .array(.bigint(rows.map(\.id))),
                    .array(.integer(http)),
                    .array(
                        .bigint(
                            rows.map { r in
                                r.timing.heldUntil.map { _ in
                                    r.timing.nextAttemptAt(acceptedAt: now, expiresAt: expires)
                                }
                            })),
                    .array(.bigint(rows.map { r in r.state == .queued ? r.timing.heldUntil : nil })),
                    .array(.text(rows.map(\.timing.stored))),
                ])
        }
        // A caller that waits for the outcome: the answers of the early sends
        // that come within the hold are written final, in parts as they come
        // (while the rest are still being sent), and the last part with the
        // other rows: each such delivery is written once.
        var written = Set<Int64>()
        if let box = plan.results, box.isOpen, let holds {
            var index: [Int64: Int] = [:]
            for (i, row) in rows.enumerated() { if let id = row.id { index[id] = i } }
            let last = try holds.drain(box, waitingFor: plan.deliveryIDs.count, latest: holdLatest) { part in
                plan.keep(part)
                let final = Dictionary(part.map { ($0.deliveryID, $0) }, uniquingKeysWith: { first, _ in first })
                let slice = part.compactMap { index[$0.deliveryID] }.map { i in
                    var row = rows[i]
                    row.state = .delivered
                    return row
                }
                _ = try insert(slice, final: final)
                written.formUnion(final.keys)
            }
            plan.keep(last)
        }
        // Every kept result is final in `rows`; those not written in a part
        // (the last, or every one in a run after a lost race) go with the rest.
        let kept = plan.kept
        if !kept.isEmpty {
            for i in rows.indices where rows[i].id.map({ kept[$0] != nil }) ?? false { rows[i].state = .delivered }
        }
        let rest = written.isEmpty ? rows : rows.filter { $0.id.map { !written.contains($0) } ?? true }
        let inserted = rest.isEmpty ? nil : try insert(rest, final: kept)
        if rows.allSatisfy({ $0.state.isFinal }) {
            // Every delivery final as written (skipped, or answered before
            // the commit): complete now, and no later change says so.
            try c.execute(EventSQL.postgresMessageCompleteIfDone, [.int(now), .text(messageID)])
        }
        let idsKnown = rows.allSatisfy { $0.id != nil }
        if !kept.isEmpty {
            // Their devices' last success, as ``record(_:_:now:)`` writes it.
            let succeeded = recentSuccesses.due(
                kept.values.lazy.map(\.deviceID), now: now, within: Queue.successResolutionMs)
            if !succeeded.isEmpty {
                try c.execute(
                    Statements.lastSuccess,
                    [.int(now), .array(.text(succeeded)), .int(now - Queue.successResolutionMs)])
                recentSuccesses.wrote(succeeded, at: now)
            }
        }
        var ids: [String: Int64] = [:]
        if idsKnown {
            for row in rows { ids[row.target.deviceID] = row.id }
        } else {
            for r in inserted?.rows ?? [] { ids[try r.text(1)] = try r.int64(0) }
        }

        // What was not sent early goes in the claim, handed at the commit.
        var queuedLeft = false
        if !sentEarly {
            for row in rows where row.state != .skipped {
                guard let secrets = row.secrets, let deliveryID = ids[row.target.deviceID] else {
                    if row.state == .queued { queuedLeft = true }
                    continue
                }
                jobs.append(
                    job(
                        deliveryID, row.target, secrets, app: e.app, messageID: messageID, message: message, now: now,
                        expires: expires, silent: row.timing.silent))
            }
        } else {
            queuedLeft = rows.contains { $0.state == .queued }
        }
        if queuedLeft { try notify(c) }
        known.withLock {
            $0.pendingBound += devices
            $0.pendingByApp[e.app, default: 0] += devices
        }
        let claim = Claim(jobs: jobs, finished: [], batchSizes: jobs.isEmpty ? [:] : sizes, nextDueAt: nil)
        var accepted = Enqueued(messageID: messageID, devices: devices, skipped: skipped, duplicate: false)
        accepted.delivered = kept.count
        return (accepted, claim)
    }

    private func job(
        _ deliveryID: Int64, _ t: DeviceTarget, _ secrets: (token: String, keys: WebPushKeys?), app: String,
        messageID: String, message: PushMessage, now: Int64, expires: Int64, silent: Bool
    ) -> DeliveryJob {
        var job = DeliveryJob(
            deliveryID: deliveryID, messageID: messageID, app: app, deviceID: t.deviceID, user: t.user,
            platform: t.platform, environment: t.environment, token: secrets.token, keys: secrets.keys,
            tokenHash: t.tokenHash, registeredAt: t.registeredAt, message: message, acceptedAt: now,
            expiresAt: expires, previousAttempts: 0, bundleID: t.bundleID, serverKey: t.serverKey)
        job.silent = silent
        return job
    }

    /// Refuses `adding` more deliveries when the queue (every instance's)
    /// would pass `limit`.
    /// Refuses the message when ``QueueAdmission`` does, on the bounds while
    /// they admit and are younger than `boundAgeMs`; counted again
    /// otherwise, per app only when the apps contend.
    private func admit(_ c: PostgresConnection, _ e: Enqueue, adding: Int, now: Int64) throws {
        let limit = e.pendingLimit, apps = e.pendingApps
        let (bound, byApp, countedAt, byAppAt) = known.withLock {
            ($0.pendingBound, $0.pendingByApp, $0.boundCountedAt, $0.byAppCountedAt)
        }
        let contendedBound = QueueAdmission.contended(adding: adding, total: bound, limit: limit, apps: apps)
        let refused =
            contendedBound
            && QueueAdmission.refusal(
                app: e.app, adding: adding, total: bound, byApp: byApp, limit: limit, apps: apps) != nil
        // The per-app figures are trusted as the total is: younger than `boundAgeMs`.
        let byAppStale = contendedBound && apps > 1 && now - byAppAt >= Self.boundAgeMs
        guard refused || byAppStale || now - countedAt >= Self.boundAgeMs else { return }
        let d = try depth(c)
        var counted = d.waiting + d.inFlight
        var perApp = byApp
        let contended = QueueAdmission.contended(adding: adding, total: counted, limit: limit, apps: apps)
        if contended && apps > 1 {
            perApp = try depthByApp(c).mapValues { $0.waiting + $0.inFlight }
            counted = perApp.values.reduce(0, +)
        }
        known.withLock { k in
            k.pendingBound = counted
            if contended && apps > 1 {
                k.pendingByApp = perApp
                k.byAppCountedAt = now
            }
            k.boundCountedAt = now
        }
        guard contended else { return }
        if let refusal = QueueAdmission.refusal(
            app: e.app, adding: adding, total: counted, byApp: perApp, limit: limit, apps: apps)
        {
            throw refusal
        }
    }

    /// Wakes the other instances at commit (see ``PostgresStore``).
    func notify(_ c: PostgresConnection) throws {
        try c.execute(Statements.notify, [.text(Self.channel), .text(instance)])
    }

    /// With results written with the message, the handed deliveries after
    /// the first ``Queue/firstEarlyChunk`` go in claims of this many.
    static let heldEarlyChunk = 128

    /// The recipients' devices, in the order of their users (by name) and
    /// registration, or of the device ids given. With `message` (the
    /// message's row, as ``Statements/insertMessage`` takes it), the same
    /// statement writes the message and takes an id for each device's
    /// delivery: `ids[i]` is the id of the `i`th device's.
    private func resolve(
        _ c: PostgresConnection, _ recipients: Recipients, app: String, rows: (role: ActivityRole?, key: String),
        writing message: [PostgresValue]? = nil
    ) throws -> (targets: [DeviceTarget], ids: [Int64]) {
        let result: PostgresResult
        // Which rows: ordinary devices (no role), or a Live Activity's tokens.
        let picked: [PostgresValue] = [.optional(rows.role?.rawValue), .text(rows.key)]
        switch (recipients, message) {
        case (.users(let users), nil):
            result = try c.execute(
                Statements.resolveUsers, [.text(app), .array(.bytea(users.map { Array($0.utf8) }))] + picked)
        case (.users(let users), let message?):
            result = try c.execute(
                Statements.resolveUsersWritingMessage,
                message + [.array(.bytea(users.map { Array($0.utf8) }))] + picked)
        case (.devices(let ids), nil):
            result = try c.execute(Statements.resolveDevices, [.text(app), .array(.text(ids))] + picked)
        case (.devices(let ids), let message?):
            result = try c.execute(Statements.resolveDevicesWritingMessage, message + [.array(.text(ids))] + picked)
        }
        var out: [DeviceTarget] = []
        var ids: [Int64] = []
        out.reserveCapacity(result.rows.count)
        var seen = Set<String>()
        for r in result.rows {
            let id = try r.text(0)
            guard seen.insert(id).inserted, let platform = Platform(rawValue: try r.text(2)) else { continue }
            var target = DeviceTarget(
                deviceID: id, user: try r.clientText(1), platform: platform, tokenHash: try r.text(3),
                environment: try r.optionalText(4).flatMap(APNsEnvironment.init(rawValue:)),
                tokenSealed: try r.bytes(5), keysSealed: try r.optionalBytes(6), registeredAt: try r.int64(7),
                bundleID: try r.optionalText(8), serverKey: try r.optionalText(9), enabled: try r.bool(10))
            target.preferences = StoredPreferences(
                timeZone: try r.optionalText(11), quietHours: try r.optionalText(12), topics: try r.optionalText(13))
            out.append(target)
            if message != nil { ids.append(try r.int64(14)) }
        }
        return (out, ids)
    }

    private func stateCounts(_ c: PostgresConnection, _ messageID: String) throws -> [DeliveryState: Int] {
        var counts: [DeliveryState: Int] = [:]
        for r in try c.execute(Statements.stateCounts, [.text(messageID)]).rows {
            if let s = DeliveryState(rawValue: try r.text(0)) { counts[s] = Int(try r.int64(1)) }
        }
        return counts
    }

    // MARK: Status and cancel

    func status(_ c: PostgresConnection, app: String, messageID: String, detail: Bool) throws -> MessageStatus? {
        // The message and its counts in one statement (a poll of `wait: true` costs one).
        let summary = try c.execute(
            """
            SELECT m.created_at, \(Queue.reportedState), count(d.state) FROM messages m
            LEFT JOIN deliveries d ON d.message_id = m.message_id
            WHERE m.app = $1 AND m.message_id = $2 GROUP BY 1, 2
            """, [.text(app), .text(messageID)]
        ).rows
        guard let first = summary.first else { return nil }
        var counts: [DeliveryState: Int] = [:]
        for r in summary {
            if let s = try r.optionalText(1).flatMap(DeliveryState.init(rawValue:)) { counts[s] = Int(try r.int64(2)) }
        }
        var devices: [MessageStatus.Device]?
        if detail {
            devices = try c.execute(
                """
                SELECT device_id, platform, \(Queue.reportedState), attempts, http_status, reason, updated_at,
                    sent_by, shrunk, held_until, timing
                FROM deliveries d WHERE message_id = $1 ORDER BY delivery_id
                """, [.text(messageID)]
            ).rows.map { r in
                var device = MessageStatus.Device(
                    deviceID: try r.text(0), platform: Platform(rawValue: try r.text(1)) ?? .apns,
                    state: DeliveryState(rawValue: try r.text(2)) ?? .failed, attempts: Int(try r.int64(3)),
                    httpStatus: try r.optionalInt64(4).map { Int($0) }, reason: try r.optionalText(5),
                    updatedAt: try r.int64(6), sentBy: try r.optionalText(7),
                    shrunk: try r.optionalInt64(8).map { Int($0) })
                device.heldUntil = try r.optionalInt64(9)
                device.timing = try r.optionalText(10)
                return device
            }
        }
        var status = MessageStatus(
            messageID: messageID, createdAt: try first.int64(0), counts: counts, devices: devices)
        if detail {
            var numbering = MessageStatus.Attempt.Numbering()
            status.attempts = try c.execute(MessageStatus.Attempt.query(message: "$1"), [.text(messageID)]).rows.map {
                try numbering.take($0)
            }
            if let payload = try c.execute("SELECT payload FROM messages WHERE message_id = $1", [.text(messageID)])
                .first?.text(0)
            {
                status.liveActivity = MessageRules.activityOutline(payload, messageID: messageID, key: key)
            }
        }
        return status
    }

    func cancel(_ c: PostgresConnection, app: String, messageID: String, now: Int64) throws -> Int? {
        guard
            try c.execute("SELECT 1 FROM messages WHERE app = $1 AND message_id = $2", [.text(app), .text(messageID)])
                .first != nil
        else { return nil }
        return try c.execute(
            """
            UPDATE deliveries SET state = 'skipped', reason = 'cancelled', updated_at = $1
            WHERE message_id = $2 AND state IN ('queued', 'retrying')
            """, [.int(now), .text(messageID)]
        ).affectedRows
    }

    func releaseCredentialWaits(_ c: PostgresConnection, lanes: [QueueLane], now: Int64) throws -> Int {
        var released = 0
        for lane in lanes {
            released += try c.execute(
                """
                UPDATE deliveries SET next_attempt_at = $1, updated_at = $1
                WHERE state = 'retrying' AND reason = $2 AND platform = $3 AND next_attempt_at > $1 AND app = $4
                """,
                [.int(now), .text(DeliveryReason.credentialRejected), .text(lane.platform.rawValue), .text(lane.app)]
            ).affectedRows
        }
        if released > 0 { try notify(c) }
        return released
    }

    // MARK: Leases

    /// This instance's deliveries in flight go back to the queue, due at once (keeping the time they were due, so they stay ahead of later work),
    /// with `reason`: at open, what its previous run left (a stop or
    /// crash), and at a graceful stop, what it did not send. Other instances
    /// are woken to take them. Returns how many.
    func releaseOwn(_ c: PostgresConnection, now: Int64, reason: String) throws -> Int {
        let n = try c.execute(
            """
            UPDATE deliveries SET state = 'retrying', next_attempt_at = LEAST(next_attempt_at, $1), updated_at = $1,
                lease_expires_at = NULL, reason = $3
            WHERE state = 'in_flight' AND sent_by = $2
            """, [.int(now), .text(instance), .text(reason)]
        ).affectedRows
        if n > 0 { try notify(c) }
        return n
    }

    /// Deliveries in flight that nobody holds any more go back to the queue,
    /// due at once (keeping the time they were due): a lease that ran out (its instance stopped renewing it, or
    /// never held it: a result lost in an ambiguous commit), none at all, one
    /// older than the maximum age, or one of an instance in `gone` (its
    /// process is dead: its sessions closed). Returns how many; the other
    /// instances are woken when there are any.
    func rescue(_ c: PostgresConnection, now: Int64, gone: [String]) throws -> Int {
        let n = try c.execute(
            Statements.rescue, [.int(now), .int(now - maxAgeMs), .text(Self.textArray(gone))]
        ).affectedRows
        if n > 0 { try notify(c) }
        return n
    }

    /// Extends the leases of `held`, the deliveries this instance's
    /// scheduler holds (never every row recorded under its name: one whose
    /// result was lost must run out), up to the maximum age.
    func renewLeases(_ c: PostgresConnection, held: [Int64], now: Int64) throws -> Int {
        guard !held.isEmpty else { return 0 }
        return try c.execute(
            Statements.renew,
            [leaseParameter, .text(Self.bigintArray(held)), .text(instance), .int(now - maxAgeMs)]
        ).affectedRows
    }

    /// Puts back deliveries of `ids` still in flight under this instance
    /// that its scheduler does not hold (a claim or hand-over whose commit
    /// failed may have committed after all). Returns how many.
    func putBack(_ c: PostgresConnection, ids: [Int64], now: Int64) throws -> Int {
        guard !ids.isEmpty else { return 0 }
        let n = try c.execute(
            """
            UPDATE deliveries SET state = 'retrying', next_attempt_at = LEAST(next_attempt_at, $1), updated_at = $1,
                lease_expires_at = NULL, reason = 'claim not confirmed'
            WHERE delivery_id = ANY($2::bigint[]) AND state = 'in_flight' AND sent_by = $3
            """, [.int(now), .text(Self.bigintArray(ids)), .text(instance)]
        ).affectedRows
        if n > 0 { try notify(c) }
        return n
    }

    // MARK: Claims

    /// Takes due deliveries as ``Queue/claimDue(lanes:others:now:)`` does,
    /// skipping rows another instance is taking, and leases them.
    func claimDue(
        _ c: PostgresConnection, lanes: [QueueLane: Int], others: Int, counted: Set<BatchKey> = [], now: Int64
    ) throws -> Claim {
        _ = try rescue(c, now: now, gone: [])
        var results: [PostgresResult] = []
        let named = lanes.keys.sorted { ($0.app, $0.platform.rawValue) < ($1.app, $1.platform.rawValue) }
        let (own, cached, othersKnown) = known.withLock { ($0.ownLanes, $0.othersLanes, $0.othersKnown) }
        var elsewhere = cached
        if othersKnown, let own,
            named.contains(where: {
                lanes[$0]! > 0 && !own.contains(Self.laneName($0))
                    && !elsewhere.contains(Self.laneName($0))
            })
        {
            // About to skip deliveries for want of a sender: ask the database,
            // as an enqueue does, not the listener's view a second old (an
            // instance that started meanwhile can send them).
            elsewhere = try liveLanesOfOthers(c)
            setOthersLanes(elsewhere)
        }
        // Lanes whose raw-token registrations this instance cannot send and no
        // live instance can: those are skipped at the claim.
        var noSender = Set<QueueLane>()
        for lane in named where lanes[lane]! > 0 {
            // A lane whose raw-token registrations only another live instance
            // can send: take its Web Push-form ones only, leave the rest to it.
            let name = Self.laneName(lane)
            let lacks = own.map { !$0.contains(name) } == true
            // Until the others' lanes are known, assume one of them can send.
            let webOnly = lacks && (!othersKnown || elsewhere.contains(name))
            if lacks && !webOnly { noSender.insert(lane) }
            results.append(
                try c.execute(
                    Statements.claimLane,
                    [
                        .text(lane.app), .text(lane.platform.rawValue), .int(now), .int(Int64(lanes[lane]!)),
                        .bool(webOnly),
                    ]))
        }
        if others > 0 {
            // Lanes this instance sends are claimed above; lanes another live
            // instance can send are left to it.
            let excluded = Self.textArray(Array(Set(named.map(Self.laneName)).union(elsewhere)))
            results.append(try c.execute(Statements.claimOthers, [.int(now), .text(excluded), .int(Int64(others))]))
        }

        var sorting = ClaimSorting(key: key, now: now, noSender: noSender)
        for r in results.flatMap(\.rows) { try sorting.sort(r) }
        return try sorting.finish(counted: counted, Rows(queue: self, c: c))
    }

    /// The queue's statements on one connection, for the rules written once
    /// (``ClaimSorting``, ``StaleRules``).
    struct Rows: ClaimStatements, StaleStatements, IdempotencyStatements {
        let queue: PostgresQueue
        let c: PostgresConnection

        func message(app: String, idempotencyHash: [UInt8]) throws -> (id: String, acceptedAt: Int64)? {
            guard let found = try c.execute(Statements.findIdempotent, [.text(app), .bytes(idempotencyHash)]).first
            else { return nil }
            return (try found.text(0), try found.int64(1))
        }

        func clearIdempotencyKey(messageID: String) throws {
            try c.execute("UPDATE messages SET idempotency_hash = NULL WHERE message_id = $1", [.text(messageID)])
        }

        func stateCounts(_ messageID: String) throws -> [DeliveryState: Int] {
            try queue.stateCounts(c, messageID)
        }

        func batchSizes(_ messageIDs: [String], now: Int64) throws -> [BatchKey: Int] {
            var sizes: [BatchKey: Int] = [:]
            for r in try c.execute(Statements.batchSizes, [.text(PostgresQueue.textArray(messageIDs)), .int(now)]).rows
            {
                if let p = Platform(rawValue: try r.text(1)) {
                    sizes[BatchKey(messageID: try r.text(0), platform: p)] = Int(try r.int64(2))
                }
            }
            return sizes
        }

        func mark(_ id: Int64, _ state: DeliveryState, reason: String, now: Int64) throws {
            try queue.mark(c, id, state, reason: reason, now: now)
        }

        func markUnreadable(_ id: Int64, now: Int64) throws {
            try queue.markUnreadable(c, id, now: now)
        }

        func take(_ ids: [Int64], now: Int64) throws {
            try c.execute(
                Statements.lease,
                [.int(now), .text(queue.instance), queue.leaseParameter, .text(PostgresQueue.bigintArray(ids))])
        }

        func nextDueAt() throws -> Int64? {
            try c.execute(Statements.nextDue).first?.optionalInt64(0)
        }

        func owner(deviceID: String, tokenHash: String) throws -> (app: String, device: RemovedDevice)? {
            guard
                let row = try c.execute(
                    "SELECT app, user_name, platform FROM devices WHERE device_id = $1 AND token_hash = $2",
                    [.text(deviceID), .text(tokenHash)]
                ).first
            else { return nil }
            return (
                try row.text(0),
                RemovedDevice(deviceID: deviceID, user: try row.clientText(1), platform: try row.text(2))
            )
        }

        func noteRemoved(app: String, _ devices: [RemovedDevice], reason: RemovalReason, now: Int64) throws {
            try PostgresRegistry.noteRemoved(c, app: app, devices, reason: reason, now: now)
        }

        /// Counted under a transaction lock per platform, so that two
        /// instances never both take the window's last deletion.
        func recentDeletions(platform: String, since: Int64) throws -> Int? {
            try PostgresRegistry.lock(c, PostgresRegistry.lockKey("stale", platform))
            try c.execute(
                "DELETE FROM stale_deletions WHERE platform = $1 AND deleted_at <= $2", [.text(platform), .int(since)])
            let recent = try c.execute("SELECT count(*) FROM stale_deletions WHERE platform = $1", [.text(platform)])
            return Int(try recent.first?.int64(0) ?? 0)
        }

        func deleteDevice(deviceID: String, tokenHash: String) throws {
            try c.execute(
                "DELETE FROM devices WHERE device_id = $1 AND token_hash = $2", [.text(deviceID), .text(tokenHash)])
        }

        func noteDeletion(platform: String, at: Int64) throws {
            try c.execute(
                "INSERT INTO stale_deletions (platform, deleted_at) VALUES ($1, $2)", [.text(platform), .int(at)])
        }

        /// Through the batch record: only a delivery this instance holds changes.
        func recordResult(_ r: DeliveryRecord, now: Int64) throws {
            try queue.record(c, [r], now: now)
        }
    }

    // MARK: Results

    /// Records attempts' results, however many and however different, in
    /// at most two statements, the devices' last success and failure with
    /// them. Only a delivery still in flight under this instance's lease
    /// changes: one whose lease ran out and that another instance took
    /// keeps that instance's attempt.
    ///
    /// The common result, delivered with nothing more to say, goes by its
    /// ids alone in a prepared statement (`delivery_id = ANY(…)`: a lookup
    /// per id in the live partition's primary key, planned once); every
    /// other result in one `UPDATE … FROM unnest(…)`.
    func record(_ c: PostgresConnection, _ records: [DeliveryRecord], now: Int64) throws {
        guard !records.isEmpty else { return }
        try insertAttempts(c, records, now: now)
        // The devices of deliveries delivered whose last success this
        // instance did not write within its resolution.
        let succeeded = recentSuccesses.due(
            records.lazy.filter { $0.state == .delivered }.map(\.deviceID), now: now,
            within: Queue.successResolutionMs)
        // The plain deliveries of the most common kind: HTTP status, and
        // whether a Web Push payload was sealed whole (its shrink step cleared).
        struct Kind: Hashable {
            let status: Int?
            let whole: Bool
        }
        let kinds = records.map { r in
            r.isPlainDelivery ? Kind(status: r.httpStatus, whole: r.shrink == .whole) : nil
        }
        var counts: [Kind: Int] = [:]
        for case let k? in kinds { counts[k, default: 0] += 1 }
        let common = counts.max { $0.value < $1.value }
        if let common, common.value < records.count {
            // Two statements: each locks the message rows whose deliveries it ends (their
            // completion count, in message order); taken for both first, in that order, so
            // that two instances writing results of the same messages cannot deadlock.
            try c.execute(Statements.lockMessages, [.array(.bigint(records.map(\.deliveryID)))])
        }
        var plain: [Int64] = []
        var rest: [DeliveryRecord] = []
        if let common {
            plain.reserveCapacity(common.value)
            for (r, k) in zip(records, kinds) {
                if k == common.key {
                    plain.append(r.deliveryID)
                } else {
                    rest.append(r)
                }
            }
            try c.execute(
                Statements.recordDelivered,
                [
                    common.key.status.map { .int(Int64($0)) } ?? .null, .int(now), .array(.bigint(plain)),
                    .text(instance), .int(now - Queue.successResolutionMs), .array(.text(succeeded)),
                    .text(common.key.whole ? "t" : "f"),
                ])
        } else {
            rest = records
        }
        if !rest.isEmpty {
            // Planned for its arrays each time (an unnamed statement): a
            // generic plan does not know how many rows the arrays hold, and a
            // nested loop over them costs the square of a batch's results.
            try c.execute(
                Statements.record.sql,
                [
                    .text(Self.bigintArray(rest.map(\.deliveryID))),
                    .text(Self.textArray(rest.map { $0.state.rawValue })),
                    .text(Self.bigintArray(rest.map { $0.httpStatus.map(Int64.init) })),
                    .text(Self.textArray(rest.map { $0.reason?.text })),
                    .text(Self.bigintArray(rest.map(\.nextAttemptAt))),
                    .text(Self.bigintArray(rest.map { Int64?($0.countsAsAttempt ? 0 : 1) })),
                    .text("{" + rest.map { $0.shrink != nil ? "t" : "f" }.joined(separator: ",") + "}"),
                    .text(Self.bigintArray(rest.map { $0.shrink?.index.map(Int64.init) })),
                    .int(now), .text(instance), .int(now - Queue.successResolutionMs),
                    // The successes went with the plain deliveries' statement.
                    .text(Self.textArray(common == nil ? succeeded : [])),
                ])
        }
        recentSuccesses.wrote(succeeded, at: now)
    }

    /// The attempts a provider saw (or that failed on their way), before
    /// their deliveries' results: a delivery's final event carries its last
    /// attempt's provider id.
    private func insertAttempts(_ c: PostgresConnection, _ records: [DeliveryRecord], now: Int64) throws {
        let attempted = records.filter { $0.receipt != nil }
        guard !attempted.isEmpty else { return }
        try c.execute(
            Statements.insertAttempts,
            [
                .int(now), .text(instance), .array(.bigint(attempted.map(\.deliveryID))),
                .array(.text(attempted.map { $0.state.rawValue })),
                .array(.integer(attempted.map { $0.httpStatus.map { Int32(clamping: $0) } })),
                .array(.text(attempted.map { $0.reason?.text })),
                .array(.text(attempted.map { $0.receipt?.apnsID })),
                .array(.text(attempted.map { $0.receipt?.providerID })),
                .array(.text(attempted.map { $0.receipt?.origin })),
                .array(.bigint(attempted.map { $0.receipt?.elapsedMs })),
            ])
    }

    /// Takes a token of a rate bucket shared by every instance: nil when
    /// allowed, else the milliseconds until one is available.
    func takeToken(_ c: PostgresConnection, bucket: String, perMinute: Int, now: Int64) throws -> Int64? {
        let name = SHA256.hex("bucket:" + bucket)
        let burst = Double(perMinute)
        let perMs = Double(perMinute) / 60_000
        try PostgresRegistry.lock(c, PostgresRegistry.lockKey("bucket", name))
        var tokens = burst
        if let row = try c.execute(
            "SELECT tokens, updated_at FROM rate_buckets WHERE bucket = $1", [.text(name)]
        ).first {
            let stored = Double(try row.text(0)) ?? 0
            tokens = min(burst, stored + Double(max(0, now - (try row.int64(1)))) * perMs)
        }
        let allowed = tokens >= 1
        if allowed { tokens -= 1 }
        try c.execute(
            """
            INSERT INTO rate_buckets (bucket, tokens, updated_at) VALUES ($1, $2::double precision, $3)
            ON CONFLICT (bucket) DO UPDATE SET tokens = excluded.tokens, updated_at = excluded.updated_at
            """, [.text(name), .text(String(tokens)), .int(now)])
        return allowed ? nil : Int64(((1 - tokens) / perMs).rounded(.up))
    }

    // MARK: Housekeeping

    /// The advisory lock of the housekeeper: one instance at a time purges.
    static let housekeeperLock = PostgresRegistry.lockKey("housekeeper")
    /// Messages one purge chunk deletes (with their deliveries).
    static let purgeChunk = 500

    /// The session advisory lock held while vacuuming the live partition
    /// (one instance at a time; the others skip).
    static let vacuumLock = PostgresRegistry.lockKey("vacuum live")
    /// Dead rows in `deliveries_live` past which it is vacuumed, at least:
    /// also past as many as it holds live ones.
    static let vacuumDeadRows: Int64 = 2000

    /// Vacuums `deliveries_live` when its dead rows (every delivery leaves
    /// one when it finishes and moves to the history) pass
    /// ``vacuumDeadRows`` and its live ones, unless another instance is at
    /// it. Autovacuum visits a database once a minute by default, and a
    /// minute of a busy queue's dead rows is many times its live work: this
    /// keeps the queue's table, and every scan of it, the size of the live
    /// work. Runs outside any transaction. Returns whether it vacuumed.
    func vacuumLive(_ c: PostgresConnection) throws -> Bool {
        let counts = try c.execute(
            "SELECT n_dead_tup, n_live_tup FROM pg_stat_user_tables WHERE relid = 'deliveries_live'::regclass"
        ).first
        guard let counts, try counts.int64(0) > max(Self.vacuumDeadRows, try counts.int64(1)) else { return false }
        guard try c.execute("SELECT pg_try_advisory_lock($1)", [.int(Self.vacuumLock)]).first?.bool(0) == true else {
            return false
        }
        defer { _ = try? c.execute("SELECT pg_advisory_unlock($1)", [.int(Self.vacuumLock)]) }
        try c.executeScript("VACUUM (SKIP_LOCKED, TRUNCATE false) deliveries_live")
        return true
    }

    /// One chunk of housekeeping, if no other instance is doing it: deletes
    /// up to ``purgeChunk`` messages created before `before` whose
    /// deliveries are all final, buckets idle for an hour, deletions past
    /// the stale window, and instance rows silent for a day. Returns the
    /// messages deleted, or nil when another instance holds the lock.
    func purgeChunk(_ c: PostgresConnection, before: Int64, now: Int64) throws -> Int? {
        guard try c.execute("SELECT pg_try_advisory_xact_lock($1)", [.int(Self.housekeeperLock)]).first?.bool(0) == true
        else { return nil }
        let purged = try c.execute(
            """
            DELETE FROM messages WHERE message_id IN (
                SELECT m.message_id FROM messages m WHERE m.created_at < $1 AND NOT EXISTS (
                    SELECT 1 FROM deliveries d WHERE d.message_id = m.message_id
                    AND d.state IN ('queued', 'retrying', 'in_flight'))
                ORDER BY m.created_at LIMIT $2)
            """, [.int(before), .int(Int64(Self.purgeChunk))]
        ).affectedRows
        // Buckets idle for an hour are full again; deletions past the window count no more.
        try c.execute("DELETE FROM rate_buckets WHERE updated_at < $1", [.int(now - 3_600_000)])
        try c.execute("DELETE FROM stale_deletions WHERE deleted_at <= $1", [.int(now - staleWindowMs)])
        try c.execute(
            "DELETE FROM instances WHERE heartbeat_at < $1 AND instance_id <> $2",
            [.int(now - 86_400_000), .text(instance)])
        return purged
    }

    private func mark(_ c: PostgresConnection, _ id: Int64, _ state: DeliveryState, reason: String, now: Int64) throws {
        try c.execute(
            "UPDATE deliveries SET state = $1, reason = $2, updated_at = $3, lease_expires_at = NULL WHERE delivery_id = $4",
            [.text(state.rawValue), .text(reason), .int(now), .int(id)])
    }

    private func markUnreadable(_ c: PostgresConnection, _ id: Int64, now: Int64) throws {
        try mark(c, id, .failed, reason: Queue.unreadableRowReason, now: now)
        try c.execute(
            """
            UPDATE devices SET last_failure_at = $1, last_failure_reason = $2
            WHERE device_id = (SELECT device_id FROM deliveries WHERE delivery_id = $3)
            """, [.int(now), .text(Queue.unreadableRowReason), .int(id)])
    }

    /// Deliveries waiting and in flight, every instance's: two counts that
    /// each read one partial index (the live work), never the history.
    func depth(_ c: PostgresConnection) throws -> QueueDepth {
        guard let r = try c.execute(Statements.depth).first else { return QueueDepth(waiting: 0, inFlight: 0) }
        let depth = QueueDepth(waiting: Int(try r.int64(0)), inFlight: Int(try r.int64(1)))
        known.withLock { $0.cachedDepth = (depth, Self.monotonicMs()) }
        return depth
    }

    /// The depth counted less than ``depthCacheMs`` ago, if any.
    var recentDepth: QueueDepth? {
        known.withLock {
            guard let cached = $0.cachedDepth, Self.monotonicMs() - cached.at < Self.depthCacheMs else { return nil }
            return cached.depth
        }
    }

    static func monotonicMs() -> Int64 {
        Int64(DispatchTime.now().uptimeNanoseconds / 1_000_000)
    }

    func depthByApp(_ c: PostgresConnection) throws -> [String: QueueDepth] {
        var out: [String: QueueDepth] = [:]
        for r in try c.execute(
            """
            SELECT app, count(*) FILTER (WHERE state IN ('queued', 'retrying')), count(*) FILTER (WHERE state = 'in_flight')
            FROM deliveries WHERE state IN ('queued', 'retrying', 'in_flight') GROUP BY app
            """
        ).rows {
            out[try r.text(0)] = QueueDepth(waiting: Int(try r.int64(1)), inFlight: Int(try r.int64(2)))
        }
        return out
    }

    private enum Statements {
        static let notify = PostgresStatement(name: "q_notify", sql: "SELECT pg_notify($1, $2)")
        static let findIdempotent = PostgresStatement(
            name: "q_idem", sql: "SELECT message_id, created_at FROM messages WHERE app = $1 AND idempotency_hash = $2")
        static let insertMessage = PostgresStatement(name: "q_message", sql: insertMessageSQL)
        private static let insertMessageSQL = """
            INSERT INTO messages (message_id, app, idempotency_hash, payload, created_at, expires_at)
            VALUES ($1, $2, $3, $4, $5, $6)
            """
        static let supersede = PostgresStatement(
            name: "q_supersede",
            sql: """
                UPDATE deliveries SET state = 'superseded', reason = $1, updated_at = $2
                WHERE device_id = ANY($3::text[]) AND collapse_key = $4 AND state IN ('queued', 'retrying')
                """)
        static let lastSuccess = PostgresStatement(
            name: "q_last_success",
            sql: """
                UPDATE devices SET last_success_at = $1
                WHERE device_id = ANY($2::text[]) AND (last_success_at IS NULL OR last_success_at <= $3)
                """)
        static let insertDeliveries = PostgresStatement(
            name: "q_deliveries", sql: insertDeliveriesSQL + "\nRETURNING delivery_id, device_id")
        /// The same when every id was taken ahead: nothing to return.
        static let insertDeliveriesWithIDs = PostgresStatement(name: "q_deliveries_ids", sql: insertDeliveriesSQL)
        static let insertDeliveriesSQL = """
            INSERT INTO deliveries (delivery_id, message_id, app, device_id, user_name, platform, token_hash,
                collapse_key, state, attempts, next_attempt_at, reason, updated_at, sent_by, lease_expires_at,
                http_status, held_until, timing)
            SELECT coalesce(t.id, nextval('deliveries_delivery_id_seq')), $1, $2, t.device_id, t.user_name,
                t.platform, t.token_hash, $3, t.state,
                CASE WHEN t.state IN ('in_flight', 'delivered') THEN 1 ELSE 0 END, coalesce(t.next_at, $4), t.reason,
                CASE WHEN t.state = 'delivered' THEN \(databaseNowOnce) ELSE $4 END,
                CASE WHEN t.state IN ('in_flight', 'delivered') THEN $5 END,
                CASE WHEN t.state = 'in_flight' THEN \(databaseNowOnce) + $6::bigint END,
                t.http, t.held_until, t.timing
            FROM unnest($7::text[], $8::bytea[], $9::text[], $10::text[], $11::text[], $12::text[], $13::bigint[],
                    $14::integer[], $15::bigint[], $16::bigint[], $17::text[])
                WITH ORDINALITY AS t(device_id, user_name, platform, token_hash, state, reason, id, http, next_at,
                    held_until, timing, n)
            ORDER BY t.n
            """
        static let resolveUsers = PostgresStatement(
            name: "q_resolve_users",
            sql: """
                SELECT \(resolveColumns)
                FROM devices v WHERE v.app = $1 AND v.user_name = ANY($2::bytea[]) AND \(picked(3, 4))
                ORDER BY v.user_name, v.registered_seq
                """)
        static let resolveDevices = PostgresStatement(
            name: "q_resolve_devices",
            sql: """
                SELECT \(resolveColumns)
                FROM unnest($2::text[]) WITH ORDINALITY AS n(id, i) JOIN devices v ON v.device_id = n.id AND v.app = $1
                WHERE \(picked(3, 4))
                ORDER BY n.i
                """)
        /// As ``resolveUsers`` (the app `$2`, the users `$7`), writing the
        /// message's row ($1-$6, as ``insertMessage``) and taking an id
        /// ahead for each device's delivery (sent before its row is written),
        /// under the table's lock (`LOCK TABLE deliveries IN ROW EXCLUSIVE
        /// MODE`: the insert's own, taken before any send, by
        /// `take_delivery_ids(0)`), in one round trip.
        static let resolveUsersWritingMessage = PostgresStatement(
            name: "q_resolve_users_message",
            sql: """
                WITH \(messageAndLock)
                SELECT \(resolveColumns), nextval('deliveries_delivery_id_seq')
                FROM m, locked, devices v WHERE v.app = $2 AND v.user_name = ANY($7::bytea[]) AND \(picked(8, 9))
                ORDER BY v.user_name, v.registered_seq
                """)
        /// As ``resolveUsersWritingMessage``, for devices by id.
        static let resolveDevicesWritingMessage = PostgresStatement(
            name: "q_resolve_devices_message",
            sql: """
                WITH \(messageAndLock)
                SELECT \(resolveColumns), nextval('deliveries_delivery_id_seq')
                FROM m, locked, unnest($7::text[]) WITH ORDINALITY AS n(id, i)
                JOIN devices v ON v.device_id = n.id AND v.app = $2
                WHERE \(picked(8, 9))
                ORDER BY n.i
                """)
        /// The rows a message goes to (``MessageRules/targetRows(_:)``): with
        /// `$role` null, ordinary devices; else the Live Activity tokens of
        /// that role whose type (start) or id (update) is `$key`.
        private static func picked(_ role: Int, _ key: Int) -> String {
            """
            (CASE WHEN $\(role)::text IS NULL THEN v.activity_role IS NULL
                WHEN $\(role)::text = 'start' THEN v.activity_role = 'start' AND v.activity_type = $\(key)::text
                ELSE v.activity_role = $\(role)::text AND v.activity_id = $\(key)::text END)
            """
        }
        private static let resolveColumns = """
            v.device_id, v.user_name, v.platform, v.token_hash, v.environment, v.token_sealed, v.keys_sealed,
                v.registered_at, v.bundle_id, v.server_key, v.enabled, v.time_zone, v.quiet_hours, v.topics
            """
        private static let messageAndLock = """
            m AS (\(insertMessageSQL) RETURNING 1),
                locked AS (SELECT count(*) FROM take_delivery_ids(0))
            """
        static let stateCounts = PostgresStatement(
            name: "q_state_counts",
            sql: "SELECT \(Queue.reportedState), count(*) FROM deliveries d WHERE message_id = $1 GROUP BY 1")
        static let rescue = PostgresStatement(
            name: "q_rescue",
            sql: """
                UPDATE deliveries SET state = 'retrying', next_attempt_at = LEAST(next_attempt_at, $1), updated_at = $1,
                    lease_expires_at = NULL, reason = CASE WHEN sent_by = ANY($3::text[]) THEN 'instance gone'
                        WHEN updated_at < $2 THEN 'lease past its maximum age' ELSE 'lease expired' END
                WHERE delivery_id IN (
                    SELECT delivery_id FROM deliveries WHERE state = 'in_flight' AND (lease_expires_at IS NULL
                        OR lease_expires_at < $1 OR updated_at < $2 OR sent_by = ANY($3::text[]))
                    ORDER BY lease_expires_at LIMIT 10000 FOR UPDATE SKIP LOCKED)
                """)
        static let renew = PostgresStatement(
            name: "q_renew",
            sql: """
                UPDATE deliveries SET lease_expires_at = \(databaseNowOnce) + $1
                WHERE delivery_id = ANY($2::bigint[]) AND state = 'in_flight' AND sent_by = $3 AND updated_at >= $4
                """)
        static let claimColumns = """
            SELECT d.delivery_id, d.message_id, d.app, d.device_id, d.user_name, d.platform, d.attempts, m.expires_at,
                m.payload, v.environment, v.token_sealed, v.keys_sealed, v.token_hash, v.registered_at, m.created_at,
                v.bundle_id, v.server_key, v.enabled, d.timing,
                CASE WHEN d.collapse_key IS NULL THEN NULL ELSE (
                    SELECT n.message_id FROM deliveries n
                    WHERE n.device_id = d.device_id AND n.collapse_key = d.collapse_key AND n.delivery_id > d.delivery_id
                        AND n.state IN ('queued', 'retrying', 'in_flight', 'delivered')
                    ORDER BY n.delivery_id DESC LIMIT 1) END
            FROM picked p JOIN deliveries d ON d.delivery_id = p.delivery_id
            JOIN messages m ON m.message_id = d.message_id
            LEFT JOIN devices v ON v.device_id = d.device_id
            ORDER BY d.next_attempt_at, d.delivery_id
            """
        static let claimLane = PostgresStatement(
            name: "q_claim_lane",
            sql: """
                WITH picked AS (
                    SELECT delivery_id FROM deliveries
                    WHERE app = $1 AND platform = $2 AND state IN ('queued', 'retrying') AND next_attempt_at <= $3
                        AND (NOT $5::boolean OR EXISTS (
                            SELECT 1 FROM devices w WHERE w.device_id = deliveries.device_id AND w.keys_sealed IS NOT NULL))
                    ORDER BY next_attempt_at LIMIT $4 FOR UPDATE SKIP LOCKED)
                \(claimColumns)
                """)
        static let claimOthers = PostgresStatement(
            name: "q_claim_others",
            sql: """
                WITH picked AS (
                    SELECT delivery_id FROM deliveries
                    WHERE state IN ('queued', 'retrying') AND next_attempt_at <= $1
                        AND (app || chr(31) || platform) <> ALL($2::text[])
                    ORDER BY next_attempt_at LIMIT $3 FOR UPDATE SKIP LOCKED)
                \(claimColumns)
                """)
        static let batchSizes = PostgresStatement(
            name: "q_batch_sizes",
            sql: """
                SELECT message_id, platform, count(*) FROM deliveries
                WHERE message_id = ANY($1::text[]) AND state IN ('queued', 'retrying', 'in_flight')
                    AND (held_until IS NULL OR next_attempt_at <= $2)
                GROUP BY message_id, platform
                """)
        static let lease = PostgresStatement(
            name: "q_lease",
            sql: """
                UPDATE deliveries SET state = 'in_flight', attempts = attempts + 1, updated_at = $1, sent_by = $2,
                    lease_expires_at = \(databaseNowOnce) + $3
                WHERE delivery_id = ANY($4::bigint[])
                """)
        static let nextDue = PostgresStatement(
            name: "q_next_due",
            sql: """
                SELECT min(next_attempt_at) FROM deliveries WHERE state IN ('queued', 'retrying')
                """)
        static let record = PostgresStatement(
            name: "q_record",
            sql: """
                WITH r AS (
                    SELECT * FROM unnest($1::bigint[], $2::text[], $3::integer[], $4::text[], $5::bigint[],
                        $6::integer[], $7::boolean[], $8::integer[])
                        AS r(id, state, http, reason, next_at, uncount, set_shrunk, shrunk)),
                done AS (
                    UPDATE deliveries d SET state = r.state, http_status = r.http, reason = r.reason,
                        next_attempt_at = COALESCE(r.next_at, d.next_attempt_at), updated_at = $9,
                        attempts = greatest(0, d.attempts - r.uncount), lease_expires_at = NULL,
                        shrunk = CASE WHEN r.set_shrunk THEN r.shrunk ELSE d.shrunk END
                    FROM r WHERE d.delivery_id = ANY($1::bigint[]) AND d.delivery_id = r.id AND d.state = 'in_flight'
                        AND d.sent_by = $10
                    RETURNING d.device_id, r.state, r.reason),
                succeeded AS (
                    UPDATE devices v SET last_success_at = $9
                    FROM unnest($12::text[]) s(device_id)
                    WHERE v.device_id = s.device_id AND (v.last_success_at IS NULL OR v.last_success_at <= $11)
                    RETURNING 1),
                failed AS (
                    UPDATE devices v SET last_failure_at = $9, last_failure_reason = f.reason
                    FROM (SELECT DISTINCT ON (device_id) device_id, reason FROM done WHERE state = 'failed') f
                    WHERE v.device_id = f.device_id
                    RETURNING 1)
                SELECT (SELECT count(*) FROM done), (SELECT count(*) FROM succeeded), (SELECT count(*) FROM failed)
                """)
        /// Deliveries delivered with nothing more to say (``DeliveryRecord/isPlainDelivery``), by id.
        static let lockMessages = PostgresStatement(
            name: "q_lock_messages",
            sql: """
                SELECT 1 FROM messages WHERE message_id IN (
                    SELECT message_id FROM deliveries WHERE delivery_id = ANY($1::bigint[]))
                ORDER BY message_id FOR UPDATE
                """)
        static let insertAttempts = PostgresStatement(
            name: "q_attempts",
            sql: """
                INSERT INTO attempts (delivery_id, at, state, http_status, reason, request_id, provider_id, origin,
                    elapsed_ms, sent_by)
                SELECT t.id, $1, t.state, t.http, t.reason, t.request_id, t.provider_id, t.origin, t.elapsed, $2
                FROM unnest($3::bigint[], $4::text[], $5::integer[], $6::text[], $7::text[], $8::text[], $9::text[],
                        $10::bigint[])
                    WITH ORDINALITY AS t(id, state, http, reason, request_id, provider_id, origin, elapsed, n)
                ORDER BY t.n
                """)
        static let recordDelivered = PostgresStatement(
            name: "q_record_delivered",
            sql: """
                WITH done AS (
                    UPDATE deliveries SET state = 'delivered', http_status = $1, reason = NULL, updated_at = $2,
                        lease_expires_at = NULL, shrunk = CASE WHEN $7::boolean THEN NULL ELSE shrunk END
                    WHERE delivery_id = ANY($3::bigint[]) AND state = 'in_flight' AND sent_by = $4
                    RETURNING 1),
                succeeded AS (
                    UPDATE devices v SET last_success_at = $2
                    WHERE v.device_id = ANY($6::text[]) AND (v.last_success_at IS NULL OR v.last_success_at <= $5)
                    RETURNING 1)
                SELECT (SELECT count(*) FROM done), (SELECT count(*) FROM succeeded)
                """)
        static let depth = PostgresStatement(
            name: "q_depth",
            sql: """
                SELECT (SELECT count(*) FROM deliveries WHERE state IN ('queued', 'retrying')),
                    (SELECT count(*) FROM deliveries WHERE state = 'in_flight')
                """)
    }
}

/// What one enqueue sent before its rows were written, kept across the runs
/// of its job: a run after a lost race writes the same message and ids, and
/// the deliveries already sent in flight.
final class EarlyPlan: Sendable {
    private struct Plan {
        var message: String?
        var ids: [String: Int64] = [:]
        var sentDevices: Set<String> = []
        var sentIDs: [Int64] = []
        var heldResults: EarlyResults?
        var keptResults: [Int64: DeliveryRecord] = [:]
    }

    /// The runs of one job follow each other on pool threads.
    private let plan = Locked(Plan())

    /// The results the enqueue may write itself (see ``EarlyResults``): set
    /// by the first run that sends early for a caller that waits.
    var results: EarlyResults? {
        get { plan.withLock { $0.heldResults } }
        set { plan.withLock { $0.heldResults = newValue } }
    }
    /// The results the enqueue took, by delivery id: every run writes them.
    var kept: [Int64: DeliveryRecord] { plan.withLock { $0.keptResults } }

    func keep(_ records: [DeliveryRecord]) {
        guard !records.isEmpty else { return }
        plan.withLock { p in for r in records { p.keptResults[r.deliveryID] = r } }
    }

    /// The message id the first run chose, once it took ids ahead.
    var messageID: String? { plan.withLock { $0.message } }
    /// Whether ids were taken ahead (a run after that sends nothing early).
    var started: Bool { plan.withLock { $0.message != nil } }
    /// The deliveries sent early, by id.
    var deliveryIDs: [Int64] { plan.withLock { $0.sentIDs } }

    func start(messageID: String, ids: [(String, Int64)]) {
        plan.withLock {
            $0.message = messageID
            $0.ids = Dictionary(ids, uniquingKeysWith: { first, _ in first })
        }
    }

    func id(of device: String) -> Int64? { plan.withLock { $0.ids[device] } }
    func wasSent(_ device: String) -> Bool { plan.withLock { $0.sentDevices.contains(device) } }

    func sent(_ device: String) {
        plan.withLock { p in
            p.sentDevices.insert(device)
            if let id = p.ids[device] { p.sentIDs.append(id) }
        }
    }
}

/// The devices whose last success one instance wrote lately, and when:
/// two generations of at most ``capacity`` devices each (when the current
/// one is full it becomes the previous, and the previous is dropped), so
/// that it holds at most twice that many whatever the traffic. A device
/// dropped from it is only written again sooner than needed.
final class RecentSuccesses: Sendable {
    private struct Generations {
        var current: [String: Int64] = [:]
        var previous: [String: Int64] = [:]
    }

    private let generations = Locked(Generations())
    let capacity: Int

    init(capacity: Int = 65_536) { self.capacity = max(1, capacity) }

    /// How many devices it holds (at most twice ``capacity``).
    var count: Int { generations.withLock { $0.current.count + $0.previous.count } }

    /// `devices` (each once) whose last success was not written within `within` ms of `now`.
    func due<S: Sequence<String>>(_ devices: S, now: Int64, within: Int64) -> [String] {
        generations.withLock { g in
            var seen = Set<String>()
            var out: [String] = []
            for device in devices where seen.insert(device).inserted {
                let at = g.current[device] ?? g.previous[device]
                if at.map({ now - $0 >= within }) ?? true { out.append(device) }
            }
            return out
        }
    }

    /// Notes that the last success of `devices` was written at `now`.
    func wrote(_ devices: [String], at now: Int64) {
        guard !devices.isEmpty else { return }
        generations.withLock { g in
            for device in devices {
                if g.current.count >= capacity && g.current[device] == nil {
                    g.previous = g.current
                    g.current = [:]
                    g.current.reserveCapacity(capacity)
                }
                g.current[device] = now
            }
        }
    }
}
