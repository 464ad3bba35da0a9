import Foundation
import HeraldCore
import HeraldIO
@testable import HeraldStore
import HeraldStoreTestSupport
import Testing

/// What the SQLite store keeps in memory for messages written in parts is
/// bounded: how many are written in parts at once (past that a large one is
/// written whole), and how many sends wait for one that holds their key.
@Suite("Bounds of messages written in parts")
struct AssemblyBoundsTests {
    /// Users with one device each: more devices than a message written whole.
    static let users = Queue.partThreshold + 76

    func registerMany(_ t: TestStore) throws -> [String] {
        let names = (0..<Self.users).map { "b\($0)" }
        for name in names {
            _ = try t.register(
                Registration(app: "default", user: name, platform: .fcm, environment: nil, token: "fcm-\(name)"))
        }
        return names
    }

    enum Began: Equatable { case parts, whole, other }

    static func kind(_ step: EnqueueStep) -> Began {
        switch step {
        case .partial: .parts
        case .whole: .whole
        default: .other
        }
    }

    /// Begins `count` large messages in one writer job (no part after the
    /// first is written: each stays being written in parts); with `fail`,
    /// the job then throws, so that none of their first parts commits.
    func begin(_ store: SQLiteStore, _ e: Enqueue, count: Int, fail: Bool = false) throws -> [Began] {
        struct Undo: Error {}
        let result = Locked<Result<[Began], any Error>?>(nil)
        let done = DispatchSemaphore(value: 0)
        store.submit(
            { t, now in
                var kinds: [Began] = []
                for _ in 0..<count {
                    kinds.append(Self.kind(try t.queue.begin(e, now: now, handoff: [:], early: nil)))
                }
                if fail { throw Undo() }
                return kinds
            }
        ) { r in
            result.withLock { $0 = r }
            done.signal()
        }
        #expect(done.wait(timeout: .now() + 60) == .success)
        return try #require(result.withLock { $0 }).get()
    }

    @Test("past the most messages written in parts at once, a large message is written whole")
    func atMostSoManyInParts() throws {
        let t = try TestStore(.sqlite)
        defer { t.close() }
        let store = try #require(t.store as? SQLiteStore)
        let e = send(PushMessage(kind: .notification), to: .users(try registerMany(t)))
        let kinds = try begin(store, e, count: Queue.maxAssembling + 2)
        #expect(kinds == Array(repeating: .parts, count: Queue.maxAssembling) + [.whole, .whole])
    }

    @Test("messages noted as written in parts whose first part never committed do not count against the bound")
    func uncommittedFirstPartsAreForgotten() throws {
        let t = try TestStore(.sqlite)
        defer { t.close() }
        let store = try #require(t.store as? SQLiteStore)
        let e = send(PushMessage(kind: .notification), to: .users(try registerMany(t)))
        #expect(throws: (any Error).self) { try begin(store, e, count: Queue.maxAssembling, fail: true) }
        #expect(try begin(store, e, count: 1) == [.parts], "the rolled-back ones were forgotten")
    }

    @Test("sends waiting for a message with their key are bounded in all, and released by that message")
    func keyWaitersAreBounded() {
        var w = KeyWaiters(limit: 3)
        let ran = Locked(0)
        #expect(w.park(behind: "m1") { ran.withLock { $0 += 1 } })
        #expect(w.park(behind: "m1") { ran.withLock { $0 += 1 } })
        #expect(w.park(behind: "m2") { ran.withLock { $0 += 10 } })
        #expect(!w.park(behind: "m2") { ran.withLock { $0 += 100 } }, "the fourth is refused")
        #expect(w.count == 3)
        for retry in w.release("m1") { retry() }
        #expect(ran.withLock { $0 } == 2 && w.count == 1)
        #expect(w.release("m1").isEmpty, "released once")
        #expect(w.park(behind: "m3") {}, "room again")
        #expect(KeyWaiters().limit == KeyWaiters.defaultLimit)
    }
}
