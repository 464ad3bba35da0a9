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
    /// The longest a delivery stays in flight after its claim, renewed or
    /// not (`[store] lease_max_age`): past it any instance takes it back, so
    /// that a live but stuck instance cannot hold work for ever.
    public var leaseMaxAge: Duration
    /// How long a caller waits for one store call (`[store] call_timeout`):
    /// past it the call fails with ``StoreTimeout`` (`store_unavailable`).
    public var callTimeout: Duration
    /// The health ping's own deadline: a store whose calls are stuck is
    /// reported within seconds.
    public var pingTimeout: Duration
    /// This Herald's version, recorded in its instance row.
    public var version: String

    public init(
        connection: PostgresConfiguration, poolSize: Int = 8, lease: Duration = .seconds(30),
        leaseMaxAge: Duration = .seconds(600), callTimeout: Duration = .seconds(5), pingTimeout: Duration = .seconds(2),
        version: String = "unknown"
    ) {
        self.connection = connection
        self.poolSize = poolSize
        self.lease = lease
        self.leaseMaxAge = leaseMaxAge
        self.callTimeout = callTimeout
        self.pingTimeout = pingTimeout
        self.version = version
    }
}
