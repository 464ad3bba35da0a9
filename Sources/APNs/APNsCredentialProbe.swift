public import HeraldCore

/// Proving an APNs signing key: APNs checks the provider token before it
/// looks at the device token, so a silent background push to a token no
/// device has (64 hex zeros) is answered 403 with the token's fault
/// (`InvalidProviderToken`, `ExpiredProviderToken`, …) when the key is bad,
/// and 400 `BadDeviceToken` when it is good. It can reach no one.
public enum APNsCredentialProbe {
    /// A syntactically valid device token that names no device.
    public static let deviceToken = String(repeating: "0", count: 64)

    /// Reasons of a 400 that concern the key's right to the app's topic,
    /// not the probe's token: the credential does not serve this app.
    static let topicReasons: Set<String> = ["TopicDisallowed", "BadTopic", "MissingTopic", "DeviceTokenNotForTopic"]

    /// The probe's request: a background push (no alert, no sound) at low
    /// priority that expires at once.
    public static func push(topic: String, notAfter: Int64?) -> APNsPush {
        APNsPush(
            deviceToken: deviceToken,
            headers: [
                ("apns-topic", topic), ("apns-push-type", "background"), ("apns-priority", "5"),
                ("apns-expiration", "0"),
            ],
            payload: Array(#"{"aps":{"content-available":1}}"#.utf8), notAfter: notAfter)
    }

    /// What APNs' answer to the probe says of the credential.
    public static func verdict(status: Int, reason: String?) -> CredentialVerdict {
        switch status {
        case 200..<300:
            return .ok
        case 403:
            // Every 403 is about the provider token or the key behind it.
            return .rejected(reason ?? "http_403")
        case 400 where reason.map(topicReasons.contains) ?? false:
            return .rejected(reason!)
        case 400, 410, 413:
            // Authenticated first, then judged on the token or the payload.
            return .ok
        default:
            // 429 (TooManyRequests, TooManyProviderTokenUpdates), 5xx, or a
            // path that is not APNs': the credential was not judged.
            return .unreachable(reason ?? "http_\(status)")
        }
    }

    /// The probe got no answer.
    public static func verdict(error: APNsClientError) -> CredentialVerdict {
        .unreachable(ProviderReason(error).rawValue)
    }
}

extension APNsTransport: CredentialProbe {
    /// Sends ``APNsCredentialProbe/push(topic:notAfter:)`` on the production
    /// lane (one key serves both environments), with the lane's provider token.
    public func probeCredential(timeout: Duration, completion: @escaping @Sendable (CredentialVerdict) -> Void) {
        let push = APNsCredentialProbe.push(
            topic: topic, notAfter: clock.nowMilliseconds() + timeout.wholeMilliseconds)
        production.send(push) { result in
            switch result {
            case .success(let r): completion(APNsCredentialProbe.verdict(status: r.status, reason: r.reason))
            case .failure(let error): completion(APNsCredentialProbe.verdict(error: error))
            }
        }
    }
}
