internal import CHeraldSys
import Foundation
public import HeraldCore
import HeraldCrypto
import Postgres

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
/// A listener thread of its own connection renews this instance's leases
/// and hears the other instances' `NOTIFY` (work queued, leases expired).
/// Completions run on the store's threads; they must hand work elsewhere quickly.
// @unchecked: the job queue, fences and counts are guarded by `condition`; connections belong to pool threads.
public final class PostgresStore: DeliveryStore, @unchecked Sendable {
    private typealias Job = any QueuedCall<PostgresConnection>

    // Guarded by `condition`.
    private let condition = NSCondition()
    private var queue: [Job] = []
    /// Fences of the batches running now: a job of such a key waits.
    private var busy: [String: Int] = [:]
    private var running = 0
    private var stopping = false
    private var observer: (@Sendable () -> Void)?

    private let pool: PostgresPool
    private let queueTables: PostgresQueue
    private let registry: PostgresRegistry
    private let clock: any WallClock
    private let options: PostgresStoreOptions
    private let listener: Listener

    /// The most jobs one transaction takes, to bound commit latency.
    static let maxBatch = 512
    /// The most jobs that may wait for a connection: past it a call fails at
    /// once (the database is slow or away) rather than queue without bound.
    static let queueLimit = 16_384
    /// Runs of one job after it lost a race with another instance.
    static let maxRetries = 5

    public let keyOutcome: StoreKeyOutcome
    public private(set) var recoveredDeliveries = 0

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
        queueTables = PostgresQueue(key: key, instance: instance, leaseMs: leaseMs)
        registry = PostgresRegistry(key: key)
        let now = clock.nowMilliseconds()
        let (tables, registry) = (queueTables, registry)
        recoveredDeliveries = try setup.transaction { c in
            try registry.expireTombstones(c, now: now)
            let own = try tables.recoverOwn(c, now: now)
            _ = try tables.requeueExpired(c, now: now)
            return own
        }
        pool = PostgresPool(
            configuration: options.connection, size: options.poolSize, queueLimit: Self.queueLimit,
            threadName: "herald-pg")
        listener = Listener(
            configuration: options.connection, queue: queueTables, clock: clock, renewEvery: max(1, leaseMs / 3))
        listener.start { [weak self] in self?.workArrived() }
    }

    deinit {
        listener.stop()
    }

    public func close() {
        condition.lock()
        stopping = true
        while running > 0 || !queue.isEmpty { condition.wait() }
        condition.unlock()
        listener.stop()
        pool.close()
    }

    public var isShared: Bool { true }

    public func setWorkObserver(_ observer: @escaping @Sendable () -> Void) {
        condition.lock()
        self.observer = observer
        condition.unlock()
    }

    private func workArrived() {
        condition.lock()
        let observer = self.observer
        condition.unlock()
        observer?()
    }

    // MARK: Jobs

    private func submit<T>(
        durable: Bool = true, fence: String? = nil, _ work: @escaping @Sendable (PostgresConnection, Int64) throws -> T,
        _ completion: @escaping @Sendable (Result<T, any Error>) -> Void
    ) {
        let job: Job = StoreCall(work: work, completion: completion, durable: durable, fence: fence)
        condition.lock()
        if stopping {
            condition.unlock()
            completion(.failure(PostgresError(.closed, "store is closed")))
            return
        }
        if queue.count >= Self.queueLimit {
            condition.unlock()
            completion(
                .failure(PostgresError(.queueFull, "the store's job queue is full (\(Self.queueLimit) jobs waiting)")))
            return
        }
        queue.append(job)
        dispatch()
        condition.unlock()
    }

    /// Starts batches while connections are free (`condition` held). A job
    /// waits while a running batch holds its fence, and so does every later
    /// job of that fence, so that writes of one key run in order.
    private func dispatch() {
        while running < pool.size && !queue.isEmpty {
            var batch: [Job] = []
            var rest: [Job] = []
            var blocked = Set<String>()
            for job in queue {
                if batch.count < Self.maxBatch,
                    job.fence.map({ busy[$0] == nil && !blocked.contains($0) }) ?? true
                {
                    batch.append(job)
                } else {
                    if let fence = job.fence { blocked.insert(fence) }
                    rest.append(job)
                }
            }
            guard !batch.isEmpty else { return }
            queue = rest
            running += 1
            for case let fence? in batch.map(\.fence) { busy[fence, default: 0] += 1 }
            let taken = batch
            pool.submit({ [self] c in commit(taken, c) }) { [self] result in
                if case .failure(let error) = result {
                    // The pool refused the batch (closing): nothing ran.
                    finished(taken, failure: error, outcomes: [])
                }
            }
        }
    }

    /// Runs a batch in one transaction on a pool thread, then completes its jobs.
    private func commit(_ batch: [Job], _ c: PostgresConnection) {
        let now = clock.nowMilliseconds()
        do {
            do {
                try c.begin()
            } catch let error where error.isConnectionFailure {
                // A connection the server dropped (a restart) is found dead only
                // when used: nothing of the batch ran, so open a new one and begin again.
                try c.begin()
            }
            if !batch.contains(where: \.durable) {
                // Claims, results and reads: a crash may lose them, costing a
                // repeat; the next durable commit makes them durable with it.
                try c.executeScript("SET LOCAL synchronous_commit = off")
            }
        } catch {
            try? c.rollback()
            finished(batch, failure: error, outcomes: [])
            return
        }
        var outcomes: [CallOutcome] = []
        outcomes.reserveCapacity(batch.count)
        var lost: (any Error)?
        for job in batch where lost == nil {
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
                    try c.executeScript("RELEASE job")
                    outcomes.append(outcome)
                    break
                } catch {
                    if let pg = error as? PostgresError, pg.isConnectionFailure {
                        lost = error
                        break
                    }
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

    /// Whether a job failed because another transaction won a race, so that
    /// running it again sees the winner's row.
    static func isRace(_ error: any Error) -> Bool {
        guard let state = (error as? PostgresError)?.sqlState else { return false }
        return state == .uniqueViolation || state == .deadlockDetected || state == .serializationFailure
    }

    /// Releases the batch's fences and connection, then answers its calls:
    /// every one with `failure` when the batch did not commit.
    private func finished(_ batch: [Job], failure: (any Error)?, outcomes: [CallOutcome]) {
        condition.lock()
        running -= 1
        for case let fence? in batch.map(\.fence) {
            let left = (busy[fence] ?? 1) - 1
            busy[fence] = left > 0 ? left : nil
        }
        if !stopping || !queue.isEmpty { dispatch() }
        condition.broadcast()
        condition.unlock()
        if let failure {
            for job in batch { job.fail(failure) }
        } else {
            for outcome in outcomes { outcome.answer(nil) }
        }
    }

    // MARK: Registry

    public func register(
        _ registration: Registration, deviceCap: Int,
        completion: @escaping @Sendable (Result<RegistrationOutcome, any Error>) -> Void
    ) {
        submit(
            fence: SQLiteStore.userFence(app: registration.app, user: registration.user),
            { [registry] c, now in try registry.register(c, registration, deviceCap: deviceCap, now: now) }, completion)
    }

    public func unregister(
        app: String, user: String, _ selector: UnregisterSelector,
        completion: @escaping @Sendable (Result<Int, any Error>) -> Void
    ) {
        submit(
            fence: SQLiteStore.userFence(app: app, user: user),
            { [registry] c, now in try registry.unregister(c, app: app, user: user, selector, now: now) }, completion)
    }

    public func list(
        app: String, user: String, completion: @escaping @Sendable (Result<[DeviceSummary], any Error>) -> Void
    ) {
        submit(
            durable: false, fence: SQLiteStore.userFence(app: app, user: user),
            { [registry] c, _ in try registry.list(c, app: app, user: user) }, completion)
    }

    public func endSession(
        app: String, user: String, session: String, completion: @escaping @Sendable (Result<Int, any Error>) -> Void
    ) {
        submit(
            fence: SQLiteStore.userFence(app: app, user: user),
            { [registry] c, _ in try registry.endSession(c, app: app, user: user, session: session) }, completion)
    }

    public func forget(app: String, user: String, completion: @escaping @Sendable (Result<Int, any Error>) -> Void) {
        submit(
            fence: SQLiteStore.userFence(app: app, user: user),
            { [registry] c, _ in try registry.forget(c, app: app, user: user) }, completion)
    }

    public func deviceCounts(completion: @escaping @Sendable (Result<[Platform: Int], any Error>) -> Void) {
        submit(durable: false, { [registry] c, _ in try registry.deviceCounts(c) }, completion)
    }

    public func deviceCountsByApp(
        completion: @escaping @Sendable (Result<[String: [Platform: Int]], any Error>) -> Void
    ) {
        submit(durable: false, { [registry] c, _ in try registry.deviceCountsByApp(c) }, completion)
    }

    public func webSubscriptionsByKey(
        completion: @escaping @Sendable (Result<[ServerKeyCount], any Error>) -> Void
    ) {
        submit(durable: false, { [registry] c, _ in try registry.webSubscriptionsByKey(c) }, completion)
    }

    public func recordServerKey(
        app: String, key: String, completion: @escaping @Sendable (Result<Int, any Error>) -> Void
    ) {
        submit({ [registry] c, _ in try registry.recordServerKey(c, app: app, key: key) }, completion)
    }

    public func updateDevice(
        app: String, user: String, deviceID: String, name: String?, enabled: Bool?,
        completion: @escaping @Sendable (Result<DeviceSummary?, any Error>) -> Void
    ) {
        submit(
            fence: SQLiteStore.userFence(app: app, user: user),
            { [registry] c, _ in
                try registry.updateDevice(c, app: app, user: user, deviceID: deviceID, name: name, enabled: enabled)
            }, completion)
    }

    public func deviceOwner(
        app: String, deviceID: String, completion: @escaping @Sendable (Result<String?, any Error>) -> Void
    ) {
        submit(
            durable: false, { [registry] c, _ in try registry.deviceOwner(c, app: app, deviceID: deviceID) }, completion
        )
    }

    // MARK: Delivery queue

    public func enqueue(_ e: Enqueue, completion: @escaping @Sendable (Result<Enqueued, any Error>) -> Void) {
        submit({ [queueTables] c, now in try queueTables.enqueue(c, e, now: now, handoff: [:]).accepted }, completion)
    }

    /// Hands the deliveries over at the commit only: `early` is never called
    /// (a batch that lost a race runs again, and its first run's early sends
    /// would be a second message).
    public func enqueue(
        _ e: Enqueue, handoff: [QueueLane: Int], limit: Int, early: (@Sendable (Claim) -> Void)?,
        completion: @escaping @Sendable (Result<(accepted: Enqueued, claim: Claim), any Error>) -> Void
    ) {
        submit(
            { [queueTables] c, now in try queueTables.enqueue(c, e, now: now, handoff: handoff, handoffLimit: limit) },
            completion)
    }

    public func status(
        app: String, messageID: String, detail: Bool,
        completion: @escaping @Sendable (Result<MessageStatus?, any Error>) -> Void
    ) {
        submit(
            durable: false, fence: SQLiteStore.messageFence(messageID),
            { [queueTables] c, _ in try queueTables.status(c, app: app, messageID: messageID, detail: detail) },
            completion)
    }

    public func cancel(
        app: String, messageID: String, completion: @escaping @Sendable (Result<Int?, any Error>) -> Void
    ) {
        submit(
            fence: SQLiteStore.messageFence(messageID),
            { [queueTables] c, now in try queueTables.cancel(c, app: app, messageID: messageID, now: now) }, completion)
    }

    public func claimDue(
        lanes: [QueueLane: Int], others: Int, completion: @escaping @Sendable (Result<Claim, any Error>) -> Void
    ) {
        submit(
            durable: false,
            { [queueTables] c, now in try queueTables.claimDue(c, lanes: lanes, others: others, now: now) },
            completion)
    }

    public func record(
        deliveryID: Int64, state: DeliveryState, httpStatus: Int?, reason: String?, nextAttemptAt: Int64?,
        completion: @escaping @Sendable (Result<Void, any Error>) -> Void
    ) {
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
                            reason: reason, nextAttemptAt: nextAttemptAt)
                    ], now: now)
            }, completion)
    }

    public func record(_ records: [DeliveryRecord], completion: @escaping @Sendable (Result<Void, any Error>) -> Void) {
        submit(durable: false, { [queueTables] c, now in try queueTables.record(c, records, now: now) }, completion)
    }

    public func releaseCredentialWaits(
        lanes: [QueueLane], completion: @escaping @Sendable (Result<Int, any Error>) -> Void
    ) {
        submit(
            { [queueTables] c, now in try queueTables.releaseCredentialWaits(c, lanes: lanes, now: now) }, completion)
    }

    public func removeStale(
        deliveryID: Int64, deviceID: String, tokenHash: String, httpStatus: Int?, reason: String, windowCap: Int,
        completion: @escaping @Sendable (Result<StaleRemoval, any Error>) -> Void
    ) {
        submit(
            durable: false,
            { [queueTables] c, now in
                try queueTables.removeStale(
                    c, deliveryID: deliveryID, deviceID: deviceID, tokenHash: tokenHash, httpStatus: httpStatus,
                    reason: reason, windowCap: windowCap, now: now)
            }, completion)
    }

    public func purgeMessages(
        olderThan retention: Duration, completion: @escaping @Sendable (Result<Int, any Error>) -> Void
    ) {
        let ms = retention.components.seconds * 1000
        submit(
            durable: false, { [queueTables] c, now in try queueTables.purge(c, before: now - ms, now: now) }, completion
        )
    }

    public func queueDepth(completion: @escaping @Sendable (Result<QueueDepth, any Error>) -> Void) {
        submit(durable: false, { [queueTables] c, _ in try queueTables.depth(c) }, completion)
    }

    public func queueDepthByApp(completion: @escaping @Sendable (Result<[String: QueueDepth], any Error>) -> Void) {
        submit(durable: false, { [queueTables] c, _ in try queueTables.depthByApp(c) }, completion)
    }

    public func ping(completion: @escaping @Sendable (Result<Void, any Error>) -> Void) {
        submit(durable: false, { c, _ in _ = try c.execute("SELECT 1") }, completion)
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

/// The thread that renews this instance's leases and hears the others'
/// notifications, on a connection of its own (a pool connection is busy
/// with batches; a listener must keep reading its socket).
// @unchecked: its flags are guarded by `condition`; its connection belongs to its own thread.
private final class Listener: @unchecked Sendable {
    private let configuration: PostgresConfiguration
    private let queue: PostgresQueue
    private let clock: any WallClock
    private let renewEveryMs: Int64
    private let condition = NSCondition()
    private var stopping = false
    private var stopped = true
    private var thread: Thread?

    init(configuration: PostgresConfiguration, queue: PostgresQueue, clock: any WallClock, renewEvery: Int64) {
        self.configuration = configuration
        self.queue = queue
        self.clock = clock
        self.renewEveryMs = renewEvery
    }

    /// Starts the thread and returns once it listens (or its first attempt
    /// failed): work another instance queues after the store opened wakes this one.
    func start(onWork: @escaping @Sendable () -> Void) {
        condition.lock()
        stopped = false
        condition.unlock()
        let thread = Thread { [self] in
            _ = hs_set_thread_name("herald-pg-listen")
            run(onWork: onWork)
        }
        thread.name = "herald-pg-listen"
        self.thread = thread
        thread.start()
        condition.lock()
        while !settled { condition.wait() }
        condition.unlock()
    }

    /// The first LISTEN was answered (or failed).
    private var settled = false

    private func settle() {
        condition.lock()
        settled = true
        condition.broadcast()
        condition.unlock()
    }

    func stop() {
        condition.lock()
        stopping = true
        while !stopped { condition.wait() }
        condition.unlock()
    }

    private var isStopping: Bool {
        condition.lock()
        defer { condition.unlock() }
        return stopping
    }

    private func run(onWork: @escaping @Sendable () -> Void) {
        let c = PostgresConnection(configuration: configuration)
        var reconnects = -1
        var nextRenewal: Int64 = 0
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
                    // Notifications sent while the connection was down are
                    // lost: the scheduler claims again to find their work.
                    if reconnects >= 0 { onWork() }
                    reconnects = c.reconnects
                }
                let now = clock.nowMilliseconds()
                if now >= nextRenewal {
                    _ = try queue.renewLeases(c, now: now)
                    nextRenewal = now + renewEveryMs
                }
                let wait = max(10, min(250, nextRenewal - clock.nowMilliseconds()))
                let heard = try c.notifications(within: .milliseconds(wait))
                if heard.contains(where: { $0.payload != queue.instance }) { onWork() }
            } catch {
                // The database is away: the connection backs off; try again shortly.
                condition.lock()
                if !stopping { _ = condition.wait(until: Date().addingTimeInterval(0.2)) }
                condition.unlock()
            }
        }
        c.close()
        condition.lock()
        stopped = true
        thread = nil
        condition.broadcast()
        condition.unlock()
    }
}
