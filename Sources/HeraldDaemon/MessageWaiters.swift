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
/// cancellation, at a deadline, and when the message has had no report for a
/// while: 50 ms after the last report or read, the gap doubling up to 500 ms
/// while the reads find nothing new (for what changes elsewhere: another
/// instance delivering some of the message, a newer message superseding). Each read
/// sets the tally to what it saw plus the reports that came while it was
/// under way (``WaitTally``), so a report counted twice costs one early read,
/// never a wrong answer, and none is lost; a fan-out of 500 deliveries
/// answered in a few dozen record batches costs two or three reads, not one
/// per batch. At most one read per message is outstanding.
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

    private let store: any DeliveryQueue
    private let log: Logger
    private var waiting: [String: Entry] = [:]

    private struct Entry {
        let app: String
        var waiters: [Waiter]
        var tally: WaitTally
    }
    private var reading = Set<String>()
    private var readAgain = Set<String>()

    /// Deadlines and quiet messages are checked this often.
    static let tickMs = 50

    /// Call `startTicking()` once to begin checking deadlines.
    init(store: any DeliveryQueue, log: Logger) {
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
        if !accepted.duplicate && accepted.devices > 0 && accepted.delivered == accepted.devices {
            // Every delivery was written delivered with the message: complete at its commit.
            waiter.reply(
                .success(
                    Self.answer(
                        accepted, complete: true,
                        counts: [.delivered: accepted.delivered, .skipped: accepted.skipped].filter { $0.value > 0 })))
            return
        }
        waiting[
            accepted.messageID,
            default: Entry(
                app: app, waiters: [],
                tally: WaitTally(total: accepted.devices + accepted.skipped, now: monotonicMilliseconds()))
        ]
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
        let now = monotonicMilliseconds()
        for (id, n) in finals {
            guard var entry = waiting[id] else { continue }
            let due = entry.tally.reported(n == Scheduler.unknownProgress ? nil : n, now: now)
            waiting[id] = entry
            if due { read(id) }
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
        for (id, entry) in waiting
        where (entry.tally.pollDue(now: now) && !reading.contains(id))
            || entry.waiters.contains(where: { now >= $0.deadline })
        {
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
        waiting[id]?.tally.readStarted(now: monotonicMilliseconds())
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
            let seen = status.counts.reduce(0) { $0 + ($1.key.isFinal ? $1.value : 0) }
            if entry.tally.readDone(sawFinal: seen, now: now) && !left.isEmpty { readAgain.insert(id) }
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

/// What a waiter knows of its message's progress between status reads, and
/// when it reads next.
///
/// A read's answer is the store as it stood when the read ran; reports that
/// come while it is under way may be in it or not. So the count after a read
/// is what it saw plus every report that came during it: a report counted
/// twice costs an early read; one dropped would leave the waiter until the
/// next poll.
struct WaitTally: Equatable {
    /// Every delivery of the message: when `final` reaches it, read.
    let total: Int
    /// Final deliveries as of the last read plus those reported since.
    private(set) var final = 0
    private(set) var reading = false
    private var reportedDuringRead = 0
    /// What the last read saw final.
    private var lastSeen = 0
    /// Monotonic ms of the next poll, and the gap before it.
    private(set) var pollAt: Int64
    private(set) var pollGap: Int64

    /// The first poll comes this long after the last report or read.
    static let firstPollMs: Int64 = 50
    /// The gap doubles up to this while nothing is reported.
    static let maxPollMs: Int64 = 500

    init(total: Int, now: Int64) {
        self.total = total
        pollGap = Self.firstPollMs
        pollAt = now + Self.firstPollMs
    }

    /// `n` more deliveries final (nil: an unknown number; read). True when a read is due.
    mutating func reported(_ n: Int?, now: Int64) -> Bool {
        let added = n ?? total
        final = n == nil ? total : final + added
        if reading { reportedDuringRead += added }
        pollGap = Self.firstPollMs
        pollAt = now + pollGap
        return final >= total
    }

    /// A read begins.
    mutating func readStarted(now: Int64) {
        reading = true
        reportedDuringRead = 0
        pollAt = now + pollGap
    }

    /// The read saw `sawFinal` deliveries final. The next poll is
    /// `firstPollMs` later if it saw more than the read before (the message
    /// moves, perhaps on another instance), else twice the last gap. True
    /// when the reports that came during it reach the total: read again.
    mutating func readDone(sawFinal: Int, now: Int64) -> Bool {
        reading = false
        pollGap = sawFinal > lastSeen ? Self.firstPollMs : min(pollGap * 2, Self.maxPollMs)
        pollAt = now + pollGap
        lastSeen = sawFinal
        final = sawFinal + reportedDuringRead
        let again = reportedDuringRead > 0 && final >= total
        reportedDuringRead = 0
        return again
    }

    func pollDue(now: Int64) -> Bool { now >= pollAt }
}
