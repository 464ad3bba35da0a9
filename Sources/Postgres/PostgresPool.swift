internal import CHeraldSys
import Foundation

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
// @unchecked: the job queue is guarded by `condition`; each connection belongs to its thread.
public final class PostgresPool: @unchecked Sendable {
    private struct Job {
        let run: (PostgresConnection) -> Void
    }

    // Guarded by `condition`.
    private let condition = NSCondition()
    private var queue: [Job] = []
    private var stopping = false
    private var running = 0
    /// Joined by `close()`: it returns once every thread is gone, its
    /// thread-local state (libpq's, OpenSSL's) freed.
    private var threads: [pthread_t] = []

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
        running = size
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
    }

    /// Jobs waiting for a connection.
    public var queued: Int {
        condition.lock()
        defer { condition.unlock() }
        return queue.count
    }

    /// Queues `work` for the next free connection; `completion` gets its
    /// result on that connection's thread, or at once (on the caller's thread)
    /// `.queueFull` or `.closed`.
    public func submit<T>(
        _ work: @escaping (PostgresConnection) throws -> T,
        completion: @escaping @Sendable (Result<T, any Error>) -> Void
    ) {
        condition.lock()
        if stopping {
            condition.unlock()
            completion(.failure(PostgresError(.closed, "the PostgreSQL pool is closed")))
            return
        }
        if queue.count >= queueLimit {
            condition.unlock()
            completion(
                .failure(PostgresError(.queueFull, "the PostgreSQL job queue is full (\(queueLimit) jobs waiting)")))
            return
        }
        queue.append(Job { connection in completion(Result { try work(connection) }) })
        condition.signal()
        condition.unlock()
    }

    /// Runs `work` on a pool connection and waits for it (for tools and tests).
    public func sync<T>(_ work: @escaping (PostgresConnection) throws -> T) throws -> T {
        let box = WaitBox<T>()
        submit(work) { box.set($0) }
        return try box.wait().get()
    }

    /// Stops taking jobs, finishes those queued, closes every connection and
    /// waits for the threads to end.
    public func close() {
        condition.lock()
        stopping = true
        condition.broadcast()
        while running > 0 { condition.wait() }
        let joining = threads
        threads.removeAll()
        condition.unlock()
        for thread in joining { pthread_join(thread, nil) }
    }

    private func run(connection: PostgresConnection) {
        try? connection.connect()
        while true {
            condition.lock()
            while queue.isEmpty && !stopping { condition.wait() }
            if queue.isEmpty {
                running -= 1
                condition.broadcast()
                condition.unlock()
                connection.close()
                return
            }
            let job = queue.removeFirst()
            condition.unlock()
            job.run(connection)
        }
    }
}

/// What a pool thread runs, handed to `pthread_create`.
private final class ThreadBody {
    let run: () -> Void
    init(_ run: @escaping () -> Void) { self.run = run }
}

/// A one-shot result a caller can wait for.
// @unchecked: the value is set and read under the condition (NSCondition, visible to TSan).
private final class WaitBox<T>: @unchecked Sendable {
    private let condition = NSCondition()
    private var value: Result<T, any Error>?

    func set(_ result: Result<T, any Error>) {
        condition.lock()
        value = result
        condition.broadcast()
        condition.unlock()
    }

    func wait() -> Result<T, any Error> {
        condition.lock()
        defer { condition.unlock() }
        while value == nil { condition.wait() }
        return value!
    }
}
