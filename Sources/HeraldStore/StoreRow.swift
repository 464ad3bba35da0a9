/// A result row as the store's rules read it, whichever backend it came
/// from: columns by 0-based index. A client's string (a user, a device's
/// name) is `bytea` on PostgreSQL, where it may hold any byte, and text on
/// SQLite; a flag is an integer on SQLite and a boolean on PostgreSQL.
protocol StoreRow {
    func isNull(_ column: Int) throws -> Bool
    func int64(_ column: Int) throws -> Int64
    func optionalInt64(_ column: Int) throws -> Int64?
    func text(_ column: Int) throws -> String
    func optionalText(_ column: Int) throws -> String?
    func clientText(_ column: Int) throws -> String
    func optionalClientText(_ column: Int) throws -> String?
    func bytes(_ column: Int) throws -> [UInt8]
    func optionalBytes(_ column: Int) throws -> [UInt8]?
    /// nil for NULL (a column of a LEFT JOIN that found no row).
    func optionalFlag(_ column: Int) throws -> Bool?
}

extension StoreRow {
    func flag(_ column: Int) throws -> Bool { try optionalFlag(column) ?? false }
}

/// The row a SQLite statement stands on.
struct SQLiteRow: StoreRow {
    let statement: Statement

    init(_ statement: Statement) { self.statement = statement }

    func isNull(_ column: Int) -> Bool { statement.isNull(Int32(column)) }
    func int64(_ column: Int) -> Int64 { statement.int64(Int32(column)) }
    func optionalInt64(_ column: Int) -> Int64? { statement.optionalInt64(Int32(column)) }
    func text(_ column: Int) -> String { statement.text(Int32(column)) }
    func optionalText(_ column: Int) -> String? { statement.optionalText(Int32(column)) }
    func clientText(_ column: Int) -> String { statement.text(Int32(column)) }
    func optionalClientText(_ column: Int) -> String? { statement.optionalText(Int32(column)) }
    func bytes(_ column: Int) -> [UInt8] { statement.blob(Int32(column)) }
    func optionalBytes(_ column: Int) -> [UInt8]? { isNull(column) ? nil : bytes(column) }
    func optionalFlag(_ column: Int) -> Bool? { isNull(column) ? nil : int64(column) != 0 }
}
