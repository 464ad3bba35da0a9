import Foundation
import HeraldCore
import HeraldCrypto
import HeraldIO
@testable import HeraldStore
import HeraldStoreTestSupport
import HeraldTestSupport
import Postgres
import Testing

/// One instance on a scratch PostgreSQL database, with a connection of the
/// test's own that counts the rows written to the queue's live partition.
private struct Scratch {
    let scratch: StoreScratch
    let store: any DeliveryStore
    let sql: PostgresConnection

    init() throws {
        scratch = try StoreScratch(.postgres, prefix: "herald-early")
        store = try scratch.open(key: try StoreKey.generate(), instance: "host-a")
        sql = PostgresConnection(configuration: try #require(scratch.postgres).connection)
        try sql.connect()
        try sql.executeScript(
            """
            CREATE TABLE live_inserts (n bigint NOT NULL);
            INSERT INTO live_inserts VALUES (0);
            CREATE FUNCTION count_live_insert() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN UPDATE live_inserts SET n = n + 1; RETURN NEW; END $$;
            CREATE TRIGGER live_insert_counted AFTER INSERT ON deliveries_live
                FOR EACH ROW EXECUTE FUNCTION count_live_insert();
            """)
    }

    func close() {
        sql.close()
        store.close()
        scratch.remove()
    }

    /// Rows inserted into the live partition so far (committed).
    func liveInserts() throws -> Int64 { try sql.execute("SELECT n FROM live_inserts").rows[0].int64(0) }

    func devices(user: String, _ n: Int) throws {
        for i in 0..<n {
            _ = try store.sync { s, done in
                s.register(
                    Registration(app: "default", user: user, platform: .fcm, environment: nil, token: "t-\(user)-\(i)"),
                    deviceCap: 1000, completion: done)
            }
        }
    }

    func status(_ id: String) throws -> MessageStatus {
        try #require(
            try store.sync { s, done in s.status(app: "default", messageID: id, detail: true, completion: done) })
    }

    /// Enqueues `user`'s message with every device handed early; `answer`
    /// runs on a thread of its own for each early part (as the scheduler's
    /// results come from the transports), with the part's box.
    func send(
        user: String, devices: Int, waits: Bool,
        answer: @escaping @Sendable (Claim) -> Void = { _ in }
    ) throws -> (accepted: Enqueued, claim: Claim, parts: [Claim]) {
        var e = Enqueue(
            app: "default", message: PushMessage(kind: .notification), recipients: .users([user]),
            idempotencyKey: nil, disabled: [:])
        e.awaitsResults = waits
        let parts = Parts()
        let lane = QueueLane(app: "default", platform: .fcm)
        let (accepted, claim) = try store.sync { s, done in
            s.enqueue(
                e, handoff: [lane: devices], limit: devices,
                early: { claim in
                    parts.add(claim)
                    Thread.detachNewThread { answer(claim) }
                }, completion: done)
        }
        return (accepted, claim, parts.list)
    }
}

private final class Parts: @unchecked Sendable {
    private let lock = NSLock()
    private var claims: [Claim] = []
    func add(_ c: Claim) { lock.withLock { claims.append(c) } }
    var list: [Claim] { lock.withLock { claims } }
}

private func delivered(_ job: DeliveryJob) -> DeliveryRecord {
    DeliveryRecord(
        deliveryID: job.deliveryID, deviceID: job.deviceID, state: .delivered, httpStatus: 200, reason: nil,
        nextAttemptAt: nil)
}

@Suite("The results of early sends written with their message (PostgreSQL, a caller that waits)")
struct EarlyResultsTests {
    @Test("answers that come within the hold are written once, final, in the message's commit")
    func writtenOnce() throws {
        let t = try Scratch()
        defer { t.close() }
        try t.devices(user: "w1", 5)
        let taken = Counter()
        let sent = try t.send(user: "w1", devices: 5, waits: true) { claim in
            for job in claim.jobs where claim.earlyResults?.offer(delivered(job)) == true { taken.add() }
        }
        #expect(sent.parts.allSatisfy { $0.earlyResults != nil })
        #expect(taken.value == 5, "every plain result taken by the enqueue")
        #expect(sent.accepted.delivered == 5 && sent.accepted.devices == 5)
        #expect(sent.claim.jobs.isEmpty)
        #expect(try t.liveInserts() == 0, "no delivery was written in flight first")
        let status = try t.status(sent.accepted.messageID)
        #expect(status.counts[.delivered] == 5)
        for d in status.devices ?? [] {
            #expect(d.state == .delivered && d.httpStatus == 200 && d.attempts == 1 && d.sentBy == "host-a")
        }
        let successes = try t.sql.execute("SELECT count(*) FROM devices WHERE last_success_at IS NOT NULL")
        #expect(try successes.rows[0].int64(0) == 5, "the devices' last success is written as a result's would be")
        #expect(try t.sql.execute("SELECT count(*) FROM deliveries_live").rows[0].int64(0) == 0)
    }

    @Test("a result that says more, and one that never comes: written in flight, recorded as before")
    func restInFlight() throws {
        let t = try Scratch()
        defer { t.close() }
        try t.devices(user: "w2", 200)
        let refused = Counter()
        let started = ContinuousClock.now
        let sent = try t.send(user: "w2", devices: 200, waits: true) { claim in
            for job in claim.jobs {
                let n = job.deviceID.utf8.reduce(0) { ($0 &* 31 &+ Int($1)) & 0xffff } % 10
                if n == 0 { continue }  // never answered within the hold
                if n == 1 {
                    let failed = DeliveryRecord(
                        deliveryID: job.deliveryID, deviceID: job.deviceID, state: .failed, httpStatus: 400,
                        reason: "bad_request", nextAttemptAt: nil)
                    if claim.earlyResults?.offer(failed) == false { refused.add() }
                    continue
                }
                _ = claim.earlyResults?.offer(delivered(job))
            }
        }
        let waited = ContinuousClock.now - started
        #expect(waited >= .milliseconds(40), "held for the missing answers, \(waited)")
        #expect(waited < .seconds(3))
        let status = try t.status(sent.accepted.messageID)
        let done = status.counts[.delivered] ?? 0
        let inFlight = status.counts[.inFlight] ?? 0
        #expect(done == sent.accepted.delivered && done > 100)
        #expect(done + inFlight == 200 && refused.value > 0)
        // More than one part: written as the answers came, the rest with the message.
        #expect(try t.liveInserts() == Int64(inFlight), "only the deliveries without a kept result went in flight")
        // A late offer is refused: the scheduler writes it itself.
        let late = try #require(sent.parts.first?.jobs.first)
        #expect(sent.parts.first?.earlyResults?.offer(delivered(late)) == false)
        // The ones in flight take their results as any other.
        let open = (status.devices ?? []).filter { $0.state == .inFlight }
        let jobs = sent.parts.flatMap(\.jobs)
        let records = open.compactMap { d in jobs.first { $0.deviceID == d.deviceID }.map(delivered) }
        try t.store.sync { s, done in s.record(records, completion: done) }
        #expect(try t.status(sent.accepted.messageID).counts[.delivered] == 200)
    }

    @Test("a waiting caller's early sends go in claims of 128 after the first 32; one that does not wait, in two")
    func handedInParts() throws {
        let t = try Scratch()
        defer { t.close() }
        try t.devices(user: "w6", 300)
        let waiting = try t.send(user: "w6", devices: 300, waits: true) { claim in
            for job in claim.jobs { _ = claim.earlyResults?.offer(delivered(job)) }
        }
        #expect(waiting.parts.map(\.jobs.count) == [32, 128, 128, 12])
        #expect(waiting.parts.dropFirst().allSatisfy { $0.batchSizes.isEmpty }, "the batch sizes go with the first")
        let ids = waiting.parts.flatMap(\.jobs).map(\.deliveryID)
        #expect(Set(ids).count == 300)
        let rows = try t.sql.execute(
            "SELECT delivery_id FROM deliveries WHERE message_id = $1", [.text(waiting.accepted.messageID)])
        #expect(Set(try rows.rows.map { try $0.int64(0) }) == Set(ids), "the ids taken ahead are the rows' ids")
        #expect(try t.status(waiting.accepted.messageID).counts[.delivered] == 300)
        let notWaiting = try t.send(user: "w6", devices: 300, waits: false)
        #expect(notWaiting.parts.map(\.jobs.count) == [32, 268])
    }

    @Test("a caller that does not wait: nothing held, every early send written in flight")
    func notWaiting() throws {
        let t = try Scratch()
        defer { t.close() }
        try t.devices(user: "w3", 4)
        let sent = try t.send(user: "w3", devices: 4, waits: false)
        #expect(!sent.parts.isEmpty && sent.parts.allSatisfy { $0.earlyResults == nil })
        #expect(sent.accepted.delivered == 0)
        #expect(try t.liveInserts() == 4)
        #expect(try t.status(sent.accepted.messageID).counts[.inFlight] == 4)
    }

    @Test("a job that runs again after a lost race writes the results the first run took")
    func rerunKeepsResults() throws {
        let t = try Scratch()
        defer { t.close() }
        try t.devices(user: "w4", 6)
        // The first insert into the history fails as a serialization failure would.
        try t.sql.executeScript(
            """
            CREATE SEQUENCE race_once;
            CREATE FUNCTION lose_once() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF nextval('race_once') = 1 THEN
                    RAISE EXCEPTION 'lost a race (test)' USING ERRCODE = '40001';
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER lose_once BEFORE INSERT ON deliveries_done FOR EACH ROW EXECUTE FUNCTION lose_once();
            """)
        let sent = try t.send(user: "w4", devices: 6, waits: true) { claim in
            for job in claim.jobs { _ = claim.earlyResults?.offer(delivered(job)) }
        }
        #expect(try t.sql.execute("SELECT last_value FROM race_once").rows[0].int64(0) > 1, "the job ran again")
        #expect(sent.parts.flatMap(\.jobs).count == 6, "sent once, by the first run")
        let status = try t.status(sent.accepted.messageID)
        #expect(status.counts[.delivered] == 6 && sent.accepted.delivered == 6)
        #expect(try t.liveInserts() == 0)
    }
}

private final class Counter: @unchecked Sendable {
    private let lock = NSLock()
    private var n = 0
    func add() { lock.withLock { n += 1 } }
    var value: Int { lock.withLock { n } }
}

@Suite("How many enqueues hold their commit for results")
struct ResultHoldsTests {
    private func record(_ id: Int64) -> DeliveryRecord {
        DeliveryRecord(
            deliveryID: id, deviceID: "d\(id)", state: .delivered, httpStatus: 200, reason: nil, nextAttemptAt: nil)
    }

    @Test("past the limit an enqueue does not wait: it takes only what was offered, and the box closes")
    func pastTheLimit() throws {
        let holds = ResultHolds(limit: 1, longest: .seconds(5))
        let first = EarlyResults()
        let done = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            // Holds the only place: waits for 2 answers, and gets them late.
            _ = try? holds.drain(first, waitingFor: 2, latest: .max) { _ in }
            done.signal()
        }
        _ = first.offer(nil)
        Thread.sleep(forTimeInterval: 0.05)

        let second = EarlyResults()
        #expect(second.offer(record(1)))
        let started = ContinuousClock.now
        let taken = try holds.drain(second, waitingFor: 3, latest: .max) { _ in
            Issue.record("no part while it does not wait")
        }
        #expect(ContinuousClock.now - started < .seconds(1), "it did not wait for its answers")
        #expect(taken.map(\.deliveryID) == [1])
        #expect(!second.isOpen && !second.offer(record(2)), "closed: later answers are the scheduler's to write")

        _ = first.offer(record(9))
        #expect(done.wait(timeout: .now() + 5) == .success)
        // The place is free again: the next one waits for its answers.
        let third = EarlyResults()
        Thread.detachNewThread {
            Thread.sleep(forTimeInterval: 0.1)
            _ = third.offer(record(3))
        }
        let later = try holds.drain(third, waitingFor: 1, latest: .max) { _ in }
        #expect(later.map(\.deliveryID) == [3])
    }
}
