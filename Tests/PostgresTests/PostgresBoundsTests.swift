import Foundation
import HeraldIO
import HeraldTestSupport
@testable import Postgres
import Testing

/// `SHOW name` on `db`.
private func show(_ db: PostgresConnection, _ name: String) throws -> String {
    try #require(try db.execute("SHOW \(name)").first).text(0)
}

/// A connection to `server` whose dsn is the server's with `extra` appended.
private func connection(_ server: PostgresServer, adding extra: String) throws -> PostgresConnection {
    let db = PostgresConnection(
        configuration: try PostgresConfiguration(dsn: server.dsn + " " + extra, passwordFile: server.passwordFile))
    try db.connect()
    return db
}

@Suite("PostgreSQL bounded waits: keepalives, timeouts and read-write from the connection string", .serialized)
struct PostgresBoundedWaitTests {
    @Test("every connection gets the default keepalives, timeouts and target_session_attrs")
    func defaults() throws {
        let db = try connection(try PostgresServer.shared())
        #expect(try show(db, "statement_timeout") == "10s")
        #expect(try show(db, "lock_timeout") == "2s")
        #expect(try show(db, "idle_in_transaction_session_timeout") == "1min")
        let parameters = db.parameters
        for (keyword, value) in PostgresConfiguration.defaultParameters {
            #expect(parameters[keyword] == value, "\(keyword)")
        }
        #expect(parameters["connect_timeout"] == "\(PostgresConfiguration.defaultConnectTimeoutSeconds)")
        #expect(parameters["client_encoding"] == "UTF8")
        #expect(parameters["password"] == nil)
    }

    @Test("a value in the dsn, key=value or URI, overrides each default; the defaults its options leave out are added")
    func overrides() throws {
        let server = try PostgresServer.shared()
        let every = try connection(
            server,
            adding: "keepalives=0 keepalives_idle=20 keepalives_interval=4 keepalives_count=5 tcp_user_timeout=7000"
                + " connect_timeout=9 target_session_attrs=any"
                + " options='-c statement_timeout=700 -clock_timeout=300 --idle-in-transaction-session-timeout=0'")
        #expect(try show(every, "statement_timeout") == "700ms")
        #expect(try show(every, "lock_timeout") == "300ms")
        #expect(try show(every, "idle_in_transaction_session_timeout") == "0")
        let parameters = every.parameters
        let expected = [
            "keepalives": "0", "keepalives_idle": "20", "keepalives_interval": "4", "keepalives_count": "5",
            "tcp_user_timeout": "7000", "connect_timeout": "9", "target_session_attrs": "any",
        ]
        for (keyword, value) in expected { #expect(parameters[keyword] == value, "\(keyword)") }
        // The statement timeout the dsn chose is the one that ends a statement.
        let slow = postgresError { try every.execute("SELECT pg_sleep(5)") }
        #expect(slow?.sqlState == .queryCanceled, "\(String(describing: slow))")
        #expect(slow?.isConnectionFailure == false)
        #expect(try every.execute("SELECT 1").first?.int64(0) == 1)

        let one = try connection(server, adding: "options='-c lock_timeout=500 -c search_path=pg_catalog'")
        #expect(try show(one, "lock_timeout") == "500ms")
        #expect(try show(one, "search_path") == "pg_catalog")
        #expect(try show(one, "statement_timeout") == "10s")
        #expect(try show(one, "idle_in_transaction_session_timeout") == "1min")

        // The same as a URI: its query parameters are the dsn's.
        let socket = server.dir + "/run"
        let host = try #require(socket.addingPercentEncoding(withAllowedCharacters: .alphanumerics))
        let uri = try PostgresConnection(
            configuration: PostgresConfiguration(
                dsn: "postgresql://herald@/postgres?host=\(host)&port=5432&keepalives_idle=30"
                    + "&options=-c%20statement_timeout%3D4000",
                passwordFile: server.passwordFile))
        try uri.connect()
        #expect(try show(uri, "statement_timeout") == "4s")
        #expect(try show(uri, "lock_timeout") == "2s")
        #expect(try show(uri, "idle_in_transaction_session_timeout") == "1min")
        #expect(uri.parameters["keepalives_idle"] == "30")
        #expect(uri.parameters["keepalives_interval"] == "3")
        #expect(uri.parameters["target_session_attrs"] == "read-write")
    }

    @Test("libpq's environment variable for a parameter wins over Herald's default, the dsn over both")
    func environment() throws {
        let config = try PostgresConfiguration(dsn: "host=/run/postgresql dbname=herald connect_timeout=7")
        let environment = ["PGTARGETSESSIONATTRS": "any", "PGOPTIONS": "-c lock_timeout=100", "PGCONNECT_TIMEOUT": "3"]
        let parameters = config.connectionParameters(environment: { environment[$0] })
        let keywords = parameters.map(\.keyword)
        #expect(!keywords.contains("target_session_attrs"))
        #expect(!keywords.contains("connect_timeout"))
        #expect(keywords.contains("keepalives_idle"))
        // Before the dsn (which overrides them), except options (merged) after it.
        #expect(keywords.firstIndex(of: "keepalives_idle")! < keywords.firstIndex(of: "dbname")!)
        #expect(keywords.firstIndex(of: "options")! > keywords.firstIndex(of: "dbname")!)
        let options = try #require(parameters.first { $0.keyword == "options" }?.value)
        #expect(
            options == "-c lock_timeout=100 -c statement_timeout=10000 -c idle_in_transaction_session_timeout=60000")
        #expect(
            PostgresConfiguration.settingNames(inOptions: #"-c a=1 -cB=2 --c-d=3 -x h=6 -c search_path=a\ b"#)
                == ["a", "b", "c_d", "search_path"])
    }

    @Test("a lock held by another session fails the statement with 55P03 after lock_timeout instead of waiting")
    func lockTimeout() throws {
        let server = try PostgresServer.shared()
        let holder = try connection(server)
        let db = try connection(server)
        let table = tableName("locked")
        try db.executeScript("CREATE TABLE \(table) (v bigint); INSERT INTO \(table) VALUES (1)")
        // Should the statement wait anyway, the holder's session ends after
        // 15 s and the statement succeeds: the test fails rather than hangs.
        try holder.executeScript("SET idle_in_transaction_session_timeout = '15s'")
        try holder.begin()
        try holder.execute("SELECT pg_advisory_xact_lock(726)")
        try holder.executeScript("LOCK TABLE \(table) IN ACCESS EXCLUSIVE MODE")

        let write = postgresError { try db.execute("UPDATE \(table) SET v = 2") }
        #expect(write?.sqlState == .lockNotAvailable, "\(String(describing: write))")
        #expect(write?.kind == .server)
        #expect(write?.isConnectionFailure == false)
        let advisory = postgresError { try db.execute("SELECT pg_advisory_lock(726)") }
        #expect(advisory?.sqlState == .lockNotAvailable, "\(String(describing: advisory))")
        // A lock wait is no reason to replace the connection.
        #expect(db.isConnected)
        #expect(db.reconnects == 0)

        try holder.rollback()
        try db.execute("UPDATE \(table) SET v = 3")
        #expect(try db.execute("SELECT v FROM \(table)").first?.int64(0) == 3)
        try db.executeScript("DROP TABLE \(table)")
    }
}

@Suite("PostgreSQL failover: a read-only or departing server's connection is replaced", .serialized)
struct PostgresFailoverTests {
    @Test(
        "a write answered 25006 closes the connection; read-write refuses the read-only server; writes resume on the same object"
    )
    func readOnly() throws {
        let server = try PostgresServer()
        defer { server.destroy() }
        // The administrator's session ignores both the read-only default and the read-write target.
        let admin = try connection(
            server, adding: "target_session_attrs=any options='-c default_transaction_read_only=off'")
        func readOnly(_ on: Bool) throws {
            try admin.executeScript(
                on
                    ? "ALTER SYSTEM SET default_transaction_read_only = on"
                    : "ALTER SYSTEM RESET default_transaction_read_only")
            try admin.execute("SELECT pg_reload_conf()")
        }
        let db = PostgresConnection(
            configuration: try PostgresConfiguration(
                dsn: server.dsn, passwordFile: server.passwordFile, reconnectDelay: .milliseconds(20),
                maxReconnectDelay: .milliseconds(100)))
        let reader = try connection(server, adding: "target_session_attrs=any")
        try db.executeScript("CREATE TABLE items (v bigint)")
        let put = PostgresStatement(name: "put", sql: "INSERT INTO items VALUES ($1)")
        try db.execute(put, [.int(1)])
        try reader.execute("SELECT count(*) FROM items")

        try readOnly(true)
        // The server's sessions take the reload when idle: retry until one has.
        var refused: PostgresError?
        let deadline = Date().addingTimeInterval(20)
        while refused == nil && Date() < deadline {
            refused = postgresError { try db.execute(put, [.int(2)]) }
            if refused == nil { Thread.sleep(forTimeInterval: 0.05) }
        }
        let error = try #require(refused)
        #expect(error.sqlState == .readOnlySQLTransaction, "\(error)")
        #expect(error.kind == .server)
        #expect(error.isConnectionFailure)
        #expect(!db.isConnected)
        // A new connection must be writable (target_session_attrs=read-write): none is.
        let reconnect = postgresError { try db.execute(put, [.int(3)]) }
        #expect(reconnect?.kind == .connect, "\(String(describing: reconnect))")
        #expect(reconnect?.message.contains("read-only") == true, "\(String(describing: reconnect))")
        #expect(db.reconnects == 0)

        // With target_session_attrs=any the next call has a new connection at once.
        var readerRefused: PostgresError?
        while readerRefused == nil && Date() < deadline {
            readerRefused = postgresError { try reader.execute("INSERT INTO items VALUES (9)") }
            if readerRefused == nil { Thread.sleep(forTimeInterval: 0.05) }
        }
        #expect(readerRefused?.sqlState == .readOnlySQLTransaction, "\(String(describing: readerRefused))")
        #expect(!reader.isConnected)
        #expect(try reader.execute("SELECT count(*) FROM items").first?.int64(0) ?? 0 >= 1)
        #expect(reader.reconnects == 1)
        // Inside a transaction the closed connection is not replaced until the rollback.
        try reader.begin()
        let inside = postgresError { try reader.execute("INSERT INTO items VALUES (10)") }
        #expect(inside?.sqlState == .readOnlySQLTransaction, "\(String(describing: inside))")
        #expect(postgresError { try reader.execute("SELECT 1") }?.kind == .connectionLost)
        try reader.rollback()
        #expect(try reader.execute("SELECT 1").first?.int64(0) == 1)
        #expect(reader.reconnects == 2)

        try readOnly(false)
        var written = false
        let resumed = Date().addingTimeInterval(20)
        while !written && Date() < resumed {
            written = postgresError { try db.execute(put, [.int(4)]) } == nil
            if !written { Thread.sleep(forTimeInterval: 0.05) }
        }
        #expect(written)
        #expect(db.reconnects == 1)
        #expect(db.isConnected)
        // The write refused while read-only is not there; the one after is, once.
        let row = try #require(
            try db.execute("SELECT count(*) FILTER (WHERE v = 3), count(*) FILTER (WHERE v = 4) FROM items").first)
        #expect(try row.int64(0) == 0)
        #expect(try row.int64(1) == 1)
    }

    @Test("a session the server ends (57P01) is replaced on its next use, the error keeping its SQLSTATE")
    func terminated() throws {
        let server = try PostgresServer.shared()
        let admin = try connection(server)
        let db = try connection(server)
        let pid = try #require(try db.execute("SELECT pg_backend_pid()").first).int64(0)
        try admin.execute("SELECT pg_terminate_backend($1::int)", [.int(pid)])
        let ended = try #require(postgresError { try db.execute("SELECT 1") })
        // Ended while idle, the session's last words come with no SQLSTATE.
        #expect(ended.kind == .connectionLost, "\(ended)")
        #expect(ended.isConnectionFailure)
        #expect(!db.isConnected)
        #expect(try db.execute("SELECT 2").first?.int64(0) == 2)
        #expect(db.reconnects == 1)
        // Ended during a statement, the statement's error is 57P01.
        let during = try #require(postgresError { try db.execute("SELECT pg_terminate_backend(pg_backend_pid())") })
        #expect(during.sqlState == .adminShutdown, "\(during)")
        #expect(during.isConnectionFailure)
        #expect(!db.isConnected)
        #expect(try db.execute("SELECT 3").first?.int64(0) == 3)
        #expect(db.reconnects == 2)
    }

    @Test("the SQLSTATEs that replace a connection: 25006, class 08, 57P01-57P03; not a lock or statement timeout")
    func replacingStates() {
        for code in ["25006", "08000", "08003", "08006", "08P01", "57P01", "57P02", "57P03"] {
            #expect(SQLState(code).replacesConnection, "\(code)")
            #expect(PostgresError(.server, "x", sqlState: SQLState(code)).isConnectionFailure, "\(code)")
        }
        for code in ["55P03", "57014", "40001", "23505", "25P02"] {
            #expect(!SQLState(code).replacesConnection, "\(code)")
            #expect(!PostgresError(.server, "x", sqlState: SQLState(code)).isConnectionFailure, "\(code)")
        }
    }
}

@Suite("PostgreSQL connection strings never show a secret")
struct PostgresSecretTests {
    @Test("sslpassword in a key=value or URI dsn is hidden from every rendering; a password anywhere is refused")
    func redacted() throws {
        let secret = "s3cret-\(UUID().uuidString.prefix(8))"
        let server = try PostgresServer.shared()
        for dsn in [
            "\(server.dsn) sslpassword=\(secret)", "\(server.dsn) sslpassword='\(secret) with space'",
            "postgresql://herald@localhost/postgres?sslpassword=\(secret)&application_name=a%20b",
        ] {
            let config = try PostgresConfiguration(dsn: dsn, passwordFile: server.passwordFile)
            var dumped = ""
            dump(config, to: &dumped)
            for rendering in [
                config.redactedDSN, "\(config)", String(reflecting: config), config.description,
                config.debugDescription, dumped,
            ] {
                #expect(!rendering.contains(secret), "\(rendering)")
            }
            #expect(config.redactedDSN.contains("sslpassword=***"), "\(config.redactedDSN)")
            #expect(config.redactedDSN.contains("user=herald"), "\(config.redactedDSN)")
            // The redacted form is itself a connection string.
            #expect(postgresError { _ = try PostgresConfiguration(dsn: config.redactedDSN) } == nil)
        }
        #expect(
            try PostgresConfiguration(dsn: "host=/run/postgresql dbname=herald").redactedDSN
                == "host=/run/postgresql dbname=herald")
        #expect(
            try PostgresConfiguration(dsn: "dbname='my db' sslpassword=x").redactedDSN
                == "dbname='my db' sslpassword=***")

        // For renderers that hold only the string, a password is hidden too.
        for dsn in [
            "host=/run/postgresql password=\(secret)", "postgresql://herald:\(secret)@db.example/herald",
            "postgresql://db.example/herald?sslpassword=\(secret)", "host='unterminated \(secret)",
        ] {
            let shown = PostgresConfiguration.redacted(dsn)
            #expect(!shown.contains(secret), "\(shown)")
        }
        #expect(
            PostgresConfiguration.redacted("postgresql://herald:pw@db.example/herald")
                == "user=herald password=*** dbname=herald host=db.example")
        #expect(PostgresConfiguration.redacted("host=a dbname=b") == "host=a dbname=b")

        // A connection that uses it, or fails to, never shows it either.
        let db = PostgresConnection(
            configuration: try PostgresConfiguration(
                dsn: "\(server.dsn) sslpassword=\(secret)", passwordFile: server.passwordFile))
        try db.connect()
        #expect(db.parameters["sslpassword"] == nil)
        #expect(!"\(db.parameters)".contains(secret))
        let failed = postgresError {
            try PostgresConnection(
                configuration: PostgresConfiguration(dsn: "host=/nonexistent port=1 sslpassword=\(secret)")
            ).connect()
        }
        #expect(failed?.kind == .connect)
        #expect(failed.map { !"\($0)".contains(secret) } == true, "\(String(describing: failed))")

        for dsn in [
            "\(server.dsn) password=\(secret)", "postgresql://herald:\(secret)@localhost/postgres",
            "postgresql://localhost/postgres?password=\(secret)",
        ] {
            let error = postgresError { _ = try PostgresConfiguration(dsn: dsn) }
            #expect(error?.kind == .configuration, "\(dsn)")
            #expect(error.map { !"\($0)".contains(secret) } == true)
        }
    }
}
