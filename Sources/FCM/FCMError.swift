public import HeraldCore

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
