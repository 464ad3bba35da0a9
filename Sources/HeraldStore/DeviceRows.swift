import HeraldCore
import HeraldCrypto

/// A device row's secrets (its token and Web Push keys), sealed with the
/// store key and each bound to the device id: the one place both backends
/// seal and open them.
enum DeviceSecrets {
    /// The token and the keys (p256dh then auth, nil without keys) sealed for `deviceID`.
    static func seal(
        _ r: Registration, deviceID: String, key: StoreKey
    ) throws(CryptoError) -> (
        token: [UInt8], keys: [UInt8]?
    ) {
        let token = try key.seal(Array(r.token.utf8), context: Identity.tokenContext(deviceID))
        guard let keys = r.keys else { return (token, nil) }
        return (token, try key.seal(keys.p256dh + keys.auth, context: Identity.keysContext(deviceID)))
    }

    /// A device row's token and Web Push keys, opened with the store key;
    /// nil when either does not open (a damaged row, or one sealed under
    /// another key).
    static func open(
        token: [UInt8], keys: [UInt8]?, deviceID: String, key: StoreKey
    ) -> (
        token: String, keys: WebPushKeys?
    )? {
        guard let raw = try? key.open(token, context: Identity.tokenContext(deviceID)) else { return nil }
        guard let keys else { return (String(decoding: raw, as: UTF8.self), nil) }
        guard let pair = try? key.open(keys, context: Identity.keysContext(deviceID)) else { return nil }
        return (
            String(decoding: raw, as: UTF8.self),
            WebPushKeys(p256dh: Array(pair.prefix(65)), auth: Array(pair.dropFirst(65)))
        )
    }
}

/// One device a message goes to, as both backends read it from the registry
/// when they plan the message's deliveries.
struct DeviceTarget {
    let deviceID: String
    let user: String
    let platform: Platform
    let tokenHash: String
    let environment: APNsEnvironment?
    let tokenSealed: [UInt8]
    let keysSealed: [UInt8]?
    let registeredAt: Int64
    let bundleID: String?
    let serverKey: String?
    /// False for a device turned off by `device.update`: its delivery is skipped.
    let enabled: Bool
    /// Its time zone, quiet hours and topics, as stored.
    var preferences = StoredPreferences.none
}

/// What the registry's rules read of a device row before they change it:
/// whose it is, its binding and its registration version.
struct BindingRow {
    let deviceID: String
    let user: String
    let bindingHash: [UInt8]
    let version: Int64?
}

extension Identity {
    /// The device id a registration gets: from its registration id when it
    /// gives one, else from its binding.
    static func deviceID(for r: Registration) -> String {
        r.registrationID.map { deviceID(user: r.user, app: r.app, registrationID: $0) }
            ?? deviceID(
                user: r.user, app: r.app, platform: r.platform, environment: r.environment, token: r.token,
                appID: r.appID)
    }
}
