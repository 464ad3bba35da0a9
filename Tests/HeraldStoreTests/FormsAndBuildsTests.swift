import CSQLite
import Foundation
import HeraldCore
import HeraldCrypto
import HeraldStore
import HeraldStoreTestSupport
import HeraldTestSupport
import Postgres
import Testing

/// Registration forms (Web Push or legacy) on every platform, client builds
/// (`app_id`, `user_agent`) and the routing of kinds by platform and form, at
/// the store level.
@Suite("Registration forms, client builds and routing at the store level")
struct FormsAndBuildsTests {
    static let keys = WebPushKeys(
        p256dh: [4] + [UInt8](repeating: 7, count: 64), auth: [UInt8](repeating: 9, count: 16))

    static func reg(
        _ user: String, _ platform: Platform, _ token: String, keys: WebPushKeys? = nil, appID: String = "stable",
        userAgent: String? = nil
    ) -> Registration {
        Registration(
            app: "default", user: user, platform: platform, environment: platform.hasEnvironment ? .production : nil,
            token: token, keys: keys, appID: appID, userAgent: userAgent)
    }

    /// The id a device got before client builds existed: the first 32 hex
    /// characters of SHA-256 over "dev:bind", user, app, platform,
    /// environment and token, joined with NUL.
    static func idBeforeBuilds(_ fields: [String]) -> String {
        var bytes: [UInt8] = []
        for (i, field) in (["dev:bind"] + fields).enumerated() {
            if i > 0 { bytes.append(0) }
            bytes += Array(field.utf8)
        }
        return String(SHA256.hex(bytes).prefix(32))
    }

    @Test(
        "a stable registration keeps the id it had before builds existed, and re-registering finds it",
        arguments: StoreBackend.allCases)
    func stableIDsUnchanged(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        let a = try t.register(apns("alice", "aa01"))
        #expect(a.deviceID == Self.idBeforeBuilds(["alice", "default", "apns", "production", "aa01"]))
        let f = try t.register(Self.reg("alice", .fcm, "fcm-a"))
        #expect(f.deviceID == Self.idBeforeBuilds(["alice", "default", "fcm", "", "fcm-a"]))
        // The same registration named explicitly as stable is the same device.
        let again = try t.register(Self.reg("alice", .apns, "aa01", appID: "stable"))
        #expect(again.deviceID == a.deviceID && !again.created)
        // Across a restart too (the binding is found in the stored rows).
        try t.reopen(instance: "test-restarted").close()
        let afterRestart = try t.register(apns("alice", "aa01"))
        #expect(afterRestart.deviceID == a.deviceID && !afterRestart.created)
        #expect(try t.list("alice").map(\.appID) == ["stable", "stable"])
    }

    /// SHA-256 of the fields joined with NUL, as the binding hash was before builds existed.
    static func joinedHash(_ fields: [String]) -> [UInt8] {
        var bytes: [UInt8] = []
        for (i, field) in fields.enumerated() {
            if i > 0 { bytes.append(0) }
            bytes += Array(field.utf8)
        }
        return SHA256.hash(bytes)
    }

    /// (device_id, binding_hash, app_id) of every stored row, read without Herald.
    static func storedBindings(_ t: TestStore) throws -> [String: (binding: [UInt8], appID: String)] {
        var out: [String: (binding: [UInt8], appID: String)] = [:]
        switch t.backend {
        case .sqlite:
            var db: OpaquePointer?
            guard sqlite3_open_v2(t.scratch.databasePath, &db, SQLITE_OPEN_READONLY, nil) == SQLITE_OK else {
                throw HarnessError("open")
            }
            defer { sqlite3_close(db) }
            var stmt: OpaquePointer?
            guard
                sqlite3_prepare_v2(db, "SELECT device_id, binding_hash, app_id FROM devices", -1, &stmt, nil)
                    == SQLITE_OK
            else { throw HarnessError(String(cString: sqlite3_errmsg(db))) }
            defer { sqlite3_finalize(stmt) }
            while sqlite3_step(stmt) == SQLITE_ROW {
                let p = sqlite3_column_blob(stmt, 1)!
                let hash = Array(UnsafeRawBufferPointer(start: p, count: Int(sqlite3_column_bytes(stmt, 1))))
                out[String(cString: sqlite3_column_text(stmt, 0))] = (
                    hash, String(cString: sqlite3_column_text(stmt, 2))
                )
            }
        case .postgres:
            let c = PostgresConnection(configuration: t.scratch.postgres!.connection)
            defer { c.close() }
            for r in try c.execute("SELECT device_id, binding_hash, app_id FROM devices").rows {
                out[try r.text(0)] = (try r.bytes(1), String(decoding: try r.bytes(2), as: UTF8.self))
            }
        }
        return out
    }

    @Test(
        "a stable registration's binding hash is the one rows stored before builds have; another build's differs",
        arguments: StoreBackend.allCases)
    func stableBindingUnchanged(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        let a = try t.register(apns("alice", "aa01"))
        let beta = try t.register(Self.reg("alice", .apns, "aa01", appID: "beta"))
        let rows = try Self.storedBindings(t)
        let before = Self.joinedHash(["bind", "default", "apns", "production", "aa01"])
        #expect(rows[a.deviceID]?.binding == before && rows[a.deviceID]?.appID == "stable")
        #expect(rows[beta.deviceID]?.binding != before && rows[beta.deviceID]?.appID == "beta")
    }

    @Test(
        "one token under two builds is two registrations; unregistering by values with app_id removes only that one",
        arguments: StoreBackend.allCases)
    func twoBuilds(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        let stable = try t.register(Self.reg("alice", .fcm, "fcm-shared"))
        let beta = try t.register(Self.reg("alice", .fcm, "fcm-shared", appID: "beta", userAgent: "Chat/4.0 beta"))
        #expect(beta.created && beta.deviceID != stable.deviceID)
        #expect(
            beta.deviceID
                == Identity.deviceID(
                    user: "alice", app: "default", platform: .fcm, environment: nil, token: "fcm-shared", appID: "beta")
        )
        let canary = try t.register(Self.reg("alice", .fcm, "fcm-shared", appID: "canary"))
        #expect(Set([stable.deviceID, beta.deviceID, canary.deviceID]).count == 3)
        // The same four values give the same id again.
        let betaAgain = try t.register(Self.reg("alice", .fcm, "fcm-shared", appID: "beta"))
        #expect(betaAgain.deviceID == beta.deviceID && !betaAgain.created)

        let listed = try t.list("alice")
        #expect(Set(listed.map(\.appID)) == ["stable", "beta", "canary"])
        let betaRow = try #require(listed.first { $0.deviceID == beta.deviceID })
        #expect(betaRow.userAgent == "Chat/4.0 beta", "a re-registration without user_agent keeps it")
        #expect(listed.first { $0.deviceID == stable.deviceID }?.userAgent == nil)

        func unregister(_ appID: String) throws -> Int {
            try t.store.sync { s, done in
                s.unregister(
                    app: "default", user: "alice",
                    .binding(platform: .fcm, environment: nil, token: "fcm-shared", appID: appID), completion: done)
            }
        }
        #expect(try unregister("beta") == 1)
        #expect(Set(try t.list("alice").map(\.deviceID)) == [stable.deviceID, canary.deviceID])
        #expect(try unregister("nightly") == 0, "a build never registered removes nothing")
        // Without app_id: stable.
        let removed = try t.store.sync { s, done in
            s.unregister(
                app: "default", user: "alice", .binding(platform: .fcm, environment: nil, token: "fcm-shared"),
                completion: done)
        }
        #expect(removed == 1)
        #expect(try t.list("alice").map(\.deviceID) == [canary.deviceID])
    }

    @Test(
        "another user's registration of the same token and build is reclaimed; of another build it is not",
        arguments: StoreBackend.allCases)
    func reclaimPerBuild(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        _ = try t.register(Self.reg("alice", .fcm, "fcm-x", appID: "beta"))
        let bobStable = try t.register(Self.reg("bob", .fcm, "fcm-x"))
        #expect(!bobStable.reclaimed)
        #expect(try t.list("alice").count == 1)
        let bobBeta = try t.register(Self.reg("bob", .fcm, "fcm-x", appID: "beta"))
        #expect(bobBeta.reclaimed)
        #expect(try t.list("alice").isEmpty)
    }

    @Test("device.list shows the form of each registration", arguments: StoreBackend.allCases)
    func formListed(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        let legacy = try t.register(Self.reg("alice", .fcm, "fcm-legacy"))
        let webFCM = try t.register(Self.reg("alice", .fcm, "https://fcm.googleapis.com/wp/abc", keys: Self.keys))
        let up = try t.register(Self.reg("alice", .unifiedPush, "https://up.example.net/u/1", keys: Self.keys))
        let voip = try t.register(Self.reg("alice", .apnsVoIP, "https://voip.example.net/v/1", keys: Self.keys))
        let listed = Dictionary(uniqueKeysWithValues: try t.list("alice").map { ($0.deviceID, $0) })
        #expect(listed[legacy.deviceID]?.webPushForm == false)
        #expect(listed[webFCM.deviceID]?.webPushForm == true)
        #expect(listed[up.deviceID]?.webPushForm == true && listed[up.deviceID]?.platform == .unifiedPush)
        #expect(listed[voip.deviceID]?.webPushForm == true && listed[voip.deviceID]?.environment == .production)
        let counts = try t.store.sync { s, done in s.deviceCounts(completion: done) }
        #expect(counts[.unifiedPush] == 1 && counts[.fcm] == 2 && counts[.apnsVoIP] == 1)
    }

    /// Every platform × form, one registration each.
    func registerAll(_ t: TestStore) throws -> [String: String] {
        var ids: [String: String] = [:]
        ids["apns"] = try t.register(Self.reg("alice", .apns, "aa01")).deviceID
        ids["voip legacy"] = try t.register(Self.reg("alice", .apnsVoIP, "bb01")).deviceID
        ids["voip webpush"] = try t.register(
            Self.reg("alice", .apnsVoIP, "https://voip.example.net/v/1", keys: Self.keys)
        ).deviceID
        ids["fcm legacy"] = try t.register(Self.reg("alice", .fcm, "fcm-legacy")).deviceID
        ids["fcm webpush"] = try t.register(
            Self.reg("alice", .fcm, "https://fcm.googleapis.com/wp/abc", keys: Self.keys)
        ).deviceID
        ids["web"] = try t.register(Self.reg("alice", .web, "https://push.example.net/w/1", keys: Self.keys)).deviceID
        ids["unified_push"] = try t.register(
            Self.reg("alice", .unifiedPush, "https://up.example.net/u/1", keys: Self.keys)
        ).deviceID
        return ids
    }

    func routed(
        _ t: TestStore, _ ids: [String: String], _ e: Enqueue
    ) throws -> (sent: Set<String>, reasons: [String: String]) {
        let m = try t.enqueue(e)
        let status = try #require(try t.status(m.messageID))
        var sent: Set<String> = []
        var reasons: [String: String] = [:]
        for d in status.devices ?? [] {
            let name = ids.first { $0.value == d.deviceID }!.key
            if d.state == .skipped { reasons[name] = d.reason ?? "" } else { sent.insert(name) }
        }
        #expect(m.devices == sent.count && m.skipped == reasons.count)
        return (sent, reasons)
    }

    @Test(
        "each kind reaches the platforms and forms it is for; the rest are kind_not_for_platform",
        arguments: StoreBackend.allCases)
    func routing(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        let ids = try registerAll(t)
        let alerts: Set<String> = ["apns", "fcm legacy", "fcm webpush", "web", "unified_push"]
        for kind in [PushKind.notification, .clear] {
            let r = try routed(t, ids, send(PushMessage(kind: kind), to: .users(["alice"])))
            #expect(r.sent == alerts, "\(kind)")
            #expect(r.reasons == ["voip legacy": "kind_not_for_platform", "voip webpush": "kind_not_for_platform"])
        }
        let ring = try routed(t, ids, send(PushMessage(kind: .callRing), to: .users(["alice"])))
        #expect(ring.sent == ["voip legacy", "voip webpush", "fcm webpush"])
        #expect(Set(ring.reasons.keys) == ["apns", "fcm legacy", "web", "unified_push"])
        #expect(ring.reasons.values.allSatisfy { $0 == "kind_not_for_platform" })
        // The kinds with tokens of their own reach none of these registrations.
        for kind in PushKind.allCases where kind.ownPlatform != nil {
            var m = PushMessage(kind: kind)
            if kind == .liveActivity { m.liveActivity = LiveActivity(event: .update, activityID: "a", timestamp: 0) }
            let own = try routed(t, ids, send(m, to: .users(["alice"])))
            #expect(own.sent.isEmpty, "\(kind)")
            // A Live Activity reads only its activity's tokens: the devices are not even skipped.
            #expect(kind == .liveActivity ? own.reasons.isEmpty : own.reasons.count == 7, "\(kind): \(own.reasons)")
        }
        #expect(PushKind.allCases.count == 7, "a new kind needs its row in this test and in the routing table")
    }

    @Test(
        "whether a transport is disabled follows the form: Web Push-form registrations need VAPID",
        arguments: StoreBackend.allCases)
    func disabledByForm(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        let ids = try registerAll(t)
        let noFCM = try routed(
            t, ids, send(PushMessage(kind: .notification), to: .users(["alice"]), disabled: [.fcm: "no fcm"]))
        #expect(noFCM.sent == ["apns", "fcm webpush", "web", "unified_push"])
        #expect(noFCM.reasons["fcm legacy"] == "transport_disabled: no fcm")
        let noWeb = try routed(
            t, ids,
            send(
                PushMessage(kind: .callRing), to: .users(["alice"]),
                disabled: [.web: "no vapid", .unifiedPush: "no vapid"]))
        #expect(noWeb.sent == ["voip legacy"])
        #expect(noWeb.reasons["voip webpush"] == "transport_disabled: no vapid")
        #expect(noWeb.reasons["fcm webpush"] == "transport_disabled: no vapid")
        // A Web Push-form delivery is claimed with its keys and endpoint, on its platform's lane.
        let jobs = try t.claim()
        let job = try #require(jobs.first { $0.deviceID == ids["voip legacy"] })
        #expect(job.keys == nil && job.platform == .apnsVoIP)
        let webJob = try #require(jobs.first { $0.deviceID == ids["fcm webpush"] })
        #expect(webJob.keys == Self.keys && webJob.platform == .fcm)
        #expect(webJob.token == "https://fcm.googleapis.com/wp/abc")
    }
}
