internal import CHeraldSys
import Foundation
import HeraldIO

#if canImport(Glibc)
    import Glibc
#endif

/// A fixed set of connections, each owned by a thread of its own, taking
/// jobs from one bounded queue: libpq's blocking calls never run on an event
/// loop. A job gets its thread's connection (reconnected first if it broke,
/// see ``PostgresConnection``); its completion runs on that thread and must
/// hand work elsewhere quickly.
///
/// When `queueLimit` jobs wait, `submit` refuses at once with `.queueFull`
/// rather than let the queue grow while the database is slow or away.
public final class PostgresPool: Sendable {
    private struct Job {
        let run: @Sendable (PostgresConnection) -> Void
    }

    /// What the callers and the pool's threads share; its condition wakes a
    /// thread when a job comes, and `close()` when the threads are done.
    private struct Shared {
        var queue: [Job] = []
        var stopping = false
        var running: Int
        /// Joined by `close()`: it returns once every thread is gone, its
        /// thread-local state (libpq's, OpenSSL's) freed.
        var threads: [pthread_t] = []
    }

    private let shared: Locked<Shared>

    /// Connections (and threads).
    public let size: Int
    /// The most jobs that may wait for a connection.
    public let queueLimit: Int

    /// Starts `size` threads; each opens its connection at once (a failure
    /// there is left to the first job: it reconnects or reports why not).
    /// Call `close()` before letting the pool go: the threads hold it.
    public init(
        configuration: PostgresConfiguration, size: Int = 8, queueLimit: Int = 4096, threadName: String = "herald-pg"
    ) {
        precondition(size >= 1 && queueLimit >= 1, "a pool needs a connection and room for a job")
        self.size = size
        self.queueLimit = queueLimit
        shared = Locked(Shared(running: size))
        var threads: [pthread_t] = []
        for index in 0..<size {
            let name = "\(threadName)\(index)"
            let body = ThreadBody { [self] in
                _ = hs_set_thread_name(name)
                self.run(connection: PostgresConnection(configuration: configuration))
            }
            var thread = pthread_t()
            let context = Unmanaged.passRetained(body).toOpaque()
            let rc = pthread_create(
                &thread, nil,
                { context in
                    Unmanaged<ThreadBody>.fromOpaque(context!).takeRetainedValue().run()
                    return nil
                }, context)
            precondition(rc == 0, "pthread_create: \(rc)")
            threads.append(thread)
        }
        shared.withLock { $0.threads = threads }
    }

    /// Jobs waiting for a connection.
    public var queued: Int { shared.withLock { $0.queue.count } }

    /// Queues `work` for the next free connection; `completion` gets its
    /// result on that connection's thread, or at once (on the caller's thread)
    /// `.queueFull` or `.closed`.
    public func submit<T>(
        _ work: @escaping @Sendable (PostgresConnection) throws -> T,
        completion: @escaping @Sendable (Result<T, any Error>) -> Void
    ) {
        let refusal = shared.withLock { s -> PostgresError? in
            if s.stopping { return PostgresError(.closed, "the PostgreSQL pool is closed") }
            if s.queue.count >= queueLimit {
                return PostgresError(.queueFull, "the PostgreSQL job queue is full (\(queueLimit) jobs waiting)")
            }
            s.queue.append(Job { connection in completion(Result { try work(connection) }) })
            return nil
        }
        if let refusal {
            completion(.failure(refusal))
        } else {
            shared.signal()
        }
    }

    /// Runs `work` on a pool connection and waits for it (for tools and tests).
    public func sync<T: Sendable>(_ work: @escaping @Sendable (PostgresConnection) throws -> T) throws -> T {
        let result = Locked<Result<T, any Error>?>(nil)
        submit(work) { answer in
            result.withLock { $0 = answer }
            result.broadcast()
        }
        return try result.withLock(when: { $0 != nil }) { $0! }.get()
    }

    /// Stops taking jobs, finishes those queued, closes every connection and
    /// waits for the threads to end.
    public func close() {
        shared.withLock { $0.stopping = true }
        shared.broadcast()
        let joining = shared.withLock(when: { $0.running == 0 }) { s in
            defer { s.threads.removeAll() }
            return s.threads
        }
        for thread in joining { pthread_join(thread, nil) }
    }

    private func run(connection: PostgresConnection) {
        try? connection.connect()
        while true {
            let job = shared.withLock(when: { !$0.queue.isEmpty || $0.stopping }) { s -> Job? in
                if s.queue.isEmpty {
                    s.running -= 1
                    return nil
                }
                return s.queue.removeFirst()
            }
            guard let job else {
                shared.broadcast()
                connection.close()
                return
            }
            job.run(connection)
        }
    }
}

/// What a pool thread runs, handed to `pthread_create`.
private final class ThreadBody {
    let run: () -> Void
    init(_ run: @escaping () -> Void) { self.run = run }
}
