@testable import JSONRPC
import Testing

/// The pieces of SPEC Revision 2 "Limits on what one client can cost" that live in
/// JSONRPC: counting a batch without parsing it, the cap on JSON values, and the
/// framer giving back a big buffer.
@Suite("limits in decoding")
struct LimitsDecodeTests {
    private func exceeds(_ text: String, _ limit: Int) -> Bool {
        RPCMessage.batchExceeds(Array(text.utf8), limit: limit)
    }

    @Test("batchExceeds counts top-level members only, skipping strings and nested values")
    func batchCount() {
        #expect(!exceeds("[1,2,3]", 3))
        #expect(exceeds("[1,2,3,4]", 3))
        #expect(!exceeds(" \n[1, 2 ,3 ]", 3))
        // Commas and brackets inside strings (escaped quotes included) and inside nested values do not count.
        #expect(!exceeds(#"["a,b,c,d", {"x":[1,2,3,4,5]}, "q\",\"r"]"#, 3))
        #expect(exceeds(#"["a,b", {"x":[1,2]}, "c", [4]]"#, 3))
        // Not a batch, or an empty one: never too large.
        #expect(!exceeds(#"{"a":[1,2,3,4,5]}"#, 1))
        #expect(!exceeds("[]", 1))
        // A huge or unfinished batch is known once the count passes the limit.
        let huge = "[" + Array(repeating: "0", count: 2_000_000).joined(separator: ",") + "]"
        #expect(exceeds(huge, 1000))
        #expect(exceeds("[0,0,0,0,0", 3))
        #expect(!exceeds("[0,0", 3))
    }

    @Test("decode with maxValues refuses more values with -32600 too_many_values and takes as many")
    func valueCap() throws {
        let text = "[" + Array(repeating: "0", count: 10).joined(separator: ",") + "]"
        // 11 values: the array and its ten members.
        guard case .single(.failure(let failure)) = RPCMessage.decode(Array(text.utf8), maxValues: 10) else {
            Issue.record("eleven values under a cap of ten were decoded")
            return
        }
        #expect(failure.id == .null)
        #expect(failure.error.code == -32600 && failure.error.reason == "too_many_values")
        #expect(failure.error.data?["limit"] == .number(10))
        guard case .batch(let calls) = RPCMessage.decode(Array(text.utf8), maxValues: 11) else {
            Issue.record("eleven values under a cap of eleven were refused")
            return
        }
        #expect(calls.count == 10)
        // Not JSON stays a parse error.
        guard case .single(.failure(let bad)) = RPCMessage.decode(Array("[1,".utf8), maxValues: 10) else {
            Issue.record("not JSON was decoded")
            return
        }
        #expect(bad.error.code == -32700)
    }

    @Test("batchTooLarge is -32600 with reason and limit")
    func batchTooLargeError() {
        let e = RPCError.batchTooLarge(limit: 1000)
        #expect(e.code == -32600 && e.reason == "batch_too_large" && e.data?["limit"] == .number(1000))
    }

    @Test("the framer gives back a big buffer once its message is taken, and reads on")
    func releaseStorage() {
        var framer = JSONFramer()
        let big = #"{"a":""# + String(repeating: "x", count: 1 << 20) + #""}"#
        framer.append(Array(big.utf8))
        guard case .message(let bytes)? = framer.next() else {
            Issue.record("no message")
            return
        }
        #expect(bytes.count == big.utf8.count)
        let none = framer.next()
        #expect(none == nil)
        let released = framer.releaseStorage()
        #expect(released)
        #expect(framer.storedByteCount == 0)
        let again = framer.releaseStorage()
        #expect(!again)
        framer.append(Array(#"{"b":1}"#.utf8))
        let next = framer.next()
        #expect(next == .message(Array(#"{"b":1}"#.utf8)))
        // Nothing is given back while a message is under way.
        var partial = JSONFramer()
        partial.append(Array((#"{"a":""# + String(repeating: "y", count: 1 << 17)).utf8))
        let pending = partial.next()
        #expect(pending == nil)
        let kept = partial.releaseStorage()
        #expect(!kept)
    }
}
