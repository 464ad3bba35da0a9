import HeraldCore
import HeraldCrypto

/// The device registry's statements on one SQLite connection (its rules
/// are ``RegistryStatements``'). Not thread-safe: the `SQLiteStore` runs it
/// on its own thread, inside its transactions.
final class Registry: RegistryStatements {
    private let db: Database
    let key: StoreKey

    /// The last registration sequence number handed out (store thread only).
    private var sequence: Int64

    init(db: Database, key: StoreKey) throws(StoreError) {
        self.db = db
        self.key = key
        let stmt = try db.statement("SELECT coalesce(max(registered_seq), 0) FROM devices")
        sequence = try stmt.step() ? stmt.int64(0) : 0
    }

    private func nextSequence() -> Int64 {
        sequence += 1
        return sequence
    }

    private static let rowColumns = BindingRow.columns(user: "user")

    /// One writer: no other transaction changes a row between its read and its write.
    func lockUser(app: String, user: String) {}

    func tombstoneVersion(
        app: String, user: String, registrationID: String, since: Int64
    ) throws(StoreError)
        -> Int64?
    {
        let stmt = try db.statement(
            "SELECT version FROM tombstones WHERE app = ? AND user = ? AND registration_id = ? AND created_at >= ?")
        try stmt.bind(.text(app), .text(user), .text(registrationID), .int(since))
        return try stmt.step() ? stmt.int64(0) : nil
    }

    func device(app: String, user: String, registrationID: String) throws -> BindingRow? {
        let stmt = try db.statement(
            "SELECT \(Self.rowColumns) FROM devices WHERE app = ? AND user = ? AND registration_id = ?")
        try stmt.bind(.text(app), .text(user), .text(registrationID))
        return try stmt.step() ? BindingRow(read: SQLiteRow(stmt)) : nil
    }

    func device(binding: [UInt8]) throws -> BindingRow? {
        let stmt = try db.statement("SELECT \(Self.rowColumns) FROM devices WHERE binding_hash = ?")
        try stmt.bind(.blob(binding))
        return try stmt.step() ? BindingRow(read: SQLiteRow(stmt)) : nil
    }

    func delete(_ row: BindingRow) throws(StoreError) {
        try db.statement("DELETE FROM devices WHERE device_id = ?").bind(.text(row.deviceID)).run()
    }

    func insert(_ d: DeviceFields, now: Int64) throws(StoreError) {
        let r = d.registration
        try db.statement(
            """
            INSERT INTO devices (device_id, app, user, platform, environment, binding_hash, token_hash,
                token_sealed, keys_sealed, name, app_version, session_hash, registration_id, version,
                created_at, registered_at, registered_seq, bundle_id, server_key, app_id, user_agent)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            """
        ).bind(
            .text(d.deviceID), .text(r.app), .text(r.user), .text(r.platform.rawValue),
            .optional(r.environment?.rawValue), .blob(d.bindingHash), .text(d.tokenHash), .blob(d.tokenSealed),
            d.keysSealed.map { .blob($0) } ?? .null, .optional(r.name), .optional(r.appVersion),
            d.sessionHash.map { .blob($0) } ?? .null, .optional(r.registrationID), .optional(r.version), .int(now),
            .int(now), .int(nextSequence()), .optional(d.keepsBundleID ? r.bundleID : nil), .optional(d.serverKey),
            .text(r.appID), .optional(r.userAgent)
        ).run()
    }

    func refresh(_ row: BindingRow, to d: DeviceFields, now: Int64) throws(StoreError) {
        let r = d.registration
        try db.statement(
            """
            UPDATE devices SET device_id = ?, platform = ?, environment = ?, binding_hash = ?, token_hash = ?,
                token_sealed = ?, keys_sealed = ?, name = COALESCE(?, name),
                app_version = COALESCE(?, app_version), session_hash = COALESCE(?, session_hash),
                registration_id = COALESCE(?, registration_id), version = COALESCE(?, version),
                registered_at = ?, registered_seq = ?,
                bundle_id = CASE WHEN ? = 1 THEN COALESCE(?, bundle_id) END, server_key = ?,
                app_id = ?, user_agent = COALESCE(?, user_agent)
            WHERE device_id = ?
            """
        ).bind(
            .text(d.deviceID), .text(r.platform.rawValue), .optional(r.environment?.rawValue), .blob(d.bindingHash),
            .text(d.tokenHash), .blob(d.tokenSealed), d.keysSealed.map { .blob($0) } ?? .null, .optional(r.name),
            .optional(r.appVersion), d.sessionHash.map { .blob($0) } ?? .null, .optional(r.registrationID),
            .optional(r.version), .int(now), .int(nextSequence()), .int(d.keepsBundleID ? 1 : 0),
            .optional(r.bundleID), .optional(d.serverKey), .text(r.appID), .optional(r.userAgent),
            .text(row.deviceID)
        ).run()
        if d.deviceID != row.deviceID {
            // The installation's id now names it: what waits for it (held
            // deliveries may wait for hours) follows.
            try db.statement(
                "UPDATE deliveries SET device_id = ? WHERE device_id = ? AND state IN ('queued', 'retrying')"
            ).bind(.text(d.deviceID), .text(row.deviceID)).run()
        }
    }

    func evict(app: String, user: String, keep: Int) throws(StoreError) -> [(String, String)] {
        let stmt = try db.statement(
            """
            SELECT device_id, platform FROM devices WHERE app = ? AND user = ? AND activity_role IS NULL
            ORDER BY registered_seq DESC LIMIT -1 OFFSET ?
            """)
        try stmt.bind(.text(app), .text(user), .int(Int64(keep)))
        var evicted: [(String, String)] = []
        while try stmt.step() { evicted.append((stmt.text(0), stmt.text(1))) }
        for (id, _) in evicted {
            try db.statement("DELETE FROM devices WHERE device_id = ?").bind(.text(id)).run()
        }
        return evicted
    }

    func noteRemoved(app: String, _ devices: [RemovedDevice], reason: RemovalReason, now: Int64) throws(StoreError) {
        try Queue.noteRemoved(db, app: app, devices, reason: reason, now: now)
    }

    func deleteDevice(app: String, user: String, deviceID: String) throws(StoreError) -> Int {
        try db.statement("DELETE FROM devices WHERE app = ? AND user = ? AND device_id = ?")
            .bind(.text(app), .text(user), .text(deviceID)).run()
        return db.changes
    }

    func deleteDevices(binding: [UInt8], user: String) throws(StoreError) -> Int {
        try db.statement("DELETE FROM devices WHERE binding_hash = ? AND user = ?")
            .bind(.blob(binding), .text(user)).run()
        return db.changes
    }

    func deleteDevices(app: String, user: String, sessionHash: [UInt8]) throws(StoreError) -> Int {
        try db.statement("DELETE FROM devices WHERE app = ? AND user = ? AND session_hash = ?")
            .bind(.text(app), .text(user), .blob(sessionHash)).run()
        return db.changes
    }

    func deleteDevices(
        app: String, user: String, registrationID: String, upTo version: Int64
    ) throws(StoreError)
        -> Int
    {
        try db.statement(
            "DELETE FROM devices WHERE app = ? AND user = ? AND registration_id = ? AND (version IS NULL OR version <= ?)"
        ).bind(.text(app), .text(user), .text(registrationID), .int(version)).run()
        return db.changes
    }

    func keepTombstone(
        app: String, user: String, registrationID: String, version: Int64, now: Int64
    ) throws(StoreError) {
        try db.statement(
            """
            INSERT INTO tombstones (app, user, registration_id, version, created_at) VALUES (?, ?, ?, ?, ?)
            ON CONFLICT (app, user, registration_id) DO UPDATE SET
                version = max(version, excluded.version), created_at = excluded.created_at
            """
        ).bind(.text(app), .text(user), .text(registrationID), .int(version), .int(now)).run()
    }

    func trimTombstones(app: String, user: String, keep: Int) throws(StoreError) {
        try db.statement(
            """
            DELETE FROM tombstones WHERE app = ? AND user = ? AND rowid NOT IN (
                SELECT rowid FROM tombstones WHERE app = ? AND user = ?
                ORDER BY created_at DESC LIMIT ?)
            """
        ).bind(.text(app), .text(user), .text(app), .text(user), .int(Int64(keep))).run()
    }

    func deleteUser(app: String, user: String) throws(StoreError) -> Int {
        try db.statement("DELETE FROM devices WHERE app = ? AND user = ?").bind(.text(app), .text(user)).run()
        let removed = db.changes
        try db.statement("DELETE FROM tombstones WHERE app = ? AND user = ?").bind(.text(app), .text(user)).run()
        try db.statement(
            "DELETE FROM deliveries WHERE user = ? AND message_id IN (SELECT message_id FROM messages WHERE app = ?)"
        ).bind(.text(user), .text(app)).run()
        return removed
    }

    func setDevice(
        app: String, user: String, deviceID: String, name: String?, enabled: Bool?
    ) throws(StoreError)
        -> Int
    {
        try db.statement(
            """
            UPDATE devices SET name = COALESCE(?, name), enabled = COALESCE(?, enabled)
            WHERE app = ? AND user = ? AND device_id = ?
            """
        ).bind(
            .optional(name), enabled.map { StoreValue.int($0 ? 1 : 0) } ?? .null, .text(app), .text(user),
            .text(deviceID)
        ).run()
        return db.changes
    }

    func applyPreferences(deviceID: String, _ changes: PreferenceChanges) throws(StoreError) -> StoredPreferences? {
        let c = changes.columns
        let stmt = try db.statement(
            """
            UPDATE devices SET time_zone = CASE WHEN ? THEN time_zone ELSE ? END,
                quiet_hours = CASE WHEN ? THEN quiet_hours ELSE ? END, topics = CASE WHEN ? THEN topics ELSE ? END
            WHERE device_id = ? RETURNING time_zone, quiet_hours, topics
            """)
        try stmt.bind(
            .int(c[0].keep ? 1 : 0), .optional(c[0].value), .int(c[1].keep ? 1 : 0), .optional(c[1].value),
            .int(c[2].keep ? 1 : 0), .optional(c[2].value), .text(deviceID))
        defer { stmt.reset() }
        guard try stmt.step() else { return nil }
        return StoredPreferences(
            timeZone: stmt.optionalText(0), quietHours: stmt.optionalText(1), topics: stmt.optionalText(2))
    }

    func list(app: String, user: String) throws -> [DeviceSummary] {
        let stmt = try db.statement(
            """
            SELECT \(DeviceSummary.listColumns) FROM devices WHERE app = ? AND user = ? AND activity_role IS NULL
            ORDER BY registered_seq DESC
            """)
        try stmt.bind(.text(app), .text(user))
        var out: [DeviceSummary] = []
        while try stmt.step() { out.append(try DeviceSummary(listed: SQLiteRow(stmt))) }
        return out
    }

    /// The user `deviceID` belongs to in `app`, or nil.
    func deviceOwner(app: String, deviceID: String) throws(StoreError) -> String? {
        let stmt = try db.statement(
            "SELECT user FROM devices WHERE app = ? AND device_id = ? AND activity_role IS NULL"
        ).bind(.text(app), .text(deviceID))
        return try stmt.step() ? stmt.text(0) : nil
    }

    /// Reads the schema and one row of the devices' table: that the file
    /// answers, at the cost of a few pages whatever the registry's size.
    func probe() throws(StoreError) {
        let stmt = try db.statement("SELECT 1 FROM devices LIMIT 1")
        defer { stmt.reset() }
        _ = try stmt.step()
    }

    /// Devices per platform, for `system.stats`.
    func deviceCounts() throws(StoreError) -> [Platform: Int] {
        let stmt = try db.statement("SELECT platform, count(*) FROM devices GROUP BY platform")
        var out: [Platform: Int] = [:]
        while try stmt.step() {
            if let p = Platform(rawValue: stmt.text(0)) { out[p] = Int(stmt.int64(1)) }
        }
        return out
    }

    /// Devices per app and platform, for the figures of a peer that may call only some apps.
    func deviceCountsByApp() throws(StoreError) -> [String: [Platform: Int]] {
        let stmt = try db.statement("SELECT app, platform, count(*) FROM devices GROUP BY app, platform")
        var out: [String: [Platform: Int]] = [:]
        while try stmt.step() {
            if let p = Platform(rawValue: stmt.text(1)) { out[stmt.text(0), default: [:]][p] = Int(stmt.int64(2)) }
        }
        return out
    }

    /// Web Push subscriptions (Web Push-form registrations of any platform)
    /// per app and recorded VAPID key (nil: not recorded), for `system.stats`.
    func webSubscriptionsByKey() throws(StoreError) -> [ServerKeyCount] {
        let stmt = try db.statement(
            "SELECT app, server_key, count(*) FROM devices WHERE keys_sealed IS NOT NULL GROUP BY app, server_key")
        var out: [ServerKeyCount] = []
        while try stmt.step() {
            out.append(ServerKeyCount(app: stmt.text(0), serverKey: stmt.optionalText(1), count: Int(stmt.int64(2))))
        }
        return out
    }

    /// Records `key` on the app's Web Push devices that record none (those
    /// registered before Herald recorded keys); answers how many.
    func recordServerKey(app: String, key: String) throws(StoreError) -> Int {
        try db.statement(
            "UPDATE devices SET server_key = ? WHERE app = ? AND keys_sealed IS NOT NULL AND server_key IS NULL"
        )
        .bind(.text(key), .text(app)).run()
        return db.changes
    }

    /// Drops tombstones older than their lifetime.
    func expireTombstones(now: Int64) throws(StoreError) {
        try db.statement("DELETE FROM tombstones WHERE created_at < ?").bind(
            .int(now - RegistryLimits.tombstoneLifetimeMs)
        ).run()
    }

    // MARK: Live Activity tokens

    func activityParent(app: String, user: String, deviceID: String) throws(StoreError) -> ActivityParent? {
        let stmt = try db.statement(
            """
            SELECT platform, environment, bundle_id, app_id FROM devices
            WHERE app = ? AND user = ? AND device_id = ? AND activity_role IS NULL
            """
        ).bind(.text(app), .text(user), .text(deviceID))
        guard try stmt.step(), let platform = Platform(rawValue: stmt.text(0)) else { return nil }
        return ActivityParent(
            platform: platform, environment: stmt.optionalText(1).flatMap(APNsEnvironment.init(rawValue:)),
            bundleID: stmt.optionalText(2), appID: stmt.optionalText(3) ?? ClientBuild.defaultAppID)
    }

    func putActivityToken(_ r: ActivityTokenRow, now: Int64) throws(StoreError) -> Bool {
        try db.statement("DELETE FROM devices WHERE device_id = ? AND activity_role IS NOT NULL").bind(.text(r.id))
            .run()
        let replaced = db.changes > 0
        // The same token bound to another row (another activity's, say): it is this one's now.
        try db.statement("DELETE FROM devices WHERE binding_hash = ? AND activity_role IS NOT NULL")
            .bind(.blob(r.bindingHash)).run()
        try db.statement(
            """
            INSERT INTO devices (device_id, app, user, platform, environment, binding_hash, token_hash,
                token_sealed, created_at, registered_at, registered_seq, bundle_id, app_id,
                parent_device_id, activity_role, activity_type, activity_id)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            """
        ).bind(
            .text(r.id), .text(r.app), .text(r.user), .text(Platform.apnsLiveActivity.rawValue),
            .optional(r.environment?.rawValue), .blob(r.bindingHash), .text(r.tokenHash), .blob(r.tokenSealed),
            .int(now), .int(now), .int(nextSequence()), .optional(r.bundleID), .text(r.appID),
            .text(r.parentDeviceID), .text(r.role.rawValue), .optional(r.activityType), .optional(r.activityID)
        ).run()
        return replaced
    }

    func activityTokenIDs(parentDeviceID: String, role: ActivityRole) throws(StoreError) -> [String] {
        let stmt = try db.statement(
            """
            SELECT device_id FROM devices WHERE parent_device_id = ? AND activity_role = ?
            ORDER BY registered_seq DESC
            """
        ).bind(.text(parentDeviceID), .text(role.rawValue))
        var out: [String] = []
        while try stmt.step() { out.append(stmt.text(0)) }
        return out
    }

    func deleteActivityTokens(ids: [String]) throws(StoreError) -> Int {
        var n = 0
        for id in ids {
            try db.statement("DELETE FROM devices WHERE device_id = ? AND activity_role IS NOT NULL")
                .bind(.text(id)).run()
            n += db.changes
        }
        return n
    }

    func deleteActivityTokens(app: String, user: String, _ selector: ActivitySelector) throws(StoreError) -> Int {
        switch selector {
        case .activity(let id):
            try db.statement(
                "DELETE FROM devices WHERE app = ? AND user = ? AND activity_role = 'update' AND activity_id = ?"
            ).bind(.text(app), .text(user), .text(id)).run()
        case .pushToStart(let deviceID, let type):
            try db.statement(
                """
                DELETE FROM devices WHERE app = ? AND user = ? AND parent_device_id = ? AND activity_role = 'start'
                    AND activity_type = ?
                """
            ).bind(.text(app), .text(user), .text(deviceID), .text(type)).run()
        }
        return db.changes
    }

    // MARK: Broadcast channels

    func putChannel(_ r: ChannelRow, now: Int64) throws {
        let count = try db.statement("SELECT count(*) FROM devices WHERE app = ? AND activity_role = 'channel'")
            .bind(.text(r.app))
        if try count.step(), count.int64(0) >= Int64(ChannelLimits.perApp) { throw ChannelLimitReached() }
        try db.statement("DELETE FROM devices WHERE device_id = ?").bind(.text(r.rowID)).run()
        try db.statement(
            """
            INSERT INTO devices (device_id, app, user, platform, environment, binding_hash, token_hash,
                token_sealed, created_at, registered_at, registered_seq, bundle_id, activity_role, activity_type,
                activity_id)
            VALUES (?, ?, '', ?, ?, ?, ?, ?, ?, ?, ?, ?, 'channel', ?, ?)
            """
        ).bind(
            .text(r.rowID), .text(r.app), .text(Platform.apnsChannel.rawValue), .text(r.environment.rawValue),
            .blob(r.bindingHash), .text(r.tokenHash), .blob(r.tokenSealed), .int(now), .int(now),
            .int(nextSequence()), .text(r.bundleID), .text(r.storesLatest ? "latest" : "none"), .text(r.channelID)
        ).run()
    }

    func channels(app: String, channelID: String?) throws(StoreError) -> [ChannelRecord] {
        let stmt = try db.statement(
            """
            SELECT activity_id, device_id, bundle_id, environment, activity_type, created_at FROM devices
            WHERE app = ? AND activity_role = 'channel' AND (? IS NULL OR activity_id = ?)
            ORDER BY registered_seq DESC
            """
        ).bind(.text(app), .optional(channelID), .optional(channelID))
        var out: [ChannelRecord] = []
        while try stmt.step() {
            out.append(
                ChannelRecord(
                    channelID: stmt.text(0), rowID: stmt.text(1), bundleID: stmt.optionalText(2),
                    environment: stmt.optionalText(3).flatMap(APNsEnvironment.init(rawValue:)),
                    storesLatest: stmt.optionalText(4) == "latest", createdAt: stmt.int64(5)))
        }
        return out
    }

    func deleteChannel(app: String, channelID: String) throws(StoreError) -> Bool {
        try db.statement("DELETE FROM devices WHERE app = ? AND activity_role = 'channel' AND activity_id = ?")
            .bind(.text(app), .text(channelID)).run()
        return db.changes > 0
    }

    func activityTokens(app: String, user: String) throws(StoreError) -> [ActivityTokenSummary] {
        let stmt = try db.statement(
            """
            SELECT device_id, parent_device_id, activity_role, activity_type, activity_id, token_hash, environment,
                registered_at
            FROM devices WHERE app = ? AND user = ? AND activity_role IS NOT NULL ORDER BY registered_seq DESC
            """
        ).bind(.text(app), .text(user))
        var out: [ActivityTokenSummary] = []
        while try stmt.step() {
            guard let role = ActivityRole(rawValue: stmt.text(2)) else { continue }
            out.append(
                ActivityTokenSummary(
                    tokenID: stmt.text(0), deviceID: stmt.optionalText(1) ?? "", role: role,
                    activityType: stmt.optionalText(3), activityID: stmt.optionalText(4), tokenHash: stmt.text(5),
                    environment: stmt.optionalText(6).flatMap(APNsEnvironment.init(rawValue:)),
                    registeredAt: stmt.int64(7)))
        }
        return out
    }
}
