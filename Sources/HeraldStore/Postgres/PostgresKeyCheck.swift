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
            return try decide(c, supply: supply, keyFile: keyFile, database: database)
        }
    }

    private static func decide(
        _ c: PostgresConnection, supply: StoreKeySupply, keyFile: String, database: String
    ) throws -> (key: StoreKey, outcome: StoreKeyOutcome) {
        func refuse(_ problem: StoreKeyError.Problem) -> StoreKeyError {
            StoreKeyError(problem, keyFile: keyFile, database: database)
        }
        let recorded = try c.execute("SELECT value FROM store_meta WHERE name = $1", [.text(StoreKeyCheck.name)])
            .first?.bytes(0)
        switch supply {
        case .key(let key):
            if let recorded {
                guard StoreKeyCheck.opens(recorded, with: key) else { throw refuse(.checkValueDoesNotOpen) }
                return (key, .verified)
            }
            let devices = try count(c, "devices")
            if devices > 0 {
                var opens = false
                for r in try c.execute("SELECT device_id, token_sealed FROM devices LIMIT 1000").rows
                where (try? key.open(try r.bytes(1), context: Identity.tokenContext(try r.text(0)))) != nil {
                    opens = true
                    break
                }
                guard opens else { throw refuse(.noSealedRowOpens(devices: devices)) }
            }
            try record(c, key)
            return (key, .recorded(sealedRows: devices))
        case .missing(let create):
            if recorded != nil { throw refuse(.keyRecordedElsewhere) }
            let (devices, messages, deliveries) = (
                try count(c, "devices"), try count(c, "messages"), try count(c, "deliveries")
            )
            guard devices == 0 && messages == 0 && deliveries == 0 else {
                throw refuse(.keyMissing(devices: devices, messages: messages, deliveries: deliveries))
            }
            let key = try create()
            try record(c, key)
            return (key, .created)
        }
    }

    private static func count(_ c: PostgresConnection, _ table: String) throws -> Int {
        Int(try c.execute("SELECT count(*) FROM \(table)").first?.int64(0) ?? 0)
    }

    private static func record(_ c: PostgresConnection, _ key: StoreKey) throws {
        try c.execute(
            """
            INSERT INTO store_meta (name, value) VALUES ($1, $2)
            ON CONFLICT (name) DO UPDATE SET value = excluded.value
            """, [.text(StoreKeyCheck.name), .bytes(try StoreKeyCheck.value(key))])
    }
}
