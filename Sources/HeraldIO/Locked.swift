#if canImport(Glibc)
    import Glibc
#endif

/// A value guarded by a `pthread_mutex_t`: `withLock` gives exclusive access.
///
/// Used instead of `Synchronization.Mutex`, whose Linux implementation locks
/// with raw futex calls that ThreadSanitizer cannot see, so every access it
/// guards is reported as a race and `make test-tsan` could not tell a real
/// race from a guarded one. A pthread mutex is intercepted by TSan.
///
/// It also has a condition variable (on the monotonic clock): a thread can
/// wait, the lock released meanwhile, until the value is ready
/// (``withLock(when:timeout:_:)``), and the thread that changed it wakes it
/// (``signal()``, ``broadcast()``), in place of an `NSCondition` and the
/// fields it guards.
// @unchecked: the value is reached only inside withLock (and withLock(when:), whose wait lets the mutex go and takes it back), under the pthread mutex.
public final class Locked<Value>: @unchecked Sendable {
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private let condition: UnsafeMutablePointer<pthread_cond_t>
    private var value: Value

    public init(_ value: consuming sending Value) {
        self.value = value
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        pthread_mutex_init(mutex, nil)
        condition = .allocate(capacity: 1)
        condition.initialize(to: pthread_cond_t())
        var attributes = pthread_condattr_t()
        pthread_condattr_init(&attributes)
        pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
        pthread_cond_init(condition, &attributes)
        pthread_condattr_destroy(&attributes)
    }

    deinit {
        pthread_cond_destroy(condition)
        condition.deinitialize(count: 1)
        condition.deallocate()
        pthread_mutex_destroy(mutex)
        mutex.deinitialize(count: 1)
        mutex.deallocate()
    }

    /// Runs `body` with the value while holding the lock; `body` must not
    /// call `withLock` on the same instance (the mutex is not recursive).
    public func withLock<Result, Failure: Error>(
        _ body: (inout Value) throws(Failure) -> Result
    ) throws(Failure) -> Result {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&value)
    }

    /// Waits until `ready` holds, the lock released while it waits (a thread
    /// that changes the value wakes it with ``signal()`` or ``broadcast()``;
    /// `ready` is asked again, under the lock, at each wake-up), then runs
    /// `body` with the value while holding the lock. With `timeout`, it
    /// stops waiting once that much time has passed (monotonic clock), and
    /// `body` runs whether `ready` holds or not.
    public func withLock<Result, Failure: Error>(
        when ready: (inout Value) -> Bool, timeout: Duration? = nil,
        _ body: (inout Value) throws(Failure) -> Result
    ) throws(Failure) -> Result {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        if let timeout {
            var deadline = timespec()
            clock_gettime(CLOCK_MONOTONIC, &deadline)
            let (seconds, attoseconds) = max(timeout, .zero).components
            let nanoseconds = Int(deadline.tv_nsec) + Int(attoseconds / 1_000_000_000)
            deadline.tv_sec += Int(seconds) + nanoseconds / 1_000_000_000
            deadline.tv_nsec = nanoseconds % 1_000_000_000
            while !ready(&value) {
                if pthread_cond_timedwait(condition, mutex, &deadline) == ETIMEDOUT { break }
            }
        } else {
            while !ready(&value) { pthread_cond_wait(condition, mutex) }
        }
        return try body(&value)
    }

    /// Wakes one thread waiting in ``withLock(when:timeout:_:)``: for a
    /// change only one waiter can take (a job queued for a pool of workers).
    /// Call it after the change, with or without the lock.
    public func signal() {
        pthread_cond_signal(condition)
    }

    /// Wakes every thread waiting in ``withLock(when:timeout:_:)``. Call it
    /// after the change, with or without the lock.
    public func broadcast() {
        pthread_cond_broadcast(condition)
    }
}
