import Foundation
import HeraldCore
import HeraldCrypto

/// The durable delivery queue, on the store thread, inside its transactions.
final class Queue {
    private let db: Database
    private let key: StoreKey
    /// This instance's name, recorded on every delivery it claims (`sent_by`).
    private let instance: String
    /// Never below the true number of waiting deliveries (queued, retrying,
    /// in flight): counted at open, raised by every enqueue, and counted again
    /// whenever an admission would pass its limit.
    private var pendingBound: Int
    /// `pendingBound` per app, counted and raised with it; read only when
    /// the apps contend for `max_queued` (``QueueAdmission``).
    private var pendingByApp: [String: Int] = [:]

    static let idempotencyWindowMs: Int64 = 24 * 3600 * 1000
    static let maxDevicesPerMessage = 10_000

    init(db: Database, key: StoreKey, instance: String) throws(StoreError) {
        self.db = db
        self.key = key
        self.instance = instance
        pendingBound = 0
        pendingByApp = try depthByApp().mapValues { $0.waiting + $0.inFlight }
        pendingBound = pendingByApp.values.reduce(0, +)
    }

    private func countPending() throws(StoreError) -> Int {
        let d = try depth()
        return d.waiting + d.inFlight
    }

    /// Refuses the message when ``QueueAdmission`` does: judged on the
    /// bounds first, and counted again (one query) only when they refuse.
    private func admit(_ e: Enqueue, adding: Int) throws {
        let limit = e.pendingLimit, apps = e.pendingApps
        guard QueueAdmission.contended(adding: adding, total: pendingBound, limit: limit, apps: apps),
            QueueAdmission.refusal(
                app: e.app, adding: adding, total: pendingBound, byApp: pendingByApp, limit: limit, apps: apps)
                != nil
        else { return }
        if apps > 1 {
            pendingByApp = try depthByApp().mapValues { $0.waiting + $0.inFlight }
            pendingBound = pendingByApp.values.reduce(0, +)
        } else {
            pendingBound = try countPending()
        }
        if let refusal = QueueAdmission.refusal(
            app: e.app, adding: adding, total: pendingBound, byApp: pendingByApp, limit: limit, apps: apps)
        {
            throw refusal
        }
    }

    /// Commits the message and one delivery per recipient device; with a key
    /// seen in the last 24 h, returns the first message instead.
    func enqueue(_ e: Enqueue, now: Int64) throws -> Enqueued {
        try enqueue(e, now: now, handoff: [:]).accepted
    }

    /// Commits the message as ``enqueue(_:now:)`` does, and hands up to
    /// `handoff[lane]` of its deliveries of each lane, `handoffLimit` in all,
    /// straight to the caller: they are written in flight (one attempt counted), exactly as
    /// a claim would leave them, and returned ready to send, so that a
    /// message reaching an idle scheduler skips the claim (a second pass over
    /// its rows and every due index). A crash before their results are
    /// recorded queues them again at the next open, like any claimed delivery.
    ///
    /// With `early`, the handed deliveries go to `early` as soon as the
    /// message's devices are resolved and their tokens opened, before any row
    /// is written (their ids are taken ahead: the writer holds the database),
    /// and the returned claim holds none of them: the first
    /// ``firstEarlyChunk`` with the batch sizes, then the rest in one more
    /// call. The caller may send them at
    /// once, but must not record their results before the transaction
    /// commits: if it does not, the ids name nothing (or, later, other rows).
    func enqueue(
        _ e: Enqueue, now: Int64, handoff: [QueueLane: Int], handoffLimit: Int = .max,
        early: ((Claim) -> Void)? = nil
    ) throws -> (accepted: Enqueued, claim: Claim) {
        var idempotency: StoreValue = .null
        if let k = e.idempotencyKey {
            let hash = SHA256.hash(Array(("idem:" + k).utf8))
            idempotency = .blob(hash)
            let found = try db.statement(
                "SELECT message_id, created_at FROM messages WHERE app = ? AND idempotency_hash = ?")
            try found.bind(.text(e.app), .blob(hash))
            if try found.step() {
                let id = found.text(0)
                if now - found.int64(1) < Self.idempotencyWindowMs {
                    let counts = try stateCounts(id)
                    let skipped = counts[.skipped] ?? 0
                    return (
                        Enqueued(
                            messageID: id, devices: counts.values.reduce(0, +) - skipped, skipped: skipped,
                            duplicate: true),
                        Claim(jobs: [], finished: [], batchSizes: [:], nextDueAt: nil)
                    )
                }
                try db.statement("UPDATE messages SET idempotency_hash = NULL WHERE message_id = ?").bind(.text(id))
                    .run()
            }
        }
        let targets = try resolve(e.recipients, app: e.app)
        guard targets.count <= Self.maxDevicesPerMessage else {
            throw EnqueueError.tooManyDevices(count: targets.count, limit: Self.maxDevicesPerMessage)
        }
        try admit(e, adding: targets.count)
        let messageID = try SecureRandom.bytes(16).hexString
        let expires = now + Int64(e.message.ttlSeconds) * 1000
        var message = e.message
        if message.collapseKey?.isEmpty ?? true {
            message.collapseID = Self.collapseID(app: e.app, idempotencyKey: e.idempotencyKey, messageID: messageID)
        }

        // First what becomes of each device (and so the batch sizes), then
        // the handed deliveries ready to send, then the rows. The ids follow
        // the largest one: this transaction is the only writer.
        let firstID = try nextDeliveryID()
        var planned: [PlannedDelivery] = []
        planned.reserveCapacity(targets.count)
        var sizes: [BatchKey: Int] = [:]
        var devices = 0
        var skipped = 0
        for (i, target) in targets.enumerated() {
            var state = DeliveryState.queued
            var reason: String?
            if !target.enabled {
                state = .skipped
                reason = DeliveryReason.deviceDisabled
            } else if !e.message.kind.reaches(target.platform, webPushForm: target.keysSealed != nil) {
                state = .skipped
                reason = "kind_not_for_platform"
            } else if let why = e.disabled[target.keysSealed != nil ? .web : target.platform] {
                state = .skipped
                reason = "transport_disabled: \(why)"
            }
            if state == .skipped {
                skipped += 1
            } else {
                devices += 1
                sizes[BatchKey(messageID: messageID, platform: target.platform), default: 0] += 1
            }
            planned.append(PlannedDelivery(id: firstID + Int64(i), target: target, state: state, reason: reason))
        }
        var room = handoff
        var roomLeft = handoffLimit
        var jobs: [DeliveryJob] = []
        // With `early`, the first few go as soon as they are ready (so the
        // first push does not wait for the whole message's tokens), the
        // rest in one more claim; the batch sizes travel with the first.
        var earlyChunk = early == nil ? Int.max : Self.firstEarlyChunk
        var sentEarly = false
        for (i, p) in planned.enumerated() where p.state == .queued && roomLeft > 0 {
            let lane = QueueLane(app: e.app, platform: p.target.platform)
            guard (room[lane] ?? 0) > 0 else { continue }
            // A handed delivery's row is opened before it is written in
            // flight: one that does not open stays queued, and the claim
            // that takes it fails it alone (`unreadable_row`).
            guard
                let secrets = unseal(
                    token: p.target.tokenSealed, keys: p.target.keysSealed, deviceID: p.target.deviceID)
            else { continue }
            planned[i].state = .inFlight
            room[lane]! -= 1
            roomLeft -= 1
            let t = p.target
            jobs.append(
                DeliveryJob(
                    deliveryID: p.id, messageID: messageID, app: e.app, deviceID: t.deviceID, user: t.user,
                    platform: t.platform, environment: t.environment, token: secrets.token, keys: secrets.keys,
                    tokenHash: t.tokenHash, registeredAt: t.registeredAt, message: message, acceptedAt: now,
                    expiresAt: expires, previousAttempts: 0, bundleID: t.bundleID, serverKey: t.serverKey))
            if let early, jobs.count >= earlyChunk {
                early(Claim(jobs: jobs, finished: [], batchSizes: sentEarly ? [:] : sizes, nextDueAt: nil))
                sentEarly = true
                jobs.removeAll(keepingCapacity: true)
                earlyChunk = .max
            }
        }
        // Batch sizes only when something was handed: otherwise the claim
        // that takes these deliveries counts them, as for any message.
        var claim = Claim(
            jobs: jobs, finished: [], batchSizes: jobs.isEmpty || sentEarly ? [:] : sizes, nextDueAt: nil)
        if let early, !jobs.isEmpty {
            early(claim)
            sentEarly = true
        }
        if sentEarly { claim = Claim(jobs: [], finished: [], batchSizes: [:], nextDueAt: nil) }

        try db.statement(
            "INSERT INTO messages (message_id, app, idempotency_hash, payload, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?)"
        ).bind(
            .text(messageID), .text(e.app), idempotency,
            .text(try MessageCodec.encode(message, messageID: messageID, key: key)), .int(now),
            .int(expires)
        ).run()
        for p in planned {
            if p.state != .skipped, let collapse = e.message.collapseKey {
                // A newer message with the same collapse key replaces one not yet sent.
                try db.statement(
                    """
                    UPDATE deliveries SET state = 'superseded', reason = ?, updated_at = ?
                    WHERE device_id = ? AND collapse_key = ? AND state IN ('queued', 'retrying')
                    """
                ).bind(.text("superseded by \(messageID)"), .int(now), .text(p.target.deviceID), .text(collapse)).run()
            }
            let handed = p.state == .inFlight
            // Not RETURNING: that makes SQLite keep a statement journal for
            // every insert.
            try db.statement(
                """
                INSERT INTO deliveries (delivery_id, message_id, device_id, user, platform, token_hash, collapse_key,
                    state, attempts, next_attempt_at, reason, updated_at, sent_by)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                """
            ).bind(
                .int(p.id), .text(messageID), .text(p.target.deviceID), .text(p.target.user),
                .text(p.target.platform.rawValue), .text(p.target.tokenHash), .optional(e.message.collapseKey),
                .text(p.state.rawValue), .int(handed ? 1 : 0), .int(now), .optional(p.reason), .int(now),
                handed ? .text(instance) : .null
            ).run()
        }
        pendingBound += devices
        pendingByApp[e.app, default: 0] += devices
        return (Enqueued(messageID: messageID, devices: devices, skipped: skipped, duplicate: false), claim)
    }

    /// One delivery of a message being enqueued, decided before its row is written.
    private struct PlannedDelivery {
        let id: Int64
        let target: Target
        var state: DeliveryState
        let reason: String?
    }

    /// How many handed deliveries go to `early` first, before the rest of
    /// the message's tokens are opened.
    static let firstEarlyChunk = 32

    /// The id the next delivery row takes (one above the largest).
    private func nextDeliveryID() throws(StoreError) -> Int64 {
        let stmt = try db.statement("SELECT coalesce(max(delivery_id), 0) + 1 FROM deliveries")
        guard try stmt.step() else { return 1 }
        return stmt.int64(0)
    }

    /// A message's own collapse id (for one without a collapse key): 32
    /// base64url characters of SHA-256 over the app and its idempotency key,
    /// else its message id. The same key gives the same id, so a resend of
    /// the same notification (Herald's after an ambiguous failure, or the
    /// caller's with its idempotency key) replaces the first on the device.
    static func collapseID(app: String, idempotencyKey: String?, messageID: String) -> String {
        let source =
            if let k = idempotencyKey { "herald-collapse:idem:\(app.utf8.count):\(app):\(k)" } else {
                "herald-collapse:msg:\(messageID)"
            }
        return Base64URL.encode(SHA256.hash(Array(source.utf8)).prefix(24))
    }

    private struct Target {
        let deviceID: String
        let user: String
        let platform: Platform
        let tokenHash: String
        let environment: APNsEnvironment?
        let tokenSealed: [UInt8]
        let keysSealed: [UInt8]?
        let registeredAt: Int64
        let bundleID: String?
        let serverKey: String?
        /// False for a device turned off by `device.update`: its delivery is skipped.
        let enabled: Bool
    }

    /// The app's devices of the named users, or the named devices of the app
    /// (unknown ones are left out), each once.
    private func resolve(_ recipients: Recipients, app: String) throws(StoreError) -> [Target] {
        var out: [Target] = []
        var seen = Set<String>()
        func collect(_ stmt: Statement) throws(StoreError) {
            while try stmt.step() {
                let id = stmt.text(0)
                guard seen.insert(id).inserted, let platform = Platform(rawValue: stmt.text(2)) else { continue }
                out.append(
                    Target(
                        deviceID: id, user: stmt.text(1), platform: platform, tokenHash: stmt.text(3),
                        environment: stmt.optionalText(4).flatMap(APNsEnvironment.init(rawValue:)),
                        tokenSealed: stmt.blob(5), keysSealed: stmt.isNull(6) ? nil : stmt.blob(6),
                        registeredAt: stmt.int64(7), bundleID: stmt.optionalText(8), serverKey: stmt.optionalText(9),
                        enabled: stmt.int64(10) != 0))
            }
        }
        switch recipients {
        case .users(let users):
            // One statement for every user (the index on (app, user,
            // registered_seq) serves each name of the list). json_each
            // cuts a string at a NUL, so a name holding one is looked up by
            // itself, bound with its length.
            let (plain, withNUL) = (users.filter { !$0.utf8.contains(0) }, users.filter { $0.utf8.contains(0) })
            let stmt = try db.statement(
                """
                SELECT device_id, user, platform, token_hash, environment, token_sealed, keys_sealed, registered_at,
                    bundle_id, server_key, enabled
                FROM devices WHERE app = ? AND user IN (SELECT value FROM json_each(?)) ORDER BY user, registered_seq
                """)
            try stmt.bind(.text(app), .text(Self.jsonTextList(plain)))
            try collect(stmt)
            for user in withNUL {
                let one = try db.statement(
                    """
                    SELECT device_id, user, platform, token_hash, environment, token_sealed, keys_sealed, registered_at,
                        bundle_id, server_key, enabled
                    FROM devices WHERE app = ? AND user = ? ORDER BY registered_seq
                    """)
                try one.bind(.text(app), .text(user))
                try collect(one)
            }
        case .devices(let ids):
            for id in ids {
                let stmt = try db.statement(
                    """
                    SELECT device_id, user, platform, token_hash, environment, token_sealed, keys_sealed, registered_at,
                        bundle_id, server_key, enabled FROM devices WHERE app = ? AND device_id = ?
                    """)
                try stmt.bind(.text(app), .text(id))
                try collect(stmt)
            }
        }
        return out
    }

    private func stateCounts(_ messageID: String) throws(StoreError) -> [DeliveryState: Int] {
        let stmt = try db.statement("SELECT state, count(*) FROM deliveries WHERE message_id = ? GROUP BY state")
        try stmt.bind(.text(messageID))
        var counts: [DeliveryState: Int] = [:]
        while try stmt.step() {
            if let s = DeliveryState(rawValue: stmt.text(0)) { counts[s] = Int(stmt.int64(1)) }
        }
        return counts
    }

    /// nil when the message is unknown to this app.
    func status(app: String, messageID: String, detail: Bool) throws(StoreError) -> MessageStatus? {
        let m = try db.statement("SELECT created_at FROM messages WHERE app = ? AND message_id = ?")
        try m.bind(.text(app), .text(messageID))
        guard try m.step() else { return nil }
        let createdAt = m.int64(0)
        var devices: [MessageStatus.Device]?
        if detail {
            let stmt = try db.statement(
                """
                SELECT device_id, platform, state, attempts, http_status, reason, updated_at, sent_by, shrunk
                FROM deliveries WHERE message_id = ? ORDER BY delivery_id
                """)
            try stmt.bind(.text(messageID))
            var list: [MessageStatus.Device] = []
            while try stmt.step() {
                list.append(
                    MessageStatus.Device(
                        deviceID: stmt.text(0), platform: Platform(rawValue: stmt.text(1)) ?? .apns,
                        state: DeliveryState(rawValue: stmt.text(2)) ?? .failed, attempts: Int(stmt.int64(3)),
                        httpStatus: stmt.optionalInt64(4).map { Int($0) }, reason: stmt.optionalText(5),
                        updatedAt: stmt.int64(6), sentBy: stmt.optionalText(7),
                        shrunk: stmt.optionalInt64(8).map { Int($0) }))
            }
            devices = list
        }
        return MessageStatus(
            messageID: messageID, createdAt: createdAt, counts: try stateCounts(messageID), devices: devices)
    }

    /// Drops the message's deliveries not yet sent; returns how many.
    func cancel(app: String, messageID: String, now: Int64) throws(StoreError) -> Int? {
        let m = try db.statement("SELECT 1 FROM messages WHERE app = ? AND message_id = ?")
        try m.bind(.text(app), .text(messageID))
        guard try m.step() else { return nil }
        try db.statement(
            """
            UPDATE deliveries SET state = 'skipped', reason = 'cancelled', updated_at = ?
            WHERE message_id = ? AND state IN ('queued', 'retrying')
            """
        ).bind(.int(now), .text(messageID)).run()
        return db.changes
    }

    /// Deliveries of `lanes` waiting for a credential (reason
    /// `credential_rejected`) become due at `now`: a reload brought new
    /// credentials. Returns how many.
    func releaseCredentialWaits(lanes: [QueueLane], now: Int64) throws(StoreError) -> Int {
        var released = 0
        for lane in lanes {
            try db.statement(
                """
                UPDATE deliveries SET next_attempt_at = ?, updated_at = ?
                WHERE state = 'retrying' AND reason = ? AND platform = ? AND next_attempt_at > ?
                    AND message_id IN (SELECT message_id FROM messages WHERE app = ?)
                """
            ).bind(
                .int(now), .int(now), .text(DeliveryReason.credentialRejected), .text(lane.platform.rawValue),
                .int(now), .text(lane.app)
            ).run()
            released += db.changes
        }
        return released
    }

    /// Deliveries interrupted by a stop or crash go back to the queue.
    func recoverInFlight(now: Int64) throws(StoreError) -> Int {
        try db.statement(
            "UPDATE deliveries SET state = 'retrying', next_attempt_at = ?, updated_at = ? WHERE state = 'in_flight'"
        ).bind(.int(now), .int(now)).run()
        return db.changes
    }

    /// Takes due deliveries, oldest due first: up to `lanes[lane]` of each
    /// named lane, and up to `others` of any lane not named (deliveries no
    /// transport is configured for any more, say). Marks them in flight and
    /// returns them with their unsealed tokens. Ones past their send deadline
    /// (`expires_at` + 2 s, attempted or not) become expired; ones whose
    /// device is gone become skipped.
    func claimDue(lanes: [QueueLane: Int], others: Int, now: Int64) throws -> Claim {
        let select = """
            SELECT d.delivery_id, d.message_id, m.app, d.device_id, d.user, d.platform, d.attempts, m.expires_at,
                m.payload, v.environment, v.token_sealed, v.keys_sealed, v.token_hash, v.registered_at, m.created_at,
                v.bundle_id, v.server_key, v.enabled
            FROM deliveries d JOIN messages m ON m.message_id = d.message_id
            LEFT JOIN devices v ON v.device_id = d.device_id
            WHERE d.state IN ('queued', 'retrying') AND d.next_attempt_at <= ?
            """
        var queries: [(sql: String, binds: [StoreValue])] = []
        let named = lanes.keys.sorted { ($0.app, $0.platform.rawValue) < ($1.app, $1.platform.rawValue) }
        for lane in named where lanes[lane]! > 0 {
            queries.append(
                (
                    select + " AND d.platform = ? AND m.app = ? ORDER BY d.next_attempt_at LIMIT ?",
                    [.int(now), .text(lane.platform.rawValue), .text(lane.app), .int(Int64(lanes[lane]!))]
                ))
        }
        if others > 0 {
            var sql = select
            var binds: [StoreValue] = [.int(now)]
            if !named.isEmpty {
                sql +=
                    " AND (m.app || char(31) || d.platform) NOT IN (\(named.map { _ in "?" }.joined(separator: ", ")))"
                binds += named.map { .text($0.app + "\u{1F}" + $0.platform.rawValue) }
            }
            queries.append((sql + " ORDER BY d.next_attempt_at LIMIT ?", binds + [.int(Int64(others))]))
        }

        var jobs: [DeliveryJob] = []
        var expired: [(Int64, BatchKey)] = []
        var gone: [(Int64, BatchKey)] = []
        var disabled: [(Int64, BatchKey)] = []
        var unreadable: [(Int64, BatchKey)] = []
        var unreadableDevices: [(deliveryID: Int64, deviceID: String)] = []
        var messages: [String: PushMessage?] = [:]
        for (sql, binds) in queries {
            let stmt = try db.statement(sql)
            try stmt.bind(binds)
            while try stmt.step() {
                let id = stmt.int64(0)
                let messageID = stmt.text(1)
                let platform = Platform(rawValue: stmt.text(5)) ?? .apns
                let batch = BatchKey(messageID: messageID, platform: platform)
                let expiresAt = stmt.int64(7)
                // Never sent past `accepted_at + ttl + 2 s`, attempted before or
                // not (a backlog, a restart after downtime).
                if now > DeliveryJob.sendDeadline(expiresAt: expiresAt) {
                    expired.append((id, batch))
                    continue
                }
                if stmt.isNull(10) {
                    gone.append((id, batch))
                    continue
                }
                if stmt.int64(17) == 0 {
                    // Turned off by device.update since the message was accepted.
                    disabled.append((id, batch))
                    continue
                }
                if messages[messageID] == nil {
                    var decoded = MessageCodec.decode(stmt.text(8), messageID: messageID, key: key)
                    if var m = decoded, m.collapseKey?.isEmpty ?? true, m.collapseID == nil {
                        // Stored before messages carried their own collapse id.
                        m.collapseID = Self.collapseID(app: stmt.text(2), idempotencyKey: nil, messageID: messageID)
                        decoded = m
                    }
                    messages[messageID] = decoded
                }
                guard let message = messages[messageID] ?? nil else {
                    // A payload this version cannot read: fail it rather than retry forever.
                    try mark(id, .failed, reason: "unreadable stored message", now: now)
                    continue
                }
                let deviceID = stmt.text(3)
                guard
                    let secrets = unseal(
                        token: stmt.blob(10), keys: stmt.isNull(11) ? nil : stmt.blob(11), deviceID: deviceID)
                else {
                    // A row that does not open (damaged, or sealed under
                    // another key) fails this delivery alone.
                    unreadable.append((id, batch))
                    unreadableDevices.append((id, deviceID))
                    continue
                }
                jobs.append(
                    DeliveryJob(
                        deliveryID: id, messageID: messageID, app: stmt.text(2), deviceID: deviceID,
                        user: stmt.text(4), platform: platform,
                        environment: stmt.optionalText(9).flatMap(APNsEnvironment.init(rawValue:)),
                        token: secrets.token, keys: secrets.keys, tokenHash: stmt.text(12),
                        registeredAt: stmt.int64(13), message: message, acceptedAt: stmt.int64(14),
                        expiresAt: expiresAt,
                        previousAttempts: Int(stmt.int64(6)), bundleID: stmt.optionalText(15),
                        serverKey: stmt.optionalText(16)))
            }
        }
        // Batch sizes before anything changes state, so that every delivery
        // counted here is later reported once.
        var sizes: [BatchKey: Int] = [:]
        var touched = Set<String>()
        for messageID in jobs.map(\.messageID) + (expired + gone + disabled + unreadable).map(\.1.messageID)
        where touched.insert(messageID).inserted {
            let count = try db.statement(
                """
                SELECT platform, count(*) FROM deliveries
                WHERE message_id = ? AND state IN ('queued', 'retrying', 'in_flight') GROUP BY platform
                """)
            try count.bind(.text(messageID))
            while try count.step() {
                if let p = Platform(rawValue: count.text(0)) {
                    sizes[BatchKey(messageID: messageID, platform: p)] = Int(count.int64(1))
                }
            }
        }
        for (id, _) in expired { try mark(id, .expired, reason: "ttl elapsed", now: now) }
        for (id, _) in gone { try mark(id, .skipped, reason: "device removed", now: now) }
        for (id, _) in disabled { try mark(id, .skipped, reason: DeliveryReason.deviceDisabled, now: now) }
        for (id, _) in unreadable { try markUnreadable(id, now: now) }
        if !jobs.isEmpty {
            try db.statement(
                """
                UPDATE deliveries SET state = 'in_flight', attempts = attempts + 1, updated_at = ?, sent_by = ?
                WHERE delivery_id IN (SELECT value FROM json_each(?))
                """
            ).bind(.int(now), .text(instance), .text(Self.jsonList(jobs.map(\.deliveryID)))).run()
        }
        let next = try db.statement("SELECT min(next_attempt_at) FROM deliveries WHERE state IN ('queued', 'retrying')")
        let nextDueAt = try next.step() ? next.optionalInt64(0) : nil
        return Claim(
            jobs: jobs, finished: (expired + gone + disabled + unreadable).map(\.1), batchSizes: sizes,
            nextDueAt: nextDueAt, unreadable: unreadableDevices)
    }

    /// Records an attempt's result: a final state, or `retrying` at
    /// `nextAttemptAt`. Only a delivery in flight changes (a cancelled or
    /// forgotten one stays as it is).
    func record(
        deliveryID: Int64, deviceID: String? = nil, state: DeliveryState, httpStatus: Int?, reason: RecordedReason?,
        nextAttemptAt: Int64?, now: Int64
    ) throws(StoreError) {
        try db.statement(
            """
            UPDATE deliveries SET state = ?, http_status = ?, reason = ?,
                next_attempt_at = COALESCE(?, next_attempt_at), updated_at = ?
            WHERE delivery_id = ? AND state = 'in_flight'
            """
        ).bind(
            .text(state.rawValue), .optional(httpStatus.map(Int64.init)), .optional(reason?.text),
            .optional(nextAttemptAt), .int(now), .int(deliveryID)
        ).run()
        guard db.changes > 0 else { return }
        let column: String? =
            switch state {
            case .delivered: "last_success_at = ?"
            case .failed: "last_failure_at = ?, last_failure_reason = ?"
            default: nil
            }
        guard let column else { return }
        let device: StoreValue
        if let deviceID {
            device = .text(deviceID)
        } else {
            let find = try db.statement("SELECT device_id FROM deliveries WHERE delivery_id = ?")
            try find.bind(.int(deliveryID))
            guard try find.step() else { return }
            device = .text(find.text(0))
        }
        if state == .failed {
            try db.statement("UPDATE devices SET \(column) WHERE device_id = ?")
                .bind(.int(now), .optional(reason?.text), device).run()
        } else {
            try db.statement(
                "UPDATE devices SET \(column) WHERE device_id = ? AND (last_success_at IS NULL OR last_success_at <= ?)"
            ).bind(.int(now), device, .int(now - Self.successResolutionMs)).run()
        }
    }

    /// Records many attempts' results in one go: one statement per distinct
    /// result (state, status, reason, retry time), so a fan-out's 500
    /// deliveries cost a handful of statements rather than a thousand.
    func record(_ records: [DeliveryRecord], now: Int64) throws(StoreError) {
        for (result, ids) in RecordedResult.grouping(records) {
            let update = try db.statement(
                """
                UPDATE deliveries SET state = ?, http_status = ?, reason = ?,
                    next_attempt_at = COALESCE(?, next_attempt_at), updated_at = ?, attempts = max(0, attempts - ?),
                    shrunk = CASE WHEN ? = 1 THEN ? ELSE shrunk END
                WHERE delivery_id IN (SELECT value FROM json_each(?)) AND state = 'in_flight'
                RETURNING device_id
                """)
            try update.bind(
                .text(result.state.rawValue), .optional(result.httpStatus.map(Int64.init)),
                .optional(result.reason?.text),
                .optional(result.nextAttemptAt), .int(now), .int(result.counted ? 0 : 1),
                .int(result.shrink == nil ? 0 : 1), .optional(result.shrink?.index.map(Int64.init)),
                .text(Self.jsonList(ids)))
            var devices: [String] = []
            while try update.step() { devices.append(update.text(0)) }
            guard !devices.isEmpty else { continue }
            let ids = Self.jsonList(devices)
            switch result.state {
            case .delivered:
                // Like relatime: a device row is rewritten for a success only
                // when its last one is older than `successResolution`; a
                // fan-out to the same devices every second would otherwise
                // rewrite every device row (sealed token and all) each time.
                try db.statement(
                    """
                    UPDATE devices SET last_success_at = ?
                    WHERE device_id IN (SELECT value FROM json_each(?))
                        AND (last_success_at IS NULL OR last_success_at <= ?)
                    """
                ).bind(.int(now), .text(ids), .int(now - Self.successResolutionMs)).run()
            case .failed:
                try db.statement(
                    """
                    UPDATE devices SET last_failure_at = ?, last_failure_reason = ?
                    WHERE device_id IN (SELECT value FROM json_each(?))
                    """
                ).bind(.int(now), .optional(result.reason?.text), .text(ids)).run()
            default:
                break
            }
        }
    }

    /// How stale `last_success_at` may be: a success within this much of the
    /// stored one does not rewrite the device row (failures are always written).
    static let successResolutionMs: Int64 = 60_000

    /// A JSON array of ids, for `json_each`.
    static func jsonList(_ ids: [Int64]) -> String {
        "[" + ids.map(String.init).joined(separator: ",") + "]"
    }

    /// A JSON array of arbitrary strings without NUL, for `json_each`: every
    /// control character escaped, so each names exactly what was stored.
    static func jsonTextList(_ values: [String]) -> String {
        var out = "["
        out.reserveCapacity(values.reduce(2) { $0 + $1.utf8.count + 3 })
        for (i, value) in values.enumerated() {
            if i > 0 { out.append(",") }
            out.append("\"")
            for scalar in value.unicodeScalars {
                switch scalar {
                case "\"": out.append("\\\"")
                case "\\": out.append("\\\\")
                case _ where scalar.value < 0x20:
                    let hex = String(scalar.value, radix: 16)
                    out.append("\\u" + String(repeating: "0", count: 4 - hex.count) + hex)
                default: out.unicodeScalars.append(scalar)
                }
            }
            out.append("\"")
        }
        out.append("]")
        return out
    }

    static func jsonList(_ ids: [String]) -> String {
        "[" + ids.map { "\"\($0)\"" }.joined(separator: ",") + "]"
    }

    /// A provider called the device's token stale and the guards allowed the
    /// deletion: delete the device if it still holds `tokenHash` (a device
    /// that registered a new token meanwhile is kept) and record the
    /// delivery. Returns whether the device was deleted.
    func removeStale(
        deliveryID: Int64, deviceID: String, tokenHash: String, httpStatus: Int?, reason: ProviderReason, now: Int64
    ) throws(StoreError) -> Bool {
        try db.statement("DELETE FROM devices WHERE device_id = ? AND token_hash = ?")
            .bind(.text(deviceID), .text(tokenHash)).run()
        let removed = db.changes > 0
        try record(
            deliveryID: deliveryID, deviceID: deviceID, state: removed ? .removedStale : .failed,
            httpStatus: httpStatus,
            reason: RecordedReason(reason, removed ? nil : .deviceKept), nextAttemptAt: nil,
            now: now)
        return removed
    }

    /// Deletes messages older than `before` whose deliveries are all final.
    func purge(before: Int64) throws(StoreError) -> Int {
        try db.statement(
            """
            DELETE FROM messages WHERE created_at < ? AND NOT EXISTS (
                SELECT 1 FROM deliveries d WHERE d.message_id = messages.message_id
                AND d.state IN ('queued', 'retrying', 'in_flight'))
            """
        ).bind(.int(before)).run()
        return db.changes
    }

    private func mark(_ id: Int64, _ state: DeliveryState, reason: String, now: Int64) throws(StoreError) {
        try db.statement("UPDATE deliveries SET state = ?, reason = ?, updated_at = ? WHERE delivery_id = ?")
            .bind(.text(state.rawValue), .text(reason), .int(now), .int(id)).run()
    }

    /// The reason a delivery ends `failed` when its device row does not open.
    static let unreadableRowReason = "unreadable_row"

    /// A device row's token and Web Push keys, opened with the store key;
    /// nil when either does not open (a damaged row, or one sealed under
    /// another key).
    private func unseal(token: [UInt8], keys: [UInt8]?, deviceID: String) -> (token: String, keys: WebPushKeys?)? {
        guard let raw = try? key.open(token, context: Identity.tokenContext(deviceID)) else { return nil }
        guard let keys else { return (String(decoding: raw, as: UTF8.self), nil) }
        guard let pair = try? key.open(keys, context: Identity.keysContext(deviceID)) else { return nil }
        return (
            String(decoding: raw, as: UTF8.self),
            WebPushKeys(p256dh: Array(pair.prefix(65)), auth: Array(pair.dropFirst(65)))
        )
    }

    /// Fails a delivery whose device row does not open, and says so on the
    /// device (`device.list` shows `last_failure_reason`).
    private func markUnreadable(_ id: Int64, now: Int64) throws(StoreError) {
        try mark(id, .failed, reason: Self.unreadableRowReason, now: now)
        try db.statement(
            """
            UPDATE devices SET last_failure_at = ?, last_failure_reason = ?
            WHERE device_id = (SELECT device_id FROM deliveries WHERE delivery_id = ?)
            """
        ).bind(.int(now), .text(Self.unreadableRowReason), .int(id)).run()
    }

    /// Deliveries waiting (queued or retrying) and in flight.
    func depth() throws(StoreError) -> QueueDepth {
        let stmt = try db.statement(
            """
            SELECT coalesce(sum(state IN ('queued', 'retrying')), 0), coalesce(sum(state = 'in_flight'), 0)
            FROM deliveries WHERE state IN ('queued', 'retrying', 'in_flight')
            """)
        guard try stmt.step() else { return QueueDepth(waiting: 0, inFlight: 0) }
        return QueueDepth(waiting: Int(stmt.int64(0)), inFlight: Int(stmt.int64(1)))
    }

    /// `depth()` per app (apps with nothing waiting or in flight are absent).
    func depthByApp() throws(StoreError) -> [String: QueueDepth] {
        let stmt = try db.statement(
            """
            SELECT m.app, coalesce(sum(d.state IN ('queued', 'retrying')), 0), coalesce(sum(d.state = 'in_flight'), 0)
            FROM deliveries d JOIN messages m ON m.message_id = d.message_id
            WHERE d.state IN ('queued', 'retrying', 'in_flight') GROUP BY m.app
            """)
        var out: [String: QueueDepth] = [:]
        while try stmt.step() {
            out[stmt.text(0)] = QueueDepth(waiting: Int(stmt.int64(1)), inFlight: Int(stmt.int64(2)))
        }
        return out
    }
}
