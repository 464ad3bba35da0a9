import Foundation
import HeraldTestSupport
import HeraldJSON
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// SPEC Revision 2, "Limits on what one client can cost": batches, the reply
/// budget, the JSON value cap, connections per uid, the request timeout,
/// supplementary groups and what system.stats / system.metrics show a peer.

private func request(_ id: Int, _ method: String, _ params: String? = nil) -> String {
    #"{"jsonrpc":"2.0","id":\#(id),"method":"\#(method)"\#(params.map { #","params":\#($0)"# } ?? "")}"#
}

private func parse(_ line: String?, _ what: String) throws -> JSON {
    guard let line else { throw HarnessError("\(what): no response") }
    do {
        return try JSONParser.parse(line)
    } catch {
        throw HarnessError("\(what): not JSON (\(error)): \(line.prefix(300))")
    }
}

private func code(_ response: JSON) -> Int64? { response["error"]?["code"]?.numberValue?.int64 }
private func reason(_ response: JSON) -> String? { response["error"]?["data"]?["reason"]?.stringValue }

/// Runs `herald call` through setpriv (the tests run as root): root's uid and
/// gid with the supplementary groups given. (status, stdout, stderr)
private func callWithGroups(
    _ groups: [Int], socket: String, _ method: String, _ params: String = "{}"
) throws -> (Int32, String, String) {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
    p.arguments =
        (groups.isEmpty ? ["--clear-groups"] : ["--groups", groups.map(String.init).joined(separator: ",")])
        + [heraldBinary(), "call", method, params, "--socket", socket]
    let out = Pipe()
    let err = Pipe()
    p.standardOutput = out
    p.standardError = err
    try p.run()
    let o = out.fileHandleForReading.readDataToEndOfFile()
    let e = err.fileHandleForReading.readDataToEndOfFile()
    p.waitUntilExit()
    return (p.terminationStatus, String(decoding: o, as: UTF8.self), String(decoding: e, as: UTF8.self))
}

/// Runs `body` on a thread of its own; `wait` joins it.
private final class Worker: @unchecked Sendable {
    private let done = DispatchSemaphore(value: 0)

    init(_ body: @escaping @Sendable () -> Void) {
        let done = self.done
        Thread.detachNewThread {
            body()
            done.signal()
        }
    }

    func wait(timeout: Double) -> Bool { done.wait(timeout: .now() + timeout) == .success }
}

@Suite("limits on what one client can cost", .serialized)
struct LimitsTests {
    @Test("a batch over max_batch is one -32600 batch_too_large (even 4 MiB of [0,0,…]); one at the limit is answered")
    func batchLimit() throws {
        let d = try DaemonProcess(server: "max_batch = 10")
        defer { d.cleanup() }
        let c = try d.connect()
        defer { c.close() }

        let eleven = "[" + (1...11).map { request($0, "system.health") }.joined(separator: ",") + "]\n"
        try c.send(eleven)
        let refused = try parse(c.readLine(), "a batch of 11")
        #expect(refused.arrayValue == nil, "a refused batch is one error object, not an array: \(refused)")
        #expect(refused["id"] == .null)
        #expect(code(refused) == -32600 && reason(refused) == "batch_too_large", "\(refused)")
        #expect(refused["error"]?["data"]?["limit"] == .number(10), "\(refused)")

        let ten = "[" + (1...10).map { request($0, "system.health") }.joined(separator: ",") + "]\n"
        try c.send(ten)
        let answers = try parse(c.readLine(), "a batch of 10")
        #expect(answers.arrayValue?.count == 10, "\(answers)")
        #expect(answers.arrayValue?.allSatisfy { $0["result"] != nil } == true)

        // 4 MiB of [0,0,…]: about two million calls, refused as a whole.
        var zeros = [UInt8](repeating: UInt8(ascii: ","), count: 4 * 1024 * 1024 - 2)
        for i in stride(from: 0, to: zeros.count, by: 2) { zeros[i] = UInt8(ascii: "0") }
        let big =
            [UInt8(ascii: "[")] + zeros.dropLast(zeros.last == UInt8(ascii: ",") ? 1 : 0) + [UInt8(ascii: "]"), 10]
        let sender = Worker { try? c.send(big) }
        let bigRefusal = try parse(c.readLine(timeout: 60), "4 MiB of [0,0,…]")
        #expect(sender.wait(timeout: 60))
        #expect(code(bigRefusal) == -32600 && reason(bigRefusal) == "batch_too_large", "\(bigRefusal)")
        // Nothing else came for it, and the connection goes on.
        try c.send(request(99, "system.health") + "\n")
        let after = try parse(c.readLine(), "the call after")
        #expect(after["id"] == .number(99), "\(after)")
        #expect(d.isRunning)
    }

    @Test("answers past max_reply_bytes become 1007 overloaded, in a batch and pipelined")
    func replyBudget() throws {
        let d = try DaemonProcess(server: "max_reply_bytes = 262144")
        defer { d.cleanup() }

        // A batch of ten rpc.discover (about 67 KB each): what fits is answered, the rest is overloaded.
        let c = try d.connect()
        defer { c.close() }
        try c.send("[" + (1...10).map { request($0, "rpc.discover") }.joined(separator: ",") + "]\n")
        let line = try #require(c.readLine(timeout: 30), "no answer to the batch")
        let answers = try #require(try parse(line, "the batch").arrayValue)
        #expect(answers.count == 10)
        let results = answers.filter { $0["result"] != nil }.count
        let overloaded = answers.filter { code($0) == 1007 && reason($0) == "overloaded" }
        #expect(results >= 1 && results + overloaded.count == 10, "results \(results), overloaded \(overloaded.count)")
        #expect(!overloaded.isEmpty, "ten 67 KB answers fitted in 256 KiB")
        #expect(overloaded.allSatisfy { ($0["error"]?["data"]?["retry_after_ms"]?.numberValue?.int64 ?? -1) >= 0 })
        #expect(line.utf8.count <= 262_144 + 10 * 512, "the batch's answer is \(line.utf8.count) bytes")
        let metrics = try #require((try d.call("system.metrics").result)?["text"] as? String)
        #expect(metrics.contains("herald_rpc_overloaded_total \(overloaded.count)"), "\(metrics)")

        // 100 pipelined rpc.discover, not read until all are sent: about 6.7 MB of answers
        // against 256 KiB owed (plus what the socket holds): the daemon stops reading
        // the requests while it is owed half the budget.
        let p = try d.connect()
        defer { p.close() }
        let text = (1...100).map { request($0, "rpc.discover") + "\n" }.joined()
        try p.send(text)
        usleep(500_000)
        var ids = Set<Int64>()
        var pipelinedResults = 0
        var pipelinedOverloaded = 0
        for n in 0..<100 {
            let r = try parse(p.readLine(timeout: 30), "pipelined answer \(n + 1)")
            if let id = r["id"]?.numberValue?.int64 { ids.insert(id) }
            if r["result"] != nil { pipelinedResults += 1 }
            if code(r) == 1007 && reason(r) == "overloaded" { pipelinedOverloaded += 1 }
        }
        #expect(ids.count == 100)
        // Reading paused while the answers were owed, so each was made once there was room:
        // every one is answered, none lost (overloaded only if one came back with no room).
        #expect(pipelinedResults >= 1, "\(pipelinedResults) results, \(pipelinedOverloaded) overloaded")
        #expect(pipelinedResults + pipelinedOverloaded == 100)
        try p.send(request(500, "system.health") + "\n")
        #expect(try parse(p.readLine(), "health after")["result"] != nil)
    }

    @Test("a message of more than 262,144 JSON values is -32600 too_many_values")
    func valueCap() throws {
        let d = try DaemonProcess()
        defer { d.cleanup() }
        let c = try d.connect()
        defer { c.close() }
        let zeros = Array(repeating: "0", count: 300_000).joined(separator: ",")
        let sender = Worker { try? c.send(request(1, "system.health", #"{"x":[\#(zeros)]}"#) + "\n") }
        let r = try parse(c.readLine(timeout: 60), "300,000 values")
        #expect(sender.wait(timeout: 60))
        #expect(code(r) == -32600 && reason(r) == "too_many_values", "\(r)")
        #expect(r["error"]?["data"]?["limit"] == .number(262_144))
        // Below the cap the same shape is parsed (and refused for its unknown param only).
        let few = Array(repeating: "0", count: 1000).joined(separator: ",")
        try c.send(request(2, "system.health", #"{"x":[\#(few)]}"#) + "\n")
        let ok = try parse(c.readLine(), "1,000 values")
        #expect(code(ok) == -32602 && ok["error"]?["data"]?["field"] == .string("x"), "\(ok)")
    }

    @Test("max_connections_per_uid: one more connection of that uid gets 1007 overloaded and is closed")
    func perUIDCap() throws {
        let d = try DaemonProcess(server: "max_connections_per_uid = 3")
        defer { d.cleanup() }
        var open: [TestConnection] = []
        defer { open.forEach { $0.close() } }
        for i in 0..<3 {
            let c = try d.connect()
            open.append(c)
            try c.send(request(i, "system.health") + "\n")
            #expect(try parse(c.readLine(), "connection \(i)")["result"] != nil)
        }
        let extra = try d.connect()
        defer { extra.close() }
        let refusal = try parse(extra.readLine(timeout: 30), "the fourth connection")
        #expect(code(refusal) == 1007 && reason(refusal) == "overloaded", "\(refusal)")
        #expect((refusal["error"]?["data"]?["retry_after_ms"]?.numberValue?.int64 ?? 0) > 0)
        #expect(extra.readsEOF())
        // The three still work; closing one frees a slot.
        try open[0].send(request(10, "system.stats") + "\n")
        let stats = try parse(open[0].readLine(), "stats")
        #expect((stats["result"]?["connections"]?["refused"]?.numberValue?.int64 ?? 0) >= 1, "\(stats)")
        open.removeLast().close()
        var served = false
        let deadline = Date().addingTimeInterval(10)
        while !served && Date() < deadline {
            let c = try d.connect()
            try? c.send(request(11, "system.health") + "\n")
            served = (try? parse(c.readLine(timeout: 30), "after a close"))?["result"] != nil
            c.close()
            if !served { usleep(50_000) }
        }
        #expect(served, "no slot came back after a connection closed")
    }

    @Test("request_timeout_ms: a message not complete in time closes the connection, however slowly bytes trickle in")
    func requestTimeout() throws {
        let d = try DaemonProcess(server: "request_timeout_ms = 500")
        defer { d.cleanup() }

        // Half a message, then nothing.
        let half = try d.connect()
        defer { half.close() }
        try half.send(#"{"jsonrpc":"2.0","id":1,"meth"#)
        let r = try parse(half.readLine(timeout: 10), "the timeout error")
        #expect(r["id"] == .null && code(r) == -32600 && reason(r) == "request_timeout", "\(r)")
        #expect(half.readsEOF(timeout: 5))

        // One byte every 100 ms of a message that never ends: the bytes do not keep it open.
        let drip = try d.connect()
        defer { drip.close() }
        let stop = DispatchSemaphore(value: 0)
        let dripper = Worker {
            let text =
                Array(#"{"jsonrpc":"2.0","id":2,"method":"system.health","params":{"pad":""#.utf8)
                + [UInt8](repeating: UInt8(ascii: "x"), count: 1000)
            for byte in text {
                if (try? drip.send([byte])) == nil { return }
                if stop.wait(timeout: .now() + 0.1) == .success { return }
            }
        }
        #expect(drip.readsEOF(timeout: 15), "a connection trickling bytes stayed open")
        stop.signal()
        #expect(dripper.wait(timeout: 10))

        // A message written slowly but completed in time is answered; a quiet connection stays open.
        let slow = try d.connect()
        defer { slow.close() }
        for chunk in [#"{"jsonrpc":"2.0","#, #""id":3,"method":"#, #""system.health"}"#, "\n"] {
            try slow.send(chunk)
            usleep(50_000)
        }
        #expect(try parse(slow.readLine(), "the slow message")["result"] != nil)
        usleep(1_500_000)
        try slow.send(request(4, "system.health") + "\n")
        #expect(try parse(slow.readLine(), "after a quiet second and a half")["result"] != nil)
        let metrics = try #require((try d.call("system.metrics").result)?["text"] as? String)
        #expect(metrics.contains("herald_client_request_timeouts_total 2"), "\(metrics)")
        #expect(d.isRunning)
    }

    @Test("allow_gids matches supplementary groups (SO_PEERGROUPS); stats and metrics show a peer only its apps")
    func groupsAndFigures() throws {
        let d = try DaemonProcess(
            appSections: """
                [app.default]
                allow_uids = 0
                device_cap = 20

                [app.grouped]
                allow_gids = 4343
                device_cap = 20
                """)
        defer { d.cleanup() }

        // Root with 4343 as a supplementary group may call "grouped"; root without it may not.
        let (okStatus, okOut, okErr) = try callWithGroups(
            [4343], socket: d.socketPath, "system.health", #"{"app":"grouped"}"#)
        #expect(okStatus == 0, "\(okOut) \(okErr)")
        let (noStatus, _, noErr) = try callWithGroups([], socket: d.socketPath, "system.health", #"{"app":"grouped"}"#)
        #expect(noStatus != 0 && noErr.contains("1006"), "\(noErr)")

        // Two devices in "grouped", one in "default".
        for i in 0..<2 {
            let (s, o, e) = try callWithGroups(
                [4343], socket: d.socketPath, "device.register",
                #"{"app":"grouped","user":"fig-g","platform":"fcm","token":"fig-grouped-\#(i)"}"#)
            #expect(s == 0, "\(o) \(e)")
        }
        let reg = try d.call("device.register", ["user": "fig-d", "platform": "fcm", "token": "fig-default"])
        #expect(reg.result != nil, "\(reg)")

        // This process (root, no supplementary groups) may call "default" only.
        let mine = try #require(try d.call("system.stats").result)
        #expect((mine["devices"] as? [String: Any])?["fcm"] as? Int == 1, "\(mine)")
        #expect(mine["apps"] as? [String] == ["default"], "\(mine)")
        #expect(mine["transports"] == nil, "daemon-wide send counters shown to a peer of some apps: \(mine)")
        let text = try #require((try d.call("system.metrics").result)?["text"] as? String)
        #expect(text.contains(#"herald_devices{platform="fcm"} 1"#), "\(text)")
        #expect(text.contains(#"app="default""#) && !text.contains(#"app="grouped""#))
        #expect(!text.contains("herald_sends_total"))

        // With the group it may call both: it sees everything, as before.
        let (s, out, e) = try callWithGroups([4343], socket: d.socketPath, "system.stats")
        #expect(s == 0, "\(e)")
        let all = try JSONParser.parse(out)
        #expect(all["devices"]?["fcm"] == .number(3), "\(all)")
        #expect(all["transports"] != nil && all["apps"] == nil, "\(all)")
        let (ms, mout, _) = try callWithGroups([4343], socket: d.socketPath, "system.metrics")
        #expect(ms == 0)
        let allText = try JSONParser.parse(mout)["text"]?.stringValue ?? ""
        #expect(allText.contains(#"herald_devices{platform="fcm"} 3"#) && allText.contains(#"app="grouped""#))
        #expect(allText.contains("herald_sends_total"))
    }
}
