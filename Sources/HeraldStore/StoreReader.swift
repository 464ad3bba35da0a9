import Foundation
import HeraldCrypto
import HeraldIO

/// A second, read-only connection to the store's database on a thread of its
/// own, for reads that promise nothing durable (`device.list`,
/// `push.status`, queue depth, device counts).
///
/// In WAL mode a reader never waits for the writer, and the writer's group
/// commits end with an fsync under `synchronous = full`: a read queued on the
/// writer's thread waited for the fsync of every commit ahead of it and of its
/// own. A read here sees every transaction committed before it started, so a
/// client that reads after an answered write sees that write. The
/// connection and its tables belong to the reader thread (handed to it whole
/// when it starts).
final class StoreReader: Sendable {
    private let thread = JobThread(())

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
        thread.start(named: name, nice: nice, Reads(db: db, tables: tables))
    }

    /// Finishes the reads queued and closes the connection.
    func close() { thread.close() }

    /// Queues a read; `false` when the reader is closed.
    func submit(_ job: any QueuedCall<Tables>) -> Bool { thread.submit(job) }

    /// The reader thread's work.
    private struct Reads: JobWorker {
        let db: Database
        let tables: Tables

        func take(from queue: inout JobQueue<Void>) -> [any QueuedCall<Tables>] {
            let take = min(queue.calls.count, StoreReader.maxBatch)
            defer { queue.calls.removeFirst(take) }
            return Array(queue.calls.prefix(take))
        }

        /// One read transaction for the batch: every read in it sees the same
        /// committed state, and the snapshot is let go at once.
        func run(_ batch: [any QueuedCall<Tables>], on thread: JobThread<Void>) {
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
}
