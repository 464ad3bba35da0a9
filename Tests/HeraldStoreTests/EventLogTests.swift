import Foundation
import HeraldCore
import HeraldStore
import HeraldStoreTestSupport
import Testing

extension TestStore {
    func events(after cursor: EventCursor? = nil, limit: Int = 512) throws -> EventPage {
        try store.sync { s, done in s.events(after: cursor, limit: limit, completion: done) }
    }
    func allEvents() throws -> [StoredEvent] { try events().events }
    func results(_ records: [DeliveryRecord]) throws {
        try store.sync { s, done in s.record(records, completion: done) }
    }
}

@Suite("The event log: written with the changes it reports, read in cursor order")
struct EventLogTests {
    func fcm(_ user: String, _ token: String) -> Registration {
        Registration(app: "default", user: user, platform: .fcm, environment: nil, token: token)
    }

    @Test(
        "each final outcome is one event with its last attempt's provider id; the message's completion follows its last",
        arguments: StoreBackend.allCases)
    func outcomesAndCompletion(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        for i in 0..<3 { _ = try t.register(fcm("eve", "tok\(i)")) }
        let m = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["eve"])))
        let jobs = try t.claim()
        #expect(jobs.count == 3)
        let receipt = { (i: Int) in
            ProviderReceipt(fcmName: "projects/p/messages/\(i)", origin: "https://fcm", elapsedMs: 7)
        }
        // The first: retried, then delivered; the others delivered and failed.
        try t.results([
            DeliveryRecord(
                deliveryID: jobs[0].deliveryID, deviceID: jobs[0].deviceID, state: .retrying, httpStatus: 503,
                reason: RecordedReason("UNAVAILABLE"), nextAttemptAt: 0, receipt: receipt(0)),
            DeliveryRecord(
                deliveryID: jobs[1].deliveryID, deviceID: jobs[1].deviceID, state: .delivered, httpStatus: 200,
                reason: nil, nextAttemptAt: nil, receipt: receipt(1)),
        ])
        var events = try t.allEvents()
        #expect(events.map(\.kind) == ["delivery"], "a retry is not final: \(events.map(\.kind))")
        #expect(events.first?.providerID == "projects/p/messages/1")
        #expect(events.first?.state == "delivered")
        #expect(events.first?.messageID == m.messageID)
        #expect(events.first?.deviceID == jobs[1].deviceID)
        #expect(events.first?.user == "eve")
        let again = try t.claim()
        #expect(again.map(\.deliveryID) == [jobs[0].deliveryID])
        try t.results([
            DeliveryRecord(
                deliveryID: jobs[0].deliveryID, deviceID: jobs[0].deviceID, state: .delivered, httpStatus: 200,
                reason: nil, nextAttemptAt: nil, receipt: receipt(10)),
            DeliveryRecord(
                deliveryID: jobs[2].deliveryID, deviceID: jobs[2].deviceID, state: .failed, httpStatus: 400,
                reason: RecordedReason("INVALID_ARGUMENT"), nextAttemptAt: nil, receipt: receipt(2)),
        ])
        events = try t.allEvents()
        #expect(events.map(\.kind) == ["delivery", "delivery", "delivery", "message_complete"])
        #expect(zip(events, events.dropFirst()).allSatisfy { $0.cursor < $1.cursor }, "cursors only grow")
        let byDevice = Dictionary(uniqueKeysWithValues: events.prefix(3).map { ($0.deviceID!, $0) })
        #expect(byDevice[jobs[0].deviceID]?.providerID == "projects/p/messages/10", "the final attempt's id")
        #expect(byDevice[jobs[2].deviceID]?.state == "failed")
        #expect(byDevice[jobs[2].deviceID]?.reason == "INVALID_ARGUMENT")
        #expect(byDevice[jobs[2].deviceID]?.httpStatus == 400)
        let complete = try #require(events.last)
        #expect(complete.messageID == m.messageID)
        let counts = try JSONSerialization.jsonObject(with: Data((complete.detail ?? "").utf8)) as? [String: Int]
        #expect(counts == ["delivered": 2, "failed": 1])
        // Read after a cursor: only what follows it.
        let later = try t.events(after: events[1].cursor).events
        #expect(later.map(\.cursor) == events.dropFirst(2).map(\.cursor))
        #expect(try t.events(after: events.last!.cursor).events.isEmpty)
        #expect(try t.store.sync { s, done in s.eventsHead(completion: done) } == events.last!.cursor)

        // push.status detail: every attempt, numbered per device.
        let status = try #require(try t.status(m.messageID))
        let attempts = try #require(status.attempts)
        #expect(attempts.count == 4)
        let first = attempts.filter { $0.deviceID == jobs[0].deviceID }
        #expect(first.map(\.number) == [1, 2])
        #expect(first.map(\.state) == ["retrying", "delivered"])
        #expect(first.map(\.httpStatus) == [503, 200])
        #expect(first.map(\.providerID) == ["projects/p/messages/0", "projects/p/messages/10"])
        #expect(first.allSatisfy { $0.origin == "https://fcm" && $0.elapsedMs == 7 && $0.sentBy != nil })
    }

    @Test(
        "deliveries final when written are events too, and a message with nothing to send is complete at once",
        arguments: StoreBackend.allCases)
    func skippedAtEnqueue(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        _ = try t.register(fcm("sky", "s1"))
        _ = try t.register(fcm("sky", "s2"))
        let m = try t.enqueue(
            send(PushMessage(kind: .notification), to: .users(["sky"]), disabled: [.fcm: "no credentials"]))
        #expect(m.skipped == 2)
        let events = try t.allEvents()
        #expect(events.map(\.kind) == ["delivery", "delivery", "message_complete"])
        #expect(
            events.prefix(2).allSatisfy { $0.state == "skipped" && $0.reason?.hasPrefix("transport_disabled") == true })
        #expect(events.last?.detail?.contains("\"skipped\"") == true)
    }

    @Test(
        "devices Herald removes are events with their user and why: a stale token, the cap, a forgotten user",
        arguments: StoreBackend.allCases)
    func removals(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        let stale = try t.register(fcm("sam", "stale-token")).deviceID
        let m = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["sam"])))
        let job = try #require(try t.claim().first)
        let removal = try t.store.sync { s, done in
            s.removeStale(
                deliveryID: job.deliveryID, deviceID: job.deviceID, tokenHash: job.tokenHash, httpStatus: 404,
                reason: "UNREGISTERED", windowCap: 500,
                receipt: ProviderReceipt(origin: "https://fcm", elapsedMs: 3), completion: done)
        }
        #expect(removal == .removed)
        var events = try t.allEvents()
        #expect(events.map(\.kind) == ["device_removed", "delivery", "message_complete"])
        #expect(events[0].deviceID == stale && events[0].user == "sam" && events[0].reason == "stale")
        #expect(events[0].platform == "fcm")
        #expect(events[1].state == "removed_stale" && events[1].messageID == m.messageID)

        // The cap: the oldest of three goes when a third registers with a cap of two.
        let oldest = try t.register(fcm("cap", "c1")).deviceID
        _ = try t.register(fcm("cap", "c2"))
        let third = try t.store.sync { s, done in s.register(fcm("cap", "c3"), deviceCap: 2, completion: done) }
        #expect(third.evicted == [oldest])
        events = try t.events(after: events.last!.cursor).events
        #expect(events.map(\.kind) == ["device_removed"])
        #expect(events.first?.deviceID == oldest && events.first?.reason == "cap" && events.first?.user == "cap")

        // user.forget: one event per device.
        let forgotten = try t.store.sync { s, done in s.forget(app: "default", user: "cap", completion: done) }
        #expect(forgotten == 2)
        events = try t.events(after: events.last!.cursor).events
        #expect(events.count == 2 && events.allSatisfy { $0.reason == "forget" && $0.user == "cap" })
    }

    @Test(
        "events older than the retention are purged; a reader behind them is told where they end",
        arguments: StoreBackend.allCases)
    func retention(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        _ = try t.register(fcm("ret", "r1"))
        _ = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["ret"]), disabled: [.fcm: "off"]))
        let before = try t.allEvents()
        #expect(before.count == 2)
        #expect(try t.events().purgedThrough == nil)
        // Nothing is older than a day yet.
        #expect(try t.store.sync { s, done in s.purgeEvents(olderThan: .seconds(86_400), completion: done) } == 0)
        t.clock.advance(86_400_001)
        let purged = try t.store.sync { s, done in s.purgeEvents(olderThan: .seconds(86_400), completion: done) }
        #expect(purged == 2)
        let page = try t.events()
        #expect(page.events.isEmpty)
        #expect(page.purgedThrough == before.last?.cursor)
        // The cursor goes on growing from where it was.
        #expect(
            try t.store.sync { s, done in s.eventsHead(completion: done) }.map { $0 >= before.last!.cursor } ?? true)
        try t.store.sync { s, done in
            s.append([NewEvent(app: "default", kind: .credential, platform: "fcm", state: "ok")], completion: done)
        }
        let next = try #require(try t.allEvents().first)
        #expect(next.cursor > before.last!.cursor)
        #expect(next.kind == "credential" && next.state == "ok" && next.platform == "fcm")
    }
}
