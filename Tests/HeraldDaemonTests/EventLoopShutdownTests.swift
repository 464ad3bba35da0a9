import Foundation
import HeraldIO
import Synchronization
import Testing

@testable import HeraldDaemon

/// At SIGTERM the daemon's objects must be released, not left in cycles through
/// the loop's closures: LeakSanitizer reports such cycles at exit (when no stale
/// pointer happens to hide them), and the sanitizer suite runs real daemons.
@Suite("the event loop lets go of its users at shutdown")
struct EventLoopShutdownTests {
    final class Flag: Sendable {
        private let value = Atomic<Int>(0)
        var count: Int { value.load(ordering: .relaxed) }
        var isSet: Bool { count > 0 }
        func set() { value.add(1, ordering: .relaxed) }
    }

    /// Holds the loop, as the server does; the loop's closures hold it back.
    final class User: Sendable {
        let loop: EventLoop
        let released: Flag
        init(loop: EventLoop, released: Flag) {
            self.loop = loop
            self.released = released
        }
        deinit { released.set() }
    }

    @Test("handlers, ticks, hooks and queued work hold their users until shutdown drops them")
    func shutdownBreaksCycles() throws {
        let released = Flag()
        weak var weakLoop: EventLoop?
        var fds: [Int32] = [0, 0]
        #expect(pipe(&fds) == 0)
        defer {
            close(fds[0])
            close(fds[1])
        }
        do {
            let loop = try EventLoop()
            weakLoop = loop
            let user = User(loop: loop, released: released)
            try loop.add(fds[0], events: PollEvents.readable) { _ in _ = user }
            loop.every(milliseconds: 10) { _ = user }
            loop.afterIteration = { _ = user }
            loop.hasDeferredWork = {
                _ = user.loop
                return false
            }
            loop.execute { loop.stop() }
            loop.run()
            loop.execute { _ = user }  // queued after the loop ended: never runs
        }
        // Still held: the loop and the user keep each other alive.
        #expect(!released.isSet)
        #expect(weakLoop != nil)
        weakLoop?.shutdown()
        #expect(released.isSet, "the user is released")
        #expect(weakLoop == nil, "and with it the loop")
    }

    @Test("the SIGHUP handler (the reloader and all it holds) is let go at stop; a later SIGHUP does nothing")
    func hangupsDetach() throws {
        let released = Flag()
        let calls = Flag()
        let hangups = Hangups()
        do {
            let user = try #require(try? User(loop: EventLoop(), released: released))
            hangups.attach {
                _ = user
                calls.set()
            }
        }
        hangups.received()
        #expect(calls.count == 1)
        #expect(!released.isSet)
        hangups.detach()
        #expect(released.isSet)
        hangups.received()
        #expect(calls.count == 1)
    }
}
