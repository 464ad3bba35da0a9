import Foundation
public import HeraldCore
public import HeraldStore

/// A store that passes every call to `inner`: the base of the test doubles
/// that change a few calls of a real store (an outage of result writes, a
/// shared store's answers) and leave the rest to it. A subclass overrides
/// what it changes; nothing else is written again.
open class ForwardingStore: DeliveryStore, @unchecked Sendable {
    public let inner: any DeliveryStore

    public init(_ inner: any DeliveryStore) {
        self.inner = inner
    }

    open var keyOutcome: StoreKeyOutcome { inner.keyOutcome }
    open var recoveredDeliveries: Int { inner.recoveredDeliveries }
    open var unfinishedCompleted: Int { inner.unfinishedCompleted }
    open func close() { inner.close() }
    open func setWorkObserver(_ observer: @escaping @Sendable () -> Void) { inner.setWorkObserver(observer) }
    open func register(
        _ r: Registration, deviceCap: Int,
        completion: @escaping @Sendable (Result<RegistrationOutcome, any Error>) -> Void
    ) { inner.register(r, deviceCap: deviceCap, completion: completion) }
    open func unregister(
        app: String, user: String, _ s: UnregisterSelector,
        completion: @escaping @Sendable (Result<Int, any Error>) -> Void
    ) { inner.unregister(app: app, user: user, s, completion: completion) }
    open func list(
        app: String, user: String, completion: @escaping @Sendable (Result<[DeviceSummary], any Error>) -> Void
    ) {
        inner.list(app: app, user: user, completion: completion)
    }
    open func endSession(
        app: String, user: String, session: String, completion: @escaping @Sendable (Result<Int, any Error>) -> Void
    ) { inner.endSession(app: app, user: user, session: session, completion: completion) }
    open func forget(app: String, user: String, completion: @escaping @Sendable (Result<Int, any Error>) -> Void) {
        inner.forget(app: app, user: user, completion: completion)
    }
    open func registerActivity(
        _ registration: ActivityRegistration,
        completion: @escaping @Sendable (Result<ActivityOutcome, any Error>) -> Void
    ) { inner.registerActivity(registration, completion: completion) }
    open func unregisterActivity(
        app: String, user: String, _ selector: ActivitySelector,
        completion: @escaping @Sendable (Result<Int, any Error>) -> Void
    ) { inner.unregisterActivity(app: app, user: user, selector, completion: completion) }
    open func letGoActivityTokens(
        ids: [String], completion: @escaping @Sendable (Result<Int, any Error>) -> Void
    ) { inner.letGoActivityTokens(ids: ids, completion: completion) }
    open func recordChannel(
        app: String, channelID: String, environment: APNsEnvironment, bundleID: String, storesLatest: Bool,
        completion: @escaping @Sendable (Result<ChannelRecord, any Error>) -> Void
    ) {
        inner.recordChannel(
            app: app, channelID: channelID, environment: environment, bundleID: bundleID, storesLatest: storesLatest,
            completion: completion)
    }
    open func channels(
        app: String, channelID: String?, completion: @escaping @Sendable (Result<[ChannelRecord], any Error>) -> Void
    ) { inner.channels(app: app, channelID: channelID, completion: completion) }
    open func forgetChannel(
        app: String, channelID: String, completion: @escaping @Sendable (Result<Bool, any Error>) -> Void
    ) { inner.forgetChannel(app: app, channelID: channelID, completion: completion) }
    open func listActivities(
        app: String, user: String, completion: @escaping @Sendable (Result<[ActivityTokenSummary], any Error>) -> Void
    ) { inner.listActivities(app: app, user: user, completion: completion) }
    open func deviceCounts(completion: @escaping @Sendable (Result<[Platform: Int], any Error>) -> Void) {
        inner.deviceCounts(completion: completion)
    }
    open func deviceCountsByApp(completion: @escaping @Sendable (Result<[String: [Platform: Int]], any Error>) -> Void)
    {
        inner.deviceCountsByApp(completion: completion)
    }
    open func webSubscriptionsByKey(completion: @escaping @Sendable (Result<[ServerKeyCount], any Error>) -> Void) {
        inner.webSubscriptionsByKey(completion: completion)
    }
    open func recordServerKey(
        app: String, key: String, completion: @escaping @Sendable (Result<Int, any Error>) -> Void
    ) {
        inner.recordServerKey(app: app, key: key, completion: completion)
    }
    open func updateDevice(
        app: String, user: String, deviceID: String, name: String?, enabled: Bool?, preferences: PreferenceChanges,
        completion: @escaping @Sendable (Result<DeviceSummary?, any Error>) -> Void
    ) {
        inner.updateDevice(
            app: app, user: user, deviceID: deviceID, name: name, enabled: enabled, preferences: preferences,
            completion: completion)
    }
    open func deviceOwner(
        app: String, deviceID: String, completion: @escaping @Sendable (Result<String?, any Error>) -> Void
    ) { inner.deviceOwner(app: app, deviceID: deviceID, completion: completion) }
    open func enqueue(_ e: Enqueue, completion: @escaping @Sendable (Result<Enqueued, any Error>) -> Void) {
        inner.enqueue(e, completion: completion)
    }
    open func enqueue(
        _ e: Enqueue, handoff: [QueueLane: Int], limit: Int, early: (@Sendable (Claim) -> Void)?,
        completion: @escaping @Sendable (Result<(accepted: Enqueued, claim: Claim), any Error>) -> Void
    ) { inner.enqueue(e, handoff: handoff, limit: limit, early: early, completion: completion) }
    open func status(
        app: String, messageID: String, detail: Bool,
        completion: @escaping @Sendable (Result<MessageStatus?, any Error>) -> Void
    ) { inner.status(app: app, messageID: messageID, detail: detail, completion: completion) }
    open func cancel(app: String, messageID: String, completion: @escaping @Sendable (Result<Int?, any Error>) -> Void)
    {
        inner.cancel(app: app, messageID: messageID, completion: completion)
    }
    open func claimDue(
        lanes: [QueueLane: Int], others: Int, counted: Set<BatchKey>,
        completion: @escaping @Sendable (Result<Claim, any Error>) -> Void
    ) {
        inner.claimDue(lanes: lanes, others: others, counted: counted, completion: completion)
    }
    open func record(
        deliveryID: Int64, state: DeliveryState, httpStatus: Int?, reason: RecordedReason?, nextAttemptAt: Int64?,
        completion: @escaping @Sendable (Result<Void, any Error>) -> Void
    ) {
        inner.record(
            deliveryID: deliveryID, state: state, httpStatus: httpStatus, reason: reason, nextAttemptAt: nextAttemptAt,
            completion: completion)
    }
    open func record(_ records: [DeliveryRecord], completion: @escaping @Sendable (Result<Void, any Error>) -> Void) {
        inner.record(records, completion: completion)
    }
    open func releaseCredentialWaits(
        lanes: [QueueLane], completion: @escaping @Sendable (Result<Int, any Error>) -> Void
    ) {
        inner.releaseCredentialWaits(lanes: lanes, completion: completion)
    }
    open func removeStale(
        deliveryID: Int64, deviceID: String, tokenHash: String, httpStatus: Int?, reason: ProviderReason,
        windowCap: Int, receipt: ProviderReceipt?,
        completion: @escaping @Sendable (Result<StaleRemoval, any Error>) -> Void
    ) {
        inner.removeStale(
            deliveryID: deliveryID, deviceID: deviceID, tokenHash: tokenHash, httpStatus: httpStatus, reason: reason,
            windowCap: windowCap, receipt: receipt, completion: completion)
    }
    open func events(
        after cursor: EventCursor?, limit: Int, completion: @escaping @Sendable (Result<EventPage, any Error>) -> Void
    ) {
        inner.events(after: cursor, limit: limit, completion: completion)
    }
    open func eventsHead(completion: @escaping @Sendable (Result<EventCursor?, any Error>) -> Void) {
        inner.eventsHead(completion: completion)
    }
    open func append(_ events: [NewEvent], completion: @escaping @Sendable (Result<Void, any Error>) -> Void) {
        inner.append(events, completion: completion)
    }
    open func purgeEvents(
        olderThan retention: Duration, completion: @escaping @Sendable (Result<Int, any Error>) -> Void
    ) {
        inner.purgeEvents(olderThan: retention, completion: completion)
    }
    open func purgeMessages(
        olderThan retention: Duration, completion: @escaping @Sendable (Result<Int, any Error>) -> Void
    ) {
        inner.purgeMessages(olderThan: retention, completion: completion)
    }
    open func queueDepth(completion: @escaping @Sendable (Result<QueueDepth, any Error>) -> Void) {
        inner.queueDepth(completion: completion)
    }
    open func queueDepthByApp(completion: @escaping @Sendable (Result<[String: QueueDepth], any Error>) -> Void) {
        inner.queueDepthByApp(completion: completion)
    }
    open func ping(completion: @escaping @Sendable (Result<Void, any Error>) -> Void) {
        inner.ping(completion: completion)
    }
    open var isShared: Bool { inner.isShared }
    open func takeSharedToken(
        _ bucket: String, perMinute: Int, completion: @escaping @Sendable (Result<Int64?, any Error>) -> Void
    ) { inner.takeSharedToken(bucket, perMinute: perMinute, completion: completion) }
    open func forget(deliveryIDs: [Int64]) { inner.forget(deliveryIDs: deliveryIDs) }
    open func publish(lanes: Set<QueueLane>) { inner.publish(lanes: lanes) }
}
