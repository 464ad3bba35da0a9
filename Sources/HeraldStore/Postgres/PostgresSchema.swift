import Postgres

/// The PostgreSQL schema, one migration per version recorded in
/// `schema_version`. Instances starting at once migrate one at a time (a
/// session advisory lock), each migration in a transaction of its own.
///
/// Strings a client chooses (user names, registration ids, device names,
/// app versions, collapse keys) are `bytea`: PostgreSQL `text` cannot hold
/// a NUL, and a client may send one; bytes compare and index exactly as the
/// strings did in SQLite.
enum PostgresSchema {
    /// The key of the advisory lock held while migrating.
    static let migrationLock: Int64 = 0x6865_7261_6c64_0001

    static let migrations: [String] = [
        // 1: the registry, the queue, the key check, and what instances share.
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
        """,
        // 2: device management and per-device sending facts (SQLite's 7): a
        // device turned off by id, its APNs bundle id (NULL: the app's default
        // topic), and the VAPID public key of a Web Push subscription (NULL: the
        // app's current key).
        """
        ALTER TABLE devices ADD COLUMN enabled boolean NOT NULL DEFAULT true;
        ALTER TABLE devices ADD COLUMN bundle_id text;
        ALTER TABLE devices ADD COLUMN server_key text;
        """,
        // 3: client builds and content records (SQLite's 8): a registration's
        // build (`app_id`, part of its identity; "stable" for every earlier
        // row) and its user agent, both chosen by the client (bytea); which
        // shrink step a delivery's Web Push record took.
        """
        ALTER TABLE devices ADD COLUMN app_id bytea NOT NULL DEFAULT 'stable'::bytea;
        ALTER TABLE devices ADD COLUMN user_agent bytea;
        ALTER TABLE deliveries ADD COLUMN shrunk integer;
        """,
        // 4: the instances sharing the database: one row each, with the key of
        // the session advisory lock its process holds while it lives (a dead
        // process's lock is gone with its sessions), a heartbeat on the
        // database's clock, and the lanes (`app` U+001F `platform`) it can send.
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
        """,
    ]

    /// Brings the database to the newest version; throws when it is newer
    /// than this Herald knows.
    static func migrate(_ c: PostgresConnection) throws {
        try c.execute("SELECT pg_advisory_lock($1)", [.int(migrationLock)])
        defer { _ = try? c.execute("SELECT pg_advisory_unlock($1)", [.int(migrationLock)]) }
        try c.executeScript("CREATE TABLE IF NOT EXISTS schema_version (version integer NOT NULL)")
        let current = Int(try c.execute("SELECT coalesce(max(version), 0) FROM schema_version").first?.int64(0) ?? 0)
        guard current <= migrations.count else {
            throw StoreError(
                code: 0,
                message: "database schema version \(current) is newer than this herald (\(migrations.count))")
        }
        for version in current..<migrations.count {
            try c.transaction { c in
                try c.executeScript(migrations[version])
                try c.execute("DELETE FROM schema_version")
                try c.execute("INSERT INTO schema_version (version) VALUES ($1)", [.int(Int64(version + 1))])
            }
        }
    }

    /// The schema version recorded (0 for an empty database).
    static func version(_ c: PostgresConnection) throws -> Int {
        let exists = try c.execute("SELECT to_regclass('schema_version') IS NOT NULL").first?.bool(0) ?? false
        guard exists else { return 0 }
        return Int(try c.execute("SELECT coalesce(max(version), 0) FROM schema_version").first?.int64(0) ?? 0)
    }
}
