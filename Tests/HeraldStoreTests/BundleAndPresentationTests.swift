import Foundation
import HeraldCore
import HeraldCrypto
import HeraldStore
import HeraldStoreTestSupport
import Testing

/// A device's bundle id and a message's presentation fields, stored: both
/// backends keep them, and a claim after a restart hands them out.
@Suite("Bundle ids and presentation fields in the store")
struct BundleAndPresentationTests {
    func bundled(_ user: String, _ token: String, _ bundle: String?, platform: Platform = .apns) -> Registration {
        Registration(
            app: "default", user: user, platform: platform, environment: .production, token: token, bundleID: bundle)
    }

    @Test(
        "bundle_id is stored, listed, kept when left out, replaced when given, dropped off APNs",
        arguments: StoreBackend.allCases)
    func registry(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        let dev = try t.register(bundled("u", "aa01", "com.example.app.dev"))
        let plain = try t.register(bundled("u", "aa02", nil))
        func bundleOf(_ id: String) throws -> String?? {
            try t.list("u").first { $0.deviceID == id }.map(\.bundleID)
        }
        #expect(try bundleOf(dev.deviceID) == .some("com.example.app.dev"))
        #expect(try bundleOf(plain.deviceID) == .some(nil))

        _ = try t.register(bundled("u", "aa01", nil))
        #expect(try bundleOf(dev.deviceID) == .some("com.example.app.dev"), "left out: the stored one stays")
        _ = try t.register(bundled("u", "aa01", "com.example.app"))
        #expect(try bundleOf(dev.deviceID) == .some("com.example.app"))

        // A registration that moves to FCM drops the bundle id.
        let rid = try t.register(
            Registration(
                app: "default", user: "v", platform: .apns, environment: .production, token: "bb01",
                registrationID: "inst", version: 1, bundleID: "com.example.app.dev"))
        #expect(try t.list("v").first?.bundleID == "com.example.app.dev")
        _ = try t.register(
            Registration(
                app: "default", user: "v", platform: .fcm, environment: nil, token: "fcm-v", registrationID: "inst",
                version: 2, bundleID: "com.example.app.dev"))
        let moved = try #require(try t.list("v").first)
        #expect(moved.deviceID == rid.deviceID && moved.platform == .fcm && moved.bundleID == nil)
    }

    @Test(
        "a claim carries each device's bundle id and the message's presentation fields, also after a restart",
        arguments: StoreBackend.allCases)
    func claimAfterRestart(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.scratch.remove() }
        let dev = try t.register(bundled("u", "aa01", "com.example.app.dev")).deviceID
        let prod = try t.register(bundled("u", "aa02", nil)).deviceID
        let voip = try t.register(bundled("u", "aa03", "com.example.app.dev", platform: .apnsVoIP)).deviceID
        var m = PushMessage(kind: .notification, data: [("id", "1")])
        m.interruptionLevel = .passive
        m.relevanceScore = 0.25
        m.threadID = "thread-9"
        m.category = "REPLY"
        m.androidChannelID = "quiet"
        let sent = try t.store.sync { s, done in
            s.enqueue(
                Enqueue(
                    app: "default", message: m, recipients: .users(["u"]), idempotencyKey: nil, disabled: [:]),
                completion: done)
        }
        #expect(sent.devices == 2, "the VoIP device gets rings only")

        // The first attempt fails transiently; the daemon stops.
        let first = try t.store.sync { s, done in s.claimDue(limit: 10, completion: done) }.jobs
        #expect(
            Dictionary(uniqueKeysWithValues: first.map { ($0.deviceID, $0.bundleID) }) == [
                dev: "com.example.app.dev", prod: nil,
            ])
        for job in first {
            #expect(job.message == m)
            try t.store.sync { s, done in
                s.record(
                    deliveryID: job.deliveryID, state: .retrying, httpStatus: 503, reason: "ServiceUnavailable",
                    nextAttemptAt: 0, completion: done)
            }
        }
        t.store.close()

        let again = try t.reopen()
        defer { again.close() }
        let retried = try again.sync { s, done in s.claimDue(limit: 10, completion: done) }.jobs
        #expect(retried.count == 2)
        for job in retried {
            #expect(job.message.interruptionLevel == .passive)
            #expect(job.message.relevanceScore == 0.25)
            #expect(job.message.threadID == "thread-9")
            #expect(job.message.category == "REPLY")
            #expect(job.message.androidChannelID == "quiet")
            #expect(job.bundleID == (job.deviceID == dev ? "com.example.app.dev" : nil))
        }
        #expect(!retried.contains { $0.deviceID == voip })

        // A ring reaches the VoIP device with its bundle id.
        let ring = try again.sync { s, done in
            s.enqueue(
                Enqueue(
                    app: "default", message: PushMessage(kind: .callRing), recipients: .devices([voip]),
                    idempotencyKey: nil, disabled: [:]),
                completion: done)
        }
        #expect(ring.devices == 1)
        let ringJobs = try again.sync { s, done in s.claimDue(limit: 10, completion: done) }.jobs
        #expect(ringJobs.map(\.bundleID) == ["com.example.app.dev"])
    }
}
