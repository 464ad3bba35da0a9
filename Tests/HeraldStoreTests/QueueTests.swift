import Foundation
import HeraldCore
import HeraldCrypto
import HeraldStore
import Testing

extension TestStore {
    func enqueue(_ e: Enqueue) throws -> Enqueued { try store.sync { s, done in s.enqueue(e, completion: done) } }
    func status(_ id: String, detail: Bool = true) throws -> MessageStatus? {
        try store.sync { s, done in s.status(app: "default", messageID: id, detail: detail, completion: done) }
    }
    func claim(_ limit: Int = 100) throws -> [DueDelivery] { try store.sync { s, done in s.claimDue(limit: limit, completion: done) } }
    func record(_ d: DueDelivery, _ state: DeliveryState, status: Int? = nil, reason: String? = nil, retryAt: Int64? = nil) throws {
        try store.sync { s, done in
            s.record(deliveryID: d.deliveryID, state: state, httpStatus: status, reason: reason, nextAttemptAt: retryAt, completion: done)
        }
    }
}

func send(
    _ message: PushMessage, to recipients: Recipients, key: String? = nil, disabled: [Platform: String] = [:]
) -> Enqueue {
    Enqueue(app: "default", message: message, payload: "{}", recipients: recipients, idempotencyKey: key, disabled: disabled)
}

@Suite("Delivery queue at the store level")
struct QueueTests {
    func registerMix(_ t: TestStore, user: String) throws -> [Platform: String] {
        var ids: [Platform: String] = [:]
        ids[.apns] = try t.register(apns(user, "aa\(user.count)01")).deviceID
        ids[.apnsVoIP] = try t.register(
            Registration(app: "default", user: user, platform: .apnsVoIP, environment: .production, token: "bb01")).deviceID
        ids[.fcm] = try t.register(
            Registration(app: "default", user: user, platform: .fcm, environment: nil, token: "fcm-\(user)")).deviceID
        return ids
    }

    @Test("a message and one delivery per device commit together; kinds route by platform")
    func enqueueAndRoute() throws {
        let t = try TestStore()
        defer { t.close() }
        _ = try registerMix(t, user: "alice")
        let note = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["alice", "nobody"])))
        #expect(note.devices == 2 && note.skipped == 1, "VoIP gets rings only")
        let ring = try t.enqueue(send(PushMessage(kind: .callRing), to: .users(["alice"])))
        #expect(ring.devices == 2 && ring.skipped == 1, "a ring skips plain apns")
        let status = try #require(try t.status(note.messageID))
        #expect(status.counts[.queued] == 2 && status.counts[.skipped] == 1)
        #expect(!status.isComplete)
        #expect(status.devices?.first(where: { $0.state == .skipped })?.reason == "kind_not_for_platform")
    }

    @Test("a disabled transport's devices are skipped with the reason")
    func disabledTransport() throws {
        let t = try TestStore()
        defer { t.close() }
        _ = try registerMix(t, user: "bob")
        let r = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["bob"]), disabled: [.fcm: "no fcm_credentials configured"]))
        #expect(r.devices == 1 && r.skipped == 2)
        let reasons = try #require(try t.status(r.messageID)?.devices).compactMap(\.reason)
        #expect(reasons.contains("transport_disabled: no fcm_credentials configured"))
    }

    @Test("the same idempotency key within 24 h returns the first message and adds nothing")
    func idempotency() throws {
        let t = try TestStore()
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

    @Test("a newer message with the same collapse key supersedes one not yet sent")
    func coalescing() throws {
        let t = try TestStore()
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

    @Test("claimed deliveries carry the unsealed token; outcomes are recorded; in-flight work survives a restart")
    func claimRecordRecover() throws {
        let t = try TestStore()
        defer { try? FileManager.default.removeItem(at: t.dir) }
        let dev = try t.register(Registration(app: "default", user: "erin", platform: .fcm, environment: nil, token: "fcm-token-erin"))
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
        let reopened = try Store(path: t.dir.appendingPathComponent("herald.db").path, key: t.key, synchronous: .full, clock: t.clock)
        defer { reopened.close() }
        #expect(reopened.recoveredDeliveries == 1)
        let again = try reopened.sync { s, done in s.claimDue(limit: 10, completion: done) }
        #expect(again.count == 1 && again.first?.attempts == 1)
        try reopened.sync { s, done in
            s.record(deliveryID: again[0].deliveryID, state: .delivered, httpStatus: 200, reason: nil, nextAttemptAt: nil, completion: done)
        }
        let status = try #require(try reopened.sync { s, done in s.status(app: "default", messageID: m.messageID, detail: true, completion: done) })
        #expect(status.isComplete && status.counts[.delivered] == 1)
        #expect(status.devices?.first?.attempts == 2 && status.devices?.first?.httpStatus == 200)
        let devices = try reopened.sync { s, done in s.list(app: "default", user: "erin", completion: done) }
        #expect(devices.first?.lastSuccessAt != nil)
    }

    @Test("past their TTL, deliveries expire instead of being sent; cancel drops what is not yet sent")
    func expiryAndCancel() throws {
        let t = try TestStore()
        defer { t.close() }
        _ = try t.register(Registration(app: "default", user: "fay", platform: .fcm, environment: nil, token: "f9"))
        let m = try t.enqueue(send(PushMessage(kind: .notification, ttlSeconds: 60), to: .users(["fay"])))
        let first = try t.claim()
        try t.record(first[0], .retrying, status: 503, reason: "UNAVAILABLE", retryAt: t.clock.nowMilliseconds() + 120_000)
        t.clock.advance(120_001)
        #expect(try t.claim().isEmpty)
        #expect(try t.status(m.messageID)?.counts[.expired] == 1)

        let n = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["fay"])))
        let cancelled = try t.store.sync { s, done in s.cancel(app: "default", messageID: n.messageID, completion: done) }
        #expect(cancelled == 1)
        #expect(try t.claim().isEmpty)
        #expect(try t.status(n.messageID)?.isComplete == true)
        #expect(try t.status("no-such-message") == nil)
    }
}
