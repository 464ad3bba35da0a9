import Testing

@testable import JSONRPC

extension JSONFramer {
    /// Every frame available now.
    mutating func drain() -> [Frame] {
        var frames: [Frame] = []
        while let frame = next() { frames.append(frame) }
        return frames
    }

    /// Every frame left at end of input.
    mutating func drainAtEnd() -> [Frame] {
        var frames: [Frame] = []
        while let frame = finish() { frames.append(frame) }
        return frames
    }
}

func messages(_ texts: [String]) -> [JSONFramer.Frame] {
    texts.map { .message(Array($0.utf8)) }
}

/// Frames `stream` fed in the given chunks, draining after each and at the end.
func frames(
    of chunks: [ArraySlice<UInt8>], maxMessageBytes: Int = JSONFramer.defaultMaxMessageBytes
)
    -> [JSONFramer.Frame]
{
    var framer = JSONFramer(maxMessageBytes: maxMessageBytes)
    var frames: [JSONFramer.Frame] = []
    for chunk in chunks {
        framer.append(chunk)
        frames += framer.drain()
    }
    return frames + framer.drainAtEnd()
}

func frames(
    of stream: String, maxMessageBytes: Int = JSONFramer.defaultMaxMessageBytes
)
    -> [JSONFramer.Frame]
{
    frames(of: [Array(stream.utf8)[...]], maxMessageBytes: maxMessageBytes)
}

@Suite("Framing")
struct JSONFramerTests {
    static let stream =
        "{\"a\":1}\n[1,2]\r\n\"s\\\"}\" 123 true{\"b\":\"}{\\\\\\\"[\"}null[]}xyz\t{\"c\":[{\"d\":\"]\"}]}"
        + "  ]\"\"[\"é\u{2028}\"]-1.5e3{}42"
    static let expected = messages([
        #"{"a":1}"#, "[1,2]", #""s\"}""#, "123", "true", #"{"b":"}{\\\"["}"#, "null", "[]", "}",
        "xyz",
        #"{"c":[{"d":"]"}]}"#, "]", #""""#, "[\"é\u{2028}\"]", "-1.5e3", "{}", "42",
    ])

    @Test("splits a stream of mixed messages")
    func wholeStream() {
        #expect(frames(of: Self.stream) == Self.expected)
    }

    @Test("gives the same messages whatever the split point")
    func everySplit() {
        let bytes = Array(Self.stream.utf8)
        for cut in 0...bytes.count {
            #expect(frames(of: [bytes[..<cut], bytes[cut...]]) == Self.expected, "cut at \(cut)")
        }
    }

    @Test("gives the same messages when fed one byte at a time")
    func byteByByte() {
        let bytes = Array(Self.stream.utf8)
        #expect(frames(of: bytes.indices.map { bytes[$0...$0] }) == Self.expected)
    }

    @Test("messages need no separator, or any whitespace")
    func separators() {
        #expect(frames(of: #"{"a":1}{"b":2}"#) == messages([#"{"a":1}"#, #"{"b":2}"#]))
        #expect(frames(of: "{\"a\":1}\r\n{\"b\":2}\r\n") == messages([#"{"a":1}"#, #"{"b":2}"#]))
        #expect(frames(of: "[1]\n\n\t [2] ") == messages(["[1]", "[2]"]))
        #expect(frames(of: #""a""b"[]"#) == messages([#""a""#, #""b""#, "[]"]))
        #expect(frames(of: "1 2\n3") == messages(["1", "2", "3"]))
        #expect(frames(of: #"1{"a":2}"#) == messages(["1", #"{"a":2}"#]))
        #expect(
            frames(of: #"true"a"12[3]null"#) == messages(["true", #""a""#, "12", "[3]", "null"]))
    }

    @Test("whitespace alone yields nothing")
    func whitespaceOnly() {
        #expect(frames(of: " \r\n\t \n").isEmpty)
        #expect(frames(of: "").isEmpty)
        var framer = JSONFramer()
        framer.append(Array(" \n\n ".utf8))
        #expect(framer.next() == nil)
        #expect(framer.bufferedByteCount == 0)
    }

    @Test("a stray closing bracket is its own message, and the stream recovers")
    func strayBrackets() throws {
        #expect(frames(of: #"}{"a":1}"#) == messages(["}", #"{"a":1}"#]))
        #expect(frames(of: #"{"a":1}}]{"b":2}"#) == messages([#"{"a":1}"#, "}", "]", #"{"b":2}"#]))
        var framer = JSONFramer()
        framer.append(Array("}\n".utf8))
        guard case .message(let bytes)? = framer.next() else {
            Issue.record("expected a message")
            return
        }
        #expect(
            RPCMessage.decode(bytes)
                == .single(
                    .failure(
                        RPCFailure(
                            id: .null, error: .parseError("unexpected '}'", offset: 0)))))
    }

    @Test("a scalar at the end of the buffer waits for more input or for finish()")
    func trailingScalar() {
        var framer = JSONFramer()
        framer.append(Array("12".utf8))
        #expect(framer.next() == nil)
        framer.append(Array("3".utf8))
        #expect(framer.next() == nil)
        #expect(framer.finish() == .message(Array("123".utf8)))
        #expect(framer.finish() == nil)
        #expect(framer.next() == nil)

        var spaced = JSONFramer()
        spaced.append(Array("123 ".utf8))
        #expect(spaced.next() == .message(Array("123".utf8)))
    }

    @Test("finish() hands over an unfinished message, which then fails to parse")
    func finishIncomplete() {
        var framer = JSONFramer()
        framer.append(Array(#"{"a":1}{"b":[1,"#.utf8))
        #expect(framer.next() == .message(Array(#"{"a":1}"#.utf8)))
        #expect(framer.next() == nil)
        let last = framer.finish()
        #expect(last == .message(Array(#"{"b":[1,"#.utf8)))
        #expect(framer.finish() == nil)
        if case .message(let bytes)? = last {
            #expect(RPCMessage.decode(bytes).expectedResponseCount == 1)
            guard case .single(.failure(let failure)) = RPCMessage.decode(bytes) else {
                Issue.record("expected a failure")
                return
            }
            #expect(failure.error.code == -32700)
        }
        // Bytes after finish() are ignored.
        framer.append(Array("{}".utf8))
        #expect(framer.next() == nil)
        #expect(frames(of: #""open"#) == messages([#""open"#]))
        #expect(frames(of: "  \n") == [])
    }

    @Test("finish() returns complete messages still buffered before the trailing text")
    func finishDrainsPending() {
        var framer = JSONFramer()
        framer.append(Array("[1] [2] 3".utf8))
        #expect(framer.drainAtEnd() == messages(["[1]", "[2]", "3"]))
    }

    @Test("a message over the limit is refused as soon as it is known to be too large")
    func tooLarge() {
        // Exactly the limit passes; one byte more does not, complete or not.
        #expect(frames(of: #"["abcdef"]"#, maxMessageBytes: 10) == messages([#"["abcdef"]"#]))
        #expect(frames(of: #"["abcdefg"]"#, maxMessageBytes: 10) == [.tooLarge])
        #expect(frames(of: "1234567890 ", maxMessageBytes: 10) == messages(["1234567890"]))
        #expect(frames(of: "12345678901 ", maxMessageBytes: 10) == [.tooLarge])
        #expect(frames(of: "12345678901", maxMessageBytes: 10) == [.tooLarge])
        #expect(
            frames(of: #"[1] ["abcdefghijk"] [2]"#, maxMessageBytes: 10) == messages(["[1]"]) + [
                .tooLarge
            ])
        // Leading whitespace does not count.
        #expect(frames(of: "          \n[1]", maxMessageBytes: 3) == messages(["[1]"]))

        // Fed a never-ending string in small chunks, the framer stops early and never
        // holds much more than the limit.
        let limit = 64 * 1024
        var framer = JSONFramer(maxMessageBytes: limit)
        framer.append(Array(#"{"k":""#.utf8))
        var fed = 0
        var result: JSONFramer.Frame? = nil
        while result == nil && fed < 10 * limit {
            framer.append([UInt8](repeating: UInt8(ascii: "x"), count: 1000))
            fed += 1000
            #expect(framer.bufferedByteCount <= limit + 1006)
            result = framer.next()
        }
        #expect(result == .tooLarge)
        #expect(fed <= limit + 1000)
        #expect(framer.bufferedByteCount == 0)
        #expect(framer.storedByteCount == 0)
        framer.append(Array("{}".utf8))
        #expect(framer.next() == nil)
        #expect(framer.finish() == nil)
    }

    @Test("the default limit is 4 MiB")
    func defaultLimit() {
        #expect(JSONFramer().maxMessageBytes == 4 * 1024 * 1024)
        let big = "[\"" + String(repeating: "a", count: 4 * 1024 * 1024) + "\"]"
        #expect(frames(of: big) == [.tooLarge])
    }

    @Test("one byte at a time stays linear and drops consumed bytes")
    func linearAndBounded() {
        // A 1 MiB message fed byte by byte, with next() after every byte: a rescan
        // from the start each time would take ~5·10¹¹ steps.
        let payload = String(repeating: #"{"a":"\"}","b":[1,2,{"c":null}]},"#, count: 30_000)
        let message = Array(("[" + payload + "0]").utf8)
        var framer = JSONFramer()
        var result: [JSONFramer.Frame] = []
        for byte in message {
            framer.append(CollectionOfOne(byte))
            if let frame = framer.next() { result.append(frame) }
        }
        #expect(result == [.message(message)])
        #expect(framer.bufferedByteCount == 0)

        // Many small messages, each arriving in two pieces: consumed bytes are dropped.
        var small = JSONFramer()
        var largest = 0
        for i in 0..<10_000 {
            let line = Array("{\"id\":\(i),\"method\":\"m\"}\r\n".utf8)
            small.append(line[..<7])
            #expect(small.next() == nil)
            small.append(line[7...])
            #expect(small.next() == .message(Array(line.dropLast(2))))
            #expect(small.bufferedByteCount <= 2)
            largest = max(largest, small.storedByteCount)
        }
        #expect(largest < 2 * 40)
    }

    @Test("accepts raw buffers")
    func rawBuffers() {
        var framer = JSONFramer()
        Array("[1][2]".utf8).withUnsafeBytes { framer.append($0) }
        #expect(framer.drain() == messages(["[1]", "[2]"]))
    }
}
