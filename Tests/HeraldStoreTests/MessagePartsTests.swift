import Foundation
import HeraldCore
import HeraldIO
import HeraldStore
import HeraldStoreTestSupport
import Testing

/// A message of many devices is written in parts on SQLite (each a
/// transaction of its own, so other callers' acceptances go between them):
/// it is whole when answered, its key and collapse rules hold as for a
/// message written at once, and a stop between two parts has the rest
/// written at the next open, never left half there.
@Suite("Messages written in parts")
struct MessagePartsTests {
    static let users = 1_500

    func registerMany(_ t: TestStore, prefix: String = "p") throws -> [String] {
        let names = (0..<Self.users).map { "\(prefix)\($0)" }
        for name in names {
            _ = try t.register(
                Registration(app: "default", user: name, platform: .fcm, environment: nil, token: "fcm-\(name)"))
        }
        return names
    }

    /// Completions in the order they came.
    final class Order: @unchecked Sendable {
        private let lock = NSLock()
        private var names: [String] = []
        private var results: [String: Enqueued] = [:]
        func done(_ name: String, _ r: Result<Enqueued, any Error>) {
            lock.lock()
            names.append(name)
            if case .success(let e) = r { results[name] = e }
            lock.unlock()
        }
        var all: [String] {
            lock.lock()
            defer { lock.unlock() }
            return names
        }
        func result(_ name: String) -> Enqueued? {
            lock.lock()
            defer { lock.unlock() }
            return results[name]
        }
        func wait(for n: Int) async {
            for _ in 0..<2000 where all.count < n { try? await Task.sleep(for: .milliseconds(5)) }
        }
    }

    /// Sends `e` (a large message) and runs `during` while its first part
    /// is being written (from the hand-over of its first delivery, on the
    /// store's thread): what `during` sends comes after that part.
    func sendLarge(_ t: TestStore, _ e: Enqueue, order: Order, during: @escaping @Sendable () -> Void) {
        let once = Locked(false)
        t.store.enqueue(
            e, handoff: [QueueLane(app: "default", platform: .fcm): 1], limit: 1,
            early: { _ in
                if once.withLock({ o in
                    defer { o = true }
                    return !o
                }) {
                    during()
                }
            }
        ) { order.done("large", $0.map(\.accepted)) }
    }

    @Test("a large message is whole when answered, and a small one sent after it is answered first")
    func smallGoesBetweenParts() async throws {
        let t = try TestStore(.sqlite)
        defer { t.close() }
        let names = try registerMany(t)
        _ = try t.register(apns("solo", "ab01"))
        let order = Order()
        let store = t.store
        sendLarge(t, send(PushMessage(kind: .notification), to: .users(names)), order: order) {
            store.enqueue(send(PushMessage(kind: .notification), to: .users(["solo"]))) { order.done("small", $0) }
        }
        await order.wait(for: 2)
        #expect(order.all == ["small", "large"], "the small message is answered between the large one's parts")
        let large = try #require(order.result("large"))
        #expect(large.devices == Self.users && large.skipped == 0)
        let status = try #require(try t.status(large.messageID))
        #expect(status.counts.values.reduce(0, +) == Self.users, "every delivery is written: \(status.counts)")
        let devices = Set((status.devices ?? []).map(\.deviceID))
        #expect(devices.count == Self.users, "each device once")
        let claim = try t.claimAll(5_000)
        #expect(Set(claim.jobs.map(\.deliveryID)).count == claim.jobs.count, "ids are unique")
        #expect(claim.jobs.count == Self.users, "the handed delivery is in flight already, the rest are queued")
    }

    @Test("only the first part hands deliveries over: a later part's rows are claimed")
    func handOverFromTheFirstPartOnly() async throws {
        let t = try TestStore(.sqlite)
        defer { t.close() }
        let names = try registerMany(t)
        let handed = Locked(0)
        let accepted = try t.store.sync { s, done in
            s.enqueue(
                send(PushMessage(kind: .notification), to: .users(names)),
                handoff: [QueueLane(app: "default", platform: .fcm): 5_000], limit: 5_000,
                early: { claim in handed.withLock { $0 += claim.jobs.count } }, completion: done)
        }
        let early = handed.withLock { $0 }
        #expect(early > 0 && early <= 256, "the first part's deliveries only: \(early)")
        #expect(accepted.claim.jobs.isEmpty, "every handed delivery went early")
        #expect(try t.claimAll(5_000).jobs.count == Self.users - early)
    }

    @Test("the same idempotency key sent twice while the first is written in parts names one message")
    func keyWaitsForTheFirst() async throws {
        let t = try TestStore(.sqlite)
        defer { t.close() }
        let names = try registerMany(t)
        let order = Order()
        let e = send(PushMessage(kind: .notification), to: .users(names), key: "once")
        t.store.enqueue(e) { order.done("first", $0) }
        t.store.enqueue(e) { order.done("second", $0) }
        await order.wait(for: 2)
        let first = try #require(order.result("first"))
        let second = try #require(order.result("second"))
        #expect(!first.duplicate && second.duplicate)
        #expect(second.messageID == first.messageID)
        #expect(second.devices == Self.users)
        #expect(try t.claimAll(5_000).jobs.count == Self.users, "one message's deliveries, not two")
    }

    @Test("a collapse key's newest message wins over one written in parts around it")
    func collapseAcrossParts() async throws {
        let t = try TestStore(.sqlite)
        defer { t.close() }
        let names = try registerMany(t)
        var m = PushMessage(kind: .notification)
        m.collapseKey = "score"
        let message = m
        let order = Order()
        // The small message goes to the last user, whose delivery the
        // large message writes in its last part, after the small one.
        let store = t.store
        sendLarge(t, send(message, to: .users(names)), order: order) {
            store.enqueue(send(message, to: .users([names.last!]))) { order.done("small", $0) }
        }
        await order.wait(for: 2)
        #expect(order.all == ["small", "large"])
        let large = try #require(order.result("large"))
        let small = try #require(order.result("small"))
        let lastDevice = try #require(try t.list(names.last!).first?.deviceID)
        let last = try #require(try t.status(large.messageID)?.devices?.first { $0.deviceID == lastDevice })
        #expect(last.state == .superseded && last.reason == "superseded by \(small.messageID)")
        #expect(try t.status(small.messageID)?.counts[.queued] == 1, "the newer message's delivery stays")
        let pending = try t.claimAll(5_000).jobs.filter { $0.deviceID == lastDevice }
        #expect(pending.map(\.messageID) == [small.messageID], "one pending delivery per device and key")
    }

    @Test(
        "a store closed between two parts has the rest written at its next open: the resend with its key finds it whole"
    )
    func closedBetweenParts() async throws {
        let t = try TestStore(.sqlite)
        defer { t.scratch.remove() }
        let names = try registerMany(t)
        let order = Order()
        let store = t.store
        let lane = QueueLane(app: "default", platform: .fcm)
        let e = send(PushMessage(kind: .notification), to: .users(names), key: "big-1")
        // The first part hands 10 deliveries early, on the store's thread:
        // the store is told to close then, and the first part's commit
        // finds it closing, so the second part is refused (as at a stop;
        // a crash leaves the same rows).
        let closing = Locked(false)
        let closed = Locked(false)
        store.enqueue(
            e, handoff: [lane: 10], limit: 10,
            early: { _ in
                let first = closing.withLock { c in
                    defer { c = true }
                    return !c
                }
                guard first else { return }
                Thread.detachNewThread {
                    store.close()
                    closed.withLock { $0 = true }
                }
                Thread.sleep(forTimeInterval: 0.3)
            }
        ) { order.done("large", $0.map(\.accepted)) }
        await order.wait(for: 1)
        #expect(order.result("large") == nil, "not answered: its caller sends it again")
        for _ in 0..<1000 where !closed.withLock({ $0 }) { try await Task.sleep(for: .milliseconds(5)) }
        let reopened = try t.reopen()
        defer { reopened.close() }
        #expect(reopened.unfinishedCompleted == 1)
        #expect(reopened.recoveredDeliveries == 10, "its handed deliveries are queued again, like any in flight")
        let depth = try reopened.sync { s, done in s.queueDepth(completion: done) }
        #expect(depth.waiting == Self.users && depth.inFlight == 0, "every device's delivery is there: \(depth)")
        let again = try reopened.sync { s, done in s.enqueue(e, completion: done) }
        #expect(again.duplicate && again.devices == Self.users, "the resend finds the message whole: \(again)")
        let status = try reopened.sync { s, done in
            s.status(app: "default", messageID: again.messageID, detail: true, completion: done)
        }
        #expect(Set((status?.devices ?? []).map(\.deviceID)).count == Self.users, "each device once")
    }
}
