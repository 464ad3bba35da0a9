internal import CHeraldSys
import Foundation
import HeraldCrypto

/// A second, read-only connection to the store's database on a thread of its
/// own, for reads that promise nothing durable (`device.list`,
/// `push.status`, queue depth, device counts).
///
/// In WAL mode a reader never waits for the writer, and the writer's group
/// commits end with an fsync under `synchronous = full`: a read queued on the
/// writer's thread waited for the fsync of every commit ahead of it and of its
/// own. A read here sees every transaction committed before it started, so a
/// client that reads after an answered write sees that write.
// @unchecked: the queue is guarded by `condition`; the connection belongs to the reader thread.
final class StoreReader: @unchecked Sendable {
    private let condition = NSCondition()
    private var queue: [any QueuedCall<Tables>] = []
    private var stopping = false
    private var stopped = false
    private var thread: Thread?

    /// The most reads one read transaction takes.
    static let maxBatch = 256
    /// The reader's page cache, in KiB. The writer's cache holds the hot
    /// index pages; reads that miss here are served from the OS page cache.
    static let cacheKiB = 8192

    /// Opens the reader on a database the writer has already created and
    /// migrated, and starts its thread, named `name`, at `nice` (Linux: the
    /// thread alone).
    init(path: String, key: StoreKey, instance: String, name: String = "herald-store-r", nice: Int32 = 0) throws {
        let db = try Database(path: path)
        sqlite3BusyTimeout(db, milliseconds: 5000)
        try db.execute("PRAGMA query_only = ON")
        try db.execute("PRAGMA temp_store = MEMORY")
        try db.execute("PRAGMA cache_size = -\(Self.cacheKiB)")
        let tables = Tables(
            registry: try Registry(db: db, key: key), queue: try Queue(db: db, key: key, instance: instance))
        db.resetActive()
        let owned = ReaderOwned(db: db, tables: tables)
        let thread = Thread { [self] in
            _ = hs_set_thread_name(name)
            if nice != 0 { _ = hs_set_thread_nice(nice) }
            self.run(db: owned.db, tables: owned.tables)
        }
        thread.name = name
        self.thread = thread
        thread.start()
    }

    /// Finishes the reads queued and closes the connection.
    func close() {
        condition.lock()
        stopping = true
        condition.broadcast()
        while !stopped { condition.wait() }
        condition.unlock()
    }

    /// Queues a read; `false` when the reader is closed.
    func submit(_ job: any QueuedCall<Tables>) -> Bool {
        condition.lock()
        defer { condition.unlock() }
        if stopping { return false }
        queue.append(job)
        condition.signal()
        return true
    }

    private func run(db: Database, tables: Tables) {
        while true {
            condition.lock()
            while queue.isEmpty && !stopping { condition.wait() }
            if queue.isEmpty && stopping {
                stopped = true
                thread = nil
                condition.broadcast()
                condition.unlock()
                return
            }
            let take = min(queue.count, Self.maxBatch)
            let batch = Array(queue.prefix(take))
            queue.removeFirst(take)
            condition.unlock()
            read(batch, db: db, tables: tables)
        }
    }

    /// One read transaction for the batch: every read in it sees the same
    /// committed state, and the snapshot is let go at once.
    private func read(_ batch: [any QueuedCall<Tables>], db: Database, tables: Tables) {
        let began = (try? db.statement("BEGIN").run()) != nil
        var outcomes: [CallOutcome] = []
        outcomes.reserveCapacity(batch.count)
        for job in batch {
            outcomes.append(job.run(tables, now: 0))
            db.resetActive()
        }
        if began { try? db.statement("COMMIT").run() }
        // A read answers with what it read, whatever the end of its snapshot.
        for outcome in outcomes { outcome.answer(nil) }
    }
}

/// The reader's connection and tables, handed whole to its thread.
// @unchecked: handed whole to the reader thread, its only user from then on.
private struct ReaderOwned: @unchecked Sendable {
    let db: Database
    let tables: Tables
}
