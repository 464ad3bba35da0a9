import CHeraldSys
import Foundation

import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// One epoll thread that owns every socket. Other threads hand it work with
/// `execute`, which wakes it through an eventfd. Everything registered with
/// the loop is touched only on the loop thread.
// @unchecked: the handlers, ticks and hooks are touched on the loop thread only (preconditionInLoop; before `run`, by the thread setting it up); the queued work is in a Locked.
public final class EventLoop: @unchecked Sendable {
    public typealias Handler = (_ events: UInt32) -> Void

    private let epfd: Int32
    private let wakeFD: Int32
    private var handlers: [Int32: Handler] = [:]  // loop thread only
    private var ticks: [(interval: Int64, last: Int64, body: () -> Void)] = []  // loop thread only
    /// Work queued for the loop thread, and whether `stop` was asked for.
    private let inbox = Locked<(pending: [@Sendable () -> Void], stopRequested: Bool)>(([], false))
    /// The thread running `run` (0 before it runs), read from any thread.
    private let owner = Atomic<UInt>(0)
    /// Runs after each iteration's events and queued work (loop thread only).
    public var afterIteration: (() -> Void)?
    /// True when a component has work left for the next iteration, so the
    /// loop polls without blocking (loop thread only).
    public var hasDeferredWork: (() -> Bool)?

    public init() throws(SystemError) {
        epfd = try syscall("epoll_create1") { epoll_create1(Int32(EPOLL_CLOEXEC)) }
        wakeFD = try syscall("eventfd") { eventfd(0, Int32(EFD_CLOEXEC | EFD_NONBLOCK)) }
        try add(wakeFD, events: UInt32(EPOLLIN.rawValue)) { [wakeFD] _ in
            var value: UInt64 = 0
            _ = read(wakeFD, &value, 8)
        }
    }

    deinit {
        close(wakeFD)
        close(epfd)
    }

    public var inLoop: Bool {
        let t = owner.load(ordering: .acquiring)
        return t != 0 && pthread_equal(t, pthread_self()) != 0
    }

    /// Traps in debug builds when called off the loop thread (before `run`,
    /// the thread setting the loop up is its only user).
    @inline(__always)
    public func preconditionInLoop(file: StaticString = #fileID, line: UInt = #line) {
        assert(
            owner.load(ordering: .acquiring) == 0 || inLoop, "called off the event loop thread", file: file, line: line)
    }

    public func add(_ fd: Int32, events: UInt32, handler: @escaping Handler) throws(SystemError) {
        preconditionInLoop()
        var ev = epoll_event(events: events, data: epoll_data_t(fd: fd))
        try syscall("epoll_ctl(ADD)") { epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) }
        handlers[fd] = handler
    }

    public func modify(_ fd: Int32, events: UInt32) {
        preconditionInLoop()
        var ev = epoll_event(events: events, data: epoll_data_t(fd: fd))
        _ = epoll_ctl(epfd, EPOLL_CTL_MOD, fd, &ev)
    }

    public func remove(_ fd: Int32) {
        preconditionInLoop()
        _ = epoll_ctl(epfd, EPOLL_CTL_DEL, fd, nil)
        handlers[fd] = nil
    }

    /// Runs body on the loop thread every interval milliseconds (loop thread only).
    public func every(milliseconds interval: Int64, _ body: @escaping () -> Void) {
        preconditionInLoop()
        ticks.append((interval, monotonicMilliseconds(), body))
    }

    /// Queues work for the loop thread; safe from any thread.
    public func execute(_ work: @escaping @Sendable () -> Void) {
        let first = inbox.withLock { inbox in
            inbox.pending.append(work)
            return inbox.pending.count == 1
        }
        if first {
            var one: UInt64 = 1
            _ = write(wakeFD, &one, 8)
        }
    }

    /// Asks the loop to return from `run` after the current iteration.
    public func stop() {
        inbox.withLock { $0.stopRequested = true }
        var one: UInt64 = 1
        _ = write(wakeFD, &one, 8)
    }

    /// Runs until `stop`; the calling thread becomes the loop thread.
    public func run() {
        owner.store(pthread_self(), ordering: .releasing)
        var events = [epoll_event](repeating: epoll_event(), count: 256)
        while true {
            let n = events.withUnsafeMutableBufferPointer {
                epoll_wait(epfd, $0.baseAddress, Int32($0.count), hasDeferredWork?() == true ? 0 : Int32(nextTimeout()))
            }
            if n > 0 {
                for i in 0..<Int(n) {
                    let fd = events[i].data.fd
                    handlers[fd]?(events[i].events)
                }
            }
            runPending()
            runTicks()
            afterIteration?()
            if inbox.withLock({ $0.stopRequested }) { break }
        }
        runPending()
        afterIteration?()
    }

    /// Drops every handler, tick, hook and queued piece of work, after `run`
    /// has returned, on the thread that ran it. Their closures hold the loop's
    /// users, which hold the loop: without this those cycles outlive the
    /// daemon's shutdown. The loop is not run again.
    public func shutdown() {
        preconditionInLoop()
        handlers.removeAll()
        ticks.removeAll()
        afterIteration = nil
        hasDeferredWork = nil
        let dropped = inbox.withLock { inbox in
            defer { inbox.pending.removeAll() }
            return inbox.pending
        }
        _ = dropped  // released here, outside the lock
    }

    private func runPending() {
        while true {
            let work = inbox.withLock { inbox in
                defer { inbox.pending.removeAll(keepingCapacity: true) }
                return inbox.pending
            }
            if work.isEmpty { return }
            for w in work { w() }
        }
    }

    private func nextTimeout() -> Int64 {
        guard !ticks.isEmpty else { return 1000 }
        let now = monotonicMilliseconds()
        let soonest = ticks.map { $0.last + $0.interval - now }.min() ?? 1000
        return max(0, min(soonest, 1000))
    }

    private func runTicks() {
        let now = monotonicMilliseconds()
        for i in ticks.indices where now - ticks[i].last >= ticks[i].interval {
            ticks[i].last = now
            ticks[i].body()
        }
    }
}

/// Milliseconds of `CLOCK_MONOTONIC`: for timeouts and intervals, never for wall time.
public func monotonicMilliseconds() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Int64(ts.tv_sec) * 1000 + Int64(ts.tv_nsec) / 1_000_000
}

/// Microseconds of `CLOCK_MONOTONIC` (systemd's `MONOTONIC_USEC`, latency measurements).
public func monotonicMicroseconds() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Int64(ts.tv_sec) * 1_000_000 + Int64(ts.tv_nsec) / 1000
}

/// The epoll event bits handlers receive and interests are built from.
public enum PollEvents {
    public static let readable = UInt32(EPOLLIN.rawValue)
    public static let writable = UInt32(EPOLLOUT.rawValue)
    /// The peer closed its side (or both).
    public static let hangup = UInt32(EPOLLHUP.rawValue) | UInt32(EPOLLRDHUP.rawValue)
    public static let error = UInt32(EPOLLERR.rawValue)
    /// Interest in readability and the peer's half-close.
    public static let readInterest = UInt32(EPOLLIN.rawValue) | UInt32(EPOLLRDHUP.rawValue)
}

extension String {
    /// The text of a NUL-terminated C buffer filled in by a C call.
    public init(cBuffer: [CChar]) {
        self.init(decoding: cBuffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
