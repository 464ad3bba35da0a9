import HeraldIO
import HeraldStore
import HeraldConfiguration

extension Daemon {
    /// At startup: Web Push subscriptions registered before Herald recorded
    /// the VAPID key they were made with (`server_key` NULL) are recorded
    /// under the app's current key, the one they have been sent with. A later
    /// rotation then keeps signing them with that key (as the previous key)
    /// instead of moving them to the new one. Not while the app holds a
    /// previous key too: such a row may have been made under either, and a
    /// guess would be recorded for good. A failure is logged; rows left NULL
    /// are sent with the current key, as before.
    static func recordServerKeys(_ credentials: [String: LoadedCredentials], store: any DeviceRegistry, log: Logger) {
        for (app, c) in credentials.sorted(by: { $0.key < $1.key }) {
            guard let vapid = c.webPush.value, vapid.previous == nil else { continue }
            store.recordServerKey(app: app, key: vapid.publicKey) { result in
                switch result {
                case .success(let n):
                    if n > 0 { log.info("web_subscription_keys_recorded", ["app": app, "devices": String(n)]) }
                case .failure(let error):
                    log.warning("web_subscription_keys_not_recorded", ["app": app, "error": String(describing: error)])
                }
            }
        }
    }
}
