import HeraldJSON
import JSONRPC
import Testing

func text(_ json: JSON) -> String {
    String(decoding: json.serialized(), as: UTF8.self)
}

func string(_ bytes: [UInt8]?) -> String? {
    bytes.map { String(decoding: $0, as: UTF8.self) }
}

@Suite("Responses and batches")
struct RPCResponseTests {
    @Test("success and failure responses")
    func responses() {
        #expect(
            text(RPCResponse.success(id: .string("a"), result: ["removed": true]))
                == #"{"jsonrpc":"2.0","id":"a","result":{"removed":true}}"#)
        #expect(
            text(RPCResponse.failure(id: .number(7), error: .methodNotFound("nope")))
                == #"{"jsonrpc":"2.0","id":7,"error":{"code":-32601,"message":"Method not found","data":{"method":"nope"}}}"#
        )
        #expect(
            text(
                RPCResponse.failure(
                    id: nil, error: RPCError(code: -32603, message: "Internal error")))
                == #"{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":"Internal error"}}"#
        )
        #expect(
            string(RPCResponse.frame(RPCResponse.success(id: .null, result: nil)))
                == #"{"jsonrpc":"2.0","id":null,"result":null}"# + "\n")
        var out = Array("x".utf8)
        RPCResponse.frame(["a": "\u{2028}"], into: &out)
        #expect(string(out) == #"x{"a":"\u2028"}"# + "\n")
    }

    @Test("standard errors carry the standard codes, messages and data")
    func standardErrors() {
        #expect(
            text(RPCError.parseError("trailing comma", offset: 3).json)
                == #"{"code":-32700,"message":"Parse error","data":{"reason":"trailing comma","offset":3}}"#
        )
        #expect(
            text(RPCError.parseError("x").json)
                == #"{"code":-32700,"message":"Parse error","data":{"reason":"x"}}"#)
        #expect(
            text(RPCError.invalidRequest("message too large").json)
                == #"{"code":-32600,"message":"Invalid Request","data":{"reason":"message too large"}}"#
        )
        #expect(
            text(RPCError.invalidParams(field: "keys.p256dh", reason: "must be a string").json)
                == #"{"code":-32602,"message":"Invalid params","data":{"field":"keys.p256dh","reason":"must be a string"}}"#
        )
        #expect(
            text(RPCResponse.failure(id: .null, error: .messageTooLarge(limit: 4_194_304)))
                == #"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request","data":{"reason":"message too large","limit":4194304}}}"#
        )
        #expect(
            text(RPCError.internalError().json) == #"{"code":-32603,"message":"Internal error"}"#)
        #expect(
            text(RPCError.internalError("store unavailable").json)
                == #"{"code":-32603,"message":"Internal error","data":{"reason":"store unavailable"}}"#
        )
        let codes = [
            RPCError.parseError("").code, RPCError.invalidRequest("").code,
            RPCError.methodNotFound("").code,
            RPCError.invalidParams(field: "", reason: "").code, RPCError.internalError().code,
        ]
        #expect(codes == [-32700, -32600, -32601, -32602, -32603])
        #expect(RPCError.Code.invalidParams == -32602)
        #expect(RPCError.invalidParams(field: "f", reason: "r").field == "f")
        #expect(RPCError.invalidParams(field: "f", reason: "r").reason == "r")
    }

    @Test("application errors put the reason and extras in data")
    func applicationErrors() {
        let error = RPCError.application(
            code: 1002, reason: "rate_limited", message: "Rate limited",
            extra: [("retry_after_ms", .int(1500))])
        #expect(
            text(error.json)
                == #"{"code":1002,"message":"Rate limited","data":{"reason":"rate_limited","retry_after_ms":1500}}"#
        )
        #expect(error.reason == "rate_limited")
        #expect(
            RPCError.application(code: 1003, reason: "not_found", message: "Not found").data == [
                "reason": "not_found"
            ])
        #expect(error.description.hasPrefix("1002 Rate limited"))
    }

    @Test("a batch collector returns the array once the last response arrives")
    func collector() {
        let collector = BatchCollector(expecting: 3)
        #expect(!collector.isComplete)
        #expect(collector.add(RPCResponse.success(id: .number(2), result: 2)) == nil)
        #expect(collector.remaining == 2)
        #expect(collector.add(RPCResponse.failure(id: .null, error: .invalidRequest("x"))) == nil)
        let bytes = collector.add(RPCResponse.success(id: .number(1), result: 1))
        #expect(collector.isComplete)
        #expect(
            string(bytes)
                == #"[{"jsonrpc":"2.0","id":2,"result":2},{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request","data":{"reason":"x"}}},{"jsonrpc":"2.0","id":1,"result":1}]"#
                + "\n")

        let one = BatchCollector(expecting: 1)
        #expect(string(one.add(["x": 1])) == #"[{"x":1}]"# + "\n")
    }

    @Test("a batch that expects nothing is complete at once and writes nothing")
    func emptyCollector() {
        let collector = BatchCollector(expecting: 0)
        #expect(collector.isComplete)
        #expect(collector.remaining == 0)
    }

    @Test("failures answer only when they have an id")
    func failureResponses() {
        #expect(
            RPCFailure(id: nil, error: .invalidParams(field: "params", reason: "r")).response == nil
        )
        #expect(
            RPCFailure(id: .null, error: .invalidRequest("r")).response
                == RPCResponse.failure(id: .null, error: .invalidRequest("r")))
    }
}
