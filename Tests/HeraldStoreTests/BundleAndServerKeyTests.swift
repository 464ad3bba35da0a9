import Foundation
import HeraldCore
import HeraldCrypto
import HeraldStore
import HeraldStoreTestSupport
import Testing

/// A device's bundle id (`devices.bundle_id`, APNs) and the VAPID key a Web
/// Push subscription was made with (`devices.server_key`) side by side: both
/// columns are written, refreshed and read back in the right places on both
/// backends, on every path that hands out jobs.
@Suite("Bundle ids and Web Push server keys together in the store")
struct BundleAndServerKeyTests {
    struct Expected: Equatable, CustomStringConvertible {
        var bundleID: String?
        var serverKey: String?
        var description: String { "(bundle \(bundleID ?? "nil"), key \(serverKey ?? "nil"))" }
    }

    static func apns(_ user: String, _ token: String, bundle: String?, serverKey: String? = nil) -> Registration {
        Registration(
            app: "default", user: user, platform: .apns, environment: .production, token: token, bundleID: bundle,
            serverKey: serverKey)
    }

    static func web(_ user: String, _ name: String, key: String?, bundle: String? = nil) throws -> Registration {
        Registration(
            app: "default", user: user, platform: .web, environment: nil, token: "https://push.example.net/p/\(name)",
            keys: WebPushKeys(p256dh: try P256PrivateKey.generate().publicKey, auth: try SecureRandom.bytes(16)),
            bundleID: bundle, serverKey: key)
    }

    static func columns(_ jobs: [DeliveryJob]) -> [String: Expected] {
        Dictionary(
            uniqueKeysWithValues: jobs.map { ($0.deviceID, Expected(bundleID: $0.bundleID, serverKey: $0.serverKey)) })
    }

    @Test(
        "one message's claim: each job carries its own device's bundle id and server key, never the other's",
        arguments: StoreBackend.allCases)
    func oneClaim(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        // A server key given for an APNs device and a bundle id given for a
        // web device are not stored: each column belongs to its platform.
        let apnsDev = try t.register(Self.apns("u", "aa01", bundle: "com.example.app.dev", serverKey: "key-X"))
            .deviceID
        let apnsPlain = try t.register(Self.apns("u", "aa02", bundle: nil)).deviceID
        let webA = try t.register(try Self.web("u", "a", key: "key-A", bundle: "com.example.app.dev")).deviceID
        let webNone = try t.register(try Self.web("u", "none", key: nil)).deviceID
        let fcm = try t.register(
            Registration(app: "default", user: "u", platform: .fcm, environment: nil, token: "fcm-u")
        ).deviceID
        let expected: [String: Expected] = [
            apnsDev: Expected(bundleID: "com.example.app.dev", serverKey: nil),
            apnsPlain: Expected(bundleID: nil, serverKey: nil),
            webA: Expected(bundleID: nil, serverKey: "key-A"),
            webNone: Expected(bundleID: nil, serverKey: nil),
            fcm: Expected(bundleID: nil, serverKey: nil),
        ]

        let listed = try t.list("u")
        #expect(
            Dictionary(uniqueKeysWithValues: listed.map { ($0.deviceID, $0.bundleID) }) == [
                apnsDev: "com.example.app.dev", apnsPlain: nil, webA: nil, webNone: nil, fcm: nil,
            ])
        let counts = try t.store.sync { s, done in s.webSubscriptionsByKey(completion: done) }
        #expect(
            Dictionary(uniqueKeysWithValues: counts.map { ($0.serverKey ?? "-", $0.count) }) == ["key-A": 1, "-": 1],
            "\(counts)")

        // claimDue (the claim statement's columns).
        let sent = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["u"])))
        #expect(sent.devices == 5)
        let claimed = try t.claim()
        #expect(Set(claimed.map(\.messageID)) == [sent.messageID])
        #expect(Self.columns(claimed) == expected)

        // Handed over at the enqueue, resolved by user and by device id.
        let lanes: [QueueLane: Int] = [
            QueueLane(app: "default", platform: .apns): 10, QueueLane(app: "default", platform: .web): 10,
            QueueLane(app: "default", platform: .fcm): 10,
        ]
        let byUser = try t.store.sync { s, done in
            s.enqueue(
                send(PushMessage(kind: .notification), to: .users(["u"])), handoff: lanes, limit: 10, completion: done
            )
        }
        #expect(Self.columns(byUser.claim.jobs) == expected)
        let byDevice = try t.store.sync { s, done in
            s.enqueue(
                send(PushMessage(kind: .notification), to: .devices([webA, apnsDev, fcm, webNone, apnsPlain])),
                handoff: lanes, limit: 10, completion: done)
        }
        #expect(Self.columns(byDevice.claim.jobs) == expected)
    }

    @Test(
        "refreshes: a bundle id left out stays and a web refresh rewrites its key; moving platforms drops each column",
        arguments: StoreBackend.allCases)
    func refreshes(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.scratch.remove() }
        let apnsDev = try t.register(Self.apns("u", "aa01", bundle: "com.example.app.dev")).deviceID
        let webA = try t.register(try Self.web("u", "a", key: "key-A")).deviceID

        // Again: the APNs device without a bundle id (kept), the web device under key B.
        #expect(try t.register(Self.apns("u", "aa01", bundle: nil)).deviceID == apnsDev)
        #expect(try t.register(try Self.web("u", "a", key: "key-B")).deviceID == webA)
        _ = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["u"])))
        let first = try t.claim()
        #expect(
            Self.columns(first) == [
                apnsDev: Expected(bundleID: "com.example.app.dev", serverKey: nil),
                webA: Expected(bundleID: nil, serverKey: "key-B"),
            ])
        for job in first { try t.record(job, .retrying, status: 503, reason: "ServiceUnavailable", retryAt: 0) }
        t.store.close()

        // After a restart, the retried jobs still carry both.
        let again = try t.reopen()
        let retried = try again.sync { s, done in s.claimDue(limit: 10, completion: done) }.jobs
        #expect(Self.columns(retried) == Self.columns(first))

        // One installation moves APNs -> web and another web -> APNs: each
        // row keeps only its new platform's column.
        let moving = try again.sync { s, done in
            s.register(
                Registration(
                    app: "default", user: "v", platform: .apns, environment: .production, token: "bb01",
                    registrationID: "i1", version: 1, bundleID: "com.example.app"),
                deviceCap: 20, completion: done)
        }.deviceID
        var webV = try Self.web("v", "v2", key: "key-A")
        webV.registrationID = "i2"
        webV.version = 1
        let movingWeb = try again.sync { s, done in s.register(webV, deviceCap: 20, completion: done) }.deviceID
        var toWeb = try Self.web("v", "v1", key: "key-B", bundle: "com.example.app")
        toWeb.registrationID = "i1"
        toWeb.version = 2
        #expect(try again.sync { s, done in s.register(toWeb, deviceCap: 20, completion: done) }.deviceID == moving)
        var toAPNs = Self.apns("v", "bb02", bundle: "com.example.app.dev", serverKey: "key-A")
        toAPNs.registrationID = "i2"
        toAPNs.version = 2
        #expect(try again.sync { s, done in s.register(toAPNs, deviceCap: 20, completion: done) }.deviceID == movingWeb)
        _ = try again.sync { s, done in
            s.enqueue(send(PushMessage(kind: .notification), to: .users(["v"])), completion: done)
        }
        let moved = try again.sync { s, done in s.claimDue(limit: 10, completion: done) }.jobs
        #expect(
            Self.columns(moved) == [
                moving: Expected(bundleID: nil, serverKey: "key-B"),
                movingWeb: Expected(bundleID: "com.example.app.dev", serverKey: nil),
            ])
        again.close()
    }
}
