import HeraldCore
import HeraldDelivery
import HeraldIO

/// What other threads read of the engine: the lanes and Web Push origins
/// degraded, and the figures of `system.stats`. The one part not owned by
/// the engine's queue: every field is behind `state`'s lock, so the daemon
/// reads it from any thread without waiting for the queue.
final class Health: Sendable {
    private struct State {
        var stats = SchedulerStats()
        var degraded: [QueueLane: String] = [:]
        /// Web Push origins (per lane) whose service answered 401/403, or
        /// that stopped answering, with the reason; oldest first in
        /// `originOrder`, bounded.
        var degradedOrigins: [QueueLane: [String: String]] = [:]
        var originOrder: [(lane: QueueLane, origin: String)] = []
    }

    private let state = Locked(State())
    private let log: Logger?
    private let originLimit: Int
    /// Told of each lane that degrades (`degraded`, the reason) or recovers
    /// (`recovered`), after the change; any thread.
    let observer = Locked<(@Sendable (QueueLane, LaneChange) -> Void)?>(nil)

    init(log: Logger?, originLimit: Int) {
        self.log = log
        self.originLimit = max(1, originLimit)
    }

    var stats: SchedulerStats { state.withLock { $0.stats } }
    var degradedLanes: [QueueLane: String] { state.withLock { $0.degraded } }
    var degradedOrigins: [QueueLane: [String: String]] { state.withLock { $0.degradedOrigins } }

    func isDegraded(_ lane: QueueLane) -> Bool { state.withLock { $0.degraded[lane] != nil } }

    func publish(_ update: (inout SchedulerStats) -> Void) {
        state.withLock { update(&$0.stats) }
    }

    func markDegraded(_ lane: QueueLane, reason: ProviderReason) {
        let changed = state.withLock { s -> Bool in
            let before = s.degraded[lane]
            s.degraded[lane] = reason.rawValue
            return before != reason.rawValue
        }
        if changed {
            log?.warning(
                "transport_degraded", ["app": lane.app, "platform": lane.platform.rawValue, "reason": reason.rawValue])
            observer.withLock { $0 }?(lane, .degraded(reason))
        }
    }

    /// Clears the lane's degradation; whether it had one.
    func clearDegraded(_ lane: QueueLane) -> Bool {
        let was = state.withLock { $0.degraded.removeValue(forKey: lane) }
        guard was != nil else { return false }
        log?.info("transport_recovered", ["app": lane.app, "platform": lane.platform.rawValue])
        observer.withLock { $0 }?(lane, .recovered)
        return true
    }

    func markOriginDegraded(_ origin: String, lane: QueueLane, reason: ProviderReason) {
        let limit = originLimit
        let changed = state.withLock { s -> Bool in
            let before = s.degradedOrigins[lane]?[origin]
            if before == nil {
                s.originOrder.append((lane, origin))
                while s.originOrder.count > limit {
                    let (oldLane, oldOrigin) = s.originOrder.removeFirst()
                    s.degradedOrigins[oldLane]?[oldOrigin] = nil
                    if s.degradedOrigins[oldLane]?.isEmpty == true { s.degradedOrigins[oldLane] = nil }
                }
            }
            s.degradedOrigins[lane, default: [:]][origin] = reason.rawValue
            return before != reason.rawValue
        }
        if changed {
            log?.warning(
                "webpush_origin_degraded",
                ["app": lane.app, "platform": lane.platform.rawValue, "origin": origin, "reason": reason.rawValue])
        }
    }

    func clearOriginDegraded(_ origin: String, lane: QueueLane) {
        let was = state.withLock { s -> String? in
            guard let was = s.degradedOrigins[lane]?.removeValue(forKey: origin) else { return nil }
            if s.degradedOrigins[lane]?.isEmpty == true { s.degradedOrigins[lane] = nil }
            s.originOrder.removeAll { $0.lane == lane && $0.origin == origin }
            return was
        }
        if was != nil {
            log?.info(
                "webpush_origin_recovered", ["app": lane.app, "platform": lane.platform.rawValue, "origin": origin])
        }
    }

    /// Forgets the origin's `timeout` degradation on every lane (it was
    /// marked on the lane whose send tipped it; any lane's answer ends it).
    func clearOriginTimeouts(_ origin: String) {
        let lanes = state.withLock { s -> [QueueLane] in
            let lanes = s.degradedOrigins.compactMap { lane, origins in
                origins[origin] == ProviderReason.timeout.rawValue ? lane : nil
            }
            for lane in lanes {
                s.degradedOrigins[lane]?[origin] = nil
                if s.degradedOrigins[lane]?.isEmpty == true { s.degradedOrigins[lane] = nil }
            }
            s.originOrder.removeAll { $0.origin == origin && lanes.contains($0.lane) }
            return lanes
        }
        for lane in lanes {
            log?.info(
                "webpush_origin_recovered", ["app": lane.app, "platform": lane.platform.rawValue, "origin": origin])
        }
    }
}

/// The per-platform counters of `system.stats` (engine queue only).
final class Tally {
    private let owner: EngineQueue
    private(set) var platforms: [Platform: PlatformCounters] = [:]

    init(owner: EngineQueue) {
        self.owner = owner
    }

    func add(_ platform: Platform, _ counter: WritableKeyPath<PlatformCounters, Int>) {
        owner.check()
        platforms[platform, default: PlatformCounters()][keyPath: counter] += 1
    }

    func sendLatency(_ platform: Platform, microseconds: Int64) {
        owner.check()
        platforms[platform, default: PlatformCounters()].sendLatency.record(microseconds: microseconds)
    }
}

/// The messages whose deliveries changed, each with how many of them
/// became final (``Scheduler/unknownProgress``: read the message), handed
/// to `onProgress` once per turn of the engine's queue (engine queue only).
final class Progress {
    private unowned let s: Scheduler
    private var touched: [String: Int] = [:]
    private var scheduled = false

    init(_ s: Scheduler) {
        self.s = s
    }

    /// Changed by an unknown number (the store finished some itself).
    func unknown(_ messageID: String) {
        s.owner.check()
        touched[messageID] = Scheduler.unknownProgress
    }

    /// One more result of the message, final or not.
    func add(_ messageID: String, final: Bool) {
        s.owner.check()
        touched[messageID] = (touched[messageID] ?? 0).addingFinal(final)
    }

    /// `count` final results of the message.
    func add(_ messageID: String, finals count: Int) {
        s.owner.check()
        let n = touched[messageID] ?? 0
        touched[messageID] = n == Scheduler.unknownProgress ? n : n + count
    }

    func schedule() {
        s.owner.check()
        guard !scheduled, !touched.isEmpty else { return }
        scheduled = true
        s.owner.async { [s] in s.progress.report() }
    }

    private func report() {
        s.owner.check()
        scheduled = false
        let ids = touched
        touched.removeAll()
        if !ids.isEmpty { s.onProgress?(ids) }
    }
}

extension Int {
    /// A message's progress count after one more result, final or not
    /// (``Scheduler/unknownProgress`` stays unknown).
    fileprivate func addingFinal(_ final: Bool) -> Int {
        self == Scheduler.unknownProgress ? self : self + (final ? 1 : 0)
    }
}
