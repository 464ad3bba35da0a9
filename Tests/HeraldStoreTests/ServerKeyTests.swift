import Foundation
import HeraldCore
import HeraldCrypto
import HeraldStore
import HeraldStoreTestSupport
import Testing

/// The VAPID key a Web Push subscription was made with (`devices.server_key`),
/// on both backends.
@Suite("Web Push server keys at the store level")
struct ServerKeyTests {
    static func web(_ user: String, key: String?) throws -> Registration {
        Registration(
            app: "default", user: user, platform: .web, environment: nil,
            token: "https://push.example.net/p/\(user)",
            keys: WebPushKeys(p256dh: try P256PrivateKey.generate().publicKey, auth: try SecureRandom.bytes(16)),
            serverKey: key)
    }

    static func byKey(_ t: TestStore) throws -> [String?: Int] {
        let counts = try t.store.sync { s, done in s.webSubscriptionsByKey(completion: done) }
        var out: [String?: Int] = [:]
        for c in counts {
            #expect(c.app == "default")
            out[c.serverKey, default: 0] += c.count
        }
        return out
    }

    @Test(
        "a Web Push registration records its key, a refresh replaces it, other platforms record none; claims carry it",
        arguments: StoreBackend.allCases)
    func recordedAndClaimed(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        let (a, b) = ("key-A", "key-B")
        let alice = try t.register(try Self.web("alice", key: a))
        _ = try t.register(try Self.web("bob", key: nil))
        var fcm = Registration(app: "default", user: "carol", platform: .fcm, environment: nil, token: "fcm-carol")
        fcm.serverKey = a
        _ = try t.register(fcm)
        #expect(try Self.byKey(t) == [a: 1, nil: 1], "only web rows count; the fcm row records none")

        // The browser subscribed again under another key: the refresh records it.
        var again = try Self.web("alice", key: b)
        again.token = "https://push.example.net/p/alice"
        let refreshed = try t.register(again)
        #expect(!refreshed.created && refreshed.deviceID == alice.deviceID)
        #expect(try Self.byKey(t) == [b: 1, nil: 1])

        // Claimed, and handed over at the enqueue: each job carries its device's key.
        _ = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["alice", "bob", "carol"])))
        let jobs = try t.claim()
        #expect(jobs.count == 3)
        #expect(
            Dictionary(uniqueKeysWithValues: jobs.map { ($0.user, $0.serverKey) }) == [
                "alice": b, "bob": nil, "carol": nil,
            ])
        let handed = try t.store.sync { s, done in
            s.enqueue(
                send(PushMessage(kind: .notification), to: .users(["alice"])),
                handoff: [QueueLane(app: "default", platform: .web): 1], limit: 1, completion: done)
        }
        #expect(handed.claim.jobs.map(\.serverKey) == [b])
    }

    @Test(
        "recordServerKey fills in only the web rows of that app that record no key; a second run changes nothing",
        arguments: StoreBackend.allCases)
    func recordMissing(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        _ = try t.register(try Self.web("old1", key: nil))
        _ = try t.register(try Self.web("old2", key: nil))
        _ = try t.register(try Self.web("kept", key: "key-B"))
        var other = try Self.web("elsewhere", key: nil)
        other.app = "other"
        _ = try t.register(other)
        _ = try t.register(Registration(app: "default", user: "f", platform: .fcm, environment: nil, token: "fcm-f"))

        let n = try t.store.sync { s, done in s.recordServerKey(app: "default", key: "key-A", completion: done) }
        #expect(n == 2)
        let counts = try t.store.sync { s, done in s.webSubscriptionsByKey(completion: done) }
        let byAppKey = Dictionary(uniqueKeysWithValues: counts.map { ("\($0.app)/\($0.serverKey ?? "-")", $0.count) })
        #expect(byAppKey == ["default/key-A": 2, "default/key-B": 1, "other/-": 1], "\(counts)")
        #expect(try t.store.sync { s, done in s.recordServerKey(app: "default", key: "key-A", completion: done) } == 0)
        let jobs = try {
            _ = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["old1", "kept", "f"])))
            return try t.claim()
        }()
        #expect(Set(jobs.compactMap(\.serverKey)) == ["key-A", "key-B"])
        #expect(jobs.first { $0.user == "f" }?.serverKey == nil)
    }
}
