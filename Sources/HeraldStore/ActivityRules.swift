public import HeraldCore
import HeraldCrypto
import Postgres

/// One `activity.register` call, validated: a Live Activity token of one
/// of the user's `apns` devices.
public struct ActivityRegistration: Sendable {
    public var app: String
    public var user: String
    /// The device the token came from (an `apns` registration of the user).
    public var deviceID: String
    public var role: ActivityRole
    /// The `ActivityAttributes` type: what a push-to-start token starts,
    /// and the type of a running activity.
    public var activityType: String?
    /// The app's id of a running activity (`update` tokens).
    public var activityID: String?
    /// The hex token ActivityKit gave.
    public var token: String

    public init(
        app: String, user: String, deviceID: String, role: ActivityRole, activityType: String?, activityID: String?,
        token: String
    ) {
        self.app = app
        self.user = user
        self.deviceID = deviceID
        self.role = role
        self.activityType = activityType
        self.activityID = activityID
        self.token = token
    }
}

/// What `activity.register` did.
public struct ActivityOutcome: Sendable, Equatable {
    /// The token's row id (32 hex), stable for the device and the activity
    /// type (start) or the activity id (update).
    public let tokenID: String
    public let tokenHash: String
    /// false when it replaced the token of the same row.
    public let created: Bool
    /// Older tokens of the device let go to stay within ``ActivityLimits/perDevice``.
    public let evicted: [String]
}

/// Which Live Activity tokens `activity.unregister` removes.
public enum ActivitySelector: Sendable, Equatable {
    /// Every update token of the user's activity.
    case activity(String)
    /// The device's push-to-start token of the type.
    case pushToStart(deviceID: String, activityType: String)
}

/// One Live Activity token as `activity.list` shows it (never the token).
public struct ActivityTokenSummary: Sendable, Equatable {
    public let tokenID: String
    public let deviceID: String
    public let role: ActivityRole
    public let activityType: String?
    public let activityID: String?
    public let tokenHash: String
    public let environment: APNsEnvironment?
    public let registeredAt: Int64
}

/// `activity.register` names no `apns` device of the user.
public struct ActivityDeviceRefused: Error, Sendable, Equatable {
    public let reason: String
}

/// Bounds of the Live Activity tokens.
public enum ActivityLimits {
    /// Tokens of one role per device: push-to-start types, or running
    /// activities (the oldest go first).
    public static let perDevice = 32
}

/// What a token row takes from its device.
struct ActivityParent {
    let platform: Platform
    let environment: APNsEnvironment?
    let bundleID: String?
    let appID: String
}

/// One Live Activity token row as written.
struct ActivityTokenRow {
    let id: String
    let app: String
    let user: String
    let parentDeviceID: String
    let role: ActivityRole
    let activityType: String?
    let activityID: String?
    let environment: APNsEnvironment?
    let bindingHash: [UInt8]
    let tokenHash: String
    let tokenSealed: [UInt8]
    let bundleID: String?
    let appID: String
}

extension Identity {
    /// 32 hex chars from the device and what the token is for: one row per
    /// push-to-start type, one per running activity.
    static func activityTokenID(app: String, parentDeviceID: String, role: ActivityRole, name: String) -> String {
        String(
            SHA256.hex(Array("activity\u{0}\(app)\u{0}\(parentDeviceID)\u{0}\(role.rawValue)\u{0}\(name)".utf8))
                .prefix(32))
    }
}

extension RegistryStatements {
    /// `activity.register`: the token replaces the row of the same device
    /// and type (start) or activity (update), and the same token bound
    /// elsewhere; past ``ActivityLimits/perDevice`` the oldest tokens of
    /// the role go.
    func registerActivity(_ r: ActivityRegistration, now: Int64) throws -> ActivityOutcome {
        try lockUser(app: r.app, user: r.user)
        guard let parent = try activityParent(app: r.app, user: r.user, deviceID: r.deviceID) else {
            throw ActivityDeviceRefused(reason: "names no device of the user")
        }
        guard parent.platform == .apns else {
            throw ActivityDeviceRefused(
                reason: "must name an apns device (ActivityKit runs on iOS; this one is \(parent.platform.rawValue))")
        }
        let name = r.role == .start ? r.activityType ?? "" : r.activityID ?? ""
        let id = Identity.activityTokenID(app: r.app, parentDeviceID: r.deviceID, role: r.role, name: name)
        let binding = Identity.bindingHash(
            app: r.app, platform: .apnsLiveActivity, environment: parent.environment, token: r.token,
            appID: parent.appID)
        let tokenHash = Identity.tokenHash(r.token)
        let sealed = try key.seal(Array(r.token.utf8), context: Identity.tokenContext(id))
        let replaced = try putActivityToken(
            ActivityTokenRow(
                id: id, app: r.app, user: r.user, parentDeviceID: r.deviceID, role: r.role,
                activityType: r.activityType, activityID: r.activityID, environment: parent.environment,
                bindingHash: binding, tokenHash: tokenHash, tokenSealed: sealed, bundleID: parent.bundleID,
                appID: parent.appID), now: now)
        let ids = try activityTokenIDs(parentDeviceID: r.deviceID, role: r.role)
        let evicted = Array(ids.dropFirst(ActivityLimits.perDevice))
        if !evicted.isEmpty { _ = try deleteActivityTokens(ids: evicted) }
        return ActivityOutcome(tokenID: id, tokenHash: tokenHash, created: !replaced, evicted: evicted)
    }
}

extension RegistryHost {
    public func registerActivity(
        _ registration: ActivityRegistration,
        completion: @escaping @Sendable (Result<ActivityOutcome, any Error>) -> Void
    ) {
        writeRows(
            durable: true, fence: StoreFences.user(app: registration.app, user: registration.user),
            { rows, now in try rows.registerActivity(registration, now: now) }, completion)
    }

    public func unregisterActivity(
        app: String, user: String, _ selector: ActivitySelector,
        completion: @escaping @Sendable (Result<Int, any Error>) -> Void
    ) {
        writeRows(
            durable: true, fence: StoreFences.user(app: app, user: user),
            { rows, _ in
                try rows.lockUser(app: app, user: user)
                return try rows.deleteActivityTokens(app: app, user: user, selector)
            }, completion)
    }

    public func letGoActivityTokens(
        ids: [String], completion: @escaping @Sendable (Result<Int, any Error>) -> Void
    ) {
        writeRows(durable: true, fence: nil, { rows, _ in try rows.deleteActivityTokens(ids: ids) }, completion)
    }

    public func listActivities(
        app: String, user: String, completion: @escaping @Sendable (Result<[ActivityTokenSummary], any Error>) -> Void
    ) {
        readRows(
            fence: StoreFences.user(app: app, user: user), figures: false,
            { rows in try rows.activityTokens(app: app, user: user) }, completion)
    }
}

/// One broadcast channel as Herald keeps it (`channel.list`).
public struct ChannelRecord: Sendable, Equatable {
    public let channelID: String
    /// Its row in `devices` (a `push.broadcast` delivery's device id).
    public let rowID: String
    public let bundleID: String?
    public let environment: APNsEnvironment?
    /// `latest` (message-storage-policy 1) or `none` (0).
    public let storesLatest: Bool
    public let createdAt: Int64

    public init(
        channelID: String, rowID: String, bundleID: String?, environment: APNsEnvironment?, storesLatest: Bool,
        createdAt: Int64
    ) {
        self.channelID = channelID
        self.rowID = rowID
        self.bundleID = bundleID
        self.environment = environment
        self.storesLatest = storesLatest
        self.createdAt = createdAt
    }
}

/// A channel row as written.
struct ChannelRow {
    let rowID: String
    let app: String
    let channelID: String
    let environment: APNsEnvironment
    let bundleID: String
    let storesLatest: Bool
    let bindingHash: [UInt8]
    let tokenHash: String
    let tokenSealed: [UInt8]
}

/// Bounds of the broadcast channels.
public enum ChannelLimits {
    /// Apple's limit per app and environment; Herald keeps no more per app.
    public static let perApp = 10_000
}

/// A channel past ``ChannelLimits/perApp``.
public struct ChannelLimitReached: Error, Sendable {}

extension Identity {
    /// A channel's row id: 32 hex chars from the app and the channel id.
    static func channelRowID(app: String, channelID: String) -> String {
        String(SHA256.hex(Array("channel\u{0}\(app)\u{0}\(channelID)".utf8)).prefix(32))
    }
}

extension RegistryHost {
    /// Records a channel APNs created (`channel.create`).
    public func recordChannel(
        app: String, channelID: String, environment: APNsEnvironment, bundleID: String, storesLatest: Bool,
        completion: @escaping @Sendable (Result<ChannelRecord, any Error>) -> Void
    ) {
        writeRows(
            durable: true, fence: nil,
            { rows, now in
                let rowID = Identity.channelRowID(app: app, channelID: channelID)
                let key = rows.key
                try rows.putChannel(
                    ChannelRow(
                        rowID: rowID, app: app, channelID: channelID, environment: environment, bundleID: bundleID,
                        storesLatest: storesLatest,
                        bindingHash: Identity.bindingHash(
                            app: app, platform: .apnsChannel, environment: environment, token: channelID),
                        tokenHash: Identity.tokenHash(channelID),
                        tokenSealed: try key.seal(Array(channelID.utf8), context: Identity.tokenContext(rowID))),
                    now: now)
                return ChannelRecord(
                    channelID: channelID, rowID: rowID, bundleID: bundleID, environment: environment,
                    storesLatest: storesLatest, createdAt: now)
            }, completion)
    }

    public func channels(
        app: String, channelID: String?, completion: @escaping @Sendable (Result<[ChannelRecord], any Error>) -> Void
    ) {
        readRows(fence: nil, figures: false, { rows in try rows.channels(app: app, channelID: channelID) }, completion)
    }

    public func forgetChannel(
        app: String, channelID: String, completion: @escaping @Sendable (Result<Bool, any Error>) -> Void
    ) {
        writeRows(
            durable: true, fence: nil, { rows, _ in try rows.deleteChannel(app: app, channelID: channelID) },
            completion)
    }
}

/// The Live Activity budget's notes on SQLite (one writer: no lock needed).
struct SQLiteActivityBudget: ActivityBudgetStatements {
    let db: Database

    func highSends(app: String, activityID: String, since: Int64) throws -> Int {
        let stmt = try db.statement(
            "SELECT count(*) FROM activity_high_sends WHERE app = ? AND activity_id = ? AND sent_at >= ?")
        try stmt.bind(.text(app), .text(activityID), .int(since))
        return try stmt.step() ? Int(stmt.int64(0)) : 0
    }

    func noteHighSend(app: String, activityID: String, at: Int64) throws {
        try db.statement("DELETE FROM activity_high_sends WHERE app = ? AND sent_at < ?")
            .bind(.text(app), .int(at - 3_600_000)).run()
        try db.statement("INSERT INTO activity_high_sends (app, activity_id, sent_at) VALUES (?, ?, ?)")
            .bind(.text(app), .text(activityID), .int(at)).run()
    }
}

/// The Live Activity budget's notes on PostgreSQL: the activity's
/// advisory lock makes two instances' sends of one activity take turns.
struct PostgresActivityBudget: ActivityBudgetStatements {
    let c: PostgresConnection

    func highSends(app: String, activityID: String, since: Int64) throws -> Int {
        try PostgresRegistry.lock(c, PostgresRegistry.lockKey("activity", app, activityID))
        return Int(
            try c.execute(
                "SELECT count(*) FROM activity_high_sends WHERE app = $1 AND activity_id = $2 AND sent_at >= $3",
                [.text(app), .text(activityID), .int(since)]
            ).first?.int64(0) ?? 0)
    }

    func noteHighSend(app: String, activityID: String, at: Int64) throws {
        try c.execute(
            "DELETE FROM activity_high_sends WHERE app = $1 AND sent_at < $2", [.text(app), .int(at - 3_600_000)])
        try c.execute(
            "INSERT INTO activity_high_sends (app, activity_id, sent_at) VALUES ($1, $2, $3)",
            [.text(app), .text(activityID), .int(at)])
    }
}
