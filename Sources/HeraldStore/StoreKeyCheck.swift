import HeraldCrypto

/// The check value of the store key: a constant sealed under the key with
/// the same primitive as every token at rest (XChaCha20-Poly1305, a random
/// nonce, its own context). It opens only with that key and says nothing
/// about the key itself.
enum StoreKeyCheck {
    static let name = "key_check"
    static let plaintext = Array("herald store key check, version 1".utf8)
    static let context = Array("store:key-check".utf8)

    static func value(_ key: StoreKey) throws(CryptoError) -> [UInt8] {
        try key.seal(plaintext, context: context)
    }

    static func opens(_ value: [UInt8], with key: StoreKey) -> Bool {
        (try? key.open(value, context: context)) == plaintext
    }

    /// Checks the key against the database, in one write transaction: a
    /// recorded check value must open; without one, a database holding data
    /// needs its key file, and its sealed rows (if any) must open with it.
    /// Records the check value when there was none (or a new key was made).
    static func settle(
        _ db: Database, supply: StoreKeySupply, keyFile: String, database: String
    ) throws -> (key: StoreKey, outcome: StoreKeyOutcome) {
        try db.execute("BEGIN IMMEDIATE")
        do {
            let settled = try decide(db, supply: supply, keyFile: keyFile, database: database)
            db.resetActive()
            try db.execute("COMMIT")
            return settled
        } catch {
            db.resetActive()
            try? db.execute("ROLLBACK")
            throw error
        }
    }

    private static func decide(
        _ db: Database, supply: StoreKeySupply, keyFile: String, database: String
    ) throws -> (key: StoreKey, outcome: StoreKeyOutcome) {
        func refuse(_ problem: StoreKeyError.Problem) -> StoreKeyError {
            StoreKeyError(problem, keyFile: keyFile, database: database)
        }
        let read = try db.statement("SELECT value FROM store_meta WHERE name = ?")
        try read.bind(.text(name))
        let recorded: [UInt8]? = try read.step() ? read.blob(0) : nil
        read.reset()

        switch supply {
        case .key(let key):
            if let recorded {
                guard opens(recorded, with: key) else { throw refuse(.checkValueDoesNotOpen) }
                return (key, .verified)
            }
            // A database from before check values (or a new one): its sealed
            // rows say whether this is its key.
            let devices = try count(db, "devices")
            if devices > 0 {
                let anyOpens = try anySealedRowOpens(db, with: key)
                guard anyOpens else { throw refuse(.noSealedRowOpens(devices: devices)) }
            }
            try record(db, key)
            return (key, .recorded(sealedRows: devices))
        case .missing(let create):
            let (devices, messages, deliveries) = (
                try count(db, "devices"), try count(db, "messages"), try count(db, "deliveries")
            )
            guard devices == 0 && messages == 0 && deliveries == 0 else {
                throw refuse(.keyMissing(devices: devices, messages: messages, deliveries: deliveries))
            }
            let key = try create()
            try record(db, key)
            return (key, .created)
        }
    }

    private static func count(_ db: Database, _ table: String) throws(StoreError) -> Int {
        let stmt = try db.statement("SELECT count(*) FROM \(table)")
        defer { stmt.reset() }
        return try stmt.step() ? Int(stmt.int64(0)) : 0
    }

    /// Whether the token of any device row opens with `key` (stops at the first).
    private static func anySealedRowOpens(_ db: Database, with key: StoreKey) throws(StoreError) -> Bool {
        let stmt = try db.statement("SELECT device_id, token_sealed FROM devices")
        defer { stmt.reset() }
        while try stmt.step() {
            if (try? key.open(stmt.blob(1), context: Identity.tokenContext(stmt.text(0)))) != nil { return true }
        }
        return false
    }

    private static func record(_ db: Database, _ key: StoreKey) throws {
        try db.statement("INSERT OR REPLACE INTO store_meta (name, value) VALUES (?, ?)")
            .bind(.text(name), .blob(try value(key))).run()
    }
}
