/// A PostgreSQL failure: what kind, the server's SQLSTATE when the server
/// answered, and its primary message. Never carries a password or the
/// server's DETAIL text (which quotes row values, sealed tokens included).
public struct PostgresError: Error, Sendable, CustomStringConvertible {
    /// What failed. A struct with `static let` members: the set may grow.
    public struct Kind: Hashable, Sendable, CustomStringConvertible {
        public let name: String
        public init(_ name: String) { self.name = name }
        public var description: String { name }

        /// The connection string or the password file cannot be used.
        public static let configuration = Kind("configuration")
        /// A connection could not be opened.
        public static let connect = Kind("connect")
        /// The connection broke during a call; whether the statement ran is unknown.
        public static let connectionLost = Kind("connection_lost")
        /// A reconnect is not due yet (bounded backoff after a failed connect).
        public static let unavailable = Kind("unavailable")
        /// The server refused or failed the statement (see `sqlState`).
        public static let server = Kind("server")
        /// A value cannot be sent (a NUL in text) or a column cannot be read as asked.
        public static let value = Kind("value")
        /// The pool's job queue is full.
        public static let queueFull = Kind("queue_full")
        /// The pool is closed.
        public static let closed = Kind("closed")
    }

    public let kind: Kind
    /// The server's five-character error code, when the server sent one.
    public let sqlState: SQLState?
    public let message: String
    /// The constraint a violation names (`23505` and friends), when the server sent one.
    public let constraint: String?

    public init(_ kind: Kind, _ message: String, sqlState: SQLState? = nil, constraint: String? = nil) {
        self.kind = kind
        self.message = message
        self.sqlState = sqlState
        self.constraint = constraint
    }

    /// The database cannot serve the caller now (connect failed, connection
    /// lost, waiting to reconnect, or the server answered that it is
    /// read-only or going away, see ``SQLState/replacesConnection``): the
    /// caller reports the store unavailable.
    public var isConnectionFailure: Bool {
        kind == .connect || kind == .connectionLost || kind == .unavailable
            || sqlState?.replacesConnection == true
    }

    public var description: String {
        var text = "postgres \(kind)"
        if let sqlState { text += " \(sqlState.code)" }
        text += ": \(message)"
        if let constraint { text += " (constraint \(constraint))" }
        return text
    }
}

/// A SQLSTATE code; the classes Herald acts on have names.
public struct SQLState: Hashable, Sendable, CustomStringConvertible {
    public let code: String
    public init(_ code: String) { self.code = code }
    public var description: String { code }

    public static let uniqueViolation = SQLState("23505")
    public static let foreignKeyViolation = SQLState("23503")
    public static let checkViolation = SQLState("23514")
    public static let serializationFailure = SQLState("40001")
    public static let deadlockDetected = SQLState("40P01")
    public static let lockNotAvailable = SQLState("55P03")
    /// A write in a read-only transaction: on a server that has
    /// `default_transaction_read_only` on, or a standby after a failover.
    public static let readOnlySQLTransaction = SQLState("25006")
    /// `statement_timeout` ended the statement.
    public static let queryCanceled = SQLState("57014")
    public static let adminShutdown = SQLState("57P01")
    public static let crashShutdown = SQLState("57P02")
    public static let cannotConnectNow = SQLState("57P03")

    /// Class 08 (connection exception) or 57P0x (the server is going away).
    public var isConnectionClass: Bool { code.hasPrefix("08") || code.hasPrefix("57P0") }

    /// The connection that got this answer is closed, never used again: a
    /// connection exception, a server going away, or a read-only server
    /// (which stays read-only for the session; a new connection with
    /// `target_session_attrs=read-write` finds the writable one).
    public var replacesConnection: Bool { isConnectionClass || self == .readOnlySQLTransaction }
}
