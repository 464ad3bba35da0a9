import HeraldJSON
import Testing

/// Parses raw bytes, for cases that are not valid UTF-8 text.
func parse(bytes: [UInt8]) throws(JSONParseError) -> JSON {
    try JSONParser.parse(bytes)
}

func nested(_ depth: Int) -> String {
    String(repeating: "[", count: depth) + String(repeating: "]", count: depth)
}

@Suite("JSON parser")
struct JSONParserTests {
    /// Texts every conforming parser accepts (JSONTestSuite y_ style).
    static let accepted: [String] = [
        "[]", "{}", "[null]", "[true]", "[false]", "0", "-0", "\"a\"", "null", "true", "false",
        " [1] ", "\t\n\r [1]\n\r\t", "[1, 2 ,3]", "[-0]", "[-0.0]", "[1E22]", "[1e-2]", "[1E+2]",
        "[0e1]", "[0E-0]", "[123.456e78]", "[-123]", "[1.5]", "[1e400]", "[-1e400]", "[1e-400]",
        "[123456789012345678901234567890]", "[-9223372036854775809]", #"["\/"]"#, #"["\u0000"]"#,
        #"["\uD834\uDd1E"]"#, #"["\u00e9"]"#, "[\"é\"]", #"["\"\\\/\b\f\n\r\t"]"#,
        #"["\u2028\u2029"]"#,
        #"[""]"#, #"{"a":[],"a":1}"#, #"{"":0}"#, "[[[[]]]]", #"["\uFFFF"]"#, #"["\uDBFF\uDFFF"]"#,
        "[\"\u{10FFFF}\"]", "[\"\u{7F}\"]", #"{"a":{"b":{"c":[1,{"d":null}]}}}"#, "[\"😀 日本\"]",
        #""\u005C""#, "1", "-1.0e+0",
    ]

    @Test("accepts valid JSON", arguments: accepted)
    func accepts(_ text: String) throws {
        _ = try JSONParser.parse(text)
    }

    /// Texts every conforming parser refuses (JSONTestSuite n_ style).
    static let rejected: [String] = [
        "", " ", "\n", "[1,]", #"{"a":1,}"#, "[,1]", "[1,,2]", "{,}", "[01]", "[-01]", "[00]",
        "[+1]",
        "[.5]", "[1.]", "[1.e1]", "[1e]", "[1e+]", "[-]", "[- 1]", "[NaN]", "[Infinity]",
        "[-Infinity]",
        "[0x10]", "// c\n[]", "[] // c", "/* */[]", "[]#", #"["\uD800"]"#, #"["\uDC00"]"#,
        #"["\uD800\u0041"]"#, #"["\uD800\n"]"#, #"["\uD800""#, "[\"a\u{1F}b\"]", "[\"tab\there\"]",
        "[\"new\nline\"]", #"["\x"]"#, #"["\u12"]"#, #"["\uZZZZ"]"#, #"["\U0041"]"#, "['a']",
        "{a:1}",
        #"{"a" 1}"#, #"{"a":}"#, #"{"a"}"#, #"{1:1}"#, "[1 2]", "[true false]", "tru", "nul",
        "True",
        "[1]x", "[1]]", "{}}", "1 2", #"["a"#, "[", "{", #"{"a":1"#, "[\u{0}]", "[1]\u{0}",
        "[\u{0B}1]", "[\u{0C}1]", "\u{A0}[]", "\u{FEFF}[]", "\"", "[\"a\\\"]", "[1,", "]", "}",
        #"{"a":1 "b":2}"#, "[1:2]", #"{"a"::1}"#, "[--1]", "[1e1.5]", "[.]", "'single'",
        "undefined",
        nested(JSONParser.maxDepth + 1), "{\"a\":" + nested(JSONParser.maxDepth) + "}",
    ]

    @Test("refuses invalid JSON", arguments: rejected)
    func rejects(_ text: String) {
        #expect(throws: JSONParseError.self) { try JSONParser.parse(text) }
    }

    static let invalidUTF8: [[UInt8]] = [
        [0x22, 0xFF, 0x22],  // never valid
        [0x22, 0xC0, 0xAF, 0x22],  // overlong "/"
        [0x22, 0xE0, 0x80, 0xAF, 0x22],  // overlong 3-byte
        [0x22, 0xF0, 0x80, 0x80, 0xAF, 0x22],  // overlong 4-byte
        [0x22, 0xED, 0xA0, 0x80, 0x22],  // encoded surrogate U+D800
        [0x22, 0xF4, 0x90, 0x80, 0x80, 0x22],  // beyond U+10FFFF
        [0x22, 0xE9, 0x22],  // truncated sequence
        [0x22, 0x80, 0x22],  // lone continuation byte
        [0x22, 0xE2, 0x82, 0x22],  // truncated euro sign
        [0x22, 0x5C, 0x22, 0xC3, 0x22],  // after an escape, truncated
        [0x22, 0xF5, 0x80, 0x80, 0x80, 0x22],  // F5 lead byte
        [0x22, 0xE2, 0x82],  // truncated at end of input
        [0x5B, 0xC3, 0xA9, 0x5D],  // non-ASCII outside a string
    ]

    @Test("refuses invalid UTF-8", arguments: invalidUTF8)
    func rejectsInvalidUTF8(_ bytes: [UInt8]) {
        #expect(throws: JSONParseError.self) { try parse(bytes: bytes) }
    }

    @Test("decodes values")
    func values() throws {
        #expect(try JSONParser.parse("null") == .null)
        #expect(try JSONParser.parse(" true ") == .bool(true))
        #expect(try JSONParser.parse(#"["\/"]"#) == ["/"])
        #expect(try JSONParser.parse(#""\"\\\/\b\f\n\r\t""#) == .string("\"\\/\u{8}\u{C}\n\r\t"))
        #expect(try JSONParser.parse(#""\uD834\uDD1E x \u00e9\u0000""#) == .string("𝄞 x é\u{0}"))
        #expect(try JSONParser.parse(#""a\u0041b""#) == "aAb")
        #expect(try JSONParser.parse("\"😀 日本\"") == "😀 日本")
        #expect(try parse(bytes: [0x22, 0xF4, 0x8F, 0xBF, 0xBF, 0x22]) == .string("\u{10FFFF}"))
        #expect(
            try JSONParser.parse(#"{"a":1,"b":[true,null],"a":"x"}"#) == [
                "a": 1, "b": [true, nil], "a": "x",
            ])
        #expect(try JSONParser.parse("[1.50]") == .array([.number(JSONNumber("1.50")!)]))
        #expect(try JSONParser.parse(nested(JSONParser.maxDepth)) != .null)
    }

    @Test("objects keep order and duplicates")
    func objects() throws {
        let object = try #require(try JSONParser.parse(#"{"b":1,"a":2,"b":3}"#).objectValue)
        #expect(object.keys == ["b", "a", "b"])
        #expect(object.count == 3)
        #expect(object["b"] == 1)
        #expect(object["a"] == 2)
        #expect(object["c"] == nil)
        #expect(object.hasDuplicateKeys)
        #expect(object.firstDuplicateKey == "b")
        #expect(try JSONParser.parse(#"{"b":1,"a":2}"#).objectValue?.hasDuplicateKeys == false)
        let many = JSONObject((0..<40).map { ("k\($0)", JSON.int($0)) } + [("k7", .null)])
        #expect(many.firstDuplicateKey == "k7")
    }

    @Test("numbers keep their text and convert on request")
    func numbers() throws {
        func number(_ text: String) throws -> JSONNumber {
            try #require(try JSONParser.parse(text).numberValue)
        }
        #expect(try number("-0").text == "-0")
        #expect(try number("-0").int64 == 0)
        #expect(try number("1E+2").text == "1E+2")
        #expect(try number("9223372036854775807").int64 == Int64.max)
        #expect(try number("-9223372036854775808").int64 == Int64.min)
        #expect(try number("9223372036854775808").int64 == nil)
        #expect(try number("123456789012345678901234567890").int64 == nil)
        #expect(try number("1.0").int64 == nil)
        #expect(try number("1e3").int64 == nil)
        #expect(try number("1e3").double == 1000)
        #expect(try number("1e400").double == .infinity)
        #expect(try number("-1e400").double == -.infinity)
        #expect(try number("1e-400").double == 0)
        #expect(try number("0.1").double == 0.1)
        #expect(JSONNumber("01") == nil)
        #expect(JSONNumber("+1") == nil)
        #expect(JSONNumber(" 1") == nil)
        #expect(JSONNumber("") == nil)
        #expect(JSONNumber("-1.5e-3")?.double == -0.0015)
        #expect(JSONNumber(Double.nan) == nil)
        #expect(JSONNumber(Double.infinity) == nil)
        #expect(JSONNumber(0.1)?.text == "0.1")
        #expect(JSONNumber(1e-7).map { JSONNumber($0.text) != nil } == true)
        #expect(JSONNumber(-42).text == "-42")
        #expect(JSONNumber(UInt64.max).text == "18446744073709551615")
    }

    @Test("errors carry a reason and the byte offset")
    func errorOffsets() {
        func failure(_ text: String) -> JSONParseError? {
            do {
                _ = try JSONParser.parse(text)
                return nil
            } catch {
                return error
            }
        }
        #expect(failure("[1,]") == JSONParseError("trailing comma", at: 3))
        #expect(failure(#"{"a":1,}"#) == JSONParseError("trailing comma", at: 7))
        #expect(failure("[01]") == JSONParseError("leading zero", at: 1))
        #expect(failure("[1] x") == JSONParseError("unexpected data after value", at: 4))
        #expect(failure("") == JSONParseError("unexpected end of input", at: 0))
        #expect(failure(#"["\uD800"]"#) == JSONParseError("lone surrogate", at: 2))
        #expect(failure("[\"a\nb\"]") == JSONParseError("control character in string", at: 3))
        #expect(failure(nested(257))?.reason == "nesting too deep")
        #expect(failure(nested(257))?.offset == 256)
        #expect(failure("{\"a\" 1}")?.reason == "expected ':'")
        #expect(failure("\u{FEFF}[]")?.reason == "byte order mark")
        #expect(throws: JSONParseError("invalid UTF-8", at: 3)) {
            try parse(bytes: Array(#"["a"#.utf8) + [0xFF, 0x22, 0x5D])
        }
        #expect(JSONParseError("x", at: 4).description == "x at byte 4")
    }

    @Test("parses from every contiguous and non-contiguous byte source")
    func sources() throws {
        let text = #"{"k":[1,"v"]}"#
        let bytes = Array(text.utf8)
        let expected: JSON = ["k": [1, "v"]]
        #expect(try JSONParser.parse(bytes) == expected)
        #expect(try JSONParser.parse(bytes[...]) == expected)
        #expect(
            try bytes.withUnsafeBytes { raw throws(JSONParseError) in try JSONParser.parse(raw) }
                == expected)
        #expect(try JSONParser.parse(text) == expected)
        #expect(try JSONParser.parse(text.utf8.lazy.map { $0 }) == expected)
        let empty = UnsafeRawBufferPointer(start: nil, count: 0)
        #expect(throws: JSONParseError("unexpected end of input", at: 0)) {
            try JSONParser.parse(empty)
        }
    }
}
