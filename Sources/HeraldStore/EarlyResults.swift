import Foundation
import HeraldIO

/// The results of a message's early sends that its own enqueue writes, on a
/// shared store, when the caller waits for the outcome (`push.send` with
/// `wait: true`).
///
/// A delivery sent before its message commits is otherwise written twice
/// more: in flight with the message, then moved to the history with its
/// result. Its enqueue can instead wait a few milliseconds, within
/// ``PostgresStore/resultHold``, before it writes the message's rows: each
/// delivery whose answer came meanwhile and says nothing more than
/// "delivered" (``DeliveryRecord/isPlainDelivery``) is written once, final,
/// in the same commit. The caller, who waits for every outcome anyway, has
/// its answer sooner, and the database writes a third of the rows.
///
/// The scheduler ``offer(_:)``s every answer of the message's early sends
/// until the commit is known; the enqueue takes what was kept with
/// ``next(waitingFor:atLeast:until:)`` (through ``ResultHolds``) until every
/// answer came or the hold ended, which closes it. Each result is taken by one side only: one the
/// enqueue kept is in the commit (or, the commit failed, nowhere, as every
/// result of a message that did not commit); one it refused, or offered
/// after the close, the scheduler writes as before.
public final class EarlyResults: Sendable {
    private struct State {
        var open = true
        var answers = 0
        /// Kept and not yet taken by the enqueue.
        var fresh: [DeliveryRecord] = []
    }

    private let state = Locked(State())

    public init() {}

    /// An answer to one of the message's early sends: `record`, or nil for
    /// one that is not a result yet (a stale answer waiting for its guards).
    /// True when the enqueue took the record to write with the message's
    /// rows: the caller must not write it.
    public func offer(_ record: DeliveryRecord?) -> Bool {
        let (answered, kept) = state.withLock { s -> (Bool, Bool) in
            guard s.open else { return (false, false) }
            s.answers += 1
            guard let record, record.isPlainDelivery else { return (true, false) }
            s.fresh.append(record)
            return (true, true)
        }
        if answered { state.broadcast() }
        return kept
    }

    /// Waits until `atLeast` results were kept since the last call, `count`
    /// answers came, or `deadline` (``CallDeadlines/now`` nanoseconds)
    /// passed. Returns the results kept since the last call, and whether it
    /// closed meanwhile (every answer came, or the deadline passed): later
    /// offers are then refused.
    func next(
        waitingFor count: Int, atLeast: Int, until deadline: UInt64
    ) -> (
        records: [DeliveryRecord], closed: Bool
    ) {
        let now = CallDeadlines.now
        return state.withLock(
            when: { s in !s.open || s.answers >= count || s.fresh.count >= atLeast || CallDeadlines.now >= deadline },
            timeout: .nanoseconds(deadline > now ? deadline - now : 0)
        ) { s in
            if s.answers >= count || CallDeadlines.now >= deadline { s.open = false }
            defer { s.fresh.removeAll() }
            return (s.fresh, !s.open)
        }
    }

    /// Closes it now: later offers are refused. Returns the results kept
    /// since the last ``next(waitingFor:atLeast:until:)``.
    func close() -> [DeliveryRecord] {
        state.withLock { s in
            s.open = false
            defer { s.fresh.removeAll() }
            return s.fresh
        }
    }

    /// Whether it still takes results.
    var isOpen: Bool { state.withLock { $0.open } }
}

/// How many enqueues hold their commit for results at once (each holds a
/// connection of the pool meanwhile), and for how long at most.
final class ResultHolds: Sendable {
    /// Enqueues holding their commit now.
    private let holding = Locked(0)
    let limit: Int
    /// Nanoseconds.
    let longest: UInt64

    init(limit: Int, longest: Duration) {
        self.limit = max(1, limit)
        self.longest = UInt64(max(0, longest.wholeMillisecondsValue)) * 1_000_000
    }

    /// Hands `body` the results `box` keeps as they come, in parts of
    /// ``part`` at least, until `count` answers came, waiting at most
    /// ``longest`` and never past `latest`; returns the last part (the
    /// caller writes it with the rest). Without room for one more holder it
    /// closes `box` at once (what was offered until then is still taken).
    /// `box` is closed when it returns or throws.
    func drain(
        _ box: EarlyResults, waitingFor count: Int, latest: UInt64, _ body: ([DeliveryRecord]) throws -> Void
    ) throws -> [DeliveryRecord] {
        let entered = holding.withLock { holding in
            guard holding < limit else { return false }
            holding += 1
            return true
        }
        guard entered else { return box.close() }
        defer { holding.withLock { $0 -= 1 } }
        let deadline = min(CallDeadlines.now + longest, latest)
        do {
            while true {
                let (records, closed) = box.next(waitingFor: count, atLeast: Self.part, until: deadline)
                if closed { return records }
                try body(records)
            }
        } catch {
            _ = box.close()
            throw error
        }
    }

    /// Results written in one statement while the rest are still coming.
    static let part = 64
}
