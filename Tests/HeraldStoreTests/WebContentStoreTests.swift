import CSQLite
import Foundation
import HeraldCore
import HeraldCrypto
import HeraldStore
import HeraldStoreTestSupport
import Postgres
import Testing

/// `web_payload` and `shrink` kept with the message, and `deliveries.shrunk`,
/// on both backends. The ring goes to a Web Push-form `fcm` registration
/// (a `web` one takes no rings).
@Suite("web_payload at rest and shrunk")
struct WebContentStoreTests {
    static let marker = "caller-name-Zoë-7f3a"

    static func message() -> PushMessage {
        var m = PushMessage(kind: .callRing, data: [("call", "c1")], collapseKey: "call:c1")
        m.webContent = WebContent(
            payload: #"{"type":"call_ring","caller":{"name":"\#(marker)","avatar":"https://x.example/a.png"}}"#,
            shrink: [.drop(["/caller/avatar", "/media~1x"]), .shorten("/caller/name"), .keep(["/type"])])
        return m
    }

    @Test(
        "the content comes back whole after a restart, is never in the database in the clear, and shrunk is recorded",
        arguments: StoreBackend.allCases)
    func durable(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        let web = try Registration(
            app: "default", user: "u", platform: .fcm, environment: nil, token: "https://push.example.net/p/1",
            keys: WebPushKeys(p256dh: P256PrivateKey.generate().publicKey, auth: SecureRandom.bytes(16)))
        let device = try t.register(web).deviceID
        let plain = Self.message()
        let accepted = try t.enqueue(send(plain, to: .users(["u"])))
        t.store.close()

        // At rest: the content nowhere in the clear, the steps (field names only) there.
        let stored: [UInt8]
        switch backend {
        case .sqlite:
            var bytes: [UInt8] = []
            for name in ["herald.db", "herald.db-wal"] {
                let path = t.dir.appendingPathComponent(name).path
                let size = (try? FileManager.default.attributesOfItem(atPath: path)[.size] as? Int) ?? 0
                if size > 0, let data = FileManager.default.contents(atPath: path) { bytes += [UInt8](data) }
            }
            stored = bytes
        case .postgres:
            let c = PostgresConnection(configuration: try #require(t.scratch.postgres).connection)
            defer { c.close() }
            stored = Array(
                try c.execute("SELECT payload FROM messages").rows.map { try $0.text(0) }.joined().utf8)
        }
        #expect(!stored.isEmpty)
        #expect(!contains(stored, Array(Self.marker.utf8)))
        #expect(!contains(stored, Array("x.example".utf8)))
        #expect(contains(stored, Array("/caller/avatar".utf8)))

        let store = try t.reopen()
        defer {
            store.close()
            t.scratch.remove()
        }
        let claim = try store.sync { s, done in s.claimDue(limit: 10, completion: done) }
        let job = try #require(claim.jobs.first)
        #expect(job.message.webContent == plain.webContent)
        #expect(job.message == plain)

        // shrunk: written when a record was sealed, left alone otherwise.
        func record(_ state: DeliveryState, _ shrink: ShrinkOutcome?) throws {
            try store.sync { s, done in
                s.record(
                    [
                        DeliveryRecord(
                            deliveryID: job.deliveryID, deviceID: device, state: state, httpStatus: 503,
                            reason: "x", nextAttemptAt: t.clock.nowMilliseconds(), shrink: shrink)
                    ], completion: done)
            }
        }
        func shrunk() throws -> Int?? {
            let s = try store.sync { s, done in
                s.status(app: "default", messageID: accepted.messageID, detail: true, completion: done)
            }
            return s?.devices?.first.map(\.shrunk)
        }
        #expect(try shrunk() == .some(nil))
        try record(.retrying, .step(2))
        #expect(try shrunk() == .some(2))
        // An attempt that sealed nothing (a DNS failure) keeps it.
        _ = try store.sync { s, done in s.claimDue(limit: 10, completion: done) }
        try record(.retrying, nil)
        #expect(try shrunk() == .some(2))
        // One that sealed the payload whole clears it.
        _ = try store.sync { s, done in s.claimDue(limit: 10, completion: done) }
        try record(.delivered, .whole)
        #expect(try shrunk() == .some(nil))
    }

    @Test(
        "a stored web_payload that does not open fails that delivery alone; other messages go on",
        arguments: StoreBackend.allCases)
    func unreadable(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        let web = try Registration(
            app: "default", user: "x", platform: .fcm, environment: nil, token: "https://push.example.net/p/3",
            keys: WebPushKeys(p256dh: P256PrivateKey.generate().publicKey, auth: SecureRandom.bytes(16)))
        _ = try t.register(web)
        var damaged = Self.message()
        damaged.collapseKey = "a"
        let bad = try t.enqueue(send(damaged, to: .users(["x"])))
        // Another ciphertext in its place: it no longer opens with the store key.
        let sql = """
            UPDATE messages SET payload = replace(payload, '"web":"', '"web":"AAAA') WHERE message_id = '\(bad.messageID)'
            """
        switch backend {
        case .sqlite:
            var db: OpaquePointer?
            #expect(sqlite3_open(t.scratch.databasePath, &db) == SQLITE_OK)
            defer { sqlite3_close(db) }
            #expect(sqlite3_exec(db, sql, nil, nil, nil) == SQLITE_OK)
            #expect(sqlite3_changes(db) == 1)
        case .postgres:
            let c = PostgresConnection(configuration: try #require(t.scratch.postgres).connection)
            defer { c.close() }
            #expect(try c.execute(sql).affectedRows == 1)
        }
        var fine = Self.message()
        fine.collapseKey = "b"
        let good = try t.enqueue(send(fine, to: .users(["x"])))
        let jobs = try t.claim()
        #expect(jobs.map(\.messageID) == [good.messageID])
        #expect(jobs.first?.message.webContent == fine.webContent)
        let status = try #require(try t.status(bad.messageID))
        #expect(status.devices?.first?.state == .failed)
        #expect(status.devices?.first?.reason == "unreadable stored message")
    }
}
