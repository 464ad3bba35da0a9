import Foundation
import HeraldCore
import HeraldCrypto
import HeraldStore
import Testing

/// A clock the test moves by hand.
final class ManualClock: WallClock, @unchecked Sendable {
    private let lock = NSLock()
    private var now: Int64 = 1_800_000_000_000
    func nowMilliseconds() -> Int64 { lock.withLock { now } }
    func advance(_ ms: Int64) { lock.withLock { now += ms } }
}

struct TestStore {
    let dir: URL
    let store: Store
    let key: StoreKey
    let clock = ManualClock()

    init(synchronous: Synchronous = .normal) throws {
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("herald-store-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        key = try StoreKey.generate()
        store = try Store(
            path: dir.appendingPathComponent("herald.db").path, key: key, synchronous: synchronous, clock: clock)
    }

    func register(_ r: Registration, cap: Int = 20) throws -> RegistrationOutcome {
        try store.sync { s, done in s.register(r, deviceCap: cap, completion: done) }
    }

    func list(_ user: String, app: String = "default") throws -> [DeviceSummary] {
        try store.sync { s, done in s.list(app: app, user: user, completion: done) }
    }

    func close() {
        store.close()
        try? FileManager.default.removeItem(at: dir)
    }
}

func apns(_ user: String, _ token: String, rid: String? = nil, version: Int64? = nil, name: String? = nil) -> Registration {
    Registration(
        app: "default", user: user, platform: .apns, environment: .production, token: token, name: name,
        registrationID: rid, version: version)
}

@Suite("Registry rules at the store level")
struct RegistryTests {
    @Test("the same user re-registering updates in place and keeps omitted fields")
    func refresh() throws {
        let t = try TestStore()
        defer { t.close() }
        let a = try t.register(apns("alice", "aa01", name: "phone"))
        #expect(a.created && !a.reclaimed)
        #expect(a.deviceID.count == 32)
        #expect(a.tokenHash == SHA256.hex("push:aa01"))
        t.clock.advance(1000)
        let b = try t.register(apns("alice", "aa01"))
        #expect(!b.created && b.deviceID == a.deviceID)
        let devices = try t.list("alice")
        #expect(devices.count == 1)
        #expect(devices[0].name == "phone")
        #expect(devices[0].registeredAt == devices[0].createdAt + 1000)
    }

    @Test("another user's binding is reclaimed: old row deleted, new id for the caller")
    func reclaim() throws {
        let t = try TestStore()
        defer { t.close() }
        let a = try t.register(apns("alice", "aa02", name: "shared"))
        let b = try t.register(apns("bob", "aa02"))
        #expect(b.created && b.reclaimed && b.deviceID != a.deviceID)
        #expect(try t.list("alice").isEmpty)
        #expect(try t.list("bob").first?.name == nil)
    }

    @Test("over the cap the least recently registered are evicted")
    func eviction() throws {
        let t = try TestStore()
        defer { t.close() }
        var ids: [String] = []
        for i in 0..<3 {
            ids.append(try t.register(apns("carol", "c\(i)"), cap: 3).deviceID)
            t.clock.advance(10)
        }
        _ = try t.register(apns("carol", "c0"), cap: 3)  // refresh c0: c1 is now the oldest
        t.clock.advance(10)
        let r = try t.register(apns("carol", "c3"), cap: 3)
        #expect(r.evicted == [ids[1]])
        #expect(try t.list("carol").count == 3)
    }

    @Test("versions order registrations; tombstones block older ones")
    func versions() throws {
        let t = try TestStore()
        defer { t.close() }
        let a = try t.register(apns("dave", "d1", rid: "inst-1", version: 2))
        #expect(a.deviceID == Identity.deviceID(user: "dave", app: "default", registrationID: "inst-1"))
        #expect(throws: RegistrationConflict.self) { try t.register(apns("dave", "d0", rid: "inst-1", version: 1)) }
        #expect(throws: RegistrationConflict.self) { try t.register(apns("dave", "d9", rid: "inst-1", version: 2)) }
        #expect(try !t.register(apns("dave", "d1", rid: "inst-1", version: 2)).created)
        let moved = try t.register(apns("dave", "d2", rid: "inst-1", version: 3))
        #expect(moved.deviceID == a.deviceID && !moved.created)
        #expect(try t.list("dave").map(\.tokenHash) == [Identity.tokenHash("d2")])
        let removed = try t.store.sync { s, done in
            s.unregister(app: "default", user: "dave", .registration(id: "inst-1", version: 3), completion: done)
        }
        #expect(removed == 1)
        #expect(throws: RegistrationConflict.self) { try t.register(apns("dave", "d2", rid: "inst-1", version: 3)) }
        #expect(try t.register(apns("dave", "d4", rid: "inst-1", version: 4)).created)
    }

    @Test("the database file never contains a raw token or key")
    func sealedAtRest() throws {
        let t = try TestStore(synchronous: .full)
        let token = "f00dfeedcafe0123456789abcdef0123456789abcdef0123456789abcdef0001"
        let p256dh = try P256PrivateKey.generate().publicKey
        let auth = try SecureRandom.bytes(16)
        _ = try t.register(apns("erin", token, name: "ipad"))
        _ = try t.register(
            Registration(
                app: "default", user: "erin", platform: .web, environment: nil,
                token: "https://push.example.net/p/secret-endpoint-123", keys: WebPushKeys(p256dh: p256dh, auth: auth)))
        t.store.close()
        var bytes: [UInt8] = []
        for name in ["herald.db", "herald.db-wal"] {
            let path = t.dir.appendingPathComponent(name).path
            // The close leaves an empty -wal; FileManager.contents(atPath:) leaks its
            // 4 KiB buffer on an empty file (LeakSanitizer in make test-sanitize).
            let size = (try? FileManager.default.attributesOfItem(atPath: path)[.size] as? Int) ?? 0
            if size > 0, let data = FileManager.default.contents(atPath: path) {
                bytes += [UInt8](data)
            }
        }
        #expect(!bytes.isEmpty)
        for needle in [Array(token.utf8), Array("secret-endpoint-123".utf8), p256dh, auth] {
            #expect(!contains(bytes, needle))
        }
        try? FileManager.default.removeItem(at: t.dir)
    }
}

func contains(_ haystack: [UInt8], _ needle: [UInt8]) -> Bool {
    guard needle.count <= haystack.count, let first = needle.first else { return false }
    var i = 0
    while i + needle.count <= haystack.count {
        if haystack[i] == first && Array(haystack[i..<i + needle.count]) == needle { return true }
        i += 1
    }
    return false
}
