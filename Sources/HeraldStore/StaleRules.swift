import HeraldCore

/// What removing a stale device runs, inside the caller's transaction: one
/// conformance per backend.
protocol StaleStatements: EventStatements {
    /// The app, user and platform of `deviceID` while it still holds the
    /// token `tokenHash`.
    func owner(deviceID: String, tokenHash: String) throws -> (app: String, device: RemovedDevice)?
    /// The stale deletions on `platform` since `since`, across every
    /// instance, counted under a lock that orders them; nil where the
    /// caller's own guard is exact (one instance owns the store).
    func recentDeletions(platform: String, since: Int64) throws -> Int?
    func deleteDevice(deviceID: String, tokenHash: String) throws
    /// Notes a deletion, where deletions are counted.
    func noteDeletion(platform: String, at: Int64) throws
    /// Records the delivery's result (a delivery no longer in flight here stays as it is).
    func recordResult(_ record: DeliveryRecord, now: Int64) throws
}

/// The rule of a stale token, for every backend: a provider called the
/// device's token stale and the scheduler's guards allowed the deletion.
enum StaleRules {
    /// Deletes the device if it still holds `tokenHash` (one that registered
    /// a new token meanwhile is kept) and the deletions of the last window
    /// on its platform are below `windowCap`, and records the delivery:
    /// `removed_stale`, or `failed` with the reason it was kept.
    static func remove(
        deliveryID: Int64, deviceID: String, tokenHash: String, httpStatus: Int?, reason: ProviderReason,
        windowCap: Int, receipt: ProviderReceipt?, now: Int64, _ s: some StaleStatements
    ) throws -> StaleRemoval {
        func finish(_ state: DeliveryState, _ why: RecordedReason) throws {
            try s.recordResult(
                DeliveryRecord(
                    deliveryID: deliveryID, deviceID: deviceID, state: state, httpStatus: httpStatus, reason: why,
                    nextAttemptAt: nil, receipt: receipt), now: now)
        }
        guard let owner = try s.owner(deviceID: deviceID, tokenHash: tokenHash) else {
            try finish(.failed, RecordedReason(reason, .deviceKept))
            return .kept
        }
        let platform = owner.device.platform
        if let recent = try s.recentDeletions(platform: platform, since: now - staleWindowMs), recent >= windowCap {
            try finish(.failed, RecordedReason(reason, .staleNotDeleted("window_cap_reached")))
            return .refusedWindowCap
        }
        try s.noteRemoved(app: owner.app, [owner.device], reason: .stale, now: now)
        try s.deleteDevice(deviceID: deviceID, tokenHash: tokenHash)
        try s.noteDeletion(platform: platform, at: now)
        try finish(.removedStale, RecordedReason(reason))
        return .removed
    }
}

/// A store whose queue follows the rules written once: how it runs one
/// queue job. The ``DeliveryQueue`` calls that are the same on every
/// backend are written in the extension below.
protocol QueueHost: DeliveryQueue {
    associatedtype QueueRows: StaleStatements

    /// Runs `work` in a write transaction that need not be durable before
    /// it is answered (a result: a crash before the commit leaves the
    /// delivery to be sent again); `settled` are the deliveries whose
    /// results it writes.
    func writeResults<T>(
        settling settled: [Int64], _ work: @escaping @Sendable (QueueRows, Int64) throws -> T,
        _ completion: @escaping @Sendable (Result<T, any Error>) -> Void)
}

extension QueueHost {
    public func removeStale(
        deliveryID: Int64, deviceID: String, tokenHash: String, httpStatus: Int?, reason: ProviderReason,
        windowCap: Int, receipt: ProviderReceipt?,
        completion: @escaping @Sendable (Result<StaleRemoval, any Error>) -> Void
    ) {
        writeResults(
            settling: [deliveryID],
            { rows, now in
                try StaleRules.remove(
                    deliveryID: deliveryID, deviceID: deviceID, tokenHash: tokenHash, httpStatus: httpStatus,
                    reason: reason, windowCap: windowCap, receipt: receipt, now: now, rows)
            }, completion)
    }
}
