internal import CHeraldSys
import Foundation
public import HeraldCore
import HeraldCrypto
import Postgres
import HeraldIO

/// The PostgreSQL backend of ``DeliveryStore``: one database that several
/// Herald instances (one per application host) share.
///
/// Jobs queue here and run in group commits on a pool of connections, each
/// on a thread of its own: every job waiting when a connection frees up
/// joins its transaction, each job in its own savepoint, so one commit
/// covers many requests and a failing job rolls back alone. A job that
/// loses a race with another instance (a unique index, a deadlock) runs
/// again in a fresh savepoint and sees the winner's row. Writes of one key
/// (an app's user, a message) run in the order they were queued, and a read
/// of that key runs after them, as on SQLite's single writer.
///
/// A listener thread of its own connection holds this instance's identity
/// (a session advisory lock, gone with the process), beats its heartbeat,
/// renews the leases of the deliveries its scheduler holds, takes back work
/// nobody holds (a dead instance's, an expired or too old lease), and hears
/// the other instances' `NOTIFY`. Every time several instances compare is
/// the database's; jobs see it as `now`, and the times handed to the
/// scheduler are moved to this host's clock (and back) by the offset
/// measured at each batch. Every call has a deadline (``CallDeadlines``).
/// Completions run on the store's threads; they must hand work elsewhere quickly.
public final class PostgresStore: DeliveryStore, RegistryHost, QueueHost, Sendable {
    private typealias Job = any QueuedCall<PostgresConnection>

    /// What the callers and the pool's threads share.
    private struct Shared {
        var queue: [Job] = []
        /// Fences of the batches running now: a job of such a key waits.
        var busy: [String: Int] = [:]
        var running = 0
        var stopping = false
        var closed = false
        /// Per pool connection, the session (its reconnect count) set to commit asynchronously.
        var sessions: [ObjectIdentifier: Int] = [:]
        var observer: (@Sendable () -> Void)?
        /// When a call last passed its deadline (monotonic ns).
        var lastTimeoutAt: UInt64?
        /// Sweeps ``deadlines`` every 100 ms.
        let sweeper: any DispatchSourceTimer
    }

    /// Its condition wakes ``abandon()`` when the last batch finished.
    private let shared: Locked<Shared>

    private let pool: PostgresPool
    let queueTables: PostgresQueue
    /// The store key, which the registry's rules seal and open devices with.
    private let storeKey: StoreKey
    private let clock: any WallClock
    private let options: PostgresStoreOptions
    private let listener: Listener
    private let deadlines = CallDeadlines()
    /// Deliveries this instance's scheduler holds: claimed or handed over
    /// and not yet recorded. Only these leases are renewed.
    private let held = HeldDeliveries()
    /// The database's clock minus this host's, in ms, as the last batch measured it.
    private let offset = ClockOffset()
    /// Enqueues of callers that wait for the outcome holding their commit
    /// for the results of their early sends (see ``EarlyResults``): half the
    /// pool at most, each for ``resultHold`` at the most.
    private let holds: ResultHolds
    /// The longest an enqueue holds its commit for the results of its early
    /// sends: long enough for a provider on the same network (a few ms);
    /// answers that come later are written as before.
    public static let resultHold: Duration = .milliseconds(50)

    /// The most jobs with a savepoint one transaction takes: past 64
    /// PostgreSQL's subtransaction cache overflows and every snapshot pays.
    static let maxBatch = 64
    /// The most `record` calls one transaction merges into its one statement.
    static let maxMergedRecords = 256
    /// The most jobs that may wait for a connection: past it a call fails at
    /// once (the database is slow or away) rather than queue without bound.
    static let queueLimit = 16_384
    /// Runs of one job after it lost a race with another instance.
    static let maxRetries = 5

    public let keyOutcome: StoreKeyOutcome
    public let recoveredDeliveries: Int
    /// Always 0: a message is committed in one transaction here (other
    /// writers do not wait for it).
    public let unfinishedCompleted = 0
    /// The advisory lock the housekeeper holds while it purges (one instance at a time).
    public static var housekeeperLockKey: Int64 { PostgresQueue.housekeeperLock }

    /// How long a start waits for an identity held by another session before refusing.
    static let identityWait: TimeInterval = 3
    /// How long after a call passed its deadline the store is still reported degraded.
    static let stuckReportNs: UInt64 = 4_000_000_000

    /// Connects, migrates the schema (one instance at a time), checks the
    /// store key against the database, re-queues what this instance left in
    /// flight, and starts the pool and the listener. Throws when the database
    /// cannot be reached or migrated, and ``StoreKeyError`` as
    /// ``StoreLocation/open(keySupply:keyFile:instance:clock:)`` says.
    public init(
        options: PostgresStoreOptions, keySupply: StoreKeySupply, keyFile: String, instance: String,
        clock: any WallClock = SystemClock()
    ) throws {
        self.options = options
        self.clock = clock
        let database = StoreLocation.postgres(options).description
        let setup = PostgresConnection(configuration: options.connection)
        defer { setup.close() }
        try setup.connect()
        try PostgresSchema.migrate(setup)
        let (key, outcome) = try PostgresKeyCheck.settle(setup, supply: keySupply, keyFile: keyFile, database: database)
        keyOutcome = outcome
        let leaseMs = max(1, options.lease.wholeMillisecondsValue)
        let shift = Self.shift(of: clock)
        queueTables = PostgresQueue(
            key: key, instance: instance, leaseMs: leaseMs, maxAgeMs: options.leaseMaxAge.wholeMillisecondsValue,
            shift: shift)
        storeKey = key
        // The identity first: a second live instance of this name must not
        // take back the first one's work below.
        let identity = InstanceIdentity(name: instance, version: options.version)
        let own = PostgresConnection(configuration: options.connection)
        do {
            try own.connect()
            // A restart right after a kill may find the dead process's session
            // not yet ended by the server: try for a few seconds before refusing.
            let giveUp = Date().addingTimeInterval(Self.identityWait)
            while true {
                do {
                    try identity.claim(own)
                    break
                } catch let error as InstanceInUse {
                    if Date() >= giveUp { throw error }
                    Thread.sleep(forTimeInterval: 0.25)
                }
            }
        } catch {
            own.close()
            throw error
        }
        let tables = queueTables
        do {
            recoveredDeliveries = try setup.transaction { c in
                let now = clock is SystemClock ? try Self.databaseNow(c) : clock.nowMilliseconds()
                try PostgresRegistry(c, key: key).expireTombstones(now: now)
                let own = try tables.releaseOwn(c, now: now, reason: "instance restarted")
                _ = try tables.rescue(c, now: now, gone: [])
                return own
            }
        } catch {
            own.close()
            throw error
        }
        pool = PostgresPool(
            configuration: options.connection, size: options.poolSize, queueLimit: Self.queueLimit,
            threadName: "herald-pg")
        holds = ResultHolds(limit: options.poolSize / 2, longest: Self.resultHold)
        let sweeper = DispatchSource.makeTimerSource(queue: DispatchQueue(label: "herald-pg-deadlines"))
        let deadlines = self.deadlines
        sweeper.setEventHandler { deadlines.sweep() }
        sweeper.schedule(
            deadline: .now() + .milliseconds(100), repeating: .milliseconds(100), leeway: .milliseconds(20))
        sweeper.resume()
        shared = Locked(Shared(sweeper: sweeper))
        listener = Listener(identity: identity, queue: queueTables, held: held, renewEveryMs: max(1, leaseMs / 3))
        listener.start(connection: own) { [weak self] in self?.workArrived() }
    }

    /// What an injected clock (tests) adds to the database's: its distance
    /// from this host's real clock. Zero for the system clock: in service
    /// every time is the database's.
    static func shift(of clock: any WallClock) -> @Sendable () -> Int64 {
        if clock is SystemClock { return { 0 } }
        return { clock.nowMilliseconds() - SystemClock().nowMilliseconds() }
    }

    /// The database's clock, read by a statement now (see ``PostgresQueue/databaseNow``).
    static func databaseNow(_ c: PostgresConnection) throws -> Int64 {
        try c.execute(Statements.now).first?.int64(0) ?? 0
    }

    private enum Statements {
        static let now = PostgresStatement(name: "store_now", sql: "SELECT \(PostgresQueue.databaseNow)")
        static let writable = PostgresStatement(
            name: "store_writable", sql: "SELECT current_setting('transaction_read_only') = 'off', pg_is_in_recovery()")
    }

    deinit {
        let closed = shared.withLock { s in
            s.sweeper.cancel()
            return s.closed
        }
        listener.stop()
        // Let go without `close()` (a test, a start that failed half way):
        // its connections end as a killed process's would, the identity lock
        // with them. Closed elsewhere, as the last reference may be dropped
        // on one of the pool's own threads, which the close waits for.
        if !closed {
            let pool = self.pool
            Thread.detachNewThread { pool.close() }
        }
    }

    /// Stops taking calls, finishes the queued ones, hands back the
    /// deliveries this instance still has in flight (its peers take them at
    /// once rather than after the lease), and closes the connections (the
    /// identity lock goes with them).
    public func close() {
        let released = ResultBox<Int>()
        submit(
            { [queueTables] c, now in try queueTables.releaseOwn(c, now: now, reason: "released at stop") },
            { released.set($0) })
        _ = released.wait()
        abandon()
    }

    /// Closes the connections without handing anything back, as a killed
    /// process leaves the database (its sessions end, its identity lock with
    /// them): the other instances take its work within seconds. For tests;
    /// a stopping daemon calls ``close()``.
    public func abandon() {
        let first = shared.withLock { s in
            if s.closed { return false }
            s.closed = true
            s.stopping = true
            return true
        }
        guard first else { return }
        shared.withLock(when: { $0.running == 0 && $0.queue.isEmpty }) { $0.sweeper.cancel() }
        listener.stop()
        pool.close()
    }

    public var isShared: Bool { true }

    public func setWorkObserver(_ observer: @escaping @Sendable () -> Void) {
        shared.withLock { $0.observer = observer }
    }

    private func workArrived() {
        let observer = shared.withLock { $0.observer }
        observer?()
    }

    // MARK: Jobs

    func submit<T>(
        durable: Bool = true, fence: String? = nil, timeout: Duration? = nil,
        _ work: @escaping @Sendable (PostgresConnection, Int64) throws -> T,
        _ completion: @escaping @Sendable (Result<T, any Error>) -> Void
    ) {
        enqueue(call(durable: durable, fence: fence, timeout: timeout, work, completion))
    }

    /// A call with its deadline: answered by its work or, past the
    /// deadline, with ``StoreTimeout``, whichever comes first.
    private func call<T>(
        durable: Bool = true, fence: String? = nil, timeout: Duration? = nil,
        _ work: @escaping @Sendable (PostgresConnection, Int64) throws -> T,
        _ completion: @escaping @Sendable (Result<T, any Error>) -> Void
    ) -> StoreCall<PostgresConnection, T> {
        let limit = timeout ?? options.callTimeout
        let once = OnceCompletion(completion)
        let entry = deadlines.add(due: CallDeadlines.now + UInt64(max(1, limit.wholeMillisecondsValue)) * 1_000_000) {
            [weak self] in
            self?.noteTimeout()
            once.complete(.failure(StoreTimeout(seconds: Double(limit.wholeMillisecondsValue) / 1000)))
        }
        let deadlines = self.deadlines
        return StoreCall(
            work: work,
            completion: { result in
                deadlines.finish(entry)
                once.complete(result)
            }, durable: durable, fence: fence, deadline: entry.due, keeper: { deadlines.keep(entry) })
    }

    private func enqueue(_ job: Job) {
        let refusal = shared.withLock { s -> PostgresError? in
            if s.stopping { return PostgresError(.closed, "store is closed") }
            if s.queue.count >= Self.queueLimit {
                return PostgresError(.queueFull, "the store's job queue is full (\(Self.queueLimit) jobs waiting)")
            }
            s.queue.append(job)
            dispatch(&s)
            return nil
        }
        if let refusal { job.fail(refusal) }
    }

    /// Starts batches while connections are free (under `shared`'s lock). A
    /// job waits while a running batch holds its fence, and so does every
    /// later job of that fence, so that writes of one key run in order.
    private func dispatch(_ s: inout Shared) {
        while s.running < pool.size && !s.queue.isEmpty {
            var batch: [Job] = []
            var rest: [Job] = []
            var blocked = Set<String>()
            let now = CallDeadlines.now
            var savepoints = 0
            var merged = 0
            for job in s.queue {
                // Answered by its deadline already: its work would answer no one.
                if job.deadline <= now { continue }
                // Results merge into one statement without a savepoint; every
                // other job has one, at most maxBatch in a transaction.
                let isRecord = job is RecordCall
                if isRecord ? merged < Self.maxMergedRecords : savepoints < Self.maxBatch,
                    job.fence.map({ s.busy[$0] == nil && !blocked.contains($0) }) ?? true
                {
                    if isRecord { merged += 1 } else { savepoints += 1 }
                    batch.append(job)
                } else {
                    if let fence = job.fence { blocked.insert(fence) }
                    rest.append(job)
                }
            }
            guard !batch.isEmpty else { return }
            s.queue = rest
            s.running += 1
            for case let fence? in batch.map(\.fence) { s.busy[fence, default: 0] += 1 }
            let taken = batch
            pool.submit({ [self] c in commit(taken, c) }) { [self] result in
                if case .failure(let error) = result {
                    // The pool refused the batch (closing): nothing ran.
                    finished(taken, failure: error, outcomes: [])
                }
            }
        }
    }

    /// Sets the pool connection's session to commit asynchronously, once per
    /// session (again after a reconnect): see ``begin(_:_:)``.
    private func prepareSession(_ c: PostgresConnection) {
        let key = ObjectIdentifier(c)
        guard shared.withLock({ $0.sessions[key] }) != c.reconnects else { return }
        do {
            try c.executeScript("SET synchronous_commit = off")
            let done = c.reconnects
            shared.withLock { $0.sessions[key] = done }
        } catch {
            // The batch finds the connection's state itself.
        }
    }

    /// A batch of results only: their one statement, in autocommit (one
    /// round trip, no BEGIN or COMMIT), on the session's asynchronous commit.
    private func writeResults(_ batch: [Job], _ c: PostgresConnection) {
        let records = batch.compactMap { $0 as? RecordCall }.filter { !Self.answered($0) && $0.keep() }
        do {
            let now = try measure(c)
            if !records.isEmpty {
                try Self.retryingMoves { try queueTables.record(c, records.flatMap(\.records), now: now) }
            }
        } catch {
            finished(batch, failure: error, outcomes: [])
            return
        }
        finished(batch, failure: nil, outcomes: records.map(\.outcome))
    }

    /// Runs a batch in one transaction on a pool thread, then completes its jobs.
    private func commit(_ batch: [Job], _ c: PostgresConnection) {
        prepareSession(c)
        if batch.allSatisfy({ $0 is RecordCall }) { return writeResults(batch, c) }
        if batch.count == 1 { return runAlone(batch[0], c) }
        var outcomes: [CallOutcome] = []
        outcomes.reserveCapacity(batch.count)
        // Every result of the batch in one statement, first, without a
        // savepoint: it fails only with the transaction (begun again when
        // a row it records was moved by another transaction meanwhile).
        let records = batch.compactMap { $0 as? RecordCall }.filter { !Self.answered($0) && $0.keep() }
        let started = Result {
            try Self.retryingMoves {
                let now = try begin(batch, c)
                do {
                    if !records.isEmpty { try queueTables.record(c, records.flatMap(\.records), now: now) }
                } catch {
                    try? c.rollback()
                    throw error
                }
                return now
            }
        }
        guard case .success(let now) = started else {
            try? c.rollback()
            if case .failure(let error) = started { finished(batch, failure: error, outcomes: []) }
            return
        }
        outcomes += records.map(\.outcome)
        var lost: (any Error)?
        // A job whose caller was answered by its deadline does not run: a
        // batch stuck behind a lock does not run, one after another, jobs
        // nobody waits for. The jobs run in the order of their fences (the
        // user or message whose lock they take; the same fence's jobs in the
        // order asked): every instance's batch takes its locks in one order,
        // so two batches never wait for each other in a cycle.
        for job in Self.lockOrder(batch, fence: { $0.fence }) where lost == nil && !(job is RecordCall) {
            if Self.answered(job) { continue }
            var attempt = 0
            while true {
                do {
                    try c.executeScript("SAVEPOINT job")
                } catch {
                    lost = error
                    break
                }
                let outcome = job.run(c, now: now)
                do {
                    if let error = outcome.error { throw error }
                    guard job.keep() else {
                        // Answered store_unavailable meanwhile: undone, never a silent accept.
                        try c.executeScript("ROLLBACK TO job")
                        try c.executeScript("RELEASE job")
                        outcomes.append(CallOutcome(error: nil) { _ in })
                        break
                    }
                    try c.executeScript("RELEASE job")
                    outcomes.append(outcome)
                    break
                } catch {
                    if let pg = error as? PostgresError, pg.isConnectionFailure {
                        lost = error
                        break
                    }
                    noteIfStuck(error)
                    do {
                        try c.executeScript("ROLLBACK TO job")
                        try c.executeScript("RELEASE job")
                    } catch {
                        lost = error
                        break
                    }
                    attempt += 1
                    if Self.isRace(error), attempt < Self.maxRetries { continue }
                    outcomes.append(outcome.error != nil ? outcome : CallOutcome(error: error) { _ in job.fail(error) })
                    break
                }
            }
        }
        var failure = lost
        if lost != nil {
            try? c.rollback()
        } else {
            do {
                try c.commit()
            } catch {
                try? c.rollback()
                // Nothing of this batch is known to be committed: no job may report success.
                failure = error
            }
        }
        finished(batch, failure: failure, outcomes: outcomes)
    }

    /// The jobs of a batch in the order they take their locks in: by fence,
    /// those without one last, each fence's jobs (and those without) in the
    /// order they were asked for.
    static func lockOrder<T>(_ batch: [T], fence: (T) -> String?) -> [T] {
        batch.enumerated().sorted { x, y in
            switch (fence(x.element), fence(y.element)) {
            case (let a?, let b?) where a != b: return a < b
            case (.some, .none): return true
            case (.none, .some): return false
            default: return x.offset < y.offset
            }
        }.map(\.element)
    }

    /// A batch of one job: its own transaction, no savepoint (a lost race
    /// runs the whole transaction again).
    private func runAlone(_ job: Job, _ c: PostgresConnection) {
        var attempt = 0
        while true {
            let started = Result { try begin([job], c) }
            guard case .success(let now) = started else {
                try? c.rollback()
                if case .failure(let error) = started { finished([job], failure: error, outcomes: []) }
                return
            }
            if Self.answered(job) {
                try? c.rollback()
                return finished([job], failure: nil, outcomes: [])
            }
            let outcome = job.run(c, now: now)
            if let error = outcome.error {
                try? c.rollback()
                noteIfStuck(error)
                attempt += 1
                if Self.isRace(error), attempt < Self.maxRetries { continue }
                return finished([job], failure: nil, outcomes: [outcome])
            }
            if !job.keep() {
                // Answered store_unavailable meanwhile: undone, never a silent accept.
                try? c.rollback()
                return finished([job], failure: nil, outcomes: [])
            }
            let committed = Result { try c.commit() }
            if case .failure(let error) = committed {
                try? c.rollback()
                return finished([job], failure: error, outcomes: [])
            }
            return finished([job], failure: nil, outcomes: [outcome])
        }
    }

    /// Begins the batch's transaction; returns the database's time.
    private func begin(_ batch: [Job], _ c: PostgresConnection) throws -> Int64 {
        // The session commits asynchronously (claims, results and reads: a
        // crash may lose them, costing a repeat); a registration, an enqueue
        // or a cancel commits as the server is configured to (set in the
        // BEGIN's round trip).
        let settings = batch.contains(where: { $0.durable }) ? "SET LOCAL synchronous_commit TO DEFAULT" : nil
        do {
            try c.begin(settings)
        } catch {
            // A connection the server dropped (a restart) is found dead only
            // when used: nothing of the batch ran, so open a new one and begin again.
            guard error.isConnectionFailure else { throw error }
            try c.begin(settings)
        }
        // The batch's time is the database's; the offset to this host's
        // clock moves the times handed to the scheduler (and back).
        return try measure(c)
    }

    /// Whether the job's caller was answered by its deadline.
    private static func answered(_ job: Job) -> Bool {
        job.deadline <= CallDeadlines.now
    }

    /// The store's time for a batch: the database's, from the offset to this
    /// host's clock measured within the last second, else measured now (an
    /// injected test clock is the store's time exactly).
    private func measure(_ c: PostgresConnection) throws -> Int64 {
        // A test's injected clock is the store's time exactly (its rules are
        // tested to the millisecond); leases still follow the database's.
        if !(clock is SystemClock) { return clock.nowMilliseconds() }
        if let d = offset.recent(within: 1_000_000_000) { return clock.nowMilliseconds() + d }
        let before = clock.nowMilliseconds()
        let now = try Self.databaseNow(c) + queueTables.shift()
        let after = clock.nowMilliseconds()
        offset.set(now - (before + after) / 2)
        return now
    }

    /// Runs `body` again (at most ``maxRetries`` times in all) while it
    /// fails with SQLSTATE 40001: a row it updates was moved to the other
    /// partition of `deliveries` (finished, or back to the queue) by a
    /// transaction that committed while this one waited for the row's lock.
    /// Read committed cannot follow such a row, so the statement fails; run
    /// again, it sees where the row went.
    static func retryingMoves<T>(_ body: () throws -> T) throws -> T {
        var attempt = 1
        while true {
            do {
                return try body()
            } catch {
                guard (error as? PostgresError)?.sqlState == .serializationFailure, attempt < maxRetries else {
                    throw error
                }
                attempt += 1
            }
        }
    }

    /// Whether a job failed because another transaction won a race, so that
    /// running it again sees the winner's row.
    static func isRace(_ error: any Error) -> Bool {
        if error is RegistrationRaceLost { return true }
        guard let state = (error as? PostgresError)?.sqlState else { return false }
        return state == .uniqueViolation || state == .deadlockDetected || state == .serializationFailure
    }

    /// Releases the batch's fences and connection, then answers its calls:
    /// every one with `failure` when the batch did not commit.
    private func finished(_ batch: [Job], failure: (any Error)?, outcomes: [CallOutcome]) {
        shared.withLock { s in
            s.running -= 1
            for case let fence? in batch.map(\.fence) {
                let left = (s.busy[fence] ?? 1) - 1
                s.busy[fence] = left > 0 ? left : nil
            }
            if !s.stopping || !s.queue.isEmpty { dispatch(&s) }
        }
        shared.broadcast()
        if let failure {
            for job in batch { job.fail(failure) }
        } else {
            for outcome in outcomes { outcome.answer(nil) }
        }
    }

    // MARK: Registry (the calls themselves: ``RegistryHost``)

    func writeRows<T>(
        durable: Bool, fence: String?, _ work: @escaping @Sendable (PostgresRegistry, Int64) throws -> T,
        _ completion: @escaping @Sendable (Result<T, any Error>) -> Void
    ) {
        submit(
            durable: durable, fence: fence, { [storeKey] c, now in try work(PostgresRegistry(c, key: storeKey), now) },
            completion)
    }

    /// A read on the pool, after the writes of its fence (the figures too:
    /// every pool connection reads without holding up the others).
    func readRows<T>(
        fence: String?, figures: Bool, _ work: @escaping @Sendable (PostgresRegistry) throws -> T,
        _ completion: @escaping @Sendable (Result<T, any Error>) -> Void
    ) {
        submit(
            durable: false, fence: fence, { [storeKey] c, _ in try work(PostgresRegistry(c, key: storeKey)) },
            completion)
    }

    // MARK: Delivery queue

    public func enqueue(_ e: Enqueue, completion: @escaping @Sendable (Result<Enqueued, any Error>) -> Void) {
        submit({ [queueTables] c, now in try queueTables.enqueue(c, e, now: now, handoff: [:]).accepted }, completion)
    }

    /// Takes over what a claim or hand-over committed: its deliveries are
    /// held (their leases renewed) and its times moved to this host's clock.
    /// A claim whose commit failed may have committed all the same (the
    /// connection was lost during COMMIT): its rows are put back at once.
    private func take(_ result: Result<Claim, any Error>, tried: ClaimedIDs) -> Result<Claim, any Error> {
        switch result {
        case .success(let claim):
            held.insert(claim.jobs.map(\.deliveryID))
            return .success(offset.toLocal(claim))
        case .failure(let error):
            let ids = tried.ids
            if !ids.isEmpty {
                submit(
                    durable: false, { [queueTables] c, now in try queueTables.putBack(c, ids: ids, now: now) }, { _ in }
                )
            }
            return .failure(error)
        }
    }

    /// Hands the deliveries over before their rows are written when `early`
    /// is given (their ids taken ahead: see
    /// ``PostgresQueue/enqueue(_:_:now:handoff:handoffLimit:early:plan:)``),
    /// else at the commit. A job that lost a race runs again with the same
    /// plan, so that what went early is neither lost nor sent twice.
    public func enqueue(
        _ e: Enqueue, handoff: [QueueLane: Int], limit: Int, early: (@Sendable (Claim) -> Void)?,
        completion: @escaping @Sendable (Result<(accepted: Enqueued, claim: Claim), any Error>) -> Void
    ) {
        let tried = ClaimedIDs()
        let plan = EarlyPlan()
        let offset = self.offset
        let holds = self.holds
        var handEarly: (@Sendable (Claim) -> Void)?
        if let early {
            handEarly = { claim in early(offset.toLocal(claim)) }
        }
        let earlyCall = handEarly
        // Early sends only while a second at least is left before the call's deadline.
        let due = CallDeadlines.now + UInt64(max(1, options.callTimeout.wholeMillisecondsValue)) * 1_000_000
        let margin: UInt64 = 1_000_000_000
        submit(
            { [queueTables] c, now in
                let result = try queueTables.enqueue(
                    c, e, now: now, handoff: handoff, handoffLimit: limit, early: earlyCall,
                    earlyAllowed: { CallDeadlines.now + margin < due }, plan: plan, holds: holds,
                    holdLatest: due - margin)
                tried.ids = plan.deliveryIDs + result.claim.jobs.map(\.deliveryID)
                return result
            },
            { [self] result in
                // What went early is held (its leases renewed) once its rows are known to be written.
                switch result {
                case .success(let (accepted, claim)):
                    let kept = plan.kept
                    held.insert(kept.isEmpty ? plan.deliveryIDs : plan.deliveryIDs.filter { kept[$0] == nil })
                    completion(take(.success(claim), tried: tried).map { (accepted, $0) })
                case .failure(let error):
                    if tried.ids.isEmpty { tried.ids = plan.deliveryIDs }
                    _ = take(.failure(error), tried: tried)
                    completion(.failure(error))
                }
            })
    }

    public func status(
        app: String, messageID: String, detail: Bool,
        completion: @escaping @Sendable (Result<MessageStatus?, any Error>) -> Void
    ) {
        submit(
            durable: false, fence: StoreFences.message(messageID),
            { [queueTables] c, _ in try queueTables.status(c, app: app, messageID: messageID, detail: detail) },
            completion)
    }

    public func cancel(
        app: String, messageID: String, completion: @escaping @Sendable (Result<Int?, any Error>) -> Void
    ) {
        submit(
            fence: StoreFences.message(messageID),
            { [queueTables] c, now in try queueTables.cancel(c, app: app, messageID: messageID, now: now) }, completion)
    }

    public func claimDue(
        lanes: [QueueLane: Int], others: Int, counted: Set<BatchKey>,
        completion: @escaping @Sendable (Result<Claim, any Error>) -> Void
    ) {
        let tried = ClaimedIDs()
        submit(
            durable: false,
            { [queueTables] c, now in
                let claim = try queueTables.claimDue(c, lanes: lanes, others: others, counted: counted, now: now)
                tried.ids = claim.jobs.map(\.deliveryID)
                return claim
            },
            { [self] result in completion(take(result, tried: tried)) })
    }

    public func record(
        deliveryID: Int64, state: DeliveryState, httpStatus: Int?, reason: RecordedReason?, nextAttemptAt: Int64?,
        completion: @escaping @Sendable (Result<Void, any Error>) -> Void
    ) {
        let next = nextAttemptAt.map(offset.toDatabase)
        submit(
            durable: false,
            { [queueTables] c, now in
                let deviceID =
                    try c.execute("SELECT device_id FROM deliveries WHERE delivery_id = $1", [.int(deliveryID)])
                    .first?.text(0) ?? ""
                try queueTables.record(
                    c,
                    [
                        DeliveryRecord(
                            deliveryID: deliveryID, deviceID: deviceID, state: state, httpStatus: httpStatus,
                            reason: reason, nextAttemptAt: next)
                    ], now: now)
            },
            { [held] result in
                if case .success = result { held.remove([deliveryID]) }
                completion(result)
            })
    }

    public func record(_ records: [DeliveryRecord], completion: @escaping @Sendable (Result<Void, any Error>) -> Void) {
        let moved = records.map(offset.toDatabase)
        let inner = call(
            durable: false, { [queueTables] c, now in try queueTables.record(c, moved, now: now) },
            { [held] result in
                if case .success = result { held.remove(records.map(\.deliveryID)) }
                completion(result)
            })
        enqueue(RecordCall(records: moved, inner: inner))
    }

    /// The scheduler gave up on these deliveries' results (dropped past its
    /// bound): their leases are no longer renewed, so that any instance
    /// sends them again once the lease runs out.
    public func forget(deliveryIDs: [Int64]) {
        held.remove(deliveryIDs)
    }

    /// Publishes the lanes this instance can send (its instance row), so
    /// that the others leave their deliveries to it rather than skip them.
    public func publish(lanes: Set<QueueLane>) {
        let names = Set(lanes.map(PostgresQueue.laneName))
        queueTables.setOwnLanes(names)
        listener.publish(lanes: names)
    }

    public func releaseCredentialWaits(
        lanes: [QueueLane], completion: @escaping @Sendable (Result<Int, any Error>) -> Void
    ) {
        submit(
            { [queueTables] c, now in try queueTables.releaseCredentialWaits(c, lanes: lanes, now: now) }, completion)
    }

    /// A result's job (``QueueHost``: `removeStale`): once it is written,
    /// the settled deliveries are no longer held (their leases not renewed).
    func writeResults<T>(
        settling settled: [Int64], _ work: @escaping @Sendable (PostgresQueue.Rows, Int64) throws -> T,
        _ completion: @escaping @Sendable (Result<T, any Error>) -> Void
    ) {
        submit(
            durable: false, { [queueTables] c, now in try work(PostgresQueue.Rows(queue: queueTables, c: c), now) },
            { [held] result in
                if case .success = result { held.remove(settled) }
                completion(result)
            })
    }

    public func purgeMessages(
        olderThan retention: Duration, completion: @escaping @Sendable (Result<Int, any Error>) -> Void
    ) {
        let ms = retention.components.seconds * 1000
        purgeChunks(before: ms, total: 0, completion: completion)
    }

    /// One housekeeping chunk per job, each its own batch's worth of work
    /// after the calls queued meanwhile, until a chunk finds less than a
    /// full one (or another instance is the housekeeper: its lock is taken).
    private func purgeChunks(
        before ms: Int64, total: Int, completion: @escaping @Sendable (Result<Int, any Error>) -> Void
    ) {
        submit(
            durable: false, { [queueTables] c, now in try queueTables.purgeChunk(c, before: now - ms, now: now) },
            { [self] result in
                switch result {
                case .success(let purged?) where purged >= PostgresQueue.purgeChunk:
                    purgeChunks(before: ms, total: total + purged, completion: completion)
                case .success(let purged):
                    completion(.success(total + (purged ?? 0)))
                case .failure(let error):
                    completion(total > 0 ? .success(total) : .failure(error))
                }
            })
    }

    /// Counted from the partial indexes, and answered from a count less
    /// than a second old when there is one.
    public func queueDepth(completion: @escaping @Sendable (Result<QueueDepth, any Error>) -> Void) {
        if let depth = queueTables.recentDepth { return completion(.success(depth)) }
        submit(durable: false, { [queueTables] c, _ in try queueTables.depth(c) }, completion)
    }

    public func queueDepthByApp(completion: @escaping @Sendable (Result<[String: QueueDepth], any Error>) -> Void) {
        submit(durable: false, { [queueTables] c, _ in try queueTables.depthByApp(c) }, completion)
    }

    /// Answers within its own deadline; fails when the database cannot take
    /// writes (a standby, `default_transaction_read_only`), when a call
    /// passed its deadline in the last seconds (calls are stuck on a lock or
    /// a slow database), or when another live instance holds this one's identity.
    public func ping(completion: @escaping @Sendable (Result<Void, any Error>) -> Void) {
        if let why = listener.identityProblem { return completion(.failure(StoreHealthProblem(why))) }
        let stuck = shared.withLock { $0.lastTimeoutAt.map { CallDeadlines.now - $0 < Self.stuckReportNs } ?? false }
        let limit = options.callTimeout
        submit(
            durable: false, timeout: options.pingTimeout,
            { c, _ in
                let r = try c.execute(Statements.writable).first
                if try r?.bool(0) != true || r?.bool(1) == true {
                    throw StoreHealthProblem("the database is read-only: it cannot take writes")
                }
                if stuck {
                    throw StoreHealthProblem("store calls passed their deadline (\(limit)) in the last seconds")
                }
            }, completion)
    }

    /// A lock or statement timeout: the store is stuck, as for a deadline.
    private func noteIfStuck(_ error: any Error) {
        guard let state = (error as? PostgresError)?.sqlState else { return }
        if state == .lockNotAvailable || state == .queryCanceled { noteTimeout() }
    }

    private func noteTimeout() {
        shared.withLock { $0.lastTimeoutAt = CallDeadlines.now }
    }

    public func takeSharedToken(
        _ bucket: String, perMinute: Int, completion: @escaping @Sendable (Result<Int64?, any Error>) -> Void
    ) {
        submit(
            durable: false,
            { [queueTables] c, now in try queueTables.takeToken(c, bucket: bucket, perMinute: perMinute, now: now) },
            completion)
    }
}

extension Duration {
    /// Whole milliseconds (rounded down).
    var wholeMillisecondsValue: Int64 {
        components.seconds * 1000 + components.attoseconds / 1_000_000_000_000_000
    }
}

/// A `record` call: a batch merges the results of all its record calls into
/// one statement (``PostgresQueue/record(_:_:now:)``), run without a savepoint.
struct RecordCall: QueuedCall {
    typealias Context = PostgresConnection
    let records: [DeliveryRecord]
    let inner: StoreCall<PostgresConnection, Void>

    var durable: Bool { false }
    var fence: String? { nil }
    var deadline: UInt64 { inner.deadline }
    func keep() -> Bool { inner.keep() }
    func run(_ context: PostgresConnection, now: Int64) -> CallOutcome { inner.run(context, now: now) }
    func fail(_ error: any Error) { inner.fail(error) }

    /// Answers once the batch's fate is known (its records were written).
    var outcome: CallOutcome {
        let completion = inner.completion
        return CallOutcome(error: nil) { failure in completion(failure.map { .failure($0) } ?? .success(())) }
    }
}

/// Why the store reports itself degraded though the database answers.
public struct StoreHealthProblem: Error, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}

/// A second live instance with this instance's identity (`[server] instance_id`).
public struct InstanceInUse: Error, CustomStringConvertible {
    public let description: String
}

/// The deliveries an instance's scheduler holds (see ``PostgresStore``).
final class HeldDeliveries: Sendable {
    private let ids = Locked(Set<Int64>())

    func insert(_ new: [Int64]) { ids.withLock { $0.formUnion(new) } }
    func remove(_ gone: [Int64]) { ids.withLock { $0.subtract(gone) } }
    var all: [Int64] { ids.withLock { Array($0) } }
}

/// The ids a claim's job took, for putting them back when its commit fails.
final class ClaimedIDs: Sendable {
    private let taken = Locked<[Int64]>([])
    var ids: [Int64] {
        get { taken.withLock { $0 } }
        set { taken.withLock { $0 = newValue } }
    }
}

/// The database's clock minus this host's (ms): the scheduler compares the
/// times it is handed with its own clock, so they are moved to it, and the
/// times it hands back (a retry's due time) are moved to the database's.
final class ClockOffset: Sendable {
    /// The offset, and when it was measured (``CallDeadlines/now``).
    private let measured = Locked<(ms: Int64, at: UInt64?)>((0, nil))

    func set(_ value: Int64) {
        measured.withLock { $0 = (value, CallDeadlines.now) }
    }

    /// The offset when it was measured less than `ns` ago: the clocks do
    /// not drift apart in a second, so a batch need not ask the database.
    func recent(within ns: UInt64) -> Int64? {
        measured.withLock { m in m.at.map { CallDeadlines.now - $0 < ns } == true ? m.ms : nil }
    }
    var value: Int64 { measured.withLock { $0.ms } }

    func toDatabase(_ local: Int64) -> Int64 { local + value }

    func toDatabase(_ r: DeliveryRecord) -> DeliveryRecord {
        guard let next = r.nextAttemptAt else { return r }
        return DeliveryRecord(
            deliveryID: r.deliveryID, deviceID: r.deviceID, state: r.state, httpStatus: r.httpStatus, reason: r.reason,
            nextAttemptAt: next + value, countsAsAttempt: r.countsAsAttempt, shrink: r.shrink, receipt: r.receipt)
    }

    func toLocal(_ claim: Claim) -> Claim {
        let d = value
        guard d != 0 else { return claim }
        let jobs = claim.jobs.map { j in
            var moved = DeliveryJob(
                deliveryID: j.deliveryID, messageID: j.messageID, app: j.app, deviceID: j.deviceID, user: j.user,
                platform: j.platform, environment: j.environment, token: j.token, keys: j.keys, tokenHash: j.tokenHash,
                registeredAt: j.registeredAt, message: j.message, acceptedAt: j.acceptedAt - d,
                expiresAt: j.expiresAt == .max ? .max : j.expiresAt - d, previousAttempts: j.previousAttempts,
                bundleID: j.bundleID, serverKey: j.serverKey)
            moved.silent = j.silent
            return moved
        }
        var moved = Claim(
            jobs: jobs, finished: claim.finished, batchSizes: claim.batchSizes,
            nextDueAt: claim.nextDueAt.map { $0 - d })
        moved.unreadable = claim.unreadable
        moved.earlyResults = claim.earlyResults
        return moved
    }
}

/// This instance's row in `instances` and the session advisory lock that
/// says it lives: held by the listener's connection, so that it goes with
/// the process (its sessions close) and the others take its work at once.
struct InstanceIdentity: Sendable {
    let name: String
    let version: String
    let host = ProcessInfo.processInfo.hostName
    let pid = Int64(ProcessInfo.processInfo.processIdentifier)
    var lockKey: Int64 { PostgresRegistry.lockKey("instance", name) }

    /// Instances silent longer than this, whose lock is free, are gone.
    static let silenceMs: Int64 = 2000

    /// Takes the identity lock, or throws ``InstanceInUse`` naming the live
    /// instance that holds it; then records this instance's row.
    func claim(_ c: PostgresConnection) throws {
        guard try c.execute("SELECT pg_try_advisory_lock($1)", [.int(lockKey)]).first?.bool(0) == true else {
            let other = try? c.execute(
                "SELECT host, pid, to_timestamp(started_at / 1000.0)::text FROM instances WHERE instance_id = $1",
                [.text(name)]
            ).first
            let who =
                (try? other.map { "host \(try $0.text(0)), pid \(try $0.int64(1)), started \(try $0.text(2))" })
                ?? nil
            throw InstanceInUse(
                description:
                    "instance_id \(name) is in use by another live instance (\(who ?? "its row not yet written")); "
                    + "give each Herald on this database its own [server] instance_id")
        }
        try c.execute(
            """
            INSERT INTO instances (instance_id, lock_key, host, pid, version, started_at, heartbeat_at)
            VALUES ($1, $2, $3, $4, $5, \(PostgresQueue.databaseNow), \(PostgresQueue.databaseNow))
            ON CONFLICT (instance_id) DO UPDATE SET lock_key = excluded.lock_key, host = excluded.host,
                pid = excluded.pid, version = excluded.version, started_at = excluded.started_at,
                heartbeat_at = excluded.heartbeat_at, lanes = '{}'
            """, [.text(name), .int(lockKey), .text(host), .int(pid), .text(version)])
    }

    /// Beats the heartbeat and publishes `lanes`.
    func beat(_ c: PostgresConnection, lanes: Set<String>) throws {
        try c.execute(
            """
            UPDATE instances SET heartbeat_at = \(PostgresQueue.databaseNow), lanes = $2::text[]
            WHERE instance_id = $1
            """, [.text(name), .text(PostgresQueue.textArray(lanes.sorted()))])
    }

    /// The other instances: those gone (lock free and silent) and the lanes of the live ones.
    func others(_ c: PostgresConnection) throws -> (gone: [String], lanes: Set<String>) {
        var gone: [String] = []
        var lanes = Set<String>()
        for r in try c.execute(
            """
            SELECT i.instance_id, array_to_string(i.lanes, chr(30)), \(PostgresQueue.instanceAlive),
                i.heartbeat_at < \(PostgresQueue.databaseNow) - $2
            FROM instances i WHERE i.instance_id <> $1
            """, [.text(name), .int(Self.silenceMs)]
        ).rows {
            let alive = try r.bool(2)
            if alive {
                for lane in try r.text(1).split(separator: "\u{1E}") { lanes.insert(String(lane)) }
            } else if try r.bool(3) {
                gone.append(try r.text(0))
            }
        }
        return (gone, lanes)
    }
}

/// The thread that keeps this instance's identity and leases and hears the
/// others' notifications, on a connection of its own (a pool connection is
/// busy with batches; a listener must keep reading its socket). Its timers
/// run on the monotonic clock; the times it writes are the database's.
private final class Listener: Sendable {
    private let identity: InstanceIdentity
    private let queue: PostgresQueue
    private let held: HeldDeliveries
    private let renewEveryMs: Int64

    /// What the listener's thread and the store share.
    private struct State {
        var stopping = false
        var stopped = true
        /// The first LISTEN was answered (or failed).
        var settled = false
        var lanes: Set<String> = []
        var lanesChanged = true
        var identityLost: String?
    }

    private let state = Locked(State())

    /// How often the heartbeat beats and the others' state is read.
    static let beatMs: Int64 = 1000
    /// How often the live partition's dead rows are looked at (and it is vacuumed past its bound).
    static let vacuumMs: Int64 = 1000

    init(identity: InstanceIdentity, queue: PostgresQueue, held: HeldDeliveries, renewEveryMs: Int64) {
        self.identity = identity
        self.queue = queue
        self.held = held
        self.renewEveryMs = renewEveryMs
    }

    func publish(lanes: Set<String>) {
        state.withLock {
            $0.lanes = lanes
            $0.lanesChanged = true
        }
    }

    /// Why this instance's identity is not its own any more, if so.
    var identityProblem: String? { state.withLock { $0.identityLost } }

    /// Starts the thread, which owns `connection` from then on, and returns
    /// once it listens (or its first attempt failed): work another instance
    /// queues after the store opened wakes this one.
    func start(connection: sending PostgresConnection, onWork: @escaping @Sendable () -> Void) {
        state.withLock { $0.stopped = false }
        startOwnerThread(named: "herald-pg-listen") { [self] in run(connection, onWork: onWork) }
        state.withLock(when: { $0.settled }) { _ in }
    }

    private func settle() {
        state.withLock { $0.settled = true }
        state.broadcast()
    }

    func stop() {
        state.withLock { $0.stopping = true }
        state.withLock(when: { $0.stopped }) { _ in }
    }

    private var isStopping: Bool { state.withLock { $0.stopping } }

    private static var monotonicMs: Int64 { Int64(CallDeadlines.now / 1_000_000) }

    private func run(_ c: PostgresConnection, onWork: @escaping @Sendable () -> Void) {
        var reconnects = c.reconnects
        var nextRenewal: Int64 = 0
        var nextBeat: Int64 = 0
        var nextVacuum: Int64 = 0
        var listening = false
        while !isStopping {
            do {
                if !listening {
                    // Once: the connection listens again by itself after a reconnect.
                    defer { settle() }
                    try c.listen(PostgresQueue.channel)
                    listening = true
                }
                if c.reconnects != reconnects {
                    // The session ended: its identity lock went with it. Take
                    // it again (another instance of this name may have it now).
                    reconnects = c.reconnects
                    do {
                        try identity.claim(c)
                        state.withLock {
                            $0.identityLost = nil
                            $0.lanesChanged = true
                        }
                    } catch let error as InstanceInUse {
                        state.withLock { $0.identityLost = error.description }
                    }
                    // Notifications sent while the connection was down are
                    // lost: the scheduler claims again to find their work.
                    onWork()
                }
                let mono = Self.monotonicMs
                if mono >= nextRenewal {
                    // A renewal that failed (the database away, a row moved
                    // meanwhile) is tried again at the next turn.
                    _ = try PostgresStore.retryingMoves {
                        try queue.renewLeases(c, held: held.all, now: try PostgresStore.databaseNow(c) + queue.shift())
                    }
                    nextRenewal = mono + renewEveryMs
                }
                let (publish, changed) = state.withLock { ($0.lanes, $0.lanesChanged) }
                if mono >= nextBeat || changed {
                    // Every second, and at once when the lanes changed.
                    nextBeat = mono + Self.beatMs
                    try identity.beat(c, lanes: publish)
                    if changed { state.withLock { $0.lanesChanged = false } }
                    let others = try identity.others(c)
                    queue.setOthersLanes(others.lanes)
                    // Work nobody holds: a gone instance's, leases run out or too old.
                    let now = try PostgresStore.databaseNow(c) + queue.shift()
                    if try queue.rescue(c, now: now, gone: others.gone) > 0 { onWork() }
                }
                if mono >= nextVacuum {
                    nextVacuum = mono + Self.vacuumMs
                    _ = try queue.vacuumLive(c)
                }
                let wait = max(10, min(250, min(nextRenewal, nextBeat) - Self.monotonicMs))
                let heard = try c.notifications(within: .milliseconds(wait))
                if heard.contains(where: { $0.payload != queue.instance }) { onWork() }
            } catch {
                // The database is away: the connection backs off; try again shortly.
                state.withLock(when: { $0.stopping }, timeout: .milliseconds(200)) { _ in }
            }
        }
        c.close()
        state.withLock { $0.stopped = true }
        state.broadcast()
    }
}
