import Dispatch
import Synchronization

/// The serial queue the delivery engine's parts run on. Each part keeps
/// its own state and touches it only here: every function that reads or
/// changes it begins with `owner.check()`, which traps in debug builds when
/// called from any other thread (as swift-nio's `assertInEventLoop`).
/// Release builds skip the check: it would cost every push a lookup.
final class EngineQueue: Sendable {
    let queue: DispatchQueue
    /// Work dispatched onto the queue so far (`async`), for tests that
    /// count the engine's hops (docs/architecture.md).
    private let dispatched = Atomic<Int>(0)

    init(label: String) {
        queue = DispatchQueue(label: label)
    }

    var dispatches: Int { dispatched.load(ordering: .relaxed) }

    @inline(__always)
    func check() {
        assert(
            {
                dispatchPrecondition(condition: .onQueue(queue))
                return true
            }())
    }

    func async(_ work: @escaping @Sendable () -> Void) {
        dispatched.add(1, ordering: .relaxed)
        queue.async(execute: work)
    }

    func async(afterMs ms: Int, _ work: @escaping @Sendable () -> Void) {
        dispatched.add(1, ordering: .relaxed)
        queue.asyncAfter(deadline: .now() + .milliseconds(ms), execute: work)
    }

    func sync<T>(_ work: () throws -> T) rethrows -> T {
        try queue.sync(execute: work)
    }
}
