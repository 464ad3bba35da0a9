import HeraldJSON
import JSONRPC
import Testing

func params(_ text: String) throws -> JSONObject {
    try #require(try JSONParser.parse(text).objectValue)
}

func reader(_ text: String) throws -> ParamReader {
    ParamReader(try params(text))
}

/// Expects `body` to fail with invalid params for `field` and `reason`.
func expectInvalid(
    _ field: String, _ reason: String, sourceLocation: SourceLocation = #_sourceLocation,
    _ body: () throws -> Void
) {
    do {
        try body()
        Issue.record("expected \(field): \(reason)", sourceLocation: sourceLocation)
    } catch {
        #expect(
            error as? RPCError == .invalidParams(field: field, reason: reason),
            sourceLocation: sourceLocation)
    }
}

@Suite("Param reader")
struct ParamReaderTests {
    @Test("reads a device.register call")
    func register() throws {
        var p = try reader(
            #"""
            {"user":"u1","platform":"web","token":"https://push.example/abc",
             "keys":{"p256dh":"BPub","auth":"sec"},"version":3,"app":"default","name":null}
            """#)
        #expect(try p.string("user", required: true, maxBytes: 256) == "u1")
        #expect(
            try p.enumeration(
                "platform", required: true, allowed: ["apns", "apns_voip", "fcm", "web"]) == "web")
        #expect(try p.string("token", required: true, maxBytes: 4096) == "https://push.example/abc")
        let keys = try p.object("keys") { (k: inout ParamReader) throws(RPCError) in
            (
                try k.string("p256dh", required: true, maxBytes: 128),
                try k.string("auth", required: true, maxBytes: 64)
            )
        }
        #expect(keys?.0 == "BPub" && keys?.1 == "sec")
        #expect(try p.int("version", range: 0...Int.max) == 3)
        #expect(try p.string("app", maxBytes: 64) ?? "default" == "default")
        #expect(try p.string("name", maxBytes: 64) == nil)
        #expect(try p.enumeration("environment", allowed: ["production", "development"]) == nil)
        #expect(try p.string("session", maxBytes: 64) == nil)
        try p.finish()
    }

    @Test("strings")
    func strings() throws {
        var p = try reader(#"{"s":"abc","e":"","n":5,"u":"ééé","z":null}"#)
        #expect(try p.string("s", maxBytes: 3) == "abc")
        expectInvalid("s", "must be at most 2 bytes") { _ = try p.string("s", maxBytes: 2) }
        expectInvalid("u", "must be at most 5 bytes") { _ = try p.string("u", maxBytes: 5) }
        #expect(try p.string("u", maxBytes: 6) == "ééé")
        expectInvalid("e", "must not be empty") { _ = try p.string("e", maxBytes: 9) }
        #expect(try p.string("e", maxBytes: 9, allowEmpty: true) == "")
        expectInvalid("n", "must be a string") { _ = try p.string("n", maxBytes: 9) }
        expectInvalid("missing", "is required") {
            _ = try p.string("missing", required: true, maxBytes: 9)
        }
        expectInvalid("z", "is required") { _ = try p.string("z", required: true, maxBytes: 9) }
        #expect(try p.string("z", maxBytes: 9) == nil)
        #expect(try p.string("missing", maxBytes: 9) == nil)
    }

    @Test("integers")
    func integers() throws {
        var p = try reader(
            #"{"i":42,"neg":-0,"f":1.0,"e":1e3,"s":"5","big":99999999999999999999,"b":true}"#)
        #expect(try p.int("i", range: 0...100) == 42)
        #expect(try p.int("neg", range: 0...0) == 0)
        expectInvalid("i", "must be between 0 and 10") { _ = try p.int("i", range: 0...10) }
        expectInvalid("i", "must be at least 50") { _ = try p.int("i", range: 50...Int.max) }
        expectInvalid("i", "must be at most 41") { _ = try p.int("i", range: Int.min...41) }
        expectInvalid("f", "must be an integer") { _ = try p.int("f") }
        expectInvalid("e", "must be an integer") { _ = try p.int("e") }
        expectInvalid("s", "must be an integer") { _ = try p.int("s") }
        expectInvalid("b", "must be an integer") { _ = try p.int("b") }
        expectInvalid("big", "must be a 64-bit integer") { _ = try p.int("big") }
        expectInvalid("big", "must be at least 0") { _ = try p.int("big", range: 0...Int.max) }
        expectInvalid("x", "is required") { _ = try p.int("x", required: true) }
        #expect(try p.int("x") == nil)
    }

    @Test("booleans and enumerations")
    func boolsAndEnums() throws {
        var p = try reader(#"{"w":true,"n":1,"k":"clear","bad":"CLEAR","num":3}"#)
        #expect(try p.bool("w") == true)
        expectInvalid("n", "must be a boolean") { _ = try p.bool("n") }
        let kinds = ["notification", "clear", "call_ring"]
        #expect(try p.enumeration("k", allowed: kinds) == "clear")
        expectInvalid("bad", "must be one of: notification, clear, call_ring") {
            _ = try p.enumeration("bad", allowed: kinds)
        }
        expectInvalid("num", "must be one of: a, b") {
            _ = try p.enumeration("num", allowed: ["a", "b"])
        }
        expectInvalid("kind", "is required") {
            _ = try p.enumeration("kind", required: true, allowed: kinds)
        }
    }

    @Test("nested objects report dotted fields and are finished")
    func nested() throws {
        var p = try reader(
            #"{"keys":{"p256dh":1,"auth":"a"},"alert":"x","to":{"users":["a"],"extra":1}}"#)
        var keys = try #require(try p.object("keys"))
        #expect(keys.prefix == "keys")
        expectInvalid("keys.p256dh", "must be a string") {
            _ = try keys.string("p256dh", maxBytes: 99)
        }
        expectInvalid("keys.auth", "unknown parameter") { try keys.finish() }
        expectInvalid("alert", "must be an object") { _ = try p.object("alert") }
        expectInvalid("missing", "is required") { _ = try p.object("missing", required: true) }
        expectInvalid("to.extra", "unknown parameter") {
            _ = try p.object("to") { (to: inout ParamReader) throws(RPCError) in
                try to.stringArray("users", maxCount: 10, maxBytes: 10)
            }
        }
        var deep = try reader(#"{"a":{"b":{"c":5}}}"#)
        expectInvalid("a.b.c", "must be a string") {
            _ = try deep.object("a") { (a: inout ParamReader) throws(RPCError) in
                try a.object("b") { (b: inout ParamReader) throws(RPCError) in
                    try b.string("c", maxBytes: 1)
                }
            }
        }
    }

    @Test("string arrays report the failing element")
    func stringArrays() throws {
        var p = try reader(
            #"{"to":{"users":["a","b","c",7]},"e":[],"s":"x","long":["ok","toolong"],"blank":[""]}"#
        )
        var to = try #require(try p.object("to"))
        expectInvalid("to.users[3]", "must be a string") {
            _ = try to.stringArray("users", maxCount: 10, maxBytes: 10)
        }
        expectInvalid("to.users", "must have at most 3 items") {
            _ = try to.stringArray("users", maxCount: 3, maxBytes: 10)
        }
        #expect(try p.stringArray("e", maxCount: 5, maxBytes: 5) == [])
        expectInvalid("e", "must not be empty") {
            _ = try p.stringArray("e", minCount: 1, maxCount: 5, maxBytes: 5)
        }
        expectInvalid("e", "must have at least 2 items") {
            _ = try p.stringArray("e", minCount: 2, maxCount: 5, maxBytes: 5)
        }
        expectInvalid("s", "must be an array") {
            _ = try p.stringArray("s", maxCount: 5, maxBytes: 5)
        }
        expectInvalid("long[1]", "must be at most 5 bytes") {
            _ = try p.stringArray("long", maxCount: 5, maxBytes: 5)
        }
        expectInvalid("blank[0]", "must not be empty") {
            _ = try p.stringArray("blank", maxCount: 5, maxBytes: 5)
        }
        #expect(try p.stringArray("blank", maxCount: 5, maxBytes: 5, allowEmpty: true) == [""])
        var ok = try reader(#"{"users":["u1","u2"]}"#)
        #expect(
            try ok.stringArray("users", required: true, maxCount: 10_000, maxBytes: 256) == [
                "u1", "u2",
            ])
        try ok.finish()
    }

    @Test("string maps keep order and check keys and values")
    func stringMaps() throws {
        var p = try reader(
            #"{"data":{"room":"r1","thread":"t9"},"bad":{"k":1},"dup":{"a":"1","a":"2"},"long":{"abcdef":"v"},"arr":["x"],"big":{"a":"1","b":"2","c":"3"},"val":{"k":"123456"},"empty":{"":"v"}}"#
        )
        let data = try #require(
            try p.stringMap("data", maxCount: 10, maxKeyBytes: 16, maxValueBytes: 16))
        #expect(data.map(\.key) == ["room", "thread"])
        #expect(data.map(\.value) == ["r1", "t9"])
        expectInvalid("bad.k", "must be a string") {
            _ = try p.stringMap("bad", maxCount: 10, maxKeyBytes: 16, maxValueBytes: 16)
        }
        expectInvalid("dup.a", "duplicate key") {
            _ = try p.stringMap("dup", maxCount: 10, maxKeyBytes: 16, maxValueBytes: 16)
        }
        expectInvalid("long.abcdef", "key must be at most 5 bytes") {
            _ = try p.stringMap("long", maxCount: 10, maxKeyBytes: 5, maxValueBytes: 16)
        }
        expectInvalid("arr", "must be an object") {
            _ = try p.stringMap("arr", maxCount: 10, maxKeyBytes: 16, maxValueBytes: 16)
        }
        expectInvalid("big", "must have at most 2 members") {
            _ = try p.stringMap("big", maxCount: 2, maxKeyBytes: 16, maxValueBytes: 16)
        }
        expectInvalid("val.k", "must be at most 5 bytes") {
            _ = try p.stringMap("val", maxCount: 2, maxKeyBytes: 16, maxValueBytes: 5)
        }
        expectInvalid("empty.", "key must not be empty") {
            _ = try p.stringMap("empty", maxCount: 2, maxKeyBytes: 16, maxValueBytes: 5)
        }
    }

    @Test("finish() refuses unknown and duplicate params")
    func finish() throws {
        var p = try reader(#"{"user":"u","usr":"typo"}"#)
        _ = try p.string("user", maxBytes: 9)
        expectInvalid("usr", "unknown parameter") { try p.finish() }
        _ = try p.string("usr", maxBytes: 9)
        try p.finish()

        var d = try reader(#"{"user":"a","user":"b"}"#)
        #expect(try d.string("user", maxBytes: 9) == "a")
        expectInvalid("user", "duplicate parameter") { try d.finish() }

        var n = try reader(#"{"user":"a","extra":null}"#)
        _ = try n.string("user", maxBytes: 9)
        expectInvalid("extra", "unknown parameter") { try n.finish() }

        let nested = ParamReader(try params(#"{"a":1,"a":2}"#), prefix: "keys")
        expectInvalid("keys.a", "duplicate parameter") { try nested.finish() }

        try ParamReader(JSONObject()).finish()
    }

    @Test("raw values and caller-made errors")
    func raw() throws {
        var p = try reader(#"{"badge":{"u1":3},"x":null}"#)
        #expect(p.value("badge") == ["u1": 3])
        #expect(p.value("x") == .null)
        #expect(p.value("y") == nil)
        try p.finish()
        #expect(
            p.invalid("badge", "must be an integer or an object")
                == .invalidParams(field: "badge", reason: "must be an integer or an object"))
        #expect(ParamReader(JSONObject(), prefix: "to").path("users") == "to.users")
    }
}
