/// Why a provider (or the connection to it) answered the way it did: an APNs
/// `reason`, an FCM error code, or a Herald-side name for a transport failure.
///
/// A closed-looking set that stays open: the known values are `static let`
/// members (Herald's own names here, each provider's names in that provider's
/// module), and anything a provider adds tomorrow is kept verbatim through
/// ``unknown(_:)`` so it can still be recorded in `push.status`.
public struct ProviderReason: RawRepresentable, Hashable, Sendable, CustomStringConvertible, ExpressibleByStringLiteral
{
    /// The reason exactly as the provider spelled it (or Herald's own name).
    public let rawValue: String

    public init(rawValue: String) { self.rawValue = rawValue }

    public init(_ rawValue: String) { self.rawValue = rawValue }

    public init(stringLiteral value: String) { self.rawValue = value }

    /// A reason this module has no name for, kept as the provider sent it.
    public static func unknown(_ rawValue: String) -> ProviderReason { ProviderReason(rawValue) }

    /// A reason for an answer that carried none: `http_<status>`.
    public static func httpStatus(_ status: Int) -> ProviderReason { ProviderReason("http_\(status)") }

    public var description: String { rawValue }
}

// MARK: - Transport failures (Herald's names; no provider answer was received)

extension ProviderReason {
    /// The request got no answer within its deadline.
    public static let timeout = ProviderReason("timeout")
    /// The connection was reset or closed mid-request.
    public static let connectionReset = ProviderReason("connection_reset")
    /// The server sent GOAWAY before answering this stream.
    public static let goAway = ProviderReason("goaway")
    /// The server refused the stream (RST_STREAM REFUSED_STREAM).
    public static let refusedStream = ProviderReason("refused_stream")
    /// The provider's host name did not resolve.
    public static let dnsFailure = ProviderReason("dns_failure")
    /// The TLS handshake or the certificate check failed.
    public static let tlsFailure = ProviderReason("tls_failure")
    /// The connection could not be opened.
    public static let connectFailure = ProviderReason("connect_failure")
    /// The client was shutting down before an answer came (spelled as APNs
    /// spells its own `Shutdown`, which means the same to the scheduler).
    public static let shutdown = ProviderReason("Shutdown")

    /// Every name above.
    public static let transportFailures: Set<ProviderReason> = [
        .timeout, .connectionReset, .goAway, .refusedStream, .dnsFailure, .tlsFailure, .connectFailure, .shutdown,
    ]
}

// MARK: - Herald's own, and shared with the providers

extension ProviderReason {
    /// A request Herald could not build for this device (a routing or data bug).
    public static let requestInvalid = ProviderReason("request_invalid")
    /// The payload was over the provider's limit: APNs' `PayloadTooLarge`, also
    /// what a Web Push 413 on the minimal payload and ``Outcome/tooLarge`` record.
    public static let payloadTooLarge = ProviderReason("PayloadTooLarge")
}
