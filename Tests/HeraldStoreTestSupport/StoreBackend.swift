public import Foundation
public import HeraldCore
public import HeraldCrypto
public import HeraldStore
import HeraldTestSupport
public import Postgres

/// The store backends the store tests run against. A test of the registry,
/// the queue or the scheduler takes the backend as its argument
/// (`@Test(arguments: StoreBackend.allCases)`) and opens its store through a
/// ``StoreScratch``, so that a new backend runs the very same tests,
/// assertions and fixtures by adding its case here (and to the few switches
/// on it that reach into a backend's own storage).
public enum StoreBackend: String, CaseIterable, Sendable, CustomStringConvertible {
    case sqlite
    /// A database of its own on the test process's PostgreSQL server
    /// (``PostgresServer/shared()``, started at first use).
    case postgres

    public var description: String { rawValue }
}

/// An empty store of one backend for one test: opened, closed and opened
/// again (a restart) as the test likes, then removed.
public struct StoreScratch: Sendable {
    public let backend: StoreBackend
    /// A directory of the test's own (key files; SQLite's database).
    public let dir: URL

    /// The PostgreSQL database (`.postgres` only), created empty for this scratch.
    public let postgres: PostgresStoreOptions?

    public init(_ backend: StoreBackend, prefix: String = "herald-store", lease: Duration = .seconds(30)) throws {
        self.backend = backend
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("\(prefix)-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        switch backend {
        case .sqlite:
            postgres = nil
        case .postgres:
            let server = try PostgresServer.shared()
            let name = "herald_" + UUID().uuidString.prefix(12).lowercased().replacingOccurrences(of: "-", with: "")
            let admin = try PostgresConfiguration(dsn: server.dsn, passwordFile: server.passwordFile)
            let c = PostgresConnection(configuration: admin)
            defer { c.close() }
            try c.executeScript("CREATE DATABASE \(name)")
            let dsn = server.dsn.replacingOccurrences(of: "dbname=postgres", with: "dbname=\(name)")
            postgres = PostgresStoreOptions(
                connection: try PostgresConfiguration(dsn: dsn, passwordFile: server.passwordFile), poolSize: 3,
                lease: lease)
        }
    }

    /// The SQLite database file (`.sqlite` only).
    public var databasePath: String { dir.appendingPathComponent("herald.db").path }

    /// Where the store lives. `synchronous` is SQLite's commit setting.
    public func location(synchronous: Synchronous = .normal) -> StoreLocation {
        switch backend {
        case .sqlite: .sqlite(path: databasePath, synchronous: synchronous)
        case .postgres: .postgres(postgres!)
        }
    }

    /// Opens (creating at first) the store with a key that must belong to it.
    public func open(
        key: StoreKey, clock: any WallClock = SystemClock(), synchronous: Synchronous = .normal,
        instance: String = "test-instance"
    ) throws -> any DeliveryStore {
        try open(
            keySupply: .key(key), keyFile: "(given key)", clock: clock, synchronous: synchronous, instance: instance)
    }

    /// Opens (creating at first) the store as the daemon does.
    public func open(
        keySupply: StoreKeySupply, keyFile: String, clock: any WallClock = SystemClock(),
        synchronous: Synchronous = .normal, instance: String = "test-instance"
    ) throws -> any DeliveryStore {
        try location(synchronous: synchronous).open(
            keySupply: keySupply, keyFile: keyFile, instance: instance, clock: clock)
    }

    /// Deletes what the store left (close it first).
    public func remove() {
        try? FileManager.default.removeItem(at: dir)
        if let postgres, let server = try? PostgresServer.shared(),
            let admin = try? PostgresConfiguration(dsn: server.dsn, passwordFile: server.passwordFile)
        {
            let c = PostgresConnection(configuration: admin)
            defer { c.close() }
            let name = postgres.connection.dsn.split(separator: " ").first { $0.hasPrefix("dbname=") }?.dropFirst(7)
            if let name { try? c.executeScript("DROP DATABASE IF EXISTS \(name) WITH (FORCE)") }
        }
    }
}
