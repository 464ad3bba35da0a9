import CSQLite
import Foundation
import HeraldCore
import HeraldCrypto
import HeraldStore
import HeraldStoreTestSupport
import Testing

/// Reads (`device.list`, `push.status`, queue depth, device counts) run on
/// `SQLiteStore`'s read connection: they never wait for the writer's commits.
@Suite struct ReaderTests {
    /// A second process's connection holding the write lock stands in for a
    /// slow commit: the writer's next transaction waits for it, a read must not.
    @Test func readsAnswerWhileTheWriterIsHeld() throws {
        let t = try TestStore(.sqlite, synchronous: .full)
        defer { t.close() }
        _ = try t.register(apns("alice", "aa00aa00aa00aa00"))

        var other: OpaquePointer?
        #expect(sqlite3_open(t.scratch.databasePath, &other) == SQLITE_OK)
        defer { sqlite3_close(other) }
        #expect(sqlite3_exec(other, "BEGIN IMMEDIATE", nil, nil, nil) == SQLITE_OK)

        // The writer now waits for the lock (its busy timeout is 5 s).
        let registered = Flag()
        t.store.register(apns("bob", "bb00bb00bb00bb00"), deviceCap: 20) { _ in registered.set() }
        let listed = Flag()
        let depth = Flag()
        t.store.list(app: "default", user: "alice") { result in
            if case .success(let devices) = result, devices.count == 1 { listed.set() }
        }
        // A read of what a pending write changes waits for it (read your
        // own writes, even after a notification that gets no answer).
        let bobListed = Flag()
        t.store.list(app: "default", user: "bob") { result in
            if case .success(let devices) = result, devices.count == 1 { bobListed.set() }
        }
        t.store.queueDepth { result in
            if case .success = result { depth.set() }
        }
        // The figures of system.stats and the metrics, per app too (issue 27:
        // a stats loop on the writer made every registration wait).
        let figures = Flag()
        t.store.queueDepthByApp { depths in
            t.store.deviceCountsByApp { counts in
                t.store.webSubscriptionsByKey { web in
                    if case .success = depths, case .success(let c) = counts, case .success = web,
                        c["default"]?[.apns] == 1
                    {
                        figures.set()
                    }
                }
            }
        }
        // The reads are answered while the lock is still held, so before
        // the registration that was queued first could commit.
        #expect(listed.wait(seconds: 4))
        #expect(depth.wait(seconds: 4))
        #expect(figures.wait(seconds: 4))
        #expect(!registered.isSet)
        #expect(!bobListed.isSet)

        #expect(sqlite3_exec(other, "COMMIT", nil, nil, nil) == SQLITE_OK)
        #expect(registered.wait(seconds: 10))
        #expect(bobListed.wait(seconds: 10))
        // A read after an answered write sees it.
        #expect(try t.list("bob").count == 1)
    }

    /// The health ping proves the writer: it waits for the write lock, so a
    /// stuck writer shows (it reads one row, where it used to count the devices).
    @Test func pingGoesThroughTheWriter() throws {
        let t = try TestStore(.sqlite, synchronous: .full)
        defer { t.close() }
        for i in 0..<300 { _ = try t.register(apns("u\(i)", String(format: "%016x", i))) }
        try t.store.sync { s, done in s.ping(completion: done) }

        var other: OpaquePointer?
        #expect(sqlite3_open(t.scratch.databasePath, &other) == SQLITE_OK)
        defer { sqlite3_close(other) }
        #expect(sqlite3_exec(other, "BEGIN IMMEDIATE", nil, nil, nil) == SQLITE_OK)
        let pinged = Flag()
        t.store.ping { result in
            if case .success = result { pinged.set() }
        }
        #expect(!pinged.wait(seconds: 0.5), "answered while another connection held the write lock")
        #expect(sqlite3_exec(other, "COMMIT", nil, nil, nil) == SQLITE_OK)
        #expect(pinged.wait(seconds: 10))
    }

    /// The read connection is read-only: a closed store refuses reads
    /// instead of hanging, and a reopened one reads what was committed.
    @Test(arguments: StoreBackend.allCases)
    func closedStoreRefusesReadsAndReopenedOneReads(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        _ = try t.register(apns("carol", "cc00cc00cc00cc00"))
        t.store.close()
        let refused = Flag()
        t.store.list(app: "default", user: "carol") { result in
            if case .failure = result { refused.set() }
        }
        #expect(refused.wait(seconds: 2))
        let reopened = try t.reopen()
        defer {
            reopened.close()
            t.scratch.remove()
        }
        let devices = try reopened.sync { s, done in s.list(app: "default", user: "carol", completion: done) }
        #expect(devices.count == 1)
    }
}

/// A flag set once from any thread, waited for with a deadline.
private final class Flag: @unchecked Sendable {
    private let condition = NSCondition()
    private var set_ = false

    func set() {
        condition.lock()
        set_ = true
        condition.broadcast()
        condition.unlock()
    }

    var isSet: Bool {
        condition.lock()
        defer { condition.unlock() }
        return set_
    }

    func wait(seconds: Double) -> Bool {
        let deadline = Date(timeIntervalSinceNow: seconds)
        condition.lock()
        defer { condition.unlock() }
        while !set_ { if !condition.wait(until: deadline) { return set_ } }
        return true
    }
}
