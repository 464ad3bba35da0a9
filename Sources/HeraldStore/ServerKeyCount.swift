/// How many Web Push subscriptions of one app record one VAPID public key
/// (`devices.server_key`), for `system.stats`.
public struct ServerKeyCount: Sendable, Equatable {
    public let app: String
    /// The base64url public key; nil for subscriptions that record none
    /// (registered before Herald recorded keys): they are sent as made under
    /// the app's current key.
    public let serverKey: String?
    public let count: Int

    public init(app: String, serverKey: String?, count: Int) {
        self.app = app
        self.serverKey = serverKey
        self.count = count
    }
}
