import Foundation
import HeraldCore
import HeraldCrypto
@testable import HeraldStore
import HeraldStoreTestSupport
import HeraldTestSupport
import Postgres
import Testing

/// Two registrations of two users racing on one PostgreSQL database, the
/// interleaving forced: one runs with the store's own registry code on a
/// connection of the test's, inside a transaction the test holds open (as
/// another instance's batch would be, mid-commit); the other goes through a
/// store and must wait on that transaction's row lock. The test commits the
/// first only once PostgreSQL shows the second blocked by it
/// (`pg_blocking_pids`), then judges by `device.list` what both were told.
private final class Race: @unchecked Sendable {
    let scratch: StoreScratch
    let key: StoreKey
    let store: any DeliveryStore
    /// The other instance's transaction, held open by the test.
    private let held: PostgresConnection
    /// Reads pg_stat_activity (outside any transaction, so every read is fresh).
    private let monitor: PostgresConnection
    private var pending: Pending?

    init() throws {
        scratch = try StoreScratch(.postgres, prefix: "herald-race")
        key = try StoreKey.generate()
        store = try scratch.open(key: key, instance: "host-b")
        let configuration = try #require(scratch.postgres).connection
        held = PostgresConnection(configuration: configuration)
        monitor = PostgresConnection(configuration: configuration)
    }

    func close() {
        try? held.rollback()
        _ = pending?.wait(seconds: 30)
        held.close()
        monitor.close()
        store.close()
        scratch.remove()
    }

    @discardableResult
    func register(_ r: Registration, cap: Int = 1000) throws -> RegistrationOutcome {
        try store.sync { s, done in s.register(r, deviceCap: cap, completion: done) }
    }

    func tokenHashes(_ user: String) throws -> Set<String> {
        Set(try store.sync { s, done in s.list(app: "default", user: user, completion: done) }.map(\.tokenHash))
    }

    /// Runs `r` with the store's own registry code in the held transaction, left uncommitted.
    @discardableResult
    func registerHeld(_ r: Registration, cap: Int = 1000) throws -> RegistrationOutcome {
        try held.begin()
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        return try PostgresRegistry(held, key: key).register(r, deviceCap: cap, now: now)
    }

    func commitHeld() throws { try held.commit() }

    /// Starts `r` through the store on a thread of its own.
    func start(_ r: Registration, cap: Int = 1000) -> Pending {
        let p = Pending()
        pending = p
        let store = store
        Thread.detachNewThread {
            p.set(Result { try store.sync { s, done in s.register(r, deviceCap: cap, completion: done) } })
        }
        return p
    }

    /// Whether a session of the store is waiting on a lock the held
    /// transaction holds; waits up to 15 s for it, or until `pending` ends.
    func blockedByHeld(_ p: Pending) throws -> Bool {
        let pid = try #require(try held.execute("SELECT pg_backend_pid()").first?.int64(0))
        let deadline = Date().addingTimeInterval(15)
        while Date() < deadline {
            let waiting = try monitor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid))", [.int(pid)]
            ).first?.int64(0)
            if waiting ?? 0 > 0 { return true }
            if p.isDone { return false }
            Thread.sleep(forTimeInterval: 0.01)
        }
        return false
    }
}

/// One registration running on another thread.
private final class Pending: @unchecked Sendable {
    private let condition = NSCondition()
    private var result: Result<RegistrationOutcome, any Error>?

    func set(_ r: Result<RegistrationOutcome, any Error>) {
        condition.lock()
        result = r
        condition.broadcast()
        condition.unlock()
    }

    var isDone: Bool {
        condition.lock()
        defer { condition.unlock() }
        return result != nil
    }

    /// Its result, or nil if it has not ended within `seconds`.
    func wait(seconds: Double) -> Result<RegistrationOutcome, any Error>? {
        condition.lock()
        defer { condition.unlock() }
        let deadline = Date().addingTimeInterval(seconds)
        while result == nil { if !condition.wait(until: deadline) { break } }
        return result
    }
}

private func fcm(
    _ user: String, _ token: String, installation: String? = nil, version: Int64? = nil
) -> Registration {
    Registration(
        app: "default", user: user, platform: .fcm, environment: nil, token: token, registrationID: installation,
        version: version)
}

@Suite("Registrations racing across instances on PostgreSQL", .serialized)
struct RegistrationRaceTests {
    @Test(
        "A moves her installation from T1 to T2 while B registers T1: B waits for A's row, then A keeps T2 and B has T1",
        arguments: [false, true])
    func moveThenClaim(claimByInstallation: Bool) throws {
        let t = try Race()
        defer { t.close() }
        try t.register(fcm("ann", "race-t1", installation: "ann-phone", version: 1))
        if claimByInstallation {
            // B's own installation moves onto T1: the registration_id path's reclaim.
            try t.register(fcm("bob", "race-bob-old", installation: "bob-phone", version: 1))
        }
        let move = try t.registerHeld(fcm("ann", "race-t2", installation: "ann-phone", version: 2))
        #expect(move.created == false && move.tokenHash == Identity.tokenHash("race-t2"))
        let claim = t.start(
            claimByInstallation
                ? fcm("bob", "race-t1", installation: "bob-phone", version: 2) : fcm("bob", "race-t1"))
        try #require(try t.blockedByHeld(claim), "B's registration of T1 did not wait for A's uncommitted move")
        try t.commitHeld()
        let outcome = try #require(claim.wait(seconds: 15), "B's registration never ended").get()
        #expect(outcome.tokenHash == Identity.tokenHash("race-t1"))
        #expect(outcome.reclaimed == false, "T1 was nobody's once A's move committed")
        #expect(try t.tokenHashes("ann") == [Identity.tokenHash("race-t2")], "A's acknowledged move was lost")
        #expect(try t.tokenHashes("bob") == [Identity.tokenHash("race-t1")])
    }

    @Test("B registers T1 while A moves her installation from T1 to T2: A's move waits for B, then A has T2")
    func claimThenMove() throws {
        let t = try Race()
        defer { t.close() }
        try t.register(fcm("ann", "race-t1", installation: "ann-phone", version: 1))
        let claim = try t.registerHeld(fcm("bob", "race-t1"))
        #expect(claim.reclaimed)
        let move = t.start(fcm("ann", "race-t2", installation: "ann-phone", version: 2))
        try #require(try t.blockedByHeld(move), "A's move did not wait for B's uncommitted reclaim")
        try t.commitHeld()
        let outcome = try #require(move.wait(seconds: 15), "A's move never ended").get()
        #expect(outcome.tokenHash == Identity.tokenHash("race-t2"))
        #expect(try t.tokenHashes("ann") == [Identity.tokenHash("race-t2")], "A's acknowledged move was lost")
        #expect(try t.tokenHashes("bob") == [Identity.tokenHash("race-t1")])
    }

    @Test("a device another user reclaims while A registers over her cap does not make A evict one she can keep")
    func evictionCountsWhatStays() throws {
        let t = try Race()
        defer { t.close() }
        try t.register(fcm("ann", "race-old"), cap: 2)
        try t.register(fcm("ann", "race-t1"), cap: 2)
        // B takes T1 (A's newer device) in a transaction not yet committed.
        #expect(try t.registerHeld(fcm("bob", "race-t1"), cap: 2).reclaimed)
        let third = t.start(fcm("ann", "race-new"), cap: 2)
        // A's eviction waits for B's row lock (today's code does not wait, and evicts at once).
        _ = try t.blockedByHeld(third)
        try t.commitHeld()
        let outcome = try #require(third.wait(seconds: 15), "A's registration never ended").get()
        #expect(outcome.evicted == [], "A has two devices once B's reclaim committed: nothing to evict")
        #expect(try t.tokenHashes("ann") == [Identity.tokenHash("race-new"), Identity.tokenHash("race-old")])
        #expect(try t.tokenHashes("bob") == [Identity.tokenHash("race-t1")])
    }
}
