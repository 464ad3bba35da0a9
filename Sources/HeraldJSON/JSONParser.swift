/// Why a text is not JSON, and the byte offset where that became clear.
public struct JSONParseError: Error, Sendable, Equatable, CustomStringConvertible {
    /// A short lowercase phrase, e.g. "trailing comma" or "invalid UTF-8".
    public var reason: String
    /// Offset from the start of the text.
    public var offset: Int

    public init(_ reason: String, at offset: Int) {
        self.reason = reason
        self.offset = offset
    }

    public var description: String { "\(reason) at byte \(offset)" }
}

/// A strict RFC 8259 parser working directly on UTF-8 bytes.
///
/// Accepts exactly one value with optional surrounding whitespace (space, tab,
/// LF, CR). Refuses comments, trailing commas, `NaN`, leading zeros, `+`, bare
/// control characters in strings, lone surrogate escapes, invalid UTF-8 anywhere,
/// a byte-order mark, and nesting deeper than ``maxDepth``.
public enum JSONParser {
    /// The deepest nesting of arrays and objects accepted; one more is an error.
    public static let maxDepth = 256

    public static func parse(_ bytes: UnsafeRawBufferPointer) throws(JSONParseError) -> JSON {
        var parser = Parser(
            UnsafeBufferPointer(
                start: bytes.baseAddress?.assumingMemoryBound(to: UInt8.self), count: bytes.count))
        return try parser.parseDocument()
    }

    public static func parse(_ bytes: UnsafeBufferPointer<UInt8>) throws(JSONParseError) -> JSON {
        var parser = Parser(bytes)
        return try parser.parseDocument()
    }

    public static func parse(_ bytes: some Collection<UInt8>) throws(JSONParseError) -> JSON {
        let result = bytes.withContiguousStorageIfAvailable { buffer in
            Result { () throws(JSONParseError) -> JSON in try parse(buffer) }
        }
        if let result { return try result.get() }
        return try Array(bytes).withUnsafeBufferPointer { buffer in
            Result { () throws(JSONParseError) -> JSON in try parse(buffer) }
        }.get()
    }

    /// Like ``parse(_:)-(some Collection<UInt8>)``, refusing (with the reason
    /// ``tooManyValues``) a text of more than `maxValues` values, counted as
    /// they are read, so that a hostile text cannot build a huge tree.
    public static func parse(_ bytes: some Collection<UInt8>, maxValues: Int) throws(JSONParseError) -> JSON {
        let result = bytes.withContiguousStorageIfAvailable { buffer in
            Result { () throws(JSONParseError) -> JSON in
                var parser = Parser(buffer)
                parser.maxValues = maxValues
                return try parser.parseDocument()
            }
        }
        if let result { return try result.get() }
        return try Array(bytes).withUnsafeBufferPointer { buffer in
            Result { () throws(JSONParseError) -> JSON in
                var parser = Parser(buffer)
                parser.maxValues = maxValues
                return try parser.parseDocument()
            }
        }.get()
    }

    /// The reason of the error for a text with more values than allowed.
    public static let tooManyValues = "too many values"

    public static func parse(_ text: String) throws(JSONParseError) -> JSON {
        try parse(text.utf8)
    }
}

private enum Byte {
    static let quote = UInt8(ascii: "\"")
    static let backslash = UInt8(ascii: "\\")
    static let slash = UInt8(ascii: "/")
    static let comma = UInt8(ascii: ",")
    static let colon = UInt8(ascii: ":")
    static let openBrace = UInt8(ascii: "{")
    static let closeBrace = UInt8(ascii: "}")
    static let openBracket = UInt8(ascii: "[")
    static let closeBracket = UInt8(ascii: "]")
    static let minus = UInt8(ascii: "-")
    static let zero = UInt8(ascii: "0")
}

private struct Parser {
    let bytes: UnsafeBufferPointer<UInt8>
    let end: Int
    var index = 0
    var depth = 0
    var values = 0
    var maxValues = Int.max
    /// Reused buffer for strings that contain escapes.
    var scratch: [UInt8] = []

    init(_ bytes: UnsafeBufferPointer<UInt8>) {
        self.bytes = bytes
        self.end = bytes.count
    }

    func fail(_ reason: String, at offset: Int? = nil) -> JSONParseError {
        JSONParseError(reason, at: offset ?? index)
    }

    @inline(__always)
    mutating func skipWhitespace() {
        while index < end {
            switch bytes[index] {
            case 0x20, 0x09, 0x0A, 0x0D: index += 1
            default: return
            }
        }
    }

    mutating func parseDocument() throws(JSONParseError) -> JSON {
        skipWhitespace()
        let value = try parseValue()
        skipWhitespace()
        guard index == end else { throw fail("unexpected data after value") }
        return value
    }

    mutating func parseValue() throws(JSONParseError) -> JSON {
        guard index < end else { throw fail("unexpected end of input") }
        values += 1
        if values > maxValues { throw fail(JSONParser.tooManyValues) }
        switch bytes[index] {
        case Byte.openBrace: return try parseObject()
        case Byte.openBracket: return try parseArray()
        case Byte.quote: return .string(try parseString())
        case UInt8(ascii: "t"):
            try expectLiteral("true")
            return .bool(true)
        case UInt8(ascii: "f"):
            try expectLiteral("false")
            return .bool(false)
        case UInt8(ascii: "n"):
            try expectLiteral("null")
            return .null
        case Byte.minus, Byte.zero...UInt8(ascii: "9"):
            return .number(try parseNumber())
        case UInt8(ascii: "+"):
            throw fail("invalid number")
        case Byte.closeBracket, Byte.closeBrace:
            throw fail("unexpected '\(Character(Unicode.Scalar(bytes[index])))'")
        case 0xEF where index + 2 < end && bytes[index + 1] == 0xBB && bytes[index + 2] == 0xBF:
            throw fail("byte order mark")
        default:
            throw fail("unexpected character")
        }
    }

    mutating func expectLiteral(_ word: StaticString) throws(JSONParseError) {
        let count = word.utf8CodeUnitCount
        let text = word.utf8Start
        guard index + count <= end else { throw fail("invalid literal") }
        for k in 0..<count where bytes[index + k] != text[k] {
            throw fail("invalid literal")
        }
        index += count
    }

    mutating func enter() throws(JSONParseError) {
        depth += 1
        guard depth <= JSONParser.maxDepth else { throw fail("nesting too deep") }
    }

    mutating func parseArray() throws(JSONParseError) -> JSON {
        try enter()
        index += 1
        skipWhitespace()
        if index < end && bytes[index] == Byte.closeBracket {
            index += 1
            depth -= 1
            return .array([])
        }
        var elements: [JSON] = []
        elements.reserveCapacity(4)
        while true {
            skipWhitespace()
            if index < end && bytes[index] == Byte.closeBracket && !elements.isEmpty {
                throw fail("trailing comma")
            }
            let element = try parseValue()
            elements.append(element)
            skipWhitespace()
            guard index < end else { throw fail("unexpected end of input") }
            switch bytes[index] {
            case Byte.comma:
                index += 1
            case Byte.closeBracket:
                index += 1
                depth -= 1
                return .array(elements)
            default:
                throw fail("expected ',' or ']'")
            }
        }
    }

    mutating func parseObject() throws(JSONParseError) -> JSON {
        try enter()
        index += 1
        skipWhitespace()
        if index < end && bytes[index] == Byte.closeBrace {
            index += 1
            depth -= 1
            return .object(JSONObject())
        }
        var members: [JSONObject.Member] = []
        members.reserveCapacity(8)
        while true {
            skipWhitespace()
            guard index < end else { throw fail("unexpected end of input") }
            guard bytes[index] == Byte.quote else {
                throw fail(
                    bytes[index] == Byte.closeBrace && !members.isEmpty
                        ? "trailing comma" : "expected string key")
            }
            let key = try parseString()
            skipWhitespace()
            guard index < end else { throw fail("unexpected end of input") }
            guard bytes[index] == Byte.colon else { throw fail("expected ':'") }
            index += 1
            skipWhitespace()
            let value = try parseValue()
            members.append((key: key, value: value))
            skipWhitespace()
            guard index < end else { throw fail("unexpected end of input") }
            switch bytes[index] {
            case Byte.comma:
                index += 1
            case Byte.closeBrace:
                index += 1
                depth -= 1
                var object = JSONObject()
                object.members = members
                return .object(object)
            default:
                throw fail("expected ',' or '}'")
            }
        }
    }

    mutating func parseNumber() throws(JSONParseError) -> JSONNumber {
        let start = index
        guard let length = JSONNumber.syntaxLength(bytes, from: start) else {
            throw fail("invalid number")
        }
        let stop = start + length
        if stop < end, bytes[stop] &- Byte.zero < 10, bytes[stop - 1] == Byte.zero,
            length == 1 || (length == 2 && bytes[start] == Byte.minus)
        {
            throw fail("leading zero", at: stop - 1)
        }
        index = stop
        return JSONNumber(
            unchecked: String(
                decoding: UnsafeBufferPointer(rebasing: bytes[start..<stop]), as: UTF8.self))
    }

    /// Parses a string starting at its opening quote.
    mutating func parseString() throws(JSONParseError) -> String {
        index += 1
        let start = index
        var i = start
        // Fast path: no escapes, so the text is the bytes between the quotes.
        while i < end {
            let byte = bytes[i]
            if byte == Byte.quote {
                index = i + 1
                return String(
                    decoding: UnsafeBufferPointer(rebasing: bytes[start..<i]), as: UTF8.self)
            } else if byte == Byte.backslash {
                break
            } else if byte < 0x20 {
                throw fail("control character in string", at: i)
            } else if byte < 0x80 {
                i += 1
            } else {
                i += try utf8SequenceLength(at: i)
            }
        }
        guard i < end else { throw fail("unterminated string", at: i) }
        scratch.removeAll(keepingCapacity: true)
        scratch.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[start..<i]))
        while i < end {
            let byte = bytes[i]
            if byte == Byte.quote {
                index = i + 1
                return String(decoding: scratch, as: UTF8.self)
            } else if byte == Byte.backslash {
                i = try unescape(at: i)
            } else if byte < 0x20 {
                throw fail("control character in string", at: i)
            } else if byte < 0x80 {
                scratch.append(byte)
                i += 1
            } else {
                let length = try utf8SequenceLength(at: i)
                scratch.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[i..<i + length]))
                i += length
            }
        }
        throw fail("unterminated string", at: i)
    }

    /// Decodes the escape at `at` (a backslash) into `scratch`; returns the index after it.
    mutating func unescape(at position: Int) throws(JSONParseError) -> Int {
        guard position + 1 < end else { throw fail("unterminated string", at: end) }
        let code = bytes[position + 1]
        switch code {
        case Byte.quote, Byte.backslash, Byte.slash: scratch.append(code)
        case UInt8(ascii: "b"): scratch.append(0x08)
        case UInt8(ascii: "f"): scratch.append(0x0C)
        case UInt8(ascii: "n"): scratch.append(0x0A)
        case UInt8(ascii: "r"): scratch.append(0x0D)
        case UInt8(ascii: "t"): scratch.append(0x09)
        case UInt8(ascii: "u"):
            var scalar = try hex4(at: position + 2)
            var next = position + 6
            if scalar >= 0xD800 && scalar <= 0xDBFF {
                guard next + 1 < end, bytes[next] == Byte.backslash,
                    bytes[next + 1] == UInt8(ascii: "u")
                else { throw fail("lone surrogate", at: position) }
                let low = try hex4(at: next + 2)
                guard low >= 0xDC00 && low <= 0xDFFF else {
                    throw fail("lone surrogate", at: position)
                }
                scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                next += 6
            } else if scalar >= 0xDC00 && scalar <= 0xDFFF {
                throw fail("lone surrogate", at: position)
            }
            appendUTF8(scalar)
            return next
        default:
            throw fail("invalid escape", at: position)
        }
        return position + 2
    }

    func hex4(at position: Int) throws(JSONParseError) -> UInt32 {
        guard position + 4 <= end else { throw fail("invalid \\u escape", at: position) }
        var value: UInt32 = 0
        for k in position..<position + 4 {
            let byte = bytes[k]
            let digit: UInt8
            switch byte {
            case Byte.zero...UInt8(ascii: "9"): digit = byte - Byte.zero
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = byte - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = byte - UInt8(ascii: "A") + 10
            default: throw fail("invalid \\u escape", at: k)
            }
            value = value << 4 | UInt32(digit)
        }
        return value
    }

    mutating func appendUTF8(_ scalar: UInt32) {
        switch scalar {
        case ..<0x80:
            scratch.append(UInt8(scalar))
        case ..<0x800:
            scratch.append(UInt8(0xC0 | scalar >> 6))
            scratch.append(UInt8(0x80 | scalar & 0x3F))
        case ..<0x10000:
            scratch.append(UInt8(0xE0 | scalar >> 12))
            scratch.append(UInt8(0x80 | scalar >> 6 & 0x3F))
            scratch.append(UInt8(0x80 | scalar & 0x3F))
        default:
            scratch.append(UInt8(0xF0 | scalar >> 18))
            scratch.append(UInt8(0x80 | scalar >> 12 & 0x3F))
            scratch.append(UInt8(0x80 | scalar >> 6 & 0x3F))
            scratch.append(UInt8(0x80 | scalar & 0x3F))
        }
    }

    /// The length of the well-formed UTF-8 sequence starting with a non-ASCII byte
    /// at `i` (Unicode table 3-7: no overlongs, no surrogates, nothing past U+10FFFF).
    func utf8SequenceLength(at i: Int) throws(JSONParseError) -> Int {
        let lead = bytes[i]
        let length: Int
        var low: UInt8 = 0x80
        var high: UInt8 = 0xBF
        switch lead {
        case 0xC2...0xDF: length = 2
        case 0xE0:
            length = 3
            low = 0xA0
        case 0xE1...0xEC, 0xEE...0xEF: length = 3
        case 0xED:
            length = 3
            high = 0x9F
        case 0xF0:
            length = 4
            low = 0x90
        case 0xF1...0xF3: length = 4
        case 0xF4:
            length = 4
            high = 0x8F
        default: throw fail("invalid UTF-8", at: i)
        }
        guard i + length <= end else { throw fail("invalid UTF-8", at: i) }
        let second = bytes[i + 1]
        guard second >= low && second <= high else { throw fail("invalid UTF-8", at: i) }
        for k in 2..<length where bytes[i + k] & 0xC0 != 0x80 {
            throw fail("invalid UTF-8", at: i)
        }
        return length
    }
}
