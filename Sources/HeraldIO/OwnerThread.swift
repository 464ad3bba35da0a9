import CHeraldSys

#if canImport(Glibc)
    import Glibc
#endif

/// Starts a detached thread named `name` that runs `body`, which may own
/// what the caller hands it: a database connection and its prepared
/// statements, made and checked before the thread starts. `body` is
/// `sending`, so the compiler checks that the caller keeps no reference to
/// anything it captures (unlike `Thread`, which takes only `@Sendable`
/// work): the thread is their one user from then on.
public func startOwnerThread(named name: String, _ body: sending @escaping () -> Void) {
    let context = Unmanaged.passRetained(ThreadStart(name: name, body: body)).toOpaque()
    var thread = pthread_t()
    let rc = pthread_create(
        &thread, nil,
        { context in
            let start = Unmanaged<ThreadStart>.fromOpaque(context!).takeRetainedValue()
            _ = hs_set_thread_name(start.name)
            start.body()
            return nil
        }, context)
    precondition(rc == 0, "pthread_create: \(rc)")
    pthread_detach(thread)
}

/// What the new thread runs, handed to `pthread_create`.
private final class ThreadStart {
    let name: String
    let body: () -> Void

    init(name: String, body: @escaping () -> Void) {
        self.name = name
        self.body = body
    }
}
