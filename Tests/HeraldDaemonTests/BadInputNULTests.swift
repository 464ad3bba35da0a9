import Foundation
import HeraldJSON
import HeraldTestSupport
import JSONRPC
import Testing

/// U+0000 in string params: one answer whatever the store backend.
///
/// PostgreSQL `text` cannot hold a NUL (SQLite can), so identifiers and values
/// PostgreSQL keeps as `text` are read with ``ParamReader/StringContent/text``
/// and a NUL is -32602 naming the field before the store is asked; strings the
/// store keeps as bytes are read as `.bytes` and keep a NUL whole.
/// `Tests/reliability/test_hostile.py` runs the same rule against a daemon on
/// each backend.
@Suite("bad input: NUL in string params")
struct BadInputNULTests {
    private static func reader(_ text: String) throws -> ParamReader {
        ParamReader(try #require(try JSONParser.parse(text).objectValue))
    }

    /// Expects `body` to fail with -32602 for `field` and `reason`.
    private static func expectInvalid(
        _ field: String, _ reason: String, sourceLocation: SourceLocation = #_sourceLocation,
        _ body: () throws -> Void
    ) {
        do {
            try body()
            Issue.record("expected \(field): \(reason)", sourceLocation: sourceLocation)
        } catch {
            #expect(
                error as? RPCError == .invalidParams(field: field, reason: reason), "\(error)",
                sourceLocation: sourceLocation)
        }
    }

    @Test(".text refuses a NUL in a string, an array item and a map key or value, naming the field")
    func textRefusesNUL() throws {
        let reason = ParamReader.nulReason
        #expect(reason == "must not contain NUL (U+0000)")
        var p = try Self.reader(#"{"id":"ab\u0000cd","end":"abc\u0000"}"#)
        Self.expectInvalid("id", reason) { _ = try p.string("id", maxBytes: 32, content: .text) }
        Self.expectInvalid("end", reason) { _ = try p.string("end", required: true, maxBytes: 32, content: .text) }

        var nested = try Self.reader(#"{"to":{"devices":["0123","45\u000067"]}}"#)
        Self.expectInvalid("to.devices[1]", reason) {
            _ = try nested.object("to") { (to: inout ParamReader) throws(RPCError) in
                try to.stringArray("devices", maxCount: 10, maxBytes: 32, content: .text)
            }
        }

        var map = try Self.reader(#"{"m":{"k":"v\u0000"},"n":{"k\u0000":"v"}}"#)
        Self.expectInvalid("m.k", reason) {
            _ = try map.stringMap("m", maxCount: 4, maxKeyBytes: 8, maxValueBytes: 8, content: .text)
        }
        Self.expectInvalid("n.k\u{0}", "key " + reason) {
            _ = try map.stringMap("n", maxCount: 4, maxKeyBytes: 8, maxValueBytes: 8, content: .text)
        }
    }

    @Test(".text keeps the other checks first and accepts text without a NUL")
    func textOtherwise() throws {
        var p = try Self.reader(#"{"a":"plain","b":"","c":5,"d":"\u0000\u0000\u0000"}"#)
        #expect(try p.string("a", maxBytes: 8, content: .text) == "plain")
        Self.expectInvalid("b", "must not be empty") { _ = try p.string("b", maxBytes: 8, content: .text) }
        Self.expectInvalid("c", "must be a string") { _ = try p.string("c", maxBytes: 8, content: .text) }
        // Length is checked before content: the reason a client most needs comes first.
        Self.expectInvalid("d", "must be at most 2 bytes") { _ = try p.string("d", maxBytes: 2, content: .text) }
        Self.expectInvalid("d", ParamReader.nulReason) { _ = try p.string("d", maxBytes: 8, content: .text) }
    }

    @Test(".bytes (the default) keeps a NUL whole, wherever it is")
    func bytesKeepNUL() throws {
        var p = try Self.reader(
            #"{"user":"alice\u0000evil","list":["\u0000","a\u0000"],"map":{"k\u0000":"v\u0000w"},"s":"x\u0000"}"#)
        #expect(try p.string("user", maxBytes: 256) == "alice\u{0}evil")
        #expect(try p.stringArray("list", maxCount: 4, maxBytes: 8) == ["\u{0}", "a\u{0}"])
        let map = try #require(try p.stringMap("map", maxCount: 4, maxKeyBytes: 8, maxValueBytes: 8))
        #expect(map.count == 1 && map[0].key == "k\u{0}" && map[0].value == "v\u{0}w")
        #expect(try p.string("s", maxBytes: 8, content: .bytes) == "x\u{0}")
        try p.finish()
    }
}

/// The rule through the socket (on SQLite here; the Python hostile suite runs it on both backends):
/// the text params refuse a NUL with their field, nothing is stored, the connection goes on; the
/// byte params keep it whole.
@Suite(
    "bad input: NUL through the socket", .serialized,
    .sharedDaemon { _ in
        """
        [app.default]
        device_cap = 20
        """
    })
struct BadInputNULSocketTests {
    static let user = "nul-sock"

    @Test("a NUL in a text param is -32602 with its field; in a byte param it is kept whole")
    func throughTheSocket() throws {
        let daemon = try SuiteDaemon.daemon()
        let client = BadInputTests.Client(try daemon.connect())
        defer { client.connection.close() }
        let registered = try client.result(
            "device.register", #"{"user":"\#(Self.user)","platform":"fcm","token":"nul-sock-token"}"#)
        let deviceID = try #require(registered["device_id"]?.stringValue)
        let before = try client.result("device.list", #"{"user":"\#(Self.user)"}"#)
        let refused: [(method: String, params: String, field: String)] = [
            ("device.register", #"{"user":"u","platform":"fcm","token":"t\u0000"}"#, "token"),
            (
                "device.register",
                #"{"user":"u","platform":"apns","token":"00112233445566778899aabbccddeeff","bundle_id":"b\u0000"}"#,
                "bundle_id"
            ),
            ("device.unregister", #"{"user":"u","device_id":"\#(deviceID.dropLast())\u0000"}"#, "device_id"),
            (
                "device.unregister", #"{"user":"\#(Self.user)","platform":"fcm","token":"nul-sock-token\u0000"}"#,
                "token"
            ),
            ("device.update", #"{"device_id":"\#(deviceID.dropLast())\u0000","enabled":false}"#, "device_id"),
            ("push.send", #"{"to":{"devices":["\#(deviceID.dropLast())\u0000"]}}"#, "to.devices[0]"),
            ("push.send", #"{"to":{"users":["\#(Self.user)"]},"thread_id":"t\u0000"}"#, "thread_id"),
            ("push.status", #"{"message_id":"\#(String(repeating: "0", count: 31))\u0000"}"#, "message_id"),
            ("push.cancel", #"{"message_id":"\#(String(repeating: "0", count: 31))\u0000"}"#, "message_id"),
        ]
        for (method, params, field) in refused {
            let response = try client.call(method, rawParams: params)
            #expect(response["error"]?["code"]?.numberValue?.text == "-32602", "\(method) \(params): \(response)")
            #expect(response["error"]?["data"]?["field"]?.stringValue == field, "\(method) \(params): \(response)")
            #expect(try client.result("device.list", #"{"user":"\#(Self.user)"}"#) == before, "\(method): changed")
            #expect(try client.result("system.health")["status"]?.stringValue == "ok")
        }

        // Kept whole: a user of its own, with a name and app version given back as sent.
        let kept = try client.result(
            "device.register",
            #"{"user":"\#(Self.user)\u0000x","platform":"fcm","token":"nul-sock-2","name":"a\u0000b","#
                + #""app_version":"1\u0000"}"#
        )
        #expect(kept["device_id"]?.stringValue != deviceID)
        let listed = try client.result("device.list", #"{"user":"\#(Self.user)\u0000x"}"#)["devices"]?.arrayValue
        #expect(listed?.count == 1)
        #expect(listed?.first?["name"]?.stringValue == "a\u{0}b")
        #expect(listed?.first?["app_version"]?.stringValue == "1\u{0}")
        #expect(try client.result("device.list", #"{"user":"\#(Self.user)"}"#) == before)
        _ = try client.result("user.forget", #"{"user":"\#(Self.user)\u0000x"}"#)
        _ = try client.result("user.forget", #"{"user":"\#(Self.user)"}"#)
    }
}
