import HeraldCore
import HeraldCrypto

/// The device registry on one SQLite connection. Not thread-safe: the
/// `SQLiteStore` runs it on its own thread, inside its transactions.
final class Registry {
    private let db: Database
    private let key: StoreKey

    static let tombstoneBound = 1024
    static let tombstoneLifetimeMs: Int64 = 30 * 24 * 3600 * 1000

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

    private static let rowColumns = "device_id, user, binding_hash, version"

    private func row(_ stmt: Statement) -> BindingRow {
        BindingRow(
            deviceID: stmt.text(0), user: stmt.text(1), bindingHash: stmt.blob(2), version: stmt.optionalInt64(3))
    }

    private func findByBinding(_ hash: [UInt8]) throws(StoreError) -> BindingRow? {
        let stmt = try db.statement("SELECT \(Self.rowColumns) FROM devices WHERE binding_hash = ?")
        try stmt.bind(.blob(hash))
        return try stmt.step() ? row(stmt) : nil
    }

    private func findByRegistration(app: String, user: String, id: String) throws(StoreError) -> BindingRow? {
        let stmt = try db.statement(
            "SELECT \(Self.rowColumns) FROM devices WHERE app = ? AND user = ? AND registration_id = ?")
        try stmt.bind(.text(app), .text(user), .text(id))
        return try stmt.step() ? row(stmt) : nil
    }

    private func tombstoneVersion(app: String, user: String, id: String, now: Int64) throws(StoreError) -> Int64? {
        let stmt = try db.statement(
            "SELECT version FROM tombstones WHERE app = ? AND user = ? AND registration_id = ? AND created_at >= ?")
        try stmt.bind(.text(app), .text(user), .text(id), .int(now - Self.tombstoneLifetimeMs))
        return try stmt.step() ? stmt.int64(0) : nil
    }

    private func delete(deviceID: String) throws(StoreError) {
        try db.statement("DELETE FROM devices WHERE device_id = ?").bind(.text(deviceID)).run()
    }

    private func seal(_ r: Registration, deviceID: String) throws(CryptoError) -> (token: [UInt8], keys: StoreValue) {
        let sealed = try DeviceSecrets.seal(r, deviceID: deviceID, key: key)
        return (sealed.token, sealed.keys.map { .blob($0) } ?? .null)
    }

    /// Every rule of `device.register`: ordering by registration version,
    /// in-place refresh, cross-user reclaim, eviction over the cap.
    func register(_ r: Registration, deviceCap: Int, now: Int64) throws -> RegistrationOutcome {
        let binding = Identity.bindingHash(
            app: r.app, platform: r.platform, environment: r.environment, token: r.token, appID: r.appID)
        let tokenHash = Identity.tokenHash(r.token)
        var reclaimed = false

        if let rid = r.registrationID {
            if let version = r.version,
                let tomb = try tombstoneVersion(app: r.app, user: r.user, id: rid, now: now), tomb >= version
            {
                throw RegistrationConflict(
                    storedVersion: tomb, reason: "registration was unregistered at version \(tomb)")
            }
            if let existing = try findByRegistration(app: r.app, user: r.user, id: rid) {
                if let version = r.version, let stored = existing.version {
                    if version < stored {
                        throw RegistrationConflict(storedVersion: stored, reason: "a newer version is registered")
                    }
                    if version == stored && existing.bindingHash != binding {
                        throw RegistrationConflict(
                            storedVersion: stored, reason: "the same version is registered with another token")
                    }
                }
                if existing.bindingHash != binding, let other = try findByBinding(binding) {
                    // The new token belongs to another row: it moves here.
                    reclaimed = other.user != r.user
                    try delete(deviceID: other.deviceID)
                }
                try update(existing.deviceID, with: r, binding: binding, tokenHash: tokenHash, now: now)
                return RegistrationOutcome(
                    deviceID: existing.deviceID, tokenHash: tokenHash, created: false, reclaimed: reclaimed, evicted: []
                )
            }
        }

        if let existing = try findByBinding(binding) {
            if existing.user == r.user {
                // A registration_id given now names the installation: the id follows it.
                let id =
                    r.registrationID.map { Identity.deviceID(user: r.user, app: r.app, registrationID: $0) }
                    ?? existing.deviceID
                try update(existing.deviceID, with: r, binding: binding, tokenHash: tokenHash, now: now, newID: id)
                return RegistrationOutcome(
                    deviceID: id, tokenHash: tokenHash, created: false, reclaimed: false, evicted: [])
            }
            try delete(deviceID: existing.deviceID)
            reclaimed = true
        }

        let deviceID = Identity.deviceID(for: r)
        let sealed = try seal(r, deviceID: deviceID)
        try db.statement(
            """
            INSERT INTO devices (device_id, app, user, platform, environment, binding_hash, token_hash,
                token_sealed, keys_sealed, name, app_version, session_hash, registration_id, version,
                created_at, registered_at, registered_seq, bundle_id, server_key, app_id, user_agent)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            """
        ).bind(
            .text(deviceID), .text(r.app), .text(r.user), .text(r.platform.rawValue),
            .optional(r.environment?.rawValue), .blob(binding), .text(tokenHash), .blob(sealed.token), sealed.keys,
            .optional(r.name), .optional(r.appVersion), r.session.map { .blob(Identity.sessionHash($0)) } ?? .null,
            .optional(r.registrationID), .optional(r.version), .int(now), .int(now), .int(nextSequence()),
            .optional(r.platform.hasEnvironment ? r.bundleID : nil), .optional(Self.serverKey(r)), .text(r.appID),
            .optional(r.userAgent)
        ).run()
        let evicted = try evict(app: r.app, user: r.user, keep: deviceCap)
        return RegistrationOutcome(
            deviceID: deviceID, tokenHash: tokenHash, created: true, reclaimed: reclaimed, evicted: evicted)
    }

    /// The VAPID key a row records: a Web Push registration's, as given
    /// (every refresh writes it again: a subscription made anew may have been
    /// made under another key); NULL for a raw-token (legacy) registration.
    static func serverKey(_ r: Registration) -> String? {
        r.isWebPushForm ? r.serverKey : nil
    }

    /// Refreshes a row in place: the binding and every field the call gives;
    /// a field left out keeps its stored value. Web Push keys always follow
    /// the platform (a move away from web drops them), and so does the VAPID
    /// key the subscription was made with; the bundle id follows the platform
    /// too (a move away from APNs drops it). With `newID` the row
    /// is re-keyed, and its secrets re-sealed under the new id.
    private func update(
        _ deviceID: String, with r: Registration, binding: [UInt8], tokenHash: String, now: Int64,
        newID: String? = nil
    ) throws {
        let id = newID ?? deviceID
        let sealed = try seal(r, deviceID: id)
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
            .text(id), .text(r.platform.rawValue), .optional(r.environment?.rawValue), .blob(binding),
            .text(tokenHash), .blob(sealed.token), sealed.keys, .optional(r.name), .optional(r.appVersion),
            r.session.map { .blob(Identity.sessionHash($0)) } ?? .null, .optional(r.registrationID),
            .optional(r.version), .int(now), .int(nextSequence()), .int(r.platform.hasEnvironment ? 1 : 0),
            .optional(r.bundleID), .optional(Self.serverKey(r)), .text(r.appID), .optional(r.userAgent),
            .text(deviceID)
        ).run()
    }

    /// Deletes the least recently registered devices beyond the cap.
    private func evict(app: String, user: String, keep: Int) throws(StoreError) -> [String] {
        let stmt = try db.statement(
            """
            SELECT device_id FROM devices WHERE app = ? AND user = ?
            ORDER BY registered_seq DESC LIMIT -1 OFFSET ?
            """)
        try stmt.bind(.text(app), .text(user), .int(Int64(keep)))
        var evicted: [String] = []
        while try stmt.step() { evicted.append(stmt.text(0)) }
        for id in evicted { try delete(deviceID: id) }
        return evicted
    }

    /// Deletes the named device(s) of this user only; returns how many.
    func unregister(app: String, user: String, _ selector: UnregisterSelector, now: Int64) throws(StoreError) -> Int {
        switch selector {
        case .deviceID(let id):
            try db.statement("DELETE FROM devices WHERE app = ? AND user = ? AND device_id = ?")
                .bind(.text(app), .text(user), .text(id)).run()
            return db.changes
        case .binding(let platform, let environment, let token, let appID):
            let hash = Identity.bindingHash(
                app: app, platform: platform, environment: environment, token: token, appID: appID)
            try db.statement("DELETE FROM devices WHERE binding_hash = ? AND user = ?")
                .bind(.blob(hash), .text(user)).run()
            return db.changes
        case .registration(let id, let version):
            try db.statement(
                """
                INSERT INTO tombstones (app, user, registration_id, version, created_at) VALUES (?, ?, ?, ?, ?)
                ON CONFLICT (app, user, registration_id) DO UPDATE SET
                    version = max(version, excluded.version), created_at = excluded.created_at
                """
            ).bind(.text(app), .text(user), .text(id), .int(version), .int(now)).run()
            try db.statement(
                """
                DELETE FROM tombstones WHERE app = ? AND user = ? AND rowid NOT IN (
                    SELECT rowid FROM tombstones WHERE app = ? AND user = ?
                    ORDER BY created_at DESC LIMIT ?)
                """
            ).bind(.text(app), .text(user), .text(app), .text(user), .int(Int64(Self.tombstoneBound))).run()
            try db.statement(
                "DELETE FROM devices WHERE app = ? AND user = ? AND registration_id = ? AND (version IS NULL OR version <= ?)"
            ).bind(.text(app), .text(user), .text(id), .int(version)).run()
            return db.changes
        }
    }

    func endSession(app: String, user: String, session: String) throws(StoreError) -> Int {
        try db.statement("DELETE FROM devices WHERE app = ? AND user = ? AND session_hash = ?")
            .bind(.text(app), .text(user), .blob(Identity.sessionHash(session))).run()
        return db.changes
    }

    func forget(app: String, user: String) throws(StoreError) -> Int {
        try db.statement("DELETE FROM devices WHERE app = ? AND user = ?").bind(.text(app), .text(user)).run()
        let removed = db.changes
        try db.statement("DELETE FROM tombstones WHERE app = ? AND user = ?").bind(.text(app), .text(user)).run()
        try db.statement(
            "DELETE FROM deliveries WHERE user = ? AND message_id IN (SELECT message_id FROM messages WHERE app = ?)"
        ).bind(.text(user), .text(app)).run()
        return removed
    }

    func list(app: String, user: String) throws(StoreError) -> [DeviceSummary] {
        let stmt = try db.statement(
            """
            SELECT device_id, platform, environment, name, app_version, token_hash, created_at, registered_at,
                last_success_at, last_failure_at, last_failure_reason, bundle_id, enabled, app_id, user_agent,
                keys_sealed IS NOT NULL
            FROM devices WHERE app = ? AND user = ? ORDER BY registered_seq DESC
            """)
        try stmt.bind(.text(app), .text(user))
        var out: [DeviceSummary] = []
        while try stmt.step() {
            out.append(
                DeviceSummary(
                    deviceID: stmt.text(0), platform: Platform(rawValue: stmt.text(1)) ?? .apns,
                    environment: stmt.optionalText(2).flatMap(APNsEnvironment.init(rawValue:)),
                    name: stmt.optionalText(3), appVersion: stmt.optionalText(4), tokenHash: stmt.text(5),
                    createdAt: stmt.int64(6), registeredAt: stmt.int64(7), lastSuccessAt: stmt.optionalInt64(8),
                    lastFailureAt: stmt.optionalInt64(9), lastFailureReason: stmt.optionalText(10),
                    bundleID: stmt.optionalText(11), enabled: stmt.int64(12) != 0, appID: stmt.text(13),
                    userAgent: stmt.optionalText(14), webPushForm: stmt.int64(15) != 0))
        }
        return out
    }

    /// `device.update`: the name and/or the enabled flag of this user's
    /// device (nil keeps the stored value). The registration itself (token,
    /// `registered_at`, the eviction order) stays as it is. nil when the user
    /// has no such device in the app.
    func updateDevice(
        app: String, user: String, deviceID: String, name: String?, enabled: Bool?
    ) throws(StoreError) -> DeviceSummary? {
        try db.statement(
            """
            UPDATE devices SET name = COALESCE(?, name), enabled = COALESCE(?, enabled)
            WHERE app = ? AND user = ? AND device_id = ?
            """
        ).bind(
            .optional(name), enabled.map { StoreValue.int($0 ? 1 : 0) } ?? .null, .text(app), .text(user),
            .text(deviceID)
        ).run()
        guard db.changes > 0 else { return nil }
        // As device.list shows it (a user has at most device_cap devices).
        return try list(app: app, user: user).first { $0.deviceID == deviceID }
    }

    /// The user `deviceID` belongs to in `app`, or nil.
    func deviceOwner(app: String, deviceID: String) throws(StoreError) -> String? {
        let stmt = try db.statement("SELECT user FROM devices WHERE app = ? AND device_id = ?")
            .bind(.text(app), .text(deviceID))
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
        try db.statement("DELETE FROM tombstones WHERE created_at < ?").bind(.int(now - Self.tombstoneLifetimeMs)).run()
    }
}
