internal import CSQLite

/// A failure reported by SQLite, with its result code and message.
public struct StoreError: Error, Sendable, CustomStringConvertible {
    public let code: Int32
    public let message: String

    public var description: String { "sqlite error \(code): \(message)" }
}

/// One SQLite connection. Not thread-safe: owned by one thread at a time.
final class Database {
    let handle: OpaquePointer
    private var statements: [String: Statement] = [:]
    /// Statements stepped to a row and not yet reset. Each holds its read
    /// transaction open, and in WAL mode no checkpoint can pass an open
    /// reader, so the write-ahead log would only grow: `resetActive()` ends
    /// them at the end of every unit of work.
    private var active: [Statement] = []

    init(path: String) throws(StoreError) {
        var db: OpaquePointer?
        let flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX
        let rc = sqlite3_open_v2(path, &db, flags, nil)
        guard rc == SQLITE_OK, let db else {
            let message = db.map { String(cString: sqlite3_errmsg($0)) } ?? "cannot open"
            sqlite3_close_v2(db)
            throw StoreError(code: rc, message: "\(path): \(message)")
        }
        handle = db
        sqlite3_extended_result_codes(db, 1)
    }

    deinit {
        statements.removeAll()
        sqlite3_close_v2(handle)
    }

    func error(_ rc: Int32) -> StoreError {
        StoreError(code: rc, message: String(cString: sqlite3_errmsg(handle)))
    }

    func execute(_ sql: String) throws(StoreError) {
        var message: UnsafeMutablePointer<CChar>?
        let rc = sqlite3_exec(handle, sql, nil, nil, &message)
        if rc != SQLITE_OK {
            let text = message.map { String(cString: $0) } ?? "error"
            sqlite3_free(message)
            throw StoreError(code: rc, message: text)
        }
    }

    /// A cached prepared statement, reset and cleared of bindings.
    func statement(_ sql: String) throws(StoreError) -> Statement {
        if let cached = statements[sql] {
            cached.reset()
            return cached
        }
        let stmt = try Statement(db: self, sql: sql)
        statements[sql] = stmt
        return stmt
    }

    var changes: Int { Int(sqlite3_changes(handle)) }

    /// The rowid of the last row this connection inserted.
    var lastInsertRowID: Int64 { sqlite3_last_insert_rowid(handle) }

    func pragmaInt(_ name: String) throws(StoreError) -> Int64 {
        let stmt = try statement("PRAGMA \(name)")
        defer { stmt.reset() }
        guard try stmt.step() else { return 0 }
        return stmt.int64(0)
    }

    fileprivate func stepped(_ statement: Statement) { active.append(statement) }

    /// Resets every statement left on a row (their read transactions end).
    func resetActive() {
        let left = active
        active.removeAll(keepingCapacity: true)
        for statement in left { statement.reset() }
    }

    /// Copies the whole write-ahead log into the database and truncates it
    /// (at close: the next open starts with an empty log).
    func checkpoint() {
        resetActive()
        sqlite3_wal_checkpoint_v2(handle, nil, SQLITE_CHECKPOINT_TRUNCATE, nil, nil)
    }
}

/// A prepared statement; values bind by 1-based index, columns read by 0-based index.
final class Statement {
    private let stmt: OpaquePointer
    private unowned let db: Database
    /// On a row (registered with the database until reset).
    private var onRow = false

    init(db: Database, sql: String) throws(StoreError) {
        var stmt: OpaquePointer?
        let rc = sqlite3_prepare_v3(db.handle, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &stmt, nil)
        guard rc == SQLITE_OK, let stmt else { throw db.error(rc) }
        self.stmt = stmt
        self.db = db
    }

    deinit { sqlite3_finalize(stmt) }

    func reset() {
        sqlite3_reset(stmt)
        sqlite3_clear_bindings(stmt)
        onRow = false
    }

    @discardableResult
    func bind(_ values: StoreValue...) throws(StoreError) -> Statement {
        try bind(values)
    }

    @discardableResult
    func bind(_ values: [StoreValue]) throws(StoreError) -> Statement {
        for (i, value) in values.enumerated() {
            let index = Int32(i + 1)
            let rc: Int32
            switch value {
            case .null: rc = sqlite3_bind_null(stmt, index)
            case .int(let v): rc = sqlite3_bind_int64(stmt, index, v)
            case .text(let v):
                // With its byte length, so that a NUL inside the text is kept
                // (with -1 SQLite would stop at it: "a\0b" would be stored as "a").
                var text = v
                rc = text.withUTF8 { bytes in
                    guard let base = bytes.baseAddress, !bytes.isEmpty else {
                        return sqlite3_bind_text(stmt, index, "", 0, herald_sqlite_transient())
                    }
                    return UnsafeRawPointer(base).withMemoryRebound(to: CChar.self, capacity: bytes.count) {
                        sqlite3_bind_text(stmt, index, $0, Int32(bytes.count), herald_sqlite_transient())
                    }
                }
            case .blob(let v):
                rc = v.withUnsafeBytes {
                    sqlite3_bind_blob(stmt, index, $0.baseAddress, Int32($0.count), herald_sqlite_transient())
                }
            }
            if rc != SQLITE_OK { throw db.error(rc) }
        }
        return self
    }

    /// Advances; true when a row is available.
    func step() throws(StoreError) -> Bool {
        let rc = sqlite3_step(stmt)
        if rc == SQLITE_ROW {
            if !onRow {
                onRow = true
                db.stepped(self)
            }
            return true
        }
        if rc == SQLITE_DONE { return false }
        throw db.error(rc)
    }

    /// Runs a statement that returns no rows.
    func run() throws(StoreError) {
        while try step() {}
    }

    func isNull(_ column: Int32) -> Bool { sqlite3_column_type(stmt, column) == SQLITE_NULL }
    func int64(_ column: Int32) -> Int64 { sqlite3_column_int64(stmt, column) }
    func optionalInt64(_ column: Int32) -> Int64? { isNull(column) ? nil : int64(column) }

    func text(_ column: Int32) -> String {
        guard let p = sqlite3_column_text(stmt, column) else { return "" }
        let count = Int(sqlite3_column_bytes(stmt, column))
        return String(decoding: UnsafeBufferPointer(start: p, count: count), as: UTF8.self)
    }

    func optionalText(_ column: Int32) -> String? { isNull(column) ? nil : text(column) }

    func blob(_ column: Int32) -> [UInt8] {
        let count = Int(sqlite3_column_bytes(stmt, column))
        guard count > 0, let p = sqlite3_column_blob(stmt, column) else { return [] }
        return Array(UnsafeRawBufferPointer(start: p, count: count))
    }
}

/// A value bound into a statement.
enum StoreValue {
    case null
    case int(Int64)
    case text(String)
    case blob([UInt8])

    static func optional(_ s: String?) -> StoreValue { s.map { .text($0) } ?? .null }
    static func optional(_ i: Int64?) -> StoreValue { i.map { .int($0) } ?? .null }
}

/// How long a statement waits for another process's lock before SQLITE_BUSY.
func sqlite3BusyTimeout(_ db: Database, milliseconds: Int32) {
    sqlite3_busy_timeout(db.handle, milliseconds)
}
