public import HeraldCore

/// A device a provider called stale, with the token hash that was sent, so the
/// deletion can be skipped if the device has registered a new token meanwhile.
public struct StaleCandidate: Sendable, Hashable {
    public let deviceID: String
    public let tokenHash: String

    public init(deviceID: String, tokenHash: String) {
        self.deviceID = deviceID
        self.tokenHash = tokenHash
    }
}

/// Why a stale device was not deleted.
public enum StaleRefusal: String, Sendable, Hashable {
    /// At least `stale_batch_ratio` of the message's batch on this platform was stale.
    case breakerTripped = "breaker_tripped"
    /// `stale_window_cap` deletions were already made on this platform in the last 60 s.
    case windowCapReached = "window_cap_reached"
    /// The batch was finished before enough results came in to rule the breaker out.
    case batchUnresolved = "batch_unresolved"
    /// The report named a batch that was never registered or is already complete.
    case unknownBatch = "unknown_batch"
}

/// The guard's ruling on one stale device.
public struct StaleVerdict: Sendable, Hashable {
    public enum Disposition: Sendable, Hashable {
        /// Not decided yet: the batch's outcome is not known. A later call on the
        /// same batch returns exactly one `delete` or `refused` for this candidate.
        case held
        /// Delete the device now (if it still holds `candidate.tokenHash`).
        case delete
        /// Keep the device.
        case refused(StaleRefusal)
    }

    public let candidate: StaleCandidate
    public let messageID: String
    public let platform: Platform
    public let disposition: Disposition

    public init(candidate: StaleCandidate, messageID: String, platform: Platform, disposition: Disposition) {
        self.candidate = candidate
        self.messageID = messageID
        self.platform = platform
        self.disposition = disposition
    }
}

/// Per-platform counts for `system.stats`.
public struct StaleCounters: Sendable, Hashable {
    /// Deletions the guard allowed.
    public var staleRemoved = 0
    /// Stale devices the guard kept, whatever the reason.
    public var staleRefused = 0
    /// Batches in which the ratio breaker tripped (once per batch).
    public var breakerTrips = 0

    public init(staleRemoved: Int = 0, staleRefused: Int = 0, breakerTrips: Int = 0) {
        self.staleRemoved = staleRemoved
        self.staleRefused = staleRefused
        self.breakerTrips = breakerTrips
    }
}

/// The guards on deleting stale devices (SPEC "Delivery rules"), per platform.
///
/// **Batch breaker.** The scheduler registers each message's batch per platform
/// with its size, then reports every device of it exactly once, when that
/// device's delivery is final: ``reportStale(_:messageID:platform:now:)`` for a
/// stale answer, ``reportNotStale(messageID:platform:now:)`` for any other final
/// state. In a batch of at least `batchMin` devices, stale devices are *held*
/// until the batch's outcome is certain, which is usually long before the last
/// report arrives:
/// - as soon as the stale count reaches the ratio threshold the breaker trips:
///   every held and every later stale device of the batch is refused, and
///   `breakerTrips` counts one;
/// - as soon as enough devices were not stale that the threshold can no longer
///   be reached, the held devices are released to the window cap, and later
///   stale devices of the batch go straight to it.
/// A batch of fewer than `batchMin` devices skips the breaker. A batch is
/// forgotten once all its devices are reported, or on ``finish(messageID:platform:)``,
/// which refuses anything still held (fail-safe: the missing answers might have
/// been stale).
///
/// **Window cap.** At most `windowCap` deletions per platform in any 60 s,
/// exactly (a log of the deletion times, at most `windowCap` entries). Excess
/// stale devices are refused, not queued: the next send to them finds them
/// stale again. The cap is shared among the apps: once half of it is used,
/// an app takes more only while its own deletions in the window stay under
/// its share, the cap divided among the apps with deletions in the window
/// (one more seat while one of the `apps` configured has none), so one app's
/// mass of stale devices cannot use up another's. With one app configured
/// it may use the whole cap.
///
/// Every call returns the verdicts it reached, each to be acted on once; a
/// stale report always yields a verdict for its own candidate (possibly `held`).
/// Pure state, no I/O and no clock of its own: `now` is ms since the epoch, and
/// the owner (the scheduler's isolation domain) serialises calls.
public struct StaleGuard: Sendable {
    /// `[delivery] stale_window_cap`, `stale_batch_ratio`, `stale_batch_min`.
    public struct Settings: Sendable, Hashable {
        public var windowCap: Int
        public var batchRatio: Double
        public var batchMin: Int

        public init(windowCap: Int = 500, batchRatio: Double = 0.5, batchMin: Int = 4) {
            self.windowCap = windowCap
            self.batchRatio = batchRatio
            self.batchMin = batchMin
        }
    }

    /// The sliding window of the deletion cap.
    public static let window = Duration.seconds(60)

    public let settings: Settings

    private enum Phase: Sendable {
        /// Below `batchMin`: stale devices go straight to the window cap.
        case unguarded
        case pending
        case tripped
        case released
    }

    private struct Batch: Sendable {
        let size: Int
        /// The app of the message (known from its first stale report).
        var app = ""
        let threshold: Int
        var phase: Phase
        var stale = 0
        var notStale = 0
        var held: [StaleCandidate] = []

        var reported: Int { stale + notStale }
    }

    private var batches: [BatchKey: Batch] = [:]
    private var windows: [Platform: SlidingWindowLog] = [:]
    /// Each app's part of `windows`; an entry whose window is empty is dropped.
    private var appWindows: [AppPlatform: SlidingWindowLog] = [:]
    /// The apps configured, for their shares of the window cap (at least 1).
    public var apps = 1

    private struct AppPlatform: Hashable, Sendable {
        let app: String
        let platform: Platform
    }
    private var counters: [Platform: StaleCounters] = [:]

    public init(settings: Settings = Settings()) {
        self.settings = settings
    }

    // MARK: Reporting

    /// Opens the batch of `size` devices that `messageID` addresses on `platform`.
    /// Returns false (and changes nothing) when `size` is not positive or the
    /// batch is already open.
    @discardableResult
    public mutating func register(messageID: String, platform: Platform, size: Int) -> Bool {
        let key = BatchKey(messageID: messageID, platform: platform)
        guard size > 0, batches[key] == nil else { return false }
        if size < settings.batchMin {
            batches[key] = Batch(size: size, threshold: size + 1, phase: .unguarded)
        } else {
            batches[key] = Batch(size: size, threshold: breakerThreshold(batchSize: size), phase: .pending)
        }
        return true
    }

    /// One device of the batch came back stale. Returns this candidate's verdict
    /// and any held ones of the same batch that this report decided.
    public mutating func reportStale(
        _ candidate: StaleCandidate, messageID: String, platform: Platform, app: String = "", now: Int64
    ) -> [StaleVerdict] {
        let key = BatchKey(messageID: messageID, platform: platform)
        guard var batch = batches.removeValue(forKey: key) else {
            counters[platform, default: StaleCounters()].staleRefused += 1
            return [verdict(candidate, key, .refused(.unknownBatch))]
        }
        batch.app = app
        batch.stale += 1
        var verdicts: [StaleVerdict] = []
        switch batch.phase {
        case .unguarded, .released:
            verdicts.append(admit(candidate, key, app: batch.app, now: now))
        case .tripped:
            counters[platform, default: StaleCounters()].staleRefused += 1
            verdicts.append(verdict(candidate, key, .refused(.breakerTripped)))
        case .pending:
            batch.held.append(candidate)
            verdicts = settle(&batch, key, now: now)
            if batch.phase == .pending { verdicts.append(verdict(candidate, key, .held)) }
        }
        store(batch, key)
        return verdicts
    }

    /// One device of the batch reached a final state other than stale
    /// (delivered, failed, expired, superseded, skipped). Returns the held
    /// verdicts this decided, if any.
    public mutating func reportNotStale(messageID: String, platform: Platform, now: Int64) -> [StaleVerdict] {
        let key = BatchKey(messageID: messageID, platform: platform)
        guard var batch = batches.removeValue(forKey: key) else { return [] }
        batch.notStale += 1
        let verdicts = settle(&batch, key, now: now)
        store(batch, key)
        return verdicts
    }

    /// Closes a batch before all its devices were reported (message cancelled,
    /// shutdown). Devices still held are refused with `batchUnresolved`.
    public mutating func finish(messageID: String, platform: Platform) -> [StaleVerdict] {
        let key = BatchKey(messageID: messageID, platform: platform)
        guard let batch = batches.removeValue(forKey: key), !batch.held.isEmpty else { return [] }
        counters[platform, default: StaleCounters()].staleRefused += batch.held.count
        return batch.held.map { verdict($0, key, .refused(.batchUnresolved)) }
    }

    // MARK: Inspection

    /// The counters of one platform.
    public func counters(for platform: Platform) -> StaleCounters { counters[platform] ?? StaleCounters() }

    /// Batches registered and not yet complete or finished.
    public var openBatches: Int { batches.count }

    /// The open batches, or none when there are more than `limit` (a claim
    /// told of none counts every batch it touches).
    public func openBatchKeys(limit: Int) -> Set<BatchKey> {
        batches.count > limit ? [] : Set(batches.keys)
    }

    /// Whether the batch of `messageID` on `platform` is registered and not yet complete or finished.
    public func isOpen(messageID: String, platform: Platform) -> Bool {
        batches[BatchKey(messageID: messageID, platform: platform)] != nil
    }

    /// Stale devices waiting for their batch's outcome.
    public var heldCount: Int { batches.values.reduce(0) { $0 + $1.held.count } }

    /// Deletions on `platform` in the 60 s ending at `now`.
    public mutating func windowOccupancy(platform: Platform, now: Int64) -> Int {
        windows[platform]?.occupancy(now: now) ?? 0
    }

    /// Timestamps the window log of `platform` holds in memory (≤ `windowCap`).
    public var windowStorage: [Platform: Int] { windows.mapValues(\.storage) }

    /// The number of stale devices that trips the breaker in a batch of
    /// `batchSize` (≥ `batchMin`): the least k ≥ 1 with k / size ≥ ratio;
    /// `batchSize + 1` (never) when the ratio is above 1.
    public func breakerThreshold(batchSize size: Int) -> Int {
        let ratio = settings.batchRatio
        guard size > 0, ratio > 0 else { return 1 }  // a NaN ratio lands here too: fail safe
        guard ratio <= 1 else { return size + 1 }
        let reaches = { (k: Int) in Double(k) / Double(size) >= ratio }
        var k = Swift.min(size, Swift.max(1, Int((ratio * Double(size)).rounded(.up))))
        while k > 1, reaches(k - 1) { k -= 1 }
        while k <= size, !reaches(k) { k += 1 }
        return k
    }

    // MARK: Internals

    /// Trips or releases a pending batch once its outcome is certain.
    private mutating func settle(_ batch: inout Batch, _ key: BatchKey, now: Int64) -> [StaleVerdict] {
        guard batch.phase == .pending else { return [] }
        let unreported = batch.size - batch.reported
        if batch.stale >= batch.threshold {
            batch.phase = .tripped
            counters[key.platform, default: StaleCounters()].breakerTrips += 1
            counters[key.platform, default: StaleCounters()].staleRefused += batch.held.count
            defer { batch.held = [] }
            return batch.held.map { verdict($0, key, .refused(.breakerTripped)) }
        }
        if batch.stale + unreported < batch.threshold {
            batch.phase = .released
            defer { batch.held = [] }
            let app = batch.app
            return batch.held.map { admit($0, key, app: app, now: now) }
        }
        return []
    }

    /// Puts the batch back unless every device has been reported.
    private mutating func store(_ batch: Batch, _ key: BatchKey) {
        if batch.reported < batch.size { batches[key] = batch }
    }

    /// Passes one deletion through the platform's window cap.
    private mutating func admit(
        _ candidate: StaleCandidate, _ key: BatchKey, app: String, now: Int64
    ) -> StaleVerdict {
        let window = StaleGuard.window.wholeMilliseconds
        let cap = settings.windowCap
        var total = windows[key.platform, default: SlidingWindowLog(limit: cap, window: window)]
        let mine = AppPlatform(app: app, platform: key.platform)
        var own = appWindows[mine, default: SlidingWindowLog(limit: cap, window: window)]
        let admitted = total.occupancy(now: now) < cap && withinShare(own.occupancy(now: now), total.count, mine, now)
        if admitted {
            _ = total.admit(now: now)
            _ = own.admit(now: now)
        }
        windows[key.platform] = total
        appWindows[mine] = own.count > 0 ? own : nil
        if admitted {
            counters[key.platform, default: StaleCounters()].staleRemoved += 1
            return verdict(candidate, key, .delete)
        }
        counters[key.platform, default: StaleCounters()].staleRefused += 1
        return verdict(candidate, key, .refused(.windowCapReached))
    }

    /// Whether an app holding `own` of the window's `total` deletions may
    /// take one more: always below half the cap, past it while under the
    /// app's share.
    private mutating func withinShare(_ own: Int, _ total: Int, _ mine: AppPlatform, _ now: Int64) -> Bool {
        let cap = settings.windowCap
        guard apps > 1, total >= cap / 2 else { return true }
        var active = own == 0 ? 1 : 0
        for (other, _) in appWindows where other.platform == mine.platform {
            if appWindows[other]!.occupancy(now: now) > 0 {
                active += 1
            } else {
                appWindows[other] = nil
            }
        }
        let seats = active + (active < apps ? 1 : 0)
        return own < max(1, cap / max(1, seats))
    }

    private func verdict(
        _ candidate: StaleCandidate, _ key: BatchKey, _ disposition: StaleVerdict.Disposition
    ) -> StaleVerdict {
        StaleVerdict(candidate: candidate, messageID: key.messageID, platform: key.platform, disposition: disposition)
    }
}
