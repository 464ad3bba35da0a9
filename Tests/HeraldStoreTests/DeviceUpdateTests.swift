import Foundation
import HeraldCore
import HeraldCrypto
import HeraldStore
import HeraldStoreTestSupport
import Testing

extension TestStore {
    func updateByID(
        _ user: String, _ deviceID: String, name: String? = nil, enabled: Bool? = nil, app: String = "default"
    ) throws -> DeviceSummary? {
        try store.sync { s, done in
            s.updateDevice(
                app: app, user: user, deviceID: deviceID, name: name, enabled: enabled,
                preferences: PreferenceChanges(), completion: done)
        }
    }

    func listedDevice(_ user: String, _ deviceID: String) throws -> DeviceSummary? {
        try list(user).first { $0.deviceID == deviceID }
    }
}

private func fcm(_ user: String, _ token: String, name: String? = nil) -> Registration {
    Registration(app: "default", user: user, platform: .fcm, environment: nil, token: token, name: name)
}

/// `device.update` at the store level: renaming and turning devices off and
/// on by id, and what sends do with a device that is off.
@Suite("Device management by id at the store level")
struct DeviceUpdateTests {
    @Test(
        "a device is renamed and turned off and on by id; nothing else of it changes", arguments: StoreBackend.allCases)
    func renameAndToggle(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        let a = try t.register(apns("alice", "aa01", name: "phone"))
        let before = try #require(try t.listedDevice("alice", a.deviceID))
        #expect(before.enabled, "a new device starts enabled")
        t.clock.advance(5000)

        let renamed = try #require(try t.updateByID("alice", a.deviceID, name: "work phone"))
        #expect(renamed.name == "work phone" && renamed.enabled)
        let off = try #require(try t.updateByID("alice", a.deviceID, enabled: false))
        #expect(off.name == "work phone" && !off.enabled, "a field left out keeps its value")
        // The answer is what device.list shows.
        #expect(try t.listedDevice("alice", a.deviceID) == off)
        // Not a registration: the token, its hash and the times stay.
        #expect(off.registeredAt == before.registeredAt && off.createdAt == before.createdAt)
        #expect(off.tokenHash == before.tokenHash && off.platform == before.platform)

        let both = try #require(try t.updateByID("alice", a.deviceID, name: "", enabled: true))
        #expect(both.name == "" && both.enabled, "an empty name is allowed, as at registration")
        // Enabling an enabled device is not an error.
        #expect(try t.updateByID("alice", a.deviceID, enabled: true)?.enabled == true)
    }

    @Test("a device id's owner is found in its app only, and not after it is removed", arguments: StoreBackend.allCases)
    func ownerByID(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        let a = try t.register(apns("alice", "aa01"))
        let b = try t.register(fcm("bob", "fcm-b"))
        func owner(_ id: String, app: String = "default") throws -> String? {
            try t.store.sync { s, done in s.deviceOwner(app: app, deviceID: id, completion: done) }
        }
        #expect(try owner(a.deviceID) == "alice")
        #expect(try owner(b.deviceID) == "bob")
        #expect(try owner(a.deviceID, app: "other") == nil)
        #expect(try owner(String(repeating: "0", count: 32)) == nil)
        _ = try t.store.sync { s, done in
            s.unregister(app: "default", user: "alice", .deviceID(a.deviceID), completion: done)
        }
        #expect(try owner(a.deviceID) == nil)
    }

    @Test("an update is not a registration: the order of eviction stays", arguments: StoreBackend.allCases)
    func evictionOrderKept(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        let oldest = try t.register(apns("alice", "aa01"), cap: 2)
        let newer = try t.register(apns("alice", "aa02"), cap: 2)
        t.clock.advance(1000)
        _ = try #require(try t.updateByID("alice", oldest.deviceID, name: "touched", enabled: false))
        #expect(try t.list("alice").map(\.deviceID) == [newer.deviceID, oldest.deviceID])
        let third = try t.register(apns("alice", "aa03"), cap: 2)
        #expect(third.evicted == [oldest.deviceID], "a disabled device is evicted as any other")
    }

    @Test(
        "an unknown id, another user's device or another app's answer nil and change nothing",
        arguments: StoreBackend.allCases)
    func scoped(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        let a = try t.register(apns("alice", "aa01", name: "phone"))
        #expect(try t.updateByID("alice", String(repeating: "0", count: 32), enabled: false) == nil)
        #expect(try t.updateByID("bob", a.deviceID, name: "stolen", enabled: false) == nil)
        #expect(try t.updateByID("alice", a.deviceID, name: "other app", enabled: false, app: "other") == nil)
        let kept = try #require(try t.listedDevice("alice", a.deviceID))
        #expect(kept.name == "phone" && kept.enabled)
        // A removed device is unknown too.
        _ = try t.store.sync { s, done in
            s.unregister(app: "default", user: "alice", .deviceID(a.deviceID), completion: done)
        }
        #expect(try t.updateByID("alice", a.deviceID, enabled: false) == nil)
    }

    @Test(
        "a disabled device stays disabled when its token is registered again; a reclaim starts enabled",
        arguments: StoreBackend.allCases)
    func reRegisterKeepsDisabled(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        let a = try t.register(apns("alice", "aa01", name: "phone"))
        _ = try #require(try t.updateByID("alice", a.deviceID, enabled: false))
        t.clock.advance(1000)
        let again = try t.register(apns("alice", "aa01", name: "renamed by the app"))
        #expect(!again.created && again.deviceID == a.deviceID)
        let listed = try #require(try t.listedDevice("alice", a.deviceID))
        #expect(!listed.enabled, "re-registering does not turn a device on")
        #expect(listed.name == "renamed by the app" && listed.registeredAt > listed.createdAt)

        // The same with a registration id moving to a new token.
        let r = try t.register(apns("alice", "bb01", rid: "install-1", version: 1))
        _ = try #require(try t.updateByID("alice", r.deviceID, enabled: false))
        let moved = try t.register(apns("alice", "bb02", rid: "install-1", version: 2))
        #expect(moved.deviceID == r.deviceID)
        #expect(try t.listedDevice("alice", r.deviceID)?.enabled == false)

        // Only device.update turns it on again.
        #expect(try t.updateByID("alice", a.deviceID, enabled: true)?.enabled == true)
        #expect(try t.listedDevice("alice", a.deviceID)?.enabled == true)

        // Another user reclaiming a disabled device's token gets a new, enabled device.
        _ = try #require(try t.updateByID("alice", a.deviceID, enabled: false))
        let b = try t.register(apns("bob", "aa01"))
        #expect(b.reclaimed && b.created && b.deviceID != a.deviceID)
        #expect(try t.listedDevice("bob", b.deviceID)?.enabled == true)
        #expect(try t.listedDevice("alice", a.deviceID) == nil)
    }

    @Test(
        "a send skips a disabled device with device_disabled while the user's other devices get it",
        arguments: StoreBackend.allCases)
    func sendSkipsDisabled(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        let phone = try t.register(apns("alice", "aa01")).deviceID
        let tablet = try t.register(fcm("alice", "fcm-tablet")).deviceID
        let laptop = try t.register(fcm("alice", "fcm-laptop")).deviceID
        _ = try #require(try t.updateByID("alice", tablet, enabled: false))

        let accepted = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["alice"])))
        #expect(accepted.devices == 2 && accepted.skipped == 1)
        let status = try #require(try t.status(accepted.messageID))
        #expect(status.counts[.queued] == 2 && status.counts[.skipped] == 1)
        let byDevice = Dictionary(uniqueKeysWithValues: (status.devices ?? []).map { ($0.deviceID, $0) })
        #expect(byDevice[tablet]?.state == .skipped && byDevice[tablet]?.reason == "device_disabled")
        #expect(byDevice[tablet]?.attempts == 0)
        #expect(byDevice[phone]?.state == .queued && byDevice[laptop]?.state == .queued)

        // Only the enabled devices are ever handed to a sender.
        let jobs = try t.claim()
        #expect(Set(jobs.map(\.deviceID)) == [phone, laptop])
        for job in jobs { try t.record(job, .delivered) }
        let done = try #require(try t.status(accepted.messageID))
        #expect(done.isComplete && done.counts[.delivered] == 2 && done.counts[.skipped] == 1)

        // Named by id, it is skipped the same way: the device's reason comes
        // before the kind's (a ring does not reach a legacy-form fcm device).
        let ring = try t.enqueue(send(PushMessage(kind: .callRing), to: .devices([tablet, laptop])))
        #expect(ring.devices == 0 && ring.skipped == 2)
        let ringStatus = try #require(try t.status(ring.messageID))
        #expect(ringStatus.devices?.first { $0.deviceID == tablet }?.reason == "device_disabled")
        #expect(ringStatus.devices?.first { $0.deviceID == laptop }?.reason == "kind_not_for_platform")

        // Enabled again, it gets the next message.
        _ = try #require(try t.updateByID("alice", tablet, enabled: true))
        let next = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["alice"])))
        #expect(next.devices == 3 && next.skipped == 0)
    }

    @Test(
        "a delivery queued before its device is turned off ends skipped at its claim, never sent",
        arguments: StoreBackend.allCases)
    func disabledAfterAccept(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        let tablet = try t.register(fcm("alice", "fcm-tablet")).deviceID
        let laptop = try t.register(fcm("alice", "fcm-laptop")).deviceID
        let accepted = try t.enqueue(send(PushMessage(kind: .notification), to: .users(["alice"])))
        #expect(accepted.devices == 2 && accepted.skipped == 0)
        _ = try #require(try t.updateByID("alice", tablet, enabled: false))

        let claim = try t.claimAll()
        #expect(claim.jobs.map(\.deviceID) == [laptop])
        #expect(claim.finished == [BatchKey(messageID: accepted.messageID, platform: .fcm)])
        #expect(claim.batchSizes[BatchKey(messageID: accepted.messageID, platform: .fcm)] == 2)
        let status = try #require(try t.status(accepted.messageID))
        let entry = try #require(status.devices?.first { $0.deviceID == tablet })
        #expect(entry.state == .skipped && entry.reason == "device_disabled")

        // A retry comes due after the device is turned off: skipped as well.
        let job = try #require(claim.jobs.first)
        try t.record(job, .retrying, status: 503, reason: "http_503", retryAt: t.clock.nowMilliseconds())
        _ = try #require(try t.updateByID("alice", laptop, enabled: false))
        #expect(try t.claim().isEmpty)
        let final = try #require(try t.status(accepted.messageID))
        #expect(final.isComplete && final.counts[.skipped] == 2)
    }

    @Test("a message handed over at the commit never hands a disabled device", arguments: StoreBackend.allCases)
    func handoffSkipsDisabled(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        let tablet = try t.register(fcm("alice", "fcm-tablet")).deviceID
        let laptop = try t.register(fcm("alice", "fcm-laptop")).deviceID
        _ = try #require(try t.updateByID("alice", tablet, enabled: false))
        let lane = QueueLane(app: "default", platform: .fcm)
        let (accepted, claim) = try t.store.sync { s, done in
            s.enqueue(
                send(PushMessage(kind: .notification), to: .users(["alice"])), handoff: [lane: 10], limit: 10,
                completion: done)
        }
        #expect(accepted.devices == 1 && accepted.skipped == 1)
        #expect(claim.jobs.map(\.deviceID) == [laptop])
        #expect(try t.claim().isEmpty, "nothing of the disabled device is left to claim")
    }
}

@Suite("Device management across instances on one PostgreSQL database")
struct SharedDeviceUpdateTests {
    @Test("a device turned off through one instance is skipped by sends through another, at accept and at claim")
    func acrossInstances() throws {
        let scratch = try StoreScratch(.postgres, prefix: "herald-update")
        let key = try StoreKey.generate()
        let a = try scratch.open(key: key, instance: "host-a")
        let b = try scratch.open(key: key, instance: "host-b")
        defer {
            a.close()
            b.close()
            scratch.remove()
        }
        let phone = try a.sync { s, done in
            s.register(fcm("ann", "fcm-phone"), deviceCap: 20, completion: done)
        }.deviceID
        let laptop = try a.sync { s, done in
            s.register(fcm("ann", "fcm-laptop"), deviceCap: 20, completion: done)
        }.deviceID
        let queued = try b.sync { s, done in
            s.enqueue(send(PushMessage(kind: .notification), to: .users(["ann"])), completion: done)
        }
        #expect(queued.devices == 2)

        let off = try a.sync { s, done in
            s.updateDevice(
                app: "default", user: "ann", deviceID: phone, name: nil, enabled: false,
                preferences: PreferenceChanges(),
                completion: done)
        }
        #expect(off?.enabled == false)
        // Instance b sees it at once: listed off, skipped at accept and at claim.
        let listed = try b.sync { s, done in s.list(app: "default", user: "ann", completion: done) }
        #expect(listed.first { $0.deviceID == phone }?.enabled == false)
        let accepted = try b.sync { s, done in
            s.enqueue(send(PushMessage(kind: .notification), to: .users(["ann"])), completion: done)
        }
        #expect(accepted.devices == 1 && accepted.skipped == 1)
        let claim = try b.sync { s, done in s.claimDue(limit: 100, completion: done) }
        #expect(claim.jobs.map(\.deviceID) == [laptop, laptop])
        for id in [queued.messageID, accepted.messageID] {
            let status = try #require(
                try a.sync { s, done in s.status(app: "default", messageID: id, detail: true, completion: done) })
            let entry = status.devices?.first { $0.deviceID == phone }
            #expect(entry?.state == .skipped && entry?.reason == "device_disabled")
        }
    }
}
