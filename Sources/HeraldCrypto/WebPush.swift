internal import CHeraldCrypto
import HeraldIO

/// A Web Push subscription's keys, parsed and checked once and reused for
/// every record sealed for it.
public final class WebPushSubscriber: Sendable {
    private let keys: SharedHandle
    /// The core's subscriber keys: immutable after parsing, only read by sealing (from any thread).
    var handle: OpaquePointer { keys.pointer }

    /// `p256dh` is the 65-byte uncompressed point, `auth` the 16-byte secret.
    public init(p256dh: [UInt8], auth: [UInt8]) throws(CryptoError) {
        var handle: OpaquePointer?
        try check(hc_webpush_sub_new(p256dh, p256dh.count, auth, auth.count, &handle))
        keys = SharedHandle(handle!) { hc_webpush_sub_free($0) }
    }

    /// The keys as a browser's `PushSubscription.toJSON()` gives them.
    public convenience init(p256dh: String, auth: String) throws(CryptoError) {
        try self.init(p256dh: Base64URL.decode(p256dh), auth: Base64URL.decode(auth))
    }

    public var publicKey: [UInt8] {
        var out = [UInt8](repeating: 0, count: Int(HC_P256_PUBLIC_BYTES))
        hc_webpush_sub_public(handle, &out)
        return out
    }
}

/// Seals `aes128gcm` records (RFC 8291). Holds reusable scratch contexts, so
/// one sealer serves one thread or task at a time.
public final class WebPushSealer {
    /// Herald's fixed body size: every record is padded to it so that its
    /// length says nothing about its content.
    public static let defaultBodySize = 2816
    /// Herald's record size, the `rs` in every header: RFC 8291 wants it
    /// larger than the one record, and 4096 exceeds any record of the largest body.
    public static let defaultRecordSize = 4096
    /// The largest body every push service must accept (RFC 8030 §7.2).
    public static let maximumBodySize = Int(HC_WEBPUSH_MAX_BODY)

    private let handle: OpaquePointer

    /// A sealer writing `recordSize` (at least 18) into every header.
    public init(recordSize: Int = WebPushSealer.defaultRecordSize) throws(CryptoError) {
        guard let rs = UInt32(exactly: recordSize) else { throw .recordSize }
        var handle: OpaquePointer?
        try check(hc_sealer_new(rs, &handle))
        self.handle = handle!
    }

    deinit { hc_sealer_free(handle) }

    /// The largest plaintext that fits a body of `bodySize` bytes (0: unpadded).
    public static func maximumPlaintext(bodySize: Int) -> Int {
        hc_webpush_max_plaintext(bodySize)
    }

    /// One record with a fresh ephemeral key and salt, padded to exactly
    /// `bodySize` bytes (or as short as possible when `bodySize` is 0).
    public func seal(
        _ plaintext: [UInt8], for subscriber: WebPushSubscriber,
        bodySize: Int = WebPushSealer.defaultBodySize
    ) throws(CryptoError) -> [UInt8] {
        let total = hc_webpush_sealed_length(plaintext.count, bodySize)
        if total == 0 {
            // Let the core name the cause (body size or plaintext length).
            var len = 0
            try check(
                hc_webpush_seal(
                    handle, subscriber.handle, plaintext, plaintext.count, bodySize, nil, &len))
            throw .invalidArgument
        }
        var out = [UInt8](repeating: 0, count: total)
        var len = total
        try check(
            hc_webpush_seal(
                handle, subscriber.handle, plaintext, plaintext.count, bodySize, &out, &len))
        return out
    }

    /// Deterministic sealing with a given ephemeral key and salt; only for
    /// reproducing published test vectors.
    @_spi(Testing) public func sealForTesting(
        _ plaintext: [UInt8], for subscriber: WebPushSubscriber, ephemeralPrivateKey: [UInt8],
        salt: [UInt8], bodySize: Int = 0
    ) throws(CryptoError) -> [UInt8] {
        guard ephemeralPrivateKey.count == Int(HC_P256_PRIVATE_BYTES) else {
            throw .privateKeyLength
        }
        guard salt.count == Int(HC_WEBPUSH_SALT_BYTES) else { throw .invalidArgument }
        var len = hc_webpush_sealed_length(plaintext.count, bodySize)
        var out = [UInt8](repeating: 0, count: max(len, 1))
        try check(
            hc_webpush_seal_with_keys(
                handle, subscriber.handle, ephemeralPrivateKey, salt, plaintext, plaintext.count,
                bodySize, &out, &len))
        return Array(out[0..<len])
    }
}
