import HeraldCrypto

/// The short form of a long APNs collapse id: the first 24 bytes of
/// SHA-256(key) as base64url, 32 characters of `[A-Za-z0-9_-]`. It is the
/// same string as the Web Push `Topic` for that key, so a collapse key
/// groups notifications the same way on both transports.
enum CollapseDigest {
    static func shortForm(_ key: String) -> String {
        Base64URL.encode(SHA256.hash(Array(key.utf8)).prefix(24))
    }
}
