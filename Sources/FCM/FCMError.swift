public import HeraldCore

/// A payload over its transport's size limit: what `push.send` answers with
/// 1005 `payload_too_large` (`data.platform`, `data.limit`).
///
/// FCM measures what its 4096-byte limit counts: the keys and values of the
/// message's data and notification payload, not the JSON around them (see
/// `FCMMessage.payloadSize`).
public struct PayloadTooLarge: Error, Sendable, Hashable, CustomStringConvertible {
    /// Always `fcm`.
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

/// Why a message cannot become an FCM v1 message.
public enum FCMMessageError: Error, Sendable, Hashable, CustomStringConvertible {
    /// A data key FCM refuses (`from`, `message_type`, `collapse_key`, anything
    /// starting with `google` or `gcm`) or that Herald fills in itself (`kind`,
    /// `badge`).
    case reservedDataKey(String)
    /// A data key given twice.
    case duplicateDataKey(String)
    /// The payload FCM counts is over 4096 bytes.
    case payloadTooLarge(PayloadTooLarge)

    public var description: String {
        switch self {
        case .reservedDataKey(let key): "data key \"\(key)\" is reserved in FCM data"
        case .duplicateDataKey(let key): "data key \"\(key)\" is given twice"
        case .payloadTooLarge(let error): error.description
        }
    }
}
