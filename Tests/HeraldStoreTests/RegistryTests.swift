import CSQLite
import Foundation
import HeraldCore
import HeraldCrypto
import HeraldStore
import HeraldStoreTestSupport
import HeraldTestSupport
import Postgres
import Testing

/// A clock the test moves by hand.
final class ManualClock: WallClock, @unchecked Sendable {
    private let lock = NSLock()
    private var now: Int64 = 1_800_000_000_000
    func nowMilliseconds() -> Int64 { lock.withLock { now } }
    func advance(_ ms: Int64) { lock.withLock { now += ms } }
}

/// A store of one backend for one test, with a clock the test moves.
struct TestStore {
    let scratch: StoreScratch
    let store: any DeliveryStore
    let key: StoreKey
    let clock = ManualClock()

    var backend: StoreBackend { scratch.backend }
    var dir: URL { scratch.dir }

    /// `keyBytes`: the store key's 32 bytes (a fresh random key when nil).
    init(_ backend: StoreBackend, synchronous: Synchronous = .normal, keyBytes: [UInt8]? = nil) throws {
        scratch = try StoreScratch(backend)
        key = try keyBytes.map { try StoreKey(SecretBytes(copying: $0)) } ?? StoreKey.generate()
        store = try scratch.open(key: key, clock: clock, synchronous: synchronous)
    }

    /// The same store opened again (after `store.close()`: a restart).
    func reopen(synchronous: Synchronous = .normal, instance: String = "test-instance") throws -> any DeliveryStore {
        try scratch.open(key: key, clock: clock, synchronous: synchronous, instance: instance)
    }

    func register(_ r: Registration, cap: Int = 20) throws -> RegistrationOutcome {
        try store.sync { s, done in s.register(r, deviceCap: cap, completion: done) }
    }

    func list(_ user: String, app: String = "default") throws -> [DeviceSummary] {
        try store.sync { s, done in s.list(app: app, user: user, completion: done) }
    }

    func close() {
        store.close()
        scratch.remove()
    }
}

func apns(
    _ user: String, _ token: String, rid: String? = nil, version: Int64? = nil, name: String? = nil
) -> Registration {
    Registration(
        app: "default", user: user, platform: .apns, environment: .production, token: token, name: name,
        registrationID: rid, version: version)
}

@Suite("Registry rules at the store level")
struct RegistryTests {
    @Test("the same user re-registering updates in place and keeps omitted fields", arguments: StoreBackend.allCases)
    func refresh(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
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

    @Test(
        "another user's binding is reclaimed: old row deleted, new id for the caller", arguments: StoreBackend.allCases)
    func reclaim(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        let a = try t.register(apns("alice", "aa02", name: "shared"))
        let b = try t.register(apns("bob", "aa02"))
        #expect(b.created && b.reclaimed && b.deviceID != a.deviceID)
        #expect(try t.list("alice").isEmpty)
        #expect(try t.list("bob").first?.name == nil)
    }

    @Test("over the cap the least recently registered are evicted", arguments: StoreBackend.allCases)
    func eviction(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
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

    @Test("versions order registrations; tombstones block older ones", arguments: StoreBackend.allCases)
    func versions(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
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
        let t = try TestStore(.sqlite, synchronous: .full)
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
        t.scratch.remove()
    }
}

/// The sealed columns of the store's device rows, read from the database
/// without Herald.
private func sealedColumns(_ t: TestStore) throws -> [(deviceID: String, token: [UInt8], keys: [UInt8]?)] {
    switch t.backend {
    case .sqlite: try sqliteSealedColumns(t.scratch.databasePath)
    case .postgres: try postgresSealedColumns(t.scratch.postgres!.connection)
    }
}

/// The sealed columns of the store's device rows, read with libpq directly.
private func postgresSealedColumns(
    _ configuration: PostgresConfiguration
) throws
    -> [(deviceID: String, token: [UInt8], keys: [UInt8]?)]
{
    let c = PostgresConnection(configuration: configuration)
    defer { c.close() }
    return try c.execute("SELECT device_id, token_sealed, keys_sealed FROM devices").rows.map {
        (try $0.text(0), try $0.bytes(1), try $0.optionalBytes(2))
    }
}

/// The sealed columns of the store's device rows, read with SQLite directly.
private func sqliteSealedColumns(_ path: String) throws -> [(deviceID: String, token: [UInt8], keys: [UInt8]?)] {
    var db: OpaquePointer?
    guard sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, nil) == SQLITE_OK else { throw HarnessError("open \(path)") }
    defer { sqlite3_close(db) }
    var stmt: OpaquePointer?
    guard
        sqlite3_prepare_v2(db, "SELECT device_id, token_sealed, keys_sealed FROM devices", -1, &stmt, nil) == SQLITE_OK
    else { throw HarnessError(String(cString: sqlite3_errmsg(db))) }
    defer { sqlite3_finalize(stmt) }
    func blob(_ column: Int32) -> [UInt8]? {
        guard sqlite3_column_type(stmt, column) == SQLITE_BLOB, let p = sqlite3_column_blob(stmt, column) else {
            return nil
        }
        return Array(UnsafeRawBufferPointer(start: p, count: Int(sqlite3_column_bytes(stmt, column))))
    }
    var rows: [(String, [UInt8], [UInt8]?)] = []
    while sqlite3_step(stmt) == SQLITE_ROW {
        rows.append((String(cString: sqlite3_column_text(stmt, 0)), blob(1) ?? [], blob(2)))
    }
    return rows
}

@Suite("Device secrets at rest, read back without Herald")
struct SealedRowTests {
    /// A value of Herald's at-rest format, opened with libsodium directly:
    /// 0x01 || nonce (24) || XChaCha20-Poly1305 ciphertext || tag (16).
    private func open(_ sealed: [UInt8], ad: String, key: [UInt8]) throws -> [UInt8]? {
        guard sealed.count >= 1 + 24 + 16, sealed[0] == 0x01 else { return nil }
        return try Libsodium.xchacha20poly1305Decrypt(
            ciphertext: Array(sealed[25...]), ad: Array(ad.utf8), nonce: Array(sealed[1..<25]), key: key)
    }

    @Test(
        "the token and key columns are XChaCha20-Poly1305 under the store key, bound to their device_id",
        arguments: StoreBackend.allCases)
    func rowsOpenWithLibsodium(_ backend: StoreBackend) throws {
        let keyBytes = (0..<32).map { UInt8(0x20 + $0) }
        let t = try TestStore(backend, synchronous: .full, keyBytes: keyBytes)
        defer { t.close() }
        let token = "f00dfeedcafe0123456789abcdef0123456789abcdef0123456789abcdef0001"
        let endpoint = "https://push.example.net/p/secret-endpoint-123"
        let p256dh = try P256PrivateKey.generate().publicKey
        let auth = try SecureRandom.bytes(16)
        let apnsID = try t.register(apns("erin", token)).deviceID
        let webID = try t.register(
            Registration(
                app: "default", user: "erin", platform: .web, environment: nil, token: endpoint,
                keys: WebPushKeys(p256dh: p256dh, auth: auth))
        ).deviceID
        let rows = try sealedColumns(t)
        let byID = Dictionary(uniqueKeysWithValues: rows.map { ($0.deviceID, $0) })
        let apnsRow = try #require(byID[apnsID])
        let webRow = try #require(byID[webID])
        #expect(apnsRow.token.count == 1 + 24 + token.utf8.count + 16)
        #expect(try open(apnsRow.token, ad: "token:\(apnsID)", key: keyBytes) == Array(token.utf8))
        #expect(apnsRow.keys == nil)
        #expect(try open(webRow.token, ad: "token:\(webID)", key: keyBytes) == Array(endpoint.utf8))
        #expect(try open(try #require(webRow.keys), ad: "keys:\(webID)", key: keyBytes) == p256dh + auth)
        // The binding is real: under another row's context, or another key, nothing opens.
        #expect(try open(apnsRow.token, ad: "token:\(webID)", key: keyBytes) == nil)
        #expect(try open(webRow.keys ?? [], ad: "token:\(webID)", key: keyBytes) == nil)
        #expect(try open(apnsRow.token, ad: "token:\(apnsID)", key: keyBytes.reversed()) == nil)
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
