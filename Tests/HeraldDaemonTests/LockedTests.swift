import Dispatch
import Foundation
import HeraldIO
import Testing

/// `Locked`'s condition: the stores, the pools and the daemon's waiters wait
/// on it for a value to become ready.
@Suite("Locked waits for its value")
struct LockedTests {
    @Test("a waiter sleeps until another thread's change, broadcast, makes its value ready")
    func waitsForChange() {
        let queue = Locked<[Int]>([])
        DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(50)) {
            queue.withLock { $0.append(7) }
            queue.broadcast()
        }
        let taken = queue.withLock(when: { !$0.isEmpty }) { $0.removeFirst() }
        #expect(taken == 7)
        #expect(queue.withLock { $0.isEmpty })
    }

    @Test("signal wakes one waiter per change; every waiter gets a value once")
    func signalWakesOne() {
        let jobs = Locked<[Int]>([])
        let taken = Locked<[Int]>([])
        let group = DispatchGroup()
        for _ in 0..<4 {
            DispatchQueue.global().async(group: group) {
                let job = jobs.withLock(when: { !$0.isEmpty }) { $0.removeFirst() }
                taken.withLock { $0.append(job) }
            }
        }
        for job in 1...4 {
            jobs.withLock { $0.append(job) }
            jobs.signal()
        }
        #expect(group.wait(timeout: .now() + 10) == .success)
        #expect(taken.withLock { $0.sorted() } == [1, 2, 3, 4])
    }

    @Test("with a timeout, the body runs once it passed, the value not ready")
    func timesOut() {
        let flag = Locked(false)
        let start = DispatchTime.now().uptimeNanoseconds
        let ready = flag.withLock(when: { $0 }, timeout: .milliseconds(100)) { $0 }
        let waited = DispatchTime.now().uptimeNanoseconds - start
        #expect(!ready)
        #expect(waited >= 100_000_000)
        #expect(waited < 5_000_000_000)
    }

    @Test("a value ready at once is not waited for, whatever the timeout")
    func readyAtOnce() {
        let count = Locked(3)
        #expect(count.withLock(when: { $0 > 0 }, timeout: .seconds(60)) { $0 } == 3)
        #expect(count.withLock(when: { $0 > 0 }) { $0 } == 3)
    }
}
