import HeraldCore
import HeraldCrypto

/// A registration's row as both backends write it: the device id it gets,
/// its hashes, its secrets sealed for that id, and the fields the call gave
/// (nil: not given).
struct DeviceFields {
    let deviceID: String
    let registration: Registration
    let bindingHash: [UInt8]
    let tokenHash: String
    let tokenSealed: [UInt8]
    let keysSealed: [UInt8]?

    init(_ r: Registration, deviceID: String, bindingHash: [UInt8], tokenHash: String, key: StoreKey) throws {
        let sealed = try DeviceSecrets.seal(r, deviceID: deviceID, key: key)
        self.deviceID = deviceID
        registration = r
        self.bindingHash = bindingHash
        self.tokenHash = tokenHash
        tokenSealed = sealed.token
        keysSealed = sealed.keys
    }

    var sessionHash: [UInt8]? { registration.session.map(Identity.sessionHash) }

    /// Whether the platform has an environment (APNs): only then does a row
    /// keep a bundle id; a refresh to another platform drops it.
    var keepsBundleID: Bool { registration.platform.hasEnvironment }

    /// The VAPID key the row records: a Web Push registration's, as given
    /// (every refresh writes it again: a subscription made anew may have been
    /// made under another key); nil for a raw-token (legacy) registration.
    var serverKey: String? { registration.isWebPushForm ? registration.serverKey : nil }
}

/// The statements the registry's rules run, inside the caller's
/// transaction: one conformance per backend, with its SQL and its locks.
/// The rules themselves (``register(_:deviceCap:now:)`` and the rest) are
/// written once, in the extension below.
protocol RegistryStatements: EventStatements {
    var key: StoreKey { get }

    /// Orders one user's writes against another instance's (PostgreSQL: a
    /// transaction-scoped advisory lock; SQLite's one writer needs none).
    func lockUser(app: String, user: String) throws
    /// The version a registration was unregistered at, if it was since `since`.
    func tombstoneVersion(app: String, user: String, registrationID: String, since: Int64) throws -> Int64?
    func device(app: String, user: String, registrationID: String) throws -> BindingRow?
    func device(binding: [UInt8]) throws -> BindingRow?
    /// Deletes `row`. A backend where another writer may have changed it
    /// since it was read deletes it as read, or throws
    /// ``RegistrationRaceLost``.
    func delete(_ row: BindingRow) throws
    /// Inserts a new device, last in the user's recency order.
    func insert(_ device: DeviceFields, now: Int64) throws
    /// Rewrites `row` (as read, like ``delete(_:)``) with `device`, last in
    /// the user's recency order: the binding, secrets and platform always; a
    /// field the call left out (name, app version, session, registration
    /// id and version, user agent) keeps its stored value; the bundle id
    /// only on a platform with an environment.
    func refresh(_ row: BindingRow, to device: DeviceFields, now: Int64) throws
    /// Deletes the user's least recently registered devices beyond `keep`;
    /// their ids and platforms, newest first.
    func evict(app: String, user: String, keep: Int) throws -> [(String, String)]

    func deleteDevice(app: String, user: String, deviceID: String) throws -> Int
    func deleteDevices(binding: [UInt8], user: String) throws -> Int
    func deleteDevices(app: String, user: String, sessionHash: [UInt8]) throws -> Int
    /// Deletes the registration's devices registered at `version` or
    /// before, or with no version.
    func deleteDevices(app: String, user: String, registrationID: String, upTo version: Int64) throws -> Int
    /// Records that a registration was unregistered at `version`, keeping
    /// the larger of two versions.
    func keepTombstone(app: String, user: String, registrationID: String, version: Int64, now: Int64) throws
    /// Deletes the user's tombstones beyond the newest `keep`.
    func trimTombstones(app: String, user: String, keep: Int) throws
    /// Deletes everything of the user: devices (how many), tombstones and deliveries.
    func deleteUser(app: String, user: String) throws -> Int
    /// Sets a device's name and enabled flag (nil keeps it); how many rows changed.
    func setDevice(app: String, user: String, deviceID: String, name: String?, enabled: Bool?) throws -> Int
    /// Applies `changes` to the device's time zone, quiet hours and topics
    /// (``PreferenceChanges/columns``); answers them as they now stand, or
    /// nil when there is no such device.
    func applyPreferences(deviceID: String, _ changes: PreferenceChanges) throws -> StoredPreferences?
    /// The user's devices, most recently registered first.
    func list(app: String, user: String) throws -> [DeviceSummary]
    /// The user `deviceID` belongs to in `app`, or nil.
    func deviceOwner(app: String, deviceID: String) throws -> String?
    /// Devices per platform.
    func deviceCounts() throws -> [Platform: Int]
    /// Devices per app and platform, for the figures of a peer that may call only some apps.
    func deviceCountsByApp() throws -> [String: [Platform: Int]]
    /// Web Push subscriptions (Web Push-form registrations of any platform)
    /// per app and recorded VAPID key (nil: not recorded).
    func webSubscriptionsByKey() throws -> [ServerKeyCount]
    /// Records `key` on the app's Web Push devices that record none (those
    /// registered before Herald recorded keys); answers how many.
    func recordServerKey(app: String, key: String) throws -> Int

    // Live Activity tokens (``ActivityRules``): rows of `devices` with a role.
    /// The user's ordinary device `deviceID` (no activity role), or nil.
    func activityParent(app: String, user: String, deviceID: String) throws -> ActivityParent?
    /// Writes a token row, replacing the row with its id and any row bound
    /// to the same token; whether one with its id was there.
    func putActivityToken(_ row: ActivityTokenRow, now: Int64) throws -> Bool
    /// A device's tokens of `role`, newest first.
    func activityTokenIDs(parentDeviceID: String, role: ActivityRole) throws -> [String]
    /// Deletes token rows by id; how many.
    func deleteActivityTokens(ids: [String]) throws -> Int
    /// Deletes the user's tokens the selector names; how many.
    func deleteActivityTokens(app: String, user: String, _ selector: ActivitySelector) throws -> Int
    /// The user's Live Activity tokens, newest first.
    func activityTokens(app: String, user: String) throws -> [ActivityTokenSummary]

    // Broadcast channels (``ChannelRecord``): rows of `devices` with role `channel`, of no user.
    /// Writes a channel's row (its id sealed as the row's token).
    func putChannel(_ row: ChannelRow, now: Int64) throws
    /// The app's channels, newest first (nil `channelID`: all).
    func channels(app: String, channelID: String?) throws -> [ChannelRecord]
    /// Deletes the app's channel row; whether there was one.
    func deleteChannel(app: String, channelID: String) throws -> Bool
}

/// The registry's rules, for every backend.
extension RegistryStatements {
    /// Every rule of `device.register`: ordering by registration version,
    /// in-place refresh, cross-user reclaim, eviction over the cap.
    func register(_ r: Registration, deviceCap: Int, now: Int64) throws -> RegistrationOutcome {
        try lockUser(app: r.app, user: r.user)
        let binding = Identity.bindingHash(
            app: r.app, platform: r.platform, environment: r.environment, token: r.token, appID: r.appID)
        let tokenHash = Identity.tokenHash(r.token)
        func fields(_ deviceID: String) throws -> DeviceFields {
            try DeviceFields(r, deviceID: deviceID, bindingHash: binding, tokenHash: tokenHash, key: key)
        }
        var reclaimed = false

        if let rid = r.registrationID {
            if let version = r.version,
                let tomb = try tombstoneVersion(
                    app: r.app, user: r.user, registrationID: rid, since: now - RegistryLimits.tombstoneLifetimeMs),
                tomb >= version
            {
                throw RegistrationConflict(
                    storedVersion: tomb, reason: "registration was unregistered at version \(tomb)")
            }
            if let existing = try device(app: r.app, user: r.user, registrationID: rid) {
                if let version = r.version, let stored = existing.version {
                    if version < stored {
                        throw RegistrationConflict(storedVersion: stored, reason: "a newer version is registered")
                    }
                    if version == stored && existing.bindingHash != binding {
                        throw RegistrationConflict(
                            storedVersion: stored, reason: "the same version is registered with another token")
                    }
                }
                if existing.bindingHash != binding, let other = try device(binding: binding) {
                    // The new token belongs to another row: it moves here.
                    reclaimed = other.user != r.user
                    try delete(other)
                    if reclaimed { try noteReclaimed(other, r, now: now) }
                }
                try refresh(existing, to: try fields(existing.deviceID), now: now)
                try settlePreferences(existing.deviceID, r.preferences)
                return RegistrationOutcome(
                    deviceID: existing.deviceID, tokenHash: tokenHash, created: false, reclaimed: reclaimed, evicted: []
                )
            }
        }

        if let existing = try device(binding: binding) {
            if existing.user == r.user {
                // A registration_id given now names the installation: the id follows it.
                let id =
                    r.registrationID.map { Identity.deviceID(user: r.user, app: r.app, registrationID: $0) }
                    ?? existing.deviceID
                try refresh(existing, to: try fields(id), now: now)
                try settlePreferences(id, r.preferences)
                return RegistrationOutcome(
                    deviceID: id, tokenHash: tokenHash, created: false, reclaimed: false, evicted: [])
            }
            try delete(existing)
            reclaimed = true
            try noteReclaimed(existing, r, now: now)
        }

        let deviceID = Identity.deviceID(for: r)
        try insert(try fields(deviceID), now: now)
        try settlePreferences(deviceID, r.preferences)
        let evicted = try evict(app: r.app, user: r.user, keep: deviceCap)
        try noteRemoved(app: r.app, user: r.user, ids: evicted, reason: .cap, now: now)
        return RegistrationOutcome(
            deviceID: deviceID, tokenHash: tokenHash, created: true, reclaimed: reclaimed, evicted: evicted.map(\.0))
    }

    /// Writes a call's preference changes on the device, and refuses (with
    /// ``PreferenceConflict``, undoing the call) quiet hours left without a
    /// time zone to read them in.
    private func settlePreferences(_ deviceID: String, _ changes: PreferenceChanges) throws {
        guard !changes.isEmpty, let stored = try applyPreferences(deviceID: deviceID, changes) else { return }
        if stored.quietHours != nil && stored.timeZone == nil {
            throw PreferenceConflict(
                field: changes.quietHours.isKeep ? "time_zone" : "quiet_hours",
                reason: "quiet hours need the device's time_zone (give both, or keep the time zone)")
        }
    }

    /// Another user's device whose token registered here is gone from them.
    private func noteReclaimed(_ row: BindingRow, _ r: Registration, now: Int64) throws {
        // The binding includes the platform: the row's is the registration's.
        try noteRemoved(
            app: r.app, [RemovedDevice(deviceID: row.deviceID, user: row.user, platform: r.platform.rawValue)],
            reason: .reclaimed, now: now)
    }

    /// Deletes the named device(s) of this user only; returns how many. By
    /// registration, a tombstone keeps the version, so that a registration
    /// of that version or older arriving late is refused.
    func unregister(app: String, user: String, _ selector: UnregisterSelector, now: Int64) throws -> Int {
        try lockUser(app: app, user: user)
        switch selector {
        case .deviceID(let id):
            return try deleteDevice(app: app, user: user, deviceID: id)
        case .binding(let platform, let environment, let token, let appID):
            let hash = Identity.bindingHash(
                app: app, platform: platform, environment: environment, token: token, appID: appID)
            return try deleteDevices(binding: hash, user: user)
        case .registration(let id, let version):
            try keepTombstone(app: app, user: user, registrationID: id, version: version, now: now)
            try trimTombstones(app: app, user: user, keep: RegistryLimits.tombstoneBound)
            return try deleteDevices(app: app, user: user, registrationID: id, upTo: version)
        }
    }

    func endSession(app: String, user: String, session: String) throws -> Int {
        try lockUser(app: app, user: user)
        return try deleteDevices(app: app, user: user, sessionHash: Identity.sessionHash(session))
    }

    func forget(app: String, user: String, now: Int64) throws -> Int {
        try lockUser(app: app, user: user)
        let devices = try list(app: app, user: user)
        try noteRemoved(
            app: app, user: user, ids: devices.map { ($0.deviceID, $0.platform.rawValue) }, reason: .forget, now: now)
        return try deleteUser(app: app, user: user)
    }

    /// `device.update`: the name and/or the enabled flag of this user's
    /// device (nil keeps the stored value), and its preferences as
    /// `preferences` changes them. The registration itself (token,
    /// `registered_at`, the eviction order) stays as it is. nil when the user
    /// has no such device in the app.
    func updateDevice(
        app: String, user: String, deviceID: String, name: String?, enabled: Bool?,
        preferences: PreferenceChanges = PreferenceChanges()
    ) throws -> DeviceSummary? {
        try lockUser(app: app, user: user)
        guard try setDevice(app: app, user: user, deviceID: deviceID, name: name, enabled: enabled) > 0 else {
            return nil
        }
        try settlePreferences(deviceID, preferences)
        // As device.list shows it (a user has at most device_cap devices).
        return try list(app: app, user: user).first { $0.deviceID == deviceID }
    }
}

/// The registry's bounds, the same on every backend.
enum RegistryLimits {
    /// Tombstones kept per user, newest first.
    static let tombstoneBound = 1024
    /// How long a tombstone refuses a late registration.
    static let tombstoneLifetimeMs: Int64 = 30 * 24 * 3600 * 1000
}

extension PreferenceChanges {
    /// Per column (`time_zone`, `quiet_hours`, `topics`): whether the stored
    /// value stays, and otherwise the value written (nil: cleared).
    var columns: [(keep: Bool, value: String?)] {
        func column<V>(_ c: PreferenceChange<V>, _ text: (V) -> String) -> (keep: Bool, value: String?) {
            switch c {
            case .keep: (true, nil)
            case .clear: (false, nil)
            case .set(let v): (false, text(v))
            }
        }
        return [
            column(timeZone) { $0 }, column(quietHours) { $0.stored }, column(topics, StoredPreferences.topicsText),
        ]
    }
}

extension DeviceSummary {
    /// The columns a device list reads, in the order ``init(listed:)`` reads them.
    static let listColumns = """
        device_id, platform, environment, name, app_version, token_hash, created_at, registered_at,
            last_success_at, last_failure_at, last_failure_reason, bundle_id, enabled, app_id, user_agent,
            keys_sealed IS NOT NULL, time_zone, quiet_hours, topics
        """

    /// A row of ``listColumns``.
    init(listed r: some StoreRow) throws {
        self.init(
            deviceID: try r.text(0), platform: Platform(rawValue: try r.text(1)) ?? .apns,
            environment: try r.optionalText(2).flatMap(APNsEnvironment.init(rawValue:)),
            name: try r.optionalClientText(3), appVersion: try r.optionalClientText(4), tokenHash: try r.text(5),
            createdAt: try r.int64(6), registeredAt: try r.int64(7), lastSuccessAt: try r.optionalInt64(8),
            lastFailureAt: try r.optionalInt64(9), lastFailureReason: try r.optionalText(10),
            bundleID: try r.optionalText(11), enabled: try r.flag(12), appID: try r.clientText(13),
            userAgent: try r.optionalClientText(14), webPushForm: try r.flag(15))
        preferences =
            StoredPreferences(
                timeZone: try r.optionalText(16), quietHours: try r.optionalText(17), topics: try r.optionalText(18)
            ).preferences
    }
}

extension BindingRow {
    /// The columns ``init(read:)`` reads, but for the user's column, whose name differs by backend.
    static func columns(user: String) -> String { "device_id, \(user), binding_hash, version" }

    init(read r: some StoreRow) throws {
        self.init(
            deviceID: try r.text(0), user: try r.clientText(1), bindingHash: try r.bytes(2),
            version: try r.optionalInt64(3))
    }
}

/// The keys that order a store's calls: the calls about one user (or one
/// message) run in the order they came, each seeing the one before.
enum StoreFences {
    static func user(app: String, user: String) -> String { "u\u{1F}\(app)\u{1F}\(user)" }
    static func message(_ messageID: String) -> String { "m\u{1F}\(messageID)" }
}

/// A store whose registry follows ``RegistryStatements``' rules: how it
/// runs one registry job. The ``DeviceRegistry`` calls are written once, in
/// the extension below, for every backend.
protocol RegistryHost: DeviceRegistry {
    associatedtype Rows: RegistryStatements

    /// Runs `work` in a write transaction, in order with the calls of the
    /// same `fence`; `durable` ones are committed before they are answered.
    func writeRows<T>(
        durable: Bool, fence: String?, _ work: @escaping @Sendable (Rows, Int64) throws -> T,
        _ completion: @escaping @Sendable (Result<T, any Error>) -> Void)

    /// Runs `work` as a read, after the writes of the same `fence`; figures
    /// for `system.stats` go where the backend keeps them off the write path.
    func readRows<T>(
        fence: String?, figures: Bool, _ work: @escaping @Sendable (Rows) throws -> T,
        _ completion: @escaping @Sendable (Result<T, any Error>) -> Void)
}

extension RegistryHost {
    public func register(
        _ registration: Registration, deviceCap: Int,
        completion: @escaping @Sendable (Result<RegistrationOutcome, any Error>) -> Void
    ) {
        writeRows(
            durable: true, fence: StoreFences.user(app: registration.app, user: registration.user),
            { rows, now in try rows.register(registration, deviceCap: deviceCap, now: now) }, completion)
    }

    public func unregister(
        app: String, user: String, _ selector: UnregisterSelector,
        completion: @escaping @Sendable (Result<Int, any Error>) -> Void
    ) {
        writeRows(
            durable: true, fence: StoreFences.user(app: app, user: user),
            { rows, now in try rows.unregister(app: app, user: user, selector, now: now) }, completion)
    }

    public func list(
        app: String, user: String, completion: @escaping @Sendable (Result<[DeviceSummary], any Error>) -> Void
    ) {
        readRows(
            fence: StoreFences.user(app: app, user: user), figures: false,
            { rows in try rows.list(app: app, user: user) }, completion)
    }

    public func endSession(
        app: String, user: String, session: String, completion: @escaping @Sendable (Result<Int, any Error>) -> Void
    ) {
        writeRows(
            durable: true, fence: StoreFences.user(app: app, user: user),
            { rows, _ in try rows.endSession(app: app, user: user, session: session) }, completion)
    }

    public func forget(app: String, user: String, completion: @escaping @Sendable (Result<Int, any Error>) -> Void) {
        writeRows(
            durable: true, fence: StoreFences.user(app: app, user: user),
            { rows, now in try rows.forget(app: app, user: user, now: now) }, completion)
    }

    public func updateDevice(
        app: String, user: String, deviceID: String, name: String?, enabled: Bool?, preferences: PreferenceChanges,
        completion: @escaping @Sendable (Result<DeviceSummary?, any Error>) -> Void
    ) {
        writeRows(
            durable: true, fence: StoreFences.user(app: app, user: user),
            { rows, _ in
                try rows.updateDevice(
                    app: app, user: user, deviceID: deviceID, name: name, enabled: enabled, preferences: preferences)
            }, completion)
    }

    public func deviceOwner(
        app: String, deviceID: String, completion: @escaping @Sendable (Result<String?, any Error>) -> Void
    ) {
        readRows(fence: nil, figures: false, { rows in try rows.deviceOwner(app: app, deviceID: deviceID) }, completion)
    }

    public func recordServerKey(
        app: String, key: String, completion: @escaping @Sendable (Result<Int, any Error>) -> Void
    ) {
        writeRows(durable: true, fence: nil, { rows, _ in try rows.recordServerKey(app: app, key: key) }, completion)
    }

    public func deviceCounts(completion: @escaping @Sendable (Result<[Platform: Int], any Error>) -> Void) {
        readRows(fence: nil, figures: false, { rows in try rows.deviceCounts() }, completion)
    }

    public func deviceCountsByApp(
        completion: @escaping @Sendable (Result<[String: [Platform: Int]], any Error>) -> Void
    ) {
        readRows(fence: nil, figures: true, { rows in try rows.deviceCountsByApp() }, completion)
    }

    public func webSubscriptionsByKey(
        completion: @escaping @Sendable (Result<[ServerKeyCount], any Error>) -> Void
    ) {
        readRows(fence: nil, figures: true, { rows in try rows.webSubscriptionsByKey() }, completion)
    }
}
