internal import CHeraldCrypto
import HeraldIO

/// A P-256 private key (VAPID or APNs signing key). The scalar lives in the C
/// core and is wiped when the key is released.
public final class P256PrivateKey: Sendable {
    private let key: SharedHandle
    /// The core's key: immutable after creation, only read (from any thread).
    var handle: OpaquePointer { key.pointer }

    private init(handle: OpaquePointer) { key = SharedHandle(handle) { hc_p256_key_free($0) } }

    /// A fresh random key.
    public static func generate() throws(CryptoError) -> P256PrivateKey {
        var handle: OpaquePointer?
        try check(hc_p256_key_generate(&handle))
        return P256PrivateKey(handle: handle!)
    }

    /// The text of a key file: a PEM private key (PKCS#8 or SEC1), or a
    /// base64url raw 32-byte scalar; surrounding whitespace is ignored.
    public convenience init(text: SecretBytes) throws(CryptoError) {
        var handle: OpaquePointer?
        try check(text.withUnsafeCChars { hc_p256_key_from_text($0, $1, &handle) })
        self.init(handle: handle!)
    }

    /// A raw 32-byte scalar.
    public convenience init(raw: SecretBytes) throws(CryptoError) {
        var handle: OpaquePointer?
        try check(raw.withUnsafeUInt8s { hc_p256_key_from_raw($0, $1, &handle) })
        self.init(handle: handle!)
    }

    /// The uncompressed public point (65 bytes).
    public var publicKey: [UInt8] {
        var out = [UInt8](repeating: 0, count: Int(HC_P256_PUBLIC_BYTES))
        hc_p256_key_public(handle, &out)
        return out
    }

    /// The public key as base64url, the form browsers take as `applicationServerKey`.
    public var publicKeyBase64URL: String { Base64URL.encode(publicKey) }

    /// The private key as PKCS#8 PEM.
    public func pem() throws(CryptoError) -> String {
        try cString(capacity: 512) { hc_p256_key_to_pem(handle, $0, $1) }
    }

    /// ES256 signature (raw r || s, 64 bytes) over SHA-256 of the message.
    public func sign(_ message: [UInt8]) throws(CryptoError) -> [UInt8] {
        var sig = [UInt8](repeating: 0, count: Int(HC_ES256_SIGNATURE_BYTES))
        try check(hc_es256_sign(handle, message, message.count, &sig))
        return sig
    }

    /// The ECDH shared secret (X coordinate) with a peer's public point; for
    /// the tests that check the core against published vectors only.
    @_spi(Testing) public func sharedSecret(with peer: [UInt8]) throws(CryptoError) -> [UInt8] {
        try P256.checkPublicKey(peer)
        var out = [UInt8](repeating: 0, count: 32)
        try check(hc_p256_ecdh(handle, peer, &out))
        return out
    }
}

/// Checks on public P-256 material.
public enum P256 {
    /// Throws unless the bytes are an uncompressed point on P-256.
    public static func checkPublicKey(_ bytes: [UInt8]) throws(CryptoError) {
        try check(hc_p256_public_check(bytes, bytes.count))
    }

    /// Verifies an ES256 signature (raw r || s); false when it does not verify.
    public static func verify(
        signature: [UInt8], message: [UInt8], publicKey: [UInt8]
    ) throws(CryptoError) -> Bool {
        let rc = hc_es256_verify(
            publicKey, publicKey.count, message, message.count, signature, signature.count)
        if rc == Int32(HC_E_SIGNATURE_INVALID) { return false }
        try check(rc)
        return true
    }
}
