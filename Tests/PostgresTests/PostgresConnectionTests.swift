import Foundation
import HeraldIO
import HeraldTestSupport
import Postgres
import Testing

/// The error `body` throws, if it is a `PostgresError`.
func postgresError(_ body: () throws -> Void) -> PostgresError? {
    do {
        try body()
        return nil
    } catch let error as PostgresError {
        return error
    } catch {
        return nil
    }
}

func configuration(_ server: PostgresServer, passwordFile: String? = nil) throws -> PostgresConfiguration {
    try PostgresConfiguration(dsn: server.dsn, passwordFile: passwordFile ?? server.passwordFile)
}

func connection(_ server: PostgresServer) throws -> PostgresConnection {
    let connection = PostgresConnection(configuration: try configuration(server))
    try connection.connect()
    return connection
}

/// A table name no other test uses.
func tableName(_ prefix: String) -> String { "\(prefix)_\(UUID().uuidString.prefix(8).lowercased())" }

@Suite("PostgreSQL connection against a real server", .serialized)
struct PostgresConnectionTests {
    @Test("connects over the Unix socket with the password from its file")
    func connects() throws {
        let server = try PostgresServer.shared()
        let db = try connection(server)
        #expect(db.isConnected)
        let row = try #require(try db.execute("SELECT current_user, current_setting('application_name')").first)
        #expect(try row.text(0) == "herald")
        #expect(try row.text(1) == "herald")
    }

    @Test("a wrong or missing password file and a password in the dsn are clear errors that never show a password")
    func credentials() throws {
        let server = try PostgresServer.shared()
        let real = try String(contentsOfFile: server.passwordFile, encoding: .utf8).trimmingCharacters(in: .newlines)
        let wrongFile = server.dir + "/wrong-\(UUID().uuidString.prefix(6))"
        let wrong = "not-the-password-\(UUID().uuidString)"
        try (wrong + "\n").write(toFile: wrongFile, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: wrongFile) }

        let refused = postgresError {
            try PostgresConnection(configuration: configuration(server, passwordFile: wrongFile)).connect()
        }
        #expect(refused?.kind == .connect)
        #expect(refused?.message.contains("password authentication failed") == true, "\(String(describing: refused))")
        #expect(refused.map { !"\($0)".contains(wrong) && !"\($0)".contains(real) } == true)

        let missing = postgresError {
            try PostgresConnection(configuration: configuration(server, passwordFile: server.dir + "/absent")).connect()
        }
        #expect(missing?.kind == .configuration)
        #expect(missing?.message.contains("/absent") == true)

        // A password file is one short line: empty or longer than 4096 bytes is refused, its content unsaid.
        let long = String(repeating: "p", count: 4097)
        for content in ["", "\n", long, long + "\n"] {
            try content.write(toFile: wrongFile, atomically: true, encoding: .utf8)
            let error = postgresError {
                try PostgresConnection(configuration: configuration(server, passwordFile: wrongFile)).connect()
            }
            #expect(error?.kind == .configuration, "\(content.count) bytes: \(String(describing: error))")
            #expect(error.map { !"\($0)".contains("pppp") } == true)
        }
        try (real + "\nsecond line\n").write(toFile: wrongFile, atomically: true, encoding: .utf8)
        try PostgresConnection(configuration: configuration(server, passwordFile: wrongFile)).connect()

        for dsn in ["\(server.dsn) password=\(real)", "postgresql://herald:\(real)@localhost/postgres"] {
            let error = postgresError { _ = try PostgresConfiguration(dsn: dsn) }
            #expect(error?.kind == .configuration)
            #expect(error.map { !"\($0)".contains(real) } == true)
        }
        #expect(postgresError { _ = try PostgresConfiguration(dsn: "host='unterminated") }?.kind == .configuration)
    }

    @Test("parameters and columns of every type round-trip, NULL and empty bytes kept apart")
    func everyType() throws {
        let db = try connection(try PostgresServer.shared())
        let table = tableName("types")
        try db.executeScript(
            "CREATE TABLE \(table) (id bigserial PRIMARY KEY, name text, n bigint, flag boolean, token bytea, note text)"
        )
        let sealed = (0...255).map { UInt8($0) } + [0, 0, 92, 120]
        let name = "héllo \"quoted\" 'single' \\x00 ✓"
        let insert = "INSERT INTO \(table) (name, n, flag, token, note) VALUES ($1, $2, $3, $4, $5) RETURNING id"
        let first = try db.execute(insert, [.text(name), .int(.min), .bool(true), .bytes(sealed), .null])
        #expect(first.affectedRows == 1)
        let id = try #require(try first.first?.int64(0))
        let second = try db.execute(
            insert, [.text(""), .int(.max), .bool(false), .bytes([]), .optional(nil as String?)])
        let id2 = try #require(try second.first?.int64(0))

        let select = "SELECT name, n, flag, token, note FROM \(table) WHERE id = $1"
        let row = try #require(try db.execute(select, [.int(id)]).first)
        #expect(try row.text(0) == name)
        #expect(try row.int64(1) == .min)
        #expect(try row.bool(2) == true)
        #expect(try row.bytes(3) == sealed)
        #expect(try row.isNull(4))
        #expect(try row.optionalText(4) == nil)
        #expect(postgresError { _ = try row.text(4) }?.kind == .value)

        let other = try #require(try db.execute(select, [.int(id2)]).first)
        #expect(try other.text(0) == "")
        #expect(try other.int64(1) == .max)
        #expect(try other.bool(2) == false)
        #expect(try other.optionalBytes(3) == [])
        #expect(try other.isNull(4))

        #expect(postgresError { _ = try row.int64(0) }?.kind == .value)
        #expect(postgresError { _ = try row.text(9) }?.kind == .value)
        // PostgreSQL text cannot hold NUL; libpq would cut the value there.
        let nul = postgresError {
            try db.execute(insert, [.text("a\u{0}b"), .int(1), .bool(true), .bytes([1]), .null])
        }
        #expect(nul?.kind == .value)
        #expect(try db.execute("SELECT count(*) FROM \(table)").first?.int64(0) == 2)
    }

    @Test("a result of many rows keeps every cell apart: NULLs, empty and hex-looking values, bytes of every length")
    func manyRows() throws {
        let db = try connection(try PostgresServer.shared())
        let result = try db.execute(
            """
            SELECT i, CASE WHEN i % 3 = 0 THEN NULL ELSE 'v' || i END,
                CASE WHEN i % 5 = 0 THEN NULL ELSE substr(sha256(int8send(i)), 1, abs(i) % 33) END,
                CASE WHEN i % 7 = 0 THEN '\\x41' ELSE '' END, i % 2 = 0
            FROM generate_series(-200, 300) AS i ORDER BY i
            """)
        #expect(result.rows.count == 501)
        for (n, row) in zip(-200...300, result.rows) {
            #expect(row.count == 5)
            #expect(try row.int64(0) == Int64(n))
            #expect(try row.optionalText(1) == (n % 3 == 0 ? nil : "v\(n)"))
            let bytes = try row.optionalBytes(2)
            #expect(n % 5 == 0 ? bytes == nil : bytes?.count == abs(n) % 33)
            // Text that looks like bytea's hex form is text, not bytes.
            #expect(try row.text(3) == (n % 7 == 0 ? "\\x41" : ""))
            #expect(try row.bool(4) == (n % 2 == 0))
        }
        let sealed = try db.execute("SELECT '\\x00ff5c78'::bytea, ''::bytea, '\\x'::text").first
        #expect(try sealed?.bytes(0) == [0, 255, 92, 120])
        #expect(try sealed?.bytes(1) == [])
        #expect(try sealed?.text(2) == "\\x")
    }

    @Test("array parameters in binary form: every element type, NULLs, empty arrays and NUL in text")
    func binaryArrays() throws {
        let db = try connection(try PostgresServer.shared())
        let texts: [String?] = ["a", nil, "", "héllo \"{x,y}\" \\ ✓", "nul\u{0}here", "NULL"]
        let text = try db.execute(
            "SELECT t, n FROM unnest($1::text[]) WITH ORDINALITY AS u(t, n) ORDER BY n", [.array(.text(texts))])
        #expect(
            try text.rows.map { try $0.optionalText(0) } == [
                "a", nil, "", "héllo \"{x,y}\" \\ ✓", "nul\u{FFFD}here", "NULL",
            ])
        let blobs: [[UInt8]?] = [[0, 255, 92, 120], nil, [], Array(repeating: 7, count: 300)]
        let bytea = try db.execute(
            "SELECT b, n FROM unnest($1::bytea[]) WITH ORDINALITY AS u(b, n) ORDER BY n", [.array(.bytea(blobs))])
        #expect(try bytea.rows.map { try $0.optionalBytes(0) } == blobs)
        let bigints: [Int64?] = [.min, -1, 0, nil, 1, .max]
        let bigint = try db.execute(
            "SELECT i, n FROM unnest($1::bigint[]) WITH ORDINALITY AS u(i, n) ORDER BY n", [.array(.bigint(bigints))])
        #expect(try bigint.rows.map { try $0.optionalInt64(0) } == bigints)
        let ints: [Int32?] = [.min, nil, 200, .max]
        let integer = try db.execute(
            "SELECT i, n FROM unnest($1::integer[]) WITH ORDINALITY AS u(i, n) ORDER BY n", [.array(.integer(ints))])
        #expect(try integer.rows.map { try $0.optionalInt64(0) } == ints.map { $0.map(Int64.init) })
        // Empty arrays of each type; named statements (types from the SQL) as well as unnamed ones.
        let empty = PostgresStatement(
            name: "empty_arrays",
            sql: "SELECT cardinality($1::text[]), cardinality($2::bytea[]), cardinality($3::bigint[]), "
                + "cardinality($4::integer[]), $5::text[] IS NULL")
        for _ in 0..<2 {
            let row = try #require(
                try db.execute(
                    empty, [.array(.text([])), .array(.bytea([])), .array(.bigint([])), .array(.integer([])), .null]
                )
                .first)
            #expect(try (0..<4).map { try row.int64($0) } == [0, 0, 0, 0])
            #expect(try row.bool(4))
        }
        let typed = try db.execute("SELECT pg_typeof($1)::text, array_length($1, 1)", [.array(.bigint([1, 2, 3]))])
        #expect(try typed.first?.text(0) == "bigint[]")
        #expect(try typed.first?.int64(1) == 3)
    }

    @Test("integers are read from their text form: signs, the limits, and nothing past them")
    func integerText() throws {
        let db = try connection(try PostgresServer.shared())
        let good = try #require(
            try db.execute("SELECT '0', '-0', '+17', '9223372036854775807', '-9223372036854775808'").first)
        #expect(try (0..<5).map { try good.int64($0) } == [0, 0, 17, .max, .min])
        let bad = try #require(
            try db.execute("SELECT '9223372036854775808', '-9223372036854775809', '', '-', '1.5', ' 1', '12a'").first)
        for column in 0..<7 { #expect(postgresError { _ = try bad.int64(column) }?.kind == .value) }
    }

    @Test("named prepared statements run many times; a bad one is a server error with its SQLSTATE")
    func preparedStatements() throws {
        let db = try connection(try PostgresServer.shared())
        let table = tableName("prepared")
        try db.executeScript("CREATE TABLE \(table) (k text PRIMARY KEY, v bigint NOT NULL)")
        let put = PostgresStatement(name: "put_\(table)", sql: "INSERT INTO \(table) (k, v) VALUES ($1, $2)")
        let sum = PostgresStatement(name: "sum_\(table)", sql: "SELECT sum(v), count(*) FROM \(table) WHERE k LIKE $1")
        for i in 1...5 { try db.execute(put, [.text("k\(i)"), .int(Int64(i))]) }
        let row = try #require(try db.execute(sum, [.text("k%")]).first)
        #expect(try row.int64(0) == 15)
        #expect(try row.int64(1) == 5)
        let bad = PostgresStatement(name: "bad_\(table)", sql: "SELEC 1")
        let error = postgresError { try db.execute(bad) }
        #expect(error?.kind == .server)
        #expect(error?.sqlState == SQLState("42601"))
        #expect(try db.execute(sum, [.text("k1")]).first?.int64(0) == 1)
    }

    @Test("transactions: rolled back by hand or by a throw, committed otherwise; a failed one does not commit")
    func transactions() throws {
        let db = try connection(try PostgresServer.shared())
        let table = tableName("tx")
        try db.executeScript("CREATE TABLE \(table) (v bigint PRIMARY KEY)")
        func count() throws -> Int64 { try db.execute("SELECT count(*) FROM \(table)").first!.int64(0) }

        try db.begin()
        try db.execute("INSERT INTO \(table) VALUES (1)")
        #expect(try count() == 1)
        try db.rollback()
        #expect(try count() == 0)

        struct Abort: Error {}
        #expect(throws: Abort.self) {
            try db.transaction { tx in
                try tx.execute("INSERT INTO \(table) VALUES (2)")
                throw Abort()
            }
        }
        #expect(try count() == 0)

        try db.transaction { tx in try tx.execute("INSERT INTO \(table) VALUES (3)") }
        #expect(try count() == 1)

        try db.begin()
        try db.execute("INSERT INTO \(table) VALUES (4)")
        #expect(postgresError { try db.execute("INSERT INTO \(table) VALUES (3)") }?.sqlState == .uniqueViolation)
        let commit = postgresError { try db.commit() }
        #expect(commit?.kind == .server)
        #expect(commit?.sqlState == SQLState("25P02"))
        #expect(try count() == 1)
    }

    @Test("a unique violation carries SQLSTATE 23505 and the constraint, never the row's values")
    func uniqueViolation() throws {
        let db = try connection(try PostgresServer.shared())
        let table = tableName("uniq")
        try db.executeScript("CREATE TABLE \(table) (token text CONSTRAINT \(table)_token UNIQUE)")
        let secret = "sealed-token-\(UUID().uuidString)"
        try db.execute("INSERT INTO \(table) VALUES ($1)", [.text(secret)])
        let error = try #require(postgresError { try db.execute("INSERT INTO \(table) VALUES ($1)", [.text(secret)]) })
        #expect(error.kind == .server)
        #expect(error.sqlState == .uniqueViolation)
        #expect(error.constraint == "\(table)_token")
        #expect(!error.isConnectionFailure)
        #expect(!"\(error)".contains(secret))
        #expect(try db.execute("SELECT count(*) FROM \(table)").first?.int64(0) == 1)
    }

    @Test("SELECT … FOR UPDATE SKIP LOCKED from two connections takes disjoint rows")
    func skipLocked() throws {
        let server = try PostgresServer.shared()
        let a = try connection(server)
        let b = try connection(server)
        let table = tableName("lease")
        try a.executeScript("CREATE TABLE \(table) (id bigint PRIMARY KEY, owner text)")
        try a.execute("INSERT INTO \(table) SELECT g, NULL FROM generate_series(1, 10) g")
        let claim = PostgresStatement(
            name: "claim_\(table)",
            sql: """
                UPDATE \(table) SET owner = $1 WHERE id IN (
                  SELECT id FROM \(table) WHERE owner IS NULL ORDER BY id LIMIT 4 FOR UPDATE SKIP LOCKED)
                RETURNING id
                """)
        try a.begin()
        try b.begin()
        let takenA = Set(try a.execute(claim, [.text("a")]).rows.map { try $0.int64(0) })
        let takenB = Set(try b.execute(claim, [.text("b")]).rows.map { try $0.int64(0) })
        #expect(takenA.count == 4)
        #expect(takenB.count == 4)
        #expect(takenA.isDisjoint(with: takenB))
        try a.commit()
        try b.commit()
        let owners = try a.execute(
            "SELECT owner, count(*) FROM \(table) WHERE owner IS NOT NULL GROUP BY owner ORDER BY owner")
        #expect(try owners.rows.map { try "\($0.text(0))=\($0.int64(1))" } == ["a=4", "b=4"])
    }

    @Test("LISTEN/NOTIFY between two connections: nothing before the sender commits, then the payload")
    func listenNotify() throws {
        let server = try PostgresServer.shared()
        let listener = try connection(server)
        let sender = try connection(server)
        let channel = tableName("wake")
        try listener.listen(channel)
        #expect(try listener.notifications(within: .milliseconds(50)).isEmpty)

        try sender.begin()
        try sender.notify(channel, payload: "lane=apns")
        #expect(try listener.notifications(within: .milliseconds(200)).isEmpty)
        try sender.commit()

        var received: [PostgresNotification] = []
        let deadline = Date().addingTimeInterval(30)
        while received.isEmpty && Date() < deadline { received = try listener.notifications(within: .seconds(1)) }
        let senderPID = try sender.execute("SELECT pg_backend_pid()").first!.int64(0)
        #expect(received == [PostgresNotification(channel: channel, payload: "lane=apns", senderPID: Int32(senderPID))])

        try listener.unlisten(channel)
        try sender.notify(channel, payload: "after")
        #expect(try listener.notifications(within: .milliseconds(200)).isEmpty)
    }
}
