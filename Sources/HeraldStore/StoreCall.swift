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
