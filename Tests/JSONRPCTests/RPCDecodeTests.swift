import HeraldJSON
import JSONRPC
import Testing

func decode(_ text: String) -> RPCMessage {
    RPCMessage.decode(Array(text.utf8))
}

/// The bytes a server following the decoded message would write, with each request
/// answered by `answer` (nil for none, as for notifications).
func wire(_ message: RPCMessage, answer: (RPCRequest) -> JSON = { _ in "ok" }) -> String {
    func response(_ call: RPCCall) -> JSON? {
        switch call {
        case .success(let request):
            request.id.map { RPCResponse.success(id: $0, result: answer(request)) }
        case .failure(let failure): failure.response
        }
    }
    switch message {
    case .single(let call):
        return response(call).map { String(decoding: RPCResponse.frame($0), as: UTF8.self) } ?? ""
    case .batch(let calls):
        let collector = BatchCollector(expecting: message.expectedResponseCount)
        if collector.isComplete { return "" }
        var out: [UInt8]? = nil
        for call in calls.reversed() {
            if let json = response(call), let bytes = collector.add(json) { out = bytes }
        }
        return out.map { String(decoding: $0, as: UTF8.self) } ?? "<incomplete>"
    }
}

func failure(_ message: RPCMessage) -> RPCFailure? {
    if case .single(.failure(let failure)) = message { failure } else { nil }
}

func request(_ message: RPCMessage) -> RPCRequest? {
    if case .single(.success(let request)) = message { request } else { nil }
}

@Suite("JSON-RPC 2.0 decoding")
struct RPCDecodeTests {
    // MARK: The examples of the JSON-RPC 2.0 specification

    @Test("rpc call with named parameters")
    func namedParams() {
        let message = decode(
            #"{"jsonrpc": "2.0", "method": "subtract", "params": {"subtrahend": 23, "minuend": 42}, "id": 3}"#
        )
        #expect(
            request(message)
                == RPCRequest(
                    method: "subtract", params: ["subtrahend": 23, "minuend": 42], id: .number(3)))
        #expect(wire(message) { _ in 19 } == #"{"jsonrpc":"2.0","id":3,"result":19}"# + "\n")
    }

    @Test("rpc call with positional parameters is invalid params here")
    func positionalParams() {
        let message = decode(
            #"{"jsonrpc": "2.0", "method": "subtract", "params": [42, 23], "id": 1}"#)
        #expect(
            failure(message)
                == RPCFailure(
                    id: .number(1),
                    error: .invalidParams(field: "params", reason: "params must be an object")))
        #expect(
            wire(message)
                == #"{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"Invalid params","data":{"field":"params","reason":"params must be an object"}}}"#
                + "\n")
    }

    @Test("notifications get no response, even when their params are wrong")
    func notifications() {
        let update = decode(#"{"jsonrpc": "2.0", "method": "update", "params": [1,2,3,4,5]}"#)
        #expect(failure(update)?.id == nil)
        #expect(failure(update)?.error.code == -32602)
        #expect(update.expectedResponseCount == 0)
        #expect(wire(update) == "")
        let foobar = decode(#"{"jsonrpc": "2.0", "method": "foobar"}"#)
        #expect(request(foobar) == RPCRequest(method: "foobar", params: [:], id: nil))
        #expect(request(foobar)?.isNotification == true)
        #expect(wire(foobar) == "")
    }

    @Test("rpc call with invalid JSON")
    func invalidJSON() {
        let message = decode(#"{"jsonrpc": "2.0", "method": "foobar, "params": "bar", "baz]"#)
        #expect(failure(message)?.id == .null)
        #expect(failure(message)?.error.code == -32700)
        #expect(failure(message)?.error.message == "Parse error")
        #expect(
            wire(message).hasPrefix(
                #"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error","data":{"reason":"#
            ))
    }

    @Test("rpc call with invalid Request object")
    func invalidRequestObject() {
        let message = decode(#"{"jsonrpc": "2.0", "method": 1, "params": "bar"}"#)
        #expect(
            failure(message)
                == RPCFailure(id: .null, error: .invalidRequest("method must be a string")))
        #expect(
            wire(message)
                == #"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request","data":{"reason":"method must be a string"}}}"#
                + "\n")
    }

    @Test("rpc call batch with invalid JSON")
    func batchInvalidJSON() {
        let message = decode(
            #"""
            [
              {"jsonrpc": "2.0", "method": "sum", "params": [1,2,4], "id": "1"},
              {"jsonrpc": "2.0", "method"
            ]
            """#)
        #expect(failure(message)?.error.code == -32700)
        #expect(failure(message)?.id == .null)
    }

    @Test("rpc call with an empty array")
    func emptyBatch() {
        let message = decode("[]")
        #expect(
            message
                == .single(.failure(RPCFailure(id: .null, error: .invalidRequest("empty batch")))))
        #expect(wire(message).hasPrefix(#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"#))
    }

    @Test("rpc call with an invalid batch, but not empty")
    func invalidBatchOne() {
        let message = decode("[1]")
        let invalid = RPCFailure(id: .null, error: .invalidRequest("request must be an object"))
        #expect(message == .batch([.failure(invalid)]))
        #expect(
            wire(message)
                == #"[{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request","data":{"reason":"request must be an object"}}}]"#
                + "\n")
    }

    @Test("rpc call with an invalid batch")
    func invalidBatchThree() {
        let message = decode("[1,2,3]")
        let invalid = RPCCall.failure(
            RPCFailure(id: .null, error: .invalidRequest("request must be an object")))
        #expect(message == .batch([invalid, invalid, invalid]))
        #expect(message.expectedResponseCount == 3)
        let text = wire(message)
        #expect(text.hasPrefix("[{") && text.hasSuffix("}]\n"))
        #expect(text.split(separator: "-32600").count == 4)
    }

    @Test("rpc call batch")
    func mixedBatch() throws {
        let message = decode(
            #"""
            [
                {"jsonrpc": "2.0", "method": "sum", "params": [1,2,4], "id": "1"},
                {"jsonrpc": "2.0", "method": "notify_hello", "params": [7]},
                {"jsonrpc": "2.0", "method": "subtract", "params": [42,23], "id": "2"},
                {"foo": "boo"},
                {"jsonrpc": "2.0", "method": "foo.get", "params": {"name": "myself"}, "id": "5"},
                {"jsonrpc": "2.0", "method": "get_data", "id": "9"}
            ]
            """#)
        guard case .batch(let calls) = message else {
            Issue.record("expected a batch")
            return
        }
        #expect(calls.count == 6)
        #expect(calls.map(\.expectsResponse) == [true, false, true, true, true, true])
        #expect(message.expectedResponseCount == 5)
        let positional = RPCError.invalidParams(field: "params", reason: "params must be an object")
        #expect(calls[0] == .failure(RPCFailure(id: .string("1"), error: positional)))
        #expect(calls[1] == .failure(RPCFailure(id: nil, error: positional)))
        #expect(calls[2] == .failure(RPCFailure(id: .string("2"), error: positional)))
        #expect(
            calls[3]
                == .failure(RPCFailure(id: .null, error: .invalidRequest("unknown member: foo"))))
        #expect(
            calls[4]
                == .success(
                    RPCRequest(method: "foo.get", params: ["name": "myself"], id: .string("5"))))
        #expect(calls[5] == .success(RPCRequest(method: "get_data", id: .string("9"))))
        let text = wire(message) { $0.method == "get_data" ? ["hello", 5] : "other" }
        #expect(
            text.hasPrefix(
                #"[{"jsonrpc":"2.0","id":"9","result":["hello",5]},{"jsonrpc":"2.0","id":"5","result":"other"},"#
            ))
        #expect(try JSONParser.parse(text).arrayValue?.count == 5)
    }

    @Test("rpc call batch (all notifications) produces no bytes at all")
    func allNotifications() {
        let message = decode(
            #"""
            [
                {"jsonrpc": "2.0", "method": "notify_sum", "params": [1,2,4]},
                {"jsonrpc": "2.0", "method": "notify_hello", "params": [7]},
                {"jsonrpc": "2.0", "method": "notify_named", "params": {"a": 7}}
            ]
            """#)
        #expect(message.expectedResponseCount == 0)
        #expect(BatchCollector(expecting: message.expectedResponseCount).isComplete)
        #expect(wire(message) == "")
    }

    // MARK: Herald's reading of each rule

    static let invalidRequestCases: [(String, RPCID, String)] = [
        (#"{"method":"m","id":1}"#, .number(1), #"jsonrpc must be "2.0""#),
        (#"{"jsonrpc":"2","method":"m","id":1}"#, .number(1), #"jsonrpc must be "2.0""#),
        (#"{"jsonrpc":2.0,"method":"m","id":"a"}"#, .string("a"), #"jsonrpc must be "2.0""#),
        (#"{"jsonrpc":"2.0 ","method":"m","id":1}"#, .number(1), #"jsonrpc must be "2.0""#),
        (#"{"jsonrpc":null,"method":"m"}"#, .null, #"jsonrpc must be "2.0""#),
        (#"{"jsonrpc":"2.0","id":1}"#, .number(1), "method must be a string"),
        (#"{"jsonrpc":"2.0","method":null,"id":1}"#, .number(1), "method must be a string"),
        (#"{"jsonrpc":"2.0","method":["m"],"id":1}"#, .number(1), "method must be a string"),
        (
            #"{"jsonrpc":"2.0","method":"m","params":"x","id":1}"#, .number(1),
            "params must be an object"
        ),
        (
            #"{"jsonrpc":"2.0","method":"m","params":null,"id":1}"#, .number(1),
            "params must be an object"
        ),
        (
            #"{"jsonrpc":"2.0","method":"m","params":3,"id":1}"#, .number(1),
            "params must be an object"
        ),
        (#"{"jsonrpc":"2.0","method":"m","params":true}"#, .null, "params must be an object"),
        (#"{"jsonrpc":"2.0","method":"m","id":{}}"#, .null, "id must be a string, number or null"),
        (#"{"jsonrpc":"2.0","method":"m","id":[1]}"#, .null, "id must be a string, number or null"),
        (
            #"{"jsonrpc":"2.0","method":"m","id":true}"#, .null,
            "id must be a string, number or null"
        ),
        (#"{"jsonrpc":"2.0","method":"m","id":7,"extra":1}"#, .number(7), "unknown member: extra"),
        (
            #"{"jsonrpc":"2.0","method":"m","Params":{},"id":7}"#, .number(7),
            "unknown member: Params"
        ),
        (
            #"{"jsonrpc":"2.0","method":"m","method":"n","id":7}"#, .number(7),
            "duplicate member: method"
        ),
        (#"{"jsonrpc":"2.0","method":"m","id":7,"id":8}"#, .null, "duplicate member: id"),
        (
            #"{"jsonrpc":"2.0","jsonrpc":"2.0","method":"m","id":7}"#, .number(7),
            "duplicate member: jsonrpc"
        ),
        (#"{}"#, .null, #"jsonrpc must be "2.0""#),
    ]

    @Test(
        "invalid request objects are -32600, answered with the id when it is readable",
        arguments: invalidRequestCases)
    func invalidRequests(_ text: String, id: RPCID, reason: String) {
        #expect(failure(decode(text)) == RPCFailure(id: id, error: .invalidRequest(reason)))
    }

    @Test(
        "a top level that is neither object nor array is -32600",
        arguments: ["1", #""x""#, "null", "true", "-0"])
    func scalarTopLevel(_ text: String) {
        #expect(
            failure(decode(text))
                == RPCFailure(id: .null, error: .invalidRequest("request must be an object")))
    }

    @Test("batch members are decoded independently")
    func batchMembers() {
        let message = decode(
            #"[1, {"jsonrpc":"2.0","method":"a","id":1}, [], {"jsonrpc":"2.0","method":"b"}, null]"#
        )
        let invalid = RPCCall.failure(
            RPCFailure(id: .null, error: .invalidRequest("request must be an object")))
        #expect(
            message
                == .batch([
                    invalid,
                    .success(RPCRequest(method: "a", id: .number(1))),
                    invalid,
                    .success(RPCRequest(method: "b", id: nil)),
                    invalid,
                ]))
        #expect(message.expectedResponseCount == 4)
        #expect(decode("[[]]") == .batch([invalid]))
    }

    @Test("a null id is a request, not a notification")
    func nullID() {
        let message = decode(#"{"jsonrpc":"2.0","method":"m","id":null}"#)
        #expect(request(message) == RPCRequest(method: "m", id: .null))
        #expect(message.expectedResponseCount == 1)
        #expect(wire(message) == #"{"jsonrpc":"2.0","id":null,"result":"ok"}"# + "\n")
    }

    @Test("method names are kept exactly, case included")
    func methodCase() {
        #expect(
            request(decode(#"{"jsonrpc":"2.0","method":"Device.Register","id":1}"#))?.method
                == "Device.Register")
        #expect(request(decode(#"{"jsonrpc":"2.0","method":"","id":1}"#))?.method == "")
        #expect(
            request(decode(#"{"jsonrpc":"2.0","method":"rpc.discover","id":1}"#))?.method
                == "rpc.discover")
    }

    @Test("params default to an empty object; member order does not matter")
    func paramsAndOrder() {
        let message = decode(#"{"id":"x","params":{"b":1,"a":2},"method":"m","jsonrpc":"2.0"}"#)
        #expect(request(message)?.params.keys == ["b", "a"])
        #expect(request(decode(#"{"jsonrpc":"2.0","method":"m","id":1}"#))?.params.isEmpty == true)
        #expect(
            request(decode(#"{"jsonrpc":"2.0","method":"m","params":{},"id":1}"#))?.params.isEmpty
                == true)
    }

    static let ids: [String] = [
        "1.50", "-0", "1e3", "1E+3", "12345678901234567890123456789", "-9223372036854775809", "0",
        "3.14159265358979323846264338327950288", #""abc""#, #""""#, #""\u00e9\"\u2028""#, "null",
    ]

    @Test("ids are echoed byte for byte", arguments: ids)
    func idEcho(_ id: String) {
        let message = decode(#"{"jsonrpc":"2.0","method":"m","id":\#(id)}"#)
        let echoed: String =
            switch id {
            case #""\u00e9\"\u2028""#: #""é\"\u2028""#
            default: id
            }
        #expect(wire(message) == #"{"jsonrpc":"2.0","id":\#(echoed),"result":"ok"}"# + "\n")
        let bad = decode(#"{"jsonrpc":"2.0","method":"m","params":[],"id":\#(id)}"#)
        #expect(wire(bad).hasPrefix(#"{"jsonrpc":"2.0","id":\#(echoed),"error":{"code":-32602"#))
    }

    @Test("ids compare by their text")
    func idIdentity() {
        #expect(RPCID.number(JSONNumber("1")!) != RPCID.number(JSONNumber("1.0")!))
        #expect(Set<RPCID>([.number(1), .number(1), .string("1"), .null]).count == 3)
        #expect(RPCID.string("a\"").description == #""a\"""#)
    }
}
