/// The database schema, one migration per `PRAGMA user_version` step.
enum Schema {
    static let migrations: [String] = [
        // 1: the device registry and registration tombstones.
        """
        CREATE TABLE devices (
            device_id TEXT PRIMARY KEY,
            app TEXT NOT NULL,
            user TEXT NOT NULL,
            platform TEXT NOT NULL,
            environment TEXT,
            binding_hash BLOB NOT NULL UNIQUE,
            token_hash TEXT NOT NULL,
            token_sealed BLOB NOT NULL,
            keys_sealed BLOB,
            name TEXT,
            app_version TEXT,
            session_hash BLOB,
            registration_id TEXT,
            version INTEGER,
            created_at INTEGER NOT NULL,
            registered_at INTEGER NOT NULL,
            last_success_at INTEGER,
            last_failure_at INTEGER,
            last_failure_reason TEXT
        ) STRICT;
        CREATE INDEX devices_by_user ON devices (app, user, registered_at);
        CREATE UNIQUE INDEX devices_by_registration ON devices (app, user, registration_id)
            WHERE registration_id IS NOT NULL;
        CREATE TABLE tombstones (
            app TEXT NOT NULL,
            user TEXT NOT NULL,
            registration_id TEXT NOT NULL,
            version INTEGER NOT NULL,
            created_at INTEGER NOT NULL,
            PRIMARY KEY (app, user, registration_id)
        ) STRICT;
        CREATE INDEX tombstones_by_age ON tombstones (created_at);
        """,
        // 2: a registration sequence: registrations in one group commit share a
        // timestamp, and recency (eviction, listing) must still be exact.
        """
        ALTER TABLE devices ADD COLUMN registered_seq INTEGER NOT NULL DEFAULT 0;
        UPDATE devices SET registered_seq = rowid;
        CREATE INDEX devices_by_user_seq ON devices (app, user, registered_seq);
        """,
    ]

    /// Brings the database to the newest version inside one transaction each.
    static func migrate(_ db: Database) throws(StoreError) {
        let current = Int(try db.pragmaInt("user_version"))
        guard current <= migrations.count else {
            throw StoreError(
                code: 0,
                message: "database schema version \(current) is newer than this herald (\(migrations.count))")
        }
        for version in current..<migrations.count {
            try db.execute("BEGIN IMMEDIATE")
            do {
                try db.execute(migrations[version])
                try db.execute("PRAGMA user_version = \(version + 1)")
                try db.execute("COMMIT")
            } catch {
                try? db.execute("ROLLBACK")
                throw error
            }
        }
    }
}
