/// A payload over its transport's size limit: what `push.send` answers with
/// 1005 `payload_too_large` (`data.platform`, `data.limit`). Each transport
/// measures its own way: APNs the JSON body (4096, VoIP 5120), FCM the keys
/// and values of data and notification (4096), Web Push the plaintext one
/// padded record holds (2713 for Herald's 2816-byte body).
public struct PayloadTooLarge: Error, Sendable, Hashable, CustomStringConvertible {
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
