import HeraldCore
import HeraldCrypto
import Postgres

/// The device registry on PostgreSQL: the rules of ``Registry`` (SQLite),
/// run on a pool connection inside the batch's transaction. Every write of a
/// user first takes a transaction-scoped advisory lock on the user, so that
/// two instances registering the same user's devices at once take turns
/// (eviction over the cap, version ordering), as the one SQLite writer does.
///
/// The lock orders one user's writes only: another user's registration may
/// reclaim (delete) this user's row at the same time, and this user's move
/// may rewrite a row another user is about to reclaim. So every delete or
/// update of a row read earlier in the job names that row as it was read
/// (its `device_id` and its `binding_hash`), and when it finds no such row
/// any more (under READ COMMITTED a statement that waited on a row lock
/// re-checks its condition against the committed row) the job throws
/// ``RegistrationRaceLost``: the store runs it again in a fresh savepoint,
/// where it reads the current rows.
struct PostgresRegistry {
    let key: StoreKey

    static let tombstoneBound = Registry.tombstoneBound
    static let tombstoneLifetimeMs = Registry.tombstoneLifetimeMs

    /// A client string in a `bytea` column (see ``PostgresSchema``).
    static func bytes(_ s: String) -> PostgresValue { .bytes(Array(s.utf8)) }
    static func bytes(_ s: String?) -> PostgresValue { s.map(bytes) ?? .null }
    static func string(_ row: PostgresRow, _ column: Int) throws -> String {
        String(decoding: try row.bytes(column), as: UTF8.self)
    }
    static func optionalString(_ row: PostgresRow, _ column: Int) throws -> String? {
        try row.optionalBytes(column).map { String(decoding: $0, as: UTF8.self) }
    }

    /// The advisory lock of one app's user: 63 bits of SHA-256 over both names.
    static func userLock(app: String, user: String) -> Int64 {
        lockKey("user", app, user)
    }

    static func lockKey(_ parts: String...) -> Int64 {
        var input: [UInt8] = []
        for part in parts {
            input += Array(String(part.utf8.count).utf8) + [0x3A] + Array(part.utf8)
        }
        let digest = SHA256.hash(input)
        var value: Int64 = 0
        for byte in digest.prefix(8) { value = value << 8 | Int64(byte) }
        return value
    }

    static func lock(_ c: PostgresConnection, _ key: Int64) throws {
        try c.execute(Statements.advisoryLock, [.int(key)])
    }

    private static let rowColumns = "device_id, user_name, binding_hash, version"

    private func row(_ r: PostgresRow) throws -> BindingRow {
        BindingRow(
            deviceID: try r.text(0), user: try Self.string(r, 1), bindingHash: try r.bytes(2),
            version: try r.optionalInt64(3))
    }

    private func findByBinding(_ c: PostgresConnection, _ hash: [UInt8]) throws -> BindingRow? {
        try c.execute(Statements.findByBinding, [.bytes(hash)]).first.map(row)
    }

    private func findByRegistration(
        _ c: PostgresConnection, app: String, user: String, id: String
    ) throws -> BindingRow? {
        try c.execute(Statements.findByRegistration, [.text(app), Self.bytes(user), Self.bytes(id)]).first.map(row)
    }

    private func tombstoneVersion(
        _ c: PostgresConnection, app: String, user: String, id: String, now: Int64
    ) throws
        -> Int64?
    {
        try c.execute(
            Statements.tombstone, [.text(app), Self.bytes(user), Self.bytes(id), .int(now - Self.tombstoneLifetimeMs)]
        ).first?.int64(0)
    }

    /// Deletes `row` as it was read: the same device holding the same binding.
    private func delete(_ c: PostgresConnection, _ row: BindingRow) throws {
        let deleted = try c.execute(Statements.deleteDevice, [.text(row.deviceID), .bytes(row.bindingHash)])
        guard deleted.affectedRows == 1 else { throw RegistrationRaceLost(deviceID: row.deviceID) }
    }

    private func seal(_ r: Registration, deviceID: String) throws -> (token: [UInt8], keys: PostgresValue) {
        let sealed = try DeviceSecrets.seal(r, deviceID: deviceID, key: key)
        return (sealed.token, sealed.keys.map { .bytes($0) } ?? .null)
    }

    /// Every rule of `device.register` (see ``Registry/register(_:deviceCap:now:)``).
    func register(_ c: PostgresConnection, _ r: Registration, deviceCap: Int, now: Int64) throws -> RegistrationOutcome
    {
        try Self.lock(c, Self.userLock(app: r.app, user: r.user))
        let binding = Identity.bindingHash(
            app: r.app, platform: r.platform, environment: r.environment, token: r.token, appID: r.appID)
        let tokenHash = Identity.tokenHash(r.token)
        var reclaimed = false

        if let rid = r.registrationID {
            if let version = r.version,
                let tomb = try tombstoneVersion(c, app: r.app, user: r.user, id: rid, now: now), tomb >= version
            {
                throw RegistrationConflict(
                    storedVersion: tomb, reason: "registration was unregistered at version \(tomb)")
            }
            if let existing = try findByRegistration(c, app: r.app, user: r.user, id: rid) {
                if let version = r.version, let stored = existing.version {
                    if version < stored {
                        throw RegistrationConflict(storedVersion: stored, reason: "a newer version is registered")
                    }
                    if version == stored && existing.bindingHash != binding {
                        throw RegistrationConflict(
                            storedVersion: stored, reason: "the same version is registered with another token")
                    }
                }
                if existing.bindingHash != binding, let other = try findByBinding(c, binding) {
                    reclaimed = other.user != r.user
                    try delete(c, other)
                }
                try update(c, existing, with: r, binding: binding, tokenHash: tokenHash, now: now)
                return RegistrationOutcome(
                    deviceID: existing.deviceID, tokenHash: tokenHash, created: false, reclaimed: reclaimed, evicted: []
                )
            }
        }

        if let existing = try findByBinding(c, binding) {
            if existing.user == r.user {
                let id =
                    r.registrationID.map { Identity.deviceID(user: r.user, app: r.app, registrationID: $0) }
                    ?? existing.deviceID
                try update(c, existing, with: r, binding: binding, tokenHash: tokenHash, now: now, newID: id)
                return RegistrationOutcome(
                    deviceID: id, tokenHash: tokenHash, created: false, reclaimed: false, evicted: [])
            }
            try delete(c, existing)
            reclaimed = true
        }

        let deviceID = Identity.deviceID(for: r)
        let sealed = try seal(r, deviceID: deviceID)
        try c.execute(
            Statements.insertDevice,
            [
                .text(deviceID), .text(r.app), Self.bytes(r.user), .text(r.platform.rawValue),
                .optional(r.environment?.rawValue), .bytes(binding), .text(tokenHash), .bytes(sealed.token),
                sealed.keys, Self.bytes(r.name), Self.bytes(r.appVersion),
                r.session.map { .bytes(Identity.sessionHash($0)) } ?? .null, Self.bytes(r.registrationID),
                .optional(r.version), .int(now), .optional(r.platform.hasEnvironment ? r.bundleID : nil),
                .optional(Registry.serverKey(r)), Self.bytes(r.appID), Self.bytes(r.userAgent),
            ])
        let evicted = try evict(c, app: r.app, user: r.user, keep: deviceCap)
        return RegistrationOutcome(
            deviceID: deviceID, tokenHash: tokenHash, created: true, reclaimed: reclaimed, evicted: evicted)
    }

    /// Rewrites `row` as it was read (same device, same binding) with `r`.
    private func update(
        _ c: PostgresConnection, _ row: BindingRow, with r: Registration, binding: [UInt8], tokenHash: String,
        now: Int64, newID: String? = nil
    ) throws {
        let id = newID ?? row.deviceID
        let sealed = try seal(r, deviceID: id)
        let updated = try c.execute(
            Statements.updateDevice,
            [
                .text(id), .text(r.platform.rawValue), .optional(r.environment?.rawValue), .bytes(binding),
                .text(tokenHash), .bytes(sealed.token), sealed.keys, Self.bytes(r.name), Self.bytes(r.appVersion),
                r.session.map { .bytes(Identity.sessionHash($0)) } ?? .null, Self.bytes(r.registrationID),
                .optional(r.version), .int(now), .text(row.deviceID), .int(r.platform.hasEnvironment ? 1 : 0),
                .optional(r.bundleID), .optional(Registry.serverKey(r)), Self.bytes(r.appID), Self.bytes(r.userAgent),
                .bytes(row.bindingHash),
            ])
        guard updated.affectedRows == 1 else { throw RegistrationRaceLost(deviceID: row.deviceID) }
    }

    private func evict(_ c: PostgresConnection, app: String, user: String, keep: Int) throws -> [String] {
        try c.execute(Statements.evict, [.text(app), Self.bytes(user), .int(Int64(keep))]).rows.map { try $0.text(0) }
    }

    func unregister(
        _ c: PostgresConnection, app: String, user: String, _ selector: UnregisterSelector, now: Int64
    )
        throws -> Int
    {
        try Self.lock(c, Self.userLock(app: app, user: user))
        switch selector {
        case .deviceID(let id):
            return try c.execute(
                "DELETE FROM devices WHERE app = $1 AND user_name = $2 AND device_id = $3",
                [.text(app), Self.bytes(user), .text(id)]
            ).affectedRows
        case .binding(let platform, let environment, let token, let appID):
            let hash = Identity.bindingHash(
                app: app, platform: platform, environment: environment, token: token, appID: appID)
            return try c.execute(
                "DELETE FROM devices WHERE binding_hash = $1 AND user_name = $2", [.bytes(hash), Self.bytes(user)]
            ).affectedRows
        case .registration(let id, let version):
            try c.execute(
                """
                INSERT INTO tombstones (app, user_name, registration_id, version, created_at) VALUES ($1, $2, $3, $4, $5)
                ON CONFLICT (app, user_name, registration_id) DO UPDATE SET
                    version = greatest(tombstones.version, excluded.version), created_at = excluded.created_at
                """, [.text(app), Self.bytes(user), Self.bytes(id), .int(version), .int(now)])
            try c.execute(
                """
                DELETE FROM tombstones t WHERE t.app = $1 AND t.user_name = $2 AND t.registration_id NOT IN (
                    SELECT registration_id FROM tombstones WHERE app = $1 AND user_name = $2
                    ORDER BY created_at DESC LIMIT $3)
                """, [.text(app), Self.bytes(user), .int(Int64(Self.tombstoneBound))])
            return try c.execute(
                """
                DELETE FROM devices WHERE app = $1 AND user_name = $2 AND registration_id = $3
                    AND (version IS NULL OR version <= $4)
                """, [.text(app), Self.bytes(user), Self.bytes(id), .int(version)]
            ).affectedRows
        }
    }

    func endSession(_ c: PostgresConnection, app: String, user: String, session: String) throws -> Int {
        try Self.lock(c, Self.userLock(app: app, user: user))
        return try c.execute(
            "DELETE FROM devices WHERE app = $1 AND user_name = $2 AND session_hash = $3",
            [.text(app), Self.bytes(user), .bytes(Identity.sessionHash(session))]
        ).affectedRows
    }

    func forget(_ c: PostgresConnection, app: String, user: String) throws -> Int {
        try Self.lock(c, Self.userLock(app: app, user: user))
        let removed = try c.execute(
            "DELETE FROM devices WHERE app = $1 AND user_name = $2", [.text(app), Self.bytes(user)]
        ).affectedRows
        try c.execute("DELETE FROM tombstones WHERE app = $1 AND user_name = $2", [.text(app), Self.bytes(user)])
        try c.execute("DELETE FROM deliveries WHERE app = $1 AND user_name = $2", [.text(app), Self.bytes(user)])
        return removed
    }

    func list(_ c: PostgresConnection, app: String, user: String) throws -> [DeviceSummary] {
        try c.execute(Statements.list, [.text(app), Self.bytes(user)]).rows.map { r in
            DeviceSummary(
                deviceID: try r.text(0), platform: Platform(rawValue: try r.text(1)) ?? .apns,
                environment: try r.optionalText(2).flatMap(APNsEnvironment.init(rawValue:)),
                name: try Self.optionalString(r, 3), appVersion: try Self.optionalString(r, 4),
                tokenHash: try r.text(5),
                createdAt: try r.int64(6), registeredAt: try r.int64(7), lastSuccessAt: try r.optionalInt64(8),
                lastFailureAt: try r.optionalInt64(9), lastFailureReason: try r.optionalText(10),
                bundleID: try r.optionalText(11), enabled: try r.bool(12), appID: try Self.string(r, 13),
                userAgent: try Self.optionalString(r, 14), webPushForm: try r.bool(15))
        }
    }

    /// `device.update` (see ``Registry/updateDevice(app:user:deviceID:name:enabled:)``).
    func updateDevice(
        _ c: PostgresConnection, app: String, user: String, deviceID: String, name: String?, enabled: Bool?
    ) throws -> DeviceSummary? {
        try Self.lock(c, Self.userLock(app: app, user: user))
        let updated = try c.execute(
            Statements.updateByID,
            [
                .text(app), Self.bytes(user), .text(deviceID), Self.bytes(name),
                enabled.map { PostgresValue.bool($0) } ?? .null,
            ])
        guard updated.affectedRows > 0 else { return nil }
        // As device.list shows it (a user has at most device_cap devices).
        return try list(c, app: app, user: user).first { $0.deviceID == deviceID }
    }

    /// The user `deviceID` belongs to in `app`, or nil.
    func deviceOwner(_ c: PostgresConnection, app: String, deviceID: String) throws -> String? {
        let rows = try c.execute(
            "SELECT user_name FROM devices WHERE app = $1 AND device_id = $2", [.text(app), .text(deviceID)]
        ).rows
        return try rows.first.map { try Self.string($0, 0) }
    }

    func deviceCounts(_ c: PostgresConnection) throws -> [Platform: Int] {
        var out: [Platform: Int] = [:]
        for r in try c.execute("SELECT platform, count(*) FROM devices GROUP BY platform").rows {
            if let p = Platform(rawValue: try r.text(0)) { out[p] = Int(try r.int64(1)) }
        }
        return out
    }

    func deviceCountsByApp(_ c: PostgresConnection) throws -> [String: [Platform: Int]] {
        var out: [String: [Platform: Int]] = [:]
        for r in try c.execute("SELECT app, platform, count(*) FROM devices GROUP BY app, platform").rows {
            if let p = Platform(rawValue: try r.text(1)) { out[try r.text(0), default: [:]][p] = Int(try r.int64(2)) }
        }
        return out
    }

    /// See ``Registry/webSubscriptionsByKey()``.
    func webSubscriptionsByKey(_ c: PostgresConnection) throws -> [ServerKeyCount] {
        try c.execute(
            "SELECT app, server_key, count(*) FROM devices WHERE keys_sealed IS NOT NULL GROUP BY app, server_key"
        )
        .rows.map { r in
            ServerKeyCount(app: try r.text(0), serverKey: try r.optionalText(1), count: Int(try r.int64(2)))
        }
    }

    /// See ``Registry/recordServerKey(app:key:)``.
    func recordServerKey(_ c: PostgresConnection, app: String, key: String) throws -> Int {
        try c.execute(
            "UPDATE devices SET server_key = $1 WHERE app = $2 AND keys_sealed IS NOT NULL AND server_key IS NULL",
            [.text(key), .text(app)]
        ).affectedRows
    }

    func expireTombstones(_ c: PostgresConnection, now: Int64) throws {
        try c.execute("DELETE FROM tombstones WHERE created_at < $1", [.int(now - Self.tombstoneLifetimeMs)])
    }

    private enum Statements {
        static let advisoryLock = PostgresStatement(name: "advisory_xact_lock", sql: "SELECT pg_advisory_xact_lock($1)")
        static let findByBinding = PostgresStatement(
            name: "reg_by_binding", sql: "SELECT \(rowColumns) FROM devices WHERE binding_hash = $1")
        static let findByRegistration = PostgresStatement(
            name: "reg_by_registration",
            sql: "SELECT \(rowColumns) FROM devices WHERE app = $1 AND user_name = $2 AND registration_id = $3")
        static let tombstone = PostgresStatement(
            name: "reg_tombstone",
            sql: """
                SELECT version FROM tombstones
                WHERE app = $1 AND user_name = $2 AND registration_id = $3 AND created_at >= $4
                """)
        static let deleteDevice = PostgresStatement(
            name: "reg_delete", sql: "DELETE FROM devices WHERE device_id = $1 AND binding_hash = $2")
        static let insertDevice = PostgresStatement(
            name: "reg_insert",
            sql: """
                INSERT INTO devices (device_id, app, user_name, platform, environment, binding_hash, token_hash,
                    token_sealed, keys_sealed, name, app_version, session_hash, registration_id, version,
                    created_at, registered_at, registered_seq, bundle_id, server_key, app_id, user_agent)
                VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $15, nextval('registration_seq'),
                    $16, $17, $18, $19)
                """)
        static let updateDevice = PostgresStatement(
            name: "reg_update",
            sql: """
                UPDATE devices SET device_id = $1, platform = $2, environment = $3, binding_hash = $4, token_hash = $5,
                    token_sealed = $6, keys_sealed = $7, name = COALESCE($8, name),
                    app_version = COALESCE($9, app_version), session_hash = COALESCE($10, session_hash),
                    registration_id = COALESCE($11, registration_id), version = COALESCE($12, version),
                    registered_at = $13, registered_seq = nextval('registration_seq'),
                    bundle_id = CASE WHEN $15::bigint = 1 THEN COALESCE($16::text, bundle_id) END, server_key = $17,
                    app_id = $18, user_agent = COALESCE($19, user_agent)
                WHERE device_id = $14 AND binding_hash = $20
                """)
        /// Only a user over the cap by the statement's snapshot can have to
        /// evict (under the user's lock no row of the user is added meanwhile,
        /// only deleted); then FOR UPDATE waits for a row another user's
        /// reclaim is deleting and leaves it out of the count, so the user
        /// keeps every device that still fits under the cap.
        static let evict = PostgresStatement(
            name: "reg_evict",
            sql: """
                WITH gone AS (
                    SELECT device_id, registered_seq FROM devices WHERE app = $1 AND user_name = $2
                        AND (SELECT count(*) FROM devices WHERE app = $1 AND user_name = $2) > $3
                    ORDER BY registered_seq DESC OFFSET $3 FOR UPDATE),
                deleted AS (DELETE FROM devices WHERE device_id IN (SELECT device_id FROM gone))
                SELECT device_id FROM gone ORDER BY registered_seq DESC
                """)
        static let list = PostgresStatement(
            name: "reg_list",
            sql: """
                SELECT device_id, platform, environment, name, app_version, token_hash, created_at, registered_at,
                    last_success_at, last_failure_at, last_failure_reason, bundle_id, enabled, app_id, user_agent,
                    keys_sealed IS NOT NULL
                FROM devices WHERE app = $1 AND user_name = $2 ORDER BY registered_seq DESC
                """)
        static let updateByID = PostgresStatement(
            name: "reg_update_by_id",
            sql: """
                UPDATE devices SET name = COALESCE($4, name), enabled = COALESCE($5, enabled)
                WHERE app = $1 AND user_name = $2 AND device_id = $3
                """)
    }
}

/// A registration found that a device row it had read was deleted or
/// rewritten by another transaction (another user's reclaim, or the owner's
/// move to a new token) before it could delete or update it. It lost a race:
/// ``PostgresStore`` runs the job again in a fresh savepoint (see
/// ``PostgresStore/isRace(_:)``), where it reads the rows as they are now.
struct RegistrationRaceLost: Error, CustomStringConvertible {
    let deviceID: String
    var description: String {
        "device \(deviceID) changed under a registration (another instance's registration won the race)"
    }
}
