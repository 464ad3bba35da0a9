public import HeraldCore
import HeraldCrypto

/// Who a message goes to.
public enum Recipients: Sendable {
    case users([String])
    case devices([String])
}

/// One accepted `push.send`, ready to commit.
public struct Enqueue: Sendable {
    public var app: String
    public var message: PushMessage
    /// The message as stored (JSON text), written by the caller.
    public var payload: String
    public var recipients: Recipients
    public var idempotencyKey: String?
    /// Platforms whose transport is disabled for this app, with the reason.
    public var disabled: [Platform: String]

    public init(
        app: String, message: PushMessage, payload: String, recipients: Recipients, idempotencyKey: String?,
        disabled: [Platform: String]
    ) {
        self.app = app
        self.message = message
        self.payload = payload
        self.recipients = recipients
        self.idempotencyKey = idempotencyKey
        self.disabled = disabled
    }
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
    }

    public let messageID: String
    public let createdAt: Int64
    public let counts: [DeliveryState: Int]
    public let devices: [Device]?

    /// complete when every delivery is final.
    public var isComplete: Bool {
        counts.allSatisfy { state, count in state.isFinal || count == 0 }
    }
}

/// A delivery handed to the scheduler, with what it needs to send.
public struct DueDelivery: Sendable {
    public let deliveryID: Int64
    public let messageID: String
    public let app: String
    public let deviceID: String
    public let user: String
    public let platform: Platform
    public let environment: APNsEnvironment?
    public let token: String
    public let keys: WebPushKeys?
    public let tokenHash: String
    public let registeredAt: Int64
    public let payload: String
    public let attempts: Int
    public let expiresAt: Int64
}

/// The durable delivery queue, on the store thread, inside its transactions.
final class Queue {
    private let db: Database
    private let key: StoreKey

    static let idempotencyWindowMs: Int64 = 24 * 3600 * 1000
    static let maxDevicesPerMessage = 10_000

    init(db: Database, key: StoreKey) {
        self.db = db
        self.key = key
    }

    /// Commits the message and one delivery per recipient device; with a key
    /// seen in the last 24 h, returns the first message instead.
    func enqueue(_ e: Enqueue, now: Int64) throws -> Enqueued {
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
                    return Enqueued(
                        messageID: id, devices: counts.values.reduce(0, +) - skipped, skipped: skipped, duplicate: true)
                }
                try db.statement("UPDATE messages SET idempotency_hash = NULL WHERE message_id = ?").bind(.text(id)).run()
            }
        }
        let messageID = try SecureRandom.bytes(16).hexString
        let expires = now + Int64(e.message.ttlSeconds) * 1000
        try db.statement(
            "INSERT INTO messages (message_id, app, idempotency_hash, payload, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?)"
        ).bind(.text(messageID), .text(e.app), idempotency, .text(e.payload), .int(now), .int(expires)).run()

        var devices = 0
        var skipped = 0
        for target in try resolve(e.recipients, app: e.app) {
            var state = DeliveryState.queued
            var reason: String?
            if !e.message.kind.reaches(target.platform) {
                state = .skipped
                reason = "kind_not_for_platform"
            } else if let why = e.disabled[target.platform] {
                state = .skipped
                reason = "transport_disabled: \(why)"
            }
            if state == .queued, let collapse = e.message.collapseKey {
                // A newer message with the same collapse key replaces one not yet sent.
                try db.statement(
                    """
                    UPDATE deliveries SET state = 'superseded', reason = ?, updated_at = ?
                    WHERE device_id = ? AND collapse_key = ? AND state IN ('queued', 'retrying')
                    """
                ).bind(.text("superseded by \(messageID)"), .int(now), .text(target.deviceID), .text(collapse)).run()
            }
            try db.statement(
                """
                INSERT INTO deliveries (message_id, device_id, user, platform, token_hash, collapse_key, state,
                    next_attempt_at, reason, updated_at)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                """
            ).bind(
                .text(messageID), .text(target.deviceID), .text(target.user), .text(target.platform.rawValue),
                .text(target.tokenHash), .optional(e.message.collapseKey), .text(state.rawValue), .int(now),
                .optional(reason), .int(now)
            ).run()
            if state == .queued { devices += 1 } else { skipped += 1 }
        }
        return Enqueued(messageID: messageID, devices: devices, skipped: skipped, duplicate: false)
    }

    private struct Target {
        let deviceID: String
        let user: String
        let platform: Platform
        let tokenHash: String
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
                out.append(Target(deviceID: id, user: stmt.text(1), platform: platform, tokenHash: stmt.text(3)))
            }
        }
        switch recipients {
        case .users(let users):
            for user in Set(users) {
                let stmt = try db.statement(
                    "SELECT device_id, user, platform, token_hash FROM devices WHERE app = ? AND user = ?")
                try stmt.bind(.text(app), .text(user))
                try collect(stmt)
            }
        case .devices(let ids):
            for id in ids {
                let stmt = try db.statement(
                    "SELECT device_id, user, platform, token_hash FROM devices WHERE app = ? AND device_id = ?")
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
                SELECT device_id, platform, state, attempts, http_status, reason, updated_at
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
                        updatedAt: stmt.int64(6)))
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

    /// Deliveries interrupted by a stop or crash go back to the queue.
    func recoverInFlight(now: Int64) throws(StoreError) -> Int {
        try db.statement(
            "UPDATE deliveries SET state = 'retrying', next_attempt_at = ?, updated_at = ? WHERE state = 'in_flight'"
        ).bind(.int(now), .int(now)).run()
        return db.changes
    }

    /// Takes up to `limit` due deliveries, marks them in flight, and returns
    /// them with their (unsealed) tokens. Past-TTL ones become expired; ones
    /// whose device is gone become skipped.
    func claimDue(limit: Int, now: Int64) throws -> [DueDelivery] {
        let stmt = try db.statement(
            """
            SELECT d.delivery_id, d.message_id, m.app, d.device_id, d.user, d.platform, d.attempts, m.expires_at,
                m.payload, v.environment, v.token_sealed, v.keys_sealed, v.token_hash, v.registered_at
            FROM deliveries d JOIN messages m ON m.message_id = d.message_id
            LEFT JOIN devices v ON v.device_id = d.device_id
            WHERE d.state IN ('queued', 'retrying') AND d.next_attempt_at <= ?
            ORDER BY d.next_attempt_at LIMIT ?
            """)
        try stmt.bind(.int(now), .int(Int64(limit)))
        var due: [DueDelivery] = []
        var expired: [Int64] = []
        var gone: [Int64] = []
        while try stmt.step() {
            let id = stmt.int64(0)
            let expiresAt = stmt.int64(7)
            if now > expiresAt && stmt.int64(6) > 0 {
                expired.append(id)
                continue
            }
            if stmt.isNull(10) {
                gone.append(id)
                continue
            }
            let deviceID = stmt.text(3)
            let token = try key.open(stmt.blob(10), context: Identity.tokenContext(deviceID))
            var keys: WebPushKeys?
            if !stmt.isNull(11) {
                let raw = try key.open(stmt.blob(11), context: Identity.keysContext(deviceID))
                keys = WebPushKeys(p256dh: Array(raw.prefix(65)), auth: Array(raw.dropFirst(65)))
            }
            due.append(
                DueDelivery(
                    deliveryID: id, messageID: stmt.text(1), app: stmt.text(2), deviceID: deviceID,
                    user: stmt.text(4), platform: Platform(rawValue: stmt.text(5)) ?? .apns,
                    environment: stmt.optionalText(9).flatMap(APNsEnvironment.init(rawValue:)),
                    token: String(decoding: token, as: UTF8.self), keys: keys, tokenHash: stmt.text(12),
                    registeredAt: stmt.int64(13), payload: stmt.text(8), attempts: Int(stmt.int64(6)),
                    expiresAt: expiresAt))
        }
        for id in expired { try mark(id, .expired, reason: "ttl elapsed", now: now) }
        for id in gone { try mark(id, .skipped, reason: "device removed", now: now) }
        for d in due {
            try db.statement(
                "UPDATE deliveries SET state = 'in_flight', attempts = attempts + 1, updated_at = ? WHERE delivery_id = ?"
            ).bind(.int(now), .int(d.deliveryID)).run()
        }
        return due
    }

    /// Records an attempt's result: a final state, or `retrying` at `nextAttemptAt`.
    func record(
        deliveryID: Int64, state: DeliveryState, httpStatus: Int?, reason: String?, nextAttemptAt: Int64?, now: Int64
    ) throws(StoreError) {
        try db.statement(
            """
            UPDATE deliveries SET state = ?, http_status = ?, reason = ?,
                next_attempt_at = COALESCE(?, next_attempt_at), updated_at = ?
            WHERE delivery_id = ?
            """
        ).bind(
            .text(state.rawValue), .optional(httpStatus.map(Int64.init)), .optional(reason),
            .optional(nextAttemptAt), .int(now), .int(deliveryID)
        ).run()
        let column: String? =
            switch state {
            case .delivered: "last_success_at = ?, last_failure_reason = last_failure_reason"
            case .failed: "last_failure_at = ?, last_failure_reason = ?"
            default: nil
            }
        guard let column else { return }
        let device = try db.statement(
            "UPDATE devices SET \(column) WHERE device_id = (SELECT device_id FROM deliveries WHERE delivery_id = ?)")
        if state == .failed {
            try device.bind(.int(now), .optional(reason), .int(deliveryID)).run()
        } else {
            try device.bind(.int(now), .int(deliveryID)).run()
        }
    }

    private func mark(_ id: Int64, _ state: DeliveryState, reason: String, now: Int64) throws(StoreError) {
        try db.statement("UPDATE deliveries SET state = ?, reason = ?, updated_at = ? WHERE delivery_id = ?")
            .bind(.text(state.rawValue), .text(reason), .int(now), .int(id)).run()
    }

    /// Deliveries waiting or in flight, for `system.stats`.
    func depth() throws(StoreError) -> (queued: Int, inFlight: Int) {
        let stmt = try db.statement(
            """
            SELECT sum(state IN ('queued', 'retrying')), sum(state = 'in_flight') FROM deliveries
            WHERE state IN ('queued', 'retrying', 'in_flight')
            """)
        guard try stmt.step() else { return (0, 0) }
        return (Int(stmt.int64(0)), Int(stmt.int64(1)))
    }
}
