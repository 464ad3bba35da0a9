public import HeraldCore

/// A payload over its transport's size limit: what `push.send` answers with
/// 1005 `payload_too_large` (`data.platform`, `data.limit`).
///
/// APNs measures the JSON body: 4096 bytes, 5120 for VoIP (`apns_voip`).
public struct PayloadTooLarge: Error, Sendable, Hashable, CustomStringConvertible {
    /// `apns` or `apns_voip`.
    public let platform: Platform
    /// The largest size the transport accepts, in bytes.
    public let limit: Int
    /// The size this payload came to, in bytes.
    public let size: Int

    public init(platform: Platform, limit: Int, size: Int) {
        self.platform = platform
        self.limit = limit
        self.size = size
    }

    public var description: String {
        "\(platform.rawValue) payload is \(size) bytes, over the limit of \(limit)"
    }
}

/// Why a message cannot become an APNs request.
public enum APNsRequestError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The device is not an APNs device (`fcm`, `web`).
    case notAPNs(Platform)
    /// The kind does not go to this platform (`PushKind.reaches`): `apns_voip`
    /// gets `call_ring` only, and `apns` never gets a `call_ring`. The scheduler
    /// skips such pairs; reaching the builder with one is a routing bug.
    case kindNotRouted(kind: PushKind, platform: Platform)
    /// A data key the payload reserves for itself (`aps`).
    case reservedDataKey(String)
    /// A data key given twice.
    case duplicateDataKey(String)
    /// The JSON body is over 4096 bytes (5120 for VoIP).
    case payloadTooLarge(PayloadTooLarge)

    public var description: String {
        switch self {
        case .notAPNs(let platform): "\(platform.rawValue) is not an APNs platform"
        case .kindNotRouted(let kind, let platform): "\(kind.rawValue) is not delivered to \(platform.rawValue)"
        case .reservedDataKey(let key): "data key \"\(key)\" is reserved by the APNs payload"
        case .duplicateDataKey(let key): "data key \"\(key)\" is given twice"
        case .payloadTooLarge(let error): error.description
        }
    }
}
