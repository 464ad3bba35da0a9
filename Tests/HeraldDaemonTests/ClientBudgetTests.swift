import Testing

@testable import HeraldDaemon

/// Answers owed and decoded calls count against the connection, its uid and
/// the process (issue 27): an answer that fits the connection but not its
/// uid or the process is refused, and a closed connection leaves them.
@Suite struct ClientBudgetTests {
    @Test func aReservationMustFitEveryLevel() {
        let process = ClientBudget(limit: 1000, parent: nil)
        let uidA = ClientBudget(limit: 600, parent: process)
        let uidB = ClientBudget(limit: 600, parent: process)
        let a1 = ReplyBudget(limit: 500, shared: uidA)
        let a2 = ReplyBudget(limit: 500, shared: uidA)
        let b1 = ReplyBudget(limit: 500, shared: uidB)

        #expect(a1.reserve(400))
        #expect(!a2.reserve(300), "fits the connection, not its uid (400 + 300 > 600)")
        #expect(a2.value == 0 && uidA.value == 400 && process.value == 400)
        #expect(a2.reserve(200))
        #expect(uidA.spent, "the uid holds its 600")
        #expect(!uidB.spent)
        #expect(b1.reserve(400))
        #expect(!b1.reserve(1), "the process holds its 1000")
        #expect(uidB.spent, "a uid is spent while the process is")
        #expect(uidA.value == 600 && uidB.value == 400 && process.value == 1000)

        // Errors and separators are counted whether or not they fit.
        b1.force(50)
        #expect(uidB.value == 450 && process.value == 1050)
        b1.release(450)
        #expect(b1.value == 0 && uidB.value == 0 && process.value == 600)
    }

    @Test func aClosedConnectionLeavesItsUIDAndTheProcess() {
        let process = ClientBudget(limit: 1000, parent: nil)
        let uid = ClientBudget(limit: 600, parent: process)
        let conn = ReplyBudget(limit: 500, shared: uid)
        #expect(conn.reserve(300))
        uid.add(200)  // a decoded call of another connection of the uid
        conn.detach()
        #expect(uid.value == 200 && process.value == 200)
        // Answers still on their way to it count against it alone.
        #expect(conn.reserve(100))
        conn.force(10)
        conn.release(410)
        #expect(uid.value == 200 && process.value == 200 && conn.value == 0)
        conn.detach()
        #expect(uid.value == 200, "detaching twice changes nothing")
    }
}
