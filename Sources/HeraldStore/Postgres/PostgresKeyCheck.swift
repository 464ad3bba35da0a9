import HeraldCrypto
import Postgres

/// ``StoreKeyCheck`` on PostgreSQL: the same check value in `store_meta`,
/// settled in one transaction under an advisory lock, so that instances
/// starting at once agree. A shared database differs in one rule: an
/// instance without a key file never makes a new key for a database that
/// already records one (another instance made it; its key file must be
/// copied here), even while the database holds no data yet.
enum PostgresKeyCheck {
    static let lock: Int64 = 0x6865_7261_6c64_0002

    static func settle(
        _ c: PostgresConnection, supply: StoreKeySupply, keyFile: String, database: String
    ) throws -> (key: StoreKey, outcome: StoreKeyOutcome) {
        try c.transaction { c in
            try c.execute("SELECT pg_advisory_xact_lock($1)", [.int(lock)])
            return try StoreKeyCheck.decide(supply: supply, keyFile: keyFile, database: database, Statements(c: c))
        }
    }

    /// The key check's statements on one connection.
    private struct Statements: KeyCheckStatements {
        let c: PostgresConnection

        var isShared: Bool { true }

        func recordedCheck() throws -> [UInt8]? {
            try c.execute("SELECT value FROM store_meta WHERE name = $1", [.text(StoreKeyCheck.name)]).first?.bytes(0)
        }

        func count(_ table: String) throws -> Int {
            Int(try c.execute("SELECT count(*) FROM \(table)").first?.int64(0) ?? 0)
        }

        /// The first 1,000 rows at most: a shared registry may be large,
        /// and a key that opens none of them is not its key.
        func forEachSealedToken(_ body: (String, [UInt8]) -> Bool) throws {
            for r in try c.execute("SELECT device_id, token_sealed FROM devices LIMIT 1000").rows {
                if body(try r.text(0), try r.bytes(1)) { return }
            }
        }

        func record(_ value: [UInt8]) throws {
            try c.execute(
                """
                INSERT INTO store_meta (name, value) VALUES ($1, $2)
                ON CONFLICT (name) DO UPDATE SET value = excluded.value
                """, [.text(StoreKeyCheck.name), .bytes(value)])
        }
    }
}
