public import HeraldCore
import HeraldCrypto

/// The derived identifiers of the registry.
public enum Identity {
    /// hex SHA-256 of "push:" + token, as `device.list` and logs show a device's token.
    public static func tokenHash(_ token: String) -> String { SHA256.hex("push:" + token) }

    /// 32 lowercase hex chars from (user, app, registration_id).
    public static func deviceID(user: String, app: String, registrationID: String) -> String {
        String(SHA256.hex(joined(["dev:rid", user, app, registrationID])).prefix(32))
    }

    /// 32 lowercase hex chars from (user, app, platform, environment, token,
    /// app_id). A `stable` registration's id is derived as before client
    /// builds existed (without the app_id), so stored ids stay valid; any
    /// other build's under its own prefix, so no two tuples share an id.
    public static func deviceID(
        user: String, app: String, platform: Platform, environment: APNsEnvironment?, token: String,
        appID: String = ClientBuild.defaultAppID
    ) -> String {
        let fields =
            appID == ClientBuild.defaultAppID
            ? ["dev:bind", user, app, platform.rawValue, environment?.rawValue ?? "", token]
            : ["dev:bind:build", user, app, platform.rawValue, environment?.rawValue ?? "", token, appID]
        return String(SHA256.hex(joined(fields)).prefix(32))
    }

    /// The lookup key of a binding (app, platform, environment, token,
    /// app_id); as for ``deviceID``, a `stable` one is derived as before.
    static func bindingHash(
        app: String, platform: Platform, environment: APNsEnvironment?, token: String,
        appID: String = ClientBuild.defaultAppID
    ) -> [UInt8] {
        let fields =
            appID == ClientBuild.defaultAppID
            ? ["bind", app, platform.rawValue, environment?.rawValue ?? "", token]
            : ["bind:build", app, platform.rawValue, environment?.rawValue ?? "", token, appID]
        return SHA256.hash(joined(fields))
    }

    /// Sessions are stored only as SHA-256 of "sess:" + session.
    static func sessionHash(_ session: String) -> [UInt8] { SHA256.hash(Array(("sess:" + session).utf8)) }

    /// The associated data that binds a sealed token to its device row.
    static func tokenContext(_ deviceID: String) -> [UInt8] { Array("token:\(deviceID)".utf8) }

    /// The associated data that binds sealed Web Push keys to their device row.
    static func keysContext(_ deviceID: String) -> [UInt8] { Array("keys:\(deviceID)".utf8) }

    /// The associated data that binds a message's sealed `web_payload` to its message row.
    static func webPayloadContext(_ messageID: String) -> [UInt8] { Array("web:\(messageID)".utf8) }

    /// Fields joined with NUL so that no two different tuples share an encoding.
    private static func joined(_ fields: [String]) -> [UInt8] {
        var out: [UInt8] = []
        for (i, field) in fields.enumerated() {
            if i > 0 { out.append(0) }
            out.append(contentsOf: field.utf8)
        }
        return out
    }
}
