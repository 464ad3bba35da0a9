import HeraldCore
import HeraldCrypto
import Postgres

/// The device registry's statements on PostgreSQL, on one pool connection
/// inside the batch's transaction (the rules are ``RegistryStatements``',
/// the same as on SQLite). Every write of a
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
struct PostgresRegistry: RegistryStatements {
    let c: PostgresConnection
    let key: StoreKey

    init(_ c: PostgresConnection, key: StoreKey) {
        self.c = c
        self.key = key
    }

    /// A client string in a `bytea` column (see ``PostgresSchema``).
    static func bytes(_ s: String) -> PostgresValue { .bytes(Array(s.utf8)) }
    static func bytes(_ s: String?) -> PostgresValue { s.map(bytes) ?? .null }

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

    fileprivate static let rowColumns = BindingRow.columns(user: "user_name")

    func lockUser(app: String, user: String) throws {
        try Self.lock(c, Self.userLock(app: app, user: user))
    }

    func tombstoneVersion(app: String, user: String, registrationID: String, since: Int64) throws -> Int64? {
        try c.execute(Statements.tombstone, [.text(app), Self.bytes(user), Self.bytes(registrationID), .int(since)])
            .first?.int64(0)
    }

    func device(app: String, user: String, registrationID: String) throws -> BindingRow? {
        try c.execute(Statements.findByRegistration, [.text(app), Self.bytes(user), Self.bytes(registrationID)])
            .first.map(BindingRow.init(read:))
    }

    func device(binding: [UInt8]) throws -> BindingRow? {
        try c.execute(Statements.findByBinding, [.bytes(binding)]).first.map(BindingRow.init(read:))
    }

    /// Deletes `row` as it was read: the same device holding the same binding.
    func delete(_ row: BindingRow) throws {
        let deleted = try c.execute(Statements.deleteDevice, [.text(row.deviceID), .bytes(row.bindingHash)])
        guard deleted.affectedRows == 1 else { throw RegistrationRaceLost(deviceID: row.deviceID) }
    }

    func insert(_ d: DeviceFields, now: Int64) throws {
        let r = d.registration
        try c.execute(
            Statements.insertDevice,
            [
                .text(d.deviceID), .text(r.app), Self.bytes(r.user), .text(r.platform.rawValue),
                .optional(r.environment?.rawValue), .bytes(d.bindingHash), .text(d.tokenHash), .bytes(d.tokenSealed),
                d.keysSealed.map { .bytes($0) } ?? .null, Self.bytes(r.name), Self.bytes(r.appVersion),
                d.sessionHash.map { .bytes($0) } ?? .null, Self.bytes(r.registrationID), .optional(r.version),
                .int(now), .optional(d.keepsBundleID ? r.bundleID : nil), .optional(d.serverKey), Self.bytes(r.appID),
                Self.bytes(r.userAgent),
            ])
    }

    /// Rewrites `row` as it was read (same device, same binding).
    func refresh(_ row: BindingRow, to d: DeviceFields, now: Int64) throws {
        let r = d.registration
        let updated = try c.execute(
            Statements.updateDevice,
            [
                .text(d.deviceID), .text(r.platform.rawValue), .optional(r.environment?.rawValue),
                .bytes(d.bindingHash), .text(d.tokenHash), .bytes(d.tokenSealed),
                d.keysSealed.map { .bytes($0) } ?? .null, Self.bytes(r.name), Self.bytes(r.appVersion),
                d.sessionHash.map { .bytes($0) } ?? .null, Self.bytes(r.registrationID), .optional(r.version),
                .int(now), .text(row.deviceID), .int(d.keepsBundleID ? 1 : 0), .optional(r.bundleID),
                .optional(d.serverKey), Self.bytes(r.appID), Self.bytes(r.userAgent), .bytes(row.bindingHash),
            ])
        guard updated.affectedRows == 1 else { throw RegistrationRaceLost(deviceID: row.deviceID) }
        if d.deviceID != row.deviceID {
            // The installation's id now names it: what waits for it (held
            // deliveries may wait for hours) follows.
            // (Not a queued one whose collapse key the id already has queued:
            // the index that keeps one per key would refuse the move.)
            try c.execute(
                """
                UPDATE deliveries d SET device_id = $1 WHERE d.device_id = $2 AND d.state IN ('queued', 'retrying')
                    AND NOT (d.state = 'queued' AND d.collapse_key IS NOT NULL AND EXISTS (
                        SELECT 1 FROM deliveries o WHERE o.device_id = $1 AND o.collapse_key = d.collapse_key
                            AND o.state = 'queued'))
                """, [.text(d.deviceID), .text(row.deviceID)])
        }
    }

    func evict(app: String, user: String, keep: Int) throws -> [(String, String)] {
        try c.execute(Statements.evict, [.text(app), Self.bytes(user), .int(Int64(keep))]).rows.map {
            (try $0.text(0), try $0.text(1))
        }
    }

    func noteRemoved(app: String, _ devices: [RemovedDevice], reason: RemovalReason, now: Int64) throws {
        try Self.noteRemoved(c, app: app, devices, reason: reason, now: now)
    }

    static func noteRemoved(
        _ c: PostgresConnection, app: String, _ devices: [RemovedDevice], reason: RemovalReason, now: Int64
    ) throws {
        guard !devices.isEmpty else { return }
        try c.execute(
            """
            INSERT INTO events (at, app, kind, device_id, user_name, platform, reason)
            SELECT $1, $2, 'device_removed', d.id, d.user_name, d.platform, $3
            FROM unnest($4::text[], $5::bytea[], $6::text[]) WITH ORDINALITY AS d(id, user_name, platform, n)
            ORDER BY d.n
            """,
            [
                .int(now), .text(app), .text(reason.rawValue), .array(.text(devices.map(\.deviceID))),
                .array(.bytea(devices.map { Array($0.user.utf8) })), .array(.text(devices.map(\.platform))),
            ])
    }

    func deleteDevice(app: String, user: String, deviceID: String) throws -> Int {
        try c.execute(
            "DELETE FROM devices WHERE app = $1 AND user_name = $2 AND device_id = $3",
            [.text(app), Self.bytes(user), .text(deviceID)]
        ).affectedRows
    }

    func deleteDevices(binding: [UInt8], user: String) throws -> Int {
        try c.execute(
            "DELETE FROM devices WHERE binding_hash = $1 AND user_name = $2", [.bytes(binding), Self.bytes(user)]
        ).affectedRows
    }

    func deleteDevices(app: String, user: String, sessionHash: [UInt8]) throws -> Int {
        try c.execute(
            "DELETE FROM devices WHERE app = $1 AND user_name = $2 AND session_hash = $3",
            [.text(app), Self.bytes(user), .bytes(sessionHash)]
        ).affectedRows
    }

    func deleteDevices(app: String, user: String, registrationID: String, upTo version: Int64) throws -> Int {
        try c.execute(
            """
            DELETE FROM devices WHERE app = $1 AND user_name = $2 AND registration_id = $3
                AND (version IS NULL OR version <= $4)
            """, [.text(app), Self.bytes(user), Self.bytes(registrationID), .int(version)]
        ).affectedRows
    }

    func keepTombstone(app: String, user: String, registrationID: String, version: Int64, now: Int64) throws {
        try c.execute(
            """
            INSERT INTO tombstones (app, user_name, registration_id, version, created_at) VALUES ($1, $2, $3, $4, $5)
            ON CONFLICT (app, user_name, registration_id) DO UPDATE SET
                version = greatest(tombstones.version, excluded.version), created_at = excluded.created_at
            """, [.text(app), Self.bytes(user), Self.bytes(registrationID), .int(version), .int(now)])
    }

    func trimTombstones(app: String, user: String, keep: Int) throws {
        try c.execute(
            """
            DELETE FROM tombstones t WHERE t.app = $1 AND t.user_name = $2 AND t.registration_id NOT IN (
                SELECT registration_id FROM tombstones WHERE app = $1 AND user_name = $2
                ORDER BY created_at DESC LIMIT $3)
            """, [.text(app), Self.bytes(user), .int(Int64(keep))])
    }

    func deleteUser(app: String, user: String) throws -> Int {
        let removed = try c.execute(
            "DELETE FROM devices WHERE app = $1 AND user_name = $2", [.text(app), Self.bytes(user)]
        ).affectedRows
        try c.execute("DELETE FROM tombstones WHERE app = $1 AND user_name = $2", [.text(app), Self.bytes(user)])
        try c.execute("DELETE FROM deliveries WHERE app = $1 AND user_name = $2", [.text(app), Self.bytes(user)])
        return removed
    }

    func setDevice(app: String, user: String, deviceID: String, name: String?, enabled: Bool?) throws -> Int {
        try c.execute(
            Statements.updateByID,
            [
                .text(app), Self.bytes(user), .text(deviceID), Self.bytes(name),
                enabled.map { PostgresValue.bool($0) } ?? .null,
            ]
        ).affectedRows
    }

    func applyPreferences(deviceID: String, _ changes: PreferenceChanges) throws -> StoredPreferences? {
        let cols = changes.columns
        let rows = try c.execute(
            """
            UPDATE devices SET time_zone = CASE WHEN $1 THEN time_zone ELSE $2 END,
                quiet_hours = CASE WHEN $3 THEN quiet_hours ELSE $4 END, topics = CASE WHEN $5 THEN topics ELSE $6 END
            WHERE device_id = $7 RETURNING time_zone, quiet_hours, topics
            """,
            [
                .bool(cols[0].keep), .optional(cols[0].value), .bool(cols[1].keep), .optional(cols[1].value),
                .bool(cols[2].keep),
                .optional(cols[2].value), .text(deviceID),
            ])
        return try rows.rows.first.map {
            StoredPreferences(
                timeZone: try $0.optionalText(0), quietHours: try $0.optionalText(1), topics: try $0.optionalText(2))
        }
    }

    func list(app: String, user: String) throws -> [DeviceSummary] {
        try c.execute(Statements.list, [.text(app), Self.bytes(user)]).rows.map(DeviceSummary.init(listed:))
    }

    /// The user `deviceID` belongs to in `app`, or nil.
    func deviceOwner(app: String, deviceID: String) throws -> String? {
        let rows = try c.execute(
            "SELECT user_name FROM devices WHERE app = $1 AND device_id = $2 AND activity_role IS NULL",
            [.text(app), .text(deviceID)]
        ).rows
        return try rows.first.map { try $0.clientText(0) }
    }

    func deviceCounts() throws -> [Platform: Int] {
        var out: [Platform: Int] = [:]
        for r in try c.execute("SELECT platform, count(*) FROM devices GROUP BY platform").rows {
            if let p = Platform(rawValue: try r.text(0)) { out[p] = Int(try r.int64(1)) }
        }
        return out
    }

    func deviceCountsByApp() throws -> [String: [Platform: Int]] {
        var out: [String: [Platform: Int]] = [:]
        for r in try c.execute("SELECT app, platform, count(*) FROM devices GROUP BY app, platform").rows {
            if let p = Platform(rawValue: try r.text(1)) { out[try r.text(0), default: [:]][p] = Int(try r.int64(2)) }
        }
        return out
    }

    /// See ``Registry/webSubscriptionsByKey()``.
    func webSubscriptionsByKey() throws -> [ServerKeyCount] {
        try c.execute(
            "SELECT app, server_key, count(*) FROM devices WHERE keys_sealed IS NOT NULL GROUP BY app, server_key"
        )
        .rows.map { r in
            ServerKeyCount(app: try r.text(0), serverKey: try r.optionalText(1), count: Int(try r.int64(2)))
        }
    }

    /// See ``Registry/recordServerKey(app:key:)``.
    func recordServerKey(app: String, key: String) throws -> Int {
        try c.execute(
            "UPDATE devices SET server_key = $1 WHERE app = $2 AND keys_sealed IS NOT NULL AND server_key IS NULL",
            [.text(key), .text(app)]
        ).affectedRows
    }

    func expireTombstones(now: Int64) throws {
        try c.execute("DELETE FROM tombstones WHERE created_at < $1", [.int(now - RegistryLimits.tombstoneLifetimeMs)])
    }

    // MARK: Live Activity tokens

    func activityParent(app: String, user: String, deviceID: String) throws -> ActivityParent? {
        guard
            let r = try c.execute(
                """
                SELECT platform, environment, bundle_id, app_id FROM devices
                WHERE app = $1 AND user_name = $2 AND device_id = $3 AND activity_role IS NULL
                """, [.text(app), Self.bytes(user), .text(deviceID)]
            ).rows.first, let platform = Platform(rawValue: try r.text(0))
        else { return nil }
        return ActivityParent(
            platform: platform, environment: try r.optionalText(1).flatMap(APNsEnvironment.init(rawValue:)),
            bundleID: try r.optionalText(2), appID: try r.optionalClientText(3) ?? ClientBuild.defaultAppID)
    }

    func putActivityToken(_ r: ActivityTokenRow, now: Int64) throws -> Bool {
        let replaced =
            try c.execute(
                "DELETE FROM devices WHERE device_id = $1 AND activity_role IS NOT NULL", [.text(r.id)]
            ).affectedRows > 0
        // The same token bound to another row (another activity's, say): it is this one's now.
        try c.execute(
            "DELETE FROM devices WHERE binding_hash = $1 AND activity_role IS NOT NULL", [.bytes(r.bindingHash)])
        try c.execute(
            """
            INSERT INTO devices (device_id, app, user_name, platform, environment, binding_hash, token_hash,
                token_sealed, created_at, registered_at, registered_seq, bundle_id, app_id,
                parent_device_id, activity_role, activity_type, activity_id)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9, nextval('registration_seq'), $10, $11, $12, $13, $14, $15)
            """,
            [
                .text(r.id), .text(r.app), Self.bytes(r.user), .text(Platform.apnsLiveActivity.rawValue),
                .optional(r.environment?.rawValue), .bytes(r.bindingHash), .text(r.tokenHash), .bytes(r.tokenSealed),
                .int(now), .optional(r.bundleID), Self.bytes(r.appID), .text(r.parentDeviceID),
                .text(r.role.rawValue), .optional(r.activityType), .optional(r.activityID),
            ])
        return replaced
    }

    func activityTokenIDs(parentDeviceID: String, role: ActivityRole) throws -> [String] {
        try c.execute(
            """
            SELECT device_id FROM devices WHERE parent_device_id = $1 AND activity_role = $2
            ORDER BY registered_seq DESC
            """, [.text(parentDeviceID), .text(role.rawValue)]
        ).rows.map { try $0.text(0) }
    }

    func deleteActivityTokens(ids: [String]) throws -> Int {
        try c.execute(
            "DELETE FROM devices WHERE device_id = ANY($1::text[]) AND activity_role IS NOT NULL",
            [.array(.text(ids))]
        ).affectedRows
    }

    func deleteActivityTokens(app: String, user: String, _ selector: ActivitySelector) throws -> Int {
        switch selector {
        case .activity(let id):
            try c.execute(
                """
                DELETE FROM devices WHERE app = $1 AND user_name = $2 AND activity_role = 'update'
                    AND activity_id = $3
                """, [.text(app), Self.bytes(user), .text(id)]
            ).affectedRows
        case .pushToStart(let deviceID, let type):
            try c.execute(
                """
                DELETE FROM devices WHERE app = $1 AND user_name = $2 AND parent_device_id = $3
                    AND activity_role = 'start' AND activity_type = $4
                """, [.text(app), Self.bytes(user), .text(deviceID), .text(type)]
            ).affectedRows
        }
    }

    // MARK: Broadcast channels

    func putChannel(_ r: ChannelRow, now: Int64) throws {
        try Self.lock(c, Self.lockKey("channels", r.app))
        let count =
            try c.execute(
                "SELECT count(*) FROM devices WHERE app = $1 AND activity_role = 'channel'", [.text(r.app)]
            ).first?.int64(0) ?? 0
        if count >= Int64(ChannelLimits.perApp) { throw ChannelLimitReached() }
        try c.execute("DELETE FROM devices WHERE device_id = $1", [.text(r.rowID)])
        try c.execute(
            """
            INSERT INTO devices (device_id, app, user_name, platform, environment, binding_hash, token_hash,
                token_sealed, created_at, registered_at, registered_seq, bundle_id, activity_role, activity_type,
                activity_id)
            VALUES ($1, $2, ''::bytea, $3, $4, $5, $6, $7, $8, $8, nextval('registration_seq'), $9, 'channel', $10,
                $11)
            """,
            [
                .text(r.rowID), .text(r.app), .text(Platform.apnsChannel.rawValue), .text(r.environment.rawValue),
                .bytes(r.bindingHash), .text(r.tokenHash), .bytes(r.tokenSealed), .int(now), .text(r.bundleID),
                .text(r.storesLatest ? "latest" : "none"), .text(r.channelID),
            ])
    }

    func channels(app: String, channelID: String?) throws -> [ChannelRecord] {
        try c.execute(
            """
            SELECT activity_id, device_id, bundle_id, environment, activity_type, created_at FROM devices
            WHERE app = $1 AND activity_role = 'channel' AND ($2::text IS NULL OR activity_id = $2::text)
            ORDER BY registered_seq DESC
            """, [.text(app), .optional(channelID)]
        ).rows.map { r in
            ChannelRecord(
                channelID: try r.text(0), rowID: try r.text(1), bundleID: try r.optionalText(2),
                environment: try r.optionalText(3).flatMap(APNsEnvironment.init(rawValue:)),
                storesLatest: try r.optionalText(4) == "latest", createdAt: try r.int64(5))
        }
    }

    func deleteChannel(app: String, channelID: String) throws -> Bool {
        try c.execute(
            "DELETE FROM devices WHERE app = $1 AND activity_role = 'channel' AND activity_id = $2",
            [.text(app), .text(channelID)]
        ).affectedRows > 0
    }

    func activityTokens(app: String, user: String) throws -> [ActivityTokenSummary] {
        try c.execute(
            """
            SELECT device_id, parent_device_id, activity_role, activity_type, activity_id, token_hash, environment,
                registered_at
            FROM devices WHERE app = $1 AND user_name = $2 AND activity_role IS NOT NULL
            ORDER BY registered_seq DESC
            """, [.text(app), Self.bytes(user)]
        ).rows.compactMap { r in
            guard let role = ActivityRole(rawValue: try r.text(2)) else { return nil }
            return ActivityTokenSummary(
                tokenID: try r.text(0), deviceID: try r.optionalText(1) ?? "", role: role,
                activityType: try r.optionalText(3), activityID: try r.optionalText(4), tokenHash: try r.text(5),
                environment: try r.optionalText(6).flatMap(APNsEnvironment.init(rawValue:)),
                registeredAt: try r.int64(7))
        }
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
                    SELECT device_id, registered_seq, platform FROM devices WHERE app = $1 AND user_name = $2
                        AND activity_role IS NULL
                        AND (SELECT count(*) FROM devices WHERE app = $1 AND user_name = $2 AND activity_role IS NULL)
                            > $3
                    ORDER BY registered_seq DESC OFFSET $3 FOR UPDATE),
                deleted AS (DELETE FROM devices WHERE device_id IN (SELECT device_id FROM gone))
                SELECT device_id, platform FROM gone ORDER BY registered_seq DESC
                """)
        static let list = PostgresStatement(
            name: "reg_list",
            sql: """
                SELECT \(DeviceSummary.listColumns)
                FROM devices WHERE app = $1 AND user_name = $2 AND activity_role IS NULL ORDER BY registered_seq DESC
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
