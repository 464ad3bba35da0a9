#if canImport(Glibc)
    import Glibc
#endif

/// A value guarded by a `pthread_mutex_t`: `withLock` gives exclusive access.
///
/// Used instead of `Synchronization.Mutex`, whose Linux implementation locks
/// with raw futex calls that ThreadSanitizer cannot see, so every access it
/// guards is reported as a race and `make test-tsan` could not tell a real
/// race from a guarded one. A pthread mutex is intercepted by TSan.
// @unchecked: the value is reached only through withLock, under the pthread mutex.
public final class Locked<Value>: @unchecked Sendable {
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private var value: Value

    public init(_ value: Value) {
        self.value = value
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        pthread_mutex_init(mutex, nil)
    }

    deinit {
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
}
