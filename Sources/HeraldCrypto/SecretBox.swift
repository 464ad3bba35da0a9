internal import CHeraldCrypto

/// The 32-byte key that seals device tokens and Web Push keys at rest
/// (XChaCha20-Poly1305). Held in memory that is wiped on release.
public final class StoreKey: @unchecked Sendable {
    // Immutable after init.
    private let bytes: UnsafeMutableRawBufferPointer

    public static let byteCount = Int(HC_SECRETBOX_KEY_BYTES)

    public init(bytes key: [UInt8]) throws(CryptoError) {
        guard key.count == StoreKey.byteCount else { throw .invalidArgument }
        bytes = .allocate(byteCount: StoreKey.byteCount, alignment: 8)
        bytes.copyBytes(from: key)
    }

    public static func generate() throws(CryptoError) -> StoreKey {
        var raw = try SecureRandom.bytes(byteCount)
        defer { raw.withUnsafeMutableBytes { hc_wipe($0.baseAddress, $0.count) } }
        return try StoreKey(bytes: raw)
    }

    deinit {
        hc_wipe(bytes.baseAddress, bytes.count)
        bytes.deallocate()
    }

    /// version || nonce || ciphertext || tag; `context` binds the secret to
    /// where it is stored, so a sealed value moved elsewhere fails to open.
    public func seal(_ plaintext: [UInt8], context: [UInt8]) throws(CryptoError) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: plaintext.count + Int(HC_SECRETBOX_OVERHEAD))
        var len = out.count
        let key = bytes.bindMemory(to: UInt8.self).baseAddress
        try check(
            hc_secretbox_seal(key, context, context.count, plaintext, plaintext.count, &out, &len))
        return Array(out[0..<len])
    }

    public func open(_ sealed: [UInt8], context: [UInt8]) throws(CryptoError) -> [UInt8] {
        guard sealed.count >= Int(HC_SECRETBOX_OVERHEAD) else { throw .sealedFormat }
        var out = [UInt8](repeating: 0, count: max(sealed.count - Int(HC_SECRETBOX_OVERHEAD), 1))
        var len = out.count
        let key = bytes.bindMemory(to: UInt8.self).baseAddress
        try check(
            hc_secretbox_open(key, context, context.count, sealed, sealed.count, &out, &len))
        return Array(out[0..<len])
    }
}
