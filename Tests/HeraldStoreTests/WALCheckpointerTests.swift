import Foundation
@testable import HeraldStore
import HeraldStoreTestSupport
import Testing

/// When the writer asks the checkpoint thread, finishes a checkpoint itself,
/// or checkpoints the whole log (the bound when the thread falls behind).
@Suite("WAL checkpoints off the writer")
struct WALCheckpointerTests {
    @Test func theWritersStepsFollowTheLogsLength() throws {
        let scratch = try StoreScratch(.sqlite)
        defer { scratch.remove() }
        let path = scratch.dir.appendingPathComponent("c.db").path
        let db = try Database(path: path)
        try db.execute("PRAGMA journal_mode = WAL")
        let c = try WALCheckpointer(path: path, synchronous: .normal)
        defer { c.close() }
        #expect(c.step(pages: WALCheckpointer.pages - 1) == .none)
        #expect(c.step(pages: WALCheckpointer.pages) == .ask, "no pass has run: the thread is asked")
        #expect(c.step(pages: WALCheckpointer.writerPages) == .whole, "past the bound the writer does it all")
        #expect(c.runs.writer == 1)
    }
}
