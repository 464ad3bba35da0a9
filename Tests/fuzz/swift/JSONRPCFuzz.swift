// The libFuzzer target for JSON-RPC framing and decoding.
//
// Built by mk/fuzz.mk together with Sources/JSONRPC/*.swift into one module
// (`swiftc -sanitize=fuzzer,address -parse-as-library -module-name JSONRPC`), so
// it also sees JSONRPC's internals, linked against Sources/HeraldJSON built the
// same way as a module of its own.
//
// Input: a limit byte L, a split byte S, then the stream. The framer's limit is
// 1 + 3 * (L & 0x7f) bytes when L < 0x80, else the default 4 MiB; S chooses how
// the stream is cut into chunks, as a socket would deliver it.
//
// Properties:
// - framing follows the rules of JSONFramer's documentation, restated here as a
//   naive reference over the whole stream; the framer gives the same frames fed
//   all at once or in chunks, returns messages that are the stream's bytes in
//   order with only whitespace between them, never returns or holds more bytes
//   than it was fed, keeps at most twice its pending bytes after an append, and
//   returns nothing after `.tooLarge`;
// - a message over the limit is `.tooLarge`, answered with the documented
//   -32600 `{"reason": "message too large", "limit"}` and id null; the default
//   limit is 4 MiB exactly (checked once at start-up with 4 MiB texts);
// - every text JSONParser accepts is valid UTF-8 nested at most maxDepth deep;
//   its compact serialisation re-parses to the same value, serialises again to
//   the same bytes, has no control character or raw U+2028/U+2029, and frames as
//   exactly one message; a parse error's offset lies within the text;
// - RPCMessage.decode(bytes) equals decode(parse(bytes)), -32700 with the
//   parser's reason and offset when it does not parse; a batch decodes member by
//   member; a decoded request re-encoded decodes to itself; every response due
//   (and a batch of them) is well-formed JSON carrying the request's id.

import HeraldJSON

@_cdecl("LLVMFuzzerInitialize")
public func fuzzInitialize(
    _ argc: UnsafeMutablePointer<CInt>,
    _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>
) -> CInt {
    FuzzJSONRPC.checkDefaultLimit()
    return 0
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOneInput(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    FuzzJSONRPC.run(Array(UnsafeBufferPointer(start: data, count: size)))
    return 0
}

enum FuzzJSONRPC {
    static func check(
        _ condition: @autoclosure () -> Bool, _ message: @autoclosure () -> String,
        line: UInt = #line
    ) {
        if !condition() { fatalError("PROPERTY JSONRPCFuzz.swift:\(line): \(message())") }
    }

    static func run(_ input: [UInt8]) {
        let limitByte = input.first ?? 0xFF
        let splitByte = input.count > 1 ? input[1] : 0
        let stream = Array(input.dropFirst(2))
        let limit =
            limitByte < 0x80 ? 1 + 3 * Int(limitByte) : JSONFramer.defaultMaxMessageBytes

        let expected = referenceFrames(stream, limit: limit)
        let whole = frames(of: stream, limit: limit, chunks: [stream.count])
        check(whole == expected, "framing all at once differs from the reference")
        let chunked = frames(of: stream, limit: limit, chunks: chunkSizes(stream.count, splitByte))
        check(chunked == expected, "framing in chunks differs from framing all at once")
        checkLayout(whole, of: stream, limit: limit)

        for frame in whole {
            switch frame {
            case .message(let bytes): checkDecode(bytes)
            case .tooLarge: checkTooLargeResponse(limit: limit)
            }
        }
        // The stream as one text too: the framer may have cut it where a parser
        // sees one value with bad data after it.
        if whole != [.message(stream)] { checkDecode(stream) }
    }

    // MARK: - Framing

    static func isWhitespace(_ byte: UInt8) -> Bool {
        byte == 0x20 || byte == 0x09 || byte == 0x0A || byte == 0x0D
    }

    /// JSONFramer's documented rules over a complete stream, written naively.
    static func referenceFrames(_ s: [UInt8], limit: Int) -> [JSONFramer.Frame] {
        let quote = UInt8(ascii: "\""), backslash = UInt8(ascii: "\\")
        let opening: Set<UInt8> = [UInt8(ascii: "{"), UInt8(ascii: "[")]
        let closing: Set<UInt8> = [UInt8(ascii: "}"), UInt8(ascii: "]")]
        /// The index after the closing quote of a string whose body starts at `i`.
        func stringEnd(from i: Int) -> Int? {
            var j = i
            while j < s.count {
                if s[j] == quote { return j + 1 }
                j += s[j] == backslash ? 2 : 1
            }
            return nil
        }
        var frames: [JSONFramer.Frame] = []
        var i = 0
        while true {
            while i < s.count && isWhitespace(s[i]) { i += 1 }
            if i == s.count { return frames }
            let start = i
            var end: Int? = nil
            if opening.contains(s[i]) {
                var depth = 0
                var j = i
                scan: while j < s.count {
                    let byte = s[j]
                    j += 1
                    if byte == quote {
                        guard let after = stringEnd(from: j) else { break scan }
                        j = after
                    } else if opening.contains(byte) {
                        depth += 1
                    } else if closing.contains(byte) {
                        depth -= 1
                        if depth == 0 {
                            end = j
                            break scan
                        }
                    }
                }
            } else if s[i] == quote {
                end = stringEnd(from: i + 1)
            } else if closing.contains(s[i]) {
                end = i + 1
            } else {
                var j = i
                while j < s.count && !isWhitespace(s[j]) && !opening.contains(s[j]) && s[j] != quote {
                    j += 1
                }
                end = j
            }
            // Without an end the message runs to the end of the input.
            let stop = end ?? s.count
            if stop - start > limit {
                frames.append(.tooLarge)
                return frames
            }
            frames.append(.message(Array(s[start..<stop])))
            i = stop
        }
    }

    /// Chunk sizes for `count` bytes: 1, 2, 3, 7, 16, 64, 512 or 4096 bytes at
    /// most, varied by a small generator seeded from `seed`.
    static func chunkSizes(_ count: Int, _ seed: UInt8) -> [Int] {
        let caps = [1, 2, 3, 7, 16, 64, 512, 4096]
        let cap = caps[Int(seed & 7)]
        var state = UInt32(seed) &* 2_654_435_761 | 1
        var sizes: [Int] = []
        var left = count
        while left > 0 {
            state ^= state << 13
            state ^= state >> 17
            state ^= state << 5
            let size = Swift.min(left, 1 + Int(state % UInt32(cap)))
            sizes.append(size)
            left -= size
        }
        return sizes
    }

    /// Feeds the chunks one at a time, taking every frame available after each,
    /// then finishes.
    static func frames(of stream: [UInt8], limit: Int, chunks: [Int]) -> [JSONFramer.Frame] {
        var framer = JSONFramer(maxMessageBytes: limit)
        var frames: [JSONFramer.Frame] = []
        var fed = 0
        var returned = 0
        func take(_ frame: JSONFramer.Frame) {
            frames.append(frame)
            if case .message(let bytes) = frame { returned += bytes.count }
            check(returned <= fed, "the framer returned \(returned) bytes of \(fed) fed")
            check(
                framer.bufferedByteCount <= fed - returned,
                "the framer holds \(framer.bufferedByteCount) bytes, \(fed - returned) unreturned")
        }
        for (index, size) in chunks.enumerated() where size > 0 {
            let chunk = stream[fed..<fed + size]
            if index % 2 == 0 {
                framer.append(chunk)
            } else {
                Array(chunk).withUnsafeBytes { framer.append($0) }
            }
            fed += size
            check(
                framer.storedByteCount <= 2 * framer.bufferedByteCount,
                "the framer stores \(framer.storedByteCount) bytes for \(framer.bufferedByteCount) pending")
            while let frame = framer.next() { take(frame) }
        }
        while let frame = framer.finish() { take(frame) }
        check(framer.next() == nil && framer.finish() == nil, "a frame after the end")
        framer.append([UInt8(ascii: "1"), 0x20])
        check(framer.next() == nil && framer.finish() == nil, "bytes appended after the end framed")
        return frames
    }

    /// Messages are the stream's bytes in order with only whitespace between
    /// them, none longer than the limit; `.tooLarge` comes last.
    static func checkLayout(_ frames: [JSONFramer.Frame], of stream: [UInt8], limit: Int) {
        var position = 0
        for (index, frame) in frames.enumerated() {
            while position < stream.count && isWhitespace(stream[position]) { position += 1 }
            switch frame {
            case .message(let bytes):
                check(!bytes.isEmpty && bytes.count <= limit, "a message of \(bytes.count) bytes")
                check(
                    position + bytes.count <= stream.count
                        && stream[position..<position + bytes.count].elementsEqual(bytes),
                    "a message that is not the next bytes of the stream")
                position += bytes.count
            case .tooLarge:
                check(index == frames.count - 1, "a frame after .tooLarge")
                check(position < stream.count, ".tooLarge with nothing pending")
                return
            }
        }
        check(
            stream[position...].allSatisfy(isWhitespace), "the framer dropped bytes that are not whitespace")
    }

    static func checkTooLargeResponse(limit: Int) {
        let bytes = RPCResponse.frame(
            RPCResponse.failure(id: .null, error: .messageTooLarge(limit: limit)))
        check(bytes.last == 0x0A, "a response frame that does not end in a newline")
        let expected: JSON = [
            "jsonrpc": "2.0", "id": nil,
            "error": [
                "code": -32600, "message": "Invalid Request",
                "data": ["reason": "message too large", "limit": .int(limit)],
            ],
        ]
        check(
            (try? JSONParser.parse(bytes.dropLast())) == expected,
            "the too-large response is not the documented one")
    }

    /// The documented 4 MiB: a 4 MiB string is a message, one byte more is
    /// refused as soon as the framer holds it, before the text ends.
    static func checkDefaultLimit() {
        let limit = JSONFramer.defaultMaxMessageBytes
        check(limit == 4 * 1024 * 1024, "the default limit is \(limit) bytes, not 4 MiB")
        var text = [UInt8](repeating: UInt8(ascii: "a"), count: limit)
        text[0] = UInt8(ascii: "\"")
        text[limit - 1] = UInt8(ascii: "\"")
        var framer = JSONFramer()
        var offset = 0
        while offset < text.count {
            framer.append(text[offset..<Swift.min(offset + 65536, text.count)])
            offset += 65536
        }
        framer.append([0x0A])
        check(framer.next() == .message(text), "a 4 MiB message was not framed whole")

        var over = JSONFramer()
        over.append([UInt8(ascii: "[")] + [UInt8](repeating: UInt8(ascii: "1"), count: limit - 1))
        check(over.next() == nil, "an unfinished 4 MiB message is not waited for")
        over.append([UInt8(ascii: ",")])
        check(over.next() == .tooLarge, "4 MiB + 1 unfinished bytes are not refused")
        check(over.next() == nil && over.finish() == nil, "a frame after .tooLarge")
        checkTooLargeResponse(limit: limit)
    }

    // MARK: - Decoding

    static func depth(_ value: JSON) -> Int {
        switch value {
        case .array(let elements): 1 + (elements.map(depth).max() ?? 0)
        case .object(let object): 1 + (object.members.map { depth($0.value) }.max() ?? 0)
        default: 0
        }
    }

    static func checkDecode(_ bytes: [UInt8]) {
        let message = RPCMessage.decode(bytes)
        let value: JSON
        do {
            value = try JSONParser.parse(bytes)
        } catch {
            check(error.offset >= 0 && error.offset <= bytes.count, "parse error offset \(error.offset)")
            let expected = RPCFailure(
                id: .null, error: .parseError(error.reason, offset: error.offset))
            check(message == .single(.failure(expected)), "unparseable text did not decode as -32700")
            checkResponses(message)
            return
        }
        check(String(validating: bytes, as: UTF8.self) != nil, "accepted text that is not UTF-8")
        check(depth(value) <= JSONParser.maxDepth, "accepted nesting deeper than maxDepth")
        checkSerialization(value)
        check(message == RPCMessage.decode(value), "decode(bytes) differs from decode(parse(bytes))")

        switch (value, message) {
        case (.array(let elements), .batch(let calls)):
            check(!elements.isEmpty && calls.count == elements.count, "a batch lost members")
            for (element, call) in zip(elements, calls) {
                check(call == RPCMessage.decodeCall(element), "a batch member decoded differently")
                checkCall(call)
            }
        case (.array(let elements), .single(let call)):
            check(elements.isEmpty, "a non-empty array decoded as a single call")
            check(call.failureCode == RPCError.Code.invalidRequest, "[] is not -32600")
        case (.object, .single(let call)):
            checkCall(call)
        case (_, .single(let call)):
            check(call.failureCode == RPCError.Code.invalidRequest, "a scalar message is not -32600")
        default:
            check(false, "a \(value.typeName) decoded as a batch")
        }
        checkResponses(message)
    }

    static func checkSerialization(_ value: JSON) {
        let text = value.serialized()
        guard let again = try? JSONParser.parse(text) else {
            check(false, "the serialisation does not parse")
            return
        }
        check(again == value, "the serialisation parses to another value")
        check(again.serialized() == text, "serialising twice gives other bytes")
        var appended: [UInt8] = [0x20]
        value.serialize(into: &appended)
        check(appended.dropFirst().elementsEqual(text), "serialize(into:) differs from serialized()")
        check(!text.contains { $0 < 0x20 }, "a control character in the serialisation")
        for i in text.indices.dropLast(2) where text[i] == 0xE2 && text[i + 1] == 0x80 {
            check(text[i + 2] != 0xA8 && text[i + 2] != 0xA9, "raw U+2028/U+2029 in the serialisation")
        }
        var framer = JSONFramer()
        framer.append(text + [0x0A])
        var frames: [JSONFramer.Frame] = []
        while let frame = framer.finish() { frames.append(frame) }
        check(frames == [.message(text)], "a serialised value does not frame as one message")
    }

    static func checkCall(_ call: RPCCall) {
        switch call {
        case .success(let request):
            var object: JSONObject = ["jsonrpc": "2.0", "method": .string(request.method)]
            if !request.params.isEmpty { object.append("params", .object(request.params)) }
            if let id = request.id { object.append("id", id.json) }
            let again = RPCMessage.decodeCall(.object(object))
            check(again == call, "a request re-encoded decodes to another call")
        case .failure(let failure):
            let code = failure.error.code
            check(
                code == RPCError.Code.invalidRequest || code == RPCError.Code.invalidParams,
                "a call failed with \(code)")
            check(
                failure.id != nil || code == RPCError.Code.invalidParams,
                "only a notification with positional params goes unanswered")
        }
    }

    /// Every response due: a success echoing the id and the error responses,
    /// single or gathered by a BatchCollector.
    static func checkResponses(_ message: RPCMessage) {
        let calls: [RPCCall]
        switch message {
        case .single(let call): calls = [call]
        case .batch(let batch): calls = batch
        }
        var responses: [JSON] = []
        for call in calls {
            switch call {
            case .success(let request):
                guard let id = request.id else { continue }
                let response = RPCResponse.success(id: id, result: .object(request.params))
                check(response["id"] == id.json, "a success response lost its id")
                responses.append(response)
            case .failure(let failure):
                guard let response = failure.response else { continue }
                check(
                    response["error"]?["code"] == .int(failure.error.code)
                        && response["id"] == failure.id?.json,
                    "an error response lost its code or id")
                responses.append(response)
            }
        }
        check(responses.count == message.expectedResponseCount, "expectedResponseCount is wrong")
        for response in responses {
            let framed = RPCResponse.frame(response)
            check(
                framed.last == 0x0A && (try? JSONParser.parse(framed.dropLast())) == response,
                "a framed response does not parse back")
        }
        guard case .batch = message else { return }
        let collector = BatchCollector(expecting: responses.count)
        check(collector.isComplete == responses.isEmpty, "BatchCollector.isComplete is wrong")
        var out: [UInt8]? = nil
        for (index, response) in responses.enumerated() {
            out = collector.add(response)
            check((out != nil) == (index == responses.count - 1), "BatchCollector finished early or late")
        }
        if let out {
            check(
                out.last == 0x0A && (try? JSONParser.parse(out.dropLast())) == .array(responses),
                "a batch response is not the array of its responses")
        }
    }
}

extension Result where Success == RPCRequest, Failure == RPCFailure {
    fileprivate var failureCode: Int? {
        if case .failure(let failure) = self { failure.error.code } else { nil }
    }
}
