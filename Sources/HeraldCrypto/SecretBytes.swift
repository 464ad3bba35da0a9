internal import CHeraldCrypto
import HeraldIO

#if canImport(Glibc)
    import Glibc
#endif

/// Key material on its way from a file to the C core: held in memory of its
/// own that is locked against swapping where the system allows it and wiped
/// when the value is released. Its bytes are lent for a call, never copied
/// into a `String` or an `Array`; its description never shows them.
public final class SecretBytes: Sendable, CustomStringConvertible,
    CustomDebugStringConvertible, CustomReflectable
{
    /// Whole pages, written only during init (before the handle holds them)
    /// and read-only after; wiped and released with the handle.
    private let storage: SharedHandle
    private let locked: Bool

    /// The number of bytes held.
    public let count: Int

    /// Room for `capacity` bytes that `fill` writes; it returns how many it
    /// wrote (at most `capacity`). When `fill` throws, the room is wiped and
    /// released and the error passes on.
    public init<E: Error>(
        capacity: Int, fill: (UnsafeMutableRawBufferPointer) throws(E) -> Int
    ) throws(E) {
        precondition(capacity >= 0, "negative capacity")
        // Whole pages of their own: munlock on release must not unlock
        // another value's bytes that share a page.
        let page = max(Int(sysconf(Int32(_SC_PAGESIZE))), 4096)
        let size = max((capacity + page - 1) / page * page, page)
        let raw = UnsafeMutableRawBufferPointer.allocate(byteCount: size, alignment: page)
        raw.initializeMemory(as: UInt8.self, repeating: 0)
        // Locking may fail (RLIMIT_MEMLOCK, no privilege): the bytes are still wiped.
        let locked = mlock(raw.baseAddress!, size) == 0
        let written: Int
        do {
            written = try fill(UnsafeMutableRawBufferPointer(rebasing: raw[0..<capacity]))
        } catch {
            Self.release(raw, locked: locked)
            throw error
        }
        precondition(written >= 0 && written <= capacity, "fill reported \(written) of \(capacity) bytes")
        if written < capacity {
            hc_wipe(raw.baseAddress! + written, capacity - written)
        }
        storage = SharedHandle(OpaquePointer(raw.baseAddress!)) { _ in Self.release(raw, locked: locked) }
        self.locked = locked
        count = written
    }

    /// A copy of `bytes`. The source stays the caller's to wipe: use this for
    /// test vectors and for bytes that arrive in memory the caller controls.
    public convenience init(copying bytes: some Collection<UInt8>) {
        self.init(capacity: bytes.count) { (buffer: UnsafeMutableRawBufferPointer) -> Int in
            buffer.copyBytes(from: bytes)
            return bytes.count
        }
    }

    /// `count` bytes from the core's random generator.
    public static func random(count: Int) throws(CryptoError) -> SecretBytes {
        try SecretBytes(capacity: count) { (buffer: UnsafeMutableRawBufferPointer) throws(CryptoError) -> Int in
            try check(hc_random(buffer.bindMemory(to: UInt8.self).baseAddress, count))
            return count
        }
    }

    private static func release(_ raw: UnsafeMutableRawBufferPointer, locked: Bool) {
        hc_wipe(raw.baseAddress, raw.count)
        if locked { _ = munlock(raw.baseAddress!, raw.count) }
        raw.deallocate()
    }

    /// Whether the bytes are locked in memory (false where the system refused).
    public var isLocked: Bool { locked }

    /// Lends the bytes for the duration of `body`; the pointer must not escape it.
    public func withUnsafeBytes<R, E: Error>(
        _ body: (UnsafeRawBufferPointer) throws(E) -> R
    ) throws(E) -> R {
        try body(UnsafeRawBufferPointer(start: UnsafeRawPointer(storage.pointer), count: count))
    }

    /// Constant-time comparison of two secrets.
    public func isEqual(to other: SecretBytes) -> Bool {
        guard count == other.count else { return false }
        return withUnsafeUInt8s { a, n in other.withUnsafeUInt8s { b, _ in hc_equal(a, b, n) == 1 } }
    }

    /// The size only, never the bytes.
    public var description: String { "SecretBytes(\(count) bytes, redacted)" }
    public var debugDescription: String { description }
    public var customMirror: Mirror { Mirror(self, children: ["count": count]) }
}

extension SecretBytes {
    /// Lends the bytes as C characters (PEM or JSON text) with their length.
    func withUnsafeCChars<R, E: Error>(
        _ body: (UnsafePointer<CChar>, Int) throws(E) -> R
    ) throws(E) -> R {
        try withUnsafeUInt8s { (bytes: UnsafePointer<UInt8>, count: Int) throws(E) -> R in
            try bytes.withMemoryRebound(to: CChar.self, capacity: max(count, 1)) {
                (chars: UnsafePointer<CChar>) throws(E) -> R in try body(chars, count)
            }
        }
    }

    /// Lends the bytes as `UInt8`s.
    func withUnsafeUInt8s<R, E: Error>(
        _ body: (UnsafePointer<UInt8>, Int) throws(E) -> R
    ) throws(E) -> R {
        // A valid pointer even for zero bytes: the storage always has a page.
        try body(UnsafePointer(UnsafeRawPointer(storage.pointer).assumingMemoryBound(to: UInt8.self)), count)
    }
}
