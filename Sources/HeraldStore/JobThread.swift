internal import CHeraldSys
import HeraldIO

/// What a job thread's callers and the thread share, under its lock.
struct JobQueue<Extra> {
    var calls: [any QueuedCall<Tables>] = []
    var stopping = false
    var stopped = false
    /// What the owner keeps beside the queue under the same lock (the
    /// writer: fences, parked messages, durable calls queued).
    var extra: Extra
}

/// What runs on a job thread: how it takes a batch and how it runs one. It
/// is handed to the thread whole and lives there (its connection with it).
protocol JobWorker: SendableMetatype {
    associatedtype Extra
    /// The next batch, taken under the lock from a queue that is not empty.
    mutating func take(from queue: inout JobQueue<Extra>) -> [any QueuedCall<Tables>]
    /// Runs a batch (one transaction), on the thread, without the lock.
    mutating func run(_ batch: [any QueuedCall<Tables>], on thread: JobThread<Extra>)
    /// The queue is empty and closed: the thread's last work.
    mutating func stop()
}

extension JobWorker {
    mutating func stop() {}
}

/// A thread that owns one SQLite connection and runs the store's calls on
/// it in batches: the writer and both readers are one each. Callers queue
/// calls from any thread; `close()` lets the thread finish what is queued
/// and waits for it.
final class JobThread<Extra>: Sendable {
    private let shared: Locked<JobQueue<Extra>>

    init(_ extra: sending Extra) {
        shared = Locked(JobQueue(extra: extra))
    }

    /// Starts the thread, named `name`, at `nice` (Linux: the thread alone).
    func start<W: JobWorker>(named name: String, nice: Int32 = 0, _ worker: sending W) where W.Extra == Extra {
        startOwnerThread(named: name) { [self] in
            var worker = worker
            if nice != 0 { _ = hs_set_thread_nice(nice) }
            while true {
                let batch = shared.withLock(when: { !$0.calls.isEmpty || $0.stopping }) { q in
                    q.calls.isEmpty ? [] : worker.take(from: &q)
                }
                if batch.isEmpty {
                    worker.stop()
                    shared.withLock { $0.stopped = true }
                    shared.broadcast()
                    return
                }
                worker.run(batch, on: self)
            }
        }
    }

    /// Queues `call` (at the front with `front`), and lets `note` record it
    /// in the owner's state under the same lock; `false` when closed.
    func submit(
        _ call: any QueuedCall<Tables>, front: Bool = false, _ note: (inout Extra) -> Void = { _ in }
    ) -> Bool {
        let queued = shared.withLock { q in
            if q.stopping { return false }
            if front { q.calls.insert(call, at: 0) } else { q.calls.append(call) }
            note(&q.extra)
            return true
        }
        if queued { shared.signal() }
        return queued
    }

    /// The queue and the owner's state, under the lock (call ``signal()``
    /// after queueing through it).
    func withLock<T>(_ body: (inout JobQueue<Extra>) -> T) -> T {
        shared.withLock(body)
    }

    /// Wakes the thread for a call queued through ``withLock(_:)``.
    func signal() { shared.signal() }

    /// Stops taking calls, lets the thread finish the queued ones, and waits for it.
    func close() {
        shared.withLock { $0.stopping = true }
        shared.broadcast()
        shared.withLock(when: { $0.stopped }) { _ in }
    }
}
