internal import CLibPQ

#if canImport(Glibc)
    import Glibc
#endif

/// One libpq connection, for one thread at a time (like libpq's `PGconn`).
///
/// Every call first makes sure the connection is up: a connection found
/// broken is dropped and a new one opened, re-preparing statements and
/// re-subscribing channels on first use. A call that finds the connection
/// broken mid-way fails with `.connectionLost` (whether its statement ran is
/// unknown); the next call reconnects at once. A failed connect makes the
/// calls that follow fail fast with `.unavailable` until the backoff delay has
/// passed; the delay doubles with every failed attempt up to the configured
/// maximum and starts again after a success. A connection lost inside a
/// transaction is not replaced behind the caller's back: calls fail until the
/// caller ends the transaction with `rollback()`. A statement answered with a
/// SQLSTATE that says the server cannot serve this connection (read-only, a
/// connection exception, shutting down) fails with that error, and the
/// connection is closed so that the next call opens a new one.
public final class PostgresConnection {
    public let configuration: PostgresConfiguration
    private var handle: OpaquePointer?
    /// Statements prepared on the current connection, by name.
    private var prepared: Set<String> = []
    /// Channels to listen on, on this and every later connection.
    private var channels: Set<String> = []
    /// BEGIN sent, neither COMMIT nor ROLLBACK yet.
    private var inTransaction = false
    /// Monotonic time before which no connect is tried, after a failed one.
    private var nextAttempt: UInt64?
    private var delay: Duration
    private var lastConnectFailure: String?
    private var everConnected = false

    /// How many times a lost connection was replaced. Notifications sent
    /// while it was down are lost: a listener rescans when this moves.
    public private(set) var reconnects = 0

    /// Does not connect: the first call (or `connect()`) does.
    public init(configuration: PostgresConfiguration) {
        self.configuration = configuration
        delay = configuration.reconnectDelay
    }

    deinit {
        if let handle { PQfinish(handle) }
    }

    /// Whether the connection is open and was healthy at its last use.
    public var isConnected: Bool { handle.map { PQstatus($0) == CONNECTION_OK } ?? false }

    /// The libpq parameters of the open connection (`PQconninfo`), secrets
    /// and unset ones left out: what the defaults and the connection string
    /// made of it. Empty when not connected.
    public var parameters: [String: String] {
        guard let handle, let options = PQconninfo(handle) else { return [:] }
        defer { PQconninfoFree(options) }
        var found: [String: String] = [:]
        var option = options
        while let keyword = option.pointee.keyword {
            defer { option += 1 }
            let secret = option.pointee.dispchar.map { String(cString: $0).contains("*") } ?? false
            guard !secret, let value = option.pointee.val, value.pointee != 0 else { continue }
            found[String(cString: keyword)] = String(cString: value)
        }
        return found
    }

    /// The wait after the next failed connect attempt (doubling, bounded).
    public var nextReconnectDelay: Duration { delay }

    /// Opens the connection now unless it is open (subject to the backoff).
    public func connect() throws(PostgresError) {
        _ = try ready()
    }

    /// Closes the connection; a later call opens a new one.
    public func close() {
        drop()
        inTransaction = false
    }

    // MARK: Statements

    /// Runs one statement with `$1`… parameters (extended protocol, text
    /// results) and returns its rows.
    @discardableResult
    public func execute(_ sql: String, _ parameters: [PostgresValue] = []) throws(PostgresError) -> PostgresResult {
        let conn = try ready()
        let result = try withParameters(parameters) { count, types, values, lengths, formats in
            exec(conn) { PQsendQueryParams($0, sql, count, types, values, lengths, formats, 0) }
        }
        return try consume(result, conn)
    }

    /// Runs a named statement, preparing it on this connection the first time.
    @discardableResult
    public func execute(
        _ statement: PostgresStatement, _ parameters: [PostgresValue] = []
    ) throws(PostgresError)
        -> PostgresResult
    {
        let conn = try ready()
        if !prepared.contains(statement.name) {
            _ = try consume(exec(conn) { PQsendPrepare($0, statement.name, statement.sql, 0, nil) }, conn)
            prepared.insert(statement.name)
        }
        let result = try withParameters(parameters) { count, _, values, lengths, formats in
            exec(conn) { PQsendQueryPrepared($0, statement.name, count, values, lengths, formats, 0) }
        }
        return try consume(result, conn)
    }

    /// Runs statements without parameters, several separated by `;` allowed
    /// (simple protocol: schema migrations, DDL).
    public func executeScript(_ sql: String) throws(PostgresError) {
        let conn = try ready()
        _ = try consume(exec(conn, sql), conn)
    }

    // MARK: Transactions

    /// Begins a transaction; `settings` (`SET LOCAL` statements, `;`
    /// separated) go in the same round trip.
    public func begin(_ settings: String? = nil) throws(PostgresError) {
        let conn = try ready()
        _ = try consume(exec(conn, settings.map { "BEGIN; " + $0 } ?? "BEGIN"), conn)
        inTransaction = true
    }

    /// Commits; throws `.server` when the transaction had failed (the server
    /// answers COMMIT with a rollback), `.connectionLost` when the outcome is unknown.
    public func commit() throws(PostgresError) {
        defer { inTransaction = false }
        guard let conn = handle, PQstatus(conn) == CONNECTION_OK else {
            throw PostgresError(.connectionLost, "the connection was lost inside the transaction: it did not commit")
        }
        guard let result = exec(conn, "COMMIT") else { throw failure(conn, nil, lost: false) }
        let rolledBack =
            PQresultStatus(result) == PGRES_COMMAND_OK && String(cString: PQcmdStatus(result)) == "ROLLBACK"
        _ = try consume(result, conn)
        if rolledBack {
            throw PostgresError(
                .server, "the transaction had failed: COMMIT rolled it back", sqlState: SQLState("25P02"))
        }
    }

    /// Rolls back; on a lost connection there is nothing left to roll back
    /// (the server ended the transaction) and the next call reconnects.
    public func rollback() throws(PostgresError) {
        defer { inTransaction = false }
        guard let conn = handle, PQstatus(conn) == CONNECTION_OK else { return }
        _ = try consume(exec(conn, "ROLLBACK"), conn)
    }

    /// Runs `body` in a transaction: committed when it returns, rolled back when it throws.
    @discardableResult
    public func transaction<T>(_ body: (PostgresConnection) throws -> T) throws -> T {
        try begin()
        let value: T
        do {
            value = try body(self)
        } catch {
            try? rollback()
            throw error
        }
        try commit()
        return value
    }

    // MARK: LISTEN/NOTIFY

    /// Listens on `channel` now and on every later connection.
    public func listen(_ channel: String) throws(PostgresError) {
        let conn = try ready()
        try subscribe(conn, "LISTEN", channel)
        channels.insert(channel)
    }

    public func unlisten(_ channel: String) throws(PostgresError) {
        channels.remove(channel)
        let conn = try ready()
        try subscribe(conn, "UNLISTEN", channel)
    }

    /// Sends a notification (delivered when the current transaction, if
    /// any, commits).
    public func notify(_ channel: String, payload: String = "") throws(PostgresError) {
        try execute("SELECT pg_notify($1, $2)", [.text(channel), .text(payload)])
    }

    /// The notifications received so far, or else the first ones to arrive
    /// within `timeout` (a `poll` on the connection's socket); empty when
    /// none came.
    public func notifications(within timeout: Duration) throws(PostgresError) -> [PostgresNotification] {
        let conn = try ready()
        let deadline = monotonicNanoseconds() + timeout.nanoseconds
        while true {
            guard PQconsumeInput(conn) != 0, PQstatus(conn) == CONNECTION_OK else {
                throw failure(conn, nil, lost: true)
            }
            var received: [PostgresNotification] = []
            while let notice = PQnotifies(conn) {
                received.append(
                    PostgresNotification(
                        channel: String(cString: notice.pointee.relname),
                        payload: String(cString: notice.pointee.extra),
                        senderPID: notice.pointee.be_pid))
                PQfreemem(notice)
            }
            if !received.isEmpty { return received }
            let now = monotonicNanoseconds()
            if now >= deadline { return [] }
            var pfd = pollfd(fd: PQsocket(conn), events: Int16(POLLIN), revents: 0)
            let milliseconds = Int32(min((deadline - now + 999_999) / 1_000_000, UInt64(Int32.max)))
            if poll(&pfd, 1, milliseconds) < 0, errno != EINTR {
                let reason = String(cString: strerror(errno))
                drop()
                throw PostgresError(.connectionLost, "poll: \(reason)")
            }
        }
    }

    // MARK: Connection

    /// The open connection, reconnecting first if needed.
    private func ready() throws(PostgresError) -> OpaquePointer {
        if let handle, PQstatus(handle) == CONNECTION_OK { return handle }
        drop()
        if inTransaction {
            throw PostgresError(
                .connectionLost, "the connection was lost or closed inside a transaction: roll it back")
        }
        let now = configuration.clock()
        if let nextAttempt, now < nextAttempt {
            let wait = (nextAttempt - now + 999_999) / 1_000_000
            throw PostgresError(
                .unavailable, "not connected, next attempt in \(wait) ms (last: \(lastConnectFailure ?? "none"))")
        }
        do throws(PostgresError) {
            let conn = try open()
            handle = conn
            nextAttempt = nil
            delay = configuration.reconnectDelay
            lastConnectFailure = nil
            if everConnected { reconnects += 1 }
            everConnected = true
            for channel in channels.sorted() { try subscribe(conn, "LISTEN", channel) }
            return conn
        } catch {
            lastConnectFailure = error.message
            nextAttempt = now + delay.nanoseconds
            delay = min(delay * 2, configuration.maxReconnectDelay)
            throw error
        }
    }

    private func open() throws(PostgresError) -> OpaquePointer {
        var password = try configuration.readPassword()
        defer { if password != nil { wipe(&password!) } }
        var parameters = configuration.connectionParameters()
        if password != nil { parameters.append(("password", "")) }
        let keywords = parameters.map(\.keyword)
        let values = parameters.dropLast(password != nil ? 1 : 0).map(\.value)
        let cKeywords = keywords.map { strdup($0) }
        let cValues = values.map { strdup($0) }
        defer {
            for p in cKeywords + cValues { free(p) }
        }
        let keywordPointers = cKeywords.map { UnsafePointer($0) } + [nil]
        func connect(_ secret: UnsafePointer<CChar>?) -> OpaquePointer? {
            var valuePointers = cValues.map { UnsafePointer($0) }
            if let secret { valuePointers.append(secret) }
            valuePointers.append(nil)
            return PQconnectdbParams(keywordPointers, valuePointers, 1)
        }
        let made: OpaquePointer? =
            if password != nil { password!.withUnsafeBufferPointer { connect($0.baseAddress) } } else { connect(nil) }
        guard let conn = made else { throw PostgresError(.connect, "libpq could not allocate a connection") }
        guard PQstatus(conn) == CONNECTION_OK else {
            let message = Self.message(PQerrorMessage(conn))
            PQfinish(conn)
            throw PostgresError(.connect, message)
        }
        // Notices (e.g. "there is no transaction in progress") are not
        // written to stderr.
        PQsetNoticeProcessor(conn, { _, _ in }, nil)
        return conn
    }

    private func drop() {
        if let handle { PQfinish(handle) }
        handle = nil
        prepared.removeAll()
    }

    private func subscribe(_ conn: OpaquePointer, _ verb: String, _ channel: String) throws(PostgresError) {
        _ = try consume(exec(conn, "\(verb) \(try Self.identifier(channel))"), conn)
    }

    /// A quoted SQL identifier.
    static func identifier(_ name: String) throws(PostgresError) -> String {
        guard !name.isEmpty, !name.utf8.contains(0) else {
            throw PostgresError(.value, "a channel name must be non-empty text without NUL")
        }
        return "\"" + name.split(separator: "\"", omittingEmptySubsequences: false).joined(separator: "\"\"") + "\""
    }

    // MARK: Results

    /// Sends with `send` and waits for the results, as `PQexec` does, but
    /// keeps the first error rather than the last: a session the server
    /// ends during a statement answers with its SQLSTATE (57P01…), then the
    /// connection closes, and `PQexec` would return only the latter.
    private func exec(_ conn: OpaquePointer, _ send: (OpaquePointer) -> Int32) -> OpaquePointer? {
        guard send(conn) != 0 else { return nil }
        var kept: OpaquePointer?
        while let result = PQgetResult(conn) {
            if let error = kept, PQresultStatus(error) == PGRES_FATAL_ERROR {
                PQclear(result)
            } else {
                if let previous = kept { PQclear(previous) }
                kept = result
            }
            if PQstatus(conn) == CONNECTION_BAD { break }
        }
        return kept
    }

    /// Runs statements without parameters (simple protocol), as ``exec(_:_:)``.
    private func exec(_ conn: OpaquePointer, _ sql: String) -> OpaquePointer? {
        exec(conn) { PQsendQuery($0, sql) }
    }

    /// The rows of a finished statement, or its error. Frees `result`.
    private func consume(_ result: OpaquePointer?, _ conn: OpaquePointer) throws(PostgresError) -> PostgresResult {
        guard let result else { throw failure(conn, nil, lost: false) }
        defer { PQclear(result) }
        switch PQresultStatus(result) {
        case PGRES_COMMAND_OK, PGRES_TUPLES_OK, PGRES_EMPTY_QUERY: return Self.copy(result)
        default: throw failure(conn, result, lost: false)
        }
    }

    /// The error of a failed call; a broken connection is dropped (the next
    /// call reconnects) and reported as `.connectionLost`. A connection whose
    /// server answered a SQLSTATE that ``SQLState/replacesConnection`` is
    /// dropped too, the error keeping its kind and code.
    private func failure(_ conn: OpaquePointer, _ result: OpaquePointer?, lost: Bool) -> PostgresError {
        func field(_ code: Character) -> String? {
            guard let result, let value = PQresultErrorField(result, Int32(code.asciiValue!)) else { return nil }
            return String(cString: value)
        }
        let state = field("C").map(SQLState.init)
        let message = field("M") ?? Self.message(PQerrorMessage(conn))
        let broken = lost || PQstatus(conn) != CONNECTION_OK
        // A server that answers read-only (a standby after a failover) or
        // that it is going away will answer so again: the next call gets a
        // new connection rather than this one.
        if broken || state?.replacesConnection == true { drop() }
        return PostgresError(broken ? .connectionLost : .server, message, sqlState: state, constraint: field("n"))
    }

    /// libpq's message on one line.
    static func message(_ text: UnsafePointer<CChar>?) -> String {
        guard let text else { return "unknown error" }
        let lines = String(cString: text).split(whereSeparator: \.isNewline)
            .map { $0.trimmingPrefix(while: \.isWhitespace) }.filter { !$0.isEmpty }
        return lines.isEmpty ? "unknown error" : lines.joined(separator: "; ")
    }

    /// Copies every cell into one buffer (see ``PostgresCells``).
    private static func copy(_ result: OpaquePointer) -> PostgresResult {
        let rowCount = Int(PQntuples(result))
        let columnCount = Int(PQnfields(result))
        let columns = (0..<columnCount).map { String(cString: PQfname(result, Int32($0))) }
        let bytea = (0..<columnCount).map { PQftype(result, Int32($0)) == byteaOID }
        var size = 0
        for r in 0..<rowCount {
            for c in 0..<columnCount { size += Int(PQgetlength(result, Int32(r), Int32(c))) }
        }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(size)
        var bounds: [Int] = []
        bounds.reserveCapacity(2 * rowCount * columnCount)
        for r in 0..<Int32(rowCount) {
            for c in 0..<Int32(columnCount) {
                guard PQgetisnull(result, r, c) == 0, let value = PQgetvalue(result, r, c) else {
                    bounds.append(-1)
                    bounds.append(-1)
                    continue
                }
                let text = UnsafeBufferPointer(
                    start: UnsafeRawPointer(value).assumingMemoryBound(to: UInt8.self),
                    count: Int(PQgetlength(result, r, c)))
                bounds.append(bytes.count)
                if !bytea[Int(c)] || !appendByteaHex(text, to: &bytes) { bytes.append(contentsOf: text) }
                bounds.append(bytes.count)
            }
        }
        let cells = PostgresCells(bytes: bytes, bounds: bounds, columnCount: columnCount)
        return PostgresResult(
            columns: columns, rows: (0..<rowCount).map { PostgresRow(cells: cells, row: $0) },
            affectedRows: Int(String(cString: PQcmdTuples(result))) ?? 0)
    }
}

private let byteaOID: Oid = 17

/// Lays out parameters for libpq and calls `body` with them: text-format
/// values with an explicit type where the text alone is ambiguous (`int8`,
/// `bool`), `bytea` in binary format. A NUL in text is refused (PostgreSQL
/// text cannot hold it, and libpq would cut the value there).
private func withParameters<R>(
    _ parameters: [PostgresValue],
    _ body: (Int32, [Oid], [UnsafePointer<CChar>?], [Int32], [Int32]) -> R
) throws(PostgresError) -> R {
    for (i, parameter) in parameters.enumerated() {
        if case .text(let text) = parameter, text.utf8.contains(0) {
            throw PostgresError(.value, "parameter $\(i + 1) holds a NUL byte, which PostgreSQL text cannot store")
        }
    }
    var types: [Oid] = []
    var values: [UnsafePointer<CChar>?] = []
    var lengths: [Int32] = []
    var formats: [Int32] = []
    var buffers: [UnsafeMutableRawPointer] = []
    defer {
        for buffer in buffers { free(buffer) }
    }
    func append(_ type: Oid, _ bytes: some Collection<UInt8>, binary: Bool) {
        let buffer = malloc(bytes.count + 1)!
        buffers.append(buffer)
        let typed = buffer.bindMemory(to: UInt8.self, capacity: bytes.count + 1)
        _ = UnsafeMutableBufferPointer(start: typed, count: bytes.count).initialize(from: bytes)
        typed[bytes.count] = 0
        types.append(type)
        values.append(UnsafePointer(buffer.assumingMemoryBound(to: CChar.self)))
        lengths.append(Int32(bytes.count))
        formats.append(binary ? 1 : 0)
    }
    for parameter in parameters {
        switch parameter {
        case .null:
            types.append(0)
            values.append(nil)
            lengths.append(0)
            formats.append(0)
        case .text(let text): append(0, text.utf8, binary: false)
        case .int(let value): append(20, String(value).utf8, binary: false)
        case .bool(let value): append(16, (value ? "t" : "f").utf8, binary: false)
        case .bytes(let bytes): append(byteaOID, bytes, binary: true)
        case .array(let array): append(array.type, array.bytes, binary: true)
        }
    }
    return body(Int32(parameters.count), types, values, lengths, formats)
}
