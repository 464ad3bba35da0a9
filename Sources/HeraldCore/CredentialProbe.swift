/// What a credential check found: the provider accepted the credential, refused
/// it (with its reason), or could not be asked.
public struct CredentialVerdict: Sendable, Hashable, CustomStringConvertible {
    public enum Status: String, Sendable, Hashable, CaseIterable {
        /// The provider authenticated the credential.
        case ok
        /// The provider refused the credential (`reason` says how).
        case rejected
        /// No answer that judges the credential: no connection, TLS, a
        /// timeout, or the provider busy (429, 5xx).
        case unreachable
    }

    public let status: Status
    /// The provider's reason (`InvalidProviderToken`, `invalid_grant`,
    /// `UNAUTHENTICATED`), or Herald's name for what went wrong on the way.
    public let reason: String?

    public init(_ status: Status, reason: String? = nil) {
        self.status = status
        self.reason = reason
    }

    public static let ok = CredentialVerdict(.ok)

    public static func rejected(_ reason: String) -> CredentialVerdict { CredentialVerdict(.rejected, reason: reason) }

    public static func unreachable(_ reason: String) -> CredentialVerdict {
        CredentialVerdict(.unreachable, reason: reason)
    }

    public var description: String { status.rawValue + (reason.map { ":" + $0 } ?? "") }
}

/// Proves one app's credential for one platform without reaching a user: a
/// request the provider authenticates before it judges the rest, built so
/// that nothing can be delivered (a token no device has, FCM's
/// `validate_only`), or a local check where the provider has nothing to ask.
public protocol CredentialProbe: AnyObject, Sendable {
    /// Checks once; `completion` runs exactly once, on any thread, within
    /// about `timeout`, and must not block.
    func probeCredential(timeout: Duration, completion: @escaping @Sendable (CredentialVerdict) -> Void)
}
