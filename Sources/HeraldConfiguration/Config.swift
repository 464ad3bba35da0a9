// `mode_t`, `uid_t` and `gid_t` appear in the public API.
public import Glibc

public import HeraldIO
import HeraldCore
public import HeraldNet
import Foundation
import Postgres

/// Herald's configuration, read from an INI file (SPEC "Process and
/// configuration"). Every key may be omitted; the defaults are the SPEC's.
/// Paths to secrets are resolved here, but no secret is read: see
/// `LoadedCredentials` and `HeraldConfig.Store.loadOrCreateKey()`.
public struct HeraldConfig: Sendable, Equatable, CustomStringConvertible {
    /// Where `herald serve` looks without `--config` or `HERALD_CONFIG`.
    public static let defaultPath = "/etc/herald/herald.conf"

    /// The config file, as an absolute path.
    public var file: String
    public var server: Server
    public var store: Store
    public var delivery: Delivery
    public var endpoints: Endpoints
    public var metrics: Metrics
    /// One entry per `[app.NAME]` section; `default` when the file has none.
    public var apps: [String: AppConfig]

    /// The configuration of an empty file at `file`.
    public init(file: String = HeraldConfig.defaultPath, environment: [String: String] = [:]) {
        let file = ConfigPath.absolute(file)
        self.file = file
        server = Server()
        delivery = Delivery()
        endpoints = Endpoints()
        metrics = Metrics()
        let resolver = SecretResolver(configFile: file, environment: environment)
        let location = ConfigLocation(file: file, line: nil, section: "store", key: "key")
        store = Store(
            key: ConfigFileReference(
                value: Store.defaultKeyName,
                path: resolver.resolve(Store.defaultKeyName, relativeTo: server.stateDirectory),
                location: location))
        apps = [AppConfig.defaultName: AppConfig(name: AppConfig.defaultName)]
    }

    /// `[server]`
    public struct Server: Sendable, Equatable {
        /// Ignored when systemd passes the socket.
        public var socketPath = "/run/herald/herald.sock"
        public var socketMode: mode_t = 0o660
        /// `herald.db` lives here; so does the store key when given as a relative path.
        public var stateDirectory = "/var/lib/herald"
        /// Sends in flight at once, all transports together.
        public var maxInflight = 2000
        public var logLevel = LogLevel.info
        /// Calls in one JSON-RPC batch; a larger batch is refused whole.
        public var maxBatch = 1000
        /// Answers owed to one connection (bytes) before more become `overloaded`.
        public var maxReplyBytes = 16 * 1024 * 1024
        /// `event_buffer_bytes`: events one `events.subscribe` connection
        /// may have waiting to be written; past it the subscriber skips ahead
        /// and is sent a `gap` event with the cursor to replay from.
        public var eventBufferBytes = 1 << 20
        /// Client connections one peer uid may hold at once (the daemon holds 512 in all).
        public var maxConnectionsPerUID = 64
        /// `system.*` calls one peer uid may make a minute (the same number at once).
        public var systemCallsPerMinute = 6000
        /// Bytes one peer uid's connections may hold together: answers owed
        /// and decoded calls not yet run.
        public var maxUIDBytes = 128 * 1024 * 1024
        /// The same for every connection together.
        public var maxClientBytes = 384 * 1024 * 1024
        /// A message must be complete this long after its first byte, else the connection is closed.
        public var requestTimeoutMs: Int64 = 10_000
        /// This instance's name (`push.status` `sent_by`, `system.stats`,
        /// metrics); nil: the host name.
        public var instanceID: String?
        /// The name this instance goes by: `instance_id`, else the host name.
        /// `instance_id`, or by default the host name and a digest of the
        /// socket path: two instances on one host differ by their sockets.
        public var instanceName: String { instanceID ?? InstanceName.default(socket: socketPath) }

        public init() {}
    }

    /// `[store]`
    public struct Store: Sendable, Equatable {
        static let defaultKeyName = "store.key"

        /// SQLite's `synchronous` pragma.
        public enum Synchronous: String, Sendable, Equatable, CaseIterable {
            case full, normal
        }

        /// Which database holds the registry and the queue.
        public enum Backend: String, Sendable, Equatable, CaseIterable {
            /// A file in `state_dir`: one Herald on one host.
            case sqlite
            /// A PostgreSQL database that several Herald instances may share.
            case postgres
        }

        /// The 32-byte sealing key; created (0600) if absent.
        public var key: ConfigFileReference
        public var backend = Backend.sqlite
        /// SQLite's `synchronous` pragma (backend sqlite only).
        public var synchronous = Synchronous.full
        /// A libpq connection string without a password (backend postgres
        /// only, and required there); checked to parse at load.
        public var dsn: String?
        /// The file holding the database password (backend postgres only);
        /// its mode is checked at startup, its contents read at each connect.
        public var passwordFile: ConfigFileReference?
        /// Database connections this instance holds (backend postgres only).
        public var poolSize = 8
        /// How long a claimed delivery stays this instance's without a
        /// renewal (backend postgres only).
        public var lease = Duration.seconds(30)
        /// PostgreSQL: the longest a delivery stays in flight after its claim, renewed or not.
        public var leaseMaxAge = Duration.seconds(600)
        /// PostgreSQL: how long a caller waits for one store call before `store_unavailable`.
        public var callTimeout = Duration.seconds(5)

        public init(key: ConfigFileReference, synchronous: Synchronous = .full) {
            self.key = key
            self.synchronous = synchronous
        }
    }

    /// `[delivery]`
    public struct Delivery: Sendable, Equatable {
        public var maxRetries = 5
        public var backoffBase = Duration.milliseconds(1000)
        public var backoffMax = Duration.milliseconds(300_000)
        /// Stale-device deletions allowed per platform in any 60 s.
        public var staleWindowCap = 500
        /// Delete none of a batch when at least this share of it is stale…
        public var staleBatchRatio = 0.5
        /// …and the batch has at least this many devices on one platform.
        public var staleBatchMin = 4
        /// Deliveries waiting or in flight before `push.send` answers `overloaded`.
        public var maxQueued = 1_000_000
        /// After a request times out on a provider connection, the PING it is
        /// sent must be answered within this, or the connection is closed and
        /// its unanswered requests go out on a new one.
        public var pingTimeout = Duration.seconds(5)
        /// Web Push sends in flight to one push service origin at once, every
        /// app's together: about what the HTTP/2 client carries to one origin
        /// at a time (2 connections of ~100 streams).
        public var webPushOriginInflight = 200
        /// Timeouts in a row that make a Web Push origin unresponsive.
        public var webPushOriginTimeouts = 5
        /// A Web Push connection's TCP connect and TLS handshake (HTTP/2: until
        /// the server's first SETTINGS).
        public var webPushConnectTimeout = Duration.seconds(5)
        /// A whole Web Push request, from its hand-off (waiting for a stream
        /// or a connection included) to its answer.
        public var webPushTimeout = Duration.seconds(15)
        /// `event_retention`: how long events are kept for `events.subscribe`'s `since`.
        public var eventRetention = Duration.seconds(86_400)
        /// How often each app's credentials are proven (besides at start and
        /// at each reload); zero: only then.
        public var credentialCheckInterval = Duration.seconds(900)

        public init() {}
    }

    /// `[endpoints]`: provider base URLs, overridable for tests and proxies.
    public struct Endpoints: Sendable, Equatable {
        public var apnsProduction = HTTPURL(origin: Origin(scheme: .https, host: "api.push.apple.com"), target: "")
        public var apnsDevelopment = HTTPURL(
            origin: Origin(scheme: .https, host: "api.sandbox.push.apple.com"), target: "")
        public var fcm = HTTPURL(origin: Origin(scheme: .https, host: "fcm.googleapis.com"), target: "")
        /// APNs' channel management (broadcast channels), production: Apple's port 2196.
        public var apnsManageProduction = HTTPURL(
            origin: Origin(scheme: .https, host: "api-manage-broadcast.push.apple.com", port: 2196), target: "")
        /// The same for the development environment (the sandbox, port 2195).
        public var apnsManageDevelopment = HTTPURL(
            origin: Origin(scheme: .https, host: "api-manage-broadcast.sandbox.push.apple.com", port: 2195), target: "")
        /// An extra CA bundle trusted for all providers.
        public var caFile: ConfigFileReference?
        /// Lets Web Push endpoints resolve to private or loopback addresses (tests only).
        public var webPushAllowPrivate = false

        public init() {}
    }

    /// `[metrics]`: the optional Prometheus HTTP listener.
    public struct Metrics: Sendable, Equatable {
        /// `IP:port` (IPv6 in brackets) to serve `/metrics`, `/livez` and `/readyz` on; nil: no listener.
        public var listen: ListenAddress?
        /// `/metrics` shows figures per app (`herald_transport_state`);
        /// false: totals over the apps only.
        public var appFigures = false
        /// The file holding the bearer token `/metrics` requires (nil: none).
        public var bearerTokenFile: ConfigFileReference?

        public init() {}
    }

    /// The config file named by `--config`, else `HERALD_CONFIG`, else the default.
    public static func path(option: String?, environment: [String: String]) -> String {
        if let option, !option.isEmpty { return option }
        if let path = environment["HERALD_CONFIG"], !path.isEmpty { return path }
        return defaultPath
    }

    /// This process's environment, for `load` and `SecretResolver`.
    public static func processEnvironment() -> [String: String] {
        ProcessInfo.processInfo.environment
    }

    /// Reads and checks the config file at `path`.
    public static func load(
        path: String, environment: [String: String] = processEnvironment()
    ) throws(ConfigError) -> HeraldConfig {
        let file = ConfigPath.absolute(path)
        let bytes: [UInt8]
        do {
            bytes = try ConfigIO.read(file, limit: 1 << 20)
        } catch {
            throw ConfigError(
                file: file, line: nil, section: nil, key: nil, message: "cannot read: \(error.reason)")
        }
        return try parse(bytes: bytes, file: file, environment: environment)
    }

    /// Checks config text as though it had been read from `file`.
    public static func parse(
        _ text: String, file: String, environment: [String: String] = [:]
    ) throws(ConfigError) -> HeraldConfig {
        try parse(bytes: Array(text.utf8), file: ConfigPath.absolute(file), environment: environment)
    }

    static func parse(
        bytes: [UInt8], file: String, environment: [String: String]
    ) throws(ConfigError) -> HeraldConfig {
        let document = try ConfigDocument.parse(bytes, file: file)
        var interpreter = ConfigInterpreter(file: file, environment: environment)
        return try interpreter.interpret(document)
    }

    /// The effective configuration as INI text (file paths, never secrets).
    public var description: String {
        var out = ""
        for section in ConfigKey.Section.allCases where section != .app {
            out += "[\(section.rawValue)]\n"
            for key in ConfigKeys.keys(of: section) { out += "\(key.name) = \(key.value(in: self))\n" }
            out += "\n"
        }
        for name in apps.keys.sorted() {
            out += "\n" + apps[name]!.description
        }
        return out
    }
}

/// One `[app.NAME]` section: who may call it, its device cap and its provider
/// credentials (as file references; `LoadedCredentials` reads them).
public struct AppConfig: Sendable, Equatable, CustomStringConvertible {
    /// The app used by calls that name none.
    public static let defaultName = "default"

    public var name: String
    /// Peer uids allowed to call this app. With `allowGIDs` also empty, any
    /// peer that can open the socket may.
    public var allowUIDs: [uid_t] = []
    /// Peer (primary, from `SO_PEERCRED`) gids allowed to call this app.
    public var allowGIDs: [gid_t] = []
    /// Devices per user; the least recently registered is evicted.
    public var deviceCap = 20
    public var apnsKey: ConfigFileReference?
    public var apnsKeyID: String?
    public var apnsTeamID: String?
    public var apnsTopic: String?
    /// Google service-account JSON.
    public var fcmCredentials: ConfigFileReference?
    /// PEM, or a base64url raw 32-byte private key.
    public var vapidKey: ConfigFileReference?
    /// `mailto:` or `https:`.
    public var vapidSubject: String?
    public var alertLocKey = "NEW_MESSAGE"
    public var androidChannelID = "new_messages"
    /// The VAPID key in use before `vapidKey` (rotation): subscriptions made
    /// under it are signed with it. Same form as `vapidKey`.
    public var vapidKeyPrevious: ConfigFileReference?
    /// The `[app.NAME]` header, when the section was written.
    public var location: ConfigLocation?
    /// `apns_topics`: the bundle ids devices may register under, the first
    /// being the default; empty when the section sets only `apns_topic`.
    public var apnsTopics: [String] = []
    /// `quiet_hours_bypass_topics`: message topics that reach a device
    /// during its quiet hours as if it had none.
    public var quietHoursBypassTopics: [String] = []
    /// `live_activity_high_per_hour`: priority-10 Live Activity pushes per
    /// activity and hour; those past it go at priority 5.
    public var liveActivityHighPerHour = 12

    public init(name: String) { self.name = name }

    /// Every bundle id a device of this app may name, the default first:
    /// `apns_topics`, else `apns_topic` alone; empty when neither is set.
    public var apnsBundleIDs: [String] {
        if !apnsTopics.isEmpty { return apnsTopics }
        return apnsTopic.map { [$0] } ?? []
    }

    /// The `apns-topic` of a device that names no bundle id (a VoIP push adds `.voip`).
    public var defaultAPNsTopic: String? { apnsBundleIDs.first }

    /// Whether a peer with this uid, primary gid and supplementary groups may call the app.
    public func allows(uid: uid_t, gid: gid_t, groups: [gid_t] = []) -> Bool {
        if allowUIDs.isEmpty && allowGIDs.isEmpty { return true }
        return allowUIDs.contains(uid) || allowGIDs.contains(gid) || groups.contains { allowGIDs.contains($0) }
    }

    /// The section as INI text (file paths, never secrets).
    public var description: String {
        var out = "[app.\(name)]\n"
        for key in ConfigKeys.keys(of: .app) { out += "\(key.name) = \(key.value(in: HeraldConfig(), app: self))\n" }
        return out + "\n"
    }
}

extension ConfigValue {
    /// A provider base URL (`[endpoints]`): `https://host[:port][/path]`, or
    /// `http://` to a loopback host (test gateways). Read with HeraldNet's URL
    /// parser, with the config's rules added: `https://` or `http://` in
    /// lowercase, no query or fragment, a host of letters, digits, dots and
    /// hyphens (or a bracketed IPv6 literal), a port of 1–65535 when a colon
    /// is written, and `http` only to a loopback host. The value is the URL's
    /// origin (host lower-cased, a default port left out) and its path, no
    /// trailing slash.
    static func providerURL(_ text: String) throws(ConfigValueProblem) -> HTTPURL {
        let problem = ConfigValueProblem(
            "must be an https:// URL (http:// only to a loopback host) \(ConfigValue.got(text))")
        guard text.hasPrefix("https://") || text.hasPrefix("http://"),
            let url = try? HTTPURL(parsing: text)
        else { throw problem }
        // The authority ends at a character that is `/`, `?` or `#` alone
        // (not one carrying a combining mark), and the path has no query,
        // fragment, whitespace or control character.
        let rest = Substring(url.target)
        if let first = rest.first, first != "/" && first != "?" && first != "#" { throw problem }
        guard rest.allSatisfy({ $0 != "?" && $0 != "#" && !$0.isWhitespace }), !ConfigValue.hasControl(rest)
        else { throw problem }
        var path = String(rest)
        while path.hasSuffix("/") { path.removeLast() }

        let host = url.host
        if url.bracketedAddress == nil {
            let allowed = host.allSatisfy {
                $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "." || $0 == "-")
            }
            guard allowed, !host.hasPrefix("."), !host.contains("..") else { throw problem }
        }
        if url.portText != nil {
            guard let written = url.port, written >= 1 else { throw problem }
        }
        let origin = url.origin
        if url.scheme == .http && !IPAddress.isLoopbackHost(origin.host) { throw problem }
        return HTTPURL(origin: origin, target: path)
    }
}

// MARK: - Interpretation

/// A numeric IP address and a TCP port to listen on: `127.0.0.1:9464`, `[::1]:9464`.
/// Port 0 lets the kernel choose (the daemon logs the port it got).
public struct ListenAddress: Sendable, Equatable, CustomStringConvertible {
    public let host: String
    public let port: Int
    public var isIPv6: Bool { host.contains(":") }

    public var description: String { isIPv6 ? "[\(host)]:\(port)" : "\(host):\(port)" }

    public init(host: String, port: Int) {
        self.host = host
        self.port = port
    }

    static func parse(_ text: String) throws(ConfigValueProblem) -> ListenAddress {
        let problem = ConfigValueProblem(
            "must be IP:port with a numeric address, e.g. 127.0.0.1:9464 or [::1]:9464 \(ConfigValue.got(text))")
        let host: Substring
        let portText: Substring
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]"), text[text.index(after: close)...].hasPrefix(":") else {
                throw problem
            }
            host = text[text.index(after: text.startIndex)..<close]
            portText = text[text.index(close, offsetBy: 2)...]
            guard IPAddress(literal: host)?.family == .v6 else { throw problem }
        } else {
            guard let colon = text.lastIndex(of: ":") else { throw problem }
            host = text[..<colon]
            portText = text[text.index(after: colon)...]
            guard IPAddress(literal: host)?.family == .v4 else { throw problem }
        }
        guard !portText.isEmpty, portText.allSatisfy(\.isASCII), portText.allSatisfy(\.isNumber),
            let port = Int(portText), (0...65535).contains(port)
        else { throw problem }
        return ListenAddress(host: String(host), port: port)
    }
}

/// Gives meaning to a parsed document, collecting every problem and throwing
/// the earliest.
struct ConfigInterpreter {
    private enum Section {
        case server, store, delivery, endpoints, metrics
        case app(String)
    }

    /// The keys of each section, from ``ConfigKeys``.
    static var sectionKeys: [String: [String]] {
        Dictionary(grouping: ConfigKeys.all, by: \.section.rawValue).mapValues { $0.map(\.name) }
    }

    let file: String
    let resolver: SecretResolver
    var config: HeraldConfig
    private var problems: [ConfigError] = []
    /// Line of each key set, by section name then key.
    private var lines: [String: [String: Int]] = [:]
    var storeKey: (value: String, location: ConfigLocation)?
    /// Where `[store] backend` was set, and the backend-specific keys given a
    /// value, checked against the backend once every key is read.
    var storeBackendLocation: ConfigLocation?
    private var backendKeys: [(backend: Store.Backend, location: ConfigLocation)] = []
    /// `[store]` keys given a value, good or not.
    private var storeKeysGiven: Set<String> = []

    init(file: String, environment: [String: String]) {
        self.file = file
        resolver = SecretResolver(configFile: file, environment: environment)
        config = HeraldConfig(file: file, environment: environment)
        config.apps = [:]
    }

    mutating func interpret(_ document: ConfigDocument) throws(ConfigError) -> HeraldConfig {
        var sections: [String: Section] = [:]
        var firstHeader: [String: Int] = [:]
        for header in document.sections {
            if let first = firstHeader[header.name] {
                problems.append(
                    ConfigError(
                        file: file, line: header.line, section: header.name, key: nil,
                        message: "section appears twice (first on line \(first))"))
                continue
            }
            firstHeader[header.name] = header.line
            guard let section = classify(header) else { continue }
            sections[header.name] = section
            if case .app(let name) = section {
                var app = AppConfig(name: name)
                app.location = ConfigLocation(
                    file: file, line: header.line, section: header.name, key: "")
                config.apps[name] = app
            }
        }

        for entry in document.entries {
            guard let section = sections[entry.section.name] else { continue }
            let location = ConfigLocation(
                file: file, line: entry.line, section: entry.section.name, key: entry.key)
            if let first = lines[entry.section.name]?[entry.key] {
                problems.append(ConfigError(location, "duplicate key (first set on line \(first))"))
                continue
            }
            lines[entry.section.name, default: [:]][entry.key] = entry.line
            do {
                try apply(entry.value, to: section, at: location)
            } catch {
                problems.append(ConfigError(location, error.message))
            }
        }

        checkCrossFields()
        if let first = ConfigError.earliest(problems) { throw first }

        let key = storeKey ?? (Store.defaultKeyName, config.store.key.location)
        config.store.key = ConfigFileReference(
            value: key.value,
            path: resolver.resolve(key.value, relativeTo: config.server.stateDirectory),
            location: key.location)
        if config.apps.isEmpty {
            config.apps[AppConfig.defaultName] = AppConfig(name: AppConfig.defaultName)
        }
        return config
    }

    private typealias Store = HeraldConfig.Store

    private mutating func classify(_ header: ConfigSectionHeader) -> Section? {
        switch header.name {
        case "server": return .server
        case "store": return .store
        case "delivery": return .delivery
        case "endpoints": return .endpoints
        case "metrics": return .metrics
        default: break
        }
        guard header.name.hasPrefix("app.") else {
            problems.append(
                ConfigError(
                    file: file, line: header.line, section: header.name, key: nil,
                    message:
                        "unknown section (expected server, store, delivery, endpoints, metrics or app.NAME)"))
            return nil
        }
        let name = String(header.name.dropFirst(4))
        let valid =
            (1...64).contains(name.utf8.count)
            && name.utf8.allSatisfy {
                (UInt8(ascii: "a")...UInt8(ascii: "z")).contains($0)
                    || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0)
                    || $0 == UInt8(ascii: "_") || $0 == UInt8(ascii: "-")
            }
        guard valid else {
            problems.append(
                ConfigError(
                    file: file, line: header.line, section: header.name, key: nil,
                    message: "app name must be 1 to 64 characters of a-z, 0-9, '_' and '-'"))
            return nil
        }
        return .app(name)
    }

    private mutating func apply(
        _ value: String, to section: Section, at location: ConfigLocation
    ) throws(ConfigValueProblem) {
        let kind: ConfigKey.Section
        switch section {
        case .server: kind = .server
        case .store: kind = .store
        case .delivery: kind = .delivery
        case .endpoints: kind = .endpoints
        case .metrics: kind = .metrics
        case .app: kind = .app
        }
        guard let key = ConfigKeys.find(kind, location.key) else {
            let keys = ConfigKeys.keys(of: kind).map(\.name).joined(separator: ", ")
            throw ConfigValueProblem("unknown key (valid keys: \(keys))")
        }
        // A backend's key written empty: the default (and how the effective
        // config of the other backend prints it).
        if key.backend != nil && value.isEmpty { return }
        if kind == .store { storeKeysGiven.insert(key.name) }
        try key.apply(&self, value, location)
        if let backend = key.backend { backendKeys.append((backend, location)) }
    }

    /// A file setting; empty means none.
    func fileReference(
        _ value: String, _ location: ConfigLocation
    ) throws(ConfigValueProblem) -> ConfigFileReference? {
        if value.isEmpty { return nil }
        try ConfigValue.checkFileName(value)
        return ConfigFileReference(
            value: value, path: resolver.resolveSecret(value), location: location)
    }

    /// Problems between keys, reported on the line of a key that is present.
    private mutating func checkCrossFields() {
        checkStoreBackend()
        let delivery = config.delivery
        if delivery.backoffMax < delivery.backoffBase {
            let key = lines["delivery"]?["backoff_max_ms"] != nil ? "backoff_max_ms" : "backoff_base_ms"
            problems.append(
                ConfigError(
                    file: file, line: lines["delivery"]?[key], section: "delivery", key: key,
                    message:
                        "backoff_max_ms (\(ConfigValue.milliseconds(delivery.backoffMax))) must not be less than backoff_base_ms (\(ConfigValue.milliseconds(delivery.backoffBase)))"
                ))
        }
        for app in config.apps.values {
            if let topic = app.apnsTopic, let first = app.apnsTopics.first, topic != first {
                let section = "app.\(app.name)"
                problems.append(
                    ConfigError(
                        file: file, line: lines[section]?["apns_topic"], section: section, key: "apns_topic",
                        message:
                            "apns_topic (\(topic)) and apns_topics (\(app.apnsTopics.joined(separator: ", "))) disagree: the default topic is the first of apns_topics; set apns_topic to it or leave apns_topic out"
                    ))
            }
            if let key = app.apnsKey {
                let missing = [
                    ("apns_key_id", app.apnsKeyID), ("apns_team_id", app.apnsTeamID),
                    ("apns_topic", app.defaultAPNsTopic),
                ].filter { $0.1 == nil }.map(\.0)
                if !missing.isEmpty {
                    problems.append(
                        ConfigError(
                            key.location,
                            "APNs also needs \(ConfigValue.list(missing)) in this section"))
                }
            }
            if let key = app.vapidKey, app.vapidSubject == nil {
                problems.append(
                    ConfigError(
                        key.location,
                        "Web Push also needs vapid_subject (mailto: or https:) in this section"))
            }
            if let previous = app.vapidKeyPrevious, app.vapidKey == nil {
                problems.append(
                    ConfigError(
                        previous.location,
                        "vapid_key_previous needs vapid_key (the current key) in this section"))
            }
        }
    }
}

extension ConfigInterpreter {
    /// The backend's own keys go with it: a postgres store needs a dsn, and
    /// neither backend takes the other's keys (a setting that would do
    /// nothing is a mistake worth reporting).
    fileprivate mutating func checkStoreBackend() {
        for (backend, location) in backendKeys where backend != config.store.backend {
            problems.append(
                ConfigError(
                    location, "only with backend = \(backend.rawValue) (this store is \(config.store.backend.rawValue))"
                ))
        }
        if config.store.backend == .postgres {
            // A dsn that was given but refused has its own error.
            if !storeKeysGiven.contains("dsn"), let location = storeBackendLocation {
                problems.append(
                    ConfigError(
                        location,
                        "backend = postgres needs dsn (a libpq connection string without a password) in this section"))
            }
        }
    }
}

/// A bad value, described in words that read after `[section] key: `.
struct ConfigValueProblem: Error {
    let message: String
    init(_ message: String) { self.message = message }
}

/// Parsers and printers for the value types the config file uses.
package enum ConfigValue {
    /// ` (got "value")`, quoted and escaped.
    static func got(_ value: String) -> String { "(got \(String(reflecting: value)))" }

    static func list(_ items: [String]) -> String {
        switch items.count {
        case 0: return ""
        case 1: return items[0]
        default: return items.dropLast().joined(separator: ", ") + " and " + items.last!
        }
    }

    static func hasControl(_ text: some StringProtocol) -> Bool {
        text.unicodeScalars.contains { $0.value < 0x20 || (0x7F...0x9F).contains($0.value) }
    }

    static func integer(_ text: String, _ range: ClosedRange<Int>) throws(ConfigValueProblem) -> Int {
        let digits = text.hasPrefix("-") ? text.dropFirst() : Substring(text)
        guard !digits.isEmpty, digits.utf8.allSatisfy({ (0x30...0x39).contains($0) }),
            let value = Int(text), range.contains(value)
        else {
            throw ConfigValueProblem(
                "must be an integer from \(range.lowerBound) to \(range.upperBound) \(got(text))")
        }
        return value
    }

    static func boolean(_ text: String) throws(ConfigValueProblem) -> Bool {
        switch text.lowercased() {
        case "true", "yes", "on", "1": return true
        case "false", "no", "off", "0": return false
        default:
            throw ConfigValueProblem("must be true or false (or yes/no, on/off, 1/0) \(got(text))")
        }
    }

    static func octalMode(_ text: String) throws(ConfigValueProblem) -> mode_t {
        guard (3...4).contains(text.utf8.count),
            text.utf8.allSatisfy({ (0x30...0x37).contains($0) }),
            let mode = mode_t(text, radix: 8), mode <= 0o777
        else { throw ConfigValueProblem("must be an octal mode such as 0660 \(got(text))") }
        return mode
    }

    package static func octal(_ mode: mode_t) -> String {
        let digits = String(mode, radix: 8)
        return String(repeating: "0", count: max(0, 4 - digits.count)) + digits
    }

    static func ratio(_ text: String) throws(ConfigValueProblem) -> Double {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        let numeric =
            (1...2).contains(parts.count)
            && parts.allSatisfy { !$0.isEmpty && $0.utf8.allSatisfy { (0x30...0x39).contains($0) } }
        guard numeric, let value = Double(text), value > 0, value <= 1 else {
            throw ConfigValueProblem(
                "must be a number greater than 0 and at most 1, such as 0.5 \(got(text))")
        }
        return value
    }

    /// Seconds with up to three decimals ("5", "0.5"), as a duration whose
    /// milliseconds lie in `range`.
    static func seconds(_ text: String, _ range: ClosedRange<Int64>) throws(ConfigValueProblem) -> Duration {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        let digits: (Substring) -> Bool = { !$0.isEmpty && $0.utf8.allSatisfy { (0x30...0x39).contains($0) } }
        func bounds() -> String {
            "from \(seconds(.milliseconds(range.lowerBound))) to \(seconds(.milliseconds(range.upperBound)))"
        }
        guard (1...2).contains(parts.count), parts.allSatisfy(digits), parts[0].utf8.count <= 9,
            parts.count == 1 || parts[1].utf8.count <= 3, let whole = Int64(parts[0])
        else {
            throw ConfigValueProblem("must be a number of seconds \(bounds()), such as 5 or 0.5 \(got(text))")
        }
        let fraction = parts.count == 2 ? Int64(parts[1].padding(toLength: 3, withPad: "0", startingAt: 0))! : 0
        let ms = whole * 1000 + fraction
        guard range.contains(ms) else {
            throw ConfigValueProblem("must be a number of seconds \(bounds()) \(got(text))")
        }
        return .milliseconds(ms)
    }

    /// `seconds`' printer: "5", "0.5", "1.25".
    static func seconds(_ duration: Duration) -> String {
        let ms = milliseconds(duration)
        guard ms % 1000 != 0 else { return String(ms / 1000) }
        var fraction = String(ms % 1000)
        fraction = String(repeating: "0", count: 3 - fraction.count) + fraction
        while fraction.hasSuffix("0") { fraction.removeLast() }
        return "\(ms / 1000).\(fraction)"
    }

    static func milliseconds(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        return seconds * 1000 + attoseconds / 1_000_000_000_000_000
    }

    static func absolutePath(_ text: String) throws(ConfigValueProblem) -> String {
        guard text.hasPrefix("/") else {
            throw ConfigValueProblem("must be an absolute path \(got(text))")
        }
        return text
    }

    /// Comma-separated numeric ids; empty for none.
    static func ids(_ text: String, what: String) throws(ConfigValueProblem) -> [UInt32] {
        if text.isEmpty { return [] }
        var ids: [UInt32] = []
        for item in text.split(separator: ",", omittingEmptySubsequences: false) {
            let item = item.trimmingCharacters(in: .whitespaces)
            guard !item.isEmpty, item.utf8.allSatisfy({ (0x30...0x39).contains($0) }),
                let id = UInt32(item), id != UInt32.max
            else {
                throw ConfigValueProblem(
                    "must be a comma-separated list of numeric \(what), or empty for anyone \(got(text))"
                )
            }
            if !ids.contains(id) { ids.append(id) }
        }
        return ids
    }

    /// Apple's 10-character key and team identifiers.
    static func appleID(_ text: String, what: String) throws(ConfigValueProblem) -> String? {
        if text.isEmpty { return nil }
        guard text.utf8.count == 10,
            text.utf8.allSatisfy({ (0x30...0x39).contains($0) || (0x41...0x5A).contains($0) })
        else {
            throw ConfigValueProblem(
                "must be \(what) from Apple (10 characters A-Z and 0-9) \(got(text))")
        }
        return text
    }

    /// `apns_topics`: comma-separated bundle IDs, each once; empty for none.
    /// A comma-separated list of message topics (each 1 to 64 bytes without
    /// spaces, commas or control characters); empty: none.
    static func topics(_ text: String) throws(ConfigValueProblem) -> [String] {
        if text.isEmpty { return [] }
        var out: [String] = []
        for item in text.split(separator: ",", omittingEmptySubsequences: false) {
            let topic = item.trimmingCharacters(in: .whitespaces)
            guard !topic.isEmpty, topic.utf8.count <= 64,
                !topic.unicodeScalars.contains(where: {
                    $0.value <= 0x20 || (0x7F...0x9F).contains($0.value) || $0.properties.isWhitespace
                })
            else {
                throw ConfigValueProblem(
                    "must be a comma-separated list of topics (1 to 64 bytes each, no spaces), such as mention, urgent \(got(text))"
                )
            }
            if out.contains(topic) { throw ConfigValueProblem("lists \(topic) twice") }
            out.append(topic)
        }
        return out
    }

    static func bundleIDs(_ text: String) throws(ConfigValueProblem) -> [String] {
        if text.isEmpty { return [] }
        var out: [String] = []
        for item in text.split(separator: ",", omittingEmptySubsequences: false) {
            let item = item.trimmingCharacters(in: .whitespaces)
            guard !item.isEmpty, let id = try? bundleID(item) else {
                throw ConfigValueProblem(
                    "must be a comma-separated list of bundle IDs, such as com.example.app, com.example.app.dev \(got(text))"
                )
            }
            if id.hasSuffix(".voip") {
                throw ConfigValueProblem(
                    "lists \(id): name the bundle ID itself; VoIP pushes add .voip themselves")
            }
            if out.contains(id) { throw ConfigValueProblem("lists \(id) twice") }
            out.append(id)
        }
        return out
    }

    /// An app's bundle ID, which APNs takes as the topic.
    static func bundleID(_ text: String) throws(ConfigValueProblem) -> String? {
        if text.isEmpty { return nil }
        let allowed = text.allSatisfy {
            $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "." || $0 == "-")
        }
        guard allowed, text.utf8.count <= 200, !text.hasPrefix("."), !text.hasSuffix(".") else {
            throw ConfigValueProblem(
                "must be the app's bundle ID, such as com.example.app \(got(text))")
        }
        return text
    }

    static func vapidSubject(_ text: String) throws(ConfigValueProblem) -> String? {
        if text.isEmpty { return nil }
        guard VAPIDSubject.isValid(text) else {
            throw ConfigValueProblem(
                "must be a mailto: or https: URL, such as mailto:ops@example.com \(got(text))")
        }
        return text
    }

    /// A non-empty identifier sent to devices (loc key, channel id).
    static func label(_ text: String) throws(ConfigValueProblem) -> String {
        guard !text.isEmpty, !hasControl(text), text.utf8.count <= 128 else {
            throw ConfigValueProblem("must be a non-empty name of at most 128 bytes \(got(text))")
        }
        return text
    }

    /// Refuses a value that looks like a key pasted in place of a file name,
    /// without repeating it.
    static func checkFileName(_ text: String) throws(ConfigValueProblem) {
        let base64 = text.utf8.allSatisfy {
            (0x30...0x39).contains($0) || (0x41...0x5A).contains($0) || (0x61...0x7A).contains($0)
                || $0 == UInt8(ascii: "-") || $0 == UInt8(ascii: "_") || $0 == UInt8(ascii: "+")
                || $0 == UInt8(ascii: "=")
        }
        let pasted =
            text.contains("-----") || text.contains("PRIVATE KEY") || text.contains("{")
            || (base64 && text.utf8.count >= 40)
        if pasted {
            throw ConfigValueProblem(
                "looks like key material rather than a file name; put the key in a file and name the file here"
            )
        }
    }

    static func name(of level: LogLevel) -> String {
        switch level {
        case .error: "error"
        case .warning: "warning"
        case .info: "info"
        case .debug: "debug"
        }
    }
}
