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
            let settled = try decide(supply: supply, keyFile: keyFile, database: database, SQLiteKeyCheck(db: db))
            db.resetActive()
            try db.execute("COMMIT")
            return settled
        } catch {
            db.resetActive()
            try? db.execute("ROLLBACK")
            throw error
        }
    }

    /// The check's rules, for every backend: a recorded check value must
    /// open; without one, a database holding data needs its key file, and
    /// its sealed rows (if any) must open with it; the check value is
    /// recorded when there was none (or a new key was made).
    static func decide(
        supply: StoreKeySupply, keyFile: String, database: String, _ s: some KeyCheckStatements
    ) throws -> (key: StoreKey, outcome: StoreKeyOutcome) {
        func refuse(_ problem: StoreKeyError.Problem) -> StoreKeyError {
            StoreKeyError(problem, keyFile: keyFile, database: database)
        }
        let recorded = try s.recordedCheck()
        switch supply {
        case .key(let key):
            if let recorded {
                guard opens(recorded, with: key) else { throw refuse(.checkValueDoesNotOpen) }
                return (key, .verified)
            }
            // A database from before check values (or a new one): its sealed
            // rows say whether this is its key.
            let devices = try s.count("devices")
            if devices > 0 {
                var anyOpens = false
                try s.forEachSealedToken { deviceID, token in
                    anyOpens = (try? key.open(token, context: Identity.tokenContext(deviceID))) != nil
                    return anyOpens
                }
                guard anyOpens else { throw refuse(.noSealedRowOpens(devices: devices)) }
            }
            try s.record(try value(key))
            return (key, .recorded(sealedRows: devices))
        case .missing(let create):
            if recorded != nil, s.isShared { throw refuse(.keyRecordedElsewhere) }
            let (devices, messages, deliveries) = (
                try s.count("devices"), try s.count("messages"), try s.count("deliveries")
            )
            guard devices == 0 && messages == 0 && deliveries == 0 else {
                throw refuse(.keyMissing(devices: devices, messages: messages, deliveries: deliveries))
            }
            let key = try create()
            try s.record(try value(key))
            return (key, .created)
        }
    }
}

/// What the key check reads and writes, inside the caller's transaction:
/// one conformance per backend.
protocol KeyCheckStatements {
    /// A database several instances share: an instance without a key file
    /// never makes a new key for one that records a check value (another
    /// instance made it; its key file must be copied here), even while it
    /// holds no data yet.
    var isShared: Bool { get }
    /// The recorded check value, if any.
    func recordedCheck() throws -> [UInt8]?
    func count(_ table: String) throws -> Int
    /// Device rows' ids and sealed tokens, until `body` answers true.
    func forEachSealedToken(_ body: (String, [UInt8]) -> Bool) throws
    /// Records `value` as the check value, replacing any.
    func record(_ value: [UInt8]) throws
}

/// The key check's statements on SQLite.
private struct SQLiteKeyCheck: KeyCheckStatements {
    let db: Database

    var isShared: Bool { false }

    func recordedCheck() throws(StoreError) -> [UInt8]? {
        let read = try db.statement("SELECT value FROM store_meta WHERE name = ?")
        defer { read.reset() }
        try read.bind(.text(StoreKeyCheck.name))
        return try read.step() ? read.blob(0) : nil
    }

    func count(_ table: String) throws(StoreError) -> Int {
        let stmt = try db.statement("SELECT count(*) FROM \(table)")
        defer { stmt.reset() }
        return try stmt.step() ? Int(stmt.int64(0)) : 0
    }

    /// Every row, stopping where `body` says.
    func forEachSealedToken(_ body: (String, [UInt8]) -> Bool) throws(StoreError) {
        let stmt = try db.statement("SELECT device_id, token_sealed FROM devices")
        defer { stmt.reset() }
        while try stmt.step() {
            if body(stmt.text(0), stmt.blob(1)) { return }
        }
    }

    func record(_ value: [UInt8]) throws(StoreError) {
        try db.statement("INSERT OR REPLACE INTO store_meta (name, value) VALUES (?, ?)")
            .bind(.text(StoreKeyCheck.name), .blob(value)).run()
    }
}
