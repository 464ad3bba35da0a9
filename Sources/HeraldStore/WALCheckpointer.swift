internal import CSQLite
import HeraldIO

/// Folds the write-ahead log into the database on a thread of its own, so
/// that the writer's commits do not.
///
/// SQLite's automatic checkpoint runs inside the commit that takes the log
/// past 1,000 pages: it copies the log's pages into the database and syncs
/// the database file, 5-25 ms under a fan-out, and every acceptance queued
/// behind that commit waited for it. Here the writer's connection reports
/// the log's length after each commit (its `wal_hook`, which replaces the
/// automatic checkpoint) and this thread, on a connection of its own, runs a
/// passive checkpoint (one that never waits for the writer or a reader)
/// when the log is past ``pages``. The writer's next transaction after a
/// complete checkpoint starts the log again from its beginning, as before.
///
/// The writer still ends each checkpoint (``Step/finish``: the last few
/// hundred pages, the passes here having copied and synced the rest), since
/// the log starts again only after a checkpoint that reached its end. And
/// it is bounded: should this thread fall behind (a long read holding the
/// log, a slow disk), the writer checkpoints itself once the log passes
/// ``writerPages``, as SQLite would have at 1,000.
final class WALCheckpointer: Sendable {
    private struct Shared {
        var due = false
        var stopping = false
        var stopped = false
        /// Checkpoints run here; the writer's last steps; the writer's
        /// whole ones (past ``writerPages``).
        var runs = 0
        var finishes = 0
        var writerRuns = 0
        /// The log's length and the pages copied, as the last pass here found them.
        var copied: (log: Int32, done: Int32) = (0, 0)
    }

    private let shared = Locked(Shared())

    /// The log's length, in pages, past which a checkpoint is asked for
    /// (SQLite's own automatic point).
    static let pages: Int32 = 1000
    /// The log's length past which the writer checkpoints itself (64 MiB at
    /// SQLite's 4 KiB pages).
    static let writerPages: Int32 = 16000

    /// Opens a connection to the database at `path` (created and migrated
    /// by the store) and starts the checkpoint thread.
    init(path: String, synchronous: Synchronous) throws {
        let db = try Database(path: path)
        try db.execute("PRAGMA synchronous = \(synchronous.rawValue.uppercased())")
        // This connection never commits, so never checkpoints by itself.
        startOwnerThread(named: "herald-store-c") { [self] in run(db: db) }
    }

    /// Makes `db` (the writer's connection, on the writer's thread) report
    /// its log's length here after each commit, instead of checkpointing in
    /// the commit. The checkpointer must outlive the connection.
    func attach(to db: Database) {
        sqlite3_wal_hook(
            db.handle,
            { context, handle, schema, pages in
                let checkpointer = Unmanaged<WALCheckpointer>.fromOpaque(context!).takeUnretainedValue()
                switch checkpointer.step(pages: pages) {
                case .none: break
                case .ask: checkpointer.ask()
                case .finish, .whole:
                    sqlite3_wal_checkpoint_v2(handle, schema, SQLITE_CHECKPOINT_PASSIVE, nil, nil)
                }
                return SQLITE_OK
            }, Unmanaged.passUnretained(self).toOpaque())
    }

    /// How many checkpoints ran on this thread, how many the writer
    /// finished, and how many it ran whole.
    var runs: (here: Int, finishes: Int, writer: Int) {
        shared.withLock { ($0.runs, $0.finishes, $0.writerRuns) }
    }

    /// What the writer does after a commit that left `pages` in the log.
    enum Step: Equatable {
        case none
        /// Ask this thread for a checkpoint.
        case ask
        /// Copy the last few pages itself: this thread copied the rest, but
        /// the writer appends while a pass runs, so a pass here ends just
        /// behind it, and the log starts again only once a checkpoint ends
        /// at its last page (a writer that never pauses would keep it
        /// growing). The pages left are few, and the database file's sync
        /// has only them to write.
        case finish
        /// Checkpoint the whole log itself: this thread fell behind.
        case whole
    }

    func step(pages: Int32) -> Step {
        guard pages >= Self.pages else { return .none }
        if pages >= Self.writerPages {
            shared.withLock { $0.writerRuns += 1 }
            return .whole
        }
        return shared.withLock { s in
            // A pass's figures from before the log started again are larger
            // than the log now: ask for a new pass.
            let behind = pages - s.copied.done
            guard s.copied.done > 0, s.copied.log <= pages, behind <= Self.finishPages else { return .ask }
            s.copied = (0, 0)
            s.finishes += 1
            return .finish
        }
    }

    /// The most pages the writer copies to finish a checkpoint.
    static let finishPages: Int32 = 256

    private func ask() {
        let wake = shared.withLock { s in
            defer { s.due = true }
            return !s.due && !s.stopping
        }
        if wake { shared.signal() }
    }

    /// Stops the thread (before the writer's last checkpoint, which a
    /// checkpoint here would keep busy); the connection closes with it.
    func close() {
        shared.withLock { $0.stopping = true }
        shared.broadcast()
        shared.withLock(when: { $0.stopped }) { _ in }
    }

    /// Passive checkpoints until one finds nothing new to copy. The writer
    /// goes on appending while one runs, and starts the log again only at a
    /// transaction that finds every page of it copied: one pass that ends
    /// behind the writer would leave the log growing (a writer that never
    /// pauses would outrun any number of passes; ``writerPages`` bounds it).
    private func chase(_ db: Database) {
        var copied: Int32 = -1
        for _ in 0..<Self.passes {
            var log: Int32 = 0
            var done: Int32 = 0
            let rc = sqlite3_wal_checkpoint_v2(db.handle, nil, SQLITE_CHECKPOINT_PASSIVE, &log, &done)
            shared.withLock { s in
                s.runs += 1
                if rc == SQLITE_OK { s.copied = (log, done) }
            }
            if rc != SQLITE_OK || (done >= log && done == copied) { return }
            copied = done
        }
    }

    /// The most passes one request makes.
    static let passes = 64

    private func run(db: Database) {
        while true {
            let stop = shared.withLock(when: { $0.due || $0.stopping }) { s in
                s.due = false
                return s.stopping
            }
            if stop { break }
            chase(db)
        }
        shared.withLock { $0.stopped = true }
        shared.broadcast()
    }
}
