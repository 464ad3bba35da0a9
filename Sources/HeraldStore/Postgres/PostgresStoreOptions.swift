public import Postgres

/// How the PostgreSQL backend reaches its database and shares work with the
/// other instances on it (`[store] backend = postgres`).
public struct PostgresStoreOptions: Sendable {
    /// The connection string (no password) and the password file.
    public var connection: PostgresConfiguration
    /// Connections in the pool, each on a thread of its own (`[store] pool_size`).
    public var poolSize: Int
    /// How long a claimed delivery stays this instance's without a renewal
    /// (`[store] lease`): a live instance renews its leases every third of
    /// it; the deliveries of an instance that stopped renewing return to the
    /// pool when it runs out, and another instance sends them.
    public var lease: Duration

    public init(connection: PostgresConfiguration, poolSize: Int = 8, lease: Duration = .seconds(30)) {
        self.connection = connection
        self.poolSize = poolSize
        self.lease = lease
    }
}
