public import HeraldCore

/// Why a message cannot become a Web Push plaintext.
public enum WebPushPayloadError: Error, Sendable, Hashable, CustomStringConvertible {
    /// A data key given twice.
    case duplicateDataKey(String)
    /// A body size no record can have (below 104 bytes or above 4096).
    case invalidBodySize(Int)
    /// The full plaintext does not fit one record of the body size.
    case payloadTooLarge(PayloadTooLarge)

    public var description: String {
        switch self {
        case .duplicateDataKey(let key): "data key \"\(key)\" is given twice"
        case .invalidBodySize(let size): "no Web Push record has a body of \(size) bytes"
        case .payloadTooLarge(let error): error.description
        }
    }
}
