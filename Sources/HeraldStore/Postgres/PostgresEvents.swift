import HeraldCore
import Postgres

// The event stream on a database several instances share: events are
// ordered by the id of the transaction that wrote them, then their own,
// and read only below the oldest transaction still running (the
// snapshot's xmin), so that none can commit behind a cursor already read.
// An open transaction holds the stream back (never loses an event): the
// connections' `idle_in_transaction_session_timeout` bounds how long.

extension PostgresQueue {
    func events(_ c: PostgresConnection, after cursor: EventCursor?, limit: Int) throws -> EventPage {
        let rows = try c.execute(
            EventStatements.read,
            [.int(cursor?.high ?? 0), .int(cursor?.low ?? 0), .int(Int64(limit))]
        ).rows
        let events = try rows.map { try StoredEvent($0) }
        let purged =
            try c.execute(
                "SELECT value FROM store_meta WHERE name = 'events_purged_through'"
            ).first.map { EventCursor(String(decoding: try $0.bytes(0), as: UTF8.self)) } ?? nil
        return EventPage(events: events, purgedThrough: purged)
    }

    func eventsHead(_ c: PostgresConnection) throws -> EventCursor? {
        guard let r = try c.execute(EventStatements.head).first, !(try r.isNull(0)) else { return nil }
        return EventCursor(high: try r.int64(0), low: try r.int64(1))
    }

    func append(_ c: PostgresConnection, _ events: [NewEvent], now: Int64) throws {
        guard !events.isEmpty else { return }
        try c.execute(
            """
            INSERT INTO events (at, app, kind, platform, state, reason, detail)
            SELECT $1, e.app, e.kind, e.platform, e.state, e.reason, e.detail
            FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[])
                WITH ORDINALITY AS e(app, kind, platform, state, reason, detail, n)
            ORDER BY e.n
            """,
            [
                .int(now), .array(.text(events.map(\.app))), .array(.text(events.map(\.kind.rawValue))),
                .array(.text(events.map(\.platform))), .array(.text(events.map(\.state))),
                .array(.text(events.map(\.reason))), .array(.text(events.map(\.detail))),
            ])
    }

    /// Deletes the events written before `before` (one chunk), noting the
    /// newest deleted: a reader behind it is told what it missed.
    func purgeEvents(_ c: PostgresConnection, before: Int64) throws -> Int {
        guard
            let r = try c.execute(
                """
                WITH gone AS (
                    DELETE FROM events WHERE (xid, id) IN (
                        SELECT xid, id FROM events WHERE at < $1 ORDER BY xid, id LIMIT $2)
                    RETURNING xid, id)
                SELECT count(*), max(xid), (SELECT max(id) FROM gone g WHERE g.xid = (SELECT max(xid) FROM gone))
                FROM gone
                """, [.int(before), .int(Int64(Self.eventPurgeChunk))]
            ).first
        else { return 0 }
        let deleted = Int(try r.int64(0))
        guard deleted > 0 else { return 0 }
        let newest = EventCursor(high: try r.int64(1), low: try r.int64(2))
        try c.execute(
            """
            INSERT INTO store_meta (name, value) VALUES ('events_purged_through', $1)
            ON CONFLICT (name) DO UPDATE SET value = excluded.value
            """, [.bytes(Array(newest.description.utf8))])
        return deleted
    }

    /// Events deleted by one purge transaction.
    static let eventPurgeChunk = 5_000

    private enum EventStatements {
        static let read = PostgresStatement(
            name: "ev_read",
            sql: """
                SELECT xid, id, at, app, kind, message_id, device_id, user_name, platform, state, reason, http_status,
                    request_id, provider_id, detail
                FROM events
                WHERE (xid, id) > ($1, $2) AND xid < pg_snapshot_xmin(pg_current_snapshot())::text::bigint
                ORDER BY xid, id LIMIT $3
                """)
        static let head = PostgresStatement(
            name: "ev_head",
            sql: """
                SELECT xid, id FROM events
                WHERE xid < pg_snapshot_xmin(pg_current_snapshot())::text::bigint
                ORDER BY xid DESC, id DESC LIMIT 1
                """)
    }
}

extension PostgresStore: EventLog {
    public func events(
        after cursor: EventCursor?, limit: Int, completion: @escaping @Sendable (Result<EventPage, any Error>) -> Void
    ) {
        submit(
            durable: false, { [queueTables] c, _ in try queueTables.events(c, after: cursor, limit: limit) }, completion
        )
    }

    public func eventsHead(completion: @escaping @Sendable (Result<EventCursor?, any Error>) -> Void) {
        submit(durable: false, { [queueTables] c, _ in try queueTables.eventsHead(c) }, completion)
    }

    public func append(_ events: [NewEvent], completion: @escaping @Sendable (Result<Void, any Error>) -> Void) {
        submit({ [queueTables] c, now in try queueTables.append(c, events, now: now) }, completion)
    }

    public func purgeEvents(
        olderThan retention: Duration, completion: @escaping @Sendable (Result<Int, any Error>) -> Void
    ) {
        purgeEventChunks(before: retention.components.seconds * 1000, total: 0, completion: completion)
    }

    /// One chunk per transaction, until one finds less than a full chunk.
    private func purgeEventChunks(
        before ms: Int64, total: Int, completion: @escaping @Sendable (Result<Int, any Error>) -> Void
    ) {
        submit(
            durable: false, { [queueTables] c, now in try queueTables.purgeEvents(c, before: now - ms) },
            { [self] result in
                switch result {
                case .success(let n) where n >= PostgresQueue.eventPurgeChunk:
                    purgeEventChunks(before: ms, total: total + n, completion: completion)
                case .success(let n):
                    completion(.success(total + n))
                case .failure(let error):
                    completion(.failure(error))
                }
            })
    }
}
