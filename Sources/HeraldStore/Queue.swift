import Foundation
import HeraldCore
import HeraldCrypto

/// The durable delivery queue, on the store thread, inside its transactions.
final class Queue: ClaimStatements, StaleStatements, IdempotencyStatements {
    let db: Database
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

    /// The idempotency keys (app, hash) of messages being written in parts,
    /// and their ids: a second message with the key waits for the first.
    private var assemblingKeys: [String: String] = [:]
    /// Delivery ids are taken from here up when the largest row is below
    /// (a message written in parts took its ids at its first part).
    private var reservedNext: Int64 = 0
    /// The batch sizes of messages being written in parts, as their first
    /// part counted them: a claim that takes some of their rows meanwhile
    /// reports these, not the rows written so far.
    private var assemblingSizes: [String: [BatchKey: Int]] = [:]

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

    /// The first part of an enqueue: the idempotency check (a key seen in
    /// the last 24 h answers its first message), the admission, the message
    /// row, and, for a message of at most ``partThreshold`` devices, every
    /// delivery. A larger message is written in parts (``resume(_:now:)``),
    /// each a transaction of its own, so that the writer takes other
    /// callers' acceptances between them instead of after 10,000 rows; until
    /// its last part the message is listed as being assembled (what is left
    /// to write), and a store opened after a crash in between writes the
    /// rest (``finishUnfinished()``) before anything is claimed.
    ///
    /// Up to `handoff[lane]` of the first part's deliveries of each lane,
    /// `handoffLimit` in all, go straight to `early`, written in flight (one
    /// attempt counted) exactly as a claim would leave them, so that a
    /// message reaching an idle scheduler skips the claim; the first
    /// ``firstEarlyChunk`` go with the batch sizes as soon as their tokens
    /// are opened, before any row is written (their ids are taken ahead: the
    /// writer holds the database), the rest at the end of the part. The
    /// caller may send them at once but must not record their results before
    /// the part commits: until then the ids name nothing. Without `early`,
    /// the answer's claim holds them. A crash before their results are
    /// recorded queues them again at the next open, like any claimed delivery.
    func begin(
        _ e: Enqueue, now: Int64, handoff: [QueueLane: Int], handoffLimit: Int = .max,
        early: (@Sendable (Claim) -> Void)?, census counted: Census? = nil,
        countElsewhere: Bool = false
    ) throws -> EnqueueStep {
        var idempotency: [UInt8]?
        if let k = e.idempotencyKey {
            let hash = MessageRules.idempotencyHash(k)
            idempotency = hash
            if let first = assemblingKeys[e.app + "\u{1F}" + hash.hexString] {
                let listed = try db.statement("SELECT 1 FROM assembling WHERE message_id = ?")
                try listed.bind(.text(first))
                if try listed.step() {
                    // The same key's first message is still being written:
                    // its outcome decides this one's.
                    return .waitFor(first)
                }
                // Its first part never committed.
                assemblingKeys[e.app + "\u{1F}" + hash.hexString] = nil
                assemblingSizes[first] = nil
            }
            if let accepted = try duplicate(app: e.app, idempotencyHash: hash, now: now) {
                return .whole(accepted: accepted, claim: Claim(jobs: [], finished: [], batchSizes: [:], nextDueAt: nil))
            }
        }
        let messageID = try SecureRandom.bytes(16).hexString
        let message = try MessageRules.budgeted(
            MessageRules.stored(e, messageID: messageID), e, now: now, SQLiteActivityBudget(db: db))
        var a = Assembly(
            enqueue: e, messageID: messageID, message: message, acceptedAt: now,
            expiresAt: MessageRules.expiresAt(e, now: now), idempotency: idempotency,
            recipients: Self.distinct(e.recipients), room: handoff, roomLeft: handoffLimit,
            earlyChunk: early == nil ? Int.max : Self.firstEarlyChunk, early: early)

        var census = counted
        // At most ``maxAssembling`` messages are written in parts at once;
        // past them a large one is written whole, as a small one is.
        if assemblingSizes.count >= Self.maxAssembling { try pruneAssembling() }
        let inParts = assemblingSizes.count < Self.maxAssembling
        let large =
            try inParts && census == nil && Self.mayBeLarge(a.recipients)
            && rowCount(a.recipients, e) > Self.partThreshold
        if large {
            // Large: its devices are counted by platform, on the reader
            // when the caller can (`countElsewhere`), here otherwise.
            if countElsewhere { return .needsCensus }
            census = try count(a.recipients, e)
        }
        guard inParts, let census, census.rows > Self.partThreshold else {
            // Whole: every target now, the batch sizes from them.
            let targets = try resolve(a.recipients, e)
            try MessageRules.checkSize(targets.count)
            let planned = plan(targets, firstID: try nextDeliveryID(), a: a)
            var sizes: [BatchKey: Int] = [:]
            var devices = 0
            for p in planned where p.skip == nil {
                devices += 1
                // A held delivery joins its batch when it is claimed.
                if p.timing.heldUntil == nil {
                    sizes[BatchKey(messageID: messageID, platform: p.target.platform), default: 0] += 1
                }
            }
            try admit(e, adding: devices)
            a.sizes = sizes
            try insertMessage(a, idempotency: idempotency)
            try write(planned, into: &a, last: true)
            pendingBound += devices
            pendingByApp[e.app, default: 0] += devices
            return .whole(accepted: a.accepted, claim: a.claim)
        }
        try MessageRules.checkSize(census.rows)
        let devices = census.sizes.values.reduce(0, +)
        try admit(e, adding: devices)
        a.sizes = Dictionary(
            uniqueKeysWithValues: census.sizes.map { (BatchKey(messageID: messageID, platform: $0.key), $0.value) })
        // The rows' ids are taken now for every device counted, so that this
        // message's deliveries stay older than any message accepted between
        // its parts (a collapse key's newest message wins by id).
        a.nextID = try nextDeliveryID()
        a.idsEnd = a.nextID + Int64(census.rows)
        reservedNext = a.idsEnd
        // The message, its key and its list of what is left to write are
        // committed by this first part, durably: from here on the message
        // is whole or will be (a crash before its last part leaves it listed,
        // and the next open writes the rest before anything is claimed).
        try insertMessage(a, idempotency: idempotency)
        try db.statement(
            "INSERT INTO assembling (message_id, recipients, by_device, disabled, written, next_id, ids_end) VALUES (?, ?, ?, ?, 0, ?, ?)"
        ).bind(
            .text(messageID), .text(try Self.jsonStrings(a.recipients.names)), .int(a.recipients.byDevice ? 1 : 0),
            .text(try Self.jsonDisabled(e.disabled)), .int(a.nextID), .int(a.idsEnd)
        ).run()
        if let idempotency { assemblingKeys[e.app + "\u{1F}" + idempotency.hexString] = messageID }
        assemblingSizes[messageID] = a.sizes
        pendingBound += devices
        pendingByApp[e.app, default: 0] += devices
        do {
            return try resume(a, now: now)
        } catch {
            forget(a)
            throw error
        }
    }

    /// Writes the next part of a message begun in parts: the deliveries of
    /// its next recipients (about ``partRows``); at the last, marks the
    /// message whole and answers.
    func resume(_ assembly: Assembly, now: Int64) throws -> EnqueueStep {
        var a = assembly
        let take = a.next(rows: Self.partRows)
        let targets = try resolve(take, a.enqueue)
        a.counted(rows: targets.count, recipients: take.count)
        // Devices registered after the count are not written: the message
        // goes to the devices its first part counted, ids taken for them.
        let room = Int(a.idsEnd - a.nextID)
        let planned = plan(Array(targets.prefix(room)), firstID: a.nextID, a: a)
        a.nextID += Int64(planned.count)
        let last = a.done
        try write(planned, into: &a, last: last)
        guard last else {
            try db.statement("UPDATE assembling SET written = ?, next_id = ? WHERE message_id = ?")
                .bind(.int(Int64(a.offset)), .int(a.nextID), .text(a.messageID)).run()
            return .partial(a)
        }
        try db.statement("DELETE FROM assembling WHERE message_id = ?").bind(.text(a.messageID)).run()
        forget(a)
        return .whole(accepted: a.accepted, claim: a.claim)
    }

    /// Forgets the messages noted as being written in parts that are not
    /// listed (a first part whose transaction did not commit noted one).
    private func pruneAssembling() throws {
        var listed = Set<String>()
        let rows = try db.statement("SELECT message_id FROM assembling")
        while try rows.step() { listed.insert(rows.text(0)) }
        assemblingSizes = assemblingSizes.filter { listed.contains($0.key) }
        assemblingKeys = assemblingKeys.filter { listed.contains($0.value) }
    }

    /// Forgets what the first part noted in memory about the message: it is
    /// whole, or a part failed (it stays listed and the next open finishes
    /// it; meanwhile a resend with its key finds it).
    func forget(_ a: Assembly) {
        if let hash = a.idempotency { assemblingKeys[a.enqueue.app + "\u{1F}" + hash.hexString] = nil }
        assemblingSizes[a.messageID] = nil
    }

    /// Writes the rest of every message a stop or crash caught between two
    /// of its parts (at open, before anything is claimed), as its parts would
    /// have; answers how many. Its deliveries handed over in flight are then
    /// queued again with the others (``recoverInFlight(now:)``).
    func finishUnfinished() throws -> Int {
        let stmt = try db.statement(
            """
            SELECT a.message_id, a.recipients, a.by_device, a.disabled, a.written, a.next_id, a.ids_end, m.app,
                m.payload, m.created_at, m.expires_at
            FROM assembling a JOIN messages m ON m.message_id = a.message_id
            """)
        var left: [Assembly] = []
        while try stmt.step() {
            let id = stmt.text(0)
            guard let message = MessageCodec.decode(stmt.text(8), messageID: id, key: key) else { continue }
            let names = try Self.strings(fromJSON: stmt.text(1))
            let recipients: Recipients = stmt.int64(2) != 0 ? .devices(names) : .users(names)
            let e = Enqueue(
                app: stmt.text(7), message: message, recipients: recipients, idempotencyKey: nil,
                disabled: try Self.disabled(fromJSON: stmt.text(3)))
            var a = Assembly(
                enqueue: e, messageID: id, message: message, acceptedAt: stmt.int64(9), expiresAt: stmt.int64(10),
                idempotency: nil, recipients: recipients, room: [:], roomLeft: 0, earlyChunk: .max, early: nil)
            a.restore(written: Int(stmt.int64(4)), nextID: stmt.int64(5), idsEnd: stmt.int64(6))
            left.append(a)
        }
        db.resetActive()
        for var a in left {
            while true {
                guard case .partial(let next) = try resume(a, now: a.acceptedAt) else { break }
                a = next
            }
        }
        // A message whose payload this version cannot read is left as it is.
        try db.statement("DELETE FROM assembling").run()
        return left.count
    }

    static func jsonStrings(_ names: [String]) throws -> String {
        String(decoding: try JSONEncoder().encode(names), as: UTF8.self)
    }

    static func strings(fromJSON text: String) throws -> [String] {
        try JSONDecoder().decode([String].self, from: Data(text.utf8))
    }

    static func jsonDisabled(_ disabled: [Platform: String]) throws -> String {
        let byName = Dictionary(uniqueKeysWithValues: disabled.map { ($0.key.rawValue, $0.value) })
        return String(decoding: try JSONEncoder().encode(byName), as: UTF8.self)
    }

    static func disabled(fromJSON text: String) throws -> [Platform: String] {
        let byName = try JSONDecoder().decode([String: String].self, from: Data(text.utf8))
        return Dictionary(uniqueKeysWithValues: byName.compactMap { k, v in Platform(rawValue: k).map { ($0, v) } })
    }

    /// A message of more devices than this is written in parts.
    static let partThreshold = 1024
    /// About how many deliveries one part writes.
    static let partRows = 256
    /// The most messages written in parts at once (what the queue keeps in
    /// memory for each: its key and its batch sizes).
    static let maxAssembling = 32

    private func insertMessage(_ a: Assembly, idempotency: [UInt8]?) throws {
        try db.statement(
            "INSERT INTO messages (message_id, app, idempotency_hash, payload, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?)"
        ).bind(
            .text(a.messageID), .text(a.enqueue.app), idempotency.map { .blob($0) } ?? .null,
            .text(try MessageCodec.encode(a.message, messageID: a.messageID, key: key)), .int(a.acceptedAt),
            .int(a.expiresAt)
        ).run()
    }

    /// What becomes of each target: queued, or skipped and why.
    private func plan(_ targets: [DeviceTarget], firstID: Int64, a: Assembly) -> [PlannedDelivery] {
        let e = a.enqueue
        var planned: [PlannedDelivery] = []
        planned.reserveCapacity(targets.count)
        for (i, target) in targets.enumerated() {
            var skip = MessageRules.skipReason(
                enabled: target.enabled, platform: target.platform, webPushForm: target.keysSealed != nil, e)
            var timing = DeliveryTiming.now
            if skip == nil {
                timing = TimingRules.decide(a.message, target.preferences, now: a.acceptedAt)
                skip = timing.skip
            }
            planned.append(PlannedDelivery(id: firstID + Int64(i), target: target, skip: skip, timing: timing))
        }
        return planned
    }

    /// Hands over what the room allows of `planned` (sent early, or kept for
    /// the answer), then writes the rows.
    private func write(_ planned: [PlannedDelivery], into a: inout Assembly, last: Bool) throws {
        var planned = planned
        let e = a.enqueue
        for p in planned where p.skip != nil { a.skipped += 1 }
        a.devices += planned.count(where: { $0.skip == nil })
        // Only the first part hands deliveries over: they may be sent before
        // its commit, and a crash before it leaves no message (its caller,
        // unanswered, sends it again). A later part's would be sent by a
        // message already committed, and resent after a crash by the rows
        // the next open writes; the engine claims those parts' rows instead.
        let handing = a.parts == 0 ? a.roomLeft : 0
        for (i, p) in planned.enumerated()
        where p.skip == nil && p.timing.heldUntil == nil && a.roomLeft > 0 && handing > 0 {
            let lane = QueueLane(app: e.app, platform: p.target.platform)
            guard (a.room[lane] ?? 0) > 0 else { continue }
            // A handed delivery's row is opened before it is written in
            // flight: one that does not open stays queued, and the claim
            // that takes it fails it alone (`unreadable_row`).
            guard
                let secrets = DeviceSecrets.open(
                    token: p.target.tokenSealed, keys: p.target.keysSealed, deviceID: p.target.deviceID, key: key)
            else { continue }
            planned[i].handed = true
            a.room[lane]! -= 1
            a.roomLeft -= 1
            let t = p.target
            var job = DeliveryJob(
                deliveryID: p.id, messageID: a.messageID, app: e.app, deviceID: t.deviceID, user: t.user,
                platform: t.platform, environment: t.environment, token: secrets.token, keys: secrets.keys,
                tokenHash: t.tokenHash, registeredAt: t.registeredAt, message: a.message,
                acceptedAt: a.acceptedAt, expiresAt: a.expiresAt, previousAttempts: 0, bundleID: t.bundleID,
                serverKey: t.serverKey)
            job.silent = p.timing.silent
            a.jobs.append(job)
            // With `early`, the first few go as soon as they are ready (so
            // the first push does not wait for the whole message's tokens),
            // the rest at the end of the part; the batch sizes travel with
            // the first.
            if let early = a.early, a.jobs.count >= a.earlyChunk {
                a.sendEarly(early)
                a.earlyChunk = .max
            }
        }
        if let early = a.early, !a.jobs.isEmpty { a.sendEarly(early) }
        // Later parts look for a newer message with the same collapse key,
        // accepted between two parts: it wins, as it would have had this
        // message been written whole before it.
        let interleaved = a.parts > 0
        a.parts += 1
        for p in planned {
            var state: DeliveryState = p.handed ? .inFlight : (p.skip == nil ? .queued : .skipped)
            var reason = p.skip
            if p.skip == nil, let collapse = e.message.collapseKey {
                if interleaved, let newer = try newerPending(device: p.target.deviceID, collapse: collapse, than: p.id)
                {
                    state = .superseded
                    reason = "superseded by \(newer)"
                } else {
                    // A newer message with the same collapse key replaces one not yet sent.
                    try db.statement(
                        """
                        UPDATE deliveries SET state = 'superseded', reason = ?, updated_at = ?
                        WHERE device_id = ? AND collapse_key = ? AND state IN ('queued', 'retrying') AND delivery_id < ?
                        """
                    ).bind(
                        .text("superseded by \(a.messageID)"), .int(a.acceptedAt), .text(p.target.deviceID),
                        .text(collapse), .int(p.id)
                    ).run()
                }
            }
            let handed = state == .inFlight
            // Not RETURNING: that makes SQLite keep a statement journal for
            // every insert.
            try db.statement(
                """
                INSERT INTO deliveries (delivery_id, message_id, device_id, user, platform, token_hash, collapse_key,
                    state, attempts, next_attempt_at, reason, updated_at, sent_by, held_until, timing)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                """
            ).bind(
                .int(p.id), .text(a.messageID), .text(p.target.deviceID), .text(p.target.user),
                .text(p.target.platform.rawValue), .text(p.target.tokenHash), .optional(e.message.collapseKey),
                .text(state.rawValue), .int(handed ? 1 : 0),
                .int(p.timing.nextAttemptAt(acceptedAt: a.acceptedAt, expiresAt: a.expiresAt)), .optional(reason),
                .int(a.acceptedAt), handed ? .text(instance) : .null,
                state == .queued ? .optional(p.timing.heldUntil) : .null, .optional(p.timing.stored)
            ).run()
        }
        if last {
            // Every delivery final as written (skipped): the message is
            // complete now, and no later change of a delivery says so.
            try db.statement(EventSQL.sqliteMessageCompleteIfDone).bind(.int(a.acceptedAt), .text(a.messageID))
                .run()
        }
    }

    /// A newer message's delivery to `device` with `collapse`, still to be sent.
    private func newerPending(device: String, collapse: String, than id: Int64) throws(StoreError) -> String? {
        let stmt = try db.statement(
            """
            SELECT message_id FROM deliveries
            WHERE device_id = ? AND collapse_key = ? AND state IN ('queued', 'retrying') AND delivery_id > ? LIMIT 1
            """)
        try stmt.bind(.text(device), .text(collapse), .int(id))
        return try stmt.step() ? stmt.text(0) : nil
    }

    /// Whether a message to these recipients may be large enough to be
    /// written in parts: its devices are counted first (``census(_:)``).
    static func mayBeLarge(_ recipients: Recipients) -> Bool { recipients.count > partThreshold / 64 }

    /// The devices the message names, counted by platform (what it will be
    /// sent to) and in all (rows, skipped ones too), without reading the
    /// rows: on the reader's connection when no write of its users is
    /// pending, else by the message's first part.
    func census(_ e: Enqueue) throws(StoreError) -> Census { try count(Self.distinct(e.recipients), e) }

    /// How many devices the recipients name, from the index alone (a
    /// message of a few hundred devices learns it is not large in
    /// microseconds).
    private func rowCount(_ recipients: Recipients, _ e: Enqueue) throws(StoreError) -> Int {
        let (column, names): (String, [String]) =
            switch recipients {
            case .users(let users): ("user", users)
            case .devices(let ids): ("device_id", ids)
            }
        let (rowsSQL, rowsValues) = Self.targetRows(e.message)
        var rows = 0
        let all = try db.statement(
            "SELECT count(*) FROM devices WHERE app = ? AND \(column) IN (SELECT value FROM json_each(?))" + rowsSQL)
        try all.bind([.text(e.app), .text(Self.jsonTextList(names.filter { !$0.utf8.contains(0) }))] + rowsValues)
        if try all.step() { rows += Int(all.int64(0)) }
        for name in names where name.utf8.contains(0) {
            let one = try db.statement("SELECT count(*) FROM devices WHERE app = ? AND \(column) = ?" + rowsSQL)
            try one.bind([.text(e.app), .text(name)] + rowsValues)
            if try one.step() { rows += Int(one.int64(0)) }
        }
        return rows
    }

    /// The condition on `devices` that picks the rows a message goes to
    /// (``MessageRules/targetRows(_:)``), and its values.
    static func targetRows(_ m: PushMessage) -> (sql: String, values: [StoreValue]) {
        let (role, key) = MessageRules.targetRows(m)
        guard let role else { return (" AND activity_role IS NULL", []) }
        let column = role == .start ? "activity_type" : "activity_id"
        return (" AND activity_role = ? AND \(column) = ?", [.text(role.rawValue), .text(key)])
    }

    private func count(_ recipients: Recipients, _ e: Enqueue) throws(StoreError) -> Census {
        var rows = 0
        var sizes: [Platform: Int] = [:]
        func add(_ stmt: Statement) throws(StoreError) {
            while try stmt.step() {
                let n = Int(stmt.int64(3))
                rows += n
                guard let platform = Platform(rawValue: stmt.text(0)) else { continue }
                if MessageRules.skipReason(
                    enabled: stmt.int64(2) != 0, platform: platform, webPushForm: stmt.int64(1) != 0, e)
                    == nil
                {
                    sizes[platform, default: 0] += n
                }
            }
        }
        let head = "SELECT platform, keys_sealed IS NOT NULL, enabled, count(*) FROM devices WHERE app = ? AND "
        let (column, names): (String, [String]) =
            switch recipients {
            case .users(let users): ("user", users)
            case .devices(let ids): ("device_id", ids)
            }
        let (rowsSQL, rowsValues) = Self.targetRows(e.message)
        let plain = names.filter { !$0.utf8.contains(0) }
        let all = try db.statement(
            head + column + " IN (SELECT value FROM json_each(?))" + rowsSQL + " GROUP BY 1, 2, 3")
        try all.bind([.text(e.app), .text(Self.jsonTextList(plain))] + rowsValues)
        try add(all)
        for name in names where name.utf8.contains(0) {
            let one = try db.statement(head + column + " = ?" + rowsSQL + " GROUP BY 1, 2, 3")
            try one.bind([.text(e.app), .text(name)] + rowsValues)
            try add(one)
        }
        return Census(rows: rows, sizes: sizes)
    }

    /// The recipients with each name once, in their order.
    static func distinct(_ r: Recipients) -> Recipients {
        func once(_ names: [String]) -> [String] {
            var seen = Set<String>()
            return names.filter { seen.insert($0).inserted }
        }
        return switch r {
        case .users(let u): .users(once(u))
        case .devices(let d): .devices(once(d))
        }
    }

    /// One delivery of a message being enqueued, decided before its row is written.
    private struct PlannedDelivery {
        let id: Int64
        let target: DeviceTarget
        /// Why it is skipped; nil: it is sent.
        let skip: String?
        /// The device's own rules: held, silent, and the notes.
        let timing: DeliveryTiming
        var handed = false
    }

    /// How many handed deliveries go to `early` first, before the rest of
    /// the message's tokens are opened.
    static let firstEarlyChunk = 32

    /// The messages whose batches a claim counts: those with a batch (of
    /// the claim's rows) not in `counted`, each once, in order.
    static func uncounted(_ batches: [BatchKey], _ counted: Set<BatchKey>) -> [String] {
        var seen = Set<String>()
        var out: [String] = []
        for b in batches where !counted.contains(b) && seen.insert(b.messageID).inserted { out.append(b.messageID) }
        return out
    }

    /// The id the next delivery row takes (one above the largest).
    private func nextDeliveryID() throws(StoreError) -> Int64 {
        let stmt = try db.statement("SELECT coalesce(max(delivery_id), 0) + 1 FROM deliveries")
        guard try stmt.step() else { return max(1, reservedNext) }
        return max(stmt.int64(0), reservedNext)
    }

    /// The app's devices of the named users, or the named devices of the app
    /// (unknown ones are left out), each once.
    private func resolve(_ recipients: Recipients, _ e: Enqueue) throws(StoreError) -> [DeviceTarget] {
        let app = e.app
        let (rowsSQL, rowsValues) = Self.targetRows(e.message)
        var out: [DeviceTarget] = []
        var seen = Set<String>()
        func collect(_ stmt: Statement) throws(StoreError) {
            while try stmt.step() {
                let id = stmt.text(0)
                guard seen.insert(id).inserted, let platform = Platform(rawValue: stmt.text(2)) else { continue }
                var target = DeviceTarget(
                    deviceID: id, user: stmt.text(1), platform: platform, tokenHash: stmt.text(3),
                    environment: stmt.optionalText(4).flatMap(APNsEnvironment.init(rawValue:)),
                    tokenSealed: stmt.blob(5), keysSealed: stmt.isNull(6) ? nil : stmt.blob(6),
                    registeredAt: stmt.int64(7), bundleID: stmt.optionalText(8), serverKey: stmt.optionalText(9),
                    enabled: stmt.int64(10) != 0)
                if !(stmt.isNull(11) && stmt.isNull(12) && stmt.isNull(13)) {
                    target.preferences = StoredPreferences(
                        timeZone: stmt.optionalText(11), quietHours: stmt.optionalText(12),
                        topics: stmt.optionalText(13))
                }
                out.append(target)
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
                    bundle_id, server_key, enabled, time_zone, quiet_hours, topics
                FROM devices WHERE app = ? AND user IN (SELECT value FROM json_each(?))\(rowsSQL)
                ORDER BY user, registered_seq
                """)
            try stmt.bind([.text(app), .text(Self.jsonTextList(plain))] + rowsValues)
            try collect(stmt)
            for user in withNUL {
                let one = try db.statement(
                    """
                    SELECT device_id, user, platform, token_hash, environment, token_sealed, keys_sealed, registered_at,
                        bundle_id, server_key, enabled, time_zone, quiet_hours, topics
                    FROM devices WHERE app = ? AND user = ?\(rowsSQL) ORDER BY registered_seq
                    """)
                try one.bind([.text(app), .text(user)] + rowsValues)
                try collect(one)
            }
        case .devices(let ids):
            for id in ids {
                let stmt = try db.statement(
                    """
                    SELECT device_id, user, platform, token_hash, environment, token_sealed, keys_sealed, registered_at,
                        bundle_id, server_key, enabled, time_zone, quiet_hours, topics
                    FROM devices WHERE app = ? AND device_id = ?\(rowsSQL)
                    """)
                try stmt.bind([.text(app), .text(id)] + rowsValues)
                try collect(stmt)
            }
        }
        return out
    }

    func message(app: String, idempotencyHash: [UInt8]) throws(StoreError) -> (id: String, acceptedAt: Int64)? {
        let found = try db.statement(
            "SELECT message_id, created_at FROM messages WHERE app = ? AND idempotency_hash = ?")
        try found.bind(.text(app), .blob(idempotencyHash))
        return try found.step() ? (found.text(0), found.int64(1)) : nil
    }

    func clearIdempotencyKey(messageID: String) throws(StoreError) {
        try db.statement("UPDATE messages SET idempotency_hash = NULL WHERE message_id = ?").bind(.text(messageID))
            .run()
    }

    func stateCounts(_ messageID: String) throws(StoreError) -> [DeliveryState: Int] {
        let stmt = try db.statement(
            "SELECT \(Self.reportedState), count(*) FROM deliveries d WHERE message_id = ? GROUP BY 1")
        try stmt.bind(.text(messageID))
        var counts: [DeliveryState: Int] = [:]
        while try stmt.step() {
            if let s = DeliveryState(rawValue: stmt.text(0)) { counts[s] = Int(stmt.int64(1)) }
        }
        return counts
    }

    /// A delivery's state as `push.status` reports it: a queued row waiting
    /// for its time is `held` (one queued again after its time, by a
    /// recovery, is queued). Over `deliveries d`.
    static let reportedState =
        "CASE WHEN d.state = 'queued' AND d.held_until > d.updated_at THEN 'held' ELSE d.state END"

    /// nil when the message is unknown to this app.
    func status(app: String, messageID: String, detail: Bool) throws -> MessageStatus? {
        let m = try db.statement("SELECT created_at FROM messages WHERE app = ? AND message_id = ?")
        try m.bind(.text(app), .text(messageID))
        guard try m.step() else { return nil }
        let createdAt = m.int64(0)
        var devices: [MessageStatus.Device]?
        if detail {
            let stmt = try db.statement(
                """
                SELECT device_id, platform, \(Self.reportedState), attempts, http_status, reason, updated_at, sent_by,
                    shrunk, held_until, timing
                FROM deliveries d WHERE message_id = ? ORDER BY delivery_id
                """)
            try stmt.bind(.text(messageID))
            var list: [MessageStatus.Device] = []
            while try stmt.step() {
                var device = MessageStatus.Device(
                    deviceID: stmt.text(0), platform: Platform(rawValue: stmt.text(1)) ?? .apns,
                    state: DeliveryState(rawValue: stmt.text(2)) ?? .failed, attempts: Int(stmt.int64(3)),
                    httpStatus: stmt.optionalInt64(4).map { Int($0) }, reason: stmt.optionalText(5),
                    updatedAt: stmt.int64(6), sentBy: stmt.optionalText(7),
                    shrunk: stmt.optionalInt64(8).map { Int($0) })
                device.heldUntil = stmt.optionalInt64(9)
                device.timing = stmt.optionalText(10)
                list.append(device)
            }
            devices = list
        }
        var status = MessageStatus(
            messageID: messageID, createdAt: createdAt, counts: try stateCounts(messageID), devices: devices)
        if detail {
            let stmt = try db.statement(MessageStatus.Attempt.query(message: "?"))
            try stmt.bind(.text(messageID))
            var numbering = MessageStatus.Attempt.Numbering()
            var attempts: [MessageStatus.Attempt] = []
            while try stmt.step() { attempts.append(try numbering.take(SQLiteRow(stmt))) }
            status.attempts = attempts
            let payload = try db.statement("SELECT payload FROM messages WHERE message_id = ?")
            try payload.bind(.text(messageID))
            if try payload.step() {
                status.liveActivity = MessageRules.activityOutline(payload.text(0), messageID: messageID, key: key)
            }
        }
        return status
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
        // Due when it was claimed (never later than now): it keeps its place
        // ahead of what was queued after it (a held delivery claimed at its
        // time does not go behind the next fan-out).
        try db.statement(
            """
            UPDATE deliveries SET state = 'retrying', next_attempt_at = min(next_attempt_at, ?), updated_at = ?
            WHERE state = 'in_flight'
            """
        ).bind(.int(now), .int(now)).run()
        return db.changes
    }

    /// Takes due deliveries, oldest due first: up to `lanes[lane]` of each
    /// named lane, and up to `others` of any lane not named (deliveries no
    /// transport is configured for any more, say). Marks them in flight and
    /// returns them with their unsealed tokens. Ones past their send deadline
    /// (`expires_at` + 2 s, attempted or not) become expired; ones whose
    /// device is gone become skipped.
    func claimDue(lanes: [QueueLane: Int], others: Int, counted: Set<BatchKey> = [], now: Int64) throws -> Claim {
        let select = """
            SELECT d.delivery_id, d.message_id, m.app, d.device_id, d.user, d.platform, d.attempts, m.expires_at,
                m.payload, v.environment, v.token_sealed, v.keys_sealed, v.token_hash, v.registered_at, m.created_at,
                v.bundle_id, v.server_key, v.enabled, d.timing,
                CASE WHEN d.collapse_key IS NULL THEN NULL ELSE (
                    SELECT n.message_id FROM deliveries n
                    WHERE n.device_id = d.device_id AND n.collapse_key = d.collapse_key AND n.delivery_id > d.delivery_id
                        AND n.state IN ('queued', 'retrying', 'in_flight', 'delivered')
                    ORDER BY n.delivery_id DESC LIMIT 1) END
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

        var sorting = ClaimSorting(key: key, now: now)
        for (sql, binds) in queries {
            let stmt = try db.statement(sql)
            try stmt.bind(binds)
            while try stmt.step() { try sorting.sort(SQLiteRow(stmt)) }
        }
        return try sorting.finish(counted: counted, self)
    }

    func batchSizes(_ messageIDs: [String], now: Int64) throws(StoreError) -> [BatchKey: Int] {
        var sizes: [BatchKey: Int] = [:]
        for messageID in messageIDs {
            if let census = assemblingSizes[messageID] {
                sizes.merge(census) { _, counted in counted }
                continue
            }
            let count = try db.statement(
                """
                SELECT platform, count(*) FROM deliveries
                WHERE message_id = ? AND state IN ('queued', 'retrying', 'in_flight')
                    AND (held_until IS NULL OR next_attempt_at <= ?)
                GROUP BY platform
                """)
            try count.bind(.text(messageID), .int(now))
            while try count.step() {
                if let p = Platform(rawValue: count.text(0)) {
                    sizes[BatchKey(messageID: messageID, platform: p)] = Int(count.int64(1))
                }
            }
        }
        return sizes
    }

    func take(_ ids: [Int64], now: Int64) throws(StoreError) {
        try db.statement(
            """
            UPDATE deliveries SET state = 'in_flight', attempts = attempts + 1, updated_at = ?, sent_by = ?
            WHERE delivery_id IN (SELECT value FROM json_each(?))
            """
        ).bind(.int(now), .text(instance), .text(Self.jsonList(ids))).run()
    }

    func nextDueAt() throws(StoreError) -> Int64? {
        let next = try db.statement("SELECT min(next_attempt_at) FROM deliveries WHERE state IN ('queued', 'retrying')")
        return try next.step() ? next.optionalInt64(0) : nil
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
        try insertAttempts(records, now: now)
        // The deliveries this batch ended: their events are written for the batch at once
        // (`evented` keeps the row trigger off them), after every update.
        var ended: [Int64] = []
        for (result, ids) in RecordedResult.grouping(records) {
            let update = try db.statement(
                """
                UPDATE deliveries SET state = ?, http_status = ?, reason = ?,
                    next_attempt_at = COALESCE(?, next_attempt_at), updated_at = ?, attempts = max(0, attempts - ?),
                    shrunk = CASE WHEN ? = 1 THEN ? ELSE shrunk END, evented = ?
                WHERE delivery_id IN (SELECT value FROM json_each(?)) AND state = 'in_flight'
                RETURNING device_id, delivery_id
                """)
            try update.bind(
                .text(result.state.rawValue), .optional(result.httpStatus.map(Int64.init)),
                .optional(result.reason?.text),
                .optional(result.nextAttemptAt), .int(now), .int(result.counted ? 0 : 1),
                .int(result.shrink == nil ? 0 : 1), .optional(result.shrink?.index.map(Int64.init)),
                result.state.isFinal ? .int(1) : .null, .text(Self.jsonList(ids)))
            var devices: [String] = []
            while try update.step() {
                devices.append(update.text(0))
                if result.state.isFinal { ended.append(update.int64(1)) }
            }
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
        try writeEvents(ended: ended)
    }

    /// The events of deliveries a batch of results ended, as the row trigger
    /// writes them one by one for every other change: one per delivery with
    /// its last attempt's ids, in delivery order, then the completion of each
    /// message none of whose deliveries is left.
    private func writeEvents(ended: [Int64]) throws(StoreError) {
        guard !ended.isEmpty else { return }
        let list = Self.jsonList(ended.sorted())
        try db.statement(
            """
            INSERT INTO events (at, app, kind, message_id, device_id, user, platform, state, reason, http_status,
                request_id, provider_id)
            SELECT d.updated_at, m.app, 'delivery', d.message_id, d.device_id, d.user, d.platform, d.state,
                d.reason, d.http_status, a.request_id, a.provider_id
            FROM json_each(?1) j JOIN deliveries d ON d.delivery_id = j.value
                JOIN messages m ON m.message_id = d.message_id
                LEFT JOIN attempts a ON a.attempt_id = (
                    SELECT max(attempt_id) FROM attempts WHERE delivery_id = d.delivery_id)
            ORDER BY j.key
            """
        ).bind(.text(list)).run()
        try db.statement(
            """
            INSERT INTO events (at, app, kind, message_id, detail)
            SELECT x.at, m.app, 'message_complete', m.message_id,
                (SELECT json_group_object(state, n) FROM (
                    SELECT state, count(*) AS n FROM deliveries WHERE message_id = m.message_id GROUP BY state))
            FROM (
                SELECT d.message_id, max(d.updated_at) AS at FROM json_each(?1) j
                JOIN deliveries d ON d.delivery_id = j.value GROUP BY d.message_id) x
            JOIN messages m ON m.message_id = x.message_id
            WHERE NOT EXISTS (
                    SELECT 1 FROM deliveries INDEXED BY deliveries_live_by_message
                    WHERE message_id = x.message_id AND state IN ('queued', 'retrying', 'in_flight'))
                AND NOT EXISTS (SELECT 1 FROM assembling WHERE message_id = x.message_id)
            ORDER BY m.message_id
            """
        ).bind(.text(list)).run()
    }

    /// The attempts a provider saw (or that failed on their way), before
    /// their deliveries' results, in one statement: a delivery's final event
    /// carries its last attempt's provider id.
    private func insertAttempts(_ records: [DeliveryRecord], now: Int64) throws(StoreError) {
        var rows: [String] = []
        for r in records {
            guard let receipt = r.receipt else { continue }
            let fields: [String?] = [
                r.state.rawValue, r.reason?.text, receipt.apnsID, receipt.providerID, receipt.origin,
            ]
            var row = "[\(r.deliveryID),\(r.httpStatus.map(String.init) ?? "null"),"
            row += receipt.elapsedMs.map(String.init) ?? "null"
            for f in fields { row += "," + (f.map { Self.jsonString($0) } ?? "null") }
            rows.append(row + "]")
        }
        guard !rows.isEmpty else { return }
        try db.statement(
            """
            INSERT INTO attempts (delivery_id, at, state, http_status, reason, request_id, provider_id, origin,
                elapsed_ms, sent_by)
            SELECT value ->> 0, ?1, value ->> 3, value ->> 1, value ->> 4, value ->> 5, value ->> 6, value ->> 7,
                value ->> 2, ?2
            FROM json_each(?3)
            """
        ).bind(.int(now), .text(instance), .text("[" + rows.joined(separator: ",") + "]")).run()
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
        "[" + values.map(jsonString).joined(separator: ",") + "]"
    }

    /// One string as a JSON string, every control character escaped.
    static func jsonString(_ value: String) -> String {
        var out = "\""
        out.reserveCapacity(value.utf8.count + 2)
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
        return out
    }

    static func jsonList(_ ids: [String]) -> String {
        "[" + ids.map { "\"\($0)\"" }.joined(separator: ",") + "]"
    }

    // MARK: Stale tokens (the rule: ``StaleRules``)

    func owner(deviceID: String, tokenHash: String) throws(StoreError) -> (app: String, device: RemovedDevice)? {
        let stmt = try db.statement("SELECT app, user, platform FROM devices WHERE device_id = ? AND token_hash = ?")
        try stmt.bind(.text(deviceID), .text(tokenHash))
        guard try stmt.step() else { return nil }
        return (stmt.text(0), RemovedDevice(deviceID: deviceID, user: stmt.text(1), platform: stmt.text(2)))
    }

    func noteRemoved(app: String, _ devices: [RemovedDevice], reason: RemovalReason, now: Int64) throws(StoreError) {
        try Self.noteRemoved(db, app: app, devices, reason: reason, now: now)
    }

    static func noteRemoved(
        _ db: Database, app: String, _ devices: [RemovedDevice], reason: RemovalReason, now: Int64
    ) throws(StoreError) {
        for d in devices {
            try db.statement(
                """
                INSERT INTO events (at, app, kind, device_id, user, platform, reason)
                VALUES (?, ?, 'device_removed', ?, ?, ?, ?)
                """
            ).bind(.int(now), .text(app), .text(d.deviceID), .text(d.user), .text(d.platform), .text(reason.rawValue))
                .run()
        }
    }

    /// Nil: the scheduler's stale guard counts exactly what one instance deletes.
    func recentDeletions(platform: String, since: Int64) -> Int? { nil }

    func deleteDevice(deviceID: String, tokenHash: String) throws(StoreError) {
        try db.statement("DELETE FROM devices WHERE device_id = ? AND token_hash = ?")
            .bind(.text(deviceID), .text(tokenHash)).run()
    }

    func noteDeletion(platform: String, at: Int64) {}

    func recordResult(_ r: DeliveryRecord, now: Int64) throws(StoreError) {
        try insertAttempts([r], now: now)
        try record(
            deliveryID: r.deliveryID, deviceID: r.deviceID, state: r.state, httpStatus: r.httpStatus,
            reason: r.reason, nextAttemptAt: r.nextAttemptAt, now: now)
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

    func mark(_ id: Int64, _ state: DeliveryState, reason: String, now: Int64) throws(StoreError) {
        try db.statement("UPDATE deliveries SET state = ?, reason = ?, updated_at = ? WHERE delivery_id = ?")
            .bind(.text(state.rawValue), .text(reason), .int(now), .int(id)).run()
    }

    /// The reason a delivery ends `failed` when its device row does not open.
    static let unreadableRowReason = "unreadable_row"

    func markUnreadable(_ id: Int64, now: Int64) throws(StoreError) {
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
