public import HeraldJSON

/// Builds response objects and frames them for the wire.
public enum RPCResponse {
    /// `{"jsonrpc":"2.0","id":…,"result":…}`
    public static func success(id: RPCID, result: JSON) -> JSON {
        .object(["jsonrpc": "2.0", "id": id.json, "result": result])
    }

    /// `{"jsonrpc":"2.0","id":…,"error":{…}}`, with id null when `id` is nil.
    public static func failure(id: RPCID?, error: RPCError) -> JSON {
        .object(["jsonrpc": "2.0", "id": id?.json ?? .null, "error": error.json])
    }

    /// Compact JSON followed by `\n`, ready to write to the socket.
    public static func frame(_ response: JSON) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(256)
        frame(response, into: &out)
        return out
    }

    /// Appends compact JSON followed by `\n` to `out`.
    public static func frame(_ response: JSON, into out: inout [UInt8]) {
        response.serialize(into: &out)
        out.append(UInt8(ascii: "\n"))
    }
}

/// Gathers the responses of one batch, in whatever order they complete, into the
/// single array the client receives.
///
/// Create it with ``RPCMessage/expectedResponseCount``; add each response that is
/// due (never one for a notification). The last ``add(_:)`` returns the framed
/// array. A batch owed no responses (all notifications) must produce no bytes at
/// all: check ``isComplete`` right after creating it.
///
/// Not thread-safe: confine it to one task or thread, or guard it with a lock.
public final class BatchCollector {
    private var bytes: [UInt8] = [UInt8(ascii: "[")]
    /// Responses still to come.
    public private(set) var remaining: Int

    public init(expecting count: Int) {
        precondition(count >= 0, "a batch cannot expect a negative number of responses")
        self.remaining = count
    }

    /// True when nothing more is expected; for a batch that expected nothing, there
    /// is nothing to send.
    public var isComplete: Bool { remaining == 0 }

    /// Adds one response; returns the framed array (`[…]` + `\n`) when it was the
    /// last one expected, else nil. Responses beyond the expected count are ignored.
    public func add(_ response: JSON) -> [UInt8]? {
        guard remaining > 0 else {
            assertionFailure("BatchCollector received more responses than expected")
            return nil
        }
        if bytes.count > 1 { bytes.append(UInt8(ascii: ",")) }
        response.serialize(into: &bytes)
        remaining -= 1
        guard remaining == 0 else { return nil }
        bytes.append(UInt8(ascii: "]"))
        bytes.append(UInt8(ascii: "\n"))
        defer { bytes = [] }
        return bytes
    }
}
