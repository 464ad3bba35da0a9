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
        // 3: the durable delivery queue: a message and one delivery per device.
        """
        CREATE TABLE messages (
            message_id TEXT PRIMARY KEY,
            app TEXT NOT NULL,
            idempotency_hash BLOB,
            payload TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            expires_at INTEGER NOT NULL
        ) STRICT;
        CREATE UNIQUE INDEX messages_by_idempotency ON messages (app, idempotency_hash)
            WHERE idempotency_hash IS NOT NULL;
        CREATE INDEX messages_by_age ON messages (created_at);
        CREATE TABLE deliveries (
            delivery_id INTEGER PRIMARY KEY,
            message_id TEXT NOT NULL REFERENCES messages (message_id) ON DELETE CASCADE,
            device_id TEXT NOT NULL,
            user TEXT NOT NULL,
            platform TEXT NOT NULL,
            token_hash TEXT NOT NULL,
            collapse_key TEXT,
            state TEXT NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            next_attempt_at INTEGER NOT NULL,
            http_status INTEGER,
            reason TEXT,
            updated_at INTEGER NOT NULL
        ) STRICT;
        CREATE INDEX deliveries_by_message ON deliveries (message_id);
        CREATE INDEX deliveries_due ON deliveries (next_attempt_at) WHERE state IN ('queued', 'retrying');
        CREATE INDEX deliveries_in_flight ON deliveries (state) WHERE state = 'in_flight';
        CREATE INDEX deliveries_pending_by_device ON deliveries (device_id, collapse_key)
            WHERE state IN ('queued', 'retrying');
        """,
        // 4: claims go lane by lane (one platform of one app at a time).
        """
        CREATE INDEX deliveries_due_by_platform ON deliveries (platform, next_attempt_at)
            WHERE state IN ('queued', 'retrying');
        """,
        // 5: facts about the store itself: the check value of its key.
        """
        CREATE TABLE store_meta (
            name TEXT PRIMARY KEY,
            value BLOB NOT NULL
        ) STRICT;
        """,
        // 6: the instance that made a delivery's latest attempt (push.status sent_by).
        """
        ALTER TABLE deliveries ADD COLUMN sent_by TEXT;
        """,
        // 7: device management and per-device sending facts: a device turned
        // off by id (kept, skipped by sends), the APNs bundle id it was
        // registered under (NULL: the app's default topic), and the VAPID public
        // key a Web Push subscription was made with (NULL: the app's current key).
        """
        ALTER TABLE devices ADD COLUMN enabled INTEGER NOT NULL DEFAULT 1;
        ALTER TABLE devices ADD COLUMN bundle_id TEXT;
        ALTER TABLE devices ADD COLUMN server_key TEXT;
        """,
        // 8: client builds and content records: a registration's build
        // (`app_id`, part of its identity; "stable" for every earlier row) and
        // its user agent; which shrink step a delivery's Web Push record took.
        """
        ALTER TABLE devices ADD COLUMN app_id TEXT NOT NULL DEFAULT 'stable';
        ALTER TABLE devices ADD COLUMN user_agent TEXT;
        ALTER TABLE deliveries ADD COLUMN shrunk INTEGER;
        """,
        // 9: messages of many devices are written in parts; one listed here
        // is not whole yet (its recipients, how many are written, the ids
        // it took), and the next open writes the rest.
        """
        CREATE TABLE assembling (
            message_id TEXT PRIMARY KEY REFERENCES messages (message_id) ON DELETE CASCADE,
            recipients TEXT NOT NULL,
            by_device INTEGER NOT NULL,
            disabled TEXT NOT NULL,
            written INTEGER NOT NULL,
            next_id INTEGER NOT NULL,
            ids_end INTEGER NOT NULL
        );
        """,
        // 10: what happened, as it happens. `attempts`: one row per attempt
        // a provider saw (or that failed on the way), with what names the
        // push there (`provider_id`: the `apns-unique-id`, the FCM message
        // `name`, the Web Push `Location`; the `apns-id` is derived from the
        // delivery). `events`: the stream `events.subscribe` reads, written by
        // the triggers below in the transaction of the change they report
        // (a delivery's final outcome; a message complete: the trigger that
        // ends its last delivery not final finds none left, through
        // `deliveries_live_by_message`; the attempts' results write theirs a
        // batch at a time, marking their rows `evented` so that the trigger
        // passes over them) or by the code that
        // removes a device or judges a credential. `cursor` only grows
        // (AUTOINCREMENT: never reused once the newest row is purged).
        """
        CREATE TABLE attempts (
            attempt_id INTEGER PRIMARY KEY,
            delivery_id INTEGER NOT NULL REFERENCES deliveries (delivery_id) ON DELETE CASCADE,
            at INTEGER NOT NULL,
            state TEXT NOT NULL,
            http_status INTEGER,
            reason TEXT,
            request_id TEXT,
            provider_id TEXT,
            origin TEXT,
            elapsed_ms INTEGER,
            sent_by TEXT
        ) STRICT;
        CREATE INDEX attempts_by_delivery ON attempts (delivery_id);
        CREATE TABLE events (
            cursor INTEGER PRIMARY KEY AUTOINCREMENT,
            at INTEGER NOT NULL,
            app TEXT NOT NULL,
            kind TEXT NOT NULL,
            message_id TEXT,
            device_id TEXT,
            user TEXT,
            platform TEXT,
            state TEXT,
            reason TEXT,
            http_status INTEGER,
            request_id TEXT,
            provider_id TEXT,
            detail TEXT
        ) STRICT;
        CREATE INDEX events_by_age ON events (at);
        CREATE INDEX deliveries_live_by_message ON deliveries (message_id)
            WHERE state IN ('queued', 'retrying', 'in_flight');
        ALTER TABLE deliveries ADD COLUMN evented INTEGER;
        CREATE TRIGGER deliveries_inserted_final AFTER INSERT ON deliveries
            WHEN NEW.state NOT IN ('queued', 'retrying', 'in_flight')
        BEGIN
            INSERT INTO events (at, app, kind, message_id, device_id, user, platform, state, reason, http_status)
            SELECT NEW.updated_at, app, 'delivery', NEW.message_id, NEW.device_id, NEW.user, NEW.platform, NEW.state,
                NEW.reason, NEW.http_status
            FROM messages WHERE message_id = NEW.message_id;
        END;
        CREATE TRIGGER deliveries_finished AFTER UPDATE OF state ON deliveries
            WHEN NEW.state NOT IN ('queued', 'retrying', 'in_flight') AND OLD.state IN ('queued', 'retrying', 'in_flight')
                AND NEW.evented IS NULL
        BEGIN
            INSERT INTO events (at, app, kind, message_id, device_id, user, platform, state, reason, http_status,
                request_id, provider_id)
            SELECT NEW.updated_at, m.app, 'delivery', NEW.message_id, NEW.device_id, NEW.user, NEW.platform,
                NEW.state, NEW.reason, NEW.http_status, a.request_id, a.provider_id
            FROM messages m LEFT JOIN (
                SELECT request_id, provider_id FROM attempts WHERE delivery_id = NEW.delivery_id
                ORDER BY attempt_id DESC LIMIT 1) a
            WHERE m.message_id = NEW.message_id;
            INSERT INTO events (at, app, kind, message_id, detail)
            SELECT NEW.updated_at, app, 'message_complete', message_id,
                (SELECT json_group_object(state, n) FROM (
                    SELECT state, count(*) AS n FROM deliveries WHERE message_id = NEW.message_id GROUP BY state))
            FROM messages WHERE message_id = NEW.message_id
                AND NOT EXISTS (
                    SELECT 1 FROM deliveries INDEXED BY deliveries_live_by_message
                    WHERE message_id = NEW.message_id AND state IN ('queued', 'retrying', 'in_flight'))
                AND NOT EXISTS (SELECT 1 FROM assembling WHERE message_id = NEW.message_id);
        END;
        """,
        // 11: each device's own rules and sends at a time. A device's
        // `time_zone` (an IANA name), `quiet_hours` (`"22:00 07:00 hold"`,
        // then the days when listed: `" fri,sat"`) and `topics` (a JSON
        // array; NULL: every message). A held delivery is a queued row whose
        // `next_attempt_at` is its due time (so the claims, which read only
        // what is due, pass over it at no cost) with `held_until` set;
        // `timing` keeps the notes `push.status` shows (why it waited, or why
        // quiet hours did not hold it). A held delivery writes a `delivery`
        // event with state `held` and its due time when it is accepted.
        """
        ALTER TABLE devices ADD COLUMN time_zone TEXT;
        ALTER TABLE devices ADD COLUMN quiet_hours TEXT;
        ALTER TABLE devices ADD COLUMN topics TEXT;
        ALTER TABLE deliveries ADD COLUMN held_until INTEGER;
        ALTER TABLE deliveries ADD COLUMN timing TEXT;
        CREATE TRIGGER deliveries_inserted_held AFTER INSERT ON deliveries
            WHEN NEW.state = 'queued' AND NEW.held_until IS NOT NULL
        BEGIN
            INSERT INTO events (at, app, kind, message_id, device_id, user, platform, state, detail)
            SELECT NEW.updated_at, app, 'delivery', NEW.message_id, NEW.device_id, NEW.user, NEW.platform, 'held',
                json_object('due_at', NEW.held_until, 'timing', NEW.timing)
            FROM messages WHERE message_id = NEW.message_id;
        END;
        """,
        // 12: Live Activity tokens. A row of `devices` with platform
        // `apns_liveactivity` and an `activity_role`: `start` (a device's
        // push-to-start token for an `activity_type`) or `update` (a running
        // activity's token, by the app's `activity_id`), under the device it
        // came from (`parent_device_id`), in that device's app, user,
        // environment and bundle. Ordinary devices have no role; what lists,
        // counts or fans out to devices reads only those. A device that goes
        // takes its activity tokens with it; one whose id moves keeps them.
        """
        ALTER TABLE devices ADD COLUMN parent_device_id TEXT;
        ALTER TABLE devices ADD COLUMN activity_role TEXT;
        ALTER TABLE devices ADD COLUMN activity_type TEXT;
        ALTER TABLE devices ADD COLUMN activity_id TEXT;
        CREATE INDEX devices_by_parent ON devices (parent_device_id) WHERE parent_device_id IS NOT NULL;
        CREATE INDEX devices_by_activity ON devices (app, user, activity_role, activity_id, activity_type)
            WHERE activity_role IS NOT NULL;
        CREATE TRIGGER devices_deleted_activities AFTER DELETE ON devices WHEN OLD.activity_role IS NULL
        BEGIN
            DELETE FROM devices WHERE parent_device_id = OLD.device_id;
        END;
        CREATE TRIGGER devices_moved_activities AFTER UPDATE OF device_id ON devices
            WHEN OLD.activity_role IS NULL AND NEW.device_id <> OLD.device_id
        BEGIN
            UPDATE devices SET parent_device_id = NEW.device_id WHERE parent_device_id = OLD.device_id;
        END;
        CREATE TABLE activity_high_sends (
            app TEXT NOT NULL,
            activity_id TEXT NOT NULL,
            sent_at INTEGER NOT NULL
        ) STRICT;
        CREATE INDEX activity_high_sends_by_activity ON activity_high_sends (app, activity_id, sent_at);
        CREATE INDEX activity_high_sends_by_age ON activity_high_sends (app, sent_at);
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
