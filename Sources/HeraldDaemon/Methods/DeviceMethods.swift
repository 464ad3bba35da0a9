import HeraldIO
import Dispatch
import Foundation
import HeraldCore
import HeraldCrypto
import APNs
import HeraldScheduler
import HeraldStore
import HeraldJSON
import JSONRPC
import Synchronization
import WebPush
import HeraldConfiguration

// device.register, device.unregister, device.list, session.end, user.forget.
extension HeraldService {
    // MARK: device.register

    func register(_ p: inout ParamReader, _ context: CallContext, _ reply: @escaping Reply) throws(RPCError) {
        let runtime = try app(&p, context)
        let user = try user(&p)
        let platform = Platform(
            rawValue: try p.enumeration(
                "platform", required: true, allowed: Platform.allCases.filter(\.isDevicePlatform).map(\.rawValue))!)!
        var token = try p.string("token", required: true, maxBytes: 4096, content: .text)!
        var environment: APNsEnvironment?
        if let env = try p.enumeration("environment", allowed: APNsEnvironment.allCases.map(\.rawValue)) {
            guard platform.hasEnvironment else { throw p.invalid("environment", "is only for the APNs platforms") }
            environment = APNsEnvironment(rawValue: env)
        } else if platform.hasEnvironment {
            environment = .production
        }
        // The form: Web Push (an https endpoint with both keys; `web` and
        // `unified_push` always, `fcm` and `apns_voip` when keys are given)
        // or legacy (a raw vendor token, no keys).
        var keys: WebPushKeys?
        if var k = try p.object("keys") {
            guard platform.acceptsWebPushForm else {
                throw p.invalid(
                    "keys", "is not for apns (the Web Push form is for web, unified_push, fcm and apns_voip)")
            }
            keys = try Self.webKeys(&k)
            try k.finish()
            // A raw token with keys is refused at `token` by the endpoint check.
            if token.utf8.count > EndpointGuard.maximumLength {
                throw p.invalid("token", "must be at most \(EndpointGuard.maximumLength) bytes")
            }
        } else {
            if platform.requiresWebPushForm { throw p.invalid("keys", "is required for \(platform.rawValue)") }
            if platform.acceptsWebPushForm && token.contains("://") {
                throw p.invalid("keys", "is required with an endpoint URL token (the Web Push form takes both keys)")
            }
            switch platform {
            case .apns, .apnsVoIP, .apnsWidgets, .apnsLocation, .apnsPushToTalk, .apnsLiveActivity, .apnsChannel:
                token = try Self.apnsToken(token, p)
            case .fcm:
                if token.utf8.contains(where: { $0 <= 0x20 || $0 == 0x7f }) {
                    throw p.invalid("token", "must not contain whitespace or control characters")
                }
            case .web, .unifiedPush:
                break
            }
        }
        let name = try p.string("name", maxBytes: 256, allowEmpty: true)
        let appVersion = try p.string("app_version", maxBytes: 64, allowEmpty: true)
        let session = try p.string("session", maxBytes: 512)
        let registrationID = try p.string("registration_id", maxBytes: 128)
        let version = try p.int("version", range: 0...(1 << 53))
        if version != nil && registrationID == nil {
            throw p.invalid("version", "requires registration_id")
        }
        if registrationID != nil && version == nil {
            throw p.invalid("version", "is required with registration_id")
        }
        let bundleID = try Self.bundleID(&p, platform: platform, topics: runtime.config.apnsBundleIDs)
        let serverKeyText = try p.string("application_server_key", maxBytes: 128, content: .text)
        var serverKey: String?
        if keys != nil {
            serverKey = try Self.applicationServerKey(serverKeyText, vapid: runtime.credentials.webPush.value, p)
        } else if serverKeyText != nil {
            throw p.invalid(
                "application_server_key", "is only for web and the Web Push form (a registration with keys)")
        }
        let appID = try Self.appID(&p)
        let userAgent = try Self.userAgent(&p)
        let preferences = try Self.preferenceChanges(&p)
        try p.finish()
        try limit(registerLimiter, app: runtime.config.name, user: user)

        var built = Registration(
            app: runtime.config.name, user: user, platform: platform, environment: environment, token: token,
            keys: keys, name: name, appVersion: appVersion, session: session, registrationID: registrationID,
            version: version.map(Int64.init), bundleID: bundleID, serverKey: serverKey, appID: appID,
            userAgent: userAgent)
        built.preferences = preferences
        let registration = built
        let cap = runtime.config.deviceCap
        let store = self.store
        let done = finish(reply) { (o: RegistrationOutcome) -> JSON in
            [
                "device_id": .string(o.deviceID), "token_hash": .string(o.tokenHash), "created": .bool(o.created),
                "reclaimed": .bool(o.reclaimed), "evicted": .array(o.evicted.map { .string($0) }),
            ]
        }
        guard keys != nil else {
            sharedLimit(.register, app: runtime.config.name, user: user, reply) {
                store.register(registration, deviceCap: cap, completion: done)
            }
            return
        }
        // The endpoint is resolved off the loop (by the guard's asynchronous resolver, for
        // at most 2 s), then on to the store.
        let endpointGuard = self.endpointGuard
        let log = self.log
        let appName = runtime.config.name
        let checked: @Sendable (Result<CheckedEndpoint, EndpointError>) -> Void = { result in
            switch result {
            case .success(let endpoint):
                // The binding uses the normalised URL, so spellings of one endpoint are one device.
                var normalized = registration
                normalized.token = endpoint.url
                store.register(normalized, deviceCap: cap, completion: done)
            case .failure(let error):
                if case .notPubliclyRoutable(let address) = error {
                    // The operator may see what the endpoint resolved to; the caller is not told.
                    log.info("endpoint_refused", ["app": appName, "address": address])
                }
                reply(.failure(Self.endpointError(error)))
            }
        }
        sharedLimit(.register, app: runtime.config.name, user: user, reply) {
            // The daemon's guard resolves without blocking: a cached or numeric answer
            // at once, else on the resolver's thread.
            if let now = endpointGuard.check(registration.token, completion: checked) { checked(now) }
        }
    }

    /// The most bytes of an `app_id`.
    static let appIDMaxBytes = 64
    /// The most characters of a `user_agent`.
    static let userAgentMaxCharacters = 1024

    /// `app_id`: the client build, 1 to 64 of `[A-Za-z0-9._-]`; `stable` when absent.
    static func appID(_ p: inout ParamReader) throws(RPCError) -> String {
        try givenAppID(&p) ?? ClientBuild.defaultAppID
    }

    /// `app_id` as given (checked), nil when absent.
    static func givenAppID(_ p: inout ParamReader) throws(RPCError) -> String? {
        guard let given = try p.string("app_id", maxBytes: appIDMaxBytes) else { return nil }
        guard
            given.utf8.allSatisfy({
                ($0 >= 48 && $0 <= 57) || ($0 >= 65 && $0 <= 90) || ($0 >= 97 && $0 <= 122) || $0 == 46 || $0 == 95
                    || $0 == 45
            })
        else { throw p.invalid("app_id", "must be 1 to \(appIDMaxBytes) of A-Z a-z 0-9 . _ -") }
        return given
    }

    /// `user_agent`: 1 to 1024 characters, no control characters; nil when absent.
    static func userAgent(_ p: inout ParamReader) throws(RPCError) -> String? {
        guard let given = try p.string("user_agent", maxBytes: userAgentMaxCharacters * 4) else { return nil }
        guard given.unicodeScalars.count <= userAgentMaxCharacters else {
            throw p.invalid("user_agent", "must be at most \(userAgentMaxCharacters) characters")
        }
        guard !given.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7f }) else {
            throw p.invalid("user_agent", "must not contain control characters")
        }
        return given
    }

    /// `bundle_id`: for APNs platforms only, one of the app's `apns_topics`.
    /// A device of a platform with a topic of its own (`apns_voip`,
    /// `apns_widgets`, `apns_location`, `apns_pushtotalk`) may name it as
    /// the base id or as that topic (`<bundle id>.voip`, …); either is
    /// stored as the base id.
    static func bundleID(
        _ p: inout ParamReader, platform: Platform, topics: [String]
    ) throws(RPCError) -> String? {
        guard let given = try p.string("bundle_id", maxBytes: 256, content: .text) else { return nil }
        guard let suffix = platform.apnsTopicSuffix else {
            throw p.invalid("bundle_id", "is only for the APNs platforms")
        }
        if topics.contains(given) { return given }
        if !suffix.isEmpty, given.hasSuffix(suffix) {
            let base = String(given.dropLast(suffix.count))
            if topics.contains(base) { return base }
        }
        if topics.isEmpty { throw p.invalid("bundle_id", "this app configures no apns_topics") }
        let forms = suffix.isEmpty ? "" : " (or one of them with \(suffix))"
        throw p.invalid("bundle_id", "must be one of the app's apns_topics\(forms): \(topics.joined(separator: ", "))")
    }

    static func endpointError(_ error: EndpointError) -> RPCError {
        switch error {
        case .notPubliclyRoutable: RPCError(.notPubliclyRoutable)
        case .unresolvable: .invalidParams(field: "token", reason: "host does not resolve")
        case .malformed, .resolutionFailed: .invalidParams(field: "token", reason: error.description)
        }
    }

    /// APNs tokens are hex; stored lowercase so that case never splits a binding.
    static func apnsToken(_ token: String, _ p: ParamReader) throws(RPCError) -> String {
        let bytes = token.utf8
        guard bytes.count >= 16, bytes.count <= 512, bytes.count % 2 == 0,
            bytes.allSatisfy({ ($0 >= 48 && $0 <= 57) || ($0 >= 65 && $0 <= 70) || ($0 >= 97 && $0 <= 102) })
        else {
            throw p.invalid("token", "must be an even number (16 to 512) of hex digits")
        }
        return token.lowercased()
    }

    static func webKeys(_ k: inout ParamReader) throws(RPCError) -> WebPushKeys {
        let p256dhText = try k.string("p256dh", required: true, maxBytes: 128, content: .text)!
        let authText = try k.string("auth", required: true, maxBytes: 64, content: .text)!
        let p256dh: [UInt8]
        do {
            p256dh = try Base64URL.decode(p256dhText)
            try P256.checkPublicKey(p256dh)
        } catch {
            throw k.invalid("p256dh", Self.keyReason(error))
        }
        let auth: [UInt8]
        do {
            auth = try Base64URL.decode(authText)
        } catch {
            throw k.invalid("auth", Self.keyReason(error))
        }
        guard auth.count == 16 else { throw k.invalid("auth", "must be 16 bytes") }
        return WebPushKeys(p256dh: p256dh, auth: auth)
    }

    /// The VAPID public key a Web Push subscription records: the one given
    /// (the subscription's `applicationServerKey`), which must be the app's
    /// current or previous key, else the current one. Stored as the key itself
    /// in canonical base64url (as `vapid.public_key` gives it), not as "the
    /// current key": a later rotation must not move the subscription to the
    /// new key. nil only when the app has no VAPID key and none was given.
    static func applicationServerKey(
        _ text: String?, vapid: VAPIDCredentials?, _ p: ParamReader
    ) throws(RPCError) -> String? {
        guard let text else { return vapid?.publicKey }
        let canonical: String
        do {
            let raw = try Base64URL.decode(text)
            try P256.checkPublicKey(raw)
            canonical = Base64URL.encode(raw)
        } catch {
            throw p.invalid("application_server_key", Self.keyReason(error))
        }
        guard let vapid else {
            throw p.invalid("application_server_key", "web push is disabled for this app (no vapid_key)")
        }
        guard vapid.acceptedPublicKeys.contains(canonical) else {
            throw p.invalid(
                "application_server_key",
                vapid.previousPublicKey == nil
                    ? "is not the app's VAPID public key (vapid.public_key)"
                    : "is neither the app's current VAPID public key (vapid.public_key) nor its previous one")
        }
        return canonical
    }

    static func keyReason(_ error: CryptoError) -> String {
        switch error {
        case .malformedBase64: "must be base64url"
        case .publicKeyLength: "must be a 65-byte uncompressed P-256 point"
        case .publicKeyFormat: "must be an uncompressed point (0x04 prefix)"
        case .publicKeyNotOnCurve: "is not a point on P-256"
        default: error.description
        }
    }

    // MARK: device.unregister, device.list, session.end, user.forget

    func unregister(_ p: inout ParamReader, _ context: CallContext, _ reply: @escaping Reply) throws(RPCError) {
        let runtime = try app(&p, context)
        let user = try user(&p)
        let deviceID = try p.string("device_id", maxBytes: 32, content: .text)
        let platformName = try p.enumeration(
            "platform", allowed: Platform.allCases.filter(\.isDevicePlatform).map(\.rawValue))
        let token = try p.string("token", maxBytes: 4096, content: .text)
        let envName = try p.enumeration("environment", allowed: APNsEnvironment.allCases.map(\.rawValue))
        let registrationID = try p.string("registration_id", maxBytes: 128)
        let version = try p.int("version", range: 0...(1 << 53))
        let givenAppID = try Self.givenAppID(&p)
        try p.finish()
        let selector: UnregisterSelector
        let forms = [deviceID != nil, platformName != nil || token != nil, registrationID != nil || version != nil]
        guard forms.filter({ $0 }).count == 1 else {
            throw p.invalid(
                "device_id", "give exactly one of: device_id; platform and token; registration_id and version")
        }
        if version != nil && registrationID == nil { throw p.invalid("version", "requires registration_id") }
        if let deviceID {
            guard deviceID.utf8.count == 32,
                deviceID.utf8.allSatisfy({ ($0 >= 48 && $0 <= 57) || ($0 >= 97 && $0 <= 102) })
            else { throw p.invalid("device_id", "must be 32 lowercase hex characters") }
            if envName != nil { throw p.invalid("environment", "goes with platform and token") }
            if givenAppID != nil { throw p.invalid("app_id", "goes with platform and token") }
            selector = .deviceID(deviceID)
        } else if let registrationID {
            guard let version else { throw p.invalid("version", "is required with registration_id") }
            if envName != nil { throw p.invalid("environment", "goes with platform and token") }
            if givenAppID != nil { throw p.invalid("app_id", "goes with platform and token") }
            selector = .registration(id: registrationID, version: Int64(version))
        } else {
            guard let platformName, let platform = Platform(rawValue: platformName) else {
                throw p.invalid("platform", "is required with token")
            }
            guard var token else { throw p.invalid("token", "is required with platform") }
            var environment: APNsEnvironment?
            let endpoint = token.contains("://")
            if platform.hasEnvironment {
                if !endpoint || platform == .apns { token = try Self.apnsToken(token, p) }
                environment = envName.flatMap(APNsEnvironment.init(rawValue:)) ?? .production
            } else if envName != nil {
                throw p.invalid("environment", "is only for the APNs platforms")
            }
            if platform.requiresWebPushForm || (endpoint && platform.acceptsWebPushForm),
                let normalized = try? endpointGuard.normalize(token)
            {
                token = normalized
            }
            selector = .binding(
                platform: platform, environment: environment, token: token,
                appID: givenAppID ?? ClientBuild.defaultAppID)
        }
        try limit(unregisterLimiter, app: runtime.config.name, user: user)
        let store = self.store
        let app = runtime.config.name
        let done = finish(reply) { (n: Int) -> JSON in ["removed": .int(n)] }
        sharedLimit(.unregister, app: app, user: user, reply) {
            store.unregister(app: app, user: user, selector, completion: done)
        }
    }

    func list(_ p: inout ParamReader, _ context: CallContext, _ reply: @escaping Reply) throws(RPCError) {
        let runtime = try app(&p, context)
        let user = try user(&p)
        try p.finish()
        store.list(
            app: runtime.config.name, user: user,
            completion: finish(reply) { devices in
                [
                    "devices": .array(
                        devices.map { Self.deviceJSON($0, defaultBundleID: runtime.config.defaultAPNsTopic) })
                ]
            })
    }

    /// One device of `device.list`; an APNs device's `bundle_id` is its
    /// own, else the app's default topic (`defaultBundleID`).
    static func deviceJSON(_ d: DeviceSummary, defaultBundleID: String? = nil) -> JSON {
        let bundleID = d.platform.hasEnvironment ? d.bundleID ?? defaultBundleID : nil
        var o: JSONObject = [
            "device_id": .string(d.deviceID), "platform": .string(d.platform.rawValue),
            "environment": d.environment.map { .string($0.rawValue) } ?? .null,
            "name": d.name.map { .string($0) } ?? .null, "app_version": d.appVersion.map { .string($0) } ?? .null,
            "token_hash": .string(d.tokenHash), "created_at": .string(Timestamp.rfc3339(d.createdAt)),
            "registered_at": .string(Timestamp.rfc3339(d.registeredAt)),
            "last_success_at": d.lastSuccessAt.map { .string(Timestamp.rfc3339($0)) } ?? .null,
            "last_failure_at": d.lastFailureAt.map { .string(Timestamp.rfc3339($0)) } ?? .null,
            "last_failure_reason": d.lastFailureReason.map { .string($0) } ?? .null,
            "bundle_id": bundleID.map { .string($0) } ?? .null,
            "enabled": .bool(d.enabled),
            "form": .string(d.webPushForm ? "webpush" : "legacy"), "app_id": .string(d.appID),
            "user_agent": d.userAgent.map { .string($0) } ?? .null,
        ]
        preferencesJSON(d.preferences, into: &o)
        return .object(o)
    }

    func endSession(_ p: inout ParamReader, _ context: CallContext, _ reply: @escaping Reply) throws(RPCError) {
        let runtime = try app(&p, context)
        let user = try user(&p)
        let session = try p.string("session", required: true, maxBytes: 512)!
        try p.finish()
        store.endSession(
            app: runtime.config.name, user: user, session: session,
            completion: finish(reply) {
                ["removed": .int($0)]
            })
    }

    func forget(_ p: inout ParamReader, _ context: CallContext, _ reply: @escaping Reply) throws(RPCError) {
        let runtime = try app(&p, context)
        let user = try user(&p)
        try p.finish()
        store.forget(app: runtime.config.name, user: user, completion: finish(reply) { ["removed": .int($0)] })
    }

    // MARK: device.update

    /// Renames a device or turns it off and on by its id (app servers keep
    /// no raw token). With `user` the id must be that user's, as for
    /// `device.unregister`; without it, any device of the app (device ids are
    /// unique: the CLI and operators often have only the id). An id not found
    /// that way is 1003 `not_found`.
    func updateDevice(_ p: inout ParamReader, _ context: CallContext, _ reply: @escaping Reply) throws(RPCError) {
        let runtime = try app(&p, context)
        let givenUser = try p.string("user", maxBytes: 256)
        let deviceID = try p.string("device_id", required: true, maxBytes: 32, content: .text)!
        guard Self.isDeviceID(deviceID) else { throw p.invalid("device_id", "must be 32 lowercase hex characters") }
        // The limits of device.register's name.
        let name = try p.string("name", maxBytes: 256, allowEmpty: true)
        let enabled = try p.bool("enabled")
        let preferences = try Self.preferenceChanges(&p)
        try p.finish()
        if name == nil && enabled == nil && preferences.isEmpty {
            throw p.invalid("name", "give at least one of name, enabled, time_zone, quiet_hours, topics")
        }
        let app = runtime.config.name
        // As device.list shows it: an APNs device without its own bundle id has the app's default.
        let defaultBundleID = runtime.config.defaultAPNsTopic
        guard let user = givenUser else {
            // The owner first; a device removed in between is not found by the update.
            store.deviceOwner(app: app, deviceID: deviceID) { [log, self] result in
                switch result {
                case .success(let owner?):
                    update(
                        app: app, user: owner, deviceID: deviceID, name: name, enabled: enabled,
                        preferences: preferences, defaultBundleID: defaultBundleID, reply)
                case .success(nil):
                    reply(.failure(RPCError(.deviceNotFound(deviceID: deviceID))))
                case .failure(let error):
                    log.error("store_failed", ["error": String(describing: error)])
                    reply(.failure(.storeUnavailable))
                }
            }
            return
        }
        update(
            app: app, user: user, deviceID: deviceID, name: name, enabled: enabled, preferences: preferences,
            defaultBundleID: defaultBundleID, reply)
    }

    private func update(
        app: String, user: String, deviceID: String, name: String?, enabled: Bool?, preferences: PreferenceChanges,
        defaultBundleID: String?, _ reply: @escaping Reply
    ) {
        store.updateDevice(
            app: app, user: user, deviceID: deviceID, name: name, enabled: enabled, preferences: preferences
        ) { [log] result in
            switch result {
            case .success(let device?):
                // Never the name: it is the user's label, not the operator's.
                log.info(
                    "device_updated",
                    [
                        "app": app, "device": deviceID, "renamed": String(name != nil),
                        "enabled": enabled.map { String($0) } ?? "unchanged",
                        "preferences": String(!preferences.isEmpty),
                    ])
                reply(.success(["device": Self.deviceJSON(device, defaultBundleID: defaultBundleID)]))
            case .success(nil):
                reply(.failure(RPCError(.deviceNotFound(deviceID: deviceID))))
            case .failure(let error as PreferenceConflict):
                reply(.failure(.invalidParams(field: error.field, reason: error.reason)))
            case .failure(let error):
                log.error("store_failed", ["error": String(describing: error)])
                reply(.failure(.storeUnavailable))
            }
        }
    }

}
