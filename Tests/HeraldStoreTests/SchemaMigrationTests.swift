import Foundation
import HeraldCore
import HeraldCrypto
@testable import HeraldStore
import HeraldStoreTestSupport
import HeraldTestSupport
import Postgres
import Testing

/// A database of its own on the test PostgreSQL server, with connections of
/// the test's own to build it as a release left it and to look at it.
private struct SchemaDatabase {
    let scratch: StoreScratch
    let configuration: PostgresConfiguration

    init() throws {
        scratch = try StoreScratch(.postgres, prefix: "herald-schema")
        configuration = try #require(scratch.postgres).connection
    }

    func connect() throws -> PostgresConnection {
        let c = PostgresConnection(configuration: configuration)
        try c.connect()
        return c
    }

    func remove() { scratch.remove() }

    /// The database as a release from before `schema_migrations` left it at
    /// `version` (its migrate: each migration in a transaction, then
    /// `schema_version` holding the number applied). 0: an empty database.
    func leaveAsReleased(at version: Int) throws {
        guard version > 0 else { return }
        let c = try connect()
        defer { c.close() }
        try c.executeScript("CREATE TABLE schema_version (version integer NOT NULL)")
        for v in 0..<version {
            try c.transaction { c in
                try c.executeScript(PostgresSchema.migrations[v].sql)
                try c.execute("DELETE FROM schema_version")
                try c.execute("INSERT INTO schema_version (version) VALUES ($1)", [.int(Int64(v + 1))])
            }
        }
    }

    /// Migrates with a fresh connection.
    func migrate(
        _ migrations: [PostgresSchema.Migration] = PostgresSchema.migrations,
        policy: PostgresSchema.Policy = .standard
    ) throws {
        let c = try connect()
        defer { c.close() }
        try PostgresSchema.migrate(c, migrations: migrations, policy: policy)
    }

    /// `schema_version`'s rows: the compatibility level, alone.
    func levelRows() throws -> [Int64] {
        let c = try connect()
        defer { c.close() }
        return try c.execute("SELECT version FROM schema_version").rows.map { try $0.int64(0) }
    }

    /// `schema_migrations`: version, kind, whether `applied_at` is set.
    func recorded() throws -> [(version: Int, kind: String, stamped: Bool)] {
        let c = try connect()
        defer { c.close() }
        return try c.execute("SELECT version, kind, applied_at IS NOT NULL FROM schema_migrations ORDER BY version")
            .rows.map { (Int(try $0.int64(0)), try $0.text(1), try $0.bool(2)) }
    }

    func scalar(_ sql: String) throws -> Int64? {
        let c = try connect()
        defer { c.close() }
        return try c.execute(sql).first?.optionalInt64(0)
    }

    /// What a release from before this scheme checks at its start: it accepts
    /// the database while `max(version)` is at most what it knows.
    func acceptedByReleaseKnowing(_ known: Int) throws -> Bool {
        (try scalar("SELECT coalesce(max(version), 0) FROM schema_version") ?? 0) <= Int64(known)
    }
}

/// The error `body` throws, when it is a ``PostgresSchemaError``.
private func schemaError(_ body: () throws -> Void) -> PostgresSchemaError? {
    do {
        try body()
        Issue.record("no error")
        return nil
    } catch let error as PostgresSchemaError {
        return error
    } catch {
        Issue.record("not a PostgresSchemaError: \(error)")
        return nil
    }
}

private final class Box<T>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: T
    init(_ value: T) { self.value = value }
    func update(_ body: (inout T) -> Void) { lock.withLock { body(&value) } }
    var current: T { lock.withLock { value } }
}

/// The compatibility level a fresh database reaches: migrations 1–3 predate
/// the scheme (each a contract of its own version), 4 (instances) and 5 (the
/// queue's live work apart from its history) are expand.
private let currentLevel: Int64 = 3

@Suite("PostgreSQL schema migrations: expand-then-contract, bounded waits")
struct SchemaMigrationTests {
    @Test(
        "a database a release left at version 0…4 (before schema_migrations) migrates to the newest; the previous release still accepts it",
        arguments: 0...4)
    func releasedDatabaseMigrates(version: Int) throws {
        let db = try SchemaDatabase()
        defer { db.remove() }
        try db.leaveAsReleased(at: version)
        if version >= 1 {
            // A row of that time keeps its values and gets the later columns' defaults.
            let c = try db.connect()
            defer { c.close() }
            try c.execute(
                """
                INSERT INTO devices (device_id, app, user_name, platform, binding_hash, token_hash, token_sealed,
                                     created_at, registered_at, registered_seq)
                VALUES ('d-old', 'default', '\\x75'::bytea, 'fcm', '\\x01'::bytea, 'h', '\\x02'::bytea, 1, 2, 3)
                """)
        }
        try db.migrate()
        let known = PostgresSchema.migrations.count
        #expect(known == 8)
        #expect(try db.levelRows() == [currentLevel], "one row, the compatibility level")
        let recorded = try db.recorded()
        #expect(recorded.map(\.version) == Array(1...known))
        #expect(
            recorded.map(\.kind) == [
                "contract", "contract", "contract", "expand", "expand", "expand", "expand", "expand",
            ])
        // Applied before the table existed: no time; applied now: stamped.
        #expect(recorded.map(\.stamped) == (1...known).map { $0 > version })
        #expect(try db.scalar("SELECT count(*) FROM pg_class WHERE relname = 'instances'") == 1)
        #expect(try db.acceptedByReleaseKnowing(3), "the previous release (schema 3) starts on it")
        #expect(!(try db.acceptedByReleaseKnowing(2)), "a release of schema 2 still refuses it")
        if version >= 1 {
            #expect(try db.scalar("SELECT registered_seq FROM devices WHERE device_id = 'd-old'") == 3)
            #expect(try db.scalar("SELECT count(*) FROM devices WHERE enabled AND app_id = 'stable'::bytea") == 1)
        }
        // Again: nothing to do, nothing changes.
        try db.migrate()
        #expect(try db.recorded().map(\.stamped) == recorded.map(\.stamped))
        #expect(try db.levelRows() == [currentLevel])
    }

    @Test(
        "migration 5 moves a database's live deliveries apart from its history, keeps every row and id, and the ids go on"
    )
    func liveWorkApartFromHistory() throws {
        let db = try SchemaDatabase()
        defer { db.remove() }
        try db.leaveAsReleased(at: 4)
        let c = try db.connect()
        defer { c.close() }
        // As a release of schema 4 left it: one message, a delivery in each state, ids from the identity.
        try c.executeScript(
            """
            INSERT INTO messages VALUES ('m1', 'default', NULL, 'p', 1, 2);
            INSERT INTO deliveries (message_id, app, device_id, user_name, platform, token_hash, state,
                                    next_attempt_at, updated_at, collapse_key)
            SELECT 'm1', 'default', 'd' || s, 'u'::bytea, 'fcm', 'h', s, 0, 0, CASE WHEN s = 'queued' THEN 'c'::bytea END
            FROM unnest(ARRAY['queued', 'retrying', 'in_flight', 'delivered', 'failed', 'skipped', 'expired',
                              'superseded']) s;
            """)
        let before = try c.execute("SELECT delivery_id, state FROM deliveries ORDER BY 1").rows.map {
            "\(try $0.int64(0)) \(try $0.text(1))"
        }
        try db.migrate()
        func placed(_ partition: String) throws -> [String] {
            try c.execute("SELECT delivery_id, state FROM \(partition) ORDER BY 1").rows.map {
                "\(try $0.int64(0)) \(try $0.text(1))"
            }
        }
        #expect(try placed("deliveries") == before, "every row and id kept")
        let live = try placed("deliveries_live").map { $0.split(separator: " ")[1] }
        #expect(live == ["queued", "retrying", "in_flight"])
        #expect(try placed("deliveries_done").count == 5)
        let partitioned = "SELECT count(*) FROM pg_partitioned_table WHERE partrelid = 'deliveries'::regclass"
        #expect(try db.scalar(partitioned) == 1)
        // An insert as every release writes it (no id) takes the next id, after the identity's last.
        let next = try c.execute(
            """
            INSERT INTO deliveries (message_id, app, device_id, user_name, platform, token_hash, state,
                                    next_attempt_at, updated_at)
            VALUES ('m1', 'default', 'd-new', 'u'::bytea, 'fcm', 'h', 'queued', 0, 0) RETURNING delivery_id
            """
        ).first?.int64(0)
        #expect(next == Int64(before.count + 1))
        // The queue's rules hold on the live partition: one queued delivery per device and collapse key.
        do {
            try c.execute(
                """
                INSERT INTO deliveries (message_id, app, device_id, user_name, platform, token_hash, state,
                                        next_attempt_at, updated_at, collapse_key)
                VALUES ('m1', 'default', 'dqueued', 'u'::bytea, 'fcm', 'h', 'queued', 0, 0, 'c'::bytea)
                """)
            Issue.record("a second queued delivery of one collapse key was accepted")
        } catch {
            #expect(error.sqlState == .uniqueViolation, "\(error)")
        }
        // Finishing a delivery moves it; deleting the message takes its deliveries from both.
        try c.execute("UPDATE deliveries SET state = 'delivered' WHERE device_id = 'd-new'")
        #expect(try placed("deliveries_done").count == 6)
        try c.execute("DELETE FROM messages WHERE message_id = 'm1'")
        #expect(try db.scalar("SELECT count(*) FROM deliveries") == 0)
    }

    @Test("the list keeps its rules: 1–3 count as contracts of their own versions, no contract requires a later one")
    func listRules() {
        let list = PostgresSchema.migrations
        for (index, migration) in list.enumerated() {
            #expect(migration.requires <= index + 1, "migration \(index + 1)")
            if index < 3 { #expect(migration.kind == .contract(requires: index + 1), "migration \(index + 1)") }
        }
        // Until a release contracts it, the level of a new database is what the previous release knows.
        #expect(list.map(\.requires).max() == Int(currentLevel))
    }

    @Test("a migrated database opens as a store and serves (an empty one, as the daemon migrates it)")
    func storeOpensOnMigratedDatabase() throws {
        let db = try SchemaDatabase()
        defer { db.remove() }
        try db.leaveAsReleased(at: 3)
        let store = try db.scratch.open(key: try StoreKey.generate(), instance: "host-new")
        defer { store.close() }
        _ = try store.sync { s, done in
            s.register(
                Registration(app: "default", user: "hal", platform: .fcm, environment: nil, token: "t1"),
                deviceCap: 20, completion: done)
        }
        #expect(try store.sync { s, done in s.list(app: "default", user: "hal", completion: done) }.count == 1)
        #expect(try db.recorded().map(\.version) == [1, 2, 3, 4, 5, 6, 7, 8])
        #expect(try db.levelRows() == [currentLevel])
    }

    @Test("a compatibility level above what this herald knows is refused, naming both versions; nothing is applied")
    func newerLevelRefused() throws {
        let db = try SchemaDatabase()
        defer { db.remove() }
        try db.migrate()
        let c = try db.connect()
        defer { c.close() }
        // A newer release applied 9 (expand), 10 and 11 (contracts) and needs schema 11 now.
        try c.execute(
            "INSERT INTO schema_migrations (version, kind, applied_at) VALUES (9, 'expand', now()), "
                + "(10, 'contract', now()), (11, 'contract', now())")
        try c.execute("UPDATE schema_version SET version = 11")
        try c.execute("DELETE FROM schema_migrations WHERE version = 4")
        try c.execute("DROP TABLE instances")
        let error = try #require(schemaError { try db.migrate() })
        #expect(error.problem == .incompatible(needs: 11, knows: 8))
        #expect(error.message.contains("requires herald schema 11"), "\(error)")
        #expect(error.message.contains("knows schema 8"), "\(error)")
        #expect(error.message.contains("schema version 11 is newer than this herald"), "\(error)")
        // Refused before anything ran: migration 4 (missing) was not applied.
        #expect(try db.scalar("SELECT count(*) FROM pg_class WHERE relname = 'instances'") == 0)
        #expect(try db.recorded().map(\.version) == [1, 2, 3, 5, 6, 7, 8, 9, 10, 11])
        // The store refuses to open, with the same words.
        do {
            let store = try db.scratch.open(key: try StoreKey.generate(), instance: "host-old")
            store.close()
            Issue.record("a store opened a database that requires schema 11")
        } catch {
            #expect("\(error)".contains("requires herald schema 11"), "\(error)")
        }
    }

    @Test("a database of a release from before schema_migrations at a version above this herald's is refused")
    func newerReleasedVersionRefused() throws {
        let db = try SchemaDatabase()
        defer { db.remove() }
        try db.leaveAsReleased(at: 3)
        let c = try db.connect()
        defer { c.close() }
        try c.execute("UPDATE schema_version SET version = 99")
        let error = try #require(schemaError { try db.migrate() })
        #expect(error.problem == .incompatible(needs: 99, knows: 8))
        #expect(error.message.contains("requires herald schema 99"), "\(error)")
        #expect(error.message.contains("this herald knows schema 8"), "\(error)")
        #expect(try c.execute("SELECT to_regclass('schema_migrations') IS NULL").first?.bool(0) == true)
    }

    @Test("newer expand-only migrations recorded by a newer release are accepted: this herald applies only its own")
    func newerExpandAccepted() throws {
        let db = try SchemaDatabase()
        defer { db.remove() }
        // A newer release (schema 10) migrated the database from the previous release's 3.
        try db.leaveAsReleased(at: 3)
        let newer =
            PostgresSchema.migrations + [
                .expand("ALTER TABLE devices ADD COLUMN newer_note text"),
                .expand("CREATE TABLE newer_things (id bigint PRIMARY KEY)"),
            ]
        try db.migrate(newer)
        #expect(try db.recorded().map(\.version) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
        #expect(try db.levelRows() == [currentLevel])
        #expect(try db.acceptedByReleaseKnowing(3))
        // This herald starts on it and works.
        try db.migrate()
        #expect(try db.recorded().map(\.version) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
        let store = try db.scratch.open(key: try StoreKey.generate(), instance: "host-this")
        defer { store.close() }
        _ = try store.sync { s, done in
            s.register(
                Registration(app: "default", user: "hal", platform: .fcm, environment: nil, token: "t1"),
                deviceCap: 20, completion: done)
        }
        #expect(try store.sync { s, done in s.list(app: "default", user: "hal", completion: done) }.count == 1)
    }

    @Test("a contract raises the level to the schema it requires: binaries that know it still start, older ones do not")
    func contractRaisesLevel() throws {
        let db = try SchemaDatabase()
        defer { db.remove() }
        try db.migrate()
        // Release 9 stops using devices.user_agent (and adds a column); release 10 drops it.
        let nine = PostgresSchema.migrations + [.expand("ALTER TABLE devices ADD COLUMN agent_v2 bytea")]
        let ten = nine + [.contract(requires: 9, "ALTER TABLE devices DROP COLUMN user_agent")]
        try db.migrate(nine)
        #expect(try db.levelRows() == [currentLevel])
        try db.migrate(ten)
        #expect(try db.levelRows() == [9])
        #expect(try db.recorded().map(\.kind).suffix(2) == ["expand", "contract"])
        try db.migrate(nine)  // release 9 keeps running on schema 10
        let error = try #require(schemaError { try db.migrate() })
        #expect(error.problem == .incompatible(needs: 9, knows: 8), "\(error)")
        #expect(!(try db.acceptedByReleaseKnowing(3)), "the release of schema 3 refuses it too")
    }

    @Test(
        "a migration blocked by another session's lock gives up within its lock timeout, and queries do not queue behind it"
    )
    func blockedMigrationTimesOut() throws {
        let db = try SchemaDatabase()
        defer { db.remove() }
        try db.migrate()
        let withSix = PostgresSchema.migrations + [.expand("ALTER TABLE devices ADD COLUMN probe text")]
        // A long transaction that has read devices (an idle-in-transaction session, a report).
        let holder = try db.connect()
        defer { holder.close() }
        try holder.begin()
        _ = try holder.execute("SELECT count(*) FROM devices")
        // Readers of devices meanwhile: each waits at most as long as one try of the ALTER.
        let stop = Box(false)
        let slowest = Box(Duration.zero)
        let reads = Box(0)
        let readerDone = DispatchSemaphore(value: 0)
        let configuration = db.configuration
        Thread.detachNewThread {
            defer { readerDone.signal() }
            let c = PostgresConnection(configuration: configuration)
            defer { c.close() }
            guard (try? c.execute("SET statement_timeout = '20s'")) != nil else { return }
            while !stop.current {
                let start = ContinuousClock.now
                guard (try? c.execute("SELECT count(*) FROM devices")) != nil else { return }
                let took = ContinuousClock.now - start
                slowest.update { $0 = max($0, took) }
                reads.update { $0 += 1 }
                Thread.sleep(forTimeInterval: 0.02)
            }
        }
        let policy = PostgresSchema.Policy(
            lockTimeout: .milliseconds(300), attempts: 3, retryDelay: .milliseconds(100), lockWait: .seconds(5))
        let start = ContinuousClock.now
        let error = try #require(schemaError { try db.migrate(withSix, policy: policy) })
        let took = ContinuousClock.now - start
        stop.update { $0 = true }
        readerDone.wait()
        #expect(error.problem == .lockTimeout)
        #expect(error.message.contains("migration 9 (expand)"), "\(error)")
        #expect(error.message.contains("within lock_timeout 0.3 s in 3 tries"), "\(error)")
        // Three tries of 300 ms and pauses of 100 and 200 ms: about 1.2 s, never a hang.
        #expect(took >= .milliseconds(900), "\(took)")
        #expect(took < .seconds(5), "\(took)")
        #expect(reads.current > 0)
        #expect(slowest.current < .seconds(2), "a read of devices waited \(slowest.current) behind the migration")
        // Nothing of it applied.
        #expect(try db.recorded().map(\.version) == [1, 2, 3, 4, 5, 6, 7, 8])
        #expect(
            try db.scalar(
                "SELECT count(*) FROM information_schema.columns WHERE table_name = 'devices' AND column_name = 'probe'"
            )
                == 0)
        // Once the long transaction ends, the same migration goes through.
        try holder.commit()
        try db.migrate(withSix, policy: policy)
        #expect(try db.recorded().map(\.version) == [1, 2, 3, 4, 5, 6, 7, 8, 9])
        #expect(try db.levelRows() == [currentLevel])
    }

    @Test(
        "another session holding the migration lock: migrate waits a bounded time and says another instance is migrating"
    )
    func migrationLockWaitBounded() throws {
        let db = try SchemaDatabase()
        defer { db.remove() }
        let other = try db.connect()
        defer { other.close() }
        try other.execute("SELECT pg_advisory_lock($1)", [.int(PostgresSchema.migrationLock)])
        let policy = PostgresSchema.Policy(lockWait: .milliseconds(700))
        let start = ContinuousClock.now
        let error = try #require(schemaError { try db.migrate(policy: policy) })
        let took = ContinuousClock.now - start
        #expect(error.problem == .migrating)
        #expect(error.message.contains("another instance is migrating"), "\(error)")
        #expect(error.message.contains("still held after 0.7 s"), "\(error)")
        #expect(error.message.contains("PostgreSQL backend pid"), "names the holder: \(error)")
        #expect(took >= .milliseconds(700) && took < .seconds(5), "\(took)")
        #expect(try db.scalar("SELECT count(*) FROM pg_class WHERE relname = 'devices'") == 0)
        // Released (the other instance finished): it migrates.
        try other.execute("SELECT pg_advisory_unlock($1)", [.int(PostgresSchema.migrationLock)])
        try db.migrate(policy: policy)
        #expect(try db.recorded().map(\.version) == [1, 2, 3, 4, 5, 6, 7, 8])
    }
}
