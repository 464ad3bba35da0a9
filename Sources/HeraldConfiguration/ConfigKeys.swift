import Glibc
import HeraldCore
import HeraldIO
import HeraldNet
import Postgres

/// One configuration key, declared once: its section, the kind of value it
/// takes (with its bounds), its documented default, whether a reload applies
/// it, the line the example config shows for it, how a value is put into the
/// configuration and how the effective configuration prints it. The parser,
/// the effective-config printer, the reload check and the documentation
/// tests all read ``ConfigKeys/all``.
struct ConfigKey {
    enum Section: String, CaseIterable, Sendable {
        case server, store, delivery, endpoints, metrics
        /// Every `[app.NAME]` section.
        case app
    }

    /// Whether `SIGHUP` puts a new value into effect.
    enum Reload: Sendable {
        case live
        /// Bound at startup: a reload that changes it logs `reload_needs_restart`.
        case restart
    }

    /// What the value may be; the bounds given here are the parser's.
    enum Kind {
        case integer(ClosedRange<Int>)
        /// Seconds with up to three decimals; bounds in milliseconds.
        case seconds(ClosedRange<Int64>)
        case boolean
        case ratio
        case octalMode
        case absolutePath
        /// A file name or path, resolved like the credential files.
        case file
        case choice([String])
        case url
        case listenAddress
        case ids
        /// Checked by the key's own rule (its doc line says which).
        case text

        /// The bounds as docs/configuration.md writes them ("1–1000").
        var documentedBounds: String? {
            switch self {
            case .integer(let r): return "\(r.lowerBound)–\(r.upperBound)"
            case .seconds(let r):
                return
                    "\(ConfigValue.seconds(.milliseconds(r.lowerBound)))–\(ConfigValue.seconds(.milliseconds(r.upperBound)))"
            case .choice(let names): return names.map { "`\($0)`" }.joined(separator: ", ")
            default: return nil
            }
        }
    }

    /// How the effective configuration reads the key's value.
    enum Show {
        case global((HeraldConfig) -> String)
        case app((AppConfig) -> String)
    }

    typealias Apply = (inout ConfigInterpreter, String, ConfigLocation) throws(ConfigValueProblem) -> Void

    let section: Section
    let name: String
    let kind: Kind
    /// The default as the docs write it; empty when the default is "none".
    let defaultValue: String
    let reload: Reload
    /// Only with this store backend; empty means its default then.
    let backend: HeraldConfig.Store.Backend?
    /// The example config's comment for the key.
    let doc: String
    let apply: Apply
    let show: Show

    /// `[section] key`, as reload logs and errors name it.
    var qualifiedName: String { "\(section.rawValue).\(name)" }

    func value(in config: HeraldConfig, app: AppConfig? = nil) -> String {
        switch show {
        case .global(let read): return read(config)
        case .app(let read): return app.map(read) ?? ""
        }
    }
}

enum ConfigKeys {
    /// Every key, in the order of the example config and the effective configuration.
    static var all: [ConfigKey] { server + store + delivery + endpoints + metrics + app }

    static func keys(of section: ConfigKey.Section) -> [ConfigKey] {
        all.filter { $0.section == section }
    }

    static func find(_ section: ConfigKey.Section, _ name: String) -> ConfigKey? {
        all.first { $0.section == section && $0.name == name }
    }

    // MARK: Builders

    private typealias Key = ConfigKey

    private static func integer(
        _ section: Key.Section, _ name: String, _ path: WritableKeyPath<HeraldConfig, Int>, _ range: ClosedRange<Int>,
        default value: Int, reload: Key.Reload = .restart, backend: HeraldConfig.Store.Backend? = nil, doc: String
    ) -> Key {
        Key(
            section: section, name: name, kind: .integer(range), defaultValue: String(value), reload: reload,
            backend: backend, doc: doc,
            apply: { i, text, _ throws(ConfigValueProblem) in
                i.config[keyPath: path] = try ConfigValue.integer(text, range)
            },
            show: .global { backend == nil || $0.store.backend == backend ? String($0[keyPath: path]) : "" })
    }

    private static func milliseconds(
        _ section: Key.Section, _ name: String, _ path: WritableKeyPath<HeraldConfig, Duration>,
        _ range: ClosedRange<Int>, default value: Int, doc: String
    ) -> Key {
        Key(
            section: section, name: name, kind: .integer(range), defaultValue: String(value), reload: .restart,
            backend: nil, doc: doc,
            apply: { i, text, _ throws(ConfigValueProblem) in
                i.config[keyPath: path] = .milliseconds(try ConfigValue.integer(text, range))
            },
            show: .global { String(ConfigValue.milliseconds($0[keyPath: path])) })
    }

    private static func seconds(
        _ section: Key.Section, _ name: String, _ path: WritableKeyPath<HeraldConfig, Duration>,
        _ range: ClosedRange<Int64>, default value: String, backend: HeraldConfig.Store.Backend? = nil, doc: String
    ) -> Key {
        Key(
            section: section, name: name, kind: .seconds(range), defaultValue: value, reload: .restart,
            backend: backend, doc: doc,
            apply: { i, text, _ throws(ConfigValueProblem) in
                i.config[keyPath: path] = try ConfigValue.seconds(text, range)
            },
            show: .global {
                backend == nil || $0.store.backend == backend ? ConfigValue.seconds($0[keyPath: path]) : ""
            })
    }

    private static func endpoint(
        _ name: String, _ path: WritableKeyPath<HeraldConfig, HTTPURL>, default value: String, doc: String
    ) -> Key {
        Key(
            section: .endpoints, name: name, kind: .url, defaultValue: value, reload: .restart, backend: nil, doc: doc,
            apply: { i, text, _ throws(ConfigValueProblem) in
                i.config[keyPath: path] = try ConfigValue.providerURL(text)
            },
            show: .global { $0[keyPath: path].description })
    }

    private static func app(
        _ name: String, _ kind: Key.Kind, default value: String = "", doc: String,
        _ apply:
            @escaping (inout AppConfig, String, ConfigLocation, ConfigInterpreter) throws(ConfigValueProblem) -> Void,
        show: @escaping (AppConfig) -> String
    ) -> Key {
        Key(
            section: .app, name: name, kind: kind, defaultValue: value, reload: .live, backend: nil, doc: doc,
            apply: { i, text, location throws(ConfigValueProblem) in
                let appName = String(location.section.dropFirst(4))
                var app = i.config.apps[appName]!
                try apply(&app, text, location, i)
                i.config.apps[appName] = app
            },
            show: .app(show))
    }

    // MARK: [server]

    private static var server: [Key] {
        [
            Key(
                section: .server, name: "socket", kind: .absolutePath, defaultValue: "/run/herald/herald.sock",
                reload: .restart, backend: nil,
                doc: "Unix socket path (max 107 bytes); ignored when systemd passes the socket",
                apply: { i, text, _ throws(ConfigValueProblem) in
                    let path = try ConfigValue.absolutePath(text)
                    guard path.utf8.count <= 107 else {
                        throw ConfigValueProblem("a socket path may be at most 107 bytes long")
                    }
                    i.config.server.socketPath = path
                },
                show: .global { $0.server.socketPath }),
            Key(
                section: .server, name: "socket_mode", kind: .octalMode, defaultValue: "0660", reload: .restart,
                backend: nil, doc: "octal permissions of the socket Herald creates",
                apply: { i, text, _ throws(ConfigValueProblem) in
                    i.config.server.socketMode = try ConfigValue.octalMode(text)
                },
                show: .global { ConfigValue.octal($0.server.socketMode) }),
            Key(
                section: .server, name: "state_dir", kind: .absolutePath, defaultValue: "/var/lib/herald",
                reload: .restart, backend: nil, doc: "absolute; herald.db lives here",
                apply: { i, text, _ throws(ConfigValueProblem) in
                    i.config.server.stateDirectory = try ConfigValue.absolutePath(text)
                },
                show: .global { $0.server.stateDirectory }),
            integer(
                .server, "max_inflight", \.server.maxInflight, 1...1_000_000, default: 2000,
                doc: "sends in flight at once, all transports (1-1000000)"),
            Key(
                section: .server, name: "log_level", kind: .choice(["error", "warning", "info", "debug"]),
                defaultValue: "info", reload: .live, backend: nil, doc: "error | warning | info | debug",
                apply: { i, text, _ throws(ConfigValueProblem) in
                    guard let level = LogLevel(name: text.lowercased()) else {
                        throw ConfigValueProblem("must be one of error, warning, info, debug \(ConfigValue.got(text))")
                    }
                    i.config.server.logLevel = level
                },
                show: .global { ConfigValue.name(of: $0.server.logLevel) }),
            integer(
                .server, "max_batch", \.server.maxBatch, 1...100_000, default: 1000,
                doc: "calls in one JSON-RPC batch; a larger one is refused whole (1-100000)"),
            integer(
                .server, "max_reply_bytes", \.server.maxReplyBytes, 65536...(1 << 30), default: 16 * 1024 * 1024,
                doc: "answers owed to one connection before more are 1007 overloaded (65536-1073741824)"),
            integer(
                .server, "event_buffer_bytes", \.server.eventBufferBytes, 65536...(64 << 20), default: 1 << 20,
                doc: "events one events.subscribe connection may have waiting before it skips ahead with a gap "
                    + "event (65536-67108864)"),
            integer(
                .server, "max_connections_per_uid", \.server.maxConnectionsPerUID, 1...512, default: 64,
                doc: "client connections one peer uid may hold (1-512; 512 in all)"),
            integer(
                .server, "system_calls_per_minute", \.server.systemCallsPerMinute, 1...1_000_000, default: 6000,
                doc:
                    "system.stats/metrics calls one peer uid may make a minute, paced at 1/30 of it a second; system.health 50 times it (1-1000000)"
            ),
            integer(
                .server, "max_uid_bytes", \.server.maxUIDBytes, (1 << 20)...(1 << 36), default: 128 * 1024 * 1024,
                doc:
                    "answers owed and decoded calls one peer uid's connections may hold together; past it they wait (1048576-68719476736)"
            ),
            integer(
                .server, "max_client_bytes", \.server.maxClientBytes, (1 << 20)...(1 << 36), default: 384 * 1024 * 1024,
                doc:
                    "the same for every connection together; held past it for 1 s, the largest connection is closed (1048576-68719476736)"
            ),
            Key(
                section: .server, name: "request_timeout_ms", kind: .integer(100...3_600_000), defaultValue: "10000",
                reload: .restart, backend: nil,
                doc: "a message must be complete this long after its first byte (100-3600000)",
                apply: { i, text, _ throws(ConfigValueProblem) in
                    i.config.server.requestTimeoutMs = Int64(try ConfigValue.integer(text, 100...3_600_000))
                },
                show: .global { String($0.server.requestTimeoutMs) }),
            Key(
                section: .server, name: "instance_id", kind: .text, defaultValue: "", reload: .restart, backend: nil,
                doc:
                    "this Herald's name in push.status (sent_by), stats and metrics, unique among the instances of one "
                    + "database; empty: the host name and a digest of the socket path",
                apply: { i, text, _ throws(ConfigValueProblem) in
                    guard text.isEmpty || InstanceName.isValid(text) else {
                        throw ConfigValueProblem(
                            "must be 1-64 characters of A-Z a-z 0-9 . _ - (empty: the host name and a socket digest)")
                    }
                    i.config.server.instanceID = text.isEmpty ? nil : text
                },
                show: .global { $0.server.instanceID ?? "" }),
        ]
    }

    // MARK: [store]

    private static var store: [Key] {
        [
            Key(
                section: .store, name: "key", kind: .file, defaultValue: HeraldConfig.Store.defaultKeyName,
                reload: .restart, backend: nil,
                doc: "32-byte sealing key; created (0600) if absent; a relative path is under state_dir",
                apply: { i, text, location throws(ConfigValueProblem) in
                    guard !text.isEmpty else {
                        throw ConfigValueProblem("must name the store key file (default store.key)")
                    }
                    try ConfigValue.checkFileName(text)
                    i.storeKey = (text, location)
                },
                show: .global { $0.store.key.path }),
            Key(
                section: .store, name: "backend", kind: .choice(["sqlite", "postgres"]), defaultValue: "sqlite",
                reload: .restart, backend: nil,
                doc: "sqlite (herald.db in state_dir, one host) | postgres (one database shared by several instances)",
                apply: { i, text, location throws(ConfigValueProblem) in
                    guard let backend = HeraldConfig.Store.Backend(rawValue: text.lowercased()) else {
                        throw ConfigValueProblem("must be sqlite or postgres \(ConfigValue.got(text))")
                    }
                    i.config.store.backend = backend
                    i.storeBackendLocation = location
                },
                show: .global { $0.store.backend.rawValue }),
            Key(
                section: .store, name: "synchronous", kind: .choice(["full", "normal"]), defaultValue: "full",
                reload: .restart, backend: .sqlite,
                doc: "full | normal (SQLite synchronous pragma); backend = sqlite only",
                apply: { i, text, _ throws(ConfigValueProblem) in
                    guard let mode = HeraldConfig.Store.Synchronous(rawValue: text.lowercased()) else {
                        throw ConfigValueProblem("must be full or normal \(ConfigValue.got(text))")
                    }
                    i.config.store.synchronous = mode
                },
                show: .global { $0.store.backend == .sqlite ? $0.store.synchronous.rawValue : "" }),
            Key(
                section: .store, name: "dsn", kind: .text, defaultValue: "", reload: .restart, backend: .postgres,
                doc:
                    "postgres only, required: libpq connection string without a password, e.g. host=/run/postgresql dbname=herald user=herald",
                apply: { i, text, _ throws(ConfigValueProblem) in
                    do throws(PostgresError) {
                        _ = try PostgresConfiguration(dsn: text)
                    } catch {
                        // The reason only: the string may hold what libpq could not parse.
                        throw ConfigValueProblem(
                            "must be a libpq connection string without a password: \(error.message)")
                    }
                    i.config.store.dsn = text
                },
                show: .global { $0.store.dsn.map(PostgresConfiguration.redacted) ?? "" }),
            Key(
                section: .store, name: "password_file", kind: .file, defaultValue: "", reload: .restart,
                backend: .postgres,
                doc:
                    "postgres only: file holding the database password (0600; a bare name may be a systemd credential)",
                apply: { i, text, location throws(ConfigValueProblem) in
                    i.config.store.passwordFile = try i.fileReference(text, location)
                },
                show: .global { $0.store.passwordFile?.path ?? "" }),
            integer(
                .store, "pool_size", \.store.poolSize, 1...64, default: 8, backend: .postgres,
                doc: "postgres only: database connections of this instance (1-64; empty: 8)"),
            seconds(
                .store, "lease", \.store.lease, 2000...600_000, default: "30", backend: .postgres,
                doc:
                    "postgres only: seconds a claimed delivery stays this instance's without a renewal (2-600; empty: 30)"
            ),
            seconds(
                .store, "lease_max_age", \.store.leaseMaxAge, 10_000...86_400_000, default: "600", backend: .postgres,
                doc:
                    "postgres only: seconds a delivery may stay in flight after its claim, renewed or not; past it any "
                    + "instance takes it back (10-86400, at least lease; empty: 600)"),
            seconds(
                .store, "call_timeout", \.store.callTimeout, 1000...120_000, default: "5", backend: .postgres,
                doc:
                    "postgres only: seconds a call waits for the database before it answers store_unavailable "
                    + "(1-120; empty: 5)"),
        ]
    }

    // MARK: [delivery]

    private static var delivery: [Key] {
        [
            integer(
                .delivery, "max_retries", \.delivery.maxRetries, 0...100, default: 5,
                doc: "retries of a transient failure (0-100)"),
            milliseconds(
                .delivery, "backoff_base_ms", \.delivery.backoffBase, 1...3_600_000, default: 1000,
                doc: "first retry delay before jitter (1-3600000)"),
            milliseconds(
                .delivery, "backoff_max_ms", \.delivery.backoffMax, 1...86_400_000, default: 300_000,
                doc: "cap on the retry delay, >= backoff_base_ms (1-86400000)"),
            integer(
                .delivery, "stale_window_cap", \.delivery.staleWindowCap, 0...1_000_000, default: 500,
                doc: "stale deletions per platform per 60 s (0-1000000)"),
            Key(
                section: .delivery, name: "stale_batch_ratio", kind: .ratio, defaultValue: "0.5", reload: .restart,
                backend: nil, doc: "refuse deletions when >= this share of a batch... (0 < r <= 1)",
                apply: { i, text, _ throws(ConfigValueProblem) in
                    i.config.delivery.staleBatchRatio = try ConfigValue.ratio(text)
                },
                show: .global { "\($0.delivery.staleBatchRatio)" }),
            integer(
                .delivery, "stale_batch_min", \.delivery.staleBatchMin, 1...1_000_000, default: 4,
                doc: "...of at least this many devices is stale (1-1000000)"),
            integer(
                .delivery, "max_queued", \.delivery.maxQueued, 1...100_000_000, default: 1_000_000,
                doc: "deliveries waiting or in flight before push.send answers overloaded (1-100000000)"),
            seconds(
                .delivery, "ping_timeout", \.delivery.pingTimeout, 100...300_000, default: "5",
                doc:
                    "s (decimals allowed, 0.1-300): after a request times out on a provider connection, its PING must be answered within this or the connection is replaced"
            ),
            integer(
                .delivery, "webpush_origin_inflight", \.delivery.webPushOriginInflight, 1...100_000, default: 200,
                doc: "Web Push sends in flight to one push service origin, every app together (1-100000)"),
            integer(
                .delivery, "webpush_origin_timeouts", \.delivery.webPushOriginTimeouts, 1...10_000, default: 5,
                doc: "Web Push timeouts in a row that make an origin unresponsive: one probe at a time (1-10000)"),
            seconds(
                .delivery, "webpush_connect_timeout", \.delivery.webPushConnectTimeout, 100...300_000, default: "5",
                doc: "s (decimals allowed, 0.1-300): a Web Push connection's TCP connect and TLS handshake"),
            seconds(
                .delivery, "webpush_timeout", \.delivery.webPushTimeout, 100...300_000, default: "15",
                doc: "s (decimals allowed, 0.1-300): a whole Web Push request, waiting and connecting included"),
            seconds(
                .delivery, "event_retention", \.delivery.eventRetention, 60_000...2_592_000_000, default: "86400",
                doc: "s (60-2592000): how long events are kept for events.subscribe's since"),
            Key(
                section: .delivery, name: "credential_check_interval", kind: .seconds(0...86_400_000),
                defaultValue: "900", reload: .live, backend: nil,
                doc:
                    "s between checks of each app's credentials (also at start and reload); 0: only then (0 or 10-86400)",
                apply: { i, text, _ throws(ConfigValueProblem) in
                    let interval = try ConfigValue.seconds(text, 0...86_400_000)
                    guard interval == .zero || interval >= .seconds(10) else {
                        throw ConfigValueProblem(
                            "must be 0 (no periodic checks) or from 10 to 86400 seconds (got \(text))")
                    }
                    i.config.delivery.credentialCheckInterval = interval
                },
                show: .global { ConfigValue.seconds($0.delivery.credentialCheckInterval) }),
        ]
    }

    // MARK: [endpoints] and [metrics]

    private static var endpoints: [Key] {
        [
            endpoint(
                "apns_production", \.endpoints.apnsProduction, default: "https://api.push.apple.com",
                doc: "https://, or http:// to a loopback host"),
            endpoint(
                "apns_development", \.endpoints.apnsDevelopment, default: "https://api.sandbox.push.apple.com", doc: ""),
            endpoint("fcm", \.endpoints.fcm, default: "https://fcm.googleapis.com", doc: ""),
            endpoint(
                "apns_manage_production", \.endpoints.apnsManageProduction,
                default: "https://api-manage-broadcast.push.apple.com:2196",
                doc: "APNs channel management (broadcast channels), production"),
            endpoint(
                "apns_manage_development", \.endpoints.apnsManageDevelopment,
                default: "https://api-manage-broadcast.sandbox.push.apple.com:2195",
                doc: "APNs channel management, development"),
            Key(
                section: .endpoints, name: "ca_file", kind: .file, defaultValue: "", reload: .restart, backend: nil,
                doc: "extra CA bundle trusted for all providers (empty: system CAs only)",
                apply: { i, text, location throws(ConfigValueProblem) in
                    i.config.endpoints.caFile = try i.fileReference(text, location)
                },
                show: .global { $0.endpoints.caFile?.path ?? "" }),
            Key(
                section: .endpoints, name: "webpush_allow_private", kind: .boolean, defaultValue: "false",
                reload: .restart, backend: nil,
                doc: "true only for tests against loopback (a warning at every start while on)",
                apply: { i, text, _ throws(ConfigValueProblem) in
                    i.config.endpoints.webPushAllowPrivate = try ConfigValue.boolean(text)
                },
                show: .global { "\($0.endpoints.webPushAllowPrivate)" }),
        ]
    }

    private static var metrics: [Key] {
        [
            Key(
                section: .metrics, name: "listen", kind: .listenAddress, defaultValue: "", reload: .restart,
                backend: nil,
                doc: "IP:port, e.g. 127.0.0.1:9464 or [::1]:9464; serves /metrics, /livez, /readyz; empty: off",
                apply: { i, text, _ throws(ConfigValueProblem) in
                    i.config.metrics.listen = text.isEmpty ? nil : try ListenAddress.parse(text)
                },
                show: .global { $0.metrics.listen?.description ?? "" }),
            Key(
                section: .metrics, name: "app_figures", kind: .boolean, defaultValue: "false", reload: .restart,
                backend: nil,
                doc: "true: /metrics shows each app's transport states (app label); false: counts over the apps",
                apply: { i, text, _ throws(ConfigValueProblem) in
                    i.config.metrics.appFigures = try ConfigValue.boolean(text)
                },
                show: .global { "\($0.metrics.appFigures)" }),
            Key(
                section: .metrics, name: "bearer_token_file", kind: .file, defaultValue: "", reload: .restart,
                backend: nil,
                doc: "file (0600) holding a token /metrics requires as Authorization: Bearer; empty: none",
                apply: { i, text, location throws(ConfigValueProblem) in
                    i.config.metrics.bearerTokenFile = try i.fileReference(text, location)
                },
                show: .global { $0.metrics.bearerTokenFile?.path ?? "" }),
        ]
    }

    // MARK: [app.NAME]

    private static var app: [Key] {
        [
            app(
                "allow_uids", .ids,
                doc: "comma-separated uids; with allow_gids empty too: any peer that can open the socket",
                { a, text, _, _ throws(ConfigValueProblem) in a.allowUIDs = try ConfigValue.ids(text, what: "uids") },
                show: { $0.allowUIDs.map(String.init).joined(separator: ", ") }),
            app(
                "allow_gids", .ids, doc: "comma-separated gids (the peer's primary gid)",
                { a, text, _, _ throws(ConfigValueProblem) in a.allowGIDs = try ConfigValue.ids(text, what: "gids") },
                show: { $0.allowGIDs.map(String.init).joined(separator: ", ") }),
            app(
                "device_cap", .integer(1...1000), default: "20",
                doc: "devices per user (1-1000); the least recently registered is evicted",
                { a, text, _, _ throws(ConfigValueProblem) in a.deviceCap = try ConfigValue.integer(text, 1...1000) },
                show: { String($0.deviceCap) }),
            app(
                "apns_key", .file, doc: "APNs .p8 signing key file (0600), e.g. apns.p8; empty: APNs disabled",
                { a, text, location, i throws(ConfigValueProblem) in a.apnsKey = try i.fileReference(text, location) },
                show: { $0.apnsKey?.path ?? "" }),
            app(
                "apns_key_id", .text, doc: "10-character key ID from Apple, e.g. ABC123DEFG (required with apns_key)",
                { a, text, _, _ throws(ConfigValueProblem) in
                    a.apnsKeyID = try ConfigValue.appleID(text, what: "the 10-character key ID")
                },
                show: { $0.apnsKeyID ?? "" }),
            app(
                "apns_team_id", .text, doc: "10-character team ID, e.g. TEAM123456 (required with apns_key)",
                { a, text, _, _ throws(ConfigValueProblem) in
                    a.apnsTeamID = try ConfigValue.appleID(text, what: "the 10-character team ID")
                },
                show: { $0.apnsTeamID ?? "" }),
            app(
                "apns_topic", .text, doc: "the app's bundle ID, e.g. com.example.app (required with apns_key)",
                { a, text, _, _ throws(ConfigValueProblem) in a.apnsTopic = try ConfigValue.bundleID(text) },
                show: { $0.apnsTopic ?? "" }),
            app(
                "fcm_credentials", .file, doc: "service-account JSON file (0600), e.g. fcm.json; empty: FCM disabled",
                { a, text, location, i throws(ConfigValueProblem) in
                    a.fcmCredentials = try i.fileReference(text, location)
                },
                show: { $0.fcmCredentials?.path ?? "" }),
            app(
                "vapid_key", .file,
                doc: "VAPID key file (0600; PEM, or base64url raw 32 bytes), e.g. vapid.pem; empty: Web Push disabled",
                { a, text, location, i throws(ConfigValueProblem) in a.vapidKey = try i.fileReference(text, location) },
                show: { $0.vapidKey?.path ?? "" }),
            app(
                "vapid_subject", .text,
                doc: "mailto: or https: contact, e.g. mailto:ops@example.com (required with vapid_key)",
                { a, text, _, _ throws(ConfigValueProblem) in a.vapidSubject = try ConfigValue.vapidSubject(text) },
                show: { $0.vapidSubject ?? "" }),
            app(
                "vapid_key_previous", .file,
                doc: "VAPID key file used before vapid_key (rotation), same form; signs its subscriptions; empty: none",
                { a, text, location, i throws(ConfigValueProblem) in
                    a.vapidKeyPrevious = try i.fileReference(text, location)
                },
                show: { $0.vapidKeyPrevious?.path ?? "" }),
            app(
                "alert_loc_key", .text, default: "NEW_MESSAGE",
                doc: "APNs alert loc-key the app localises",
                { a, text, _, _ throws(ConfigValueProblem) in a.alertLocKey = try ConfigValue.label(text) },
                show: { $0.alertLocKey }),
            app(
                "android_channel_id", .text, default: "new_messages",
                doc: "Android notification channel",
                { a, text, _, _ throws(ConfigValueProblem) in a.androidChannelID = try ConfigValue.label(text) },
                show: { $0.androidChannelID }),
            app(
                "apns_topics", .text,
                doc:
                    "comma-separated bundle IDs devices may register under, the first the default, e.g. com.example.app, com.example.app.dev (in place of apns_topic)",
                { a, text, _, _ throws(ConfigValueProblem) in a.apnsTopics = try ConfigValue.bundleIDs(text) },
                show: { $0.apnsTopics.joined(separator: ", ") }),
            app(
                "quiet_hours_bypass_topics", .text,
                doc:
                    "comma-separated message topics that reach a device during its quiet hours, e.g. security, urgent; empty: none",
                { a, text, _, _ throws(ConfigValueProblem) in a.quietHoursBypassTopics = try ConfigValue.topics(text) },
                show: { $0.quietHoursBypassTopics.joined(separator: ", ") }),
            app(
                "live_activity_high_per_hour", .integer(0...3600), default: "12",
                doc:
                    "Live Activity pushes a call may send at priority 10 per activity and hour (0-3600); past it they go at 5, as Apple budgets priority 10",
                { a, text, _, _ throws(ConfigValueProblem) in
                    a.liveActivityHighPerHour = try ConfigValue.integer(text, 0...3600)
                },
                show: { String($0.liveActivityHighPerHour) }),
        ]
    }
}

extension HeraldConfig {
    /// The settings of `next` that differ from this configuration but take
    /// effect only at a restart, by their qualified names (`server.socket`).
    public func restartOnlyChanges(to next: HeraldConfig) -> [String] {
        ConfigKeys.all.filter { $0.reload == .restart && $0.value(in: self) != $0.value(in: next) }
            .map(\.qualifiedName)
    }
}
