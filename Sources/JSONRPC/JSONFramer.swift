/// Splits a byte stream into top-level JSON texts without parsing them.
///
/// Feed it whatever the socket delivers with ``append(_:)``, then call ``next()``
/// until it returns nil. Texts may be separated by any JSON whitespace or by
/// nothing at all (`{"a":1}{"b":2}` is two messages):
/// - objects and arrays end when their brackets balance (strings and escapes
///   inside them are skipped);
/// - a top-level string ends at its closing quote;
/// - anything else (numbers, `true`, garbage such as `xyz`) ends at whitespace or
///   at the start of `{`, `[` or `"`, so a scalar at the very end of the buffer is
///   only complete at end of input (``finish()``);
/// - a stray `}` or `]` between messages is a one-byte message of its own, so the
///   parser reports it and the stream resynchronises.
///
/// Work is O(n) in the bytes appended, however they are split: the scan resumes
/// where it stopped. Consumed bytes are dropped, so memory stays within about
/// twice the pending data, and a message is refused as soon as it is known to
/// exceed ``maxMessageBytes``.
public struct JSONFramer: Sendable {
    public enum Frame: Sendable, Equatable {
        /// One complete JSON text (or what looks like one; it may still fail to parse).
        case message([UInt8])
        /// The current message is longer than the limit. The framer has dropped its
        /// buffer and yields nothing more; reply -32600 and close the connection.
        case tooLarge
    }

    public static let defaultMaxMessageBytes = 4 * 1024 * 1024

    public let maxMessageBytes: Int

    private enum Mode: Sendable {
        /// Between messages, skipping whitespace.
        case idle
        /// Inside an object or array.
        case container
        /// Inside a top-level string.
        case string
        /// Inside a top-level scalar or garbage run.
        case scalar
        /// A message was too large, or everything has been returned after `finish()`.
        case done
    }

    private var buffer: [UInt8] = []
    /// Start of the current message (or of unconsumed whitespace) in `buffer`.
    private var start = 0
    /// Every byte before `scan` has been examined for the current message.
    private var scan = 0
    private var mode = Mode.idle
    private var depth = 0
    private var inString = false
    private var escaped = false
    private var atEnd = false

    public init(maxMessageBytes: Int = JSONFramer.defaultMaxMessageBytes) {
        precondition(maxMessageBytes > 0, "maxMessageBytes must be positive")
        self.maxMessageBytes = maxMessageBytes
    }

    /// Bytes received but not yet returned in a frame.
    public var bufferedByteCount: Int { buffer.count - start }

    /// Bytes held, consumed ones included (for tests of the memory bound).
    public var storedByteCount: Int { buffer.count }

    /// Adds bytes read from the stream. Bytes appended after ``finish()`` or after
    /// `.tooLarge` are ignored.
    public mutating func append(_ bytes: some Sequence<UInt8>) {
        guard !atEnd, mode != .done else { return }
        compact()
        let copied: Void? = bytes.withContiguousStorageIfAvailable { buffer.append(contentsOf: $0) }
        if copied == nil { buffer.append(contentsOf: bytes) }
    }

    /// Adds bytes read from the stream.
    public mutating func append(_ bytes: UnsafeRawBufferPointer) {
        guard !atEnd, mode != .done else { return }
        compact()
        // As typed UInt8s: appending a raw buffer goes byte by byte through
        // generic code in an unoptimised build; a typed one is one copy.
        bytes.withMemoryRebound(to: UInt8.self) { buffer.append(contentsOf: $0) }
    }

    /// Frees the buffer's storage when nothing is buffered and it has grown past
    /// 64 KiB (after a large message); true when it did.
    @discardableResult
    public mutating func releaseStorage() -> Bool {
        guard start == buffer.count, buffer.capacity > 1 << 16 else { return false }
        buffer = []
        start = 0
        scan = 0
        return true
    }

    /// The next complete message, `.tooLarge`, or nil when more bytes are needed.
    public mutating func next() -> Frame? {
        guard mode != .done else { return nil }
        if mode == .idle {
            skipWhitespace()
            guard start < buffer.count else {
                if atEnd { stop() }
                return nil
            }
            begin()
        }
        let limit = min(buffer.count, start + maxMessageBytes + 1)
        if let end = scanMessage(upTo: limit) {
            guard end - start <= maxMessageBytes else { return tooLarge() }
            return take(upTo: end)
        }
        if limit - start > maxMessageBytes { return tooLarge() }
        if atEnd {
            // End of input: a scalar is complete, and an unfinished object, array or
            // string is handed over as is so the parser reports it.
            return take(upTo: buffer.count)
        }
        return nil
    }

    /// Marks end of input and returns the next frame: pending complete messages
    /// first, then any trailing text (a final scalar, or an unfinished message that
    /// will fail to parse). Call until it returns nil.
    public mutating func finish() -> Frame? {
        atEnd = true
        return next()
    }

    // MARK: - Scanning

    private mutating func skipWhitespace() {
        while start < buffer.count {
            switch buffer[start] {
            case 0x20, 0x09, 0x0A, 0x0D: start += 1
            default:
                scan = start
                return
            }
        }
        scan = start
    }

    /// Chooses the mode for the message whose first byte is at `start`.
    private mutating func begin() {
        depth = 0
        inString = false
        escaped = false
        switch buffer[start] {
        case UInt8(ascii: "{"), UInt8(ascii: "["):
            mode = .container
        case UInt8(ascii: "\""):
            mode = .string
            scan = start + 1
        default:
            mode = .scalar
        }
    }

    /// Scans from `scan` towards `limit`; returns the end (exclusive) of the current
    /// message once found.
    private mutating func scanMessage(upTo limit: Int) -> Int? {
        var state = ScanState(position: scan, depth: depth, inString: inString, escaped: escaped)
        let mode = self.mode
        let start = self.start
        let end = buffer.withUnsafeBufferPointer { Self.scan($0, &state, mode: mode, start: start, limit: limit) }
        scan = state.position
        depth = state.depth
        inString = state.inString
        escaped = state.escaped
        return end
    }

    private struct ScanState {
        var position: Int
        var depth: Int
        var inString: Bool
        var escaped: Bool
    }

    /// The scan proper: one pass over the bytes with its state in locals, and
    /// byte constants rather than `UInt8(ascii:)`, so that it stays fast in an
    /// unoptimised build too (it runs on the event loop for every byte received).
    private static func scan(
        _ bytes: UnsafeBufferPointer<UInt8>, _ state: inout ScanState, mode: Mode, start: Int, limit: Int
    ) -> Int? {
        let quote: UInt8 = 0x22, backslash: UInt8 = 0x5C
        // Through the base pointer: its subscript is inlined even without optimisation.
        guard let bytes = bytes.baseAddress else { return nil }
        var position = state.position
        var depth = state.depth
        var inString = state.inString
        var escaped = state.escaped
        defer {
            state.position = position
            state.depth = depth
            state.inString = inString
            state.escaped = escaped
        }
        switch mode {
        case .container:
            while position < limit {
                let byte = bytes[position]
                position += 1
                if inString {
                    if escaped {
                        escaped = false
                    } else if byte == backslash {
                        escaped = true
                    } else if byte == quote {
                        inString = false
                    }
                    continue
                }
                switch byte {
                case quote:
                    inString = true
                case 0x7B, 0x5B:  // { [
                    depth += 1
                case 0x7D, 0x5D:  // } ]
                    depth -= 1
                    if depth == 0 { return position }
                default:
                    break
                }
            }
        case .string:
            while position < limit {
                let byte = bytes[position]
                position += 1
                if escaped {
                    escaped = false
                } else if byte == backslash {
                    escaped = true
                } else if byte == quote {
                    return position
                }
            }
        case .scalar:
            if position == start {
                // A stray closing bracket is a message of its own.
                let first = bytes[position]
                if first == 0x7D || first == 0x5D { return position + 1 }
            }
            while position < limit {
                switch bytes[position] {
                case 0x20, 0x09, 0x0A, 0x0D, 0x7B, 0x5B, quote:
                    if position > start { return position }
                    position += 1
                default:
                    position += 1
                }
            }
        case .idle, .done:
            break
        }
        return nil
    }

    private mutating func take(upTo end: Int) -> Frame {
        let message = Array(buffer[start..<end])
        start = end
        scan = end
        mode = .idle
        return .message(message)
    }

    private mutating func tooLarge() -> Frame {
        stop()
        return .tooLarge
    }

    private mutating func stop() {
        mode = .done
        buffer = []
        start = 0
        scan = 0
    }

    /// Drops consumed bytes once they are at least half the buffer, which keeps the
    /// total copying linear in the bytes appended.
    private mutating func compact() {
        guard start > 0 else { return }
        if start == buffer.count {
            buffer.removeAll(keepingCapacity: buffer.capacity <= 1 << 16)
        } else if start >= buffer.count - start {
            buffer.removeSubrange(0..<start)
        } else {
            return
        }
        scan -= start
        start = 0
    }
}
