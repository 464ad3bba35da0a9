// `P256PrivateKey`, `FCMServiceAccount` and `StoreKey` appear in the public API.
public import HeraldCrypto
import HeraldIO

#if canImport(Glibc)
    import Glibc
#endif

/// A transport's credentials: ready to use, or disabled because none are
/// configured (not an error: sends to its devices end as `skipped`).
public enum TransportCredentials<Value: Sendable>: Sendable, CustomStringConvertible {
    case ready(Value)
    case disabled(reason: String)

    public var value: Value? {
        if case .ready(let value) = self { return value }
        return nil
    }

    public var isReady: Bool { value != nil }

    /// Why the transport is disabled; nil when ready.
    public var disabledReason: String? {
        if case .disabled(let reason) = self { return reason }
        return nil
    }

    /// `ready` or `disabled (reason)`; never the credential itself.
    public var description: String {
        switch self {
        case .ready: "ready"
        case .disabled(let reason): "disabled (\(reason))"
        }
    }
}

/// What APNs needs to sign provider tokens and address pushes.
public struct APNsCredentials: Sendable, CustomStringConvertible, CustomReflectable {
    public let key: P256PrivateKey
    public let keyID: String
    public let teamID: String
    /// The default bundle ID (`apns-topic` of a device that names none; the
    /// first of `apns_topics`); `.voip` is appended for VoIP pushes.
    public let topic: String

    public var description: String {
        "APNs key \(keyID) team \(teamID) topic \(topic) (key redacted)"
    }

    public var customMirror: Mirror {
        Mirror(self, children: ["keyID": keyID, "teamID": teamID, "topic": topic])
    }
}

/// What Web Push needs to sign VAPID tokens.
public struct VAPIDCredentials: Sendable, CustomStringConvertible, CustomReflectable {
    public let key: P256PrivateKey
    /// `mailto:` or `https:`, the JWT's `sub`.
    public let subject: String
    /// The key in use before `key` (`vapid_key_previous`, key rotation):
    /// subscriptions made under it are signed with it.
    public let previous: P256PrivateKey?
    /// `key`'s public key (base64url), as `vapid.public_key` gives it.
    public let publicKey: String
    /// `previous`'s public key (base64url).
    public let previousPublicKey: String?

    public init(key: P256PrivateKey, subject: String, previous: P256PrivateKey? = nil) {
        self.key = key
        self.subject = subject
        self.previous = previous
        publicKey = key.publicKeyBase64URL
        previousPublicKey = previous?.publicKeyBase64URL
    }

    /// The public keys a Web Push subscription may be registered under: the
    /// current one, and the previous one when configured.
    public var acceptedPublicKeys: [String] { [publicKey] + (previousPublicKey.map { [$0] } ?? []) }

    public var description: String {
        "VAPID subject \(subject)\(previous == nil ? "" : " with a previous key") (keys redacted)"
    }

    public var customMirror: Mirror { Mirror(self, children: ["subject": subject]) }
}

/// One app's provider credentials, read from the files its section names and
/// checked. A transport with no credentials configured is disabled; a named
/// file that cannot be read or parsed is a startup error.
public struct LoadedCredentials: Sendable, CustomStringConvertible, CustomReflectable {
    public let app: String
    public let apns: TransportCredentials<APNsCredentials>
    public let fcm: TransportCredentials<FCMServiceAccount>
    public let webPush: TransportCredentials<VAPIDCredentials>

    /// Reads and checks the credential files of `app`.
    public init(loading app: AppConfig) throws(ConfigError) {
        self.app = app.name

        if let file = app.apnsKey {
            guard let keyID = app.apnsKeyID, let teamID = app.apnsTeamID, let topic = app.defaultAPNsTopic
            else {
                throw ConfigError(
                    file.location, "APNs also needs apns_key_id, apns_team_id and apns_topic (or apns_topics)")
            }
            let key = try Self.privateKey(file, what: "an APNs signing key (.p8 PEM)")
            apns = .ready(APNsCredentials(key: key, keyID: keyID, teamID: teamID, topic: topic))
        } else {
            apns = .disabled(reason: "no apns_key configured")
        }

        if let file = app.fcmCredentials {
            let json = try Self.readSecret(file)
            do {
                fcm = .ready(try FCMServiceAccount(json: json))
            } catch {
                throw ConfigError(
                    file.location, "\(file.path) is not a usable service-account JSON file: \(error)")
            }
        } else {
            fcm = .disabled(reason: "no fcm_credentials configured")
        }

        if let file = app.vapidKey {
            guard let subject = app.vapidSubject else {
                throw ConfigError(file.location, "Web Push also needs vapid_subject")
            }
            let key = try Self.privateKey(file, what: "a P-256 private key (PEM or base64url raw)")
            var previous: P256PrivateKey?
            if let previousFile = app.vapidKeyPrevious {
                let old = try Self.privateKey(previousFile, what: "a P-256 private key (PEM or base64url raw)")
                if old.publicKey == key.publicKey {
                    throw ConfigError(
                        previousFile.location, "vapid_key_previous holds the same key as vapid_key: drop it")
                }
                previous = old
            }
            webPush = .ready(VAPIDCredentials(key: key, subject: subject, previous: previous))
        } else {
            webPush = .disabled(reason: "no vapid_key configured")
        }
    }

    /// The credentials of every app in `config`, by app name.
    public static func load(_ config: HeraldConfig) throws(ConfigError) -> [String: LoadedCredentials] {
        var loaded: [String: LoadedCredentials] = [:]
        for name in config.apps.keys.sorted() {
            loaded[name] = try LoadedCredentials(loading: config.apps[name]!)
        }
        return loaded
    }

    /// One line per transport, e.g. `app default: apns ready, fcm disabled (…)`.
    public var description: String {
        "app \(app): apns \(apns), fcm \(fcm), webpush \(webPush)"
    }

    public var customMirror: Mirror {
        Mirror(
            self,
            children: [
                "app": app, "apns": apns.description, "fcm": fcm.description,
                "webPush": webPush.description,
            ])
    }

    /// A credential file, read into ``SecretBytes``: the key in it reaches
    /// the C core without passing through a `String` or an `Array`.
    private static func readSecret(_ file: ConfigFileReference) throws(ConfigError) -> SecretBytes {
        do {
            return try ConfigIO.readSecret(file.path, limit: 64 * 1024)
        } catch {
            throw ConfigError(file.location, "cannot read \(file.path): \(error.reason)")
        }
    }

    private static func privateKey(
        _ file: ConfigFileReference, what: String
    ) throws(ConfigError) -> P256PrivateKey {
        // The core ignores the whitespace around a key (a raw base64url key
        // is usually saved with a trailing newline).
        let text = try readSecret(file)
        do {
            return try P256PrivateKey(text: text)
        } catch {
            throw ConfigError(file.location, "\(file.path) is not \(what): \(error)")
        }
    }
}

// MARK: - Store key

extension HeraldConfig.Store {
    /// Loads the store key, creating it on first start; errors name the
    /// `[store] key` setting.
    public func loadOrCreateKey() throws(ConfigError) -> StoreKey {
        do {
            return try loadOrCreateStoreKey(path: key.path)
        } catch {
            throw ConfigError(key.location, error.description)
        }
    }

    /// Loads the store key; nil when the file does not exist (the store then
    /// decides whether one may be created: only for an empty database).
    /// Errors name the `[store] key` setting.
    public func loadKey() throws(ConfigError) -> StoreKey? {
        do {
            return try loadStoreKey(path: key.path)
        } catch {
            throw ConfigError(key.location, error.description)
        }
    }

    /// Creates the store key file (see ``createStoreKey(path:)``); errors
    /// name the `[store] key` setting.
    public func createKey() throws(ConfigError) -> StoreKey {
        do {
            return try createStoreKey(path: key.path)
        } catch {
            throw ConfigError(key.location, error.description)
        }
    }
}

/// The 32-byte store sealing key at `path`. An absent file is created with
/// fresh random bytes, mode 0600, and made durable (file and directory
/// fsync'd) before use. An existing file must hold exactly 32 bytes and grant
/// no permission to group or others. (The daemon does not create a key
/// blindly: it asks the store first, see `StoreLocation.open(keySupply:…)`.)
public func loadOrCreateStoreKey(path: String) throws(ConfigError) -> StoreKey {
    if let key = try loadStoreKey(path: path) { return key }
    return try createStoreKey(path: path)
}

/// The 32-byte store sealing key at `path`, or nil when there is no such
/// file. An existing file must be a regular file of exactly 32 bytes that
/// grants no permission to group or others.
public func loadStoreKey(path: String) throws(ConfigError) -> StoreKey? {
    // O_NONBLOCK: a FIFO in place of the key must not hang startup.
    let fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)
    guard fd >= 0 else {
        let openErrno = errno
        if openErrno == ENOENT { return nil }
        throw storeKeyFailure(path, "cannot open: \(String(cString: strerror(openErrno)))")
    }
    defer { _ = close(fd) }
    return try readStoreKey(fd) { storeKeyFailure(path, $0) }
}

/// Creates the store key at `path`: fresh random bytes written beside it,
/// mode 0600, fsync'd, linked into place (never replacing a file) and the
/// directory fsync'd. When another process created the file first, its key
/// is read instead.
public func createStoreKey(path: String) throws(ConfigError) -> StoreKey {
    for _ in 0..<2 {
        if let key = try createStoreKeyFile(path, { storeKeyFailure(path, $0) }) { return key }
        // Another process created it first: read theirs.
        if let key = try loadStoreKey(path: path) { return key }
    }
    throw storeKeyFailure(path, "cannot open or create the store key")
}

private func storeKeyFailure(_ path: String, _ message: String) -> ConfigError {
    ConfigError(file: path, line: nil, section: nil, key: nil, message: message)
}

private func readStoreKey(
    _ fd: Int32, _ failure: (String) -> ConfigError
) throws(ConfigError) -> StoreKey {
    var st = stat()
    guard fstat(fd, &st) == 0 else {
        throw failure("cannot stat: \(String(cString: strerror(errno)))")
    }
    guard st.st_mode & S_IFMT == S_IFREG else { throw failure("not a regular file") }
    let permissions = st.st_mode & 0o7777
    guard permissions & 0o077 == 0 else {
        throw failure(
            "mode \(ConfigValue.octal(permissions)) is too open: the store key must not be accessible to group or others (chmod 0600)"
        )
    }
    guard st.st_size == StoreKey.byteCount else {
        throw failure("must be exactly \(StoreKey.byteCount) bytes (found \(st.st_size))")
    }
    let bytes: SecretBytes
    do {
        bytes = try ConfigIO.readAllSecret(fd, expected: StoreKey.byteCount)
    } catch {
        throw failure("cannot read: \(error.reason)")
    }
    guard bytes.count == StoreKey.byteCount else {
        throw failure("must be exactly \(StoreKey.byteCount) bytes (found \(bytes.count))")
    }
    do {
        return try StoreKey(bytes)
    } catch {
        throw failure("unusable: \(error)")
    }
}

/// Writes a new key beside `path` and links it into place, so a crash never
/// leaves a short key file; nil when `path` appeared meanwhile.
private func createStoreKeyFile(
    _ path: String, _ failure: (String) -> ConfigError
) throws(ConfigError) -> StoreKey? {
    let bytes: SecretBytes
    do {
        bytes = try SecretBytes.random(count: StoreKey.byteCount)
    } catch {
        throw failure("cannot generate a key: \(error)")
    }

    let temporary = "\(path).\(getpid()).new"
    _ = unlink(temporary)
    let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600)
    guard fd >= 0 else {
        throw failure("cannot create: \(String(cString: strerror(errno)))")
    }
    var linked = false
    defer {
        _ = unlink(temporary)
        if linked { syncDirectory(of: path) }
    }
    do {
        defer { _ = close(fd) }
        try HeraldIO.syscall("fchmod") { fchmod(fd, 0o600) }
        try bytes.withUnsafeBytes { (raw) throws(SystemError) in try ConfigIO.writeAll(fd, raw) }
        try HeraldIO.syscall("fsync") { fsync(fd) }
    } catch {
        throw failure("cannot write \(temporary): \(String(cString: strerror(error.errno)))")
    }
    if link(temporary, path) != 0 {
        let linkErrno = errno
        if linkErrno == EEXIST { return nil }
        throw failure("cannot create: \(String(cString: strerror(linkErrno)))")
    }
    linked = true
    do {
        return try StoreKey(bytes)
    } catch {
        throw failure("unusable: \(error)")
    }
}

private func syncDirectory(of path: String) {
    let fd = open(ConfigPath.directory(of: path), O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    guard fd >= 0 else { return }
    _ = fsync(fd)
    _ = close(fd)
}

extension HeraldConfig.Metrics {
    /// `bearer_token_file`'s token (nil when unset): the file's bytes without
    /// the white space around them, which must be 16 to 4096 printable ASCII
    /// characters with no space. The file must grant nothing to group or others.
    public func loadBearerToken() throws(ConfigError) -> SecretBytes? {
        guard let file = bearerTokenFile else { return nil }
        let bytes: SecretBytes
        do {
            bytes = try ConfigIO.readSecret(file.path, limit: 4096 + 64)
        } catch {
            throw ConfigError(file.location, "cannot read \(file.path): \(error.reason)")
        }
        let span = bytes.withUnsafeBytes { raw -> Range<Int> in
            var start = 0
            var end = raw.count
            while start < end, Self.isSpace(raw[start]) { start += 1 }
            while end > start, Self.isSpace(raw[end - 1]) { end -= 1 }
            return start..<end
        }
        let printable = bytes.withUnsafeBytes { raw in raw[span].allSatisfy { $0 > 0x20 && $0 < 0x7F } }
        guard (16...4096).contains(span.count), printable else {
            throw ConfigError(
                file.location,
                "\(file.path) must hold one token of 16 to 4096 printable characters without spaces")
        }
        return SecretBytes(capacity: span.count) { (out: UnsafeMutableRawBufferPointer) -> Int in
            bytes.withUnsafeBytes { raw in out.copyMemory(from: UnsafeRawBufferPointer(rebasing: raw[span])) }
            return span.count
        }
    }

    private static func isSpace(_ byte: UInt8) -> Bool { byte == 0x20 || byte == 0x09 || byte == 0x0A || byte == 0x0D }
}
