public import HeraldJSON

/// Reads and checks named params for a method, turning every problem into an
/// ``RPCError/invalidParams(field:reason:)`` that names the field.
///
/// Read each param you accept, then call ``finish()``: it refuses any param that
/// was not read ("unknown parameter") and any name given twice ("duplicate
/// parameter"). Call it before acting on the values. Nested readers from
/// ``object(_:required:)`` must be finished too; the closure form does it for you.
///
/// An explicit `null` counts as absent. A `required` read never returns nil.
/// Field names are dotted paths from the params root: `keys.p256dh`,
/// `to.users[3]`, `data.room`.
///
/// Reasons, for clients to read and branch on: "is required", "must be a string",
/// "must not be empty", "must be at most N bytes", "must be an integer",
/// "must be between A and B" (or "must be at least A", "must be at most B",
/// "must be a 64-bit integer"), "must be a boolean", "must be an object",
/// "must be an array", "must have at most N items", "must have at least N items",
/// "must have at most N members", "key must not be empty",
/// "key must be at most N bytes", "must be one of: a, b", "duplicate key",
/// "unknown parameter", "duplicate parameter", "must not contain NUL (U+0000)".
///
/// What a string may hold besides its length is its ``StringContent``: free
/// text (`.bytes`, the default: U+0000 is kept, and a value is compared and
/// stored whole on every store backend) or `.text`, which refuses U+0000.
/// Identifiers and values PostgreSQL keeps as `text` (which cannot hold a
/// NUL) are read as `.text`, so a NUL gets the same -32602 on SQLite and on
/// PostgreSQL instead of depending on the backend.
public struct ParamReader: Sendable {
    /// What a string param may contain (see the type's documentation).
    public enum StringContent: Sendable {
        /// Any Unicode text, U+0000 included: strings a client chooses that
        /// the store keeps as bytes (user ids, registration ids, names, app
        /// versions, collapse keys, session and idempotency keys, which are
        /// hashed, and message content).
        case bytes
        /// Text without U+0000: identifiers, tokens, keys and other values
        /// that are stored as PostgreSQL `text` or passed on as identifiers.
        case text
    }

    /// The reason a `.text` string with a U+0000 is refused with.
    public static let nulReason = "must not contain NUL (U+0000)"

    /// The params being read.
    public let params: JSONObject
    /// The dotted path of `params` from the root; empty at the root.
    public let prefix: String
    /// Which members have been read: bit i for member i < 64, names beyond that.
    private var readMask: UInt64 = 0
    private var readBeyondMask: [String] = []

    public init(_ params: JSONObject, prefix: String = "") {
        self.params = params
        self.prefix = prefix
    }

    /// The full field path of the param `name`.
    public func path(_ name: String) -> String {
        prefix.isEmpty ? name : prefix + "." + name
    }

    /// An invalid-params error for the param `name`, for checks done by the caller.
    public func invalid(_ name: String, _ reason: String) -> RPCError {
        .invalidParams(field: path(name), reason: reason)
    }

    /// The raw value of `name` (nil when absent; `null` is returned as is), marked
    /// as known.
    public mutating func value(_ name: String) -> JSON? {
        let members = params.members
        for i in members.indices where members[i].key == name {
            if i < 64 {
                readMask |= 1 << UInt64(i)
            } else if !readBeyondMask.contains(name) {
                readBeyondMask.append(name)
            }
            return members[i].value
        }
        return nil
    }

    /// The value of `name` with null treated as absent, or the "is required" error.
    private mutating func present(_ name: String, required: Bool) throws(RPCError) -> JSON? {
        switch value(name) {
        case nil, .null?:
            if required { throw invalid(name, "is required") }
            return nil
        case let value?:
            return value
        }
    }

    /// A string of at most `maxBytes` UTF-8 bytes; with `content: .text`, one
    /// without U+0000.
    public mutating func string(
        _ name: String, required: Bool = false, maxBytes: Int, allowEmpty: Bool = false,
        content: StringContent = .bytes
    ) throws(RPCError) -> String? {
        guard let value = try present(name, required: required) else { return nil }
        switch Self.checkString(value, maxBytes: maxBytes, allowEmpty: allowEmpty, content: content) {
        case .success(let string): return string
        case .failure(let reason): throw invalid(name, reason.text)
        }
    }

    /// An integral JSON number without fraction or exponent (`1.0` and `1e3` are
    /// refused) within `range`.
    public mutating func int(
        _ name: String, required: Bool = false, range: ClosedRange<Int> = Int.min...Int.max
    ) throws(RPCError) -> Int? {
        guard let value = try present(name, required: required) else { return nil }
        guard case .number(let number) = value, number.isIntegerLiteral else {
            throw invalid(name, "must be an integer")
        }
        guard let int = number.int64.map(Int.init), range.contains(int) else {
            throw invalid(name, Self.rangeReason(range))
        }
        return int
    }

    public mutating func bool(_ name: String, required: Bool = false) throws(RPCError) -> Bool? {
        guard let value = try present(name, required: required) else { return nil }
        guard case .bool(let bool) = value else { throw invalid(name, "must be a boolean") }
        return bool
    }

    /// A reader for the nested object `name`, whose fields are reported as
    /// `name.field`. Call ``finish()`` on it as well.
    public mutating func object(
        _ name: String, required: Bool = false
    ) throws(RPCError)
        -> ParamReader?
    {
        guard let value = try present(name, required: required) else { return nil }
        guard case .object(let object) = value else { throw invalid(name, "must be an object") }
        return ParamReader(object, prefix: path(name))
    }

    /// Reads the nested object `name` with `body`, then finishes its reader.
    public mutating func object<T>(
        _ name: String, required: Bool = false, _ body: (inout ParamReader) throws(RPCError) -> T
    ) throws(RPCError) -> T? {
        guard var reader = try object(name, required: required) else { return nil }
        let result = try body(&reader)
        try reader.finish()
        return result
    }

    /// An array of strings; items are reported as `name[i]`.
    public mutating func stringArray(
        _ name: String, required: Bool = false, minCount: Int = 0, maxCount: Int, maxBytes: Int,
        allowEmpty: Bool = false, content: StringContent = .bytes
    ) throws(RPCError) -> [String]? {
        guard let value = try present(name, required: required) else { return nil }
        guard case .array(let elements) = value else { throw invalid(name, "must be an array") }
        if elements.count < minCount {
            throw invalid(
                name, minCount == 1 ? "must not be empty" : "must have at least \(minCount) items")
        }
        if elements.count > maxCount { throw invalid(name, "must have at most \(maxCount) items") }
        var strings: [String] = []
        strings.reserveCapacity(elements.count)
        for (i, element) in elements.enumerated() {
            switch Self.checkString(element, maxBytes: maxBytes, allowEmpty: allowEmpty, content: content) {
            case .success(let string): strings.append(string)
            case .failure(let reason):
                throw .invalidParams(field: "\(path(name))[\(i)]", reason: reason.text)
            }
        }
        return strings
    }

    /// A flat object whose values are all strings, in member order; members are
    /// reported as `name.key`. `content` applies to the keys and the values.
    public mutating func stringMap(
        _ name: String, required: Bool = false, maxCount: Int, maxKeyBytes: Int, maxValueBytes: Int,
        allowEmptyValues: Bool = true, content: StringContent = .bytes
    ) throws(RPCError) -> [(key: String, value: String)]? {
        guard let value = try present(name, required: required) else { return nil }
        guard case .object(let object) = value else { throw invalid(name, "must be an object") }
        if object.count > maxCount { throw invalid(name, "must have at most \(maxCount) members") }
        if let key = object.firstDuplicateKey { throw invalid(name + "." + key, "duplicate key") }
        var pairs: [(key: String, value: String)] = []
        pairs.reserveCapacity(object.count)
        for (key, value) in object.members {
            if key.isEmpty { throw invalid(name + "." + key, "key must not be empty") }
            if key.utf8.count > maxKeyBytes {
                throw invalid(name + "." + key, "key must be at most \(maxKeyBytes) bytes")
            }
            if content == .text && key.utf8.contains(0) { throw invalid(name + "." + key, "key " + Self.nulReason) }
            switch Self.checkString(value, maxBytes: maxValueBytes, allowEmpty: allowEmptyValues, content: content) {
            case .success(let string): pairs.append((key: key, value: string))
            case .failure(let reason): throw invalid(name + "." + key, reason.text)
            }
        }
        return pairs
    }

    /// A string that must be one of `allowed` (case-sensitive).
    public mutating func enumeration(
        _ name: String, required: Bool = false, allowed: [String]
    ) throws(RPCError) -> String? {
        guard let value = try present(name, required: required) else { return nil }
        guard case .string(let string) = value, allowed.contains(string) else {
            throw invalid(name, "must be one of: " + allowed.joined(separator: ", "))
        }
        return string
    }

    /// Throws for the first param, in member order, that repeats an earlier name
    /// ("duplicate parameter") or was never read ("unknown parameter").
    public func finish() throws(RPCError) {
        if let duplicate = params.firstDuplicateKey {
            throw invalid(duplicate, "duplicate parameter")
        }
        for (i, member) in params.members.enumerated() {
            let read =
                i < 64 ? readMask & (1 << UInt64(i)) != 0 : readBeyondMask.contains(member.key)
            if !read { throw invalid(member.key, "unknown parameter") }
        }
    }

    /// A reason a value was refused, built only when needed.
    private struct Refusal: Error {
        let text: String
    }

    private static func checkString(
        _ value: JSON, maxBytes: Int, allowEmpty: Bool, content: StringContent
    ) -> Result<
        String, Refusal
    > {
        guard case .string(let string) = value else {
            return .failure(Refusal(text: "must be a string"))
        }
        let count = string.utf8.count
        if count == 0 && !allowEmpty { return .failure(Refusal(text: "must not be empty")) }
        if count > maxBytes { return .failure(Refusal(text: "must be at most \(maxBytes) bytes")) }
        if content == .text && string.utf8.contains(0) { return .failure(Refusal(text: nulReason)) }
        return .success(string)
    }

    private static func rangeReason(_ range: ClosedRange<Int>) -> String {
        switch (range.lowerBound == Int.min, range.upperBound == Int.max) {
        case (true, true): "must be a 64-bit integer"
        case (true, false): "must be at most \(range.upperBound)"
        case (false, true): "must be at least \(range.lowerBound)"
        case (false, false): "must be between \(range.lowerBound) and \(range.upperBound)"
        }
    }
}
