import Foundation
import HeraldCore
import HeraldIO
import HeraldScheduler
import HeraldStore
import HeraldJSON
import JSONRPC

/// `push.send` with `wait: true`: each call is answered once every delivery
/// of its message is final, or at its timeout, with the counts at that time.
///
/// A status read (a `GROUP BY` over the message's deliveries) happens when
/// the waiter is added, when the scheduler's progress reports add up to every
/// delivery being final (each report says how many of a message's deliveries
/// it made final), when a report says the store changed some by itself, on a
/// cancellation, at a deadline, and every 500 ms for what changes elsewhere
/// (a newer message superseding). Each read resets the tally to the truth,
/// so a report counted twice costs one early read, never a wrong answer; a
/// fan-out of 500 deliveries answered in a few dozen record batches costs
/// two or three reads, not one per batch. At most one read per message is
/// outstanding.
///
/// An actor: its callers (the loop, the scheduler's queue, store threads)
/// hand it work without waiting; nothing here is on the path of a send.
/// Reports may overtake one another: each read resets the tally to the
/// truth, so order costs at most an extra read.
actor MessageWaiters {
    typealias Reply = @Sendable (Result<JSON, RPCError>) -> Void

    private struct Waiter {
        let accepted: Enqueued
        /// Monotonic ms.
        let deadline: Int64
        let reply: Reply
    }

    private let store: any DeliveryStore
    private let log: Logger
    private var waiting: [String: Entry] = [:]

    private struct Entry {
        let app: String
        var waiters: [Waiter]
        /// Final deliveries as of the last read plus those reported since.
        var final = 0
        /// Every delivery of the message: when `final` reaches it, read.
        let total: Int
    }
    private var reading = Set<String>()
    private var readAgain = Set<String>()
    private var lastSweep: Int64 = 0

    /// Deadlines and the sweep are checked this often.
    static let tickMs = 50

    /// Call `startTicking()` once to begin checking deadlines.
    init(store: any DeliveryStore, log: Logger) {
        self.store = store
        self.log = log
    }

    /// Checks deadlines and sweeps every `tickMs` until the waiters are released for good.
    func startTicking() {
        Task { [weak self] in
            while let self, await self.tickOrStop() {
                try? await Task.sleep(for: .milliseconds(Self.tickMs))
            }
        }
    }

    private var released = false

    private func tickOrStop() -> Bool {
        guard !released else { return false }
        tick()
        return true
    }

    /// Waits for `accepted` (any thread; returns at once).
    nonisolated func add(app: String, accepted: Enqueued, timeoutMs: Int64, reply: @escaping Reply) {
        let waiter = Waiter(accepted: accepted, deadline: monotonicMilliseconds() + timeoutMs, reply: reply)
        Task { await self.insert(app: app, waiter) }
    }

    private func insert(app: String, _ waiter: Waiter) {
        let accepted = waiter.accepted
        waiting[accepted.messageID, default: Entry(app: app, waiters: [], total: accepted.devices + accepted.skipped)]
            .waiters.append(waiter)
        // Once released (stopping), a new waiter is answered with its first read.
        read(accepted.messageID, releasing: released)
    }

    /// The scheduler recorded deliveries of these messages, this many of
    /// each final (`Scheduler.unknownProgress`: read it) (any thread; returns at once).
    nonisolated func recorded(_ finals: [String: Int]) {
        Task { await self.tally(finals) }
    }

    private func tally(_ finals: [String: Int]) {
        for (id, n) in finals {
            guard var entry = waiting[id] else { continue }
            entry.final = n == Scheduler.unknownProgress ? entry.total : entry.final + n
            waiting[id] = entry
            if entry.final >= entry.total { read(id) }
        }
    }

    /// Deliveries of these messages changed by an unknown number: read them
    /// (any thread; returns at once).
    nonisolated func progressed(_ ids: Set<String>) {
        Task { await self.readAll(ids) }
    }

    private func readAll(_ ids: Set<String>) {
        for id in ids where waiting[id] != nil { read(id) }
    }

    /// Answers every waiter now, with the counts as they stand, and every
    /// later one at once (shutdown; any thread, returns at once).
    nonisolated func releaseAll() {
        Task { await self.release() }
    }

    private func release() {
        released = true
        for id in Array(waiting.keys) { read(id, releasing: true) }
    }

    var count: Int { waiting.values.reduce(0) { $0 + $1.waiters.count } }

    private func tick() {
        let now = monotonicMilliseconds()
        let sweep = now - lastSweep >= 500
        if sweep { lastSweep = now }
        for (id, entry) in waiting where sweep || entry.waiters.contains(where: { now >= $0.deadline }) {
            read(id)
        }
    }

    private func read(_ id: String, releasing: Bool = false) {
        guard let entry = waiting[id] else { return }
        if reading.contains(id) {
            readAgain.insert(id)
            return
        }
        reading.insert(id)
        store.status(app: entry.app, messageID: id, detail: false) { result in
            Task { await self.done(id, result, releasing: releasing) }
        }
    }

    private func done(_ id: String, _ result: Result<MessageStatus?, any Error>, releasing: Bool) {
        reading.remove(id)
        guard var entry = waiting[id] else { return }
        let now = monotonicMilliseconds()
        switch result {
        case .failure(let error):
            log.error("store_failed", ["error": String(describing: error)])
            for w in entry.waiters { w.reply(.failure(.storeUnavailable)) }
            waiting[id] = nil
            return
        case .success(nil):
            // Forgotten meanwhile (user.forget of every recipient): nothing left to wait for.
            for w in entry.waiters { w.reply(.success(Self.answer(w.accepted, complete: true, counts: [:]))) }
            waiting[id] = nil
            return
        case .success(let status?):
            let complete = status.isComplete
            var left: [Waiter] = []
            for w in entry.waiters {
                if complete || releasing || now >= w.deadline {
                    w.reply(.success(Self.answer(w.accepted, complete: complete, counts: status.counts)))
                } else {
                    left.append(w)
                }
            }
            entry.waiters = left
            entry.final = status.counts.reduce(0) { $0 + ($1.key.isFinal ? $1.value : 0) }
            waiting[id] = left.isEmpty ? nil : entry
        }
        if readAgain.remove(id) != nil { read(id) }
    }

    private static func answer(_ e: Enqueued, complete: Bool, counts: [DeliveryState: Int]) -> JSON {
        var o = HeraldService.acceptedJSON(e).objectValue ?? JSONObject()
        o.append("state", .string(complete ? "complete" : "pending"))
        o.append("counts", HeraldService.countsJSON(counts))
        return .object(o)
    }
}
