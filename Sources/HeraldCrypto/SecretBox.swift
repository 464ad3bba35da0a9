internal import CHeraldCrypto

/// The 32-byte key that seals device tokens and Web Push keys at rest
/// (XChaCha20-Poly1305). Its bytes stay in the ``SecretBytes`` they were read
/// into: locked where possible and wiped on release.
public final class StoreKey: Sendable {
    private let secret: SecretBytes

    public static let byteCount = Int(HC_SECRETBOX_KEY_BYTES)

    /// Takes the key read from its file; anything but 32 bytes is refused.
    public init(_ secret: SecretBytes) throws(CryptoError) {
        guard secret.count == StoreKey.byteCount else { throw .invalidArgument }
        self.secret = secret
    }

    public static func generate() throws(CryptoError) -> StoreKey {
        try StoreKey(SecretBytes.random(count: byteCount))
    }

    /// version || nonce || ciphertext || tag; `context` binds the secret to
    /// where it is stored, so a sealed value moved elsewhere fails to open.
    public func seal(_ plaintext: [UInt8], context: [UInt8]) throws(CryptoError) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: plaintext.count + Int(HC_SECRETBOX_OVERHEAD))
        var len = out.count
        let rc = secret.withUnsafeUInt8s { key, _ in
            hc_secretbox_seal(key, context, context.count, plaintext, plaintext.count, &out, &len)
        }
        try check(rc)
        return Array(out[0..<len])
    }

    public func open(_ sealed: [UInt8], context: [UInt8]) throws(CryptoError) -> [UInt8] {
        guard sealed.count >= Int(HC_SECRETBOX_OVERHEAD) else { throw .sealedFormat }
        var out = [UInt8](repeating: 0, count: max(sealed.count - Int(HC_SECRETBOX_OVERHEAD), 1))
        var len = out.count
        let rc = secret.withUnsafeUInt8s { key, _ in
            hc_secretbox_open(key, context, context.count, sealed, sealed.count, &out, &len)
        }
        try check(rc)
        return Array(out[0..<len])
    }
}
