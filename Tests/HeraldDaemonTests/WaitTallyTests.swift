import Testing

@testable import HeraldDaemon

/// `push.send wait: true`: what a waiter counts between status reads (MessageWaiters).
@Suite("WaitTally")
struct WaitTallyTests {
    @Test("reports that come while a read is under way are kept: the waiter reads again as soon as they add up")
    func reportsDuringReadKept() {
        var t = WaitTally(total: 500, now: 0)
        t.readStarted(now: 0)  // the read when the waiter is added
        // The read saw 100 deliveries final; 300 more are recorded after it
        // ran and reported while it is still on its way back.
        do {
            let due = t.reported(200, now: 1)
            #expect(!due)
        }
        do {
            let due = t.reported(100, now: 2)
            #expect(!due)
        }
        do {
            let due = t.readDone(sawFinal: 100, now: 5)
            #expect(!due)
        }
        #expect(t.final == 400, "what the read saw plus the reports during it")
        // The last 100: the tally reaches the total and a read is due at once,
        // not at the next poll (before, the reports during the read were lost
        // and the waiter sat until a 500 ms sweep).
        do {
            let due = t.reported(60, now: 3)
            #expect(!due)
        }
        do {
            let due = t.reported(40, now: 4)
            #expect(due)
        }
    }

    @Test("reports during a read that reach the total ask for another read when it ends")
    func readAgainWhenReportsComplete() {
        var t = WaitTally(total: 10, now: 0)
        t.readStarted(now: 0)
        do {
            let due = t.reported(10, now: 1)
            #expect(due)
        }  // due, but a read is under way: the caller marks it to read again
        do {
            let due = t.readDone(sawFinal: 4, now: 5)
            #expect(due)
        }
        #expect(t.final == 14, "counted twice at worst: an early read, never a wrong answer")
        t.readStarted(now: 2)
        do {
            let due = t.readDone(sawFinal: 10, now: 5)
            #expect(!due, "nothing new during the second read: no third")
        }
        #expect(t.final == 10)
    }

    @Test("an unknown change reads the message")
    func unknownProgress() {
        var t = WaitTally(total: 10, now: 0)
        do {
            let due = t.reported(nil, now: 1)
            #expect(due)
        }
        t.readStarted(now: 1)
        do {
            let due = t.reported(nil, now: 2)
            #expect(due)
        }
        do {
            let due = t.readDone(sawFinal: 3, now: 5)
            #expect(due, "an unknown change during a read: read again")
        }
    }

    @Test(
        "a message with no reports is polled 50 ms after the last report or read; the gap doubles to 500 ms while reads find nothing new"
    )
    func quietPolling() {
        var t = WaitTally(total: 10, now: 1000)
        #expect(!t.pollDue(now: 1049))
        #expect(t.pollDue(now: 1050))
        var now: Int64 = 1050
        var gaps: [Int64] = []
        for _ in 0..<6 {
            t.readStarted(now: now)
            _ = t.readDone(sawFinal: 0, now: now)
            gaps.append(t.pollGap)
            now = t.pollAt
        }
        #expect(gaps == [100, 200, 400, 500, 500, 500])
        // A read that finds progress (another instance delivering) polls again 50 ms on.
        t.readStarted(now: now)
        _ = t.readDone(sawFinal: 3, now: now + 2)
        #expect(t.pollGap == WaitTally.firstPollMs)
        #expect(t.pollAt == now + 2 + 50)
        // A report puts the next poll 50 ms after it.
        t.readStarted(now: now + 50)
        _ = t.readDone(sawFinal: 3, now: now + 51)
        #expect(t.pollGap == 100)
        _ = t.reported(1, now: now + 57)
        #expect(t.pollAt == now + 57 + 50)
        #expect(t.pollGap == WaitTally.firstPollMs)
    }
}
