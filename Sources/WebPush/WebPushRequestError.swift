public import HeraldCore

/// A payload over its transport's size limit: what `push.send` answers with
/// 1005 `payload_too_large` (`data.platform`, `data.limit`).
///
/// Web Push measures the plaintext JSON against what one padded record of the
/// configured body size holds (2713 bytes for Herald's 2816-byte body).
public struct PayloadTooLarge: Error, Sendable, Hashable, CustomStringConvertible {
    /// Always `web`.
    public let platform: Platform
    /// The largest plaintext the record holds, in bytes.
    public let limit: Int
    /// The size of this plaintext, in bytes.
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
