import Foundation
import HeraldCore
@testable import HeraldScheduler
import HeraldStore
import HeraldStoreTestSupport
import Testing

/// A claim counts a message's rows only for the batches the engine does not
/// hold open; a batch that closes while its claim is out is opened again
/// from the claim's rows.
@Suite("Claims and batch counts")
struct ClaimCountTests {
    func job(_ id: Int64, message: String, platform: Platform = .fcm) -> DeliveryJob {
        let now = SystemClock().nowMilliseconds()
        return DeliveryJob(
            deliveryID: id, messageID: message, app: "default", deviceID: "d\(id)", user: "u", platform: platform,
            environment: nil, token: "t\(id)", keys: nil, tokenHash: "h\(id)", registeredAt: now,
            message: PushMessage(kind: .notification), acceptedAt: now, expiresAt: now + 60_000,
            previousAttempts: 0)
    }

    @Test func openBatchesAreNamedToTheClaimAndALateOneIsOpenedFromItsRows() throws {
        let f = try Fixture(.sqlite)
        defer { f.close() }
        let scheduler = Scheduler(store: f.store, transports: [:], settings: SchedulerSettings(maxInflight: 10))
        let known = BatchKey(messageID: "m1", platform: .fcm)
        let late = BatchKey(messageID: "m2", platform: .fcm)
        scheduler.owner.sync {
            let stale = scheduler.stale!
            #expect(stale.counted.isEmpty)
            stale.open([known: 10])
            #expect(stale.counted == [known], "an open batch is named, so a claim does not count it again")
            // A claim asked while m2 was open came back after it closed:
            // its sizes leave m2 out, and m2 is opened from its rows.
            stale.open([:], claimed: [job(1, message: "m1"), job(2, message: "m2"), job(3, message: "m2")])
            #expect(stale.counted == [known, late])
        }
    }

    @Test func pastTheLimitNoBatchIsNamed() throws {
        let f = try Fixture(.sqlite)
        defer { f.close() }
        let scheduler = Scheduler(store: f.store, transports: [:], settings: SchedulerSettings(maxInflight: 10))
        scheduler.owner.sync {
            let stale = scheduler.stale!
            var sizes: [BatchKey: Int] = [:]
            for i in 0...StaleHolding.countedLimit { sizes[BatchKey(messageID: "m\(i)", platform: .apns)] = 5 }
            stale.open(sizes)
            #expect(stale.counted.isEmpty, "past the limit the claim counts every batch, as before")
        }
    }
}
