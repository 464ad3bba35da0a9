import Foundation
import HeraldTestSupport
import HeraldCrypto
import HeraldNet
import Testing

@testable import HeraldDaemon
@testable import HeraldConfiguration

#if canImport(Glibc)
    import Glibc
#endif

@Suite("Configuration")
struct ConfigTests {
    static let file = "/etc/herald/herald.conf"

    // MARK: Defaults and every key

    @Test("an empty file gives the SPEC defaults and an app named default")
    func defaults() throws {
        let config = try HeraldConfig.parse("", file: Self.file)
        #expect(config.file == Self.file)
        #expect(config.server.socketPath == "/run/herald/herald.sock")
        #expect(config.server.socketMode == 0o660)
        #expect(config.server.stateDirectory == "/var/lib/herald")
        #expect(config.server.maxInflight == 2000)
        #expect(config.server.logLevel == .info)
        #expect(config.server.maxBatch == 1000)
        #expect(config.server.maxReplyBytes == 16 * 1024 * 1024)
        #expect(config.server.maxConnectionsPerUID == 64)
        #expect(config.server.requestTimeoutMs == 10_000)
        #expect(config.store.key.value == "store.key")
        #expect(config.store.key.path == "/var/lib/herald/store.key")
        #expect(config.store.key.location.line == nil)
        #expect(config.store.synchronous == .full)
        #expect(config.delivery.maxRetries == 5)
        #expect(config.delivery.backoffBase == .milliseconds(1000))
        #expect(config.delivery.backoffMax == .milliseconds(300_000))
        #expect(config.delivery.staleWindowCap == 500)
        #expect(config.delivery.staleBatchRatio == 0.5)
        #expect(config.delivery.staleBatchMin == 4)
        #expect(config.endpoints.apnsProduction.description == "https://api.push.apple.com")
        #expect(config.endpoints.apnsDevelopment.description == "https://api.sandbox.push.apple.com")
        #expect(config.endpoints.fcm.description == "https://fcm.googleapis.com")
        #expect(config.endpoints.fcm.effectivePort == 443)
        #expect(config.endpoints.caFile == nil)
        #expect(config.endpoints.webPushAllowPrivate == false)
        #expect(Array(config.apps.keys) == ["default"])
        let app = try #require(config.apps["default"])
        #expect(app.allowUIDs.isEmpty && app.allowGIDs.isEmpty)
        #expect(app.allows(uid: 12345, gid: 12345))
        #expect(app.deviceCap == 20)
        #expect(app.apnsKey == nil && app.apnsKeyID == nil && app.apnsTeamID == nil && app.apnsTopic == nil)
        #expect(app.fcmCredentials == nil && app.vapidKey == nil && app.vapidSubject == nil)
        #expect(app.alertLocKey == "NEW_MESSAGE")
        #expect(app.androidChannelID == "new_messages")
        #expect(config == HeraldConfig(file: Self.file))
    }

    @Test("every key is read")
    func everyKey() throws {
        let text = """
            [server]
            socket = /run/h/h.sock
            socket_mode = 0600
            state_dir = /srv/herald
            max_inflight = 64
            log_level = debug
            max_batch = 50
            max_reply_bytes = 1048576
            max_connections_per_uid = 8
            request_timeout_ms = 2500

            [store]
            key = keys/store.bin
            synchronous = normal

            [delivery]
            max_retries = 0
            backoff_base_ms = 250
            backoff_max_ms = 10000
            stale_window_cap = 0
            stale_batch_ratio = 1
            stale_batch_min = 10

            [endpoints]
            apns_production = https://APNS.Example.test:8443/proxy/
            apns_development = http://127.0.0.1:9001
            fcm = http://[::1]:9002/fcm
            ca_file = ca.pem
            webpush_allow_private = yes

            [app.chat-web_2]
            allow_uids = 1000, 1001,33
            allow_gids = 50
            device_cap = 1000
            apns_key = apns.p8
            apns_key_id = ABC123DEFG
            apns_team_id = TEAM123456
            apns_topic = com.example.app
            fcm_credentials = /opt/secrets/fcm.json
            vapid_key = sub/vapid.pem
            vapid_subject = https://example.com/contact
            alert_loc_key = NEW_MESSAGE_2
            android_channel_id = chat

            [app.default]
            """
        let config = try HeraldConfig.parse(text, file: Self.file)
        #expect(config.server.socketPath == "/run/h/h.sock")
        #expect(config.server.socketMode == 0o600)
        #expect(config.server.stateDirectory == "/srv/herald")
        #expect(config.server.maxInflight == 64)
        #expect(config.server.maxBatch == 50)
        #expect(config.server.maxReplyBytes == 1_048_576)
        #expect(config.server.maxConnectionsPerUID == 8)
        #expect(config.server.requestTimeoutMs == 2500)
        #expect(config.server.logLevel == .debug)
        #expect(config.store.key.value == "keys/store.bin")
        #expect(config.store.key.path == "/srv/herald/keys/store.bin")
        #expect(config.store.key.location.line == 13)
        #expect(config.store.synchronous == .normal)
        #expect(config.delivery.maxRetries == 0)
        #expect(config.delivery.backoffBase == .milliseconds(250))
        #expect(config.delivery.backoffMax == .seconds(10))
        #expect(config.delivery.staleWindowCap == 0)
        #expect(config.delivery.staleBatchRatio == 1)
        #expect(config.delivery.staleBatchMin == 10)
        let apns = config.endpoints.apnsProduction
        #expect(apns.scheme == .https && apns.host == "apns.example.test" && apns.port == 8443)
        #expect(apns.target == "/proxy" && apns.description == "https://apns.example.test:8443/proxy")
        #expect(config.endpoints.apnsDevelopment.description == "http://127.0.0.1:9001")
        #expect(config.endpoints.apnsDevelopment.origin.usesTLS == false)
        #expect(config.endpoints.fcm.host == "::1" && config.endpoints.fcm.port == 9002)
        #expect(config.endpoints.fcm.description == "http://[::1]:9002/fcm")
        #expect(config.endpoints.caFile?.path == "/etc/herald/ca.pem")
        #expect(config.endpoints.webPushAllowPrivate)

        #expect(Set(config.apps.keys) == ["chat-web_2", "default"])
        let app = try #require(config.apps["chat-web_2"])
        #expect(app.location?.line == 31)
        #expect(app.allowUIDs == [1000, 1001, 33])
        #expect(app.allowGIDs == [50])
        #expect(app.allows(uid: 33, gid: 1) && app.allows(uid: 7, gid: 50))
        #expect(!app.allows(uid: 7, gid: 7))
        // Supplementary groups count too (SO_PEERGROUPS).
        #expect(app.allows(uid: 7, gid: 7, groups: [3, 50]) && !app.allows(uid: 7, gid: 7, groups: [3, 4]))
        #expect(app.deviceCap == 1000)
        #expect(app.apnsKey?.path == "/etc/herald/apns.p8")
        #expect(app.apnsKey?.location.line == 35)
        #expect(app.apnsKey?.location.key == "apns_key")
        #expect(app.apnsKeyID == "ABC123DEFG")
        #expect(app.apnsTeamID == "TEAM123456")
        #expect(app.apnsTopic == "com.example.app")
        #expect(app.fcmCredentials?.path == "/opt/secrets/fcm.json")
        #expect(app.vapidKey?.path == "/etc/herald/sub/vapid.pem")
        #expect(app.vapidSubject == "https://example.com/contact")
        #expect(app.alertLocKey == "NEW_MESSAGE_2")
        #expect(app.androidChannelID == "chat")
        #expect(config.apps["default"]?.deviceCap == 20)
    }

    @Test("booleans accept true/false, yes/no, on/off and 1/0 in any case")
    func booleans() throws {
        for (text, value) in [
            ("true", true), ("FALSE", false), ("yes", true), ("No", false), ("on", true),
            ("off", false), ("1", true), ("0", false),
        ] {
            let config = try HeraldConfig.parse(
                "[endpoints]\nwebpush_allow_private = \(text)", file: Self.file)
            #expect(config.endpoints.webPushAllowPrivate == value, "\(text)")
        }
    }

    @Test("[metrics] listen takes IPv4 or bracketed IPv6 with a port, and is off when empty")
    func metricsListen() throws {
        #expect(try HeraldConfig.parse("", file: Self.file).metrics.listen == nil)
        #expect(try HeraldConfig.parse("[metrics]\nlisten =\n", file: Self.file).metrics.listen == nil)
        let v4 = try HeraldConfig.parse("[metrics]\nlisten = 127.0.0.1:9464\n", file: Self.file).metrics.listen
        #expect(v4 == ListenAddress(host: "127.0.0.1", port: 9464))
        #expect(v4?.isIPv6 == false)
        let v6 = try HeraldConfig.parse("[metrics]\nlisten = [::1]:0\n", file: Self.file).metrics.listen
        #expect(v6?.host == "::1" && v6?.port == 0 && v6?.isIPv6 == true)
        #expect(v6?.description == "[::1]:0")
        let config = try HeraldConfig.parse("[metrics]\nlisten = [::1]:9464\n", file: Self.file)
        #expect(try HeraldConfig.parse(config.description, file: Self.file).metrics == config.metrics)
    }

    @Test("the description is the effective config as INI and parses back to the same")
    func roundTrip() throws {
        let text = """
            [server]
            socket_mode = 0600
            [store]
            key = /secure/store.key
            [delivery]
            stale_batch_ratio = 0.25
            [endpoints]
            fcm = http://localhost:8080
            [app.b]
            allow_uids = 5, 6
            apns_key = /k/a.p8
            apns_key_id = ABC123DEFG
            apns_team_id = TEAM123456
            apns_topic = com.example.b
            [app.a]
            """
        let config = try HeraldConfig.parse(text, file: Self.file)
        let again = try HeraldConfig.parse(config.description, file: Self.file)
        #expect(again.description == config.description)
        #expect(again.apps["b"]?.allowUIDs == [5, 6])
        #expect(config.description.contains("[app.a]\n"))
        #expect(config.description.contains("socket_mode = 0600\n"))
    }

    // MARK: Errors name file, line and key

    @Test(
        "a bad value names the file, line and key",
        arguments: [
            ("server", "socket", "run/herald.sock", "must be an absolute path"),
            ("server", "socket", "/" + String(repeating: "s", count: 120), "at most 107 bytes"),
            ("server", "socket_mode", "abc", #"must be an octal mode such as 0660 (got "abc")"#),
            ("server", "socket_mode", "0999", "octal mode"),
            ("server", "socket_mode", "01777", "octal mode"),
            ("server", "socket_mode", "66", "octal mode"),
            ("server", "state_dir", "var/lib/herald", "absolute path"),
            ("server", "max_inflight", "0", "integer from 1 to 1000000 (got \"0\")"),
            ("server", "max_batch", "0", "integer from 1 to 100000"),
            ("server", "max_batch", "100001", "integer from 1 to 100000"),
            ("server", "max_reply_bytes", "65535", "integer from 65536 to 1073741824"),
            ("server", "max_reply_bytes", "16MiB", "integer from 65536 to 1073741824"),
            ("server", "max_connections_per_uid", "0", "integer from 1 to 512"),
            ("server", "max_connections_per_uid", "513", "integer from 1 to 512"),
            ("server", "request_timeout_ms", "99", "integer from 100 to 3600000"),
            ("server", "instance_id", "host a", "1-64 characters of A-Z a-z 0-9 . _ -"),
            ("server", "instance_id", "h\u{e9}te", "1-64 characters of A-Z a-z 0-9 . _ -"),
            ("server", "instance_id", String(repeating: "x", count: 65), "1-64 characters of A-Z a-z 0-9 . _ -"),
            ("server", "request_timeout_ms", "-1", "integer from 100 to 3600000"),
            ("server", "max_inflight", "1e3", "integer from 1 to 1000000"),
            ("server", "max_inflight", "-5", "integer from 1 to 1000000"),
            ("server", "max_inflight", "99999999999999999999999", "integer from 1 to 1000000"),
            ("server", "log_level", "verbose", "must be one of error, warning, info, debug"),
            ("store", "key", "", "must name the store key file"),
            ("store", "synchronous", "off", "must be full or normal"),
            ("delivery", "max_retries", "101", "integer from 0 to 100"),
            ("delivery", "backoff_base_ms", "0", "integer from 1 to 3600000"),
            ("delivery", "backoff_max_ms", "86400001", "integer from 1 to 86400000"),
            ("delivery", "stale_window_cap", "-1", "integer from 0 to 1000000"),
            ("delivery", "stale_batch_ratio", "0", "greater than 0 and at most 1"),
            ("delivery", "stale_batch_ratio", "1.5", "greater than 0 and at most 1"),
            ("delivery", "stale_batch_ratio", "nan", "greater than 0 and at most 1"),
            ("delivery", "stale_batch_ratio", "0.5x", "greater than 0 and at most 1"),
            ("delivery", "stale_batch_min", "0", "integer from 1 to 1000000"),
            ("endpoints", "apns_production", "http://api.push.apple.com", "http:// only to a loopback host"),
            ("endpoints", "apns_development", "ftp://example.com", "must be an https:// URL"),
            ("endpoints", "fcm", "https://", "must be an https:// URL"),
            ("endpoints", "fcm", "https://user@host", "must be an https:// URL"),
            ("endpoints", "fcm", "https://host:99999", "must be an https:// URL"),
            ("endpoints", "fcm", "https://host/a?b=c", "must be an https:// URL"),
            ("endpoints", "fcm", "http://10.0.0.1", "loopback"),
            ("endpoints", "webpush_allow_private", "maybe", "must be true or false"),
            ("metrics", "listen", "localhost:9464", "must be IP:port with a numeric address"),
            ("metrics", "listen", "127.0.0.1", "must be IP:port"),
            ("metrics", "listen", "127.0.0.1:65536", "must be IP:port"),
            ("metrics", "listen", "127.0.0.1:+80", "must be IP:port"),
            ("metrics", "listen", "::1:9464", "must be IP:port"),
            ("metrics", "listen", "[::1]9464", "must be IP:port"),
            ("metrics", "listen", "[127.0.0.1]:9464", "must be IP:port"),
            ("app.default", "device_cap", "0", "integer from 1 to 1000"),
            ("app.default", "device_cap", "1001", "integer from 1 to 1000"),
            ("app.default", "allow_uids", "root", "comma-separated list of numeric uids"),
            ("app.default", "allow_uids", "1000,,1001", "comma-separated list of numeric uids"),
            ("app.default", "allow_uids", "-1", "comma-separated list of numeric uids"),
            ("app.default", "allow_gids", "4294967295", "comma-separated list of numeric gids"),
            ("app.default", "apns_key_id", "abc123defg", "10-character key ID"),
            ("app.default", "apns_team_id", "TEAM12345", "10-character team ID"),
            ("app.default", "apns_topic", "com example app", "bundle ID"),
            ("app.default", "vapid_subject", "ops@example.com", "mailto: or https:"),
            ("app.default", "vapid_subject", "mailto:", "mailto: or https:"),
            ("app.default", "alert_loc_key", "", "non-empty name"),
            ("app.default", "android_channel_id", "", "non-empty name"),
        ])
    func badValue(section: String, key: String, value: String, message: String) throws {
        let text = "# herald\n\n[\(section)]\n\(key) = \(value)\n"
        let error = try #require(throws: ConfigError.self) {
            try HeraldConfig.parse(text, file: Self.file)
        }
        #expect(error.line == 4)
        #expect(error.section == section)
        #expect(error.key == key)
        #expect(error.description.hasPrefix("/etc/herald/herald.conf:4: [\(section)] \(key): "))
        #expect(error.description.contains(message), "\(error)")
    }

    @Test("[delivery] ping_timeout takes seconds, decimals allowed, default 5")
    func pingTimeout() throws {
        #expect(try HeraldConfig.parse("", file: Self.file).delivery.pingTimeout == .seconds(5))
        for (text, ms) in [("0.5", 500), ("5", 5000), ("0.1", 100), ("1.25", 1250), ("300", 300_000), ("2.0", 2000)] {
            let config = try HeraldConfig.parse("[delivery]\nping_timeout = \(text)\n", file: Self.file)
            #expect(config.delivery.pingTimeout == .milliseconds(ms), "\(text)")
            // The effective config prints it back as seconds.
            #expect(
                try HeraldConfig.parse(config.description, file: Self.file).delivery.pingTimeout == .milliseconds(ms))
        }
        #expect(
            try HeraldConfig.parse("[delivery]\nping_timeout = 0.5\n", file: Self.file).description.contains(
                "ping_timeout = 0.5\n"))
        for bad in ["0", "0.05", "300.001", "301", "-1", "5s", ".5", "5.", "1.2345", "1e3", "nan", ""] {
            let error = try #require(throws: ConfigError.self, "\(bad)") {
                try HeraldConfig.parse("[delivery]\nping_timeout = \(bad)\n", file: Self.file)
            }
            #expect(error.key == "ping_timeout")
            #expect(error.description.contains("must be a number of seconds from 0.1 to 300"), "\(error)")
        }
    }

    @Test("the error format is file:line: [section] key: message")
    func errorFormat() throws {
        let text =
            "[server]\nsocket = /run/herald/herald.sock\n" + String(repeating: "\n", count: 9)
            + "socket_mode = abc\n"
        let error = try #require(throws: ConfigError.self) {
            try HeraldConfig.parse(text, file: Self.file)
        }
        #expect(
            error.description
                == #"/etc/herald/herald.conf:12: [server] socket_mode: must be an octal mode such as 0660 (got "abc")"#
        )
    }

    @Test("unknown sections and keys, duplicates and keys outside a section are errors")
    func structuralErrors() throws {
        func error(_ text: String) throws -> ConfigError {
            try #require(throws: ConfigError.self) { try HeraldConfig.parse(text, file: Self.file) }
        }
        var e = try error("[server]\nsocket_mod = 0660\n")
        #expect(e.line == 2 && e.section == "server" && e.key == "socket_mod")
        #expect(e.description.contains("unknown key (valid keys: socket, socket_mode,"))

        e = try error("[server]\n\n[srever]\nsocket = /x\n")
        #expect(e.line == 3 && e.section == "srever" && e.key == nil)
        #expect(e.description.hasPrefix("/etc/herald/herald.conf:3: [srever]: unknown section"))

        e = try error("[delivery]\nmax_retries = 3\n; again\nmax_retries = 4\n")
        #expect(e.line == 4 && e.key == "max_retries")
        #expect(e.message == "duplicate key (first set on line 2)")

        e = try error("[store]\n[server]\n[store]\n")
        #expect(e.line == 3 && e.message == "section appears twice (first on line 1)")

        e = try error("socket = /run/x.sock\n[server]\n")
        #expect(e.line == 1 && e.key == "socket" && e.section == nil)
        #expect(e.description.hasPrefix("/etc/herald/herald.conf:1: socket: key outside any section"))

        e = try error("[server\nsocket = /x\n")
        #expect(e.line == 1 && e.message.contains("no closing ']'"))

        e = try error("[server]\nsocket /run/x.sock\n")
        #expect(e.line == 2 && e.message.contains("key = value"))

        e = try error("[server]\n= 5\n")
        #expect(e.line == 2 && e.message.contains("missing key name"))

        e = try error("[app.]\n")
        #expect(e.line == 1 && e.message.contains("app name must be 1 to 64 characters"))
        e = try error("[app.Web]\n")
        #expect(e.line == 1 && e.section == "app.Web")
        e = try error("[app.\(String(repeating: "a", count: 65))]\n")
        #expect(e.message.contains("1 to 64"))

        // Problems are reported in file order: the earliest line wins.
        e = try error("[server]\nmax_inflight = 0\n[bogus]\n")
        #expect(e.line == 2)
        e = try error("[app.default]\napns_key = a.p8\n[server]\nlog_level = loud\n")
        #expect(e.line == 2 && e.key == "apns_key")
    }

    @Test("app names up to 64 characters are kept whole")
    func longAppNames() throws {
        let a = String(repeating: "a", count: 60) + "-one"
        let b = String(repeating: "a", count: 60) + "-two"
        let config = try HeraldConfig.parse(
            "[app.\(a)]\ndevice_cap = 1\n[app.\(b)]\ndevice_cap = 2\n", file: Self.file)
        #expect(a.count == 64)
        #expect(config.apps[a]?.deviceCap == 1)
        #expect(config.apps[b]?.deviceCap == 2)
        #expect(config.apps["default"] == nil)
    }

    @Test("a line longer than inih's buffer is an error on its own line, not split in two")
    func longLine() throws {
        let ok = "[app.default]\nalert_loc_key = " + String(repeating: "K", count: 128) + "\n"
        #expect(throws: Never.self) { try HeraldConfig.parse(ok, file: Self.file) }

        let long =
            "[server]\nlog_level = info\n; " + String(repeating: "x", count: 250)
            + "\nsocket_mode = 0600\n"
        let error = try #require(throws: ConfigError.self) {
            try HeraldConfig.parse(long, file: Self.file)
        }
        #expect(error.line == 3)
        #expect(error.description == "/etc/herald/herald.conf:3: line is too long (at most 198 bytes)")

        // 198 bytes plus the newline fit; 199 do not.
        let fits = "[server]\n; " + String(repeating: "x", count: 196) + "\n"
        #expect(throws: Never.self) { try HeraldConfig.parse(fits, file: Self.file) }
        let over = "[server]\n; " + String(repeating: "x", count: 197) + "\n"
        #expect(throws: ConfigError.self) { try HeraldConfig.parse(over, file: Self.file) }
    }

    @Test("a NUL byte is an error on its line")
    func nulByte() throws {
        let error = try #require(throws: ConfigError.self) {
            try HeraldConfig.parse("[server]\nsocket = /run/a\0b\n", file: Self.file)
        }
        #expect(error.line == 2 && error.message.contains("NUL"))
    }

    @Test("cross-field problems name the line of the key that is present")
    func crossField() throws {
        var error = try #require(throws: ConfigError.self) {
            try HeraldConfig.parse(
                "[app.default]\napns_topic = com.example.app\napns_key = apns.p8\n", file: Self.file)
        }
        #expect(error.line == 3 && error.key == "apns_key" && error.section == "app.default")
        #expect(error.message.contains("apns_key_id and apns_team_id"))

        error = try #require(throws: ConfigError.self) {
            try HeraldConfig.parse("[app.web]\nvapid_key = v.pem\n", file: Self.file)
        }
        #expect(error.line == 2 && error.key == "vapid_key" && error.message.contains("vapid_subject"))

        error = try #require(throws: ConfigError.self) {
            try HeraldConfig.parse(
                "[delivery]\nbackoff_max_ms = 500\nbackoff_base_ms = 600\n", file: Self.file)
        }
        #expect(error.line == 2 && error.key == "backoff_max_ms")

        error = try #require(throws: ConfigError.self) {
            try HeraldConfig.parse("[delivery]\n\nbackoff_base_ms = 400000\n", file: Self.file)
        }
        #expect(error.line == 3 && error.key == "backoff_base_ms")

        // Ids without a key leave APNs disabled rather than failing.
        let config = try HeraldConfig.parse(
            "[app.default]\napns_key_id = ABC123DEFG\napns_key =\n", file: Self.file)
        #expect(config.apps["default"]?.apnsKey == nil)
    }

    // MARK: Syntax

    @Test("comments: ';' and '#' lines, ' ;' after a value; ';' inside a value is kept")
    func comments() throws {
        let text = """
            ; leading comment
            # hash comment
            [server]                 ; section comment
            socket_mode = 0600       ; inline comment
            log_level = debug;not-a-comment
            [app.default]
            vapid_subject = mailto:ops@example.com;x ; real comment
            alert_loc_key = A # B
            """
        let error = try #require(throws: ConfigError.self) {
            try HeraldConfig.parse(text, file: Self.file)
        }
        #expect(error.line == 5 && error.description.contains(#"(got "debug;not-a-comment")"#))

        let fixed = try HeraldConfig.parse(
            text.replacingOccurrences(of: "debug;not-a-comment", with: "debug"), file: Self.file)
        #expect(fixed.server.socketMode == 0o600)
        #expect(fixed.apps["default"]?.vapidSubject == "mailto:ops@example.com;x")
        #expect(fixed.apps["default"]?.alertLocKey == "A # B")
    }

    @Test("indented keys are keys, not continuations of the previous value")
    func indentation() throws {
        let config = try HeraldConfig.parse(
            "[server]\n  socket_mode = 0600\n\tlog_level = warning\n    [store]\n  synchronous = normal\n",
            file: Self.file)
        #expect(config.server.socketMode == 0o600)
        #expect(config.server.logLevel == .warning)
        #expect(config.store.synchronous == .normal)
    }

    @Test("CRLF line endings and a UTF-8 byte-order mark are accepted")
    func crlf() throws {
        let text =
            "\u{FEFF}[server]\r\nsocket_mode = 0640\r\nlog_level = error ; c\r\n\r\n[app.x]\r\nallow_uids = 1, 2\r\n"
        let config = try HeraldConfig.parse(text, file: Self.file)
        #expect(config.server.socketMode == 0o640)
        #expect(config.server.logLevel == .error)
        #expect(config.apps["x"]?.allowUIDs == [1, 2])

        let error = try #require(throws: ConfigError.self) {
            try HeraldConfig.parse("[server]\r\nmax_inflight = x\r\n", file: Self.file)
        }
        #expect(error.line == 2 && error.description.hasSuffix(#"(got "x")"#))
    }

    // MARK: Files

    @Test("a missing or unreadable config file is an error naming it, with the errno text")
    func missingFile() throws {
        let dir = try TemporaryDirectory()
        let path = dir.path + "/nope.conf"
        let error = try #require(throws: ConfigError.self) {
            try HeraldConfig.load(path: path, environment: [:])
        }
        #expect(error.line == nil)
        #expect(error.description == "\(path): cannot read: No such file or directory")

        let directory = try #require(throws: ConfigError.self) {
            try HeraldConfig.load(path: dir.path, environment: [:])
        }
        #expect(directory.description == "\(dir.path): cannot read: not a regular file")
    }

    @Test("load reads the file and resolves secrets against its directory")
    func loadFromDisk() throws {
        let dir = try TemporaryDirectory()
        try dir.write("herald.conf", "[app.default]\nfcm_credentials = fcm.json\n")
        let config = try HeraldConfig.load(path: dir.path + "/herald.conf", environment: [:])
        #expect(config.file == dir.path + "/herald.conf")
        #expect(config.apps["default"]?.fcmCredentials?.path == dir.path + "/fcm.json")
    }

    @Test("the config file is --config, else HERALD_CONFIG, else /etc/herald/herald.conf")
    func configPath() {
        #expect(HeraldConfig.path(option: "/a.conf", environment: ["HERALD_CONFIG": "/b.conf"]) == "/a.conf")
        #expect(HeraldConfig.path(option: nil, environment: ["HERALD_CONFIG": "/b.conf"]) == "/b.conf")
        #expect(HeraldConfig.path(option: nil, environment: [:]) == "/etc/herald/herald.conf")
    }

    @Test("secrets: absolute as is; a bare name in CREDENTIALS_DIRECTORY first, then beside the config")
    func secretResolution() throws {
        let dir = try TemporaryDirectory()
        let credentials = dir.path + "/credentials"
        try FileManager.default.createDirectory(atPath: credentials, withIntermediateDirectories: true)
        try dir.write("credentials/apns.p8", "x")
        try dir.write("credentials/store.key", "x")
        let configFile = dir.path + "/etc/herald.conf"
        let environment = ["CREDENTIALS_DIRECTORY": credentials]
        let resolver = SecretResolver(configFile: configFile, environment: environment)

        #expect(resolver.resolveSecret("apns.p8") == credentials + "/apns.p8")
        #expect(resolver.resolveSecret("fcm.json") == dir.path + "/etc/fcm.json")
        #expect(resolver.resolveSecret("keys/apns.p8") == dir.path + "/etc/keys/apns.p8")
        #expect(resolver.resolveSecret("./fcm.json") == dir.path + "/etc/fcm.json")
        #expect(resolver.resolveSecret("/abs/apns.p8") == "/abs/apns.p8")
        // herald.service loads /etc/herald/credentials as one directory credential: herald_NAME.
        try dir.write("credentials/herald_push.pem", "x")
        try dir.write("credentials/herald_apns.p8", "x")
        #expect(resolver.resolveSecret("push.pem") == credentials + "/herald_push.pem")
        #expect(resolver.resolveSecret("apns.p8") == credentials + "/apns.p8", "the name itself comes first")
        #expect(resolver.resolveSecret("herald_push.pem") == credentials + "/herald_push.pem")

        let plain = SecretResolver(configFile: configFile, environment: [:])
        #expect(plain.resolveSecret("apns.p8") == dir.path + "/etc/apns.p8")
        let empty = SecretResolver(configFile: configFile, environment: ["CREDENTIALS_DIRECTORY": ""])
        #expect(empty.credentialsDirectory == nil)

        // Through the parser: the store key falls back to state_dir, not the config directory.
        let config = try HeraldConfig.parse(
            """
            [server]
            state_dir = /var/lib/h
            [app.default]
            apns_key = apns.p8
            apns_key_id = ABC123DEFG
            apns_team_id = TEAM123456
            apns_topic = com.example.app
            vapid_key = vapid.pem
            vapid_subject = mailto:a@example.com
            """, file: configFile, environment: environment)
        #expect(config.apps["default"]?.apnsKey?.path == credentials + "/apns.p8")
        #expect(config.apps["default"]?.vapidKey?.path == dir.path + "/etc/vapid.pem")
        #expect(config.store.key.path == credentials + "/store.key")
        let noCredentials = try HeraldConfig.parse("[server]\nstate_dir = /var/lib/h\n", file: configFile)
        #expect(noCredentials.store.key.path == "/var/lib/h/store.key")
    }

    @Test("a key pasted in place of a file name is refused without being echoed")
    func pastedKey() throws {
        let raw = Base64URL.encode([UInt8](repeating: 0x42, count: 32))
        let error = try #require(throws: ConfigError.self) {
            try HeraldConfig.parse(
                "[app.default]\nvapid_key = \(raw)\nvapid_subject = mailto:a@b.c\n", file: Self.file)
        }
        #expect(error.line == 2 && error.key == "vapid_key")
        #expect(error.message.contains("looks like key material"))
        #expect(!error.description.contains(raw))
    }

    // MARK: Credentials

    /// The default app with every transport's credential file: apns.p8,
    /// fcm.json and vapid.pem beside the config file.
    static let allCredentials = """
        [app.default]
        apns_key = apns.p8
        apns_key_id = ABC123DEFG
        apns_team_id = TEAM123456
        apns_topic = com.example.app
        fcm_credentials = fcm.json
        vapid_key = vapid.pem
        vapid_subject = mailto:ops@example.com

        """

    @Test("credentials load from files: APNs .p8, FCM service account, VAPID PEM or raw")
    func credentialsReady() throws {
        let dir = try TemporaryDirectory()
        let apnsPEM = try P256PrivateKey.generate().pem()
        let vapidKey = try P256PrivateKey.generate()
        try dir.write("apns.p8", apnsPEM)
        try dir.write("vapid.pem", try vapidKey.pem())
        try dir.write("fcm.json", try Self.serviceAccountJSON())
        let raw = [UInt8](repeating: 0x11, count: 32)
        try dir.write("vapid.raw", Base64URL.encode(raw) + "\n")

        let config = try HeraldConfig.parse(
            Self.allCredentials + """
                [app.raw]
                vapid_key = vapid.raw
                vapid_subject = https://example.com
                """, file: dir.path + "/herald.conf")
        let all = try LoadedCredentials.load(config)
        let loaded = try #require(all["default"])
        let apns = try #require(loaded.apns.value)
        #expect(apns.keyID == "ABC123DEFG" && apns.teamID == "TEAM123456" && apns.topic == "com.example.app")
        #expect(apns.key.publicKey == (try P256PrivateKey(text: SecretBytes(copying: apnsPEM.utf8))).publicKey)
        #expect(loaded.fcm.value?.projectID == "herald-test")
        #expect(loaded.webPush.value?.key.publicKey == vapidKey.publicKey)
        #expect(loaded.webPush.value?.subject == "mailto:ops@example.com")
        #expect(loaded.description == "app default: apns ready, fcm ready, webpush ready")

        let rawApp = try #require(all["raw"])
        #expect(rawApp.webPush.value?.key.publicKey == (try P256PrivateKey(raw: SecretBytes(copying: raw))).publicKey)
        #expect(rawApp.apns.disabledReason == "no apns_key configured")
    }

    @Test(
        "a key file that group or others may read is refused on its setting's line, as the store key is",
        arguments: [
            ("apns_key", "apns.p8", 0o640), ("fcm_credentials", "fcm.json", 0o644), ("vapid_key", "vapid.pem", 0o604),
        ])
    func credentialTooOpen(key: String, file: String, mode: Int) throws {
        let dir = try TemporaryDirectory()
        try dir.write("apns.p8", try P256PrivateKey.generate().pem())
        try dir.write("vapid.pem", try P256PrivateKey.generate().pem())
        try dir.write("fcm.json", try Self.serviceAccountJSON())
        let path = dir.path + "/" + file
        #expect(chmod(path, mode_t(mode)) == 0)
        let config = try HeraldConfig.parse(Self.allCredentials, file: dir.path + "/herald.conf")
        let error = try #require(throws: ConfigError.self) { try LoadedCredentials.load(config) }
        #expect(error.key == key, "\(error)")
        let octal = "0" + String(mode, radix: 8)
        #expect(
            error.message.contains(
                "mode \(octal) is too open: a key file must not be accessible to group or others (chmod 0600)"),
            "\(error)")
        #expect(chmod(path, 0o600) == 0)
        #expect(
            try LoadedCredentials.load(config)["default"]?.description
                == "app default: apns ready, fcm ready, webpush ready")
        #expect(chmod(path, 0o400) == 0)
        #expect(
            try LoadedCredentials.load(config)["default"]?.description
                == "app default: apns ready, fcm ready, webpush ready")
    }

    @Test("a transport without credentials is disabled, not an error")
    func credentialsDisabled() throws {
        let config = try HeraldConfig.parse("", file: Self.file)
        let loaded = try #require(try LoadedCredentials.load(config)["default"])
        #expect(loaded.apns.disabledReason == "no apns_key configured")
        #expect(loaded.fcm.disabledReason == "no fcm_credentials configured")
        #expect(loaded.webPush.disabledReason == "no vapid_key configured")
        #expect(!loaded.apns.isReady && !loaded.fcm.isReady && !loaded.webPush.isReady)
        #expect(
            loaded.description
                == "app default: apns disabled (no apns_key configured), fcm disabled (no fcm_credentials configured), webpush disabled (no vapid_key configured)"
        )
    }

    @Test("a named credential that cannot be read or parsed is an error naming file, line and key")
    func credentialErrors() throws {
        let dir = try TemporaryDirectory()
        let secret = "SECRET-CONTENT-DO-NOT-PRINT"
        try dir.write("garbage.p8", "-----BEGIN PRIVATE KEY-----\n\(secret)\n-----END PRIVATE KEY-----\n")
        try dir.write("garbage.json", "{\"private_key\": \"\(secret)\"}")
        try dir.write(
            "rsa.pem",
            String(
                decoding: try Self.openssl(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"]),
                as: UTF8.self))
        let configFile = dir.path + "/herald.conf"

        func loadError(_ section: String) throws -> ConfigError {
            let config = try HeraldConfig.parse(section, file: configFile)
            return try #require(throws: ConfigError.self) { try LoadedCredentials.load(config) }
        }
        let apnsIDs = "apns_key_id = ABC123DEFG\napns_team_id = TEAM123456\napns_topic = com.example.app\n"

        var error = try loadError("[app.default]\n\(apnsIDs)apns_key = missing.p8\n")
        #expect(error.line == 5 && error.section == "app.default" && error.key == "apns_key")
        #expect(
            error.description
                == "\(configFile):5: [app.default] apns_key: cannot read \(dir.path)/missing.p8: No such file or directory"
        )

        error = try loadError("[app.default]\n\(apnsIDs)apns_key = garbage.p8\n")
        #expect(error.line == 5 && error.message.hasPrefix("\(dir.path)/garbage.p8 is not an APNs signing key"))
        #expect(!error.description.contains(secret))

        error = try loadError("[app.default]\n\(apnsIDs)apns_key = rsa.pem\n")
        #expect(error.key == "apns_key" && error.message.contains("is not an APNs signing key"))
        #expect(!error.description.contains("MII"))

        error = try loadError("[app.default]\nfcm_credentials = garbage.json\n")
        #expect(error.line == 2 && error.key == "fcm_credentials")
        #expect(error.message.contains("is not a usable service-account JSON file"))
        #expect(!error.description.contains(secret))

        error = try loadError("[app.default]\nvapid_subject = mailto:a@b.c\nvapid_key = .\n")
        #expect(error.line == 3 && error.key == "vapid_key" && error.message.contains("not a regular file"))
    }

    // MARK: Store key

    @Test("the store key is created with 32 random bytes and mode 0600, then read back")
    func storeKeyCreated() throws {
        let dir = try TemporaryDirectory()
        let path = dir.path + "/store.key"
        let key = try loadOrCreateStoreKey(path: path)
        var st = stat()
        #expect(stat(path, &st) == 0)
        #expect(st.st_mode & 0o7777 == 0o600)
        #expect(st.st_size == 32)
        let contents = try #require(FileManager.default.contents(atPath: path))
        #expect(contents.count == 32 && Set(contents).count > 1)
        #expect(try FileManager.default.contentsOfDirectory(atPath: dir.path) == ["store.key"])

        let sealed = try key.seal(Array("token".utf8), context: Array("ctx".utf8))
        let again = try loadOrCreateStoreKey(path: path)
        #expect(try again.open(sealed, context: Array("ctx".utf8)) == Array("token".utf8))

        // Through the config: a relative key lives in state_dir.
        let config = try HeraldConfig.parse("[server]\nstate_dir = \(dir.path)\n", file: Self.file)
        let viaConfig = try config.store.loadOrCreateKey()
        #expect(try viaConfig.open(sealed, context: Array("ctx".utf8)) == Array("token".utf8))
    }

    @Test(
        "a store key readable by group or others, or of the wrong size, is refused",
        arguments: [
            (0o644, 32, "mode 0644 is too open"),
            (0o640, 32, "mode 0640 is too open"),
            (0o604, 32, "mode 0604 is too open"),
            (0o600, 31, "must be exactly 32 bytes (found 31)"),
            (0o400, 33, "must be exactly 32 bytes (found 33)"),
        ])
    func storeKeyRefused(mode: Int, size: Int, message: String) throws {
        let dir = try TemporaryDirectory()
        let path = dir.path + "/store.key"
        try Data(repeating: 7, count: size).write(to: URL(fileURLWithPath: path))
        #expect(chmod(path, mode_t(mode)) == 0)
        let error = try #require(throws: ConfigError.self) { try loadOrCreateStoreKey(path: path) }
        #expect(error.description.hasPrefix("\(path): \(message)"), "\(error)")

        let config = try HeraldConfig.parse("[store]\nkey = \(path)\n", file: Self.file)
        let located = try #require(throws: ConfigError.self) { try config.store.loadOrCreateKey() }
        #expect(located.description.hasPrefix("/etc/herald/herald.conf:2: [store] key: \(path): \(message)"))
    }

    @Test("a 0400 store key of 32 bytes is accepted")
    func storeKeyReadOnly() throws {
        let dir = try TemporaryDirectory()
        let path = dir.path + "/store.key"
        try Data(repeating: 7, count: 32).write(to: URL(fileURLWithPath: path))
        #expect(chmod(path, 0o400) == 0)
        #expect(throws: Never.self) { try loadOrCreateStoreKey(path: path) }
    }

    @Test("a store key in a missing directory is an error with the errno text")
    func storeKeyNoDirectory() throws {
        let dir = try TemporaryDirectory()
        let path = dir.path + "/absent/store.key"
        let error = try #require(throws: ConfigError.self) { try loadOrCreateStoreKey(path: path) }
        #expect(error.description == "\(path): cannot create: No such file or directory")
    }

    // MARK: Example and redaction

    @Test("systemd/herald.conf.example parses to the defaults")
    func exampleFile() throws {
        let example = URL(fileURLWithPath: #filePath)
            .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("systemd/herald.conf.example").path
        let config = try HeraldConfig.load(path: example, environment: [:])
        let defaults = try HeraldConfig.parse("", file: example)
        #expect(config.description == defaults.description)
        #expect(config.store.key.location.line != nil)

        // Every key the parser knows appears in the example.
        let text = try String(contentsOfFile: example, encoding: .utf8)
        for (_, keys) in ConfigInterpreter.sectionKeys {
            for key in keys {
                #expect(text.contains("\n\(key) = "), "\(key) missing from the example")
            }
        }
    }

    @Test("descriptions of the config and credentials never contain key material")
    func redaction() throws {
        let dir = try TemporaryDirectory()
        let apnsPEM = try P256PrivateKey.generate().pem()
        let vapidPEM = try P256PrivateKey.generate().pem()
        let fcm = try Self.serviceAccountJSON()
        try dir.write("apns.p8", apnsPEM)
        try dir.write("vapid.pem", vapidPEM)
        try dir.write("fcm.json", fcm)
        let config = try HeraldConfig.parse(
            """
            [app.default]
            apns_key = apns.p8
            apns_key_id = ABC123DEFG
            apns_team_id = TEAM123456
            apns_topic = com.example.app
            fcm_credentials = fcm.json
            vapid_key = vapid.pem
            vapid_subject = mailto:ops@example.com
            """, file: dir.path + "/herald.conf")
        let loaded = try #require(try LoadedCredentials.load(config)["default"])
        let storeKey = try loadOrCreateStoreKey(path: dir.path + "/store.key")
        let storeBytes = try #require(FileManager.default.contents(atPath: dir.path + "/store.key"))

        var dumped = ""
        dump(loaded, to: &dumped)
        dump(config, to: &dumped)
        let texts = [
            config.description, String(describing: config), String(reflecting: config),
            loaded.description, String(reflecting: loaded), dumped,
            String(describing: loaded.apns.value!), String(reflecting: loaded.apns.value!),
            String(describing: loaded.webPush.value!), String(reflecting: loaded.webPush.value!),
            String(describing: loaded.apns), String(describing: storeKey),
        ]
        // Every base64 line of every PEM (the key itself), and the store key bytes.
        let material =
            (apnsPEM + "\n" + vapidPEM + "\n"
            + fcm.replacingOccurrences(of: "\\n", with: "\n").replacingOccurrences(of: "\\/", with: "/"))
            .split(whereSeparator: \.isNewline)
            .map(String.init)
            .filter { !$0.contains("-----") && $0.count >= 16 && !$0.contains("\"") }
        #expect(material.count >= 4)
        let storeHex = storeBytes.map { String(format: "%02x", $0) }.joined()
        let storeB64 = Data(storeBytes).base64EncodedString()
        for text in texts {
            for line in material { #expect(!text.contains(line)) }
            #expect(!text.lowercased().contains(storeHex) && !text.contains(storeB64))
            #expect(!text.contains("PRIVATE KEY"))
        }
        #expect(config.description.contains("apns_key = \(dir.path)/apns.p8"))
    }

    // MARK: Helpers

    /// A service-account JSON with a fresh RSA key.
    static func serviceAccountJSON() throws -> String {
        let pem = String(
            decoding: try openssl(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"]),
            as: UTF8.self)
        let object: [String: String] = [
            "type": "service_account", "project_id": "herald-test",
            "client_email": "push@herald-test.iam.gserviceaccount.com",
            "token_uri": "https://oauth2.googleapis.com/token", "private_key": pem,
        ]
        return String(decoding: try JSONSerialization.data(withJSONObject: object), as: UTF8.self)
    }

    static func openssl(_ arguments: [String]) throws -> Data {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
        process.arguments = arguments
        let out = Pipe()
        process.standardOutput = out
        process.standardError = FileHandle.nullDevice
        try process.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return data
    }

    /// A directory removed with everything in it when released.
    final class TemporaryDirectory {
        let path: String

        init() throws {
            var template = Array("/tmp/herald-config-XXXXXX".utf8CString)
            guard let made = mkdtemp(&template) else { throw CocoaError(.fileWriteUnknown) }
            path = String(cString: made)
        }

        func write(_ name: String, _ text: String) throws {
            let url = URL(fileURLWithPath: path + "/" + name)
            try FileManager.default.createDirectory(
                at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
            try Data(text.utf8).write(to: url)
            // Owner only, as key files must be (a test of a too-open file chmods it after).
            guard chmod(url.path, 0o600) == 0 else { throw CocoaError(.fileWriteNoPermission) }
        }

        deinit { try? FileManager.default.removeItem(atPath: path) }
    }
}
