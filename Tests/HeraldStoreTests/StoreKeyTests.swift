import Foundation
import HeraldCore
import HeraldCrypto
@testable import HeraldStore
import HeraldStoreTestSupport
import Testing

/// A SQLite database of its own, opened and reopened with chosen keys, and
/// edited behind the store's back (these tests reach into SQLite's file).
private struct KeyedDatabase {
    let scratch: StoreScratch
    let path: String
    let keyFile: String
    let clock = ManualClock()

    init() throws {
        scratch = try StoreScratch(.sqlite, prefix: "herald-key")
        path = scratch.databasePath
        keyFile = scratch.dir.appendingPathComponent("store.key").path
    }

    func open(_ supply: StoreKeySupply) throws -> any DeliveryStore {
        try scratch.open(keySupply: supply, keyFile: keyFile, clock: clock)
    }

    func open(_ key: StoreKey) throws -> any DeliveryStore { try open(.key(key)) }

    /// Opens with `key` and closes again; what the store did with the key.
    func outcome(_ key: StoreKey) throws -> StoreKeyOutcome {
        let store = try open(key)
        defer { store.close() }
        return store.keyOutcome
    }

    /// A connection of the test's own (a closing store may still be
    /// folding its log in: wait for it rather than fail).
    private func connect() throws -> Database {
        let db = try Database(path: path)
        sqlite3BusyTimeout(db, milliseconds: 5000)
        return db
    }

    /// The error opening with `supply` throws (nil when it opens).
    func refusal(_ supply: StoreKeySupply) -> StoreKeyError? {
        do {
            let store = try open(supply)
            store.close()
            return nil
        } catch let error as StoreKeyError {
            return error
        } catch {
            Issue.record("not a StoreKeyError: \(error)")
            return nil
        }
    }

    /// Works on the closed database directly (to damage a row, or make it
    /// look like a database from before check values).
    func edit(_ sql: String) throws {
        try connect().execute(sql)
    }

    func checkValue() throws -> [UInt8]? {
        let db = try connect()
        let stmt = try db.statement("SELECT value FROM store_meta WHERE name = 'key_check'")
        defer { stmt.reset() }
        return try stmt.step() ? stmt.blob(0) : nil
    }

    func remove() { scratch.remove() }
}

private func register(_ store: any DeliveryStore, _ r: Registration) throws -> RegistrationOutcome {
    try store.sync { s, done in s.register(r, deviceCap: 20, completion: done) }
}

private func fcm(_ user: String, _ token: String) -> Registration {
    Registration(app: "default", user: user, platform: .fcm, environment: nil, token: token)
}

private func web(_ user: String, _ token: String) -> Registration {
    Registration(
        app: "default", user: user, platform: .web, environment: nil, token: token,
        keys: WebPushKeys(p256dh: [4] + [UInt8](repeating: 7, count: 64), auth: [UInt8](repeating: 9, count: 16)))
}

private func claim(_ store: any DeliveryStore, _ limit: Int = 100) throws -> Claim {
    try store.sync { s, done in s.claimDue(limit: limit, completion: done) }
}

private func status(_ store: any DeliveryStore, _ id: String) throws -> MessageStatus {
    try #require(try store.sync { s, done in s.status(app: "default", messageID: id, detail: true, completion: done) })
}

/// Counts the calls of a `.missing` supply's `create`.
private final class KeyMaker {
    private(set) var calls = 0
    private(set) var made: StoreKey?

    var supply: StoreKeySupply {
        .missing(create: { [self] in
            calls += 1
            let key = try StoreKey.generate()
            made = key
            return key
        })
    }
}

@Suite("The store key is checked against the database")
struct StoreKeyTests {
    @Test("another key is refused, with an error naming the key file and the database; the right key opens it")
    func wrongKeyRefused() throws {
        let d = try KeyedDatabase()
        defer { d.remove() }
        let key = try StoreKey.generate()
        let store = try d.open(key)
        #expect(store.keyOutcome == .recorded(sealedRows: 0), "a new database records its key's check value")
        _ = try register(store, fcm("alice", "fcm-alice"))
        store.close()

        let error = try #require(d.refusal(.key(try StoreKey.generate())))
        #expect(error.problem == .checkValueDoesNotOpen)
        #expect(error.description.contains(d.keyFile) && error.description.contains(d.path), "\(error)")

        let again = try d.open(key)
        defer { again.close() }
        #expect(again.keyOutcome == .verified)
        let m = try again.sync { s, done in
            s.enqueue(send(PushMessage(kind: .notification), to: .users(["alice"])), completion: done)
        }
        #expect(try claim(again).jobs.map(\.token) == ["fcm-alice"])
        #expect(m.devices == 1)
    }

    @Test("the check value opens only with its key and holds neither the key nor its hash")
    func checkValueLeaksNothing() throws {
        let d = try KeyedDatabase()
        defer { d.remove() }
        let raw = try SecureRandom.bytes(StoreKey.byteCount)
        try d.open(try StoreKey(SecretBytes(copying: raw))).close()
        let value = try #require(try d.checkValue())
        #expect(value.count > StoreKeyCheck.plaintext.count, "sealed: nonce and tag around the constant")
        let bytes = Data(value)
        #expect(bytes.range(of: Data(raw)) == nil)
        #expect(bytes.range(of: Data(SHA256.hash(raw))) == nil)
        #expect(bytes.range(of: Data(StoreKeyCheck.plaintext)) == nil, "the constant is sealed, not stored")
        #expect(StoreKeyCheck.opens(value, with: try StoreKey(SecretBytes(copying: raw))))
        #expect(!StoreKeyCheck.opens(value, with: try StoreKey.generate()))
    }

    @Test("no key file: a key is created (once) only for an empty database; one holding data is refused")
    func missingKey() throws {
        let d = try KeyedDatabase()
        defer { d.remove() }
        let maker = KeyMaker()
        let store = try d.open(maker.supply)
        #expect(store.keyOutcome == .created && maker.calls == 1)
        let device = try register(store, fcm("bob", "fcm-bob"))
        store.close()
        let made = try #require(maker.made)
        #expect(try d.outcome(made) == .verified)

        // Devices: refused, and no key is made.
        let refuse = KeyMaker()
        let error = try #require(d.refusal(refuse.supply))
        #expect(error.problem == .keyMissing(devices: 1, messages: 0, deliveries: 0))
        #expect(refuse.calls == 0, "no key is created for a database holding data")
        #expect(error.description.contains(d.keyFile) && error.description.contains(d.path), "\(error)")

        // Messages but no devices any more: still data, still refused.
        let reopened = try d.open(made)
        _ = try reopened.sync { s, done in
            s.enqueue(send(PushMessage(kind: .notification), to: .devices([device.deviceID])), completion: done)
        }
        _ = try reopened.sync { s, done in s.forget(app: "default", user: "bob", completion: done) }
        reopened.close()
        let messagesOnly = KeyMaker()
        #expect(d.refusal(messagesOnly.supply)?.problem == .keyMissing(devices: 0, messages: 1, deliveries: 0))
        #expect(messagesOnly.calls == 0)

        // Emptied: a new key may be made, and it replaces the check value.
        try d.edit("DELETE FROM messages")
        let fresh = KeyMaker()
        try d.open(fresh.supply).close()
        #expect(fresh.calls == 1)
        #expect(d.refusal(.key(made))?.problem == .checkValueDoesNotOpen, "the old key no longer opens it")
        #expect(try d.outcome(try #require(fresh.made)) == .verified)
    }

    @Test("a database from before check values: the right key records one; a key no row opens with is refused")
    func migration() throws {
        let d = try KeyedDatabase()
        defer { d.remove() }
        let key = try StoreKey.generate()
        let store = try d.open(key)
        var ids: [String] = []
        for i in 0..<3 { ids.append(try register(store, fcm("u\(i)", "fcm-\(i)")).deviceID) }
        store.close()
        // As schema version 4 left it: no store_meta. The first row is
        // damaged too: one bad row does not decide.
        try d.edit(
            """
            DROP TRIGGER devices_deleted_activities; DROP TRIGGER devices_moved_activities;
            DROP INDEX devices_by_parent; DROP INDEX devices_by_activity; DROP TABLE activity_high_sends;
            ALTER TABLE devices DROP COLUMN parent_device_id; ALTER TABLE devices DROP COLUMN activity_role;
            ALTER TABLE devices DROP COLUMN activity_type; ALTER TABLE devices DROP COLUMN activity_id;
            DROP TABLE store_meta; ALTER TABLE deliveries DROP COLUMN sent_by; ALTER TABLE devices DROP COLUMN enabled;
            ALTER TABLE devices DROP COLUMN bundle_id; ALTER TABLE devices DROP COLUMN server_key;
            ALTER TABLE devices DROP COLUMN app_id; ALTER TABLE devices DROP COLUMN user_agent;
            ALTER TABLE deliveries DROP COLUMN shrunk; DROP TABLE assembling;
            DROP TRIGGER deliveries_inserted_final; DROP TRIGGER deliveries_finished; DROP TABLE attempts;
            DROP TRIGGER deliveries_inserted_held; ALTER TABLE devices DROP COLUMN time_zone;
            ALTER TABLE devices DROP COLUMN quiet_hours; ALTER TABLE devices DROP COLUMN topics;
            ALTER TABLE deliveries DROP COLUMN held_until; ALTER TABLE deliveries DROP COLUMN timing;
            DROP TABLE events; DROP INDEX deliveries_live_by_message; ALTER TABLE deliveries DROP COLUMN evented;
            PRAGMA user_version = 4;
            UPDATE devices SET token_sealed = zeroblob(length(token_sealed)) WHERE device_id = '\(ids[0])';
            """)

        let error = try #require(d.refusal(.key(try StoreKey.generate())))
        #expect(error.problem == .noSealedRowOpens(devices: 3))
        #expect(error.description.contains(d.keyFile) && error.description.contains(d.path), "\(error)")
        #expect(d.refusal(KeyMaker().supply)?.problem == .keyMissing(devices: 3, messages: 0, deliveries: 0))

        #expect(try d.outcome(key) == .recorded(sealedRows: 3))
        #expect(try d.checkValue() != nil)
        #expect(try d.outcome(key) == .verified)
        #expect(d.refusal(.key(try StoreKey.generate()))?.problem == .checkValueDoesNotOpen)
    }

    @Test("a row that does not open fails its delivery alone (unreadable_row); the others are sent; nothing stalls")
    func unreadableRow() throws {
        let d = try KeyedDatabase()
        defer { d.remove() }
        let key = try StoreKey.generate()
        let setup = try d.open(key)
        let good = try (0..<3).map { try register(setup, fcm("good\($0)", "fcm-good-\($0)")).deviceID }
        let goodWeb = try register(setup, web("webgood", "https://push.example.net/good")).deviceID
        let badToken = try register(setup, fcm("bad", "fcm-bad")).deviceID
        let badKeys = try register(setup, web("webbad", "https://push.example.net/bad")).deviceID
        setup.close()
        // One token damaged in place; one row's Web Push keys cut short.
        try d.edit(
            """
            UPDATE devices SET token_sealed = zeroblob(length(token_sealed)) WHERE device_id = '\(badToken)';
            UPDATE devices SET keys_sealed = substr(keys_sealed, 1, 20) WHERE device_id = '\(badKeys)';
            """)
        let store = try d.open(key)
        defer { store.close() }
        #expect(store.keyOutcome == .verified, "the key is right: only two rows are damaged")
        let everyone = ["good0", "good1", "good2", "webgood", "bad", "webbad"]
        let m = try store.sync { s, done in
            s.enqueue(send(PushMessage(kind: .notification), to: .users(everyone)), completion: done)
        }
        #expect(m.devices == 6)

        let first = try claim(store)
        #expect(Set(first.jobs.map(\.deviceID)) == Set(good + [goodWeb]), "the good rows are claimed, in one claim")
        #expect(first.jobs.first { $0.deviceID == goodWeb }?.keys?.auth == [UInt8](repeating: 9, count: 16))
        #expect(first.finished.count == 2, "the two unreadable ones are reported final")
        #expect(Set(first.unreadable.map(\.deviceID)) == [badToken, badKeys], "and named, for the log")
        #expect(first.batchSizes[BatchKey(messageID: m.messageID, platform: .fcm)] == 4)
        let s = try status(store, m.messageID)
        #expect(s.counts[.failed] == 2 && s.counts[.inFlight] == 4)
        for id in [badToken, badKeys] {
            let row = s.devices?.first { $0.deviceID == id }
            #expect(row?.state == .failed && row?.reason == "unreadable_row", "\(id): \(String(describing: row))")
        }
        let listed = try store.sync { s, done in s.list(app: "default", user: "bad", completion: done) }
        #expect(listed.first?.lastFailureReason == "unreadable_row", "device.list tells the operator")

        // Nothing is left to retry; the next message's good deliveries flow again.
        #expect(try claim(store).jobs.isEmpty)
        for job in first.jobs {
            try store.sync { s, done in
                s.record(
                    deliveryID: job.deliveryID, state: .delivered, httpStatus: 200, reason: nil, nextAttemptAt: nil,
                    completion: done)
            }
        }
        #expect(try status(store, m.messageID).isComplete)
        d.clock.advance(1000)
        let next = try store.sync { s, done in
            s.enqueue(send(PushMessage(kind: .notification), to: .users(everyone)), completion: done)
        }
        let second = try claim(store)
        #expect(second.jobs.count == 4 && second.jobs.allSatisfy { $0.messageID == next.messageID })
    }

    @Test("a message handed straight to an idle scheduler hands over the good rows only; the claim fails the bad one")
    func unreadableRowAtHandoff() throws {
        let d = try KeyedDatabase()
        defer { d.remove() }
        let key = try StoreKey.generate()
        let setup = try d.open(key)
        let good = try register(setup, fcm("good", "fcm-good")).deviceID
        let bad = try register(setup, fcm("bad", "fcm-bad")).deviceID
        setup.close()
        try d.edit("UPDATE devices SET token_sealed = x'00' WHERE device_id = '\(bad)'")
        let store = try d.open(key)
        defer { store.close() }
        let lane = QueueLane(app: "default", platform: .fcm)
        let (accepted, handed) = try store.sync { s, done in
            s.enqueue(
                send(PushMessage(kind: .notification), to: .users(["good", "bad"])), handoff: [lane: 10], limit: 10,
                completion: done)
        }
        #expect(accepted.devices == 2, "the message is accepted whole")
        #expect(handed.jobs.map(\.deviceID) == [good] && handed.jobs.first?.token == "fcm-good")
        let after = try claim(store)
        #expect(after.jobs.isEmpty && after.finished == [BatchKey(messageID: accepted.messageID, platform: .fcm)])
        let s = try status(store, accepted.messageID)
        #expect(s.devices?.first { $0.deviceID == bad }?.reason == "unreadable_row")
        #expect(s.counts[.failed] == 1 && s.counts[.inFlight] == 1)
    }
}
