public import HeraldCore
import HeraldIO
import HeraldTransport

/// Proving an FCM service account: a fresh OAuth token exchange (a revoked
/// or deleted key is refused there, `invalid_grant`, even while an access
/// token it issued still works), then a `messages:send` with
/// `validate_only: true` to a topic, which FCM authenticates and checks
/// without delivering it to anyone (`{"name": "projects/…/messages/fake_message_id"}`).
public enum FCMCredentialProbe {
    /// The topic the probe's message names (no app subscribes to it; it is
    /// never delivered: `validate_only`).
    public static let topic = "herald-credential-check"

    /// The probe's body.
    public static let body = Array(
        #"{"validate_only":true,"message":{"topic":"herald-credential-check","data":{"herald":"credential_check"}}}"#
            .utf8)

    /// What the token endpoint's refusal says of the credential.
    public static func verdict(tokenError error: FCMAccessTokenError) -> CredentialVerdict {
        switch error {
        case .assertion:
            return .rejected("assertion_failed")
        case .transport(let failure):
            return .unreachable(failure.reason.rawValue)
        case .status(let status, let code, _):
            if status == 408 || status == 429 || (500..<600).contains(status) {
                return .unreachable(code ?? "http_\(status)")
            }
            return .rejected(code ?? "http_\(status)")
        case .badResponse:
            return .unreachable("token_bad_response")
        }
    }

    /// What the `validate_only` send's answer says of the credential.
    /// `errorCode` is the FCM `errorCode` (or the error's `status`).
    public static func verdict(status: Int, errorCode: String?) -> CredentialVerdict {
        switch status {
        case 200..<300:
            return .ok
        case 401, 403, 404:
            // Not authenticated, not allowed to send for the project, or no
            // such project: the account cannot send for this app.
            return .rejected(errorCode ?? "http_\(status)")
        case 400:
            // Authenticated first; only the probe's own message was judged.
            return .ok
        case 408, 429, 500..<600:
            return .unreachable(errorCode ?? "http_\(status)")
        default:
            return .rejected(errorCode ?? "http_\(status)")
        }
    }
}

extension FCMSender {
    /// Runs ``FCMCredentialProbe``: a fresh token exchange, then the
    /// `validate_only` send with its token. Never retried.
    public func probeCredential(timeout: Duration, completion: @escaping @Sendable (CredentialVerdict) -> Void) {
        let notAfter = clock.nowMilliseconds() + timeout.wholeMilliseconds
        tokens.exchangeAfresh { [self] result in
            switch result {
            case .failure(let error):
                completion(FCMCredentialProbe.verdict(tokenError: error))
            case .success(let token):
                let request = OriginRequest(
                    origin: origin, url: sendURL, path: path,
                    headers: [
                        ("authorization", "Bearer " + token), ("content-type", "application/json; charset=UTF-8"),
                    ],
                    body: FCMCredentialProbe.body, notAfter: notAfter, timeout: timeout)
                transport.send(request, lane: { self.lane }) { [self] result in
                    switch result {
                    case .success(let response):
                        let (_, info) = Self.classify(response, now: clock.nowMilliseconds())
                        completion(FCMCredentialProbe.verdict(status: info.status, errorCode: info.errorCode))
                    case .failure(let failure):
                        completion(.unreachable(failure.reason.rawValue))
                    }
                }
            }
        }
    }
}

extension FCMTransport: CredentialProbe {
    public func probeCredential(timeout: Duration, completion: @escaping @Sendable (CredentialVerdict) -> Void) {
        sender.probeCredential(timeout: timeout, completion: completion)
    }
}
