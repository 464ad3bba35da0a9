internal import CLibPQ

#if canImport(Glibc)
    import Glibc
#endif

/// Where and how to connect: a libpq connection string without a password,
/// the file that holds the password, and the reconnect backoff.
///
/// Every connection bounds its waits (see ``defaultParameters`` and
/// ``defaultServerSettings``) unless the connection string, or libpq's
/// environment variable for the parameter, sets its own. The description
/// shows the connection string with every secret libpq knows (`sslpassword`)
/// hidden.
public struct PostgresConfiguration: Sendable, CustomStringConvertible, CustomDebugStringConvertible,
    CustomReflectable
{
    /// A libpq connection string (`host=/run/postgresql dbname=herald user=herald`
    /// or a `postgresql://` URI), checked to carry no password. It may carry
    /// `sslpassword`: render ``redactedDSN`` or the configuration itself, never this.
    public let dsn: String
    /// Read at every connect (so a rotated password is picked up), never logged.
    public let passwordFile: String?
    /// `application_name` unless the connection string sets one.
    public let applicationName: String
    /// Seconds libpq waits for a connection (`connect_timeout`) unless the connection string sets one.
    public let connectTimeoutSeconds: Int
    /// The wait before the second connect attempt after a failed one; it
    /// doubles with every further failure, up to `maxReconnectDelay`.
    public let reconnectDelay: Duration
    public let maxReconnectDelay: Duration
    /// Monotonic nanoseconds, injectable so backoff is testable without sleeping.
    public let clock: @Sendable () -> UInt64
    /// The connection string with every secret's value replaced by `***`:
    /// the string as given when it holds none.
    public let redactedDSN: String
    /// The parameters the connection string sets, by keyword.
    let given: [String: String]

    /// libpq parameters every connection uses unless the connection string
    /// sets them: TCP keepalives and a TCP user timeout find a dead host or
    /// network within about 20 s, where the kernel's defaults take hours on an
    /// idle connection and some 15 minutes on a busy one (they apply to TCP,
    /// not to a Unix socket); and only a server that takes writes is
    /// accepted, so a standby left behind by a failover is refused at connect.
    public static let defaultParameters: [(keyword: String, value: String)] = [
        ("keepalives", "1"),
        ("keepalives_idle", "10"),
        ("keepalives_interval", "3"),
        ("keepalives_count", "3"),
        ("tcp_user_timeout", "10000"),
        ("target_session_attrs", "read-write"),
    ]

    /// Server settings sent in libpq's `options` (`-c name=value`), each
    /// unless the connection string's own `options` sets it: no statement
    /// runs longer than 10 s, no lock is waited for longer than 2 s (a host
    /// that died holding one stalls nobody for long), and a transaction left
    /// idle is ended after 60 s, releasing its locks. Values in milliseconds.
    public static let defaultServerSettings: [(name: String, value: String)] = [
        ("statement_timeout", "10000"),
        ("lock_timeout", "2000"),
        ("idle_in_transaction_session_timeout", "60000"),
    ]

    /// `connect_timeout` in seconds unless `init` or the connection string says otherwise.
    public static let defaultConnectTimeoutSeconds = 5

    /// Throws `.configuration` when the connection string does not parse or
    /// carries a password (the password belongs in `passwordFile`).
    public init(
        dsn: String, passwordFile: String? = nil, applicationName: String = "herald",
        connectTimeoutSeconds: Int = defaultConnectTimeoutSeconds,
        reconnectDelay: Duration = .milliseconds(100), maxReconnectDelay: Duration = .seconds(5),
        clock: @escaping @Sendable () -> UInt64 = monotonicNanoseconds
    ) throws(PostgresError) {
        let parsed = try Self.parse(dsn: dsn)
        guard reconnectDelay > .zero, maxReconnectDelay >= reconnectDelay else {
            throw PostgresError(.configuration, "the reconnect delays must be positive, the maximum at least the first")
        }
        self.dsn = dsn
        self.passwordFile = passwordFile
        self.applicationName = applicationName
        self.connectTimeoutSeconds = connectTimeoutSeconds
        self.reconnectDelay = reconnectDelay
        self.maxReconnectDelay = maxReconnectDelay
        self.clock = clock
        given = parsed.given
        redactedDSN = parsed.secrets ? Self.render(parsed.ordered, hiding: parsed.secretKeywords) : dsn
    }

    public var description: String {
        "PostgresConfiguration(dsn: \(redactedDSN), password_file: \(passwordFile ?? "none"))"
    }

    public var debugDescription: String { description }

    /// `dump` and the debugger show the redacted string, never `dsn`.
    public var customMirror: Mirror {
        Mirror(
            self,
            children: [
                "redactedDSN": redactedDSN, "passwordFile": passwordFile as Any, "applicationName": applicationName,
                "connectTimeoutSeconds": connectTimeoutSeconds, "reconnectDelay": reconnectDelay,
                "maxReconnectDelay": maxReconnectDelay,
            ])
    }

    /// What libpq's own parser finds in the string. Its message is not
    /// repeated: it may quote part of the string.
    private static func parse(
        dsn: String, allowingPassword: Bool = false
    ) throws(PostgresError) -> (
        given: [String: String], ordered: [(String, String)], secrets: Bool, secretKeywords: Set<String>
    ) {
        var error: UnsafeMutablePointer<CChar>?
        guard let options = PQconninfoParse(dsn, &error) else {
            if let error { PQfreemem(error) }
            throw PostgresError(.configuration, "the dsn is not a libpq connection string")
        }
        defer { PQconninfoFree(options) }
        var given: [String: String] = [:]
        var ordered: [(String, String)] = []
        var secretKeywords: Set<String> = []
        var secrets = false
        var option = options
        while let keyword = option.pointee.keyword {
            defer { option += 1 }
            let name = String(cString: keyword)
            // libpq marks the options whose value it never shows with "*".
            let secret = option.pointee.dispchar.map { String(cString: $0).contains("*") } ?? false
            if secret { secretKeywords.insert(name) }
            guard let value = option.pointee.val else { continue }
            if name == "password", value.pointee != 0, !allowingPassword {
                throw PostgresError(.configuration, "the dsn carries a password: put it in the password file instead")
            }
            if secret { secrets = true }
            given[name] = String(cString: value)
            ordered.append((name, String(cString: value)))
        }
        return (given, ordered, secrets, secretKeywords)
    }

    /// Checks a connection string as `init` does.
    static func check(dsn: String) throws(PostgresError) {
        _ = try parse(dsn: dsn)
    }

    /// A connection string as logs, errors and the effective configuration
    /// may show it: as given when it holds no secret, else its parameters
    /// with every secret's value (`password`, `sslpassword`, a URI's
    /// `user:password@`) as `***`; a string libpq cannot parse is not shown.
    public static func redacted(_ dsn: String) -> String {
        guard let parsed = try? parse(dsn: dsn, allowingPassword: true) else {
            return "(not a libpq connection string)"
        }
        return parsed.secrets ? render(parsed.ordered, hiding: parsed.secretKeywords) : dsn
    }

    /// `keyword=value` pairs in libpq's syntax, hidden keywords' values as `***`.
    static func render(_ pairs: [(String, String)], hiding hidden: Set<String>) -> String {
        pairs.map { keyword, value in
            if hidden.contains(keyword) { return "\(keyword)=***" }
            let plain = !value.isEmpty && !value.contains { $0 == "'" || $0 == "\\" || $0.isWhitespace }
            if plain { return "\(keyword)=\(value)" }
            var quoted = "'"
            for c in value {
                if c == "'" || c == "\\" { quoted.append("\\") }
                quoted.append(c)
            }
            return "\(keyword)=\(quoted)'"
        }.joined(separator: " ")
    }

    /// The keyword/value pairs handed to `PQconnectdbParams` (with
    /// `expand_dbname`), the password left to the caller: defaults first, so
    /// that the connection string (in `dbname`) overrides them; a default is
    /// also left out when libpq's environment variable for it is set, as
    /// libpq would prefer that to its own default. `options` comes after the
    /// string: its own (or `PGOPTIONS`), with each default server setting it
    /// does not make appended.
    func connectionParameters(
        environment: (String) -> String? = { getenv($0).map { String(cString: $0) } }
    )
        -> [(keyword: String, value: String)]
    {
        let environmentVariables = [
            "connect_timeout": "PGCONNECT_TIMEOUT", "target_session_attrs": "PGTARGETSESSIONATTRS",
            "options": "PGOPTIONS",
        ]
        func unset(_ keyword: String) -> Bool {
            given[keyword] == nil && environmentVariables[keyword].flatMap(environment) == nil
        }
        var parameters: [(keyword: String, value: String)] = []
        for (keyword, value) in [("connect_timeout", "\(connectTimeoutSeconds)")] + Self.defaultParameters
        where unset(keyword) {
            parameters.append((keyword, value))
        }
        parameters.append(("fallback_application_name", applicationName))
        parameters.append(("dbname", dsn))
        let options = given["options"] ?? environment("PGOPTIONS") ?? ""
        let set = Self.settingNames(inOptions: options)
        let added = Self.defaultServerSettings.filter { !set.contains($0.name) }.map { "-c \($0.name)=\($0.value)" }
        parameters.append(("options", ([options] + added).filter { !$0.isEmpty }.joined(separator: " ")))
        // Rows are decoded as UTF-8, whatever the string says.
        parameters.append(("client_encoding", "UTF8"))
        return parameters
    }

    /// The names of the settings an `options` string gives the server
    /// (`-c name=value`, `-cname=value`, `--name=value`), folded as the
    /// server folds them: lower case, `-` as `_`. Words split on unescaped
    /// white space, as the server splits them.
    static func settingNames(inOptions options: String) -> Set<String> {
        var words: [String] = []
        var word = ""
        var escaped = false
        for c in options {
            if escaped {
                word.append(c)
                escaped = false
            } else if c == "\\" {
                escaped = true
            } else if c.isWhitespace {
                if !word.isEmpty { words.append(word) }
                word = ""
            } else {
                word.append(c)
            }
        }
        if !word.isEmpty { words.append(word) }
        var names: Set<String> = []
        var index = 0
        while index < words.count {
            var setting: String?
            let w = words[index]
            if w == "-c" {
                index += 1
                setting = index < words.count ? words[index] : nil
            } else if w.hasPrefix("--") {
                setting = String(w.dropFirst(2))
            } else if w.hasPrefix("-c") {
                setting = String(w.dropFirst(2))
            }
            if let setting, let name = setting.split(separator: "=", maxSplits: 1).first {
                names.insert(String(name.lowercased().map { $0 == "-" ? "_" : $0 }))
            }
            index += 1
        }
        return names
    }

    /// The password file's first line, as NUL-terminated bytes the caller
    /// wipes after use; nil without a password file.
    func readPassword() throws(PostgresError) -> [CChar]? {
        guard let passwordFile else { return nil }
        let fd = open(passwordFile, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            throw PostgresError(.configuration, "password file \(passwordFile): \(String(cString: strerror(errno)))")
        }
        defer { close(fd) }
        var chunk = [CChar](repeating: 0, count: 256)
        defer { wipe(&chunk) }
        // Room for the longest read and the NUL up front: an array that grew
        // would leave unwiped copies of the password in the memory it let go.
        var bytes: [CChar] = []
        bytes.reserveCapacity(4096 + chunk.count + 1)
        while bytes.count <= 4096 {
            let n = read(fd, &chunk, chunk.count)
            if n < 0 {
                if errno == EINTR { continue }
                wipe(&bytes)
                throw PostgresError(
                    .configuration, "password file \(passwordFile): \(String(cString: strerror(errno)))")
            }
            if n == 0 { break }
            bytes.append(contentsOf: chunk[0..<n])
        }
        if let newline = bytes.firstIndex(where: { $0 == 0x0A || $0 == 0x0D }) {
            for i in newline..<bytes.count { bytes[i] = 0 }
            bytes.removeSubrange(newline...)
        }
        guard !bytes.isEmpty, bytes.count <= 4096, !bytes.contains(0) else {
            wipe(&bytes)
            throw PostgresError(.configuration, "password file \(passwordFile): empty, too long or not text")
        }
        bytes.append(0)
        return bytes
    }
}

/// CLOCK_MONOTONIC in nanoseconds.
public func monotonicNanoseconds() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
}

/// Overwrites a secret before its memory is let go.
func wipe(_ bytes: inout [CChar]) {
    bytes.withUnsafeMutableBytes { raw in
        guard let base = raw.baseAddress else { return }
        explicit_bzero(base, raw.count)  // a memset the optimizer may not drop
    }
}

extension Duration {
    var nanoseconds: UInt64 {
        let (seconds, attoseconds) = components
        return UInt64(max(0, seconds)) * 1_000_000_000 + UInt64(max(0, attoseconds) / 1_000_000_000)
    }
}
