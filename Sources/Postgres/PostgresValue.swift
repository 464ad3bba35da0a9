/// A statement parameter. Text, integers and booleans go as text-format
/// parameters; bytes go in binary format as `bytea` (no escaping, no hex).
public enum PostgresValue: Sendable, Hashable {
    case null
    case text(String)
    case int(Int64)
    case bool(Bool)
    case bytes([UInt8])

    public static func optional(_ s: String?) -> PostgresValue { s.map { .text($0) } ?? .null }
    public static func optional(_ i: Int64?) -> PostgresValue { i.map { .int($0) } ?? .null }
    public static func optional(_ b: [UInt8]?) -> PostgresValue { b.map { .bytes($0) } ?? .null }
}

/// The rows of one statement, copied out of libpq's result (which is freed
/// at once), so a result may cross threads.
public struct PostgresResult: Sendable {
    public let columns: [String]
    public let rows: [PostgresRow]
    /// Rows inserted, updated, deleted or selected, as the command tag says (0 for others).
    public let affectedRows: Int

    public init(columns: [String], rows: [PostgresRow], affectedRows: Int) {
        self.columns = columns
        self.rows = rows
        self.affectedRows = affectedRows
    }

    /// The first row, if any.
    public var first: PostgresRow? { rows.first }
}

/// One row; columns are read by 0-based index. `bytea` columns hold their
/// decoded bytes, every other column its text form.
public struct PostgresRow: Sendable {
    let cells: [[UInt8]?]

    init(cells: [[UInt8]?]) { self.cells = cells }

    public var count: Int { cells.count }

    public func isNull(_ column: Int) throws(PostgresError) -> Bool { try cell(column) == nil }

    public func optionalText(_ column: Int) throws(PostgresError) -> String? {
        try cell(column).map { String(decoding: $0, as: UTF8.self) }
    }

    public func text(_ column: Int) throws(PostgresError) -> String {
        guard let value = try optionalText(column) else { throw Self.null(column, "text") }
        return value
    }

    public func optionalInt64(_ column: Int) throws(PostgresError) -> Int64? {
        guard let bytes = try cell(column) else { return nil }
        guard let value = Int64(String(decoding: bytes, as: UTF8.self)) else {
            throw PostgresError(.value, "column \(column) is not an integer")
        }
        return value
    }

    public func int64(_ column: Int) throws(PostgresError) -> Int64 {
        guard let value = try optionalInt64(column) else { throw Self.null(column, "integer") }
        return value
    }

    public func optionalBool(_ column: Int) throws(PostgresError) -> Bool? {
        guard let bytes = try cell(column) else { return nil }
        switch bytes {
        case [UInt8(ascii: "t")]: return true
        case [UInt8(ascii: "f")]: return false
        default: throw PostgresError(.value, "column \(column) is not a boolean")
        }
    }

    public func bool(_ column: Int) throws(PostgresError) -> Bool {
        guard let value = try optionalBool(column) else { throw Self.null(column, "boolean") }
        return value
    }

    public func optionalBytes(_ column: Int) throws(PostgresError) -> [UInt8]? { try cell(column) }

    public func bytes(_ column: Int) throws(PostgresError) -> [UInt8] {
        guard let value = try cell(column) else { throw Self.null(column, "bytea") }
        return value
    }

    private func cell(_ column: Int) throws(PostgresError) -> [UInt8]? {
        guard cells.indices.contains(column) else {
            throw PostgresError(.value, "no column \(column) in a row of \(cells.count)")
        }
        return cells[column]
    }

    private static func null(_ column: Int, _ type: String) -> PostgresError {
        PostgresError(.value, "column \(column) is NULL, not \(type)")
    }
}

/// A notification received on a channel the connection listens on.
public struct PostgresNotification: Sendable, Hashable {
    public let channel: String
    public let payload: String
    /// The server process that sent it.
    public let senderPID: Int32

    public init(channel: String, payload: String, senderPID: Int32) {
        self.channel = channel
        self.payload = payload
        self.senderPID = senderPID
    }
}

/// A named statement, prepared on a connection the first time it runs there
/// (and again after a reconnect).
public struct PostgresStatement: Sendable, Hashable {
    public let name: String
    public let sql: String

    public init(name: String, sql: String) {
        self.name = name
        self.sql = sql
    }
}

/// Decodes a `bytea` column's text form (`\x` and hex digits; the server's
/// default `bytea_output`).
func decodeByteaHex(_ text: UnsafeBufferPointer<UInt8>) -> [UInt8]? {
    guard text.count >= 2, text[0] == UInt8(ascii: "\\"), text[1] == UInt8(ascii: "x"), text.count % 2 == 0 else {
        return nil
    }
    func nibble(_ c: UInt8) -> UInt8? {
        switch c {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return c - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return c - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return c - UInt8(ascii: "A") + 10
        default: return nil
        }
    }
    var out: [UInt8] = []
    out.reserveCapacity((text.count - 2) / 2)
    var i = 2
    while i < text.count {
        guard let hi = nibble(text[i]), let lo = nibble(text[i + 1]) else { return nil }
        out.append(hi << 4 | lo)
        i += 2
    }
    return out
}
