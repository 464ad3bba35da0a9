internal import CHeraldSys
import Foundation
public import HeraldCore
import HeraldCrypto
import HeraldIO

/// SQLite's `synchronous` setting: `full` makes every commit durable on
/// power loss, `normal` (in WAL mode) only on process crash.
public enum Synchronous: String, Sendable {
    case full
    case normal
}

/// The SQLite backend of ``DeliveryStore``.
///
/// The embedded store: one SQLite connection in WAL mode owned by one
/// thread. Work is queued and run in group commits: every job waiting when
/// a transaction starts joins it, each job in its own savepoint, so one
/// fsync covers many requests and a failing job rolls back alone.
/// Completions run on the store thread; they must hand work elsewhere quickly.
/// The connection and its tables belong to the store thread (handed to it
/// whole when it starts).
public final class SQLiteStore: DeliveryStore, RegistryHost, QueueHost, Sendable {
    /// What the callers and the store thread share beside the queue, under its lock.
    struct WriterState {
        /// Writes queued or being committed, per key (an app's user, a
        /// message): a read of that key waits behind them on the writer's
        /// thread, so a client that pipelines a write and a read of the same
        /// thing (even as a notification) reads its own write. Reads of keys
        /// with no write pending go to the reader.
        var fences: [String: Int] = [:]
        /// Messages waiting for one being written in parts (by its id) that
        /// holds their idempotency key; asked again when it is done.
        var parked = KeyWaiters()
        /// Durable jobs (acceptances) in the queue: a transaction of bulk
        /// work ends early, between two jobs, when one comes.
        var durableQueued = 0
    }

    /// The store thread, which owns the write connection.
    private let writer = JobThread(WriterState())
    private let clock: any WallClock
    private let path: String
    /// Reads that promise nothing durable, on a connection of their own.
    private let reader: StoreReader
    /// The figures' counts (`system.stats`, the metrics), scans of every
    /// device and live delivery, on a third connection whose thread runs at
    /// nice 10: when the cores are busy, the scans wait and the writer, the
    /// loop and the other reads do not.
    private let figuresReader: StoreReader
    /// Checkpoints the write-ahead log off the writer's thread.
    private let checkpointer: WALCheckpointer

    /// Checkpoints of the write-ahead log run off the writer's thread, the
    /// ones the writer finished (their last pages), and the ones it ran
    /// whole (only when the log outgrew the other thread).
    public var walCheckpoints: (offWriter: Int, finishedByWriter: Int, byWriter: Int) {
        let runs = checkpointer.runs
        return (runs.here, runs.finishes, runs.writer)
    }

    /// Deliveries found in flight at open (a stop or crash interrupted them),
    /// now queued again.
    public let recoveredDeliveries: Int
    /// Messages a stop or crash caught between two of their parts, written
    /// whole at open.
    public let unfinishedCompleted: Int

    /// The figures reader's nice value.
    static let figuresNice: Int32 = 10

    /// The most jobs one transaction takes, to bound commit latency.
    static let maxBatch = 512

    /// The configured `synchronous`, used for commits holding a durable job.
    private let synchronous: Synchronous

    /// What the store did with its key at open (checked it, recorded its
    /// check value, or created it for an empty database).
    public let keyOutcome: StoreKeyOutcome

    /// Opens (creating if needed) and migrates the database, checks the store
    /// key against it, then starts the store thread. Throws if the file
    /// cannot be opened or migrated, and ``StoreKeyError`` (naming `keyFile`
    /// and the database) when the key does not open the database, or when
    /// there is no key and the database holds data: a key is created (by
    /// `keySupply`) only for an empty database.
    public init(
        path: String, keySupply: StoreKeySupply, keyFile: String, synchronous: Synchronous,
        instance: String = InstanceName.host, clock: any WallClock = SystemClock()
    ) throws {
        self.path = path
        self.clock = clock
        self.synchronous = synchronous
        // The schema and the key are settled on a connection of their own,
        // closed before the store's opens: the store's connection never meets
        // the caller's `keySupply`, and is handed whole to the store thread.
        let (key, keyOutcome) = try {
            let setup = try Self.connect(path: path, synchronous: synchronous)
            try Schema.migrate(setup)
            return try StoreKeyCheck.settle(setup, supply: keySupply, keyFile: keyFile, database: path)
        }()
        self.keyOutcome = keyOutcome
        let db = try Self.connect(path: path, synchronous: synchronous)
        let tables = Tables(
            registry: try Registry(db: db, key: key), queue: try Queue(db: db, key: key, instance: instance))
        try tables.registry.expireTombstones(now: clock.nowMilliseconds())
        try db.execute("BEGIN IMMEDIATE")
        do {
            unfinishedCompleted = try tables.queue.finishUnfinished()
            try db.execute("COMMIT")
        } catch {
            try? db.execute("ROLLBACK")
            throw error
        }
        recoveredDeliveries = try tables.queue.recoverInFlight(now: clock.nowMilliseconds())
        db.resetActive()
        // The readers open before the store thread starts: a reader that
        // cannot open fails the open with nothing to stop but the other one.
        reader = try StoreReader(path: path, key: key, instance: instance)
        do {
            figuresReader = try StoreReader(
                path: path, key: key, instance: instance, name: "herald-store-f", nice: Self.figuresNice)
        } catch {
            reader.close()
            throw error
        }
        do {
            checkpointer = try WALCheckpointer(path: path, synchronous: synchronous)
        } catch {
            reader.close()
            figuresReader.close()
            throw error
        }
        checkpointer.attach(to: db)
        writer.start(
            named: "herald-store",
            Writes(db: db, tables: tables, clock: clock, synchronous: synchronous, current: synchronous, path: path))
    }

    /// A connection to the database at `path`, set up as the store's.
    private static func connect(path: String, synchronous: Synchronous) throws -> Database {
        let db = try Database(path: path)
        sqlite3BusyTimeout(db, milliseconds: 5000)
        try db.execute("PRAGMA journal_mode = WAL")
        try db.execute("PRAGMA synchronous = \(synchronous.rawValue.uppercased())")
        try db.execute("PRAGMA foreign_keys = ON")
        // Savepoint and statement journals in memory, not in temporary files:
        // every job runs in a savepoint, and a fan-out's would otherwise
        // write page images to a file it throws away at the commit.
        try db.execute("PRAGMA temp_store = MEMORY")
        // A page cache of 32 MiB rather than SQLite's 2 MiB: the queue's
        // indexes outgrow 2 MiB after a few hundred fan-outs, and every
        // insert and result then reads its index pages back from the OS.
        try db.execute("PRAGMA cache_size = -32768")
        return db
    }

    /// Stops taking work, finishes what is queued, and closes the database.
    public func close() {
        // The reader first: its snapshot would keep the final checkpoint
        // from emptying the log.
        reader.close()
        figuresReader.close()
        checkpointer.close()
        writer.close()
    }

    /// Queues a job. `durable: false` for work whose loss in a power cut
    /// costs nothing but a repeat (claims, attempt results, reads): a commit
    /// of only such jobs skips the fsync (`synchronous = NORMAL` in WAL mode,
    /// still safe against corruption and against a process crash), and the
    /// next durable commit makes it durable with its own.
    func submit<T>(
        durable: Bool = true, fence: String? = nil, front: Bool = false,
        _ work: @escaping @Sendable (Tables, Int64) throws -> T,
        _ completion: @escaping @Sendable (Result<T, any Error>) -> Void
    ) {
        let job = StoreCall(work: work, completion: completion, durable: durable, fence: fence)
        let queued = writer.submit(job, front: front) { w in
            if let fence { w.fences[fence, default: 0] += 1 }
            if durable { w.durableQueued += 1 }
        }
        if !queued { completion(.failure(StoreError(code: 0, message: "store is closed"))) }
    }

    /// Queues a read on the reader connection (see `StoreReader`), or
    /// behind the writes pending on `fence` on the writer's thread.
    func read<T>(
        fence: String? = nil, figures: Bool = false, _ work: @escaping @Sendable (Tables) throws -> T,
        _ completion: @escaping @Sendable (Result<T, any Error>) -> Void
    ) {
        let job = StoreCall(work: { tables, _ in try work(tables) }, completion: completion, durable: false, fence: nil)
        if let fence {
            let behind = writer.withLock { q in
                guard q.extra.fences[fence] != nil, !q.stopping else { return false }
                q.calls.append(job)
                return true
            }
            if behind {
                writer.signal()
                return
            }
        }
        guard (figures ? figuresReader : reader).submit(job) else {
            completion(.failure(StoreError(code: 0, message: "store is closed")))
            return
        }
    }

    /// The store thread's work: batches taken in turns, each committed in
    /// one transaction, a savepoint per job.
    private struct Writes: JobWorker {
        let db: Database
        let tables: Tables
        let clock: any WallClock
        /// The configured `synchronous`, used for commits holding a durable job.
        let synchronous: Synchronous
        /// What the connection's `synchronous` is set to now.
        var current: Synchronous
        var turns = WriterTurns()
        var writeback: WALWriteback

        init(
            db: Database, tables: Tables, clock: any WallClock, synchronous: Synchronous, current: Synchronous,
            path: String
        ) {
            self.db = db
            self.tables = tables
            self.clock = clock
            self.synchronous = synchronous
            self.current = current
            writeback = WALWriteback(path: path + "-wal")
        }

        mutating func take(from queue: inout JobQueue<WriterState>) -> [any QueuedCall<Tables>] {
            let batch = turns.next(from: &queue.calls, max: SQLiteStore.maxBatch) { $0.durable }
            queue.extra.durableQueued -= batch.count(where: \.durable)
            return batch
        }

        mutating func run(_ batch: [any QueuedCall<Tables>], on thread: JobThread<WriterState>) {
            commit(batch, on: thread)
            // A commit that did not sync the log (no acceptance in it) has
            // its pages written out now, without waiting: the next
            // acceptance's sync then has only its own to wait for, not the
            // megabytes of results and claims a fan-out wrote since the
            // last one.
            if current == .normal && synchronous != .normal { writeback.start() }
        }

        /// Folds the write-ahead log into the database: a stopped daemon
        /// leaves herald.db whole and an empty -wal.
        mutating func stop() {
            db.checkpoint()
            writeback.close()
        }

        /// Transaction control goes through cached prepared statements: a
        /// fan-out's commits run hundreds of savepoints, each parsed once.
        private mutating func commit(_ batch: [any QueuedCall<Tables>], on thread: JobThread<WriterState>) {
            let now = clock.nowMilliseconds()
            let wanted: Synchronous = batch.contains(where: \.durable) ? synchronous : .normal
            if wanted != current, (try? db.execute("PRAGMA synchronous = \(wanted.rawValue.uppercased())")) != nil {
                current = wanted
            }
            var outcomes: [CallOutcome] = []
            outcomes.reserveCapacity(batch.count)
            do {
                try db.statement("BEGIN IMMEDIATE").run()
            } catch {
                Self.lift(batch[...], on: thread)
                for job in batch { job.fail(error) }
                return
            }
            // A transaction of bulk work alone ends between two jobs when an
            // acceptance comes: the jobs not run go back to the front of the
            // queue, and the acceptance waits for one job, not for them all.
            let preemptible = !batch.contains(where: \.durable)
            var ran = batch.count
            for (i, job) in batch.enumerated() {
                if preemptible && i > 0 && thread.withLock({ $0.extra.durableQueued > 0 }) {
                    ran = i
                    break
                }
                do {
                    try db.statement("SAVEPOINT job").run()
                } catch {
                    outcomes.append(CallOutcome(error: error) { _ in job.fail(error) })
                    continue
                }
                let outcome = job.run(tables, now: now)
                do {
                    if outcome.error != nil { throw outcome.error! }
                    try db.statement("RELEASE job").run()
                    outcomes.append(outcome)
                } catch {
                    try? db.statement("ROLLBACK TO job").run()
                    try? db.statement("RELEASE job").run()
                    outcomes.append(outcome.error != nil ? outcome : CallOutcome(error: error) { _ in job.fail(error) })
                }
            }
            // Statements left on a row would hold a read transaction past the
            // commit and keep every later checkpoint from shrinking the WAL.
            db.resetActive()
            var commitFailure: (any Error)?
            do {
                try db.statement("COMMIT").run()
            } catch {
                try? db.statement("ROLLBACK").run()
                // Nothing of this batch is durable: no job may report success.
                commitFailure = error
            }
            if ran < batch.count {
                let rest = batch[ran...]
                thread.withLock { $0.calls.insert(contentsOf: rest, at: 0) }
            }
            Self.lift(batch[..<ran], on: thread)
            for outcome in outcomes { outcome.answer(commitFailure) }
        }

        /// The batch's writes are committed (or failed): reads of their keys
        /// may go to the reader again.
        private static func lift(_ batch: ArraySlice<any QueuedCall<Tables>>, on thread: JobThread<WriterState>) {
            guard batch.contains(where: { $0.fence != nil }) else { return }
            thread.withLock { q in
                for case let fence? in batch.map(\.fence) {
                    let left = (q.extra.fences[fence] ?? 1) - 1
                    q.extra.fences[fence] = left > 0 ? left : nil
                }
            }
        }
    }

    // MARK: Registry operations (the calls themselves: ``RegistryHost``)

    func writeRows<T>(
        durable: Bool, fence: String?, _ work: @escaping @Sendable (Registry, Int64) throws -> T,
        _ completion: @escaping @Sendable (Result<T, any Error>) -> Void
    ) {
        submit(durable: durable, fence: fence, { t, now in try work(t.registry, now) }, completion)
    }

    func readRows<T>(
        fence: String?, figures: Bool, _ work: @escaping @Sendable (Registry) throws -> T,
        _ completion: @escaping @Sendable (Result<T, any Error>) -> Void
    ) {
        read(fence: fence, figures: figures, { t in try work(t.registry) }, completion)
    }

    /// Deliveries waiting and in flight, per app.
    public func queueDepthByApp(completion: @escaping @Sendable (Result<[String: QueueDepth], any Error>) -> Void) {
        read(figures: true, { t in try t.queue.depthByApp() }, completion)
    }

    // MARK: Delivery queue

    /// Commits a message and its deliveries (or finds it by idempotency key).
    public func enqueue(_ e: Enqueue, completion: @escaping @Sendable (Result<Enqueued, any Error>) -> Void) {
        accept(e, handoff: [:], limit: 0, early: nil, census: nil) { completion($0.map(\.accepted)) }
    }

    /// Commits a message and hands up to `handoff[lane]` of its deliveries
    /// per lane, `limit` in all, to the caller already in flight; with
    /// `early`, before the commit (see
    /// `Queue.begin(_:now:handoff:handoffLimit:early:census:countElsewhere:)`). A batch's jobs
    /// run once each, so `early` gets each handed delivery once.
    public func enqueue(
        _ e: Enqueue, handoff: [QueueLane: Int], limit: Int, early: (@Sendable (Claim) -> Void)?,
        completion: @escaping @Sendable (Result<(accepted: Enqueued, claim: Claim), any Error>) -> Void
    ) {
        accept(e, handoff: handoff, limit: limit, early: early, census: nil, completion)
    }

    /// Whether a write of one of the message's users (or any write, for a
    /// message to devices by id) is queued or being committed.
    private func writesPending(for e: Enqueue) -> Bool {
        writer.withLock { q in
            guard !q.extra.fences.isEmpty else { return false }
            guard case .users(let users) = e.recipients else { return true }
            return users.contains { q.extra.fences[StoreFences.user(app: e.app, user: $0)] != nil }
        }
    }

    /// Commits a message: whole in one transaction, or a large one in parts
    /// (see `Queue.begin`), each part queued ahead of the bulk work so
    /// that a message is written without a pause, while acceptances that
    /// wait take the transactions between its parts.
    private func accept(
        _ e: Enqueue, handoff: [QueueLane: Int], limit: Int, early: (@Sendable (Claim) -> Void)?, census: Census?,
        countElsewhere mayCountElsewhere: Bool = true,
        _ completion: @escaping @Sendable (Result<(accepted: Enqueued, claim: Claim), any Error>) -> Void
    ) {
        // A large message's devices are counted by platform on the reader
        // (10,000 rows: milliseconds the writer need not spend), unless a
        // write of one of its users is still queued: the count must see it
        // (a client reads its own writes).
        let countElsewhere =
            mayCountElsewhere && census == nil && Queue.mayBeLarge(e.recipients) && !writesPending(for: e)
        submit(
            { t, now in
                try t.queue.begin(
                    e, now: now, handoff: handoff, handoffLimit: limit, early: early, census: census,
                    countElsewhere: countElsewhere)
            }
        ) { [self] result in
            switch result {
            case .failure(let error): completion(.failure(error))
            case .success(.needsCensus):
                let counting = StoreCall<Tables, Census>(
                    work: { t, _ in try t.queue.census(e) },
                    completion: { [self] result in
                        // A count that failed on the reader is made by the writer.
                        accept(
                            e, handoff: handoff, limit: limit, early: early, census: try? result.get(),
                            countElsewhere: false, completion)
                    }, durable: false, fence: nil)
                if !reader.submit(counting) { completion(.failure(StoreError(code: 0, message: "store is closed"))) }
            case .success(.whole(let accepted, let claim)): completion(.success((accepted, claim)))
            case .success(.partial(let a)): assemble(a, completion)
            case .success(.waitFor(let first)):
                let parked: Result<Void, any Error> = writer.withLock { q in
                    guard !q.stopping else { return .failure(StoreError(code: 0, message: "store is closed")) }
                    let held = q.extra.parked.park(behind: first) { [self] in
                        accept(e, handoff: handoff, limit: limit, early: early, census: nil, completion)
                    }
                    return held ? .success(()) : .failure(EnqueueError.keyWaitersFull(limit: q.extra.parked.limit))
                }
                if case .failure(let error) = parked { completion(.failure(error)) }
            }
        }
    }

    /// Writes the next part of `a`; the last answers the caller.
    private func assemble(
        _ a: Assembly,
        _ completion: @escaping @Sendable (Result<(accepted: Enqueued, claim: Claim), any Error>) -> Void
    ) {
        submit(durable: a.nextIsLast, front: true, { t, now in try t.queue.resume(a, now: now) }) { [self] result in
            switch result {
            case .success(.partial(let next)):
                assemble(next, completion)
            case .success(.whole(let accepted, let claim)):
                release(a.messageID)
                completion(.success((accepted, claim)))
            case .success(.waitFor), .success(.needsCensus):
                preconditionFailure("a later part neither waits nor counts")
            case .failure(let error):
                // A part failed (or the store is closing): its caller hears
                // why; the message stays listed and the next open writes the
                // rest (a resend with its key finds it meanwhile).
                submit(durable: false, front: true, { t, _ in t.queue.forget(a) }) { [self] _ in
                    release(a.messageID)
                    completion(.failure(error))
                }
            }
        }
    }

    /// Asks again the messages that waited for `messageID` (the same
    /// idempotency key) now that it is whole or dropped.
    private func release(_ messageID: String) {
        let waiting = writer.withLock { $0.extra.parked.release(messageID) }
        for retry in waiting { retry() }
    }

    public func status(
        app: String, messageID: String, detail: Bool,
        completion: @escaping @Sendable (Result<MessageStatus?, any Error>) -> Void
    ) {
        read(
            fence: StoreFences.message(messageID),
            { t in try t.queue.status(app: app, messageID: messageID, detail: detail) }, completion)
    }

    public func cancel(
        app: String, messageID: String, completion: @escaping @Sendable (Result<Int?, any Error>) -> Void
    ) {
        submit(
            fence: StoreFences.message(messageID),
            { t, now in try t.queue.cancel(app: app, messageID: messageID, now: now) }, completion)
    }

    /// Takes due deliveries, up to `lanes[lane]` of each named lane and up to
    /// `others` of any other lane, and marks them in flight.
    public func claimDue(
        lanes: [QueueLane: Int], others: Int, counted: Set<BatchKey>,
        completion: @escaping @Sendable (Result<Claim, any Error>) -> Void
    ) {
        submit(
            durable: false,
            { t, now in try t.queue.claimDue(lanes: lanes, others: others, counted: counted, now: now) }, completion)
    }

    /// Records an attempt's result: a final state, or `retrying` at `nextAttemptAt`.
    public func record(
        deliveryID: Int64, state: DeliveryState, httpStatus: Int?, reason: RecordedReason?, nextAttemptAt: Int64?,
        completion: @escaping @Sendable (Result<Void, any Error>) -> Void
    ) {
        submit(
            durable: false,
            { t, now in
                try t.queue.record(
                    deliveryID: deliveryID, state: state, httpStatus: httpStatus, reason: reason,
                    nextAttemptAt: nextAttemptAt, now: now)
            }, completion)
    }

    /// Records many attempts' results in one job.
    public func record(
        _ records: [DeliveryRecord], completion: @escaping @Sendable (Result<Void, any Error>) -> Void
    ) {
        submit(durable: false, { t, now in try t.queue.record(records, now: now) }, completion)
    }

    /// Makes the deliveries of `lanes` that wait for a credential due at once
    /// (after a reload); answers how many.
    public func releaseCredentialWaits(
        lanes: [QueueLane], completion: @escaping @Sendable (Result<Int, any Error>) -> Void
    ) {
        submit({ t, now in try t.queue.releaseCredentialWaits(lanes: lanes, now: now) }, completion)
    }

    /// A result's job (``QueueHost``: `removeStale`).
    func writeResults<T>(
        settling settled: [Int64], _ work: @escaping @Sendable (Queue, Int64) throws -> T,
        _ completion: @escaping @Sendable (Result<T, any Error>) -> Void
    ) {
        submit(durable: false, { t, now in try work(t.queue, now) }, completion)
    }

    /// Deletes messages (and their deliveries) older than `retention` whose
    /// deliveries are all final; returns how many.
    public func purgeMessages(
        olderThan retention: Duration, completion: @escaping @Sendable (Result<Int, any Error>) -> Void
    ) {
        let ms = retention.components.seconds * 1000
        submit(durable: false, { t, now in try t.queue.purge(before: now - ms) }, completion)
    }

    /// Deliveries waiting and in flight.
    public func queueDepth(completion: @escaping @Sendable (Result<QueueDepth, any Error>) -> Void) {
        read({ t in try t.queue.depth() }, completion)
    }

    // MARK: One instance

    /// One daemon owns a SQLite file.
    public var isShared: Bool { false }

    /// No other instance queues work here.
    public func setWorkObserver(_ observer: @escaping @Sendable () -> Void) {}

    /// The caller's own limiter is exact: always allowed.
    public func takeSharedToken(
        _ bucket: String, perMinute: Int, completion: @escaping @Sendable (Result<Int64?, any Error>) -> Void
    ) {
        completion(.success(nil))
    }

    /// Proves the writer answers and takes the write lock (its
    /// transaction is `BEGIN IMMEDIATE`), for `system.health` and `/readyz`,
    /// every 2 s. One row, not a count: counting the devices took the
    /// writer 10 ms every 2 s at 20,000 devices (and ten times that at
    /// 200,000), and the calls queued behind it waited.
    public func ping(completion: @escaping @Sendable (Result<Void, any Error>) -> Void) {
        submit(durable: false, { t, _ in try t.registry.probe() }, completion)
    }
}

/// The store's tables, as jobs see them.
struct Tables {
    let registry: Registry
    let queue: Queue
}

/// The write-ahead log's file, opened read-only to start its writeback
/// (``hs_start_writeback``); opened on first use, again after a failure
/// only every 1,000 tries (the log may not exist yet).
private struct WALWriteback {
    let path: String
    private var fd: Int32 = -1
    private var skip = 0

    init(path: String) { self.path = path }

    mutating func start() {
        if fd < 0 {
            if skip > 0 {
                skip -= 1
                return
            }
            fd = open(path, O_RDONLY | O_CLOEXEC)
            if fd < 0 {
                skip = 1000
                return
            }
        }
        _ = hs_start_writeback(fd)
    }

    mutating func close() {
        if fd >= 0 { _ = Glibc.close(fd) }
        fd = -1
    }
}
