import Foundation
import HeraldIO
import HeraldTestSupport
import Postgres
import Testing

/// Monotonic time the test moves by hand.
final class ManualClock: Sendable {
    private let now = Locked<UInt64>(1_000_000_000)
    func advance(_ d: Duration) {
        now.withLock {
            $0 += UInt64(d.components.seconds) * 1_000_000_000 + UInt64(d.components.attoseconds / 1_000_000_000)
        }
    }
    var read: @Sendable () -> UInt64 { { [now] in now.withLock { $0 } } }
}

@Suite("PostgreSQL outages: reconnect and bounded backoff", .serialized)
struct PostgresOutageTests {
    @Test(
        "a restart under open connections: the first call fails as connection lost, later calls reconnect with their statements and channels"
    )
    func restartUnderOpenConnection() throws {
        let server = try PostgresServer()
        defer { server.destroy() }
        let db = try connection(server)
        let listener = try connection(server)
        try db.executeScript("CREATE TABLE items (v bigint)")
        let put = PostgresStatement(name: "put", sql: "INSERT INTO items VALUES ($1)")
        try db.execute(put, [.int(1)])
        try listener.listen("wake")

        try server.restart()

        let lost = try #require(postgresError { try db.execute(put, [.int(2)]) })
        #expect(lost.kind == .connectionLost, "\(lost)")
        #expect(lost.isConnectionFailure)
        #expect(!db.isConnected)
        try db.execute(put, [.int(3)])
        #expect(db.reconnects == 1)
        #expect(try db.execute("SELECT array_agg(v ORDER BY v)::text FROM items").first?.text(0) == "{1,3}")

        #expect(postgresError { _ = try listener.notifications(within: .seconds(5)) }?.kind == .connectionLost)
        try listener.connect()
        #expect(listener.reconnects == 1)
        try db.notify("wake", payload: "again")
        var received: [PostgresNotification] = []
        let deadline = Date().addingTimeInterval(30)
        while received.isEmpty && Date() < deadline { received = try listener.notifications(within: .seconds(1)) }
        #expect(received.map(\.payload) == ["again"])

        // Inside a transaction the lost connection is not replaced silently.
        try db.begin()
        try db.execute(put, [.int(4)])
        try server.restart()
        #expect(postgresError { try db.execute(put, [.int(5)]) }?.kind == .connectionLost)
        let still = postgresError { try db.execute(put, [.int(6)]) }
        #expect(still?.kind == .connectionLost)
        #expect(still?.message.contains("inside a transaction") == true)
        #expect(postgresError { try db.commit() }?.kind == .connectionLost)
        try db.execute(put, [.int(7)])
        #expect(try db.execute("SELECT array_agg(v ORDER BY v)::text FROM items").first?.text(0) == "{1,3,7}")
    }

    @Test(
        "a failed connect waits before the next attempt, the wait doubles up to its maximum and resets after a success")
    func boundedBackoff() throws {
        let server = try PostgresServer()
        defer { server.destroy() }
        let clock = ManualClock()
        let config = try PostgresConfiguration(
            dsn: server.dsn, passwordFile: server.passwordFile, reconnectDelay: .seconds(1),
            maxReconnectDelay: .seconds(4), clock: clock.read)
        let db = PostgresConnection(configuration: config)
        try db.connect()
        try server.stop()

        #expect(postgresError { try db.execute("SELECT 1") }?.kind == .connectionLost)
        // The first reconnect is tried at once; it fails, and so begins the backoff.
        let refused = postgresError { try db.execute("SELECT 1") }
        #expect(refused?.kind == .connect, "\(String(describing: refused))")
        #expect(refused?.isConnectionFailure == true)
        let waiting = postgresError { try db.execute("SELECT 1") }
        #expect(waiting?.kind == .unavailable)
        #expect(waiting?.message.contains("next attempt in 1000 ms") == true, "\(String(describing: waiting))")

        clock.advance(.seconds(1))
        #expect(postgresError { try db.connect() }?.kind == .connect)
        #expect(db.nextReconnectDelay == .seconds(4))
        clock.advance(.milliseconds(1999))
        #expect(postgresError { try db.connect() }?.kind == .unavailable)
        clock.advance(.milliseconds(1))
        #expect(postgresError { try db.connect() }?.kind == .connect)
        // From now on the wait stays at the maximum.
        for _ in 0..<6 {
            #expect(postgresError { try db.connect() }?.kind == .unavailable)
            clock.advance(.seconds(4))
            #expect(postgresError { try db.connect() }?.kind == .connect)
            #expect(db.nextReconnectDelay == .seconds(4))
        }

        try server.start()
        clock.advance(.seconds(4))
        #expect(try db.execute("SELECT 1").first?.int64(0) == 1)
        #expect(db.nextReconnectDelay == .seconds(1))
        #expect(db.reconnects == 1)
    }
}

@Suite("PostgreSQL pool: threads, bounded queue", .serialized)
struct PostgresPoolTests {
    @Test("jobs run on the pool's own threads, two connections at once")
    func concurrentConnections() throws {
        let pool = PostgresPool(configuration: try configuration(try PostgresServer.shared()), size: 2, queueLimit: 8)
        defer { pool.close() }
        let firstWaits = DispatchSemaphore(value: 0)
        let done = DispatchSemaphore(value: 0)
        let results = Locked<[String: Result<Int64, any Error>]>([:])
        pool.submit({ db in
            // Only a second connection on another thread can let this one go.
            guard firstWaits.wait(timeout: .now() + 30) == .success else {
                throw PostgresError(.closed, "no second thread")
            }
            return try db.execute("SELECT pg_backend_pid()").first!.int64(0)
        }) { result in
            results.withLock { $0["first"] = result }
            done.signal()
        }
        pool.submit({ db in
            defer { firstWaits.signal() }
            return try db.execute("SELECT pg_backend_pid()").first!.int64(0)
        }) { result in
            results.withLock { $0["second"] = result }
            done.signal()
        }
        #expect(done.wait(timeout: .now() + 60) == .success)
        #expect(done.wait(timeout: .now() + 60) == .success)
        let pids = try results.withLock { r in try [r["first"]!.get(), r["second"]!.get()] }
        #expect(pids[0] != pids[1])
        #expect(try pool.sync { db in try db.execute("SELECT 41 + 1").first!.int64(0) } == 42)
    }

    @Test("a full job queue refuses at once with queue_full; the accepted jobs all complete; a closed pool refuses")
    func queueBound() throws {
        let pool = PostgresPool(configuration: try configuration(try PostgresServer.shared()), size: 1, queueLimit: 2)
        let started = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        let completed = DispatchSemaphore(value: 0)
        let outcomes = Locked<[Int: Result<Int64, any Error>]>([:])
        func submit(_ n: Int, blocking: Bool = false) {
            pool.submit({ db in
                if blocking {
                    started.signal()
                    _ = release.wait(timeout: .now() + 60)
                }
                return try db.execute("SELECT $1::bigint", [.int(Int64(n))]).first!.int64(0)
            }) { result in
                outcomes.withLock { $0[n] = result }
                completed.signal()
            }
        }
        submit(0, blocking: true)
        #expect(started.wait(timeout: .now() + 30) == .success)
        submit(1)
        submit(2)
        #expect(pool.queued == 2)
        submit(3)
        let refused = outcomes.withLock { $0[3] }
        guard case .failure(let error as PostgresError)? = refused else {
            Issue.record("the job past the bound was not refused at once: \(String(describing: refused))")
            release.signal()
            pool.close()
            return
        }
        #expect(error.kind == .queueFull)
        #expect(error.message.contains("2 jobs waiting"))
        release.signal()
        // Three accepted jobs, and the refusal's completion already in.
        for _ in 0..<4 { #expect(completed.wait(timeout: .now() + 60) == .success) }
        #expect(try outcomes.withLock { r in try (0...2).map { try r[$0]?.get() } } == [0, 1, 2])
        pool.close()
        submit(4)
        let closed = outcomes.withLock { $0[4] }
        guard case .failure(let after as PostgresError)? = closed else {
            Issue.record("a closed pool took a job")
            return
        }
        #expect(after.kind == .closed)
    }
}
