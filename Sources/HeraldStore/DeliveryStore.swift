import Foundation
public import HeraldCore
import HeraldIO

/// What every part of the store's interface shares: a class, callable from
/// any thread (see ``DeliveryStore`` for the promises its calls keep).
public protocol StoreService: AnyObject, Sendable {}

/// The device registry: what the device methods use.
public protocol DeviceRegistry: StoreService {
    /// Every rule of `device.register`: ordering by registration version,
    /// in-place refresh, cross-user reclaim, eviction over `deviceCap`.
    func register(
        _ registration: Registration, deviceCap: Int,
        completion: @escaping @Sendable (Result<RegistrationOutcome, any Error>) -> Void)

    /// Deletes the named device(s) of this user only; answers how many.
    func unregister(
        app: String, user: String, _ selector: UnregisterSelector,
        completion: @escaping @Sendable (Result<Int, any Error>) -> Void)

    /// The user's devices, most recently registered first.
    func list(app: String, user: String, completion: @escaping @Sendable (Result<[DeviceSummary], any Error>) -> Void)

    /// Deletes the user's devices registered with `session`; answers how many.
    func endSession(
        app: String, user: String, session: String, completion: @escaping @Sendable (Result<Int, any Error>) -> Void)

    /// Deletes the user's devices, tombstones and deliveries; answers how many devices.
    func forget(app: String, user: String, completion: @escaping @Sendable (Result<Int, any Error>) -> Void)

    /// Records `key` as the VAPID key of the app's Web Push devices that
    /// record none (registered before Herald recorded keys); answers how many.
    func recordServerKey(app: String, key: String, completion: @escaping @Sendable (Result<Int, any Error>) -> Void)

    /// `device.update`: renames this user's device and/or turns it off or on
    /// (nil leaves that field as it is) and changes its preferences, without
    /// touching its registration (token, recency, eviction order). Answers
    /// the device as `list` shows it, or nil when the user has no such device
    /// in the app; fails with ``PreferenceConflict`` (nothing changed) when
    /// quiet hours would be left without a time zone.
    func updateDevice(
        app: String, user: String, deviceID: String, name: String?, enabled: Bool?, preferences: PreferenceChanges,
        completion: @escaping @Sendable (Result<DeviceSummary?, any Error>) -> Void)

    /// `activity.register`: a Live Activity token of one of the user's devices.
    func registerActivity(
        _ registration: ActivityRegistration,
        completion: @escaping @Sendable (Result<ActivityOutcome, any Error>) -> Void)
    /// `activity.unregister`: how many tokens went.
    func unregisterActivity(
        app: String, user: String, _ selector: ActivitySelector,
        completion: @escaping @Sendable (Result<Int, any Error>) -> Void)
    /// `channel.create`: records a channel APNs created.
    func recordChannel(
        app: String, channelID: String, environment: APNsEnvironment, bundleID: String, storesLatest: Bool,
        completion: @escaping @Sendable (Result<ChannelRecord, any Error>) -> Void)
    /// `channel.list` (nil `channelID`), or one channel.
    func channels(
        app: String, channelID: String?, completion: @escaping @Sendable (Result<[ChannelRecord], any Error>) -> Void)
    /// `channel.delete`: whether Herald kept it.
    func forgetChannel(
        app: String, channelID: String, completion: @escaping @Sendable (Result<Bool, any Error>) -> Void)
    /// `activity.list`: the user's Live Activity tokens.
    func listActivities(
        app: String, user: String, completion: @escaping @Sendable (Result<[ActivityTokenSummary], any Error>) -> Void)

    /// The user a device id belongs to in the app, or nil when the app has no
    /// such device (`device.update` and the CLI without a user).
    func deviceOwner(
        app: String, deviceID: String, completion: @escaping @Sendable (Result<String?, any Error>) -> Void)
}

/// The delivery queue: messages accepted, claimed, recorded and read back;
/// what `push.*` and the delivery engine use.
public protocol DeliveryQueue: StoreService {
    /// A Live Activity's end reached these update tokens: the activity is
    /// over, so they go (their rows, by id; ordinary devices are never touched).
    func letGoActivityTokens(ids: [String], completion: @escaping @Sendable (Result<Int, any Error>) -> Void)

    /// Commits a message and its deliveries (or finds it by idempotency key).
    func enqueue(_ e: Enqueue, completion: @escaping @Sendable (Result<Enqueued, any Error>) -> Void)

    /// Commits a message and hands up to `handoff[lane]` of its deliveries
    /// per lane, `limit` in all, to the caller already in flight (one attempt
    /// counted, as a claim would leave them).
    ///
    /// A store may instead pass the handed deliveries to `early` before the
    /// commit, in one or more parts (the first carries the batch sizes; the
    /// claim in `completion` then holds none), so that they are sent while the
    /// commit is under way. Their results must not
    /// be recorded until `completion` reports the commit; if it reports a
    /// failure, nothing of the message exists and the results are dropped.
    /// ``SQLiteStore`` does this; ``PostgresStore`` does not (it runs a
    /// transaction again after a lost race, which would send the message twice).
    func enqueue(
        _ e: Enqueue, handoff: [QueueLane: Int], limit: Int, early: (@Sendable (Claim) -> Void)?,
        completion: @escaping @Sendable (Result<(accepted: Enqueued, claim: Claim), any Error>) -> Void)

    /// `push.status` of one of the app's messages; nil when there is none.
    func status(
        app: String, messageID: String, detail: Bool,
        completion: @escaping @Sendable (Result<MessageStatus?, any Error>) -> Void)

    /// Cancels the message's deliveries not yet sent; answers how many, or
    /// nil when the app has no such message.
    func cancel(app: String, messageID: String, completion: @escaping @Sendable (Result<Int?, any Error>) -> Void)

    /// Takes due deliveries, up to `lanes[lane]` of each named lane and up to
    /// `others` of any other lane, and marks them in flight. The claim's
    /// batch sizes leave out the batches in `counted` (the caller holds
    /// them open already): counting a 10,000-device message's rows again at
    /// each of its claims would cost more than the claim.
    func claimDue(
        lanes: [QueueLane: Int], others: Int, counted: Set<BatchKey>,
        completion: @escaping @Sendable (Result<Claim, any Error>) -> Void)

    /// Records an attempt's result: a final state, or `retrying` at `nextAttemptAt`.
    func record(
        deliveryID: Int64, state: DeliveryState, httpStatus: Int?, reason: RecordedReason?, nextAttemptAt: Int64?,
        completion: @escaping @Sendable (Result<Void, any Error>) -> Void)

    /// Records many attempts' results in one job.
    func record(_ records: [DeliveryRecord], completion: @escaping @Sendable (Result<Void, any Error>) -> Void)

    /// Makes the deliveries of `lanes` that wait for a credential due at once
    /// (after a reload); answers how many.
    func releaseCredentialWaits(lanes: [QueueLane], completion: @escaping @Sendable (Result<Int, any Error>) -> Void)

    /// Deletes a stale device if it still holds `tokenHash`, and records the
    /// delivery (`removed_stale`, or `failed` when the device moved on). A
    /// shared store (``isShared``) also holds the deletion to `windowCap` per
    /// platform in any ``staleWindowMs`` across every instance, and refuses
    /// it past that (`failed`, the reason saying why); a store with one
    /// instance leaves the cap to the caller's own guard, which is exact.
    func removeStale(
        deliveryID: Int64, deviceID: String, tokenHash: String, httpStatus: Int?, reason: ProviderReason,
        windowCap: Int, receipt: ProviderReceipt?,
        completion: @escaping @Sendable (Result<StaleRemoval, any Error>) -> Void)
}

/// What several instances sharing one database need of each other (a
/// store of one instance answers with the defaults below).
public protocol StoreInstances: StoreService {
    /// Whether other Herald instances may use this store at the same time
    /// (PostgreSQL): then limits that must hold across instances are asked
    /// of the store, and other instances' work arrives through the work
    /// observer.
    var isShared: Bool { get }

    /// Sets what runs (on a store thread; hand work elsewhere quickly) when
    /// work may be due that this instance did not queue itself: another
    /// instance committed a message or released credential waits, or a
    /// lease of a dead instance expired. A store no other instance uses
    /// never calls it.
    func setWorkObserver(_ observer: @escaping @Sendable () -> Void)

    /// Takes one token of the rate bucket `bucket`, shared by every instance
    /// on this store (`perMinute` tokens a minute, bursting to as many):
    /// nil when allowed, else the milliseconds until a token is available.
    /// A store only this instance uses answers nil at once: the caller's
    /// own limiter is the whole truth.
    func takeSharedToken(
        _ bucket: String, perMinute: Int, completion: @escaping @Sendable (Result<Int64?, any Error>) -> Void)

    /// The caller gave up writing these deliveries' results (its bound of
    /// held results was passed): a shared store stops renewing their leases,
    /// so that another instance sends them again once the lease runs out.
    func forget(deliveryIDs: [Int64])

    /// The lanes this instance can send now (those with a transport): a
    /// shared store publishes them, so that the other instances leave the
    /// deliveries of those lanes to it rather than skip them.
    func publish(lanes: Set<QueueLane>)
}

/// The store's life and figures: open outcome, close, health, purge, counts.
public protocol StoreAdministration: StoreService {
    /// What the store did with its key at open.
    var keyOutcome: StoreKeyOutcome { get }

    /// Deliveries found in flight at open (a stop or crash interrupted them),
    /// now queued again.
    var recoveredDeliveries: Int { get }

    /// Messages a stop or crash caught between two of their parts (SQLite
    /// writes a message of many devices in parts), written whole at open.
    var unfinishedCompleted: Int { get }

    /// Stops taking work, finishes what is queued, and closes the database.
    func close()

    /// Devices per platform.
    func deviceCounts(completion: @escaping @Sendable (Result<[Platform: Int], any Error>) -> Void)

    /// Devices per app and platform.
    func deviceCountsByApp(completion: @escaping @Sendable (Result<[String: [Platform: Int]], any Error>) -> Void)

    /// Web Push subscriptions per app and recorded VAPID public key.
    func webSubscriptionsByKey(completion: @escaping @Sendable (Result<[ServerKeyCount], any Error>) -> Void)

    /// Deletes messages (and their deliveries) older than `retention` whose
    /// deliveries are all final; answers how many.
    func purgeMessages(olderThan retention: Duration, completion: @escaping @Sendable (Result<Int, any Error>) -> Void)

    /// Deliveries waiting and in flight.
    func queueDepth(completion: @escaping @Sendable (Result<QueueDepth, any Error>) -> Void)

    /// Deliveries waiting and in flight, per app.
    func queueDepthByApp(completion: @escaping @Sendable (Result<[String: QueueDepth], any Error>) -> Void)

    /// A quick read that proves the database answers, for `system.health`.
    func ping(completion: @escaping @Sendable (Result<Void, any Error>) -> Void)
}

/// The registry and the delivery queue, whatever database holds them: all
/// four parts of the store's interface. The daemon and the scheduler see the
/// store only through these protocols, each caller through the parts it
/// uses;
/// ``StoreLocation/open(keySupply:keyFile:instance:clock:)`` picks the backend
/// (``SQLiteStore`` today).
///
/// Every operation is asynchronous: it queues its work and answers through
/// `completion`, which runs on a thread of the store and must hand work
/// elsewhere quickly. An implementation keeps these promises:
/// - a write answered with success is committed (`register`, `enqueue` and
///   the other caller-facing writes durably; claims and attempt results may
///   wait for the next durable commit);
/// - a read of an app's user (`list`) or of a message (`status`) sees every
///   write of that user or message queued before it, answered or not (a
///   client that pipelines a write and a read reads its own write);
/// - after `close()` every call fails at once with an error.
public protocol DeliveryStore: DeviceRegistry, DeliveryQueue, StoreInstances, StoreAdministration, EventLog {}

/// What became of a stale device (see ``DeliveryQueue/removeStale``).
public enum StaleRemoval: Sendable, Equatable {
    /// Deleted; the delivery is `removed_stale`.
    case removed
    /// Kept: it registered a new token meanwhile; the delivery is `failed`.
    case kept
    /// Kept: the deletions of the last window, across instances, reached
    /// the cap; the delivery is `failed` with the reason.
    case refusedWindowCap
}

/// The sliding window of the stale-deletion cap.
public let staleWindowMs: Int64 = 60_000

extension StoreInstances {
    /// A store of one instance renews no leases: nothing to forget.
    public func forget(deliveryIDs: [Int64]) {}

    /// A store of one instance has no one to tell.
    public func publish(lanes: Set<QueueLane>) {}
}

extension DeliveryQueue {
    /// Commits a message and hands deliveries over at the commit (no early sends).
    public func enqueue(
        _ e: Enqueue, handoff: [QueueLane: Int], limit: Int,
        completion: @escaping @Sendable (Result<(accepted: Enqueued, claim: Claim), any Error>) -> Void
    ) {
        enqueue(e, handoff: handoff, limit: limit, early: nil, completion: completion)
    }

    /// Takes up to `limit` due deliveries of any lane and marks them in flight.
    public func claimDue(limit: Int, completion: @escaping @Sendable (Result<Claim, any Error>) -> Void) {
        claimDue(lanes: [:], others: limit, counted: [], completion: completion)
    }

    /// Takes due deliveries per lane (see ``claimDue(lanes:others:counted:completion:)``), every batch counted.
    public func claimDue(
        lanes: [QueueLane: Int], others: Int, completion: @escaping @Sendable (Result<Claim, any Error>) -> Void
    ) {
        claimDue(lanes: lanes, others: others, counted: [], completion: completion)
    }
}

extension StoreService {
    /// Runs a job synchronously (for tools and tests).
    public func sync<T: Sendable>(
        _ body: (Self, @escaping @Sendable (Result<T, any Error>) -> Void) -> Void
    ) throws -> T {
        let box = ResultBox<T>()
        body(self) { box.set($0) }
        return try box.wait().get()
    }
}

/// A one-shot result that a caller can wait for.
final class ResultBox<T: Sendable>: Sendable {
    private let value = Locked<Result<T, any Error>?>(nil)

    func set(_ result: Result<T, any Error>) {
        value.withLock { $0 = result }
        value.broadcast()
    }

    func wait() -> Result<T, any Error> {
        value.withLock(when: { $0 != nil }) { $0! }
    }
}
