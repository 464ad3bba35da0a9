public import HeraldCore

extension ProviderReason {
    /// Herald's reason for a request the HTTP/2 client could not get
    /// answered (APNs, FCM and Web Push alike): always worth a retry.
    public init(_ error: HTTP2ClientError) {
        self =
            switch error {
            case .timeout: .timeout
            case .dnsFailure: .dnsFailure
            case .connectFailed: .connectFailure
            case .tls, .noHTTP2: .tlsFailure
            case .connectionReset: .connectionReset
            case .refusedStream: .refusedStream
            case .goAway: .goAway
            case .shutdown: .shutdown
            }
    }
}
