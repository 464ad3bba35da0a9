import Foundation
import HeraldCore
import HeraldCrypto
import HeraldStore
import HeraldStoreTestSupport
import Testing

/// `device.update` on devices that record a bundle id (`devices.bundle_id`)
/// and a VAPID key (`devices.server_key`), on both backends: an update keeps
/// both columns, and every path that reads devices (the list, the resolve at
/// the commit, the claim) reads `enabled` and the two columns from their own
/// places, not one from another's.
@Suite("Device updates keep bundle ids and server keys")
struct DeviceUpdateBundleAndKeyTests {
    typealias Expected = BundleAndServerKeyTests.Expected

    @Test(
        "turning devices off and on and renaming them keeps their bundle id and server key; sends skip the disabled and carry both for the rest",
        arguments: StoreBackend.allCases)
    func roundTrip(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        let dev = "com.example.app.dev"
        let apnsDev = try t.register(BundleAndServerKeyTests.apns("u", "aa01", bundle: dev)).deviceID
        let apnsOff = try t.register(BundleAndServerKeyTests.apns("u", "aa02", bundle: dev)).deviceID
        let webOld = try t.register(try BundleAndServerKeyTests.web("u", "old", key: "key-old")).deviceID
        let webNew = try t.register(try BundleAndServerKeyTests.web("u", "new", key: "key-new")).deviceID
        let before = try t.list("u")

        // An update answers the device as listed: bundle id kept, enabled as set.
        let off = try #require(try t.updateByID("u", apnsOff, name: "spare", enabled: false))
        #expect(off.bundleID == dev && !off.enabled && off.name == "spare")
        let renamed = try #require(try t.updateByID("u", webOld, name: "old browser"))
        #expect(renamed.enabled && renamed.bundleID == nil && renamed.name == "old browser")
        _ = try #require(try t.updateByID("u", webNew, enabled: false))
        _ = try #require(try t.updateByID("u", webNew, enabled: true))

        let listed = Dictionary(uniqueKeysWithValues: try t.list("u").map { ($0.deviceID, $0) })
        #expect(listed[apnsOff] == off && listed[webOld] == renamed)
        #expect(
            listed.mapValues(\.bundleID) == [apnsDev: dev, apnsOff: dev, webOld: nil, webNew: nil], "\(listed)")
        #expect(listed.mapValues(\.enabled) == [apnsDev: true, apnsOff: false, webOld: true, webNew: true])
        for b in before {
            let a = try #require(listed[b.deviceID])
            #expect(a.registeredAt == b.registeredAt && a.tokenHash == b.tokenHash, "not a registration")
        }
        // The server keys stay: still one subscription per key.
        let byKey = try t.store.sync { s, done in s.webSubscriptionsByKey(completion: done) }
        #expect(
            Dictionary(uniqueKeysWithValues: byKey.map { ($0.serverKey ?? "-", $0.count) })
                == ["key-old": 1, "key-new": 1], "\(byKey)")

        let expected: [String: Expected] = [
            apnsDev: Expected(bundleID: dev, serverKey: nil),
            webOld: Expected(bundleID: nil, serverKey: "key-old"),
            webNew: Expected(bundleID: nil, serverKey: "key-new"),
        ]
        // The claim: the disabled device is skipped at the commit, the others
        // carry their own columns (an enabled device with a bundle id is sent).
        let sent = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["u"])))
        #expect(sent.devices == 3 && sent.skipped == 1)
        let status = try #require(try t.status(sent.messageID))
        #expect(status.devices?.first { $0.deviceID == apnsOff }?.reason == "device_disabled")
        #expect(BundleAndServerKeyTests.columns(try t.claim()) == expected)

        // Handed over at the commit, resolved by user and by id.
        let lanes: [QueueLane: Int] = [
            QueueLane(app: "default", platform: .apns): 10, QueueLane(app: "default", platform: .web): 10,
        ]
        for to in [Recipients.users(["u"]), .devices([apnsOff, webNew, apnsDev, webOld])] {
            let (accepted, claim) = try t.store.sync { s, done in
                s.enqueue(send(PushMessage(kind: .notification), to: to), handoff: lanes, limit: 10, completion: done)
            }
            #expect(accepted.devices == 3 && accepted.skipped == 1, "\(to)")
            #expect(BundleAndServerKeyTests.columns(claim.jobs) == expected, "\(to)")
        }

        // Queued while enabled, claimed after the device is turned off: skipped
        // there; the device turned on again is sent to its own bundle.
        let queued = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["u"])))
        _ = try #require(try t.updateByID("u", webOld, enabled: false))
        let on = try #require(try t.updateByID("u", apnsOff, enabled: true))
        #expect(on.bundleID == dev && on.name == "spare")
        var afterOff = expected
        afterOff[webOld] = nil
        #expect(BundleAndServerKeyTests.columns(try t.claim()) == afterOff)
        let final = try #require(try t.status(queued.messageID))
        #expect(final.devices?.first { $0.deviceID == webOld }?.reason == "device_disabled")

        _ = try #require(try t.updateByID("u", webOld, enabled: true))
        let again = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["u"])))
        #expect(again.devices == 4 && again.skipped == 0)
        var all = expected
        all[apnsOff] = Expected(bundleID: dev, serverKey: nil)
        #expect(BundleAndServerKeyTests.columns(try t.claim()) == all)
    }
}
