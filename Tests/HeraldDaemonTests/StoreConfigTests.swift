import Foundation
import HeraldStore
import HeraldTestSupport
import Testing

@testable import HeraldDaemon
@testable import HeraldConfiguration

#if canImport(Glibc)
    import Glibc
#endif

/// `[store] backend`, and the keys of the PostgreSQL backend.
@Suite("Store configuration")
struct StoreConfigTests {
    static let file = ConfigTests.file
    typealias TemporaryDirectory = ConfigTests.TemporaryDirectory

    @Test("without [store] backend the store is herald.db in state_dir; the postgres keys keep their defaults")
    func sqliteDefault() throws {
        let config = try HeraldConfig.parse("[server]\nstate_dir = /srv/h\n", file: Self.file)
        #expect(config.store.backend == .sqlite)
        #expect(config.store.dsn == nil && config.store.passwordFile == nil)
        #expect(config.store.poolSize == 8 && config.store.lease == .seconds(30))
        let location = try config.storeLocation()
        guard case .sqlite(let path, let synchronous) = location else {
            Issue.record("expected sqlite, got \(location)")
            return
        }
        #expect(path == "/srv/h/herald.db" && synchronous == .full)
        #expect(location.description == "/srv/h/herald.db")
        #expect(StoreSummary(location) == .sqlite)
    }

    @Test("backend = postgres takes dsn, password_file, pool_size and lease; the effective config parses back")
    func postgresKeys() throws {
        let dir = try TemporaryDirectory()
        try dir.write("pg.pass", "s3cret-password\n")
        #expect(chmod(dir.path + "/pg.pass", 0o600) == 0)
        let text = """
            [server]
            instance_id = host-a
            [store]
            backend = postgres
            dsn = host=/run/postgresql dbname=herald user=herald
            password_file = pg.pass
            pool_size = 16
            lease = 2.5
            """
        let config = try HeraldConfig.parse(text, file: dir.path + "/herald.conf")
        #expect(config.store.backend == .postgres)
        #expect(config.store.dsn == "host=/run/postgresql dbname=herald user=herald")
        #expect(config.store.passwordFile?.path == dir.path + "/pg.pass")
        #expect(config.store.passwordFile?.location.line == 6)
        #expect(config.store.poolSize == 16)
        #expect(config.store.lease == .milliseconds(2500))

        let again = try HeraldConfig.parse(config.description, file: dir.path + "/herald.conf")
        #expect(again.description == config.description && again.store.passwordFile?.path == dir.path + "/pg.pass")
        #expect(config.description.contains("lease = 2.5\n") && config.description.contains("synchronous = \n"))
        #expect(!config.description.contains("s3cret"))

        let location = try config.storeLocation()
        guard case .postgres(let options) = location else {
            Issue.record("expected postgres, got \(location)")
            return
        }
        #expect(options.poolSize == 16 && options.lease == .milliseconds(2500))
        #expect(options.connection.dsn == config.store.dsn)
        #expect(options.connection.passwordFile == dir.path + "/pg.pass")
        #expect(options.connection.applicationName == "herald-host-a")
        #expect(location.description == "postgresql (host=/run/postgresql dbname=herald user=herald)")
        #expect(StoreSummary(location) == StoreSummary(backend: "postgres", poolSize: 16, leaseMs: 2500))
        let json = HeraldService.storeJSON(StoreSummary(location), heldResults: 3)
        #expect(json.members.map(\.key) == ["backend", "pool_size", "lease_ms", "held_results"])
    }

    @Test("a postgres store needs no password file; the pool and lease keep their defaults")
    func postgresMinimal() throws {
        let config = try HeraldConfig.parse(
            "[store]\nbackend = POSTGRES\ndsn = postgresql:///herald?host=/run/postgresql\n", file: Self.file)
        guard case .postgres(let options) = try config.storeLocation() else {
            Issue.record("expected postgres")
            return
        }
        #expect(options.connection.passwordFile == nil)
        #expect(options.poolSize == 8 && options.lease == .seconds(30))
        #expect(try HeraldConfig.parse(config.description, file: Self.file).description == config.description)
    }

    @Test("password_file resolves like the credential files, systemd's credential directory first")
    func passwordFileCredential() throws {
        let dir = try TemporaryDirectory()
        try dir.write("credentials/herald_pg.pass", "pw\n")
        let text = "[store]\nbackend = postgres\ndsn = dbname=herald\npassword_file = pg.pass\n"
        let viaSystemd = try HeraldConfig.parse(
            text, file: "/etc/herald/herald.conf", environment: ["CREDENTIALS_DIRECTORY": dir.path + "/credentials"])
        #expect(viaSystemd.store.passwordFile?.path == dir.path + "/credentials/herald_pg.pass")
        let byHand = try HeraldConfig.parse(text, file: "/etc/herald/herald.conf")
        #expect(byHand.store.passwordFile?.path == "/etc/herald/pg.pass")
        let absolute = try HeraldConfig.parse(
            text.replacingOccurrences(of: "pg.pass", with: "/run/secrets/pg"), file: "/etc/herald/herald.conf")
        #expect(absolute.store.passwordFile?.path == "/run/secrets/pg")
    }

    @Test(
        "a bad [store] value names the file, line and key, and never repeats a dsn",
        arguments: [
            ("backend = mysql", "backend", "must be sqlite or postgres (got \"mysql\")"),
            ("backend = ", "backend", "must be sqlite or postgres"),
            ("backend = postgres\ndsn = host=/tmp password=hunter2", "dsn", "the dsn carries a password"),
            (
                "backend = postgres\ndsn = postgresql://herald:hunter2@localhost/herald", "dsn",
                "the dsn carries a password"
            ),
            ("backend = postgres\ndsn = host='hunter2", "dsn", "the dsn is not a libpq connection string"),
            ("backend = postgres\ndsn = hunter2", "dsn", "the dsn is not a libpq connection string"),
            ("backend = postgres\ndsn = dbname=h\npool_size = 0", "pool_size", "integer from 1 to 64 (got \"0\")"),
            ("backend = postgres\ndsn = dbname=h\npool_size = 65", "pool_size", "integer from 1 to 64"),
            ("backend = postgres\ndsn = dbname=h\npool_size = eight", "pool_size", "integer from 1 to 64"),
            ("backend = postgres\ndsn = dbname=h\nlease = 1.999", "lease", "seconds from 2 to 600"),
            ("backend = postgres\ndsn = dbname=h\nlease = 601", "lease", "seconds from 2 to 600"),
            ("backend = postgres\ndsn = dbname=h\nlease = 30s", "lease", "seconds from 2 to 600"),
            (
                "backend = postgres\ndsn = dbname=h\npassword_file = -----BEGIN", "password_file",
                "looks like key material"
            ),
            ("backend = postgres\ndsn = dbname=h\nsynchronous = full", "synchronous", "only with backend = sqlite"),
            ("dsn = dbname=h", "dsn", "only with backend = postgres (this store is sqlite)"),
            ("backend = sqlite\npassword_file = pg.pass", "password_file", "only with backend = postgres"),
            ("pool_size = 8", "pool_size", "only with backend = postgres"),
            ("lease = 30", "lease", "only with backend = postgres"),
            ("backend = postgres", "backend", "backend = postgres needs dsn"),
            ("backend = postgres\ndsn = ", "backend", "backend = postgres needs dsn"),
        ])
    func badValue(lines: String, key: String, message: String) throws {
        let text = "# herald\n[store]\n" + lines + "\n"
        let error = try #require(throws: ConfigError.self) { try HeraldConfig.parse(text, file: Self.file) }
        let line =
            3
            + (lines.split(separator: "\n", omittingEmptySubsequences: false).firstIndex {
                $0.hasPrefix(key + " =")
            } ?? 0)
        #expect(error.line == line, "\(error)")
        #expect(error.section == "store" && error.key == key, "\(error)")
        #expect(error.description.hasPrefix("\(Self.file):\(line): [store] \(key): "), "\(error)")
        #expect(error.description.contains(message), "\(error)")
        #expect(!error.description.contains("hunter2"), "the dsn's secret is not repeated: \(error)")
    }

    @Test("the empty value of a backend key means its default, whatever the backend")
    func emptyMeansDefault() throws {
        let config = try HeraldConfig.parse(
            "[store]\nsynchronous =\ndsn =\npassword_file =\npool_size =\nlease =\n", file: Self.file)
        #expect(config.store.backend == .sqlite && config.store.synchronous == .full)
        #expect(config.store.dsn == nil && config.store.poolSize == 8 && config.store.lease == .seconds(30))
    }

    @Test(
        "the password file must be a regular, non-empty file that grants nothing to group or others",
        arguments: [
            ("0640", "mode 0640 is too open: the password file must not be accessible to group or others (chmod 0600)"),
            ("0604", "mode 0604 is too open"),
            ("empty", "is empty"),
            ("missing", "cannot open: No such file or directory"),
            ("directory", "not a regular file"),
        ])
    func passwordFileRefused(kind: String, message: String) throws {
        let dir = try TemporaryDirectory()
        let path = dir.path + "/pg.pass"
        switch kind {
        case "missing": break
        case "directory": try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: false)
        case "empty":
            try dir.write("pg.pass", "")
            #expect(chmod(path, 0o600) == 0)
        default:
            try dir.write("pg.pass", "hunter2\n")
            #expect(chmod(path, mode_t(kind, radix: 8)!) == 0)
        }
        let config = try HeraldConfig.parse(
            "[store]\nbackend = postgres\ndsn = dbname=herald\npassword_file = \(path)\n", file: Self.file)
        let error = try #require(throws: ConfigError.self) { try config.storeLocation() }
        #expect(error.description.hasPrefix("\(Self.file):4: [store] password_file: \(path): \(message)"), "\(error)")
        #expect(!error.description.contains("hunter2"))
    }

    @Test("a 0400 password file is accepted")
    func passwordFileReadOnly() throws {
        let dir = try TemporaryDirectory()
        try dir.write("pg.pass", "pw\n")
        #expect(chmod(dir.path + "/pg.pass", 0o400) == 0)
        let config = try HeraldConfig.parse(
            "[store]\nbackend = postgres\ndsn = dbname=herald\npassword_file = \(dir.path)/pg.pass\n", file: Self.file)
        #expect(throws: Never.self) { try config.storeLocation() }
    }

    @Test("every [store] key is restart-only: a reload names the ones that changed")
    func reloadNeedsRestart() throws {
        let base = "[store]\nbackend = postgres\ndsn = dbname=a\npool_size = 4\nlease = 10\npassword_file = /p/a\n"
        let running = try HeraldConfig.parse(base, file: Self.file)
        let next = try HeraldConfig.parse(
            base.replacingOccurrences(of: "dbname=a", with: "dbname=b")
                .replacingOccurrences(of: "pool_size = 4", with: "pool_size = 5")
                .replacingOccurrences(of: "lease = 10", with: "lease = 11")
                .replacingOccurrences(of: "/p/a", with: "/p/b"), file: Self.file)
        #expect(
            Reloader.restartOnlyChanges(from: running, to: next)
                == ["store.dsn", "store.password_file", "store.pool_size", "store.lease"])
        let sqlite = try HeraldConfig.parse("", file: Self.file)
        #expect(Reloader.restartOnlyChanges(from: sqlite, to: running).contains("store.backend"))
        #expect(Reloader.restartOnlyChanges(from: running, to: running).isEmpty)
    }

    @Test("herald serve refuses a bad store setting with one line naming the key, and never the password")
    func serveRefuses() throws {
        let dir = try TemporaryDirectory()
        try dir.write("pg.pass", "hunter2\n")
        #expect(chmod(dir.path + "/pg.pass", 0o644) == 0)
        let body = """
            [server]
            socket = \(dir.path)/h.sock
            state_dir = \(dir.path)
            [store]
            key = \(dir.path)/store.key
            backend = postgres
            dsn = host=\(dir.path) dbname=herald
            password_file = pg.pass
            """
        try dir.write("herald.conf", body)
        let (status, out, err) = try runHerald(["serve", "--config", dir.path + "/herald.conf"])
        #expect(status == 1, "\(out)\(err)")
        let errors = (out + err).split(separator: "\n").filter { $0.hasPrefix("<3>") }
        #expect(errors.count == 1 && errors.first?.hasPrefix("<3>startup_failed ") == true, "\(out)\(err)")
        #expect(errors.first?.contains("[store] password_file") == true, "\(errors)")
        #expect(errors.first?.contains("mode 0644 is too open") == true, "\(errors)")
        #expect(!(out + err).contains("hunter2"))

        try dir.write(
            "herald.conf", body.replacingOccurrences(of: "dbname=herald", with: "dbname=herald password=hunter2"))
        let (status2, out2, err2) = try runHerald(["serve", "--config", dir.path + "/herald.conf"])
        #expect(status2 == 1)
        #expect(
            (out2 + err2).contains("[store] dsn: must be a libpq connection string without a password"),
            "\(out2)\(err2)")
        #expect(!(out2 + err2).contains("hunter2"))
    }
}
