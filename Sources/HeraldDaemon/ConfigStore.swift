public import HeraldStore
import Postgres
public import HeraldConfiguration

#if canImport(Glibc)
    import Glibc
#endif

extension HeraldConfig {
    /// The database `[store]` names: `herald.db` in `state_dir`, or the
    /// PostgreSQL database of `dsn`. For postgres the password file, when
    /// one is named, must be a regular file this process can open that
    /// grants nothing to group or others (it is read at each connect, not
    /// here). Errors name the `[store]` key.
    public func storeLocation() throws(ConfigError) -> StoreLocation {
        switch store.backend {
        case .sqlite:
            return .sqlite(
                path: ConfigPath.join(server.stateDirectory, "herald.db"),
                synchronous: store.synchronous == .full ? .full : .normal)
        case .postgres:
            guard let dsn = store.dsn else {
                throw ConfigError(
                    file: file, line: nil, section: "store", key: "dsn", message: "backend = postgres needs dsn")
            }
            if let passwordFile = store.passwordFile { try Self.checkPasswordFile(passwordFile) }
            let connection: PostgresConfiguration
            do {
                connection = try PostgresConfiguration(
                    dsn: dsn, passwordFile: store.passwordFile?.path, applicationName: "herald-\(server.instanceName)")
            } catch {
                throw ConfigError(
                    file: file, line: nil, section: "store", key: "dsn",
                    message: "must be a libpq connection string without a password: \(error.message)")
            }
            return .postgres(
                PostgresStoreOptions(
                    connection: connection, poolSize: store.poolSize, lease: store.lease,
                    leaseMaxAge: max(store.leaseMaxAge, store.lease), callTimeout: store.callTimeout,
                    version: HeraldService.version))
        }
    }

    /// Opens the file (proving it exists and is readable) and checks its
    /// type and mode, as the store key is checked; reads nothing.
    static func checkPasswordFile(_ file: ConfigFileReference) throws(ConfigError) {
        func failure(_ message: String) -> ConfigError { ConfigError(file.location, "\(file.path): \(message)") }
        // O_NONBLOCK: a FIFO in place of the file must not hang startup.
        let fd = open(file.path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)
        guard fd >= 0 else { throw failure("cannot open: \(String(cString: strerror(errno)))") }
        defer { _ = close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0 else { throw failure("cannot stat: \(String(cString: strerror(errno)))") }
        guard st.st_mode & S_IFMT == S_IFREG else { throw failure("not a regular file") }
        let permissions = st.st_mode & 0o7777
        guard permissions & 0o077 == 0 else {
            throw failure(
                "mode \(ConfigValue.octal(permissions)) is too open: the password file must not be accessible to group or others (chmod 0600)"
            )
        }
        guard st.st_size > 0 else { throw failure("is empty") }
    }
}
