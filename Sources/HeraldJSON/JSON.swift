/// A JSON value as it appeared on the wire.
///
/// Numbers keep their source text and objects keep their member order and any
/// duplicate names, so a value parsed and written again comes out byte-identical
/// (apart from whitespace and string escapes). Equality is structural and
/// order-sensitive: `{"a":1,"b":2}` differs from `{"b":2,"a":1}`, and `1.0`
/// differs from `1`.
public enum JSON: Sendable, Equatable {
    case null
    case bool(Bool)
    case number(JSONNumber)
    case string(String)
    case array([JSON])
    case object(JSONObject)

    /// An integer number.
    public static func int(_ value: some BinaryInteger) -> JSON {
        .number(JSONNumber(value))
    }

    /// A floating-point number; `null` when `value` is not finite, since JSON cannot
    /// spell infinities or NaN.
    public static func double(_ value: Double) -> JSON {
        JSONNumber(value).map(JSON.number) ?? .null
    }
}

extension JSON {
    public var isNull: Bool {
        if case .null = self { true } else { false }
    }

    public var boolValue: Bool? {
        if case .bool(let value) = self { value } else { nil }
    }

    public var numberValue: JSONNumber? {
        if case .number(let value) = self { value } else { nil }
    }

    public var stringValue: String? {
        if case .string(let value) = self { value } else { nil }
    }

    public var arrayValue: [JSON]? {
        if case .array(let value) = self { value } else { nil }
    }

    public var objectValue: JSONObject? {
        if case .object(let value) = self { value } else { nil }
    }

    /// The member `key` of an object (the first one if repeated); nil for other values.
    public subscript(key: String) -> JSON? {
        objectValue?[key]
    }

    /// A short name of the value's type, for error messages ("string", "object", …).
    public var typeName: String {
        switch self {
        case .null: "null"
        case .bool: "boolean"
        case .number: "number"
        case .string: "string"
        case .array: "array"
        case .object: "object"
        }
    }
}

extension JSON: ExpressibleByNilLiteral, ExpressibleByBooleanLiteral, ExpressibleByIntegerLiteral,
    ExpressibleByFloatLiteral, ExpressibleByStringLiteral, ExpressibleByArrayLiteral,
    ExpressibleByDictionaryLiteral
{
    public init(nilLiteral: ()) { self = .null }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    public init(integerLiteral value: Int) { self = .number(JSONNumber(value)) }
    public init(floatLiteral value: Double) { self = .double(value) }
    public init(stringLiteral value: String) { self = .string(value) }
    public init(arrayLiteral elements: JSON...) { self = .array(elements) }
    public init(dictionaryLiteral elements: (String, JSON)...) {
        self = .object(JSONObject(elements))
    }
}

extension JSON: CustomStringConvertible {
    /// The compact serialisation.
    public var description: String {
        String(decoding: serialized(), as: UTF8.self)
    }
}

/// A JSON number, held as its exact source text so it can be echoed unchanged.
///
/// Two numbers are equal when their text is equal: `1`, `1.0` and `1e0` are three
/// different request ids.
public struct JSONNumber: Sendable, Hashable, CustomStringConvertible {
    /// The number as written, always valid RFC 8259 number syntax.
    public let text: String

    /// Validates `text` against the RFC 8259 number grammar (no `+`, no leading
    /// zeros, no surrounding whitespace).
    public init?(_ text: String) {
        var copy = text
        let valid = copy.withUTF8 {
            JSONNumber.syntaxLength($0, from: 0) == $0.count && !$0.isEmpty
        }
        guard valid else { return nil }
        self.text = text
    }

    public init(_ value: some BinaryInteger) {
        self.text = String(value)
    }

    /// Nil when `value` is infinite or NaN.
    public init?(_ value: Double) {
        guard value.isFinite else { return nil }
        // Swift prints finite doubles in a JSON-compatible form ("1e-07", "1e+300", "0.1").
        self.text = value.description
    }

    init(unchecked text: String) {
        self.text = text
    }

    public var description: String { text }

    /// True when the text is a plain integer: no fraction and no exponent.
    public var isIntegerLiteral: Bool {
        !text.utf8.contains {
            $0 == UInt8(ascii: ".") || $0 == UInt8(ascii: "e") || $0 == UInt8(ascii: "E")
        }
    }

    /// The value as an `Int64`, only when the text is a plain integer (no fraction,
    /// no exponent: `1.0` and `1e3` give nil) that fits. `-0` gives 0.
    public var int64: Int64? {
        isIntegerLiteral ? Int64(text) : nil
    }

    /// The nearest `Double`; magnitudes beyond its range give ±infinity, and tiny
    /// ones round to zero.
    public var double: Double {
        Double(text) ?? .nan
    }

    /// The length of the longest prefix of `bytes[from...]` that is a number, or nil
    /// when none starts there. Trailing garbage is left to the caller.
    static func syntaxLength(_ bytes: UnsafeBufferPointer<UInt8>, from start: Int) -> Int? {
        var i = start
        let end = bytes.count
        @inline(__always) func isDigit(_ i: Int) -> Bool {
            i < end && bytes[i] &- UInt8(ascii: "0") < 10
        }
        if i < end && bytes[i] == UInt8(ascii: "-") { i += 1 }
        guard isDigit(i) else { return nil }
        if bytes[i] == UInt8(ascii: "0") {
            i += 1
        } else {
            while isDigit(i) { i += 1 }
        }
        if i < end && bytes[i] == UInt8(ascii: ".") {
            i += 1
            guard isDigit(i) else { return nil }
            while isDigit(i) { i += 1 }
        }
        if i < end && (bytes[i] | 0x20) == UInt8(ascii: "e") {
            i += 1
            if i < end && (bytes[i] == UInt8(ascii: "+") || bytes[i] == UInt8(ascii: "-")) {
                i += 1
            }
            guard isDigit(i) else { return nil }
            while isDigit(i) { i += 1 }
        }
        return i - start
    }
}

extension JSONNumber: ExpressibleByIntegerLiteral {
    public init(integerLiteral value: Int) {
        self.init(value)
    }
}

/// A JSON object: its members in wire order, duplicates included.
///
/// Lookups by name are linear, which is the fast choice for the dozen members of
/// a request. Build responses with a dictionary literal: `["removed": true]`.
public struct JSONObject: Sendable, Equatable, RandomAccessCollection,
    ExpressibleByDictionaryLiteral,
    ExpressibleByArrayLiteral
{
    public typealias Member = (key: String, value: JSON)

    /// The members in order.
    public var members: [Member]

    public init() {
        self.members = []
    }

    public init(_ members: [(String, JSON)]) {
        self.members = members.map { (key: $0.0, value: $0.1) }
    }

    public init(dictionaryLiteral elements: (String, JSON)...) {
        self.init(elements)
    }

    public init(arrayLiteral elements: (String, JSON)...) {
        self.init(elements)
    }

    public var startIndex: Int { members.startIndex }
    public var endIndex: Int { members.endIndex }
    public subscript(position: Int) -> Member { members[position] }

    /// The value of the first member named `key`. Setting replaces that member's
    /// value (or appends a member); setting nil removes every member named `key`.
    public subscript(key: String) -> JSON? {
        get {
            for member in members where member.key == key {
                return member.value
            }
            return nil
        }
        set {
            guard let newValue else {
                members.removeAll { $0.key == key }
                return
            }
            if let index = members.firstIndex(where: { $0.key == key }) {
                members[index].value = newValue
            } else {
                members.append((key: key, value: newValue))
            }
        }
    }

    /// The member names in order, duplicates included.
    public var keys: [String] { members.map(\.key) }

    /// Appends a member even if one with the same name exists.
    public mutating func append(_ key: String, _ value: JSON) {
        members.append((key: key, value: value))
    }

    /// True when some name appears more than once.
    public var hasDuplicateKeys: Bool {
        firstDuplicateKey != nil
    }

    /// The first name (in member order) that repeats an earlier one.
    public var firstDuplicateKey: String? {
        if members.count < 2 { return nil }
        if members.count <= 16 {
            for i in 1..<members.count {
                for j in 0..<i where members[j].key == members[i].key {
                    return members[i].key
                }
            }
            return nil
        }
        var seen = Set<String>(minimumCapacity: members.count)
        for member in members where !seen.insert(member.key).inserted {
            return member.key
        }
        return nil
    }

    public static func == (lhs: JSONObject, rhs: JSONObject) -> Bool {
        lhs.members.count == rhs.members.count
            && zip(lhs.members, rhs.members).allSatisfy { $0.key == $1.key && $0.value == $1.value }
    }
}
