import Foundation
import Postgres

/// The PostgreSQL schema: a list of migrations, applied in order, each in a
/// transaction of its own, by instances that take turns (a session advisory
/// lock, waited for with a deadline).
///
/// Several releases of Herald run on one database during a rolling upgrade,
/// so the schema evolves expand-then-contract. Two tables say where a
/// database stands:
///
/// - `schema_version` holds one number, the *compatibility level*: the
///   oldest schema knowledge a binary needs to work with this database (a
///   binary "knows schema M" when it knows migrations 1…M). A binary starts
///   on a database whose level is at most M, and refuses it otherwise, naming
///   both. Releases from before this scheme (schema 3 and earlier) read the
///   same number as "migrations applied" and accept it while it is at most
///   what they know, so the level never moves for an expand migration.
/// - `schema_migrations (version, kind, applied_at)` records each migration
///   applied, newer binaries' included: a binary applies the ones of its list
///   not recorded there. Rows of migrations applied before the table existed
///   have no `applied_at`.
///
/// A database from before `schema_migrations` (levels 0…3, or 4 from a build
/// of the instances table before this scheme) has had exactly migrations
/// 1…`schema_version`: those are recorded, and the level recomputed from
/// their kinds, on the first start of a binary of this scheme.
///
/// Strings a client chooses (user names, registration ids, device names,
/// app versions, collapse keys) are `bytea`: PostgreSQL `text` cannot hold
/// a NUL, and a client may send one; bytes compare and index exactly as the
/// strings did in SQLite.
enum PostgresSchema {
    /// The key of the advisory lock held while migrating (the releases before
    /// this scheme take it too, with `pg_advisory_lock`).
    static let migrationLock: Int64 = 0x6865_7261_6c64_0001

    /// One step of the schema.
    struct Migration: Sendable {
        enum Kind: Sendable, Equatable {
            /// Only adds what older binaries ignore (a table, a nullable
            /// column or one with a default, an index): every binary that
            /// accepted the database before still works; the level stays.
            case expand
            /// Removes or changes what binaries knowing fewer than `requires`
            /// migrations use: once applied, the level is at least `requires`
            /// and those binaries refuse to start. `requires` is at most the
            /// migration's own version: the first release that no longer uses
            /// what it removes (so that release keeps running on it).
            case contract(requires: Int)
        }

        let kind: Kind
        /// Statements without parameters, run in one transaction.
        let sql: String

        static func expand(_ sql: String) -> Migration { Migration(kind: .expand, sql: sql) }
        static func contract(requires: Int, _ sql: String) -> Migration {
            Migration(kind: .contract(requires: requires), sql: sql)
        }

        /// As `schema_migrations.kind` records it.
        var kindName: String {
            switch kind {
            case .expand: "expand"
            case .contract: "contract"
            }
        }

        /// The level the database needs at least once this is applied.
        var requires: Int {
            switch kind {
            case .expand: 0
            case .contract(let requires): requires
            }
        }
    }

    /// How long migrating may wait, and how often a migration is tried.
    struct Policy: Sendable {
        /// `lock_timeout` of every migration transaction: a statement that
        /// cannot take its lock within it fails, rather than wait behind a
        /// long transaction while every query on that table queues behind it.
        var lockTimeout: Duration = .seconds(5)
        /// Tries of one migration that failed on a lock timeout or a deadlock.
        var attempts = 4
        /// The pause before the second try; doubled before each later one.
        var retryDelay: Duration = .seconds(1)
        /// How long to wait for another instance that holds the migration lock.
        var lockWait: Duration = .seconds(60)

        static let standard = Policy()
    }

    /// The migrations, version `i + 1` at index `i`.
    ///
    /// Writing a new one (rolling upgrades: hosts are upgraded one at a
    /// time, so the previous release runs on the new schema for a while):
    ///
    /// 1. Append; never edit, reorder or remove an entry that was released.
    ///    Its version is its position (5 follows 4).
    /// 2. Prefer `.expand`: add a table, a column that is nullable or has a
    ///    constant default, an index, a function. Old binaries must keep
    ///    working: nothing they insert may now violate a constraint, and
    ///    nothing they read may change meaning. The new release must in turn
    ///    work with rows the old one keeps writing: a new column left NULL
    ///    (or at its default) by them must mean something sensible.
    /// 3. Removing or changing anything a released binary uses (drop or rename
    ///    a column or table, change a type, add NOT NULL or a CHECK that old
    ///    writers break, change what a value means) takes two releases:
    ///    release N stops using it (and writes both forms if a value moves),
    ///    and a later release drops it in a `.contract(requires: N)`, where N
    ///    is the version that release knew; binaries older than N are refused
    ///    once it runs, so every host must run N or newer first.
    /// 4. Keep it quick under its locks: each transaction runs with
    ///    `lock_timeout` and is retried, but once it holds a lock every query
    ///    on that table waits for its commit. No table rewrite (a volatile
    ///    default, a type change) and no index build on a large table inside
    ///    it: `CREATE INDEX CONCURRENTLY` cannot run in a transaction and needs
    ///    a step of its own this list does not have yet. Backfill large tables
    ///    in the application, in chunks, not here.
    /// 5. No parameters and no `BEGIN`/`COMMIT`: the statements run as one
    ///    script in the migration's transaction, with the version's row in
    ///    `schema_migrations` (and the level, for a contract).
    /// 6. Add a test that the previous release works on the new schema
    ///    (Tests/reliability/test_rolling_upgrade.py runs it).
    ///
    /// 1–3 predate this scheme; binaries of then read `schema_version` as the
    /// number of migrations applied, so each counts as a contract of its own
    /// version (the level of a database they made is 3, as they wrote it).
    static let migrations: [Migration] = [
        // 1: the registry, the queue, the key check, and what instances share.
        .contract(
            requires: 1,
            """
            CREATE TABLE devices (
                device_id text PRIMARY KEY,
                app text NOT NULL,
                user_name bytea NOT NULL,
                platform text NOT NULL,
                environment text,
                binding_hash bytea NOT NULL UNIQUE,
                token_hash text NOT NULL,
                token_sealed bytea NOT NULL,
                keys_sealed bytea,
                name bytea,
                app_version bytea,
                session_hash bytea,
                registration_id bytea,
                version bigint,
                created_at bigint NOT NULL,
                registered_at bigint NOT NULL,
                registered_seq bigint NOT NULL,
                last_success_at bigint,
                last_failure_at bigint,
                last_failure_reason text
            );
            CREATE INDEX devices_by_user ON devices (app, user_name, registered_seq);
            CREATE UNIQUE INDEX devices_by_registration ON devices (app, user_name, registration_id)
                WHERE registration_id IS NOT NULL;
            CREATE SEQUENCE registration_seq;
            CREATE TABLE tombstones (
                app text NOT NULL,
                user_name bytea NOT NULL,
                registration_id bytea NOT NULL,
                version bigint NOT NULL,
                created_at bigint NOT NULL,
                PRIMARY KEY (app, user_name, registration_id)
            );
            CREATE INDEX tombstones_by_age ON tombstones (created_at);
            CREATE TABLE messages (
                message_id text PRIMARY KEY,
                app text NOT NULL,
                idempotency_hash bytea,
                payload text NOT NULL,
                created_at bigint NOT NULL,
                expires_at bigint NOT NULL
            );
            CREATE UNIQUE INDEX messages_by_idempotency ON messages (app, idempotency_hash)
                WHERE idempotency_hash IS NOT NULL;
            CREATE INDEX messages_by_age ON messages (created_at);
            CREATE TABLE deliveries (
                delivery_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                message_id text NOT NULL REFERENCES messages (message_id) ON DELETE CASCADE,
                app text NOT NULL,
                device_id text NOT NULL,
                user_name bytea NOT NULL,
                platform text NOT NULL,
                token_hash text NOT NULL,
                collapse_key bytea,
                state text NOT NULL,
                attempts integer NOT NULL DEFAULT 0,
                next_attempt_at bigint NOT NULL,
                http_status integer,
                reason text,
                updated_at bigint NOT NULL,
                sent_by text,
                lease_expires_at bigint
            );
            CREATE INDEX deliveries_by_message ON deliveries (message_id);
            CREATE INDEX deliveries_by_user ON deliveries (app, user_name);
            CREATE INDEX deliveries_due ON deliveries (app, platform, next_attempt_at)
                WHERE state IN ('queued', 'retrying');
            CREATE INDEX deliveries_next_due ON deliveries (next_attempt_at) WHERE state IN ('queued', 'retrying');
            CREATE INDEX deliveries_leased ON deliveries (lease_expires_at) WHERE state = 'in_flight';
            CREATE INDEX deliveries_pending_by_device ON deliveries (device_id, collapse_key)
                WHERE state IN ('queued', 'retrying');
            CREATE UNIQUE INDEX deliveries_one_queued_per_collapse ON deliveries (device_id, collapse_key)
                WHERE state = 'queued' AND collapse_key IS NOT NULL;
            CREATE TABLE store_meta (
                name text PRIMARY KEY,
                value bytea NOT NULL
            );
            CREATE TABLE rate_buckets (
                bucket text PRIMARY KEY,
                tokens double precision NOT NULL,
                updated_at bigint NOT NULL
            );
            CREATE TABLE stale_deletions (
                platform text NOT NULL,
                deleted_at bigint NOT NULL
            );
            CREATE INDEX stale_deletions_by_time ON stale_deletions (platform, deleted_at);
            """),
        // 2: device management and per-device sending facts (SQLite's 7): a
        // device turned off by id, its APNs bundle id (NULL: the app's default
        // topic), and the VAPID public key of a Web Push subscription (NULL: the
        // app's current key).
        .contract(
            requires: 2,
            """
            ALTER TABLE devices ADD COLUMN enabled boolean NOT NULL DEFAULT true;
            ALTER TABLE devices ADD COLUMN bundle_id text;
            ALTER TABLE devices ADD COLUMN server_key text;
            """),
        // 3: client builds and content records (SQLite's 8): a registration's
        // build (`app_id`, part of its identity; "stable" for every earlier
        // row) and its user agent, both chosen by the client (bytea); which
        // shrink step a delivery's Web Push record took.
        .contract(
            requires: 3,
            """
            ALTER TABLE devices ADD COLUMN app_id bytea NOT NULL DEFAULT 'stable'::bytea;
            ALTER TABLE devices ADD COLUMN user_agent bytea;
            ALTER TABLE deliveries ADD COLUMN shrunk integer;
            """),
        // 4: the instances sharing the database: one row each, with the key of
        // the session advisory lock its process holds while it lives (a dead
        // process's lock is gone with its sessions), a heartbeat on the
        // database's clock, and the lanes (`app` U+001F `platform`) it can send.
        .expand(
            """
            CREATE TABLE instances (
                instance_id text PRIMARY KEY,
                lock_key bigint NOT NULL,
                host text NOT NULL,
                pid integer NOT NULL,
                version text NOT NULL,
                started_at bigint NOT NULL,
                heartbeat_at bigint NOT NULL,
                lanes text[] NOT NULL DEFAULT '{}'
            );
            """),
        // 5: the queue's live work apart from its history. `deliveries` keeps
        // its name and columns and becomes a table partitioned by `state`:
        // `deliveries_live` holds what is queued, retrying or in flight (the
        // queue's partial indexes, so that its table and indexes stay the size
        // of the live work), `deliveries_done` every finished delivery (the
        // former table itself, attached as the default partition: no copy of
        // the history). A finished delivery moves from one to the other in
        // the update that records it. Older binaries keep working on it: the
        // name, the columns and their defaults are the same, ids come from a
        // sequence that continues the identity's (PostgreSQL 15 has no identity
        // on a partitioned table), and nothing of theirs names a partition.
        // Under its lock the migration moves the live rows (few: the partial
        // indexes find them) and reads the history once to attach it (a scan,
        // not a rewrite or an index build: the history's indexes are reused;
        // about a second per gigabyte of history, so without the connection's
        // statement timeout; the lock is still taken within `lock_timeout`).
        // The foreign key to `messages` gives way to a statement trigger that
        // deletes a deleted message's deliveries, as its ON DELETE CASCADE did
        // for every release's purge: a key checked on every row inserted and
        // every row moved to the history cost more than the rest of the move.
        // The index by user (`user.forget`) stays on the history alone: on the
        // live partition, small, a scan finds a user's rows, and every delivery
        // written saves an index entry. Vacuum does not truncate the live
        // partition: that takes its access exclusive lock, and the queue's
        // every statement would wait for it; the space is used again.
        // `take_delivery_ids(n)` takes the table's lock and n ids ahead in one
        // statement, for the deliveries a message hands over before its rows
        // are written.
        .expand(
            """
            SET LOCAL statement_timeout = 0;
            LOCK TABLE deliveries IN ACCESS EXCLUSIVE MODE;
            ALTER TABLE deliveries RENAME TO deliveries_done;
            ALTER TABLE deliveries_done RENAME CONSTRAINT deliveries_pkey TO deliveries_done_pkey;
            ALTER INDEX deliveries_by_message RENAME TO deliveries_done_by_message;
            ALTER INDEX deliveries_by_user RENAME TO deliveries_done_by_user;
            DROP INDEX deliveries_due, deliveries_next_due, deliveries_leased, deliveries_pending_by_device,
                deliveries_one_queued_per_collapse;
            ALTER SEQUENCE deliveries_delivery_id_seq RENAME TO deliveries_done_delivery_id_seq;
            DO $$
            DECLARE next bigint;
            BEGIN
                SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END INTO next
                FROM deliveries_done_delivery_id_seq;
                EXECUTE format('CREATE SEQUENCE deliveries_delivery_id_seq START WITH %s', next);
            END $$;
            ALTER TABLE deliveries_done ALTER COLUMN delivery_id DROP IDENTITY;
            CREATE TABLE deliveries (LIKE deliveries_done INCLUDING DEFAULTS) PARTITION BY LIST (state);
            ALTER TABLE deliveries ALTER COLUMN delivery_id SET DEFAULT nextval('deliveries_delivery_id_seq');
            ALTER SEQUENCE deliveries_delivery_id_seq OWNED BY deliveries.delivery_id;
            CREATE TABLE deliveries_live PARTITION OF deliveries FOR VALUES IN ('queued', 'retrying', 'in_flight');
            ALTER TABLE deliveries_live ADD PRIMARY KEY (delivery_id);
            ALTER TABLE deliveries_live SET (vacuum_truncate = false);
            ALTER TABLE deliveries_done DROP CONSTRAINT deliveries_message_id_fkey;
            CREATE FUNCTION deliveries_of_deleted_messages() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                DELETE FROM deliveries d USING deleted_messages g WHERE d.message_id = g.message_id;
                RETURN NULL;
            END $$;
            CREATE FUNCTION take_delivery_ids(n integer) RETURNS SETOF bigint LANGUAGE plpgsql AS $$
            BEGIN
                LOCK TABLE deliveries IN ROW EXCLUSIVE MODE;
                RETURN QUERY SELECT nextval('deliveries_delivery_id_seq') FROM generate_series(1, n);
            END $$;
            CREATE TRIGGER messages_take_their_deliveries AFTER DELETE ON messages
                REFERENCING OLD TABLE AS deleted_messages FOR EACH STATEMENT
                EXECUTE FUNCTION deliveries_of_deleted_messages();
            WITH moved AS (
                DELETE FROM deliveries_done WHERE state IN ('queued', 'retrying', 'in_flight') RETURNING *)
            INSERT INTO deliveries_live SELECT * FROM moved;
            ALTER TABLE deliveries ATTACH PARTITION deliveries_done DEFAULT;
            CREATE INDEX deliveries_by_message ON deliveries (message_id);
            CREATE INDEX deliveries_due ON deliveries_live (app, platform, next_attempt_at)
                WHERE state IN ('queued', 'retrying');
            CREATE INDEX deliveries_next_due ON deliveries_live (next_attempt_at) WHERE state IN ('queued', 'retrying');
            CREATE INDEX deliveries_leased ON deliveries_live (lease_expires_at) WHERE state = 'in_flight';
            CREATE INDEX deliveries_pending_by_device ON deliveries_live (device_id, collapse_key)
                WHERE state IN ('queued', 'retrying');
            CREATE UNIQUE INDEX deliveries_one_queued_per_collapse ON deliveries_live (device_id, collapse_key)
                WHERE state = 'queued' AND collapse_key IS NOT NULL;
            """),
        // 6: what happened, as it happens (SQLite's 10). `attempts`: one row per
        // attempt a provider saw, with what names the push there; deleted with
        // their deliveries. `events`: the stream `events.subscribe` reads,
        // written in the transaction of the change it reports: a delivery's
        // final outcome and a message's completion by the statement triggers
        // below (so that a release before this one writes them too), the rest
        // by the code that removes a device or judges a credential. An event
        // is ordered by the id of the transaction that wrote it (`xid`), then
        // its own; readers read only below the oldest transaction still
        // running, so that no event can commit behind a cursor already read.
        // A statement that ends deliveries locks their messages' rows (in
        // message order) and then, in a statement of its own and so with a
        // snapshot taken after the lock, writes the completion of each whose
        // deliveries are all final: of two instances ending a message's last
        // two deliveries at once, the second to take the lock sees the
        // first's and writes it, once.
        .expand(
            """
            CREATE TABLE attempts (
                attempt_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                delivery_id bigint NOT NULL,
                at bigint NOT NULL,
                state text NOT NULL,
                http_status integer,
                reason text,
                request_id text,
                provider_id text,
                origin text,
                elapsed_ms bigint,
                sent_by text
            );
            CREATE INDEX attempts_by_delivery ON attempts (delivery_id);
            CREATE TABLE events (
                xid bigint NOT NULL DEFAULT (pg_current_xact_id()::text::bigint),
                id bigint GENERATED ALWAYS AS IDENTITY,
                at bigint NOT NULL,
                app text NOT NULL,
                kind text NOT NULL,
                message_id text,
                device_id text,
                user_name bytea,
                platform text,
                state text,
                reason text,
                http_status integer,
                request_id text,
                provider_id text,
                detail text,
                PRIMARY KEY (xid, id)
            );
            CREATE INDEX events_by_age ON events (at);
            CREATE FUNCTION deliveries_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO events (at, app, kind, message_id, device_id, user_name, platform, state, reason,
                    http_status)
                SELECT n.updated_at, n.app, 'delivery', n.message_id, n.device_id, n.user_name, n.platform, n.state,
                    n.reason, n.http_status
                FROM inserted_deliveries n WHERE n.state NOT IN ('queued', 'retrying', 'in_flight')
                ORDER BY n.delivery_id;
                RETURN NULL;
            END $$;
            CREATE FUNCTION deliveries_updated() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO events (at, app, kind, message_id, device_id, user_name, platform, state, reason,
                    http_status, request_id, provider_id)
                SELECT n.updated_at, n.app, 'delivery', n.message_id, n.device_id, n.user_name, n.platform, n.state,
                    n.reason, n.http_status, a.request_id, a.provider_id
                FROM updated_new n JOIN updated_old o ON o.delivery_id = n.delivery_id
                    LEFT JOIN LATERAL (
                        SELECT request_id, provider_id FROM attempts WHERE delivery_id = n.delivery_id
                        ORDER BY attempt_id DESC LIMIT 1) a ON true
                WHERE n.state NOT IN ('queued', 'retrying', 'in_flight') AND o.state IN ('queued', 'retrying', 'in_flight')
                ORDER BY n.delivery_id;
                PERFORM 1 FROM messages m WHERE m.message_id IN (
                    SELECT n.message_id FROM updated_new n JOIN updated_old o ON o.delivery_id = n.delivery_id
                    WHERE n.state NOT IN ('queued', 'retrying', 'in_flight') AND o.state IN ('queued', 'retrying', 'in_flight'))
                ORDER BY m.message_id FOR UPDATE;
                INSERT INTO events (at, app, kind, message_id, detail)
                SELECT c.at, m.app, 'message_complete', m.message_id,
                    (SELECT json_object_agg(s.state, s.n)::text FROM (
                        SELECT state, count(*) AS n FROM deliveries WHERE message_id = m.message_id GROUP BY state) s)
                FROM (
                    SELECT n.message_id, max(n.updated_at) AS at
                    FROM updated_new n JOIN updated_old o ON o.delivery_id = n.delivery_id
                    WHERE n.state NOT IN ('queued', 'retrying', 'in_flight') AND o.state IN ('queued', 'retrying', 'in_flight')
                    GROUP BY n.message_id) c
                JOIN messages m ON m.message_id = c.message_id
                WHERE NOT EXISTS (SELECT 1 FROM deliveries_live l WHERE l.message_id = c.message_id)
                ORDER BY m.message_id;
                RETURN NULL;
            END $$;
            CREATE FUNCTION deliveries_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                DELETE FROM attempts a USING deleted_deliveries o WHERE a.delivery_id = o.delivery_id;
                RETURN NULL;
            END $$;
            CREATE TRIGGER deliveries_insert_events AFTER INSERT ON deliveries
                REFERENCING NEW TABLE AS inserted_deliveries FOR EACH STATEMENT
                EXECUTE FUNCTION deliveries_inserted();
            CREATE TRIGGER deliveries_update_events AFTER UPDATE ON deliveries
                REFERENCING OLD TABLE AS updated_old NEW TABLE AS updated_new FOR EACH STATEMENT
                EXECUTE FUNCTION deliveries_updated();
            CREATE TRIGGER deliveries_delete_attempts AFTER DELETE ON deliveries
                REFERENCING OLD TABLE AS deleted_deliveries FOR EACH STATEMENT
                EXECUTE FUNCTION deliveries_deleted();
            """),
        // 7: each device's own rules and sends at a time (SQLite's 11): a
        // device's `time_zone`, `quiet_hours` and `topics`; a held delivery
        // is a queued row due at `held_until` (its `next_attempt_at`), with
        // the notes of its `timing`; its acceptance writes a `delivery` event
        // with state `held` and its due time. Columns that older binaries
        // leave NULL, and a trigger function that writes what it wrote before
        // and the held rows' events besides.
        .expand(
            """
            ALTER TABLE devices ADD COLUMN time_zone text, ADD COLUMN quiet_hours text, ADD COLUMN topics text;
            ALTER TABLE deliveries ADD COLUMN held_until bigint, ADD COLUMN timing text;
            CREATE OR REPLACE FUNCTION deliveries_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO events (at, app, kind, message_id, device_id, user_name, platform, state, reason,
                    http_status)
                SELECT n.updated_at, n.app, 'delivery', n.message_id, n.device_id, n.user_name, n.platform, n.state,
                    n.reason, n.http_status
                FROM inserted_deliveries n WHERE n.state NOT IN ('queued', 'retrying', 'in_flight')
                ORDER BY n.delivery_id;
                INSERT INTO events (at, app, kind, message_id, device_id, user_name, platform, state, detail)
                SELECT n.updated_at, n.app, 'delivery', n.message_id, n.device_id, n.user_name, n.platform, 'held',
                    json_build_object('due_at', n.held_until, 'timing', n.timing)::text
                FROM inserted_deliveries n WHERE n.state = 'queued' AND n.held_until IS NOT NULL
                ORDER BY n.delivery_id;
                RETURN NULL;
            END $$;
            """),
        // 8: Live Activity tokens (SQLite's 12): rows of `devices` with
        // platform `apns_liveactivity` and an `activity_role` (`start`, by
        // `activity_type`; `update`, by `activity_id`) under their
        // `parent_device_id`. A device that goes takes them with it; one
        // whose id moves keeps them. Older binaries pass over the rows (they
        // do not know the platform).
        .expand(
            """
            ALTER TABLE devices ADD COLUMN parent_device_id text, ADD COLUMN activity_role text,
                ADD COLUMN activity_type text, ADD COLUMN activity_id text;
            CREATE INDEX devices_by_parent ON devices (parent_device_id) WHERE parent_device_id IS NOT NULL;
            CREATE INDEX devices_by_activity ON devices (app, user_name, activity_role, activity_id, activity_type)
                WHERE activity_role IS NOT NULL;
            CREATE FUNCTION devices_deleted_activities() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                -- The tokens' own deletion fires this again, with no device among them: it stops there.
                IF EXISTS (SELECT 1 FROM deleted_devices o WHERE o.activity_role IS NULL) THEN
                    DELETE FROM devices WHERE parent_device_id IN (
                        SELECT o.device_id FROM deleted_devices o WHERE o.activity_role IS NULL);
                END IF;
                RETURN NULL;
            END $$;
            CREATE TRIGGER devices_deleted_activities AFTER DELETE ON devices
                REFERENCING OLD TABLE AS deleted_devices FOR EACH STATEMENT
                EXECUTE FUNCTION devices_deleted_activities();
            CREATE FUNCTION devices_moved_activities() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                UPDATE devices SET parent_device_id = NEW.device_id WHERE parent_device_id = OLD.device_id;
                RETURN NULL;
            END $$;
            CREATE TRIGGER devices_moved_activities AFTER UPDATE OF device_id ON devices
                FOR EACH ROW WHEN (OLD.activity_role IS NULL AND NEW.device_id <> OLD.device_id)
                EXECUTE FUNCTION devices_moved_activities();
            CREATE TABLE activity_high_sends (app text NOT NULL, activity_id text NOT NULL, sent_at bigint NOT NULL);
            CREATE INDEX activity_high_sends_by_activity ON activity_high_sends (app, activity_id, sent_at);
            CREATE INDEX activity_high_sends_by_age ON activity_high_sends (app, sent_at);
            """),
    ]

    /// Brings the database to the newest schema this binary knows; applies
    /// nothing and throws ``PostgresSchemaError`` when the database's level is
    /// above what it knows, when another instance holds the migration lock
    /// past `policy.lockWait`, or when a migration cannot take its locks in
    /// `policy.attempts` tries.
    static func migrate(
        _ c: PostgresConnection, migrations: [Migration] = migrations, policy: Policy = .standard
    ) throws {
        try lock(c, policy: policy)
        defer { _ = try? c.execute("SELECT pg_advisory_unlock($1)", [.int(migrationLock)]) }
        var (level, applied) = try attempt("reading the schema version", policy: policy, c) { c in
            try state(c, migrations: migrations)
        }
        guard level <= migrations.count else {
            throw PostgresSchemaError.incompatible(needs: level, knows: migrations.count)
        }
        for (index, migration) in migrations.enumerated() where !applied.contains(index + 1) {
            let version = index + 1
            precondition(migration.requires <= version, "migration \(version) requires a later schema")
            level = try attempt("migration \(version) (\(migration.kindName))", policy: policy, c) { c in
                try c.executeScript(migration.sql)
                try c.execute(
                    "INSERT INTO schema_migrations (version, kind, applied_at) VALUES ($1, $2, now())",
                    [.int(Int64(version)), .text(migration.kindName)])
                guard migration.requires > level else { return level }
                try setLevel(c, migration.requires)
                return migration.requires
            }
            applied.insert(version)
        }
    }

    /// The compatibility level recorded (0 for an empty database).
    static func version(_ c: PostgresConnection) throws -> Int {
        let exists = try c.execute("SELECT to_regclass('schema_version') IS NOT NULL").first?.bool(0) ?? false
        guard exists else { return 0 }
        return Int(try c.execute("SELECT coalesce(max(version), 0) FROM schema_version").first?.int64(0) ?? 0)
    }

    /// The versions `schema_migrations` records, in order (empty before it exists).
    static func applied(_ c: PostgresConnection) throws -> [Int] {
        let exists = try c.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").first?.bool(0) ?? false
        guard exists else { return [] }
        return try c.execute("SELECT version FROM schema_migrations ORDER BY version").rows.map {
            Int(try $0.int64(0))
        }
    }

    // MARK: Steps

    /// Takes the migration lock, waiting at most `policy.lockWait` for the
    /// instance that holds it.
    private static func lock(_ c: PostgresConnection, policy: Policy) throws {
        let start = ContinuousClock.now
        var pause = Duration.milliseconds(20)
        while true {
            if try c.execute("SELECT pg_try_advisory_lock($1)", [.int(migrationLock)]).first?.bool(0) == true {
                return
            }
            let waited = ContinuousClock.now - start
            if waited >= policy.lockWait {
                throw PostgresSchemaError.migrating(waited: policy.lockWait, holder: try? lockHolder(c))
            }
            Thread.sleep(forTimeInterval: seconds(min(pause, policy.lockWait - waited)))
            pause = min(pause * 2, .milliseconds(500))
        }
    }

    /// The session holding the migration lock, as `pg_stat_activity` shows it.
    private static func lockHolder(_ c: PostgresConnection) throws -> String? {
        let rows = try c.execute(
            """
            SELECT a.pid, coalesce(nullif(a.application_name, ''), '-'), coalesce(host(a.client_addr), 'local'),
                   coalesce(to_char(a.backend_start, 'YYYY-MM-DD"T"HH24:MI:SSOF'), '-')
            FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
            WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
              AND l.classid::bigint = $1 AND l.objid::bigint = $2
            """, [.int(migrationLock >> 32), .int(migrationLock & 0xffff_ffff)])
        guard let row = rows.first else { return nil }
        return try "PostgreSQL backend pid \(row.int64(0)), application \(row.text(1)), client \(row.text(2)), "
            + "connected \(row.text(3))"
    }

    /// Creates the bookkeeping tables as needed and reads the level and the
    /// migrations applied. A database from before `schema_migrations` had
    /// exactly migrations 1…`schema_version`: they are recorded (when this
    /// binary knows them all) and the level recomputed from their kinds.
    private static func state(_ c: PostgresConnection, migrations: [Migration]) throws -> (Int, Set<Int>) {
        try c.executeScript("CREATE TABLE IF NOT EXISTS schema_version (version integer NOT NULL)")
        let stored = Int(try c.execute("SELECT coalesce(max(version), 0) FROM schema_version").first?.int64(0) ?? 0)
        let recorded = try c.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").first?.bool(0) ?? false
        if recorded {
            let versions = try c.execute("SELECT version FROM schema_migrations").rows.map { Int(try $0.int64(0)) }
            return (stored, Set(versions))
        }
        guard stored <= migrations.count else { return (stored, []) }
        try c.executeScript(
            """
            CREATE TABLE schema_migrations (
                version integer PRIMARY KEY,
                kind text NOT NULL,
                applied_at timestamptz
            )
            """)
        for (index, migration) in migrations.prefix(stored).enumerated() {
            try c.execute(
                "INSERT INTO schema_migrations (version, kind) VALUES ($1, $2)",
                [.int(Int64(index + 1)), .text(migration.kindName)])
        }
        let level = migrations.prefix(stored).map(\.requires).max() ?? 0
        if level != stored { try setLevel(c, level) }
        return (level, Set((0..<stored).map { $0 + 1 }))
    }

    private static func setLevel(_ c: PostgresConnection, _ level: Int) throws {
        try c.execute("DELETE FROM schema_version")
        try c.execute("INSERT INTO schema_version (version) VALUES ($1)", [.int(Int64(level))])
    }

    /// Runs `body` in a transaction with `lock_timeout`, again after a lock
    /// timeout or a deadlock (with a growing pause), at most `policy.attempts` times.
    private static func attempt<T>(
        _ what: String, policy: Policy, _ c: PostgresConnection, _ body: (PostgresConnection) throws -> T
    ) throws -> T {
        var pause = policy.retryDelay
        for attempt in 1...max(1, policy.attempts) {
            do {
                return try c.transaction { c in
                    try c.execute(
                        "SELECT set_config('lock_timeout', $1, true)", [.text("\(milliseconds(policy.lockTimeout))ms")])
                    return try body(c)
                }
            } catch let error as PostgresError
                where error.sqlState == .lockNotAvailable || error.sqlState == .deadlockDetected
            {
                guard attempt < policy.attempts else {
                    throw PostgresSchemaError.lockTimeout(
                        what: what, lockTimeout: policy.lockTimeout, attempts: policy.attempts, last: error)
                }
                Thread.sleep(forTimeInterval: seconds(pause))
                pause = pause * 2
            }
        }
        preconditionFailure("unreachable: the last attempt returns or throws")
    }

    private static func milliseconds(_ d: Duration) -> Int64 {
        d.components.seconds * 1000 + d.components.attoseconds / 1_000_000_000_000_000
    }

    /// "5 s", "0.3 s".
    static func text(_ d: Duration) -> String {
        let ms = milliseconds(d)
        return ms % 1000 == 0 ? "\(ms / 1000) s" : "\(Double(ms) / 1000) s"
    }

    private static func seconds(_ d: Duration) -> Double {
        Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18
    }
}

/// Why the schema could not be brought to what this Herald needs.
public struct PostgresSchemaError: Error, Sendable, CustomStringConvertible {
    public enum Problem: Sendable, Equatable {
        /// The database needs a binary that knows schema `needs`; this one knows `knows`.
        case incompatible(needs: Int, knows: Int)
        /// Another instance held the migration lock past the wait.
        case migrating
        /// A migration (or reading the version) could not take its locks.
        case lockTimeout
    }

    public let problem: Problem
    public let message: String

    public var description: String { message }

    static func incompatible(needs: Int, knows: Int) -> PostgresSchemaError {
        PostgresSchemaError(
            problem: .incompatible(needs: needs, knows: knows),
            message: "database schema version \(needs) is newer than this herald: the database requires herald "
                + "schema \(needs) or newer; this herald knows schema \(knows). A newer release removed or changed "
                + "what this one uses: upgrade this host")
    }

    static func migrating(waited: Duration, holder: String?) -> PostgresSchemaError {
        PostgresSchemaError(
            problem: .migrating,
            message: "another instance is migrating the database schema: the migration lock is still held after "
                + "\(PostgresSchema.text(waited))\(holder.map { " (by \($0))" } ?? ""); start again once it is done")
    }

    static func lockTimeout(
        what: String, lockTimeout: Duration, attempts: Int, last: PostgresError
    )
        -> PostgresSchemaError
    {
        PostgresSchemaError(
            problem: .lockTimeout,
            message: "\(what): could not take its locks within lock_timeout \(PostgresSchema.text(lockTimeout)) in "
                + "\(attempts) tries (\(last)): a long transaction holds a table it changes (see pg_stat_activity and "
                + "pg_locks); nothing of it was applied, start again once that transaction ends")
    }
}
