/// A statement parameter. Text, integers and booleans go as text-format
/// parameters; bytes go in binary format as `bytea` (no escaping, no hex),
/// and so do arrays (``PostgresArray``: nothing for the server to parse).
public enum PostgresValue: Sendable, Hashable {
    case null
    case text(String)
    case int(Int64)
    case bool(Bool)
    case bytes([UInt8])
    case array(PostgresArray)

    public static func optional(_ s: String?) -> PostgresValue { s.map { .text($0) } ?? .null }
    public static func optional(_ i: Int64?) -> PostgresValue { i.map { .int($0) } ?? .null }
    public static func optional(_ b: [UInt8]?) -> PostgresValue { b.map { .bytes($0) } ?? .null }
}

/// A one-dimensional array parameter in PostgreSQL's binary array format
/// (what `array_send` writes): a statement's `$n::text[]`, `$n::bytea[]`,
/// `$n::bigint[]` or `$n::integer[]`, whose hundreds of values the server
/// then reads without parsing an array literal.
public struct PostgresArray: Sendable, Hashable {
    /// The array type's OID.
    let type: UInt32
    let bytes: [UInt8]

    /// `text[]`. PostgreSQL text cannot hold a NUL: each becomes U+FFFD.
    public static func text(_ values: [String?]) -> PostgresArray {
        build(arrayType: 1009, elementType: 25, values) { value, out in
            if value.utf8.contains(0) {
                out.append(contentsOf: value.replacingOccurrences(of: "\0", with: "\u{FFFD}").utf8)
            } else {
                out.append(contentsOf: value.utf8)
            }
        }
    }

    /// `bytea[]`.
    public static func bytea(_ values: [[UInt8]?]) -> PostgresArray {
        build(arrayType: 1001, elementType: 17, values) { value, out in out.append(contentsOf: value) }
    }

    /// `bigint[]`.
    public static func bigint(_ values: [Int64?]) -> PostgresArray {
        build(arrayType: 1016, elementType: 20, values) { value, out in appendBigEndian(UInt64(bitPattern: value), &out)
        }
    }

    /// `integer[]`.
    public static func integer(_ values: [Int32?]) -> PostgresArray {
        build(arrayType: 1007, elementType: 23, values) { value, out in
            appendBigEndian(UInt32(bitPattern: value), &out)
        }
    }

    /// The header (dimensions, NULL flag, element type), then each element
    /// as its length and bytes, -1 for NULL; no dimension for an empty one.
    private static func build<T>(
        arrayType: UInt32, elementType: UInt32, _ values: [T?], _ write: (T, inout [UInt8]) -> Void
    ) -> PostgresArray {
        var out: [UInt8] = []
        out.reserveCapacity(20 + values.count * 16)
        appendBigEndian(UInt32(values.isEmpty ? 0 : 1), &out)
        appendBigEndian(UInt32(values.contains { $0 == nil } ? 1 : 0), &out)
        appendBigEndian(elementType, &out)
        if !values.isEmpty {
            appendBigEndian(UInt32(values.count), &out)
            appendBigEndian(UInt32(1), &out)
        }
        for value in values {
            guard let value else {
                appendBigEndian(UInt32(bitPattern: -1), &out)
                continue
            }
            let at = out.count
            out.append(contentsOf: [0, 0, 0, 0])
            write(value, &out)
            let length = UInt32(out.count - at - 4)
            for i in 0..<4 { out[at + i] = UInt8(truncatingIfNeeded: length >> (24 - 8 * UInt32(i))) }
        }
        return PostgresArray(type: arrayType, bytes: out)
    }

    private static func appendBigEndian<I: FixedWidthInteger & UnsignedInteger>(_ value: I, _ out: inout [UInt8]) {
        withUnsafeBytes(of: value.bigEndian) { out.append(contentsOf: $0) }
    }
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

/// Every cell of a result in one buffer, so that reading a result of many
/// rows costs two allocations rather than one per cell: cell `i` is
/// `bytes[bounds[2i]..<bounds[2i+1]]`, NULL where its start is -1.
final class PostgresCells: Sendable {
    let bytes: [UInt8]
    let bounds: [Int]
    let columnCount: Int

    init(bytes: [UInt8], bounds: [Int], columnCount: Int) {
        self.bytes = bytes
        self.bounds = bounds
        self.columnCount = columnCount
    }
}

/// One row; columns are read by 0-based index. `bytea` columns hold their
/// decoded bytes, every other column its text form.
public struct PostgresRow: Sendable {
    let cells: PostgresCells
    let row: Int

    init(cells: PostgresCells, row: Int) {
        self.cells = cells
        self.row = row
    }

    public var count: Int { cells.columnCount }

    public func isNull(_ column: Int) throws(PostgresError) -> Bool { try cell(column) == nil }

    public func optionalText(_ column: Int) throws(PostgresError) -> String? {
        try cell(column).map { String(decoding: $0, as: UTF8.self) }
    }

    public func text(_ column: Int) throws(PostgresError) -> String {
        guard let value = try optionalText(column) else { throw Self.null(column, "text") }
        return value
    }

    public func optionalInt64(_ column: Int) throws(PostgresError) -> Int64? {
        guard let digits = try cell(column) else { return nil }
        guard let value = Self.integer(digits) else {
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
        guard bytes.count == 1 else { throw PostgresError(.value, "column \(column) is not a boolean") }
        switch bytes.first {
        case UInt8(ascii: "t"): return true
        case UInt8(ascii: "f"): return false
        default: throw PostgresError(.value, "column \(column) is not a boolean")
        }
    }

    public func bool(_ column: Int) throws(PostgresError) -> Bool {
        guard let value = try optionalBool(column) else { throw Self.null(column, "boolean") }
        return value
    }

    public func optionalBytes(_ column: Int) throws(PostgresError) -> [UInt8]? { try cell(column).map(Array.init) }

    public func bytes(_ column: Int) throws(PostgresError) -> [UInt8] {
        guard let value = try optionalBytes(column) else { throw Self.null(column, "bytea") }
        return value
    }

    private func cell(_ column: Int) throws(PostgresError) -> ArraySlice<UInt8>? {
        guard column >= 0, column < cells.columnCount else {
            throw PostgresError(.value, "no column \(column) in a row of \(cells.columnCount)")
        }
        let i = 2 * (row * cells.columnCount + column)
        let start = cells.bounds[i]
        return start < 0 ? nil : cells.bytes[start..<cells.bounds[i + 1]]
    }

    /// A decimal integer's text form (an optional sign, then digits), read
    /// without making a string of it; nil if it is not one or overflows.
    static func integer(_ text: ArraySlice<UInt8>) -> Int64? {
        var i = text.startIndex
        var negative = false
        if i < text.endIndex, text[i] == UInt8(ascii: "-") || text[i] == UInt8(ascii: "+") {
            negative = text[i] == UInt8(ascii: "-")
            i += 1
        }
        guard i < text.endIndex else { return nil }
        var value: Int64 = 0
        while i < text.endIndex {
            let digit = text[i] &- UInt8(ascii: "0")
            guard digit < 10 else { return nil }
            // Accumulated negative, so that Int64.min fits.
            let (times, o1) = value.multipliedReportingOverflow(by: 10)
            let (next, o2) = times.subtractingReportingOverflow(Int64(digit))
            guard !o1, !o2 else { return nil }
            value = next
            i += 1
        }
        if negative { return value }
        let (positive, overflow) = (0 as Int64).subtractingReportingOverflow(value)
        return overflow ? nil : positive
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

/// Appends the bytes of a `bytea` column's text form (`\x` and hex digits;
/// the server's default `bytea_output`) to `out`; false, with `out` as it
/// was, when the text is not that form.
func appendByteaHex(_ text: UnsafeBufferPointer<UInt8>, to out: inout [UInt8]) -> Bool {
    guard text.count >= 2, text[0] == UInt8(ascii: "\\"), text[1] == UInt8(ascii: "x"), text.count % 2 == 0 else {
        return false
    }
    let mark = out.count
    out.append(contentsOf: repeatElement(0, count: (text.count - 2) / 2))
    let decoded = HexDigits.values.withUnsafeBufferPointer { value in
        out.withUnsafeMutableBufferPointer { bytes in
            var i = 2
            var j = mark
            while i < text.count {
                let hi = value[Int(text[i])]
                let lo = value[Int(text[i + 1])]
                guard hi | lo < 16 else { return false }
                bytes[j] = hi << 4 | lo
                i += 2
                j += 1
            }
            return true
        }
    }
    if !decoded { out.removeSubrange(mark...) }
    return decoded
}

/// Each byte's value as a hex digit (either case), 0xFF where it is not one.
private enum HexDigits {
    static let values: [UInt8] = (0...255).map { c -> UInt8 in
        switch UInt8(c) {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return UInt8(c) - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return UInt8(c) - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return UInt8(c) - UInt8(ascii: "A") + 10
        default: return 0xFF
        }
    }
}
