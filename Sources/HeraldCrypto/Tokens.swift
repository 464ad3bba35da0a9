internal import CHeraldCrypto
import HeraldIO

/// VAPID tokens (RFC 8292) for Web Push requests.
public enum VAPID {
    /// The longest lifetime a push service accepts.
    public static let maximumLifetime: Int64 = Int64(HC_VAPID_MAX_TTL)
    /// Herald's default lifetime: half the maximum, to absorb clock skew.
    public static let defaultLifetime: Int64 = 12 * 3600

    /// A compact JWT with `aud` (an https origin), `exp` and `sub`. The
    /// subject is written as given: the caller checks that it is a `mailto:`
    /// or `https:` URL (Herald's configuration does when it loads).
    public static func token(
        key: P256PrivateKey, audience: String, subject: String, expiresAt: Int64, now: Int64
    ) throws(CryptoError) -> String {
        try cString(capacity: 1024) {
            hc_vapid_jwt(key.handle, audience, subject, expiresAt, now, $0, $1)
        }
    }

    /// `vapid t=<jwt>, k=<public key>`, the value of the Authorization header.
    public static func authorization(
        key: P256PrivateKey, audience: String, subject: String, expiresAt: Int64, now: Int64
    ) throws(CryptoError) -> String {
        try cString(capacity: 1200) {
            hc_vapid_authorization(key.handle, audience, subject, expiresAt, now, $0, $1)
        }
    }
}

/// APNs provider tokens (ES256 JWT with `kid`, `iss` and `iat`).
public enum APNsProviderToken {
    public static func make(
        key: P256PrivateKey, keyID: String, teamID: String, issuedAt: Int64
    ) throws(CryptoError) -> String {
        try cString(capacity: 512) { hc_apns_jwt(key.handle, keyID, teamID, issuedAt, $0, $1) }
    }
}

/// A Google service account, as read from its JSON file, that signs the
/// OAuth2 JWT-bearer assertion for FCM HTTP v1.
public final class FCMServiceAccount: Sendable {
    /// The core's account: immutable after parsing, only read by signing (from any thread).
    private let account: SharedHandle
    private var handle: OpaquePointer { account.pointer }
    public let projectID: String
    public let clientEmail: String
    public let tokenURI: String

    /// The service-account file's text; the private key goes from it to the
    /// core and stays there.
    public init(json: SecretBytes) throws(CryptoError) {
        var handle: OpaquePointer?
        try check(json.withUnsafeCChars { hc_fcm_account_from_json($0, $1, &handle) })
        account = SharedHandle(handle!) { hc_fcm_account_free($0) }
        projectID = String(cString: hc_fcm_account_project_id(account.pointer))
        clientEmail = String(cString: hc_fcm_account_client_email(account.pointer))
        tokenURI = String(cString: hc_fcm_account_token_uri(account.pointer))
    }

    /// The RS256 assertion for the token exchange asking for `scope` (one or
    /// more space-separated scope URIs), valid for `lifetime` seconds (≤ 3600).
    public func assertion(
        scope: String, issuedAt: Int64, lifetime: Int64 = 3600
    ) throws(CryptoError) -> String {
        try cString(capacity: 2048) { hc_fcm_assertion(handle, scope, issuedAt, lifetime, $0, $1) }
    }
}
