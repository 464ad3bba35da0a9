import Foundation
import HeraldIO
import HeraldJSON
import HeraldTestSupport
import JSONRPC
import Synchronization
import Testing

@testable import HeraldDaemon

/// A call whose answer cannot fit what the connection, its uid or the process
/// may be owed is refused with 1007 before it runs: the server does not make
/// (and serialise) an answer only to drop it. With 64 slow readers each owed
/// 400 rpc.discover documents, making and dropping them cost the loop a
/// minute of CPU and other clients their latency.
@Suite("answers that cannot fit are refused before their calls run")
struct RefusedUnrunTests {
    /// `big` answers with a 40 KB string, `small` with a short one; each
    /// counts the calls that ran.
    final class Handler: RequestHandler {
        let bigRuns = Atomic<Int>(0)
        let smallRuns = Atomic<Int>(0)

        func handle(
            _ request: RPCRequest, context: CallContext, reply: @escaping @Sendable (Result<JSON, RPCError>) -> Void
        ) {
            switch request.method {
            case "big":
                bigRuns.add(1, ordering: .relaxed)
                reply(.success(.string(String(repeating: "x", count: 40_000))))
            case "small":
                smallRuns.add(1, ordering: .relaxed)
                reply(.success(.string("ok")))
            default:
                reply(.failure(.methodNotFound(request.method)))
            }
        }
    }

    private static func codes(_ line: String?) throws -> [Int] {
        let text = try #require(line)
        let answers = try #require(try JSONParser.parse(Array(text.utf8)).arrayValue)
        return answers.map { answer in
            answer["error"]?["code"]?.numberValue.flatMap { Int($0.text) } ?? 0
        }
    }

    @Test(
        "a big answer that would pass max_reply_bytes is refused unrun; a small call still runs; after a read, big runs again"
    )
    func refusedBeforeRunning() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent(
            "herald-unrun-\(getpid())-\(UInt32.random(in: 0...UInt32.max))")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let path = dir.appendingPathComponent("s.sock").path

        let loop = try EventLoop()
        let listener = try Listener.create(path: path, mode: 0o600)
        let handler = Handler()
        var limits = ServerLimits()
        limits.maxReplyBytes = 64 * 1024
        let server = RPCServer(
            loop: loop, listener: listener, handler: handler, log: Logger(level: .error), limits: limits)
        try server.start()
        let thread = Thread {
            loop.run()
            loop.shutdown()
        }
        thread.start()
        defer {
            loop.execute { loop.stop() }
            while !thread.isFinished { usleep(1000) }
            listener.close()
        }

        let conn = try TestConnection(path: path)
        defer { conn.close() }
        // One batch: the first big answer (40 KB) is held for the batch; a
        // second would pass 64 KiB, so it and the third are refused without
        // running; a small call fits and runs.
        try conn.send(
            #"[{"jsonrpc":"2.0","id":1,"method":"big"},{"jsonrpc":"2.0","id":2,"method":"big"},"#
                + #"{"jsonrpc":"2.0","id":3,"method":"big"},{"jsonrpc":"2.0","id":4,"method":"small"}]"# + "\n")
        #expect(try Self.codes(conn.readLine()) == [0, 1007, 1007, 0])
        #expect(handler.bigRuns.load(ordering: .relaxed) == 1, "the refused calls did not run")
        #expect(handler.smallRuns.load(ordering: .relaxed) == 1)

        // Read: nothing is owed now, and the next big call runs.
        try conn.send(#"{"jsonrpc":"2.0","id":5,"method":"big"}"# + "\n")
        let line = try #require(conn.readLine())
        #expect(line.utf8.count > 40_000)
        #expect(handler.bigRuns.load(ordering: .relaxed) == 2)
    }

    @Test("the room checked leaves aside what the connection's own decoded calls hold")
    func roomBesidesDecoded() {
        let process = ClientBudget(limit: 1000, parent: nil)
        let uid = ClientBudget(limit: 800, parent: process)
        let conn = ReplyBudget(limit: 500, shared: uid)
        uid.add(700)  // this connection's decoded message
        #expect(!conn.hasRoom(200), "700 + 200 passes the uid's 800")
        #expect(conn.hasRoom(200, besides: 700), "once its own message is let go, 200 fits")
        #expect(!conn.hasRoom(600, besides: 700), "but never past the connection's own 500")
        process.add(850)  // another uid's answers
        #expect(!conn.hasRoom(200, besides: 700), "others' 850 and 200 pass the process's 1000")
        #expect(conn.hasRoom(150, besides: 700))
        conn.detach()
        #expect(conn.hasRoom(500), "a closed connection counts against itself alone")
    }
}
