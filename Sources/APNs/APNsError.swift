public import HeraldCore

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
