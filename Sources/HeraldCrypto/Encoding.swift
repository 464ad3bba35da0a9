internal import CHeraldCrypto

/// base64url without padding, as Web Push, VAPID and JWTs use it.
public enum Base64URL {
    public static func encode(_ bytes: some Collection<UInt8>) -> String {
        let input = Array(bytes)
        var capacity = hc_base64url_encoded_length(input.count) + 1
        var out = [CChar](repeating: 0, count: capacity)
        _ = hc_base64url_encode(input, input.count, &out, &capacity)
        return String(decoding: out[0..<capacity].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// Decodes strictly: characters outside the URL-safe alphabet and wrong
    /// padding are refused.
    public static func decode(_ text: String) throws(CryptoError) -> [UInt8] {
        let utf8 = Array(text.utf8)
        var out = [UInt8](repeating: 0, count: utf8.count / 4 * 3 + 3)
        var len = out.count
        let rc = utf8.withUnsafeBufferPointer { input in
            input.withMemoryRebound(to: CChar.self) {
                hc_base64url_decode($0.baseAddress, $0.count, &out, &len)
            }
        }
        try check(rc)
        return Array(out[0..<len])
    }
}

/// SHA-256 digests.
public enum SHA256 {
    public static func hash(_ bytes: some Collection<UInt8>) -> [UInt8] {
        let input = Array(bytes)
        var out = [UInt8](repeating: 0, count: Int(HC_SHA256_BYTES))
        hc_sha256(input, input.count, &out)
        return out
    }

    /// The digest as lowercase hex.
    public static func hex(_ bytes: some Collection<UInt8>) -> String {
        hash(bytes).hexString
    }

    public static func hex(_ text: String) -> String { hex(Array(text.utf8)) }
}

/// HKDF with SHA-256 (RFC 5869).
public enum HKDF {
    public static func derive(
        salt: [UInt8], ikm: [UInt8], info: [UInt8], length: Int
    ) throws(CryptoError) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: length)
        try check(hc_hkdf(salt, salt.count, ikm, ikm.count, info, info.count, &out, length))
        return out
    }
}

/// Cryptographically secure random bytes.
public enum SecureRandom {
    public static func bytes(_ count: Int) throws(CryptoError) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: count)
        try check(hc_random(&out, count))
        return out
    }
}

extension Collection<UInt8> {
    /// Lowercase hex of the bytes.
    public var hexString: String {
        let digits = Array("0123456789abcdef".utf8)
        var chars = [UInt8]()
        chars.reserveCapacity(count * 2)
        for byte in self {
            chars.append(digits[Int(byte >> 4)])
            chars.append(digits[Int(byte & 0x0f)])
        }
        return String(decoding: chars, as: UTF8.self)
    }
}

/// Calls a core function that writes a NUL-terminated string into a
/// caller-owned buffer, growing the buffer once if the core asks for more.
func cString(
    capacity: Int, _ body: (UnsafeMutablePointer<CChar>, UnsafeMutablePointer<Int>) -> Int32
) throws(CryptoError) -> String {
    var size = capacity
    for _ in 0..<2 {
        var buffer = [CChar](repeating: 0, count: size)
        var len = size
        let rc = buffer.withUnsafeMutableBufferPointer { body($0.baseAddress!, &len) }
        if rc == Int32(HC_E_BUFFER_TOO_SMALL) {
            size = len
            continue
        }
        try check(rc)
        let text = String(decoding: buffer[0..<len].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        buffer.withUnsafeMutableBytes { hc_wipe($0.baseAddress, $0.count) }
        return text
    }
    throw .bufferTooSmall
}
