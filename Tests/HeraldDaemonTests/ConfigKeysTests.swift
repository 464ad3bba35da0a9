import Foundation
import Testing
@testable import HeraldDaemon
@testable import HeraldConfiguration

// Every configuration key is declared once, in ConfigKeys: the parser, the
// effective configuration and the reload check read that table, and the
// example config and docs/configuration.md are checked against it here.

@Suite("the configuration keys are declared once and the docs follow the table")
struct ConfigKeysTests {
    /// `key = value ; comment` lines of the example config, by section (every `[app.*]` as `app`).
    static func exampleLines() throws -> [(section: String, key: String, value: String, comment: String)] {
        let text = try String(
            contentsOf: DocsTests.root.appendingPathComponent("systemd/herald.conf.example"), encoding: .utf8)
        var section = ""
        var out: [(String, String, String, String)] = []
        for raw in text.split(separator: "\n") {
            let line = String(raw)
            if line.hasPrefix("#") || line.hasPrefix(";") { continue }
            if line.hasPrefix("[") {
                let name = String(line.dropFirst().prefix { $0 != "]" })
                section = name.hasPrefix("app.") ? "app" : name
                continue
            }
            guard let eq = line.firstIndex(of: "=") else { continue }
            let key = line[..<eq].trimmingCharacters(in: .whitespaces)
            var rest = String(line[line.index(after: eq)...])
            var comment = ""
            if let semi = rest.range(of: " ;") {
                comment = rest[semi.upperBound...].trimmingCharacters(in: .whitespaces)
                rest = String(rest[..<semi.lowerBound])
            }
            out.append((section, key, rest.trimmingCharacters(in: .whitespaces), comment))
        }
        return out
    }

    /// configuration.md's table rows: section, key, default column, allowed column.
    static func documentedRows() throws -> [(section: String, key: String, defaults: String, allowed: String)] {
        let text = try String(
            contentsOf: DocsTests.root.appendingPathComponent("docs/configuration.md"), encoding: .utf8)
        var section: String?
        var out: [(String, String, String, String)] = []
        for raw in text.split(separator: "\n") {
            let line = String(raw)
            if line.hasPrefix("#") {
                section = nil
                if line.hasPrefix("### `["), let close = line.firstIndex(of: "]") {
                    let name = String(line[line.index(line.startIndex, offsetBy: 6)..<close])
                    section = name.hasPrefix("app.") ? "app" : name
                }
                continue
            }
            guard let section, line.hasPrefix("| `") else { continue }
            let cells = line.split(separator: "|", omittingEmptySubsequences: false).map {
                $0.trimmingCharacters(in: .whitespaces)
            }
            guard cells.count >= 4 else { continue }
            out.append((section, cells[1].trimmingCharacters(in: CharacterSet(charactersIn: "`")), cells[2], cells[3]))
        }
        return out
    }

    @Test("the example config shows every key once, in its section, with the table's default and doc line")
    func exampleFollowsTheTable() throws {
        let lines = try Self.exampleLines()
        for line in lines {
            guard let section = ConfigKey.Section(rawValue: line.section),
                let key = ConfigKeys.find(section, line.key)
            else {
                Issue.record("the example sets [\(line.section)] \(line.key), which the table does not declare")
                continue
            }
            let shownEmpty = line.value.isEmpty && line.comment.contains("empty: \(key.defaultValue)")
            #expect(line.value == key.defaultValue || shownEmpty, "[\(line.section)] \(line.key) = \(line.value)")
            #expect(
                line.comment == key.doc, "[\(line.section)] \(line.key): the example's comment is not the table's doc")
        }
        for key in ConfigKeys.all {
            let count = lines.filter { $0.section == key.section.rawValue && $0.key == key.name }.count
            #expect(count == 1, "[\(key.section)] \(key.name) appears \(count) times in the example")
        }
    }

    @Test("configuration.md documents every key in its section with the table's default and bounds")
    func referenceFollowsTheTable() throws {
        let rows = try Self.documentedRows()
        for key in ConfigKeys.all {
            let matching = rows.filter { $0.section == key.section.rawValue && $0.key == key.name }
            guard let row = matching.first, matching.count == 1 else {
                Issue.record("[\(key.section)] \(key.name) is documented \(matching.count) times in configuration.md")
                continue
            }
            if key.defaultValue.isEmpty {
                #expect(row.defaults.hasPrefix("empty"), "[\(key.section)] \(key.name): default column \(row.defaults)")
            } else {
                #expect(
                    row.defaults.hasPrefix("`\(key.defaultValue)`"),
                    "[\(key.section)] \(key.name): default column \(row.defaults)")
            }
            switch key.kind {
            case .choice(let names):
                for name in names {
                    #expect(row.allowed.contains("`\(name)`"), "[\(key.section)] \(key.name) allows \(name)")
                }
            default:
                if let bounds = key.kind.documentedBounds {
                    #expect(
                        row.allowed.contains(bounds),
                        "[\(key.section)] \(key.name): \(row.allowed) should say \(bounds)")
                }
            }
        }
        for row in rows {
            let known = ConfigKey.Section(rawValue: row.section).flatMap { ConfigKeys.find($0, row.key) } != nil
            #expect(known, "configuration.md documents [\(row.section)] \(row.key), which the table does not declare")
        }
    }

    @Test("each declared default is the parser's: writing it changes nothing")
    func defaultsAreTheParsers() throws {
        let postgres = "backend = postgres\ndsn = host=/run/postgresql dbname=herald user=herald\n"
        for key in ConfigKeys.all where !key.defaultValue.isEmpty {
            let section = key.section == .app ? "app.default" : key.section.rawValue
            let preamble = "[\(section)]\n" + (key.backend == .postgres ? postgres : "")
            let body = preamble + "\(key.name) = \(key.defaultValue)\n"
            let with = try HeraldConfig.parse(body, file: "/etc/herald/herald.conf")
            let without = try HeraldConfig.parse(preamble, file: "/etc/herald/herald.conf")
            #expect(
                with.description == without.description,
                "[\(section)] \(key.name) = \(key.defaultValue) is not the default")
            #expect(
                key.value(in: without, app: without.apps["default"]) == key.defaultValue || key.kind.isFile,
                "[\(section)] \(key.name): the effective config prints \(key.value(in: without, app: without.apps["default"]))"
            )
        }
    }

    @Test("a reload names exactly the restart-only keys that changed; live keys never")
    func reloadFollowsTheTable() throws {
        let base = try HeraldConfig.parse("", file: "/etc/herald/herald.conf")
        // One changed value per key, each valid on its own.
        let changed: [String: String] = [
            "server.socket": "/run/x.sock", "server.socket_mode": "0600", "server.state_dir": "/var/lib/x",
            "server.max_inflight": "7", "server.log_level": "debug", "server.max_batch": "7",
            "server.max_reply_bytes": "70000", "server.max_connections_per_uid": "7",
            "server.system_calls_per_minute": "7", "metrics.app_figures": "true",
            "server.max_uid_bytes": "2000000", "server.max_client_bytes": "3000000",
            "metrics.bearer_token_file": "/etc/herald/metrics.token",
            "server.request_timeout_ms": "700", "server.instance_id": "x", "store.key": "other.key",
            "store.backend": "postgres", "store.synchronous": "normal", "delivery.max_retries": "7",
            "delivery.backoff_base_ms": "7", "delivery.backoff_max_ms": "7000", "delivery.stale_window_cap": "7",
            "delivery.stale_batch_ratio": "0.7", "delivery.stale_batch_min": "7", "delivery.max_queued": "7",
            "delivery.ping_timeout": "7", "delivery.webpush_origin_inflight": "7",
            "delivery.webpush_origin_timeouts": "7",
            "delivery.webpush_connect_timeout": "7", "delivery.webpush_timeout": "7",
            "delivery.event_retention": "700", "server.event_buffer_bytes": "70000",
            "delivery.credential_check_interval": "60",
            "endpoints.apns_production": "https://apns.example",
            "endpoints.apns_development": "https://apns-dev.example", "endpoints.fcm": "https://fcm.example",
            "endpoints.apns_manage_production": "https://manage.example:2196",
            "endpoints.apns_manage_development": "https://manage-dev.example:2195",
            "endpoints.ca_file": "/etc/ca.pem", "endpoints.webpush_allow_private": "true",
            "metrics.listen": "127.0.0.1:9", "app.device_cap": "7", "app.allow_uids": "7", "app.allow_gids": "7",
            "app.alert_loc_key": "X", "app.android_channel_id": "x", "app.apns_topics": "com.x, com.y",
            "app.quiet_hours_bypass_topics": "security",
            "app.live_activity_high_per_hour": "30",
        ]
        let postgresBase = try HeraldConfig.parse(
            "[store]\nbackend = postgres\ndsn = host=/a dbname=b user=c\n", file: "/etc/herald/herald.conf")
        let postgresChanged: [String: String] = [
            "store.dsn": "host=/b dbname=b user=c", "store.password_file": "/etc/pg.pass", "store.pool_size": "7",
            "store.lease": "7", "store.lease_max_age": "700", "store.call_timeout": "7",
        ]
        for (name, value) in changed.merging(postgresChanged, uniquingKeysWith: { a, _ in a }) {
            let key = try #require(ConfigKeys.all.first { $0.qualifiedName == name }, "\(name)")
            let isPostgres = postgresChanged[name] != nil
            var text = isPostgres ? "[store]\nbackend = postgres\n" : ""
            if key.section == .store {
                if !isPostgres { text = "[store]\n" }
                if name == "store.backend" { text += "dsn = host=/a dbname=b user=c\n" }
                if isPostgres && name != "store.dsn" { text += "dsn = host=/a dbname=b user=c\n" }
                text += "\(key.name) = \(value)\n"
            } else {
                text += "[\(key.section == .app ? "app.default" : key.section.rawValue)]\n\(key.name) = \(value)\n"
            }
            let next = try HeraldConfig.parse(text, file: "/etc/herald/herald.conf")
            let named = Reloader.restartOnlyChanges(from: isPostgres ? postgresBase : base, to: next)
            if key.reload == .restart {
                #expect(named.contains(name), "changing \(name) is not named as needing a restart: \(named)")
            } else {
                #expect(named.isEmpty, "changing live \(name) names \(named)")
            }
        }
        // Every key is exercised above, except the app's credentials (their checks need files).
        let untested = Set(ConfigKeys.all.map(\.qualifiedName)).subtracting(changed.keys).subtracting(
            postgresChanged.keys)
        #expect(
            untested == [
                "app.apns_key", "app.apns_key_id", "app.apns_team_id", "app.apns_topic", "app.fcm_credentials",
                "app.vapid_key", "app.vapid_subject", "app.vapid_key_previous",
            ])
    }
}

extension ConfigKey.Kind {
    var isFile: Bool {
        if case .file = self { return true }
        return false
    }
}
