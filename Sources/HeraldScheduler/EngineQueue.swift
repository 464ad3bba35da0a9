import Dispatch

/// The serial queue the delivery engine's parts run on. Each part keeps
/// its own state and touches it only here: every function that reads or
/// changes it begins with `owner.check()`, which traps in debug builds when
/// called from any other thread (as swift-nio's `assertInEventLoop`).
/// Release builds skip the check: it would cost every push a lookup.
final class EngineQueue: Sendable {
    let queue: DispatchQueue

    init(label: String) {
        queue = DispatchQueue(label: label)
    }

    @inline(__always)
    func check() {
        assert(
            {
                dispatchPrecondition(condition: .onQueue(queue))
                return true
            }())
    }

    func async(_ work: @escaping @Sendable () -> Void) {
        queue.async(execute: work)
    }

    func async(afterMs ms: Int, _ work: @escaping @Sendable () -> Void) {
        queue.asyncAfter(deadline: .now() + .milliseconds(ms), execute: work)
    }

    func sync<T>(_ work: () throws -> T) rethrows -> T {
        try queue.sync(execute: work)
    }
}
