import Foundation
import HeraldCore
import HeraldCrypto
import HeraldIO
import HeraldStore
import HeraldStoreTestSupport
import HeraldTestSupport
import Postgres
import Testing

/// Two instances on one PostgreSQL database, each with its own store (pool,
/// listener, instance name), as two hosts' daemons would be.
private struct TwoInstances {
    let scratch: StoreScratch
    let key: StoreKey
    let clock = ManualClock()
    var a: any DeliveryStore
    var b: any DeliveryStore

    init(lease: Duration = .seconds(30)) throws {
        scratch = try StoreScratch(.postgres, prefix: "herald-shared", lease: lease)
        key = try StoreKey.generate()
        a = try scratch.open(key: key, clock: clock, instance: "host-a")
        b = try scratch.open(key: key, clock: clock, instance: "host-b")
    }

    func close() {
        a.close()
        b.close()
        scratch.remove()
    }

    /// The instances (alive: their identity lock held) and the deliveries in flight, for a failure's message.
    func diagnosis() throws -> String {
        let c = PostgresConnection(configuration: try #require(scratch.postgres).connection)
        defer { c.close() }
        try c.connect()
        let instances = try c.execute(
            """
            SELECT i.instance_id, i.heartbeat_at, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint,
                EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
                    AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                    AND l.classid::bigint = ((i.lock_key >> 32) & 4294967295)
                    AND l.objid::bigint = (i.lock_key & 4294967295))::text
            FROM instances i ORDER BY 1
            """
        ).rows.map { r in "\(try r.text(0)) beat \(try r.int64(2) - r.int64(1)) ms ago alive \(try r.text(3))" }
        let rows = try c.execute(
            "SELECT state, coalesce(sent_by, '-'), coalesce(reason, '-'), count(*) FROM deliveries GROUP BY 1, 2, 3"
        ).rows.map { r in "\(try r.text(0))/\(try r.text(1))/\(try r.text(2)): \(try r.int64(3))" }
        return "instances: \(instances); deliveries: \(rows)"
    }

    func register(_ s: any DeliveryStore, _ r: Registration) throws -> RegistrationOutcome {
        try s.sync { s, done in s.register(r, deviceCap: 1000, completion: done) }
    }

    func enqueue(_ s: any DeliveryStore, _ e: Enqueue) throws -> Enqueued {
        try s.sync { s, done in s.enqueue(e, completion: done) }
    }

    func claim(_ s: any DeliveryStore, _ limit: Int = 1000) throws -> Claim {
        try s.sync { s, done in s.claimDue(limit: limit, completion: done) }
    }

    func status(_ s: any DeliveryStore, _ id: String) throws -> MessageStatus {
        try #require(try s.sync { s, done in s.status(app: "default", messageID: id, detail: true, completion: done) })
    }

    /// `n` FCM devices of one user, registered through `s`.
    func devices(_ s: any DeliveryStore, user: String, _ n: Int) throws {
        for i in 0..<n {
            _ = try register(
                s, Registration(app: "default", user: user, platform: .fcm, environment: nil, token: "t-\(user)-\(i)"))
        }
    }

    /// Runs both bodies at once on two threads and returns both results.
    func concurrently<T: Sendable>(
        _ first: @escaping @Sendable () throws -> T, _ second: @escaping @Sendable () throws -> T
    )
        throws -> (T, T)
    {
        let results = ResultPair<T>()
        let group = DispatchGroup()
        DispatchQueue.global().async(group: group) { results.set(0, Result { try first() }) }
        DispatchQueue.global().async(group: group) { results.set(1, Result { try second() }) }
        group.wait()
        return (try results.get(0), try results.get(1))
    }
}

private final class ResultPair<T: Sendable>: @unchecked Sendable {
    private let lock = NSLock()
    private var values: [Int: Result<T, any Error>] = [:]
    func set(_ i: Int, _ r: Result<T, any Error>) { lock.withLock { values[i] = r } }
    func get(_ i: Int) throws -> T { try lock.withLock { values[i]! }.get() }
}

private final class Flag: @unchecked Sendable {
    private let condition = NSCondition()
    private var raised = 0
    func raise() {
        condition.lock()
        raised += 1
        condition.broadcast()
        condition.unlock()
    }
    /// Whether it was raised within `seconds`.
    func wait(seconds: Double) -> Bool {
        condition.lock()
        defer { condition.unlock() }
        let deadline = Date().addingTimeInterval(seconds)
        while raised == 0 { if !condition.wait(until: deadline) { return raised > 0 } }
        return true
    }
}

private func fcmSend(_ user: String, key: String? = nil, collapse: String? = nil) -> Enqueue {
    var message = PushMessage(kind: .notification)
    message.collapseKey = collapse
    return Enqueue(app: "default", message: message, recipients: .users([user]), idempotencyKey: key, disabled: [:])
}

@Suite("Several instances on one PostgreSQL database")
struct SharedStoreTests {
    @Test("a device registered through one instance is sent through the other; claims never overlap")
    func sharedRegistryAndDisjointClaims() throws {
        let t = try TwoInstances()
        defer { t.close() }
        try t.devices(t.a, user: "ann", 300)
        let accepted = try t.enqueue(t.b, fcmSend("ann"))
        #expect(accepted.devices == 300)
        let (ca, cb) = try t.concurrently({ try t.claim(t.a, 200) }, { try t.claim(t.b, 200) })
        let ida = Set(ca.jobs.map(\.deliveryID))
        let idb = Set(cb.jobs.map(\.deliveryID))
        #expect(ida.isDisjoint(with: idb))
        #expect(ida.count + idb.count == 300)
        let status = try t.status(t.a, accepted.messageID)
        let senders = Dictionary(grouping: status.devices ?? [], by: { $0.sentBy ?? "" }).mapValues(\.count)
        #expect(senders["host-a"] == ida.count && senders["host-b"] == idb.count)
        // A result recorded by the instance that does not hold the lease changes nothing.
        let foreign = try #require(cb.jobs.first)
        try t.a.sync { s, done in
            s.record(
                [
                    DeliveryRecord(
                        deliveryID: foreign.deliveryID, deviceID: foreign.deviceID, state: .delivered, httpStatus: 200,
                        reason: nil, nextAttemptAt: nil)
                ], completion: done)
        }
        #expect(try t.status(t.a, accepted.messageID).counts[.delivered] == nil)
        try t.b.sync { s, done in
            s.record(
                [
                    DeliveryRecord(
                        deliveryID: foreign.deliveryID, deviceID: foreign.deviceID, state: .delivered, httpStatus: 200,
                        reason: nil, nextAttemptAt: nil)
                ], completion: done)
        }
        #expect(try t.status(t.a, accepted.messageID).counts[.delivered] == 1)
    }

    @Test(
        "a killed instance's work is taken over within seconds whatever the lease; a graceful stop hands it back at once"
    )
    func deadInstanceTakenOver() throws {
        var t = try TwoInstances(lease: .seconds(30))
        defer { t.close() }
        try t.devices(t.a, user: "bob", 10)
        let m = try t.enqueue(t.a, fcmSend("bob"))
        let held = try t.claim(t.a)
        #expect(held.jobs.count == 10)
        #expect(try t.claim(t.b).jobs.isEmpty, "a live instance's leases are its own")
        // host-a is killed holding them: its sessions end, and its identity lock with them.
        (t.a as? PostgresStore)?.abandon()
        let deadline = Date().addingTimeInterval(20)
        var taken: [DeliveryJob] = []
        while taken.count < 10 && Date() < deadline {
            taken += try t.claim(t.b).jobs
            if taken.count < 10 { Thread.sleep(forTimeInterval: 0.2) }
        }
        let why = (try? t.diagnosis()) ?? "no diagnosis"
        #expect(
            Set(taken.map(\.deliveryID)) == Set(held.jobs.map(\.deliveryID)), "far sooner than the 30 s lease; \(why)")
        #expect(taken.allSatisfy { $0.previousAttempts == 1 })
        let status = try t.status(t.b, m.messageID)
        #expect(status.devices?.allSatisfy { $0.sentBy == "host-b" && $0.attempts == 2 } == true)

        // host-b stops gracefully while they are in flight: they are handed
        // back at once, due now, for any instance (no lease to wait out).
        t.b.close()
        t.a = try t.scratch.open(key: t.key, clock: t.clock, instance: "host-a")
        #expect(t.a.recoveredDeliveries == 0)
        #expect(try t.claim(t.a).jobs.count == 10)
        t.b = try t.scratch.open(key: t.key, clock: t.clock, instance: "host-b")
        #expect(t.b.recoveredDeliveries == 0)
    }

    @Test("a delivery in flight that its live instance does not hold is taken back once its lease runs out")
    func strandedWhileOwnerLives() throws {
        let t = try TwoInstances(lease: .seconds(5))
        defer { t.close() }
        try t.devices(t.a, user: "cy", 4)
        _ = try t.enqueue(t.a, fcmSend("cy"))
        let held = try t.claim(t.a)
        #expect(held.jobs.count == 4)
        // host-a's scheduler gives two up (a lost result): it no longer renews them.
        let lost = held.jobs.prefix(2).map(\.deliveryID)
        t.a.forget(deliveryIDs: lost)
        #expect(try t.claim(t.b).jobs.isEmpty)
        // Past the lease (host-a lives and renews the two it holds), host-b takes the lost two only.
        t.clock.advance(3000)
        Thread.sleep(forTimeInterval: 2.5)  // a renewal of the two it holds
        t.clock.advance(3000)
        let taken = try t.claim(t.b)
        #expect(Set(taken.jobs.map(\.deliveryID)) == Set(lost))
    }

    @Test(
        "one housekeeper: purging waits for no one and skips while another instance holds the lock; it purges in chunks"
    )
    func oneHousekeeper() throws {
        let t = try TwoInstances()
        defer { t.close() }
        try t.devices(t.a, user: "old", 1)
        // 620 finished messages, more than one chunk of 500.
        for _ in 0..<620 {
            let m = try t.enqueue(t.a, fcmSend("old"))
            let job = try #require(try t.claim(t.a).jobs.first { $0.messageID == m.messageID })
            try t.a.sync { s, done in
                s.record(
                    [
                        DeliveryRecord(
                            deliveryID: job.deliveryID, deviceID: job.deviceID, state: .delivered, httpStatus: 200,
                            reason: nil, nextAttemptAt: nil)
                    ], completion: done)
            }
        }
        t.clock.advance(8 * 24 * 3_600_000)
        let retention = Duration.seconds(7 * 24 * 3600)
        // Another instance is the housekeeper (it holds the lock): this one purges nothing and does not wait.
        let other = PostgresConnection(configuration: try #require(t.scratch.postgres).connection)
        defer { other.close() }
        try other.connect()
        try other.execute("SELECT pg_advisory_lock($1)", [.int(PostgresStore.housekeeperLockKey)])
        let started = Date()
        #expect(try t.b.sync { s, done in s.purgeMessages(olderThan: retention, completion: done) } == 0)
        #expect(Date().timeIntervalSince(started) < 4, "no wait on the housekeeper's lock")
        try other.execute("SELECT pg_advisory_unlock($1)", [.int(PostgresStore.housekeeperLockKey)])
        // Free: this one purges them all, chunk after chunk.
        #expect(try t.b.sync { s, done in s.purgeMessages(olderThan: retention, completion: done) } == 620)
        let left = try other.execute("SELECT count(*) FROM messages").first?.int64(0)
        #expect(left == 0)
    }

    @Test("queue depth is counted from the partial indexes of live work, not the history")
    func depthFromPartialIndexes() throws {
        let t = try TwoInstances()
        defer { t.close() }
        let c = PostgresConnection(configuration: try #require(t.scratch.postgres).connection)
        defer { c.close() }
        try c.connect()
        try c.executeScript("SET enable_seqscan = off")
        let plan = try c.execute(
            """
            EXPLAIN SELECT (SELECT count(*) FROM deliveries WHERE state IN ('queued', 'retrying')),
                (SELECT count(*) FROM deliveries WHERE state = 'in_flight')
            """
        ).rows.map { try $0.text(0) }.joined(separator: "\n")
        // Only the partial indexes of queued/retrying and in-flight rows, never the table or a full index.
        let partial = ["deliveries_due", "deliveries_next_due", "deliveries_pending_by_device", "deliveries_leased"]
        let indexScans = plan.split(separator: "\n").filter { $0.contains("Index") }
        #expect(!plan.contains("Seq Scan") && !indexScans.isEmpty, "\(plan)")
        for line in indexScans {
            #expect(partial.contains { line.contains($0 + " ") }, "\(line)")
        }
        #expect(plan.contains("deliveries_leased"), "\(plan)")
    }

    @Test("finished deliveries leave the queue's table: live work in deliveries_live, the history in deliveries_done")
    func historyLeavesTheQueueTable() throws {
        let t = try TwoInstances()
        defer { t.close() }
        try t.devices(t.a, user: "hy", 10)
        let m = try t.enqueue(t.b, fcmSend("hy"))
        let claimed = try t.claim(t.a)
        #expect(claimed.jobs.count == 10)
        let finished = claimed.jobs.prefix(6).map {
            DeliveryRecord(
                deliveryID: $0.deliveryID, deviceID: $0.deviceID, state: .delivered, httpStatus: 200, reason: nil,
                nextAttemptAt: nil)
        }
        try t.a.sync { s, done in s.record(finished, completion: done) }
        let c = PostgresConnection(configuration: try #require(t.scratch.postgres).connection)
        defer { c.close() }
        try c.connect()
        let placed = try c.execute(
            "SELECT tableoid::regclass::text, state, count(*) FROM deliveries GROUP BY 1, 2 ORDER BY 1, 2"
        ).rows.map { "\(try $0.text(0)) \(try $0.text(1)) \(try $0.int64(2))" }
        #expect(placed == ["deliveries_done delivered 6", "deliveries_live in_flight 4"])
        // The queue's own indexes are on the live partition only; the history keeps the full ones.
        let doneIndexes = try c.execute(
            "SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = 'deliveries_done'::regclass ORDER BY 1"
        ).rows.map { try $0.text(0) }
        #expect(doneIndexes == ["deliveries_done_by_message", "deliveries_done_by_user", "deliveries_done_pkey"])
        // Readers see both: the message's status counts all ten.
        let status = try t.status(t.b, m.messageID)
        #expect(status.counts[.delivered] == 6 && status.counts[.inFlight] == 4, "\(status.counts)")
        #expect(status.devices?.count == 10)
    }

    @Test(
        "the queue's table is vacuumed by an instance once its dead rows pass the bound, not after autovacuum's minute")
    func liveTableVacuumed() throws {
        let t = try TwoInstances()
        defer { t.close() }
        let c = PostgresConnection(configuration: try #require(t.scratch.postgres).connection)
        defer { c.close() }
        try c.connect()
        try c.executeScript("ALTER TABLE deliveries_live SET (autovacuum_enabled = false)")
        // 3,000 deliveries finished: each leaves a dead row in the live partition.
        try c.executeScript(
            """
            INSERT INTO messages VALUES ('m-many', 'default', NULL, 'p', 0, 9999999999999);
            INSERT INTO deliveries (message_id, app, device_id, user_name, platform, token_hash, state,
                                    next_attempt_at, updated_at)
            SELECT 'm-many', 'default', 'd' || i, 'u'::bytea, 'fcm', 'h', 'in_flight', 0, 0
            FROM generate_series(1, 3000) i;
            UPDATE deliveries SET state = 'delivered' WHERE message_id = 'm-many';
            """)
        let deadline = Date().addingTimeInterval(15)
        var vacuums: Int64 = 0
        while vacuums == 0 && Date() < deadline {
            Thread.sleep(forTimeInterval: 0.5)
            vacuums =
                try c.execute("SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = 'deliveries_live'::regclass")
                .first?.int64(0) ?? 0
        }
        #expect(vacuums > 0, "deliveries_live was not vacuumed within 15 s")
        #expect(try c.execute("SELECT count(*) FROM deliveries_done").first?.int64(0) == 3000)
    }

    @Test("a result whose row another transaction moved to the history while it waited is recorded on a second try")
    func resultAfterAConcurrentMove() throws {
        let t = try TwoInstances()
        defer { t.close() }
        try t.devices(t.a, user: "mo", 2)
        let m = try t.enqueue(t.a, fcmSend("mo"))
        let jobs = try t.claim(t.a).jobs
        #expect(jobs.count == 2)
        // Another session finishes the first delivery and holds its row while the results come.
        let other = PostgresConnection(configuration: try #require(t.scratch.postgres).connection)
        defer { other.close() }
        try other.connect()
        try other.begin()
        try other.execute(
            "UPDATE deliveries SET state = 'skipped', reason = 'cancelled' WHERE delivery_id = $1",
            [.int(jobs[0].deliveryID)])
        let answered = DispatchSemaphore(value: 0)
        let outcome = ResultBox()
        t.a.record(
            jobs.map {
                DeliveryRecord(
                    deliveryID: $0.deliveryID, deviceID: $0.deviceID, state: .delivered, httpStatus: 200,
                    reason: nil, nextAttemptAt: nil)
            }
        ) { result in
            outcome.set(result)
            answered.signal()
        }
        // The result statement waits for the row's lock; the move commits meanwhile.
        Thread.sleep(forTimeInterval: 0.4)
        try other.commit()
        #expect(answered.wait(timeout: .now() + 10) == .success)
        #expect(outcome.error == nil, "\(outcome.error.map { "\($0)" } ?? "")")
        let status = try t.status(t.a, m.messageID)
        #expect(status.counts[.skipped] == 1 && status.counts[.delivered] == 1, "\(status.counts)")
    }

    @Test(
        "a message with a collapse key is handed at the commit, not early; a job that lost its race hands each once"
    )
    func collapseRaceHandsOnce() throws {
        let t = try TwoInstances()
        defer { t.close() }
        try t.devices(t.a, user: "ra", 2)
        // Another instance's message for the second device (the one not handed) is
        // being queued with the same collapse key: its row is written, not yet committed.
        let other = PostgresConnection(configuration: try #require(t.scratch.postgres).connection)
        defer { other.close() }
        try other.connect()
        try other.begin()
        try other.executeScript(
            """
            INSERT INTO messages VALUES ('m-other', 'default', NULL, 'p', 0, 9999999999999);
            INSERT INTO deliveries (message_id, app, device_id, user_name, platform, token_hash, collapse_key, state,
                                    next_attempt_at, updated_at)
            SELECT 'm-other', app, device_id, user_name, platform, token_hash, 'c'::bytea, 'queued', 0, 0
            FROM devices ORDER BY registered_seq DESC LIMIT 1;
            """)
        // Room for one: the first device is handed, the second queued, and its row
        // waits for the other's; when that commits, the job loses the race and runs again.
        let early = Claims()
        let answered = DispatchSemaphore(value: 0)
        let outcome = EnqueueBox()
        let lane = QueueLane(app: "default", platform: .fcm)
        t.b.enqueue(
            fcmSend("ra", collapse: "c"), handoff: [lane: 1], limit: 1, early: { early.list.append($0) }
        ) { result in
            outcome.set(result)
            answered.signal()
        }
        Thread.sleep(forTimeInterval: 0.5)
        try other.commit()
        #expect(answered.wait(timeout: .now() + 10) == .success)
        let (accepted, claim) = try #require(outcome.result).get()
        #expect(early.list.isEmpty, "nothing early: the unique index could hold the insert up")
        let handed = try #require(claim.jobs.first)
        #expect(claim.jobs.count == 1, "handed once, at the commit")
        let status = try t.status(t.a, accepted.messageID)
        let rows = Dictionary(uniqueKeysWithValues: (status.devices ?? []).map { ($0.deviceID, $0) })
        #expect(rows[handed.deviceID]?.state == .inFlight && rows[handed.deviceID]?.sentBy == "host-b")
        let second = try #require(rows.keys.first { $0 != handed.deviceID })
        #expect(rows[second]?.state == .queued)
        let replaced = try t.status(t.a, "m-other").counts
        #expect(replaced[.superseded] == 1, "\(replaced)")
    }

    @Test("a session holding the queue's table: an enqueue fails before anything is handed early")
    func earlyWaitsForTheTable() throws {
        let t = try TwoInstances()
        defer { t.close() }
        try t.devices(t.a, user: "lk", 3)
        let other = PostgresConnection(configuration: try #require(t.scratch.postgres).connection)
        defer { other.close() }
        try other.connect()
        try other.begin()
        try other.executeScript("LOCK TABLE deliveries IN ACCESS EXCLUSIVE MODE")
        let early = Claims()
        let lane = QueueLane(app: "default", platform: .fcm)
        let result = Result {
            try t.b.sync { s, done in
                s.enqueue(
                    fcmSend("lk"), handoff: [lane: 3], limit: 3, early: { early.list.append($0) }, completion: done)
            }
        }
        try other.rollback()
        guard case .failure = result else {
            Issue.record("accepted while the table was held")
            return
        }
        #expect(early.list.isEmpty, "a caller told the store is unavailable was sent nothing")
        // Released: the same message is accepted and handed early.
        let handed = try t.b.sync { s, done in
            s.enqueue(fcmSend("lk"), handoff: [lane: 3], limit: 3, early: { early.list.append($0) }, completion: done)
        }
        #expect(early.list.flatMap(\.jobs).count == 3 && handed.claim.jobs.isEmpty)
    }

    @Test("a second live instance with an instance_id in use refuses to start, naming the other")
    func identityInUse() throws {
        let t = try TwoInstances(lease: .seconds(5))
        defer { t.close() }
        #expect {
            _ = try t.scratch.open(key: t.key, clock: t.clock, instance: "host-a")
        } throws: { error in
            let text = String(describing: error)
            return error is InstanceInUse && text.contains("host-a") && text.contains("pid")
        }
    }

    @Test("the same idempotency key sent through both instances at once yields one message")
    func idempotencyAcrossInstances() throws {
        let t = try TwoInstances()
        defer { t.close() }
        try t.devices(t.a, user: "cy", 50)
        for round in 0..<5 {
            let (x, y) = try t.concurrently(
                { try t.enqueue(t.a, fcmSend("cy", key: "k-\(round)")) },
                { try t.enqueue(t.b, fcmSend("cy", key: "k-\(round)")) })
            #expect(x.messageID == y.messageID)
            #expect(x.duplicate != y.duplicate)
        }
        #expect(try t.claim(t.a, 1000).jobs.count == 5 * 50)
    }

    @Test("coalescing holds across instances: one queued delivery per device and collapse key")
    func coalescingAcrossInstances() throws {
        let t = try TwoInstances()
        defer { t.close() }
        try t.devices(t.a, user: "dee", 40)
        for _ in 0..<5 {
            _ = try t.concurrently(
                { try t.enqueue(t.a, fcmSend("dee", collapse: "score")) },
                { try t.enqueue(t.b, fcmSend("dee", collapse: "score")) })
        }
        let claimed = try t.claim(t.a, 1000).jobs
        #expect(claimed.count == 40)
        #expect(Set(claimed.map(\.deviceID)).count == 40)
    }

    @Test("a rate bucket is shared: tokens taken through one instance are gone for the other")
    func sharedRateBucket() throws {
        let t = try TwoInstances()
        defer { t.close() }
        func take(_ s: any DeliveryStore) throws -> Int64? {
            try s.sync { s, done in
                s.takeSharedToken("register\u{1F}default\u{1F}eve\u{0}x", perMinute: 20, completion: done)
            }
        }
        for i in 0..<20 { #expect(try take(i % 2 == 0 ? t.a : t.b) == nil) }
        let wait = try #require(try take(t.b))
        #expect(wait > 0 && wait <= 3000)
        #expect(try take(t.a) != nil)
        t.clock.advance(3000)
        #expect(try take(t.a) == nil)
        #expect(try take(t.b) != nil)
    }

    @Test("the stale-deletion window cap counts every instance's deletions")
    func sharedStaleCap() throws {
        let t = try TwoInstances()
        defer { t.close() }
        try t.devices(t.a, user: "fay", 6)
        let m = try t.enqueue(t.a, fcmSend("fay"))
        let ja = try t.claim(t.a, 3).jobs
        let jb = try t.claim(t.b, 3).jobs
        var outcomes: [StaleRemoval] = []
        for (s, job) in zip([t.a, t.b, t.a, t.b, t.a, t.b], [ja[0], jb[0], ja[1], jb[1], ja[2], jb[2]]) {
            outcomes.append(
                try s.sync { s, done in
                    s.removeStale(
                        deliveryID: job.deliveryID, deviceID: job.deviceID, tokenHash: job.tokenHash, httpStatus: 404,
                        reason: "UNREGISTERED", windowCap: 4, receipt: nil, completion: done)
                })
        }
        #expect(outcomes == [.removed, .removed, .removed, .removed, .refusedWindowCap, .refusedWindowCap])
        let status = try t.status(t.a, m.messageID)
        #expect(status.counts[.removedStale] == 4 && status.counts[.failed] == 2)
        #expect(status.devices?.contains { $0.reason?.contains("window_cap_reached") == true } == true)
        // A minute later the window has room again.
        t.clock.advance(staleWindowMs + 1)
        let more = try t.enqueue(t.b, fcmSend("fay"))
        let job = try #require(try t.claim(t.b).jobs.first { $0.messageID == more.messageID })
        let removal = try t.b.sync { s, done in
            s.removeStale(
                deliveryID: job.deliveryID, deviceID: job.deviceID, tokenHash: job.tokenHash, httpStatus: 404,
                reason: "UNREGISTERED", windowCap: 4, receipt: nil, completion: done)
        }
        #expect(removal == .removed)
    }

    @Test("work queued through one instance wakes the other (NOTIFY), not itself")
    func notifyWakesTheOther() throws {
        let t = try TwoInstances()
        defer { t.close() }
        let wokeA = Flag()
        let wokeB = Flag()
        t.a.setWorkObserver { wokeA.raise() }
        t.b.setWorkObserver { wokeB.raise() }
        try t.devices(t.a, user: "gus", 2)
        _ = try t.enqueue(t.a, fcmSend("gus"))
        #expect(wokeB.wait(seconds: 10))
        #expect(!wokeA.wait(seconds: 0.3))
    }

    @Test("an instance without a key file never makes a second key for a shared database; a wrong key is refused")
    func keyCheckShared() throws {
        let t = try TwoInstances()
        defer { t.close() }
        #expect(t.a.keyOutcome == .created || t.a.keyOutcome == .recorded(sealedRows: 0))
        #expect(t.b.keyOutcome == .verified)
        let made = Flag()
        #expect(throws: StoreKeyError.self) {
            _ = try t.scratch.open(
                keySupply: .missing(create: {
                    made.raise()
                    return try StoreKey.generate()
                }), keyFile: "/etc/herald/store.key",
                instance: "host-c")
        }
        #expect(!made.wait(seconds: 0))
        do {
            _ = try t.scratch.open(key: try StoreKey.generate(), instance: "host-d")
            Issue.record("another key opened the database")
        } catch let error as StoreKeyError {
            #expect(error.problem == .checkValueDoesNotOpen)
        }
    }

    @Test("instances starting at once on an empty database migrate it once; a newer schema is refused by name")
    func migrationAtOnce() throws {
        let scratch = try StoreScratch(.postgres, prefix: "herald-migrate")
        defer { scratch.remove() }
        let key = try StoreKey.generate()
        let results = ResultPair<String>()
        let group = DispatchGroup()
        for i in 0..<3 {
            DispatchQueue.global().async(group: group) {
                results.set(
                    i,
                    Result {
                        let store = try scratch.open(key: key, instance: "host-\(i)")
                        store.close()
                        return "host-\(i)"
                    })
            }
        }
        group.wait()
        for i in 0..<3 { #expect(try results.get(i) == "host-\(i)") }
        let c = PostgresConnection(configuration: try #require(scratch.postgres).connection)
        defer { c.close() }
        let versions = try c.execute("SELECT version FROM schema_version").rows.map { try $0.int64(0) }
        #expect(versions == [3], "one row naming the newest version (3: client builds)")
        #expect(try c.execute("SELECT count(*) FROM pg_class WHERE relname = 'deliveries'").first?.int64(0) == 1)
        // A database a newer Herald migrated: this one refuses to start on it.
        try c.execute("UPDATE schema_version SET version = 99")
        do {
            _ = try scratch.open(key: key, instance: "host-old")
            Issue.record("a herald opened a database of a newer schema")
        } catch {
            #expect("\(error)".contains("schema version 99 is newer than this herald"), "\(error)")
        }
    }

    @Test("a database restart: calls fail while it is away, and the store answers again by itself")
    func databaseRestart() throws {
        let server = try PostgresServer()
        defer { server.destroy() }
        let options = PostgresStoreOptions(
            connection: try PostgresConfiguration(
                dsn: server.dsn, passwordFile: server.passwordFile, reconnectDelay: .milliseconds(20),
                maxReconnectDelay: .milliseconds(200)), poolSize: 2)
        let store = try StoreLocation.postgres(options).open(keySupply: .key(try StoreKey.generate()), keyFile: "k")
        defer { store.close() }
        _ = try store.sync { s, done in
            s.register(
                Registration(app: "default", user: "hal", platform: .fcm, environment: nil, token: "t1"), deviceCap: 20,
                completion: done)
        }
        try server.stop()
        #expect(throws: (any Error).self) { try store.sync { s, done in s.ping(completion: done) } }
        #expect(throws: (any Error).self) {
            _ = try store.sync { s, done in
                s.register(
                    Registration(app: "default", user: "hal", platform: .fcm, environment: nil, token: "t2"),
                    deviceCap: 20, completion: done)
            }
        }
        try server.start()
        let deadline = Date().addingTimeInterval(30)
        var answered = false
        while !answered && Date() < deadline {
            answered = (try? store.sync { s, done in s.ping(completion: done) }) != nil
            if !answered { Thread.sleep(forTimeInterval: 0.05) }
        }
        #expect(answered)
        let devices = try store.sync { s, done in s.list(app: "default", user: "hal", completion: done) }
        #expect(devices.count == 1)
    }

    @Test("two instances' batches of registrations for the same users, in opposite orders, never deadlock")
    func batchesTakeLocksInOneOrder() throws {
        let t = try TwoInstances()
        defer { t.close() }
        let users = (0..<12).map { "u\($0)" }
        let group = DispatchGroup()
        let failures = Locked([String]())
        // Hundreds of calls at once: each instance's queue fills and its
        // batches hold many users' locks at a time, in the order asked.
        for (n, store) in [t.a, t.b].enumerated() {
            for round in 0..<30 {
                let order = n == 0 ? users : users.reversed()
                for (i, user) in order.enumerated() {
                    group.enter()
                    let r = Registration(
                        app: "default", user: user, platform: .fcm, environment: nil, token: "t-\(n)-\(round)-\(i)")
                    store.register(r, deviceCap: 1000) { result in
                        if case .failure(let error) = result { failures.withLock { $0.append("\(error)") } }
                        group.leave()
                    }
                }
            }
        }
        #expect(group.wait(timeout: .now() + 120) == .success)
        let failed = failures.withLock { $0 }
        #expect(failed.count == 0, "\(failed.count) calls failed, the first: \(failed.first ?? "")")
        let c = PostgresConnection(configuration: try #require(t.scratch.postgres).connection)
        defer { c.close() }
        let devices = try #require(try c.execute("SELECT count(*) FROM devices").first?.int64(0))
        #expect(devices == Int64(2 * 30 * users.count))
        // The server's count of deadlocks it broke (each cost a second's wait).
        try c.execute("SELECT pg_stat_force_next_flush()")
        t.a.close()
        t.b.close()
        var deadlocks: Int64 = -1
        for _ in 0..<40 {
            try c.execute("SELECT pg_stat_clear_snapshot()")
            deadlocks =
                try c.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()").first?
                .int64(0) ?? -1
            if deadlocks != 0 { break }
            Thread.sleep(forTimeInterval: 0.05)
        }
        #expect(deadlocks == 0)
    }

    @Test("a store let go without close() closes its connections, its identity lock with them")
    func droppedStoreCloses() throws {
        let scratch = try StoreScratch(.postgres, prefix: "herald-dropped")
        defer { scratch.remove() }
        let c = PostgresConnection(configuration: try #require(scratch.postgres).connection)
        defer { c.close() }
        func sessions() throws -> Int64 {
            try c.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).first?.int64(0) ?? -1
        }
        let key = try StoreKey.generate()
        do {
            let store = try scratch.open(key: key, instance: "host-dropped")
            _ = try store.sync { s, done in s.ping(completion: done) }
            #expect(try sessions() > 0)
        }
        let deadline = Date().addingTimeInterval(20)
        while try sessions() > 0 && Date() < deadline { Thread.sleep(forTimeInterval: 0.05) }
        #expect(try sessions() == 0, "the dropped store's sessions ended")
        // Its identity is free again: the same instance id starts at once.
        let again = try scratch.open(key: key, instance: "host-dropped")
        again.close()
    }
}

/// A call's answer, set on the store's thread and read on the test's.
private final class ResultBox: @unchecked Sendable {
    private let lock = NSLock()
    private var result: Result<Void, any Error>?
    func set(_ r: Result<Void, any Error>) { lock.withLock { result = r } }
    var error: (any Error)? {
        lock.withLock {
            guard case .failure(let e) = result else { return nil }
            return e
        }
    }
}

/// An enqueue's answer, set on the store's thread and read on the test's.
private final class EnqueueBox: @unchecked Sendable {
    private let lock = NSLock()
    private var value: Result<(accepted: Enqueued, claim: Claim), any Error>?
    func set(_ r: Result<(accepted: Enqueued, claim: Claim), any Error>) { lock.withLock { value = r } }
    var result: Result<(accepted: Enqueued, claim: Claim), any Error>? { lock.withLock { value } }
}
