import HeraldJSON
import Testing

func text(_ json: JSON) -> String {
    String(decoding: json.serialized(), as: UTF8.self)
}

@Suite("JSON serializer")
struct JSONSerializerTests {
    @Test("writes compact JSON with members in stored order")
    func compact() {
        let value: JSON = ["b": 1, "a": [true, false, nil], "b": "x", "e": [:], "f": []]
        #expect(text(value) == #"{"b":1,"a":[true,false,null],"b":"x","e":{},"f":[]}"#)
        #expect(value.description == text(value))
    }

    @Test("numbers are written from their source text")
    func numbers() throws {
        for source in ["1.50", "-0", "1E+2", "1e400", "123456789012345678901234567890", "0.000"] {
            #expect(text(try JSONParser.parse(source)) == source)
        }
        #expect(text(.int(-7)) == "-7")
        #expect(text(1.5) == "1.5")
        #expect(text(.double(.infinity)) == "null")
        #expect(text(.double(.nan)) == "null")
    }

    @Test("escapes quotes, backslashes and control characters")
    func controlEscapes() {
        #expect(text(#"a"b\c/d"#) == #""a\"b\\c/d""#)
        #expect(text("\u{8}\u{C}\n\r\t") == #""\b\f\n\r\t""#)
        #expect(text("\u{0}\u{1}\u{1F}") == #""\u0000\u0001\u001f""#)
        let all = String(decoding: (0..<0x20).map { UInt8($0) }, as: UTF8.self)
        let expected =
            #""\u0000\u0001\u0002\u0003\u0004\u0005\u0006\u0007\b\t\n\u000b\f\r\u000e\u000f"#
            + #"\u0010\u0011\u0012\u0013\u0014\u0015\u0016\u0017\u0018\u0019\u001a\u001b\u001c\u001d\u001e\u001f""#
        #expect(text(.string(all)) == expected)
        #expect(text("\u{7F}") == "\"\u{7F}\"")
    }

    @Test("escapes U+2028 and U+2029, writes other non-ASCII raw")
    func lineSeparators() {
        #expect(text("a\u{2028}b\u{2029}c") == #""a\u2028b\u2029c""#)
        #expect(text("\u{2028}") == #""\u2028""#)
        #expect(text("é€😀\u{2027}\u{202A}") == "\"é€😀\u{2027}\u{202A}\"")
        #expect(JSON.string("é").serialized() == [0x22, 0xC3, 0xA9, 0x22])
        #expect(text(["k\u{2028}": "v"]) == #"{"k\u2028":"v"}"#)
        // A lone E2 at the end of the string is part of some other character.
        #expect(text("\u{2000}") == "\"\u{2000}\"")
    }

    static let roundTrip: [String] = [
        #"{"jsonrpc":"2.0","method":"push.send","params":{"to":{"users":["u1","u2"]},"data":{"k":"v"}},"id":7}"#,
        #"[1,-0,1.50,1E+2,"\"\\\b\f\n\r\t\u0001\u2028\u2029",true,false,null,{},[]]"#,
        #"{"a":{"a":{"a":[[["é😀"]]]}},"a":1}"#,
        #""/""#, "0", #""""#,
    ]

    @Test("compact canonical text survives parse and serialize byte for byte", arguments: roundTrip)
    func roundTrips(_ source: String) throws {
        let value = try JSONParser.parse(source)
        #expect(text(value) == source)
        #expect(try JSONParser.parse(value.serialized()) == value)
    }

    @Test("every string survives a round trip")
    func stringRoundTrip() throws {
        var scalars: [Unicode.Scalar] = (0..<0x80).map { Unicode.Scalar(UInt8($0)) }
        let wide: [UInt32] = [
            0xA0, 0x7FF, 0x800, 0x2028, 0x2029, 0xD7FF, 0xE000, 0xFFFD, 0xFFFF, 0x10000, 0x10FFFF,
        ]
        scalars += wide.compactMap { Unicode.Scalar($0) }
        var string = ""
        string.unicodeScalars.append(contentsOf: scalars)
        let value: JSON = [.string(string), ["key \(string)": .string(string)]]
        #expect(try JSONParser.parse(value.serialized()) == value)
    }

    @Test("serialize(into:) appends")
    func appends() {
        var out = Array("x".utf8)
        JSON.array([1, "a"]).serialize(into: &out)
        #expect(String(decoding: out, as: UTF8.self) == #"x[1,"a"]"#)
    }

    @Test("serialising into a non-empty array appends exactly the compact text")
    func serializeAppends() {
        var out: [UInt8] = Array("prefix:".utf8)
        let value: JSON = ["s": "a\"b\n\u{2028}", "n": 1, "a": [true, nil]]
        value.serialize(into: &out)
        #expect(String(decoding: out, as: UTF8.self) == #"prefix:{"s":"a\"b\n\u2028","n":1,"a":[true,null]}"#)
        // A large answer keeps no more room than about twice its size.
        let big: JSON = .array((0..<2000).map { _ in .string(String(repeating: "z", count: 100)) })
        let bytes = big.serialized()
        #expect(bytes.capacity <= 2 * bytes.count + 4096)
    }
}
