public import HeraldCore

/// Where the store keeps its data, and so which backend serves it: the one
/// place that names a backend's own type.
public enum StoreLocation: Sendable, CustomStringConvertible {
    /// A SQLite database file on this host (created if needed), committed
    /// with `synchronous` (see ``Synchronous``).
    case sqlite(path: String, synchronous: Synchronous)
    /// A PostgreSQL database that several instances (one per host) may share.
    case postgres(PostgresStoreOptions)

    /// The database as logs and errors name it.
    public var description: String {
        switch self {
        case .sqlite(let path, _): path
        case .postgres(let options): "postgresql (\(options.connection.redactedDSN))"
        }
    }

    /// Opens (creating and migrating if needed) the store, checks the store
    /// key against it, and starts it. Throws ``StoreKeyError`` (naming
    /// `keyFile` and the database) when the key does not belong to the
    /// database, or when there is no key and the database holds data: a key
    /// is created (by `keySupply`) only for an empty database.
    /// `instance` names this Herald in what it records (`sent_by`).
    public func open(
        keySupply: StoreKeySupply, keyFile: String, instance: String = InstanceName.host,
        clock: any WallClock = SystemClock()
    ) throws -> any DeliveryStore {
        switch self {
        case .sqlite(let path, let synchronous):
            try SQLiteStore(
                path: path, keySupply: keySupply, keyFile: keyFile, synchronous: synchronous, instance: instance,
                clock: clock)
        case .postgres(let options):
            try PostgresStore(
                options: options, keySupply: keySupply, keyFile: keyFile, instance: instance, clock: clock)
        }
    }
}
