import Foundation
import HeraldCore
import HeraldCrypto
import HeraldStore
import HeraldStoreTestSupport
import Testing

/// Claims an `early` callback got (on the store thread; read after `sync` returns).
final class Claims: @unchecked Sendable {
    var list: [Claim] = []
}

extension TestStore {
    func enqueue(_ e: Enqueue) throws -> Enqueued { try store.sync { s, done in s.enqueue(e, completion: done) } }
    func status(_ id: String, detail: Bool = true) throws -> MessageStatus? {
        try store.sync { s, done in s.status(app: "default", messageID: id, detail: detail, completion: done) }
    }
    func claimAll(_ limit: Int = 100) throws -> Claim {
        try store.sync { s, done in s.claimDue(limit: limit, completion: done) }
    }
    func claimLanes(_ lanes: [QueueLane: Int], others: Int = 0) throws -> Claim {
        try store.sync { s, done in s.claimDue(lanes: lanes, others: others, completion: done) }
    }
    func claim(_ limit: Int = 100) throws -> [DeliveryJob] { try claimAll(limit).jobs }
    func record(
        _ d: DeliveryJob, _ state: DeliveryState, status: Int? = nil, reason: RecordedReason? = nil,
        retryAt: Int64? = nil
    ) throws {
        try store.sync { s, done in
            s.record(
                deliveryID: d.deliveryID, state: state, httpStatus: status, reason: reason, nextAttemptAt: retryAt,
                completion: done)
        }
    }
}

func send(
    _ message: PushMessage, to recipients: Recipients, key: String? = nil, disabled: [Platform: String] = [:]
) -> Enqueue {
    Enqueue(app: "default", message: message, recipients: recipients, idempotencyKey: key, disabled: disabled)
}

@Suite("Delivery queue at the store level")
struct QueueTests {
    func registerMix(_ t: TestStore, user: String) throws -> [Platform: String] {
        var ids: [Platform: String] = [:]
        ids[.apns] = try t.register(apns(user, "aa\(user.count)01")).deviceID
        ids[.apnsVoIP] = try t.register(
            Registration(app: "default", user: user, platform: .apnsVoIP, environment: .production, token: "bb01")
        ).deviceID
        ids[.fcm] = try t.register(
            Registration(app: "default", user: user, platform: .fcm, environment: nil, token: "fcm-\(user)")
        ).deviceID
        return ids
    }

    @Test(
        "a message and one delivery per device commit together; kinds route by platform",
        arguments: StoreBackend.allCases)
    func enqueueAndRoute(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        _ = try registerMix(t, user: "alice")
        let note = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["alice", "nobody"])))
        #expect(note.devices == 2 && note.skipped == 1, "VoIP gets rings only")
        let ring = try t.enqueue(send(PushMessage(kind: .callRing), to: .users(["alice"])))
        #expect(ring.devices == 1 && ring.skipped == 2, "a ring skips plain apns and a legacy-form fcm device")
        let status = try #require(try t.status(note.messageID))
        #expect(status.counts[.queued] == 2 && status.counts[.skipped] == 1)
        #expect(!status.isComplete)
        #expect(status.devices?.first(where: { $0.state == .skipped })?.reason == "kind_not_for_platform")
    }

    @Test(
        "users are resolved by name whatever their characters; a name given twice counts once",
        arguments: StoreBackend.allCases)
    func oddUserNames(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        let names = ["quote\"d", "back\\slash", "tab\tand\nnewline", "ünïcødé 🚀", "[\"json\"]", "plain"]
        for (i, name) in names.enumerated() {
            _ = try t.register(
                Registration(app: "default", user: name, platform: .fcm, environment: nil, token: "fcm-odd-\(i)"))
        }
        let m = try t.enqueue(send(PushMessage(kind: .notification), to: .users(names + ["plain", "nobody"])))
        #expect(m.devices == names.count)
        let one = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["[\"json\"]"])))
        #expect(one.devices == 1, "a name that looks like JSON is a name")
    }

    @Test(
        "a NUL inside a user id is kept: alice\\0evil is a user of its own, in the registry and at send",
        arguments: StoreBackend.allCases)
    func nulInUserID(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        _ = try t.register(
            Registration(app: "default", user: "alice", platform: .fcm, environment: nil, token: "fcm-a"))
        _ = try t.register(
            Registration(
                app: "default", user: "alice\u{0}evil", platform: .fcm, environment: nil, token: "fcm-b",
                name: "a\u{0}b"))
        #expect(try t.list("alice").count == 1)
        let evil = try t.list("alice\u{0}evil")
        #expect(evil.count == 1 && evil.first?.name == "a\u{0}b", "stored whole: \(evil)")
        #expect(try t.enqueue(send(PushMessage(kind: .notification), to: .users(["alice"]))).devices == 1)
        #expect(try t.enqueue(send(PushMessage(kind: .notification), to: .users(["alice\u{0}evil"]))).devices == 1)
        #expect(try t.enqueue(send(PushMessage(kind: .notification), to: .users(["alice\u{0}"]))).devices == 0)
    }

    @Test("the write-ahead log is checkpointed as the store works (off the writer's thread), and folded in at close")
    func walCheckpointed() throws {
        let t = try TestStore(.sqlite)
        let wal = t.dir.appendingPathComponent("herald.db-wal").path
        func size(_ path: String) -> Int {
            (try? FileManager.default.attributesOfItem(atPath: path)[.size] as? Int) ?? 0
        }
        // ~20 MB of WAL frames if nothing were ever checkpointed.
        for round in 0..<40 {
            for i in 0..<100 {
                _ = try t.register(
                    Registration(
                        app: "default", user: "w\(round)-\(i)", platform: .fcm, environment: nil,
                        token: "fcm-wal-\(round)-\(i)"))
            }
            _ = try t.enqueue(send(PushMessage(kind: .notification), to: .users((0..<100).map { "w\(round)-\($0)" })))
        }
        // Checkpointed from ~1000 pages (4 MiB) on, off the writer's thread,
        // and the log is then reused from its start. How far it grows
        // meanwhile depends on the disk; past 16,000 pages (64 MiB) the
        // writer checkpoints itself: that bounds it.
        #expect(size(wal) < 68 << 20, "WAL is \(size(wal)) bytes")
        let runs = try #require((t.store as? SQLiteStore)?.walCheckpoints)
        #expect(runs.offWriter > 0, "checkpoints: \(runs)")
        #expect(size(t.dir.appendingPathComponent("herald.db").path) > 1 << 20, "the pages reached the database")
        t.store.close()
        #expect(size(wal) == 0, "closed: the WAL is empty")
        t.scratch.remove()
    }

    @Test("a disabled transport's devices are skipped with the reason", arguments: StoreBackend.allCases)
    func disabledTransport(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        _ = try registerMix(t, user: "bob")
        let r = try t.enqueue(
            send(
                PushMessage(kind: .notification), to: .users(["bob"]), disabled: [.fcm: "no fcm_credentials configured"]
            ))
        #expect(r.devices == 1 && r.skipped == 2)
        let reasons = try #require(try t.status(r.messageID)?.devices).compactMap(\.reason)
        #expect(reasons.contains("transport_disabled: no fcm_credentials configured"))
    }

    @Test(
        "the same idempotency key within 24 h returns the first message and adds nothing",
        arguments: StoreBackend.allCases)
    func idempotency(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        _ = try registerMix(t, user: "carol")
        let first = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["carol"]), key: "k-1"))
        let again = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["carol"]), key: "k-1"))
        #expect(again.messageID == first.messageID && again.duplicate)
        #expect(again.devices == first.devices && again.skipped == first.skipped)
        #expect(try t.claim().count == first.devices, "nothing was queued twice")
        t.clock.advance(24 * 3600 * 1000 + 1)
        let later = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["carol"]), key: "k-1"))
        #expect(later.messageID != first.messageID && !later.duplicate)
    }

    @Test("a newer message with the same collapse key supersedes one not yet sent", arguments: StoreBackend.allCases)
    func coalescing(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        _ = try t.register(Registration(app: "default", user: "dan", platform: .fcm, environment: nil, token: "f1"))
        let a = try t.enqueue(send(PushMessage(kind: .notification, collapseKey: "chat-1"), to: .users(["dan"])))
        let b = try t.enqueue(send(PushMessage(kind: .notification, collapseKey: "chat-1"), to: .users(["dan"])))
        #expect(try t.status(a.messageID)?.counts[.superseded] == 1)
        #expect(try t.status(b.messageID)?.counts[.queued] == 1)
        let c = try t.enqueue(send(PushMessage(kind: .notification, collapseKey: "chat-2"), to: .users(["dan"])))
        #expect(try t.status(b.messageID)?.counts[.queued] == 1, "another collapse key does not supersede")
        #expect(try t.status(c.messageID)?.counts[.queued] == 1)
    }

    @Test(
        "claimed deliveries carry the unsealed token; outcomes are recorded; in-flight work survives a restart",
        arguments: StoreBackend.allCases)
    func claimRecordRecover(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.scratch.remove() }
        let dev = try t.register(
            Registration(app: "default", user: "erin", platform: .fcm, environment: nil, token: "fcm-token-erin"))
        let m = try t.enqueue(send(PushMessage(kind: .notification), to: .devices([dev.deviceID, "0000"])))
        #expect(m.devices == 1, "unknown device ids are left out")
        let due = try t.claim()
        #expect(due.count == 1)
        #expect(due.first?.token == "fcm-token-erin")
        #expect(due.first?.tokenHash == dev.tokenHash)
        #expect(try t.claim().isEmpty, "in flight is not claimed twice")
        #expect(try t.status(m.messageID)?.counts[.inFlight] == 1)
        // A crash now: reopen the same database.
        t.store.close()
        let reopened = try t.reopen(synchronous: .full)
        defer { reopened.close() }
        // PostgreSQL's close hands work in flight back at once (peers need not
        // wait out the lease): queued again, but not found in flight at the reopen.
        #expect(reopened.recoveredDeliveries == (backend == .postgres ? 0 : 1))
        let again = try reopened.sync { s, done in s.claimDue(limit: 10, completion: done) }.jobs
        #expect(again.count == 1 && again.first?.previousAttempts == 1)
        try reopened.sync { s, done in
            s.record(
                deliveryID: again[0].deliveryID, state: .delivered, httpStatus: 200, reason: nil, nextAttemptAt: nil,
                completion: done)
        }
        let status = try #require(
            try reopened.sync { s, done in
                s.status(app: "default", messageID: m.messageID, detail: true, completion: done)
            })
        #expect(status.isComplete && status.counts[.delivered] == 1)
        #expect(status.devices?.first?.attempts == 2 && status.devices?.first?.httpStatus == 200)
        let devices = try reopened.sync { s, done in s.list(app: "default", user: "erin", completion: done) }
        #expect(devices.first?.lastSuccessAt != nil)
    }

    @Test(
        "one batch of results of every kind is written whole: delivered under two statuses, failed, retrying, uncounted, shrunk",
        arguments: StoreBackend.allCases)
    func mixedResultBatch(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        let users = (0..<7).map { "mix\($0)" }
        for u in users {
            _ = try t.register(
                Registration(app: "default", user: u, platform: .fcm, environment: nil, token: "fcm-\(u)"))
        }
        let m = try t.enqueue(send(PushMessage(kind: .notification), to: .users(users)))
        let jobs = try t.claim().sorted { $0.user < $1.user }
        try #require(jobs.count == 7)
        func rec(
            _ i: Int, _ state: DeliveryState, _ status: Int?, reason: RecordedReason? = nil, next: Int64? = nil,
            counts: Bool = true, shrink: ShrinkOutcome? = nil
        ) -> DeliveryRecord {
            DeliveryRecord(
                deliveryID: jobs[i].deliveryID, deviceID: jobs[i].deviceID, state: state, httpStatus: status,
                reason: reason, nextAttemptAt: next, countsAsAttempt: counts, shrink: shrink)
        }
        let retryAt = t.clock.nowMilliseconds() + 60_000
        let batch = [
            rec(0, .delivered, 200), rec(1, .failed, 400, reason: "INVALID_ARGUMENT"), rec(2, .delivered, 200),
            rec(3, .delivered, 201), rec(4, .retrying, 503, reason: "UNAVAILABLE", next: retryAt, shrink: .step(2)),
            rec(5, .retrying, 401, reason: "credential_rejected", next: retryAt, counts: false),
            rec(6, .delivered, 200, shrink: .step(1)),
        ]
        try t.store.sync { s, done in s.record(batch, completion: done) }
        let status = try #require(try t.status(m.messageID))
        let byDevice = Dictionary(uniqueKeysWithValues: (status.devices ?? []).map { ($0.deviceID, $0) })
        func device(_ i: Int) throws -> MessageStatus.Device { try #require(byDevice[jobs[i].deviceID]) }
        for i in [0, 2] {
            #expect(try device(i).state == .delivered && device(i).httpStatus == 200 && device(i).reason == nil)
            #expect(try device(i).attempts == 1)
        }
        #expect(try device(1).state == .failed && device(1).httpStatus == 400 && device(1).reason == "INVALID_ARGUMENT")
        #expect(try device(3).state == .delivered && device(3).httpStatus == 201)
        #expect(try device(4).state == .retrying && device(4).reason == "UNAVAILABLE" && device(4).attempts == 1)
        #expect(try device(4).shrunk == 2)
        #expect(try device(5).state == .retrying && device(5).attempts == 0, "the uncounted attempt is taken back")
        #expect(try device(6).state == .delivered && device(6).shrunk == 1)
        #expect(status.counts[.delivered] == 4 && status.counts[.failed] == 1 && status.counts[.retrying] == 2)
        for (i, u) in users.enumerated() {
            let d = try #require(
                try t.store.sync { s, done in s.list(app: "default", user: u, completion: done) }.first)
            #expect((d.lastSuccessAt != nil) == [0, 2, 3, 6].contains(i), "last success of \(u)")
            #expect((d.lastFailureReason == "INVALID_ARGUMENT") == (i == 1), "last failure of \(u)")
        }
        // Written again (a retry after an unknown outcome), nothing changes.
        try t.store.sync { s, done in s.record(batch, completion: done) }
        #expect(try t.status(m.messageID)?.counts == status.counts)

        // The retries: one sealed whole this time (its earlier shrink step
        // cleared), one with nothing to say; a kind each, so either way one
        // goes by id and the other with the rest.
        t.clock.advance(61_000)
        let again = try t.claim().sorted { $0.user < $1.user }
        try #require(again.map(\.deviceID) == [jobs[4].deviceID, jobs[5].deviceID])
        let retries = [
            DeliveryRecord(
                deliveryID: again[0].deliveryID, deviceID: again[0].deviceID, state: .delivered, httpStatus: 201,
                reason: nil, nextAttemptAt: nil, shrink: .whole),
            DeliveryRecord(
                deliveryID: again[1].deliveryID, deviceID: again[1].deviceID, state: .delivered, httpStatus: 200,
                reason: nil, nextAttemptAt: nil),
        ]
        try t.store.sync { s, done in s.record(retries, completion: done) }
        let final = try #require(try t.status(m.messageID))
        let retried = Dictionary(uniqueKeysWithValues: (final.devices ?? []).map { ($0.deviceID, $0) })
        let four = try #require(retried[jobs[4].deviceID])
        let five = try #require(retried[jobs[5].deviceID])
        #expect(four.state == .delivered && four.httpStatus == 201 && four.shrunk == nil && four.reason == nil)
        #expect(four.attempts == 2)
        #expect(
            five.state == .delivered && five.httpStatus == 200 && five.attempts == 1, "its uncounted try taken back")
        #expect(final.isComplete && final.counts[.delivered] == 6 && final.counts[.failed] == 1)
    }

    @Test(
        "last_success_at is rewritten at most once a minute per device; failures always are",
        arguments: StoreBackend.allCases)
    func successResolution(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        _ = try t.register(
            Registration(app: "default", user: "gus", platform: .fcm, environment: nil, token: "fcm-gus"))
        func deliver(_ state: DeliveryState, reason: RecordedReason? = nil) throws {
            _ = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["gus"])))
            let job = try #require(try t.claim().first)
            let record = DeliveryRecord(
                deliveryID: job.deliveryID, deviceID: job.deviceID, state: state, httpStatus: 200, reason: reason,
                nextAttemptAt: nil)
            try t.store.sync { s, done in s.record([record], completion: done) }
        }
        func device() throws -> DeviceSummary {
            try #require(try t.store.sync { s, done in s.list(app: "default", user: "gus", completion: done) }.first)
        }
        try deliver(.delivered)
        let first = try #require(try device().lastSuccessAt)
        t.clock.advance(30_000)
        try deliver(.delivered)
        #expect(try device().lastSuccessAt == first, "within the resolution the row is not rewritten")
        try deliver(.failed, reason: "InvalidRegistration")
        #expect(try device().lastFailureAt == first + 30_000 && device().lastFailureReason == "InvalidRegistration")
        t.clock.advance(30_000)
        try deliver(.delivered)
        #expect(try device().lastSuccessAt == first + 60_000, "a minute on, the success is written")
    }

    @Test(
        "past their TTL, deliveries expire instead of being sent; cancel drops what is not yet sent",
        arguments: StoreBackend.allCases)
    func expiryAndCancel(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        _ = try t.register(Registration(app: "default", user: "fay", platform: .fcm, environment: nil, token: "f9"))
        let m = try t.enqueue(send(PushMessage(kind: .notification, ttlSeconds: 60), to: .users(["fay"])))
        let first = try t.claim()
        try t.record(
            first[0], .retrying, status: 503, reason: "UNAVAILABLE", retryAt: t.clock.nowMilliseconds() + 120_000)
        t.clock.advance(120_001)
        #expect(try t.claim().isEmpty)
        #expect(try t.status(m.messageID)?.counts[.expired] == 1)

        let n = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["fay"])))
        let cancelled = try t.store.sync { s, done in s.cancel(app: "default", messageID: n.messageID, completion: done)
        }
        #expect(cancelled == 1)
        #expect(try t.claim().isEmpty)
        #expect(try t.status(n.messageID)?.isComplete == true)
        #expect(try t.status("no-such-message") == nil)
    }

    @Test(
        "status detail names the instance that made each delivery's latest attempt (sent_by)",
        arguments: StoreBackend.allCases)
    func sentBy(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        _ = try t.register(Registration(app: "default", user: "ida", platform: .fcm, environment: nil, token: "i1"))
        _ = try t.register(Registration(app: "default", user: "ida", platform: .fcm, environment: nil, token: "i2"))
        let m = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["ida"])))
        #expect(try t.status(m.messageID)?.devices?.map(\.sentBy) == [nil, nil], "nobody has sent yet")
        let first = try t.claim(1)
        try t.record(try #require(first.first), .retrying, status: 503, retryAt: 0)
        #expect(try t.status(m.messageID)?.devices?.compactMap(\.sentBy) == ["test-instance"])
        // Another instance on the same store takes the rest, and the retry.
        t.store.close()
        let other = try t.reopen(instance: "host-b")
        defer { other.close() }
        let jobs = try other.sync { s, done in s.claimDue(limit: 10, completion: done) }.jobs
        #expect(jobs.count == 2)
        let status = try #require(
            try other.sync { s, done in
                s.status(app: "default", messageID: m.messageID, detail: true, completion: done)
            })
        #expect(status.devices?.map(\.sentBy) == ["host-b", "host-b"])
        // Deliveries handed over at the commit are this instance's from the start.
        let handed = try other.sync { s, done in
            s.enqueue(
                send(PushMessage(kind: .notification), to: .users(["ida"])),
                handoff: [QueueLane(app: "default", platform: .fcm): 1], limit: 1, completion: done)
        }
        #expect(handed.claim.jobs.count == 1)
        let afterHandOver = try #require(
            try other.sync { s, done in
                s.status(app: "default", messageID: handed.accepted.messageID, detail: true, completion: done)
            })
        #expect(afterHandOver.devices?.map(\.sentBy).sorted { ($0 ?? "") < ($1 ?? "") } == [nil, "host-b"])
    }

    @Test(
        "deliveries are handed over before the rows are written: the ids given are the rows' once committed",
        arguments: StoreBackend.allCases)
    func earlyHandoverIDs(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        for k in 0..<3 {
            _ = try t.register(
                Registration(app: "default", user: "kim", platform: .fcm, environment: nil, token: "k\(k)"))
        }
        let lane = QueueLane(app: "default", platform: .fcm)
        // An earlier message queued (not handed): the early ids follow its rows.
        let queued = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["kim"])))
        let early = Claims()
        let handed = try t.store.sync { s, done in
            s.enqueue(
                send(PushMessage(kind: .notification), to: .users(["kim"])), handoff: [lane: 2], limit: 2,
                early: { claim in early.list.append(claim) }, completion: done)
        }
        let claims = early.list
        #expect(claims.count == 1, "called once")
        let jobs = try #require(claims.first).jobs
        #expect(jobs.count == 2 && handed.claim.jobs.isEmpty, "the early claim has them; the commit's none")
        #expect(claims.first?.batchSizes[BatchKey(messageID: handed.accepted.messageID, platform: .fcm)] == 3)
        #expect(Set(jobs.map(\.token)).count == 2 && jobs.allSatisfy { $0.token.hasPrefix("k") })
        // Recording by the early ids changes exactly those rows of this message.
        for job in jobs { try t.record(job, .delivered, status: 200) }
        let status = try #require(try t.status(handed.accepted.messageID))
        #expect(status.counts[.delivered] == 2 && status.counts[.queued] == 1)
        #expect(try t.status(queued.messageID)?.counts[.queued] == 3, "the earlier message is untouched")
        // The undelivered one is claimed as usual, once.
        let rest = try t.claim()
        #expect(rest.filter { $0.messageID == handed.accepted.messageID }.count == 1)
        #expect(Set(rest.map(\.deliveryID)).isDisjoint(with: jobs.map(\.deliveryID)))

        // A larger message: the first 32 as soon as they are ready (with the
        // batch sizes), then the rest; every id once.
        for k in 0..<40 {  // two users: at most 20 devices each
            _ = try t.register(
                Registration(app: "default", user: "lee\(k % 2)", platform: .fcm, environment: nil, token: "l\(k)"))
        }
        let parts = Claims()
        let large = try t.store.sync { s, done in
            s.enqueue(
                send(PushMessage(kind: .notification), to: .users(["lee0", "lee1"])), handoff: [lane: 100], limit: 100,
                early: { claim in parts.list.append(claim) }, completion: done)
        }
        #expect(parts.list.map(\.jobs.count) == [32, 8])
        #expect(parts.list.map(\.batchSizes.count) == [1, 0])
        let ids = parts.list.flatMap(\.jobs).map(\.deliveryID)
        #expect(Set(ids).count == 40 && large.claim.jobs.isEmpty)
        for job in parts.list.flatMap(\.jobs) { try t.record(job, .delivered, status: 200) }
        #expect(try t.status(large.accepted.messageID)?.counts[.delivered] == 40)
    }

    @Test("a claimed job carries the whole message back, as accepted", arguments: StoreBackend.allCases)
    func messageRoundTrip(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        _ = try t.register(Registration(app: "default", user: "gus", platform: .fcm, environment: nil, token: "g1"))
        let message = PushMessage(
            kind: .clear, data: [(key: "z", value: "1"), (key: "a", value: "2 \u{2028}")],
            alert: PushAlert(locKey: "K", locArgs: ["x", "y"], titleLocKey: "T", bodyLocKey: "B"), badge: 4,
            badgePerUser: ["gus": 9], collapseKey: "c", priority: .normal, ttlSeconds: 77)
        let m = try t.enqueue(send(message, to: .users(["gus"])))
        let job = try #require(try t.claim().first)
        #expect(job.message == message)
        #expect(job.messageID == m.messageID)
        #expect(job.expiresAt - job.acceptedAt == 77_000)
        #expect(job.previousAttempts == 0)
    }

    @Test(
        "claims go lane by lane, report batch sizes per platform, and say when the next delivery is due",
        arguments: StoreBackend.allCases)
    func batchesAndLanes(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        _ = try registerMix(t, user: "hal")
        _ = try t.register(
            Registration(app: "default", user: "hal", platform: .fcm, environment: nil, token: "fcm-hal-2"))
        let m = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["hal"])))
        let first = try t.claimLanes([
            QueueLane(app: "default", platform: .apns): 5, QueueLane(app: "default", platform: .fcm): 0,
        ])
        #expect(first.jobs.map(\.platform) == [.apns])
        #expect(
            first.batchSizes == [
                BatchKey(messageID: m.messageID, platform: .apns): 1,
                BatchKey(messageID: m.messageID, platform: .fcm): 2,
            ])
        #expect(first.nextDueAt != nil, "the fcm deliveries still wait")
        let one = try t.claimLanes([QueueLane(app: "default", platform: .fcm): 1])
        #expect(one.jobs.map(\.platform) == [.fcm], "a lane takes no more than it asks for")
        let rest = try t.claimLanes([QueueLane(app: "default", platform: .apns): 5], others: 10)
        #expect(rest.jobs.map(\.platform) == [.fcm], "unnamed lanes come through others")
        #expect(rest.nextDueAt == nil)
    }

    @Test(
        "a claim leaves out the sizes of the batches its caller holds open, and counts every other batch it touches",
        arguments: StoreBackend.allCases)
    func countedBatches(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        _ = try registerMix(t, user: "ivy")
        for i in 2...4 {
            _ = try t.register(
                Registration(app: "default", user: "ivy", platform: .fcm, environment: nil, token: "fcm-ivy-\(i)"))
        }
        let m = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["ivy"])))
        let fcm = BatchKey(messageID: m.messageID, platform: .fcm)
        let apns = BatchKey(messageID: m.messageID, platform: .apns)
        let fcmLane = QueueLane(app: "default", platform: .fcm)
        func claim(_ n: Int, counted: Set<BatchKey>) throws -> Claim {
            try t.store.sync { s, done in s.claimDue(lanes: [fcmLane: n], others: 0, counted: counted, completion: done)
            }
        }
        let first = try claim(1, counted: [])
        #expect(first.batchSizes == [fcm: 4, apns: 1], "a batch not held open is counted, with its message's others")
        let second = try claim(1, counted: [fcm])
        #expect(second.jobs.map(\.platform) == [.fcm])
        #expect(second.batchSizes.isEmpty, "the open batch is not counted again")
        let third = try claim(1, counted: [apns])
        #expect(
            third.batchSizes == [fcm: 4, apns: 1],
            "another batch open does not spare this one its count (in flight counts: it is reported later)")
    }

    @Test("a stale device is deleted only while it holds the token that was sent", arguments: StoreBackend.allCases)
    func removeStale(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        let dev = try t.register(
            Registration(
                app: "default", user: "ida", platform: .fcm, environment: nil, token: "old", registrationID: "r",
                version: 1))
        _ = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["ida"])))
        let job = try #require(try t.claim().first)
        // The device moved to a new token while the push was out.
        _ = try t.register(
            Registration(
                app: "default", user: "ida", platform: .fcm, environment: nil, token: "new", registrationID: "r",
                version: 2))
        let kept = try t.store.sync { s, done in
            s.removeStale(
                deliveryID: job.deliveryID, deviceID: job.deviceID, tokenHash: job.tokenHash, httpStatus: 404,
                reason: "UNREGISTERED", windowCap: 500, receipt: nil, completion: done)
        }
        #expect(kept == .kept)
        _ = dev
        let devices = try t.store.sync { s, done in s.list(app: "default", user: "ida", completion: done) }
        #expect(devices.count == 1)
        let status = try #require(try t.status(job.messageID))
        #expect(status.counts[.failed] == 1)
        #expect(status.devices?.first?.reason?.contains("device kept") == true)

        let m2 = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["ida"])))
        let job2 = try #require(try t.claim().first)
        let removed = try t.store.sync { s, done in
            s.removeStale(
                deliveryID: job2.deliveryID, deviceID: job2.deviceID, tokenHash: job2.tokenHash, httpStatus: 404,
                reason: "UNREGISTERED", windowCap: 500, receipt: nil, completion: done)
        }
        #expect(removed == .removed)
        #expect(try t.status(m2.messageID)?.counts[.removedStale] == 1)
        #expect(try t.store.sync { s, done in s.list(app: "default", user: "ida", completion: done) }.isEmpty)
    }

    @Test("a full queue refuses new messages until deliveries finish", arguments: StoreBackend.allCases)
    func admission(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        for i in 0..<3 {
            _ = try t.register(
                Registration(app: "default", user: "u\(i)", platform: .fcm, environment: nil, token: "t\(i)"))
        }
        var e = send(PushMessage(kind: .notification), to: .users(["u0", "u1"]))
        e.pendingLimit = 3
        _ = try t.enqueue(e)
        #expect(throws: EnqueueError.queueFull(pending: 2, limit: 3)) { try t.enqueue(e) }
        // Once sent, the room is back.
        for job in try t.claim() { try t.record(job, .delivered, status: 200) }
        _ = try t.enqueue(e)
    }

    @Test(
        "max_queued is shared among the apps: past half, an app over its share is refused, one under it admitted",
        arguments: StoreBackend.allCases)
    func admissionSharedAmongApps(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        for (app, users) in [("default", 6), ("b", 2)] {
            for i in 0..<users {
                _ = try t.register(
                    Registration(app: app, user: "u\(i)", platform: .fcm, environment: nil, token: "\(app)\(i)"))
            }
        }
        func message(_ app: String, _ users: [String], apps: Int = 2) -> Enqueue {
            var e = Enqueue(
                app: app, message: PushMessage(kind: .notification), recipients: .users(users), idempotencyKey: nil,
                disabled: [:], pendingLimit: 10)
            e.pendingApps = apps
            return e
        }
        _ = try t.enqueue(message("default", ["u0", "u1", "u2", "u3"]))
        // 6 of 10 would pass half; the app alone with work has one seat of two: 5.
        #expect(throws: EnqueueError.queueFull(pending: 4, limit: 5)) {
            try t.enqueue(message("default", ["u4", "u5"]))
        }
        _ = try t.enqueue(message("b", ["u0", "u1"]))
        // Configured alone, an app has the whole limit.
        _ = try t.enqueue(message("default", ["u4", "u5"], apps: 1))
        #expect(throws: EnqueueError.queueFull(pending: 8, limit: 10)) {
            try t.enqueue(message("default", ["u0", "u1", "u2"], apps: 1))
        }
    }

    @Test(
        "a result for a delivery no longer in flight changes nothing; old finished messages are purged",
        arguments: StoreBackend.allCases)
    func recordGuardAndPurge(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        _ = try t.register(Registration(app: "default", user: "jo", platform: .fcm, environment: nil, token: "j"))
        let m = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["jo"])))
        let job = try #require(try t.claim().first)
        try t.record(job, .delivered, status: 200)
        try t.record(job, .failed, status: 500, reason: "late")
        #expect(try t.status(m.messageID)?.counts[.delivered] == 1)
        let pending = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["jo"])))
        t.clock.advance(8 * 24 * 3600 * 1000)
        let purged = try t.store.sync { s, done in s.purgeMessages(olderThan: .seconds(7 * 24 * 3600), completion: done)
        }
        #expect(purged == 1)
        #expect(try t.status(m.messageID) == nil)
        #expect(try t.status(pending.messageID) != nil, "a message with work left is kept")
    }
}

@Suite("Delivery semantics at the store level (SPEC Revision 2)")
struct QueueSemanticsTests {
    @Test(
        "a delivery never attempted is not claimed past accepted_at + ttl + 2 s: it ends expired",
        arguments: StoreBackend.allCases)
    func neverAttemptedExpires(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        _ = try t.register(Registration(app: "default", user: "ivy", platform: .fcm, environment: nil, token: "i1"))
        // At the deadline exactly it is still sent.
        let onTime = try t.enqueue(send(PushMessage(kind: .notification, ttlSeconds: 5), to: .users(["ivy"])))
        t.clock.advance(7_000)
        let jobs = try t.claim()
        #expect(jobs.map(\.messageID) == [onTime.messageID])
        let job = try #require(jobs.first)
        #expect(job.previousAttempts == 0)
        #expect(job.expiresAt == job.acceptedAt + 5_000, "expires_at is accepted_at + ttl")
        #expect(job.sendDeadline == job.expiresAt + 2_000, "the send deadline adds the 2 s grace")
        try t.record(job, .delivered, status: 200)
        // One millisecond later it is not, though it was never attempted.
        let late = try t.enqueue(send(PushMessage(kind: .notification, ttlSeconds: 5), to: .users(["ivy"])))
        t.clock.advance(7_001)
        let claim = try t.claimAll()
        #expect(claim.jobs.isEmpty)
        #expect(claim.finished == [BatchKey(messageID: late.messageID, platform: .fcm)])
        let status = try #require(try t.status(late.messageID))
        #expect(status.counts[.expired] == 1)
        #expect(status.devices?.first?.reason == "ttl elapsed" && status.devices?.first?.attempts == 0)
    }

    @Test(
        "a TTL-0 call ring keeps its one attempt within the 2 s grace, and no later",
        arguments: StoreBackend.allCases)
    func callRingGrace(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        _ = try t.register(
            Registration(app: "default", user: "jo", platform: .apnsVoIP, environment: .production, token: "bb01"))
        let ring = try t.enqueue(send(PushMessage(kind: .callRing), to: .users(["jo"])))
        t.clock.advance(2_000)
        #expect(try t.claim().map(\.messageID) == [ring.messageID])
        let late = try t.enqueue(send(PushMessage(kind: .callRing), to: .users(["jo"])))
        t.clock.advance(2_001)
        #expect(try t.claim().isEmpty)
        #expect(try t.status(late.messageID)?.counts[.expired] == 1)
    }

    @Test(
        "a message without a collapse key gets its own stable collapse id: from its idempotency key, else its id",
        arguments: StoreBackend.allCases)
    func ownCollapseID(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        _ = try t.register(Registration(app: "default", user: "kim", platform: .fcm, environment: nil, token: "k1"))
        func collapseID(of id: String) throws -> String? {
            let job = try #require(try t.claim().first { $0.messageID == id })
            try t.record(job, .retrying, status: 503, reason: "UNAVAILABLE", retryAt: t.clock.nowMilliseconds())
            return job.message.collapseID
        }
        let plain = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["kim"])))
        let first = try #require(try collapseID(of: plain.messageID))
        #expect(first.utf8.count == 32 && PushMessage(kind: .notification).ownCollapseID == nil)
        #expect(try collapseID(of: plain.messageID) == first, "a retry carries the same id")
        let other = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["kim"])))
        #expect(try collapseID(of: other.messageID) != first, "another message, another id")

        let keyed = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["kim"]), key: "order-7"))
        let keyedID = try #require(try collapseID(of: keyed.messageID))
        // After the idempotency window the same key is a new message with the same collapse id.
        t.clock.advance(24 * 3600 * 1000 + 1)
        let again = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["kim"]), key: "order-7"))
        #expect(again.messageID != keyed.messageID && !again.duplicate)
        #expect(try collapseID(of: again.messageID) == keyedID)

        // A message with a collapse key keeps it and needs no id of its own.
        let collapsed = try t.enqueue(
            send(PushMessage(kind: .notification, collapseKey: "chat-1"), to: .users(["kim"])))
        let job = try #require(try t.claim().first { $0.messageID == collapsed.messageID })
        #expect(job.message.collapseKey == "chat-1" && job.message.ownCollapseID == nil)
    }

    @Test(
        "an attempt that does not count (a credential rejection) leaves attempts as they were; a release makes it due",
        arguments: StoreBackend.allCases)
    func credentialWaitAndRelease(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        _ = try t.register(Registration(app: "default", user: "lou", platform: .fcm, environment: nil, token: "l1"))
        _ = try t.register(apns("lou", "aa01"))
        let m = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["lou"])))
        let later = t.clock.nowMilliseconds() + 3_600_000
        for job in try t.claim() {
            try t.store.sync { s, done in
                s.record(
                    [
                        DeliveryRecord(
                            deliveryID: job.deliveryID, deviceID: job.deviceID, state: .retrying, httpStatus: 403,
                            reason: RecordedReason(.credentialRejected), nextAttemptAt: later, countsAsAttempt: false)
                    ],
                    completion: done)
            }
        }
        let waiting = try #require(try t.status(m.messageID)?.devices)
        #expect(waiting.allSatisfy { $0.state == .retrying && $0.attempts == 0 && $0.reason == "credential_rejected" })
        #expect(try t.claim().isEmpty, "waiting for the credential")
        let released = try t.store.sync { s, done in
            s.releaseCredentialWaits(lanes: [QueueLane(app: "default", platform: .fcm)], completion: done)
        }
        #expect(released == 1)
        let due = try t.claim()
        #expect(due.map(\.platform) == [.fcm] && due[0].previousAttempts == 0, "only the released lane, uncounted")
    }
}
