import HeraldCore

// The event stream as the store keeps it (`events.subscribe`): each event is
// written in the transaction of the change it reports, a delivery's final
// outcome and a message's completion by the schema's triggers, the rest by
// the code below, and read back in cursor order.

/// Where an event stands in the stream: every later event's cursor is
/// greater. SQLite numbers its events (`high` 0); a shared PostgreSQL
/// database orders them by the writing transaction's id, then their own,
/// and reads only below the oldest transaction still running, so that no
/// event can commit behind a cursor already read.
public struct EventCursor: Sendable, Hashable, Comparable, CustomStringConvertible {
    public let high: Int64
    public let low: Int64

    public init(high: Int64 = 0, low: Int64) {
        self.high = high
        self.low = low
    }

    /// Reads the form ``description`` writes: `"17"`, or `"9041-17"`.
    public init?(_ text: some StringProtocol) {
        let parts = text.split(separator: "-", omittingEmptySubsequences: false)
        switch parts.count {
        case 1:
            guard let low = Int64(parts[0]), low >= 0 else { return nil }
            self.init(low: low)
        case 2:
            guard let high = Int64(parts[0]), let low = Int64(parts[1]), high >= 0, low >= 0 else { return nil }
            self.init(high: high, low: low)
        default:
            return nil
        }
    }

    public var description: String { high == 0 ? String(low) : "\(high)-\(low)" }

    public static func < (a: EventCursor, b: EventCursor) -> Bool {
        (a.high, a.low) < (b.high, b.low)
    }
}

/// What an event reports.
public enum EventKind: String, Sendable, CaseIterable {
    /// A delivery's final outcome (delivered, failed, expired,
    /// removed_stale, superseded, skipped).
    case delivery
    /// A device Herald removed: a stale token, the per-user cap, a token
    /// reclaimed by another user, or the user forgotten.
    case deviceRemoved = "device_removed"
    /// Every delivery of a message is final (the counts per state).
    case messageComplete = "message_complete"
    /// An app's credential for a platform was proven, rejected or unreachable.
    case credential
    /// An app's transport for a platform degraded or recovered.
    case transport
}

/// Why Herald removed a device (`device_removed` `reason`).
public enum RemovalReason: String, Sendable {
    case stale
    case cap
    case reclaimed
    case forget
}

/// One event as stored.
public struct StoredEvent: Sendable {
    public let cursor: EventCursor
    /// Unix ms.
    public let at: Int64
    public let app: String
    /// The stored kind (a kind this version does not know is passed on).
    public let kind: String
    public let messageID: String?
    public let deviceID: String?
    public let user: String?
    public let platform: String?
    public let state: String?
    public let reason: String?
    public let httpStatus: Int?
    /// The final attempt's request id Herald set (the `apns-id`).
    public let requestID: String?
    /// The final attempt's identifier at the provider: the `apns-unique-id`,
    /// the FCM message `name`, the Web Push `Location`.
    public let providerID: String?
    /// A JSON object with what else the kind carries (the counts of a
    /// complete message; a credential's verdict).
    public let detail: String?

    public init(
        cursor: EventCursor, at: Int64, app: String, kind: String, messageID: String? = nil, deviceID: String? = nil,
        user: String? = nil, platform: String? = nil, state: String? = nil, reason: String? = nil,
        httpStatus: Int? = nil, requestID: String? = nil, providerID: String? = nil, detail: String? = nil
    ) {
        self.cursor = cursor
        self.at = at
        self.app = app
        self.kind = kind
        self.messageID = messageID
        self.deviceID = deviceID
        self.user = user
        self.platform = platform
        self.state = state
        self.reason = reason
        self.httpStatus = httpStatus
        self.requestID = requestID
        self.providerID = providerID
        self.detail = detail
    }

    init(_ r: some StoreRow) throws {
        let high = try r.int64(0)
        let low = try r.int64(1)
        self.init(
            cursor: EventCursor(high: high, low: low), at: try r.int64(2), app: try r.text(3), kind: try r.text(4),
            messageID: try r.optionalText(5), deviceID: try r.optionalText(6), user: try r.optionalClientText(7),
            platform: try r.optionalText(8), state: try r.optionalText(9), reason: try r.optionalText(10),
            httpStatus: try r.optionalInt64(11).map { Int($0) }, requestID: try r.optionalText(12),
            providerID: try r.optionalText(13), detail: try r.optionalText(14))
    }
}

/// An event the daemon writes itself (a credential's verdict, a transport's
/// state): not caused by a change of the store's rows.
public struct NewEvent: Sendable {
    public let app: String
    public let kind: EventKind
    public let platform: String?
    public let state: String?
    public let reason: String?
    public let detail: String?

    public init(
        app: String, kind: EventKind, platform: String? = nil, state: String? = nil, reason: String? = nil,
        detail: String? = nil
    ) {
        self.app = app
        self.kind = kind
        self.platform = platform
        self.state = state
        self.reason = reason
        self.detail = detail
    }
}

/// A page of the stream.
public struct EventPage: Sendable {
    /// In cursor order, after the cursor asked for.
    public let events: [StoredEvent]
    /// The cursor of the newest event purged (retention): a reader whose
    /// cursor is older missed the events between.
    public let purgedThrough: EventCursor?

    public init(events: [StoredEvent], purgedThrough: EventCursor?) {
        self.events = events
        self.purgedThrough = purgedThrough
    }
}

/// The stream's reads and the events the daemon writes.
public protocol EventLog: StoreService {
    /// Up to `limit` events after `cursor` (nil: from the oldest kept), in
    /// cursor order, every app's.
    func events(
        after cursor: EventCursor?, limit: Int, completion: @escaping @Sendable (Result<EventPage, any Error>) -> Void)
    /// The newest event's cursor a reader can see (nil: none yet).
    func eventsHead(completion: @escaping @Sendable (Result<EventCursor?, any Error>) -> Void)
    /// Writes events in one transaction.
    func append(_ events: [NewEvent], completion: @escaping @Sendable (Result<Void, any Error>) -> Void)
    /// Deletes events older than `retention`; answers how many.
    func purgeEvents(olderThan retention: Duration, completion: @escaping @Sendable (Result<Int, any Error>) -> Void)
}

/// A device removed, for its event.
struct RemovedDevice: Sendable {
    let deviceID: String
    let user: String
    let platform: String
}

/// What writing the daemon's own events takes of a backend, inside the
/// caller's transaction.
protocol EventStatements {
    /// A `device_removed` event for each device, in the transaction that removes them.
    func noteRemoved(app: String, _ devices: [RemovedDevice], reason: RemovalReason, now: Int64) throws
}

extension EventStatements {
    func noteRemoved(app: String, user: String, ids: [(String, String)], reason: RemovalReason, now: Int64) throws {
        guard !ids.isEmpty else { return }
        try noteRemoved(
            app: app, ids.map { RemovedDevice(deviceID: $0.0, user: user, platform: $0.1) }, reason: reason, now: now)
    }
}

/// The statements both backends run as they are written.
enum EventSQL {
    /// A message all of whose deliveries are final when written (skipped,
    /// or answered before the commit): complete at once (SQLite; `?1` now,
    /// `?2` the message).
    static let sqliteMessageCompleteIfDone = """
        INSERT INTO events (at, app, kind, message_id, detail)
        SELECT ?1, app, 'message_complete', message_id,
            (SELECT json_group_object(state, n) FROM (
                SELECT state, count(*) AS n FROM deliveries WHERE message_id = ?2 GROUP BY state))
        FROM messages WHERE message_id = ?2 AND NOT EXISTS (
            SELECT 1 FROM deliveries INDEXED BY deliveries_live_by_message
            WHERE message_id = ?2 AND state IN ('queued', 'retrying', 'in_flight'))
        """

    /// The same on PostgreSQL (`$1` now, `$2` the message).
    static let postgresMessageCompleteIfDone = """
        INSERT INTO events (at, app, kind, message_id, detail)
        SELECT $1, app, 'message_complete', message_id,
            (SELECT json_object_agg(state, n)::text FROM (
                SELECT state, count(*) AS n FROM deliveries WHERE message_id = $2 GROUP BY state) s)
        FROM messages WHERE message_id = $2 AND NOT EXISTS (SELECT 1 FROM deliveries_live WHERE message_id = $2)
        """
}

// MARK: SQLite

extension Queue {
    func events(after cursor: EventCursor?, limit: Int) throws -> EventPage {
        let stmt = try db.statement(
            """
            SELECT 0, cursor, at, app, kind, message_id, device_id, user, platform, state, reason, http_status,
                request_id, provider_id, detail
            FROM events WHERE cursor > ? ORDER BY cursor LIMIT ?
            """)
        try stmt.bind(.int(cursor?.low ?? 0), .int(Int64(limit)))
        var events: [StoredEvent] = []
        while try stmt.step() {
            events.append(try StoredEvent(SQLiteRow(stmt)))
        }
        return EventPage(events: events, purgedThrough: try eventsPurgedThrough())
    }

    func eventsHead() throws(StoreError) -> EventCursor? {
        // The sequence, not max(cursor): every event may have been purged.
        let stmt = try db.statement("SELECT seq FROM sqlite_sequence WHERE name = 'events'")
        return try stmt.step() ? EventCursor(low: stmt.int64(0)) : nil
    }

    private func eventsPurgedThrough() throws(StoreError) -> EventCursor? {
        let stmt = try db.statement("SELECT value FROM store_meta WHERE name = 'events_purged_through'")
        guard try stmt.step() else { return nil }
        return EventCursor(String(decoding: stmt.blob(0), as: UTF8.self))
    }

    func append(_ events: [NewEvent], now: Int64) throws(StoreError) {
        for e in events {
            try db.statement(
                "INSERT INTO events (at, app, kind, platform, state, reason, detail) VALUES (?, ?, ?, ?, ?, ?, ?)"
            ).bind(
                .int(now), .text(e.app), .text(e.kind.rawValue), .optional(e.platform), .optional(e.state),
                .optional(e.reason), .optional(e.detail)
            ).run()
        }
    }

    /// Deletes the events written before `before`, noting the newest one
    /// deleted (a reader behind it is told what it missed).
    func purgeEvents(before: Int64) throws(StoreError) -> Int {
        let newest = try db.statement("SELECT max(cursor) FROM events WHERE at < ?")
        try newest.bind(.int(before))
        guard try newest.step(), let last = newest.optionalInt64(0) else { return 0 }
        try db.statement("DELETE FROM events WHERE cursor <= ?").bind(.int(last)).run()
        let deleted = db.changes
        try db.statement(
            """
            INSERT INTO store_meta (name, value) VALUES ('events_purged_through', ?)
            ON CONFLICT (name) DO UPDATE SET value = excluded.value
            """
        ).bind(.blob(Array(String(last).utf8))).run()
        return deleted
    }
}

extension SQLiteStore: EventLog {
    public func events(
        after cursor: EventCursor?, limit: Int, completion: @escaping @Sendable (Result<EventPage, any Error>) -> Void
    ) {
        read({ t in try t.queue.events(after: cursor, limit: limit) }, completion)
    }

    public func eventsHead(completion: @escaping @Sendable (Result<EventCursor?, any Error>) -> Void) {
        read({ t in try t.queue.eventsHead() }, completion)
    }

    public func append(_ events: [NewEvent], completion: @escaping @Sendable (Result<Void, any Error>) -> Void) {
        submit({ t, now in try t.queue.append(events, now: now) }, completion)
    }

    public func purgeEvents(
        olderThan retention: Duration, completion: @escaping @Sendable (Result<Int, any Error>) -> Void
    ) {
        let ms = retention.components.seconds * 1000
        submit(durable: false, { t, now in try t.queue.purgeEvents(before: now - ms) }, completion)
    }
}
