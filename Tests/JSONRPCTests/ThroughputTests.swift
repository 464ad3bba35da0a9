import HeraldJSON
import JSONRPC
import Testing

@Suite("Throughput sanity")
struct ThroughputTests {
    /// Runs 10,000 typical calls through framer, decoder, param reader and response
    /// serialisation, checking every answer. Correctness only; no timing.
    @Test("10,000 pipelined requests parse, dispatch and serialise correctly")
    func pipeline() throws {
        let count = 10_000
        var stream: [UInt8] = []
        for i in 0..<count {
            let line: String
            if i % 2 == 0 {
                line =
                    #"{"jsonrpc":"2.0","method":"push.send","params":{"to":{"users":["user-\#(i)","u2"]},"kind":"notification","data":{"thread":"t\#(i)","room":"é"},"priority":"high","ttl":3600},"id":\#(i)}"#
            } else {
                line =
                    #"{"jsonrpc":"2.0","id":"r\#(i)","method":"device.register","params":{"user":"user-\#(i)","platform":"apns","token":"\#(String(repeating: "ab", count: 32))","app_version":"1.2.3"}}"#
            }
            stream += line.utf8
            stream += i % 3 == 0 ? [0x0A] : i % 3 == 1 ? [0x0D, 0x0A] : []
        }

        var framer = JSONFramer()
        var responses: [UInt8] = []
        var handled = 0
        var offset = 0
        while offset < stream.count {
            let end = min(offset + 4096, stream.count)
            framer.append(stream[offset..<end])
            offset = end
            while let frame = framer.next() {
                guard case .message(let bytes) = frame else {
                    Issue.record("unexpected \(frame)")
                    return
                }
                guard case .single(.success(let request)) = RPCMessage.decode(bytes),
                    let id = request.id
                else {
                    Issue.record("did not decode \(String(decoding: bytes, as: UTF8.self))")
                    return
                }
                var p = ParamReader(request.params)
                let result: JSON
                switch request.method {
                case "push.send":
                    let users = try p.object("to", required: true) {
                        (to: inout ParamReader) throws(RPCError) in
                        try to.stringArray(
                            "users", required: true, minCount: 1, maxCount: 10_000, maxBytes: 256)
                    }
                    _ = try p.enumeration("kind", allowed: ["notification", "clear", "call_ring"])
                    _ = try p.stringMap("data", maxCount: 16, maxKeyBytes: 64, maxValueBytes: 256)
                    _ = try p.enumeration("priority", allowed: ["high", "normal", "low"])
                    _ = try p.int("ttl", range: 0...2_419_200)
                    try p.finish()
                    let recipients = users.flatMap { $0 } ?? []
                    result = [
                        "message_id": .string("m-\(recipients[0])"),
                        "devices": .int(recipients.count), "skipped": 0,
                    ]
                case "device.register":
                    let user = try p.string("user", required: true, maxBytes: 256)
                    _ = try p.enumeration(
                        "platform", required: true, allowed: ["apns", "apns_voip", "fcm", "web"])
                    _ = try p.string("token", required: true, maxBytes: 4096)
                    _ = try p.string("app_version", maxBytes: 64)
                    try p.finish()
                    result = [
                        "device_id": .string("d-\(user ?? "")"), "created": true,
                        "reclaimed": false, "evicted": [],
                    ]
                default:
                    Issue.record("unexpected method \(request.method)")
                    return
                }
                RPCResponse.frame(RPCResponse.success(id: id, result: result), into: &responses)
                handled += 1
            }
        }
        #expect(framer.finish() == nil)
        #expect(handled == count)

        // Every response is one line that parses and echoes its request's id.
        let lines = responses.split(separator: 0x0A)
        #expect(lines.count == count)
        for (i, line) in lines.enumerated() {
            let response = try JSONParser.parse(line)
            let expectedID: JSON = i % 2 == 0 ? .int(i) : .string("r\(i)")
            #expect(response["id"] == expectedID)
            #expect(response["jsonrpc"] == "2.0")
            if i % 2 == 0 {
                #expect(response["result"]?["message_id"] == .string("m-user-\(i)"))
            }
        }
    }
}
