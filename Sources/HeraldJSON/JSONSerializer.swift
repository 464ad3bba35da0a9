extension JSON {
    /// Compact UTF-8 JSON: no whitespace, members in stored order, numbers as their
    /// source text.
    ///
    /// Strings escape `"` `\` and control characters (`\b \f \n \r \t`, others as
    /// `\u00XX`), and U+2028/U+2029 as `\u2028`/`\u2029` so the output is also safe
    /// to embed in JavaScript; all other characters are raw UTF-8.
    public func serialized() -> [UInt8] {
        let bound = JSONWriter.bound(self)
        let out = [UInt8](unsafeUninitializedCapacity: bound) { buffer, count in
            count = JSONWriter.write(self, to: buffer.baseAddress!)
        }
        // The bound counts every string byte as six: keep no more than is used.
        guard out.capacity > 2 * out.count + 4096 else { return out }
        return [UInt8](unsafeUninitializedCapacity: out.count) { buffer, count in
            out.withUnsafeBufferPointer { buffer.baseAddress!.update(from: $0.baseAddress!, count: $0.count) }
            count = out.count
        }
    }

    /// Appends the compact serialisation to `out`.
    public func serialize(into out: inout [UInt8]) {
        JSONWriter.append(bound: JSONWriter.bound(self), to: &out) {
            JSONWriter.write(self, to: $0)
        }
    }

    /// Appends `string` as a quoted, escaped JSON string.
    public static func serialize(string: String, into out: inout [UInt8]) {
        JSONWriter.append(bound: JSONWriter.bound(string), to: &out) {
            JSONWriter.write(string, to: $0)
        }
    }
}

extension JSONObject {
    /// Appends the compact serialisation of the object to `out`.
    public func serialize(into out: inout [UInt8]) {
        JSONWriter.append(bound: JSONWriter.bound(self), to: &out) {
            JSONWriter.write(self, to: $0)
        }
    }
}

/// Serialisation in two passes: an upper bound of the size from the lengths alone
/// (every string byte could become `\u00XX`), then one write into memory of that
/// size, so output costs one allocation at most and no per-byte appends.
enum JSONWriter {
    static func bound(_ value: JSON) -> Int {
        switch value {
        case .null: 4
        case .bool(let value): value ? 4 : 5
        case .number(let number): number.text.utf8.count
        case .string(let string): bound(string)
        case .array(let elements): elements.reduce(1 + max(elements.count, 1)) { $0 + bound($1) }
        case .object(let object): bound(object)
        }
    }

    static func bound(_ object: JSONObject) -> Int {
        object.members.reduce(1 + max(object.count, 1)) { $0 + 1 + bound($1.key) + bound($1.value) }
    }

    static func bound(_ string: String) -> Int {
        2 + 6 * string.utf8.count
    }

    /// Appends at most `bound` bytes produced by `write`, which returns the count written.
    static func append(
        bound: Int, to out: inout [UInt8], _ write: (UnsafeMutablePointer<UInt8>) -> Int
    ) {
        // Written into a buffer of its own, then copied in one piece: filling `out`
        // with `bound` placeholder bytes first goes element by element through
        // generic code in an unoptimised build (about 100 ms for a 36 KB answer).
        let piece = [UInt8](unsafeUninitializedCapacity: bound) { buffer, count in
            count = write(buffer.baseAddress!)
        }
        out.append(contentsOf: piece)
    }

    @inline(__always)
    static func put(_ text: StaticString, _ p: UnsafeMutablePointer<UInt8>) -> Int {
        p.update(from: text.utf8Start, count: text.utf8CodeUnitCount)
        return text.utf8CodeUnitCount
    }

    /// Writes `value` at `p`; returns the number of bytes written.
    static func write(_ value: JSON, to p: UnsafeMutablePointer<UInt8>) -> Int {
        switch value {
        case .null:
            return put("null", p)
        case .bool(let value):
            return value ? put("true", p) : put("false", p)
        case .number(let number):
            return writeRaw(number.text, to: p)
        case .string(let string):
            return write(string, to: p)
        case .array(let elements):
            p[0] = UInt8(ascii: "[")
            var i = 1
            for element in elements {
                if i > 1 {
                    p[i] = UInt8(ascii: ",")
                    i += 1
                }
                i += write(element, to: p + i)
            }
            p[i] = UInt8(ascii: "]")
            return i + 1
        case .object(let object):
            return write(object, to: p)
        }
    }

    static func write(_ object: JSONObject, to p: UnsafeMutablePointer<UInt8>) -> Int {
        p[0] = UInt8(ascii: "{")
        var i = 1
        for member in object.members {
            if i > 1 {
                p[i] = UInt8(ascii: ",")
                i += 1
            }
            i += write(member.key, to: p + i)
            p[i] = UInt8(ascii: ":")
            i += 1
            i += write(member.value, to: p + i)
        }
        p[i] = UInt8(ascii: "}")
        return i + 1
    }

    static func writeRaw(_ text: String, to p: UnsafeMutablePointer<UInt8>) -> Int {
        if let count = text.utf8.withContiguousStorageIfAvailable({ utf8 in
            p.update(from: utf8.baseAddress!, count: utf8.count)
            return utf8.count
        }) {
            return count
        }
        var i = 0
        for byte in text.utf8 {
            p[i] = byte
            i += 1
        }
        return i
    }

    static func write(_ string: String, to p: UnsafeMutablePointer<UInt8>) -> Int {
        p[0] = UInt8(ascii: "\"")
        let count =
            string.utf8.withContiguousStorageIfAvailable { writeEscaped($0, to: p + 1) }
            ?? Array(string.utf8).withUnsafeBufferPointer { writeEscaped($0, to: p + 1) }
        p[count + 1] = UInt8(ascii: "\"")
        return count + 2
    }

    /// Writes the escaped contents of a string (without quotes); returns the length.
    static func writeEscaped(
        _ utf8: UnsafeBufferPointer<UInt8>, to p: UnsafeMutablePointer<UInt8>
    )
        -> Int
    {
        guard let base = utf8.baseAddress else { return 0 }
        let count = utf8.count
        var i = 0
        var o = 0
        while i < count {
            let byte = base[i]
            i += 1
            if byte >= 0x20 && byte != 0x22 && byte != 0x5C && byte != 0xE2 {
                p[o] = byte
                o += 1
                continue
            }
            switch byte {
            case 0x22: o += put("\\\"", p + o)
            case 0x5C: o += put("\\\\", p + o)
            case 0x08: o += put("\\b", p + o)
            case 0x0C: o += put("\\f", p + o)
            case 0x0A: o += put("\\n", p + o)
            case 0x0D: o += put("\\r", p + o)
            case 0x09: o += put("\\t", p + o)
            case 0xE2:
                // U+2028 is E2 80 A8 and U+2029 is E2 80 A9; other E2 sequences pass.
                if i + 1 < count, base[i] == 0x80, base[i + 1] & 0xFE == 0xA8 {
                    o += put(base[i + 1] == 0xA8 ? "\\u2028" : "\\u2029", p + o)
                    i += 2
                } else {
                    p[o] = byte
                    o += 1
                }
            default:
                // Other control characters: \u00XX, lowercase hex.
                let low = byte & 0xF
                o += put("\\u00", p + o)
                p[o] = 0x30 + (byte >> 4)
                p[o + 1] = low < 10 ? 0x30 + low : UInt8(ascii: "a") - 10 + low
                o += 2
            }
        }
        return o
    }
}
