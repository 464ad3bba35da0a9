import Foundation
import HeraldIO
import Synchronization

/// One store call waiting for a store thread: its work and its completion,
/// typed. The stores queue calls of every result type together as
/// `any QueuedCall<Context>` and run them in batches, one transaction per
/// batch; a call's answer waits until its transaction's fate is known.
protocol QueuedCall<Context>: Sendable {
    associatedtype Context
    /// Whether the caller is told "committed" as a promise (an accepted push,
    /// a registration): such a commit waits for the database's durability.
    var durable: Bool { get }
    /// What the call writes that a later read of the same key must see.
    var fence: String? { get }
    /// When the caller stops waiting (``CallDeadlines/now``, nanoseconds);
    /// a call still queued then is not run.
    var deadline: UInt64 { get }
    /// Takes the answer from the deadline, just before its work is kept:
    /// false when the deadline already answered the caller (the work must
    /// then be undone, or the caller, told "unavailable", finds it done).
    func keep() -> Bool
    /// Runs the work once (again after a lost race on PostgreSQL).
    func run(_ context: Context, now: Int64) -> CallOutcome
    /// Answers the caller with `error`; the work never ran or did not commit.
    func fail(_ error: any Error)
}

/// The outcome of one run of a call, answered once the batch's transaction
/// committed (`answer(nil)`) or failed (`answer(error)`).
struct CallOutcome {
    /// Why the work threw; nil when it returned.
    let error: (any Error)?
    let answer: (_ commitFailure: (any Error)?) -> Void
}

struct StoreCall<Context, T>: QueuedCall {
    let work: @Sendable (Context, Int64) throws -> T
    let completion: @Sendable (Result<T, any Error>) -> Void
    let durable: Bool
    let fence: String?
    var deadline: UInt64 = .max
    var keeper: (@Sendable () -> Bool)? = nil

    func keep() -> Bool { keeper?() ?? true }

    func run(_ context: Context, now: Int64) -> CallOutcome {
        do {
            let value = try work(context, now)
            return CallOutcome(error: nil) { failure in completion(failure.map { .failure($0) } ?? .success(value)) }
        } catch {
            return CallOutcome(error: error) { failure in completion(.failure(failure ?? error)) }
        }
    }

    func fail(_ error: any Error) { completion(.failure(error)) }
}

/// The deadlines of store calls: a call not answered by its deadline is
/// answered with ``StoreTimeout`` by ``sweep()`` (its work, if it runs or
/// commits later, answers no one), so that no caller waits on a database
/// that does not answer.
final class CallDeadlines: Sendable {
    /// One call's deadline. Whether it was answered (`done`) or expired is
    /// one atomic: ``keep(_:)`` and ``sweep(now:)`` each change it from
    /// `waiting` only, so a call is kept or expired, never both.
    final class Entry: Sendable {
        let due: UInt64
        fileprivate let state = Atomic<UInt8>(Entry.waiting)
        fileprivate let expire: @Sendable () -> Void

        fileprivate static let waiting: UInt8 = 0
        fileprivate static let done: UInt8 = 1
        fileprivate static let expired: UInt8 = 2

        fileprivate init(due: UInt64, expire: @escaping @Sendable () -> Void) {
            self.due = due
            self.expire = expire
        }
    }

    /// The calls not yet swept.
    private let entries = Locked<[Entry]>([])

    /// The monotonic clock the deadlines are on, in nanoseconds.
    static var now: UInt64 { DispatchTime.now().uptimeNanoseconds }

    func add(due: UInt64, expire: @escaping @Sendable () -> Void) -> Entry {
        let entry = Entry(due: due, expire: expire)
        entries.withLock { $0.append(entry) }
        return entry
    }

    /// The call was answered: its deadline no longer matters.
    func finish(_ entry: Entry) {
        _ = entry.state.compareExchange(expected: Entry.waiting, desired: Entry.done, ordering: .acquiringAndReleasing)
    }

    /// Its work is about to be kept: the deadline may no longer answer for
    /// it. False when it already did.
    func keep(_ entry: Entry) -> Bool {
        entry.state.compareExchange(expected: Entry.waiting, desired: Entry.done, ordering: .acquiringAndReleasing)
            .original != Entry.expired
    }

    /// Expires the calls past their deadline and forgets the answered ones;
    /// returns how many expired.
    @discardableResult
    func sweep(now: UInt64 = CallDeadlines.now) -> Int {
        var expired: [Entry] = []
        entries.withLock { entries in
            entries.removeAll { entry in
                guard entry.due <= now else {
                    return entry.state.load(ordering: .acquiring) == Entry.done
                }
                let (exchanged, _) = entry.state.compareExchange(
                    expected: Entry.waiting, desired: Entry.expired, ordering: .acquiringAndReleasing)
                if exchanged { expired.append(entry) }
                return true
            }
        }
        for entry in expired { entry.expire() }
        return expired.count
    }
}

/// A completion that runs once: the first of the work's answer and the
/// deadline's wins.
final class OnceCompletion<T>: Sendable {
    private let done = Locked(false)
    private let completion: @Sendable (Result<T, any Error>) -> Void

    init(_ completion: @escaping @Sendable (Result<T, any Error>) -> Void) {
        self.completion = completion
    }

    func complete(_ result: Result<T, any Error>) {
        let first = done.withLock { done in
            defer { done = true }
            return !done
        }
        if first { completion(result) }
    }
}

/// A store call that found no answer by its deadline: the database is slow,
/// locked or away. Whether its work ran is unknown.
public struct StoreTimeout: Error, CustomStringConvertible {
    public let seconds: Double
    public var description: String { "the store did not answer within \(seconds) s" }
}
