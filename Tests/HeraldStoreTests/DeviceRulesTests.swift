import Foundation
import HeraldCore
import HeraldCrypto
import HeraldStore
import HeraldStoreTestSupport
import Testing

/// The clock of ``TestStore`` starts at 2027-01-15T08:00:00Z, a Friday.
private let start: Int64 = 1_800_000_000_000
private let minute: Int64 = 60_000
private let hour: Int64 = 3_600_000

private func fcmDevice(
    _ user: String, _ token: String, _ preferences: PreferenceChanges = PreferenceChanges()
) -> Registration {
    var r = Registration(app: "default", user: user, platform: .fcm, environment: nil, token: token)
    r.preferences = preferences
    return r
}

private func quiet(_ start: Int, _ end: Int, _ during: QuietMode = .hold, days: [Int]? = nil) -> QuietHoursRule {
    QuietHoursRule(start: start * 60, end: end * 60, days: days, during: during)
}

private func message(
    topics: [String]? = nil, sendTime: SendTime? = nil, ttl: Int? = nil, collapseKey: String? = nil,
    level: InterruptionLevel? = nil, bypass: [String] = []
) -> PushMessage {
    var m = PushMessage(kind: .notification, collapseKey: collapseKey, ttlSeconds: ttl)
    m.topics = topics
    m.sendTime = sendTime
    m.interruptionLevel = level
    m.quietBypass = PushMessage.quietBypass(
        kind: .notification, interruptionLevel: level, topics: topics, bypassTopics: bypass)
    return m
}

extension TestStore {
    func update(
        _ user: String, _ deviceID: String, _ preferences: PreferenceChanges
    ) throws -> DeviceSummary? {
        try store.sync { s, done in
            s.updateDevice(
                app: "default", user: user, deviceID: deviceID, name: nil, enabled: nil, preferences: preferences,
                completion: done)
        }
    }

    func deliveries(_ id: String) throws -> [String: MessageStatus.Device] {
        let devices = try #require(try status(id)?.devices)
        return Dictionary(uniqueKeysWithValues: devices.map { ($0.deviceID, $0) })
    }
}

/// Each device's own rules at the store level, on both backends: its
/// preferences as stored and listed, a message's topics, quiet hours and
/// sends at a time, held deliveries as durable rows due at their time.
@Suite("Device preferences, topics, quiet hours and timed sends at the store level")
struct DeviceRulesTests {
    @Test(
        "preferences are stored, listed, kept by a re-registration and cleared by null",
        arguments: StoreBackend.allCases)
    func preferencesRoundTrip(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        let rule = quiet(22, 7, .silent, days: [5, 6])
        let a = try t.register(
            fcmDevice(
                "ann", "fcm-a",
                PreferenceChanges(timeZone: .set("Europe/Paris"), quietHours: .set(rule), topics: .set(["mention"]))))
        var listed = try #require(try t.list("ann").first)
        #expect(listed.preferences.timeZone == "Europe/Paris")
        #expect(listed.preferences.quietHours == rule)
        #expect(listed.preferences.topics == ["mention"])
        // The same token again, naming none of them: kept.
        _ = try t.register(fcmDevice("ann", "fcm-a"))
        listed = try #require(try t.list("ann").first)
        #expect(
            listed.preferences == DevicePreferences(timeZone: "Europe/Paris", quietHours: rule, topics: ["mention"]))
        // One changed, one cleared, one kept.
        let updated = try #require(
            try t.update("ann", a.deviceID, PreferenceChanges(timeZone: .set("Asia/Kolkata"), topics: .clear)))
        #expect(updated.preferences == DevicePreferences(timeZone: "Asia/Kolkata", quietHours: rule, topics: nil))
        // Quiet hours left without a time zone: refused, nothing changed.
        #expect(throws: PreferenceConflict.self) {
            try t.update("ann", a.deviceID, PreferenceChanges(timeZone: .clear))
        }
        #expect(try t.list("ann").first?.preferences.timeZone == "Asia/Kolkata")
        #expect(throws: PreferenceConflict.self) {
            try t.register(fcmDevice("ann", "fcm-b", PreferenceChanges(quietHours: .set(rule))))
        }
        #expect(try t.list("ann").count == 1, "the refused registration stored nothing")
        // A token reclaimed by another user makes a new device, without them.
        _ = try t.register(fcmDevice("bob", "fcm-a"))
        #expect(try t.list("bob").first?.preferences == DevicePreferences.none)
    }

    @Test("a message with topics reaches the devices that want one of them", arguments: StoreBackend.allCases)
    func topics(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        let wantsMention = try t.register(fcmDevice("ann", "t1", PreferenceChanges(topics: .set(["mention"]))))
        let wantsInbox = try t.register(fcmDevice("ann", "t2", PreferenceChanges(topics: .set(["mailbox:inbox"]))))
        let wantsAll = try t.register(fcmDevice("ann", "t3"))
        let wantsNone = try t.register(fcmDevice("ann", "t4", PreferenceChanges(topics: .set([]))))

        let about = try t.enqueue(send(message(topics: ["mention", "mailbox:work"]), to: .users(["ann"])))
        #expect(about.devices == 2 && about.skipped == 2)
        let d = try t.deliveries(about.messageID)
        #expect(d[wantsMention.deviceID]?.state == .queued)
        #expect(d[wantsAll.deviceID]?.state == .queued)
        #expect(d[wantsInbox.deviceID]?.state == .skipped && d[wantsInbox.deviceID]?.reason == "not_subscribed")
        #expect(d[wantsNone.deviceID]?.reason == "not_subscribed")

        let plain = try t.enqueue(send(message(), to: .users(["ann"])))
        #expect(plain.devices == 4 && plain.skipped == 0, "a message without topics meets every device")
    }

    @Test("not_before holds every delivery until its time, then it is claimed once", arguments: StoreBackend.allCases)
    func notBefore(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        let a = try t.register(fcmDevice("ann", "n1"))
        let due = start + 10 * minute
        let sent = try t.enqueue(send(message(sendTime: .notBefore(due)), to: .users(["ann"])))
        #expect(sent.devices == 1)
        let status = try #require(try t.status(sent.messageID))
        #expect(status.counts[.held] == 1 && !status.isComplete)
        let d = try #require(status.devices?.first)
        #expect(d.state == .held && d.heldUntil == due && d.timing == TimingNote.notBefore)
        #expect(try t.claim().isEmpty, "nothing is due before its time")
        t.clock.advance(10 * minute - 1)
        #expect(try t.claim().isEmpty)
        t.clock.advance(1)
        let jobs = try t.claim()
        #expect(jobs.map(\.deviceID) == [a.deviceID] && !jobs[0].silent)
        #expect(try t.status(sent.messageID)?.devices?.first?.state == .inFlight)
        #expect(try t.claim().isEmpty, "claimed once")
    }

    @Test(
        "quiet hours hold, silence or drop a delivery; what breaks through is noted", arguments: StoreBackend.allCases)
    func quietHours(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        // 08:00 UTC is 09:00 in Paris (CET): inside 08:30–10:00 there.
        let paris = PreferenceChanges(timeZone: .set("Europe/Paris"))
        func with(_ rule: QuietHoursRule) -> PreferenceChanges {
            var p = paris
            p.quietHours = .set(rule)
            return p
        }
        let rule = QuietHoursRule(start: 8 * 60 + 30, end: 10 * 60, days: nil, during: .hold)
        let hold = try t.register(fcmDevice("ann", "q1", with(rule)))
        let silent = try t.register(
            fcmDevice("ann", "q2", with(QuietHoursRule(start: 510, end: 600, days: nil, during: .silent))))
        let drop = try t.register(
            fcmDevice("ann", "q3", with(QuietHoursRule(start: 510, end: 600, days: nil, during: .drop))))
        // Quiet only on Saturdays: this Friday it is not.
        let weekend = try t.register(
            fcmDevice("ann", "q4", with(QuietHoursRule(start: 510, end: 600, days: [6], during: .hold))))
        let none = try t.register(fcmDevice("ann", "q5", paris))

        let sent = try t.enqueue(send(message(), to: .users(["ann"])))
        #expect(sent.devices == 4 && sent.skipped == 1)
        let d = try t.deliveries(sent.messageID)
        // Held to 10:00 Paris, 09:00 UTC.
        #expect(d[hold.deviceID]?.state == .held && d[hold.deviceID]?.heldUntil == start + hour)
        #expect(d[hold.deviceID]?.timing == TimingNote.quietHold)
        #expect(d[silent.deviceID]?.state == .queued && d[silent.deviceID]?.timing == TimingNote.quietSilent)
        #expect(d[drop.deviceID]?.state == .skipped && d[drop.deviceID]?.reason == "quiet_hours")
        #expect(d[weekend.deviceID]?.state == .queued && d[weekend.deviceID]?.timing == nil)
        #expect(d[none.deviceID]?.state == .queued && d[none.deviceID]?.heldUntil == nil)

        let now = try t.claim()
        #expect(Set(now.map(\.deviceID)) == [silent.deviceID, weekend.deviceID, none.deviceID])
        #expect(now.first { $0.deviceID == silent.deviceID }?.silent == true)
        #expect(now.filter { $0.deviceID != silent.deviceID }.allSatisfy { !$0.silent })
        // Answered (on PostgreSQL a lease left open would be taken back an hour on).
        for job in now { try t.record(job, .delivered, status: 200) }
        t.clock.advance(hour)
        #expect(try t.claim().map(\.deviceID) == [hold.deviceID])

        // A time-sensitive message, and one of a bypassing topic, break through.
        let urgent = try t.enqueue(send(message(level: .timeSensitive), to: .devices([hold.deviceID])))
        t.clock.advance(-hour)
        _ = urgent
        let topical = try t.enqueue(
            send(message(topics: ["security"], bypass: ["security"]), to: .devices([hold.deviceID])))
        let b = try t.deliveries(topical.messageID)[hold.deviceID]
        #expect(b?.state == .queued && b?.timing == TimingNote.quietBypassedPrefix + "topic:security")
        let level = try t.enqueue(send(message(level: .critical), to: .devices([drop.deviceID])))
        #expect(try t.deliveries(level.messageID)[drop.deviceID]?.timing == "quiet_hours:bypassed:critical")
    }

    @Test(
        "at_local waits for each device's own clock; a device without a time zone is sent at once",
        arguments: StoreBackend.allCases)
    func atLocal(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        // 08:00 UTC: 13:30 in Kolkata, 03:00 in New York, 19:00 in Sydney (summer).
        let kolkata = try t.register(fcmDevice("ann", "l1", PreferenceChanges(timeZone: .set("Asia/Kolkata"))))
        let newYork = try t.register(fcmDevice("ann", "l2", PreferenceChanges(timeZone: .set("America/New_York"))))
        let sydney = try t.register(fcmDevice("ann", "l3", PreferenceChanges(timeZone: .set("Australia/Sydney"))))
        let nowhere = try t.register(fcmDevice("ann", "l4"))
        let sent = try t.enqueue(send(message(sendTime: .atLocal(9 * 60), ttl: 2 * 86_400), to: .users(["ann"])))
        let d = try t.deliveries(sent.messageID)
        // 09:00 IST tomorrow = 03:30 UTC on the 16th.
        #expect(d[kolkata.deviceID]?.heldUntil == start + 19 * hour + 30 * minute)
        // 09:00 EST today = 14:00 UTC.
        #expect(d[newYork.deviceID]?.heldUntil == start + 6 * hour)
        // 09:00 AEDT tomorrow = 22:00 UTC today.
        #expect(d[sydney.deviceID]?.heldUntil == start + 14 * hour)
        #expect(d[kolkata.deviceID]?.timing == TimingNote.atLocal)
        #expect(d[nowhere.deviceID]?.state == .queued && d[nowhere.deviceID]?.heldUntil == nil)
        #expect(d[nowhere.deviceID]?.timing == TimingNote.atLocalNoTimeZone)
        // Each answered as it is claimed (on PostgreSQL an open lease would be taken back hours on).
        func claimAndAnswer() throws -> [String] {
            let jobs = try t.claim()
            for job in jobs { try t.record(job, .delivered, status: 200) }
            return jobs.map(\.deviceID)
        }
        #expect(try claimAndAnswer() == [nowhere.deviceID])
        t.clock.advance(6 * hour)
        #expect(try claimAndAnswer() == [newYork.deviceID])
        t.clock.advance(8 * hour)
        #expect(try claimAndAnswer() == [sydney.deviceID])
        t.clock.advance(5 * hour + 30 * minute)
        #expect(try claimAndAnswer() == [kolkata.deviceID])
    }

    @Test(
        "a held delivery whose TTL runs out first ends expired; cancel drops held ones; a newer one supersedes",
        arguments: StoreBackend.allCases)
    func expiryCancelCollapse(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        let a = try t.register(fcmDevice("ann", "e1"))
        let short = try t.enqueue(send(message(sendTime: .notBefore(start + hour), ttl: 60), to: .users(["ann"])))
        let cancelled = try t.enqueue(send(message(sendTime: .notBefore(start + hour)), to: .users(["ann"])))
        let older = try t.enqueue(
            send(message(sendTime: .notBefore(start + hour), collapseKey: "inbox"), to: .users(["ann"])))
        let newer = try t.enqueue(
            send(message(sendTime: .notBefore(start + 2 * hour), collapseKey: "inbox"), to: .users(["ann"])))
        #expect(
            try t.store.sync { s, done in s.cancel(app: "default", messageID: cancelled.messageID, completion: done) }
                == 1)
        #expect(try t.deliveries(cancelled.messageID)[a.deviceID]?.reason == "cancelled")
        #expect(try t.deliveries(older.messageID)[a.deviceID]?.state == .superseded)
        // The short one is due at its send deadline (60 s + 2 s), before its time.
        t.clock.advance(62_001)
        let claim = try t.claimAll()
        #expect(claim.jobs.isEmpty)
        #expect(try t.deliveries(short.messageID)[a.deviceID]?.state == .expired)
        t.clock.advance(2 * hour)
        #expect(try t.claim().map(\.messageID) == [newer.messageID])
    }

    @Test(
        "held deliveries follow a device whose id changes when it registers again with a registration id",
        arguments: StoreBackend.allCases)
    func followTheDevice(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.close() }
        let first = try t.register(fcmDevice("ann", "m1"))
        let sent = try t.enqueue(send(message(sendTime: .notBefore(start + minute)), to: .users(["ann"])))
        var again = fcmDevice("ann", "m1")
        again.registrationID = "install-1"
        again.version = 1
        let moved = try t.register(again)
        #expect(moved.deviceID != first.deviceID && !moved.created)
        t.clock.advance(minute)
        let jobs = try t.claim()
        #expect(jobs.map(\.deviceID) == [moved.deviceID] && jobs.map(\.messageID) == [sent.messageID])
    }

    @Test("held deliveries survive a restart and go out once at their time", arguments: StoreBackend.allCases)
    func restart(_ backend: StoreBackend) throws {
        let t = try TestStore(backend)
        defer { t.scratch.remove() }
        let a = try t.register(fcmDevice("ann", "r1"))
        let sent = try t.enqueue(send(message(sendTime: .notBefore(start + minute)), to: .users(["ann"])))
        t.store.close()
        let again = try t.reopen()
        defer { again.close() }
        func claim() throws -> [DeliveryJob] {
            try again.sync { s, done in s.claimDue(limit: 10, completion: done) }.jobs
        }
        #expect(try claim().isEmpty)
        t.clock.advance(minute)
        let jobs = try claim()
        #expect(jobs.map(\.deviceID) == [a.deviceID] && jobs.map(\.messageID) == [sent.messageID])
        #expect(try claim().isEmpty)
    }
}
