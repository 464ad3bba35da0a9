import Dispatch
import Foundation
import HeraldTestSupport
import HeraldCore
import HeraldCrypto
import HeraldStore
import Testing

#if canImport(Glibc)
    import Glibc
#endif

// The registry under concurrent clients, across a clean restart, and across
// a crash (SIGKILL): what was answered is exactly what is stored.

/// Registrations per user, to stay inside the 20/min per (app, user) limit.
private let perUser = 20

/// What one client thread did.
/// A count shared by the client threads and the thread that kills the daemon.
private final class AnsweredCount: @unchecked Sendable {
    private let lock = NSLock()
    private var n = 0
    var value: Int { lock.withLock { n } }
    func add() { lock.withLock { n += 1 } }
}

private final class ClientLog: @unchecked Sendable {
    let index: Int
    /// device_id per user, for every registration answered with success.
    var answered: [String: Set<String>] = [:]
    /// device_id per user of every registration sent (answered or not).
    var attempted: [String: Set<String>] = [:]
    var registrations = 0
    var lists = 0
    var errors: [String] = []

    init(index: Int) { self.index = index }

    func fail(_ message: String) {
        if errors.count < 10 { errors.append("client \(index): \(message)") }
    }

    var answeredCount: Int { answered.values.reduce(0) { $0 + $1.count } }
}

/// Runs `body(i)` on `count` threads and waits for all of them.
private func onThreads(_ count: Int, timeout: Double, _ body: @escaping @Sendable (Int) -> Void) throws {
    let group = DispatchGroup()
    for i in 0..<count {
        group.enter()
        let thread = Thread {
            body(i)
            group.leave()
        }
        thread.stackSize = 1 << 20
        thread.start()
    }
    if group.wait(timeout: .now() + timeout) == .timedOut {
        throw HarnessError("client threads did not finish within \(timeout) s")
    }
}

/// A registration's params and the device_id the daemon must answer with.
private struct Planned: Sendable {
    let user: String
    let params: [String: String]
    let keys: [String: String]?
    let deviceID: String

    var json: [String: Any] {
        var p: [String: Any] = params
        if let keys { p["keys"] = keys }
        return p
    }
}

/// The `n`-th registration of client `c`: unique token, a new user every
/// `perUser` registrations (unless `user` is given), the platforms in turn.
private func plan(client c: Int, n: Int, tag: String, webKeys: [String: String], user: String? = nil) -> Planned {
    let user = user ?? "\(tag)-c\(c)-u\(n / perUser)"
    let platform: Platform
    let token: String
    switch n % 4 {
    case 0:
        platform = .apns
        token = String(format: "%016llx%08x%08x", UInt64(truncatingIfNeeded: tag.hashValue), UInt32(c), UInt32(n))
    case 1:
        platform = .web
        token = "https://93.184.215.14/\(tag)/c\(c)/n\(n)"
    default:
        platform = .fcm
        token = "\(tag):c\(c):n\(n):" + String(repeating: "f", count: 40)
    }
    var params = ["user": user, "platform": platform.rawValue, "token": token]
    if platform == .apns { params["environment"] = n % 8 == 0 ? "development" : "production" }
    let env = platform == .apns ? APNsEnvironment(rawValue: params["environment"]!) : nil
    return Planned(
        user: user, params: params, keys: platform == .web ? webKeys : nil,
        deviceID: Identity.deviceID(user: user, app: "default", platform: platform, environment: env, token: token))
}

private func encode(_ id: Int, _ method: String, _ params: [String: Any]) throws -> [UInt8] {
    let request: [String: Any] = ["jsonrpc": "2.0", "id": id, "method": method, "params": params]
    return [UInt8](try JSONSerialization.data(withJSONObject: request)) + [10]
}

private func decode(_ line: String) -> [String: Any]? {
    (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any]
}

private func makeWebKeys() throws -> [String: String] {
    [
        "p256dh": Base64URL.encode(try P256PrivateKey.generate().publicKey),
        "auth": Base64URL.encode(try SecureRandom.bytes(16)),
    ]
}

/// device.list of every user in `expected` must be exactly its set of ids.
private func verifyRegistry(
    _ daemon: DaemonProcess, expected: [String: Set<String>], allowedExtra: [String: Set<String>] = [:],
    sourceLocation: SourceLocation = #_sourceLocation
) throws {
    let conn = try daemon.connect()
    defer { conn.close() }
    var mismatches: [String] = []
    // Pipelined in chunks: thousands of users.
    let users = Array(Set(expected.keys).union(allowedExtra.keys)).sorted()
    var id = 0
    for chunk in stride(from: 0, to: users.count, by: 200).map({ Array(users[$0..<min($0 + 200, users.count)]) }) {
        var bytes: [UInt8] = []
        for user in chunk {
            id += 1
            bytes += try encode(id, "device.list", ["user": user])
        }
        try conn.send(bytes)
        var byID: [Int: [String: Any]] = [:]
        while byID.count < chunk.count {
            guard let line = conn.readLine(timeout: 30), let object = decode(line), let rid = object["id"] as? Int
            else {
                throw HarnessError("device.list responses missing")
            }
            byID[rid] = object
        }
        for (offset, user) in chunk.enumerated() {
            let response = byID[id - chunk.count + 1 + offset]!
            guard let devices = (response.result?["devices"] as? [[String: Any]]) else {
                mismatches.append("\(user): \(response)")
                continue
            }
            let ids = devices.compactMap { $0["device_id"] as? String }
            let listed = Set(ids)
            if ids.count != listed.count { mismatches.append("\(user): duplicated rows \(ids)") }
            let must = expected[user] ?? []
            let may = must.union(allowedExtra[user] ?? [])
            if !must.isSubset(of: listed) { mismatches.append("\(user): lost \(must.subtracting(listed).sorted())") }
            if !listed.isSubset(of: may) {
                mismatches.append("\(user): unexpected \(listed.subtracting(may).sorted())")
            }
        }
    }
    #expect(
        mismatches.isEmpty, "\(mismatches.count) users differ: \(mismatches.prefix(5))", sourceLocation: sourceLocation)
}

private func totalDevices(_ daemon: DaemonProcess) throws -> Int {
    let stats = try daemon.call("system.stats")
    let devices = try #require(stats.result?["devices"] as? [String: Any], "\(stats)")
    return devices.values.compactMap { $0 as? Int }.reduce(0, +)
}

@Suite("load and restart", .serialized)
struct LoadAndRestartTests {
    @Test("32 concurrent clients register and list for 10 s: no errors, nothing lost or duplicated")
    func concurrentClients() throws {
        let daemon = try DaemonProcess(appSections: "[app.default]\ndevice_cap = 1000\n", synchronous: "full")
        defer { daemon.cleanup() }
        let clients = 32
        let logs = (0..<clients).map { ClientLog(index: $0) }
        let webKeys = try makeWebKeys()
        let deadline = Date().addingTimeInterval(10)
        let tag = "load\(UUID().uuidString.prefix(6))"

        try onThreads(clients, timeout: 60) { c in
            let log = logs[c]
            let conn: TestConnection
            do { conn = try daemon.connect() } catch {
                log.fail("connect: \(error)")
                return
            }
            defer { conn.close() }
            var n = 0
            var id = 0
            while Date() < deadline && log.errors.isEmpty {
                // Clients 2k and 2k+1 share their users, 10 registrations each per user:
                // concurrent writers on one user, and at most 20 a minute per user.
                let p = plan(client: c, n: n, tag: tag, webKeys: webKeys, user: "\(tag)-pair\(c / 2)-u\(n / 10)")
                n += 1
                id += 1
                do {
                    log.attempted[p.user, default: []].insert(p.deviceID)
                    try conn.send(try encode(id, "device.register", p.json))
                    guard let line = conn.readLine(timeout: 30), let r = decode(line) else {
                        log.fail("no response to registration \(n)")
                        return
                    }
                    guard r["id"] as? Int == id, let result = r.result else {
                        log.fail("registration \(n): \(r)")
                        continue
                    }
                    log.registrations += 1
                    guard let deviceID = result["device_id"] as? String, deviceID == p.deviceID,
                        result["created"] as? Bool == true, result["reclaimed"] as? Bool == false,
                        (result["evicted"] as? [Any])?.isEmpty == true
                    else {
                        log.fail("registration \(n) answered \(result), expected new device \(p.deviceID)")
                        continue
                    }
                    log.answered[p.user, default: []].insert(deviceID)

                    // Every third call also lists: read-your-writes (the partner client
                    // may have added more).
                    if n % 3 == 0 {
                        id += 1
                        try conn.send(try encode(id, "device.list", ["user": p.user]))
                        guard let line = conn.readLine(timeout: 30), let l = decode(line),
                            let devices = l.result?["devices"] as? [[String: Any]]
                        else {
                            log.fail("device.list failed")
                            continue
                        }
                        log.lists += 1
                        let listed = devices.compactMap { $0["device_id"] as? String }
                        let mine = log.answered[p.user]!
                        if !mine.isSubset(of: Set(listed)) || listed.count != Set(listed).count || listed.count > 2 * 10
                        {
                            log.fail(
                                "device.list \(p.user): \(listed.count) devices, \(mine.count) of them mine: \(listed)")
                        }
                    }
                } catch {
                    log.fail("\(error)")
                    return
                }
            }
        }

        let errors = logs.flatMap(\.errors)
        #expect(errors.isEmpty, "\(errors.prefix(10))")
        let registrations = logs.reduce(0) { $0 + $1.registrations }
        let lists = logs.reduce(0) { $0 + $1.lists }
        #expect(logs.allSatisfy { $0.registrations > 0 }, "every client got through")
        var expected: [String: Set<String>] = [:]
        for log in logs { expected.merge(log.answered) { $0.union($1) } }
        let answered = expected.values.reduce(0) { $0 + $1.count }
        #expect(answered == registrations)
        try verifyRegistry(daemon, expected: expected)
        #expect(try totalDevices(daemon) == answered, "no rows beyond the answered registrations")
        print(
            "load: \(registrations) registrations and \(lists) lists by \(clients) clients over \(expected.count) users in 10 s"
        )
        #expect(daemon.stop() == 0)
    }

    @Test("SIGTERM and start again on the same directory: every device listed with the same ids")
    func restartKeepsDevices() throws {
        let daemon = try DaemonProcess(appSections: "[app.default]\ndevice_cap = 1000\n", synchronous: "full")
        defer { daemon.cleanup() }
        let webKeys = try makeWebKeys()
        let tag = "restart"
        let conn = try daemon.connect()
        var expected: [String: Set<String>] = [:]
        var planned: [Planned] = []
        for n in 0..<60 {
            let p = plan(client: 0, n: n, tag: tag, webKeys: webKeys)
            var params = p.json
            params["name"] = "device \(n)"
            params["session"] = "session-\(n % 2)"
            let r = try conn.call("device.register", params)
            let result = try #require(r.result, "\(r)")
            #expect(result["device_id"] as? String == p.deviceID)
            expected[p.user, default: []].insert(p.deviceID)
            planned.append(p)
        }
        let rid = "rid-restart"
        let ridUser = "restart-rid-user"  // planned users are at their 20 registrations a minute
        #expect(
            try conn.call(
                "device.register",
                ["user": ridUser, "platform": "fcm", "token": "rid-token-1", "registration_id": rid, "version": 4]
            ).result != nil)
        #expect(
            try conn.call("device.unregister", ["user": ridUser, "registration_id": rid, "version": 4]).result?[
                "removed"] as? Int == 1)
        conn.close()

        func snapshot() throws -> [String: [[String: String]]] {
            var out: [String: [[String: String]]] = [:]
            for user in expected.keys {
                let devices = try #require(
                    try daemon.call("device.list", ["user": user]).result?["devices"] as? [[String: Any]])
                out[user] = devices.map { d in d.compactMapValues { $0 as? String } }
                    .sorted { $0["device_id"]! < $1["device_id"]! }
            }
            return out
        }
        let before = try snapshot()
        #expect(before.values.reduce(0) { $0 + $1.count } == 60)

        #expect(daemon.stop() == 0, "SIGTERM exits with status 0")
        #expect(!daemon.isRunning)
        try daemon.start()
        try verifyRegistry(daemon, expected: expected)
        let after = try snapshot()
        #expect(after == before, "every field of every device survives the restart")
        #expect(try totalDevices(daemon) == 60)

        // The binding and the sealed rows still work after the restart.
        let first = planned[2]
        let again = try daemon.call("device.register", first.json)
        #expect(again.result?["created"] as? Bool == false)
        #expect(again.result?["device_id"] as? String == first.deviceID)
        #expect(
            try daemon.call("session.end", ["user": planned[0].user, "session": "session-1"]).result?["removed"] as? Int
                == 10)
        // planned[6] is an fcm device of session-0: still there, found by its binding.
        #expect(try daemon.call("device.unregister", planned[6].params).result?["removed"] as? Int == 1)
        #expect(
            try daemon.call("device.unregister", planned[8].params).result?["removed"] as? Int == 1, "apns, development"
        )
        // So does the tombstone.
        let late = try daemon.call(
            "device.register",
            ["user": ridUser, "platform": "fcm", "token": "rid-token-2", "registration_id": rid, "version": 3])
        #expect(late.errorCode == 1008, "\(late)")
        #expect(daemon.stop() == 0)
    }

    @Test("SIGTERM while requests are in flight: status 0, every answered registration kept")
    func sigtermUnderLoad() throws {
        let daemon = try DaemonProcess(appSections: "[app.default]\ndevice_cap = 1000\n", synchronous: "full")
        defer { daemon.cleanup() }
        let webKeys = try makeWebKeys()
        let clients = 4
        let perClient = 2000
        let logs = (0..<clients).map { ClientLog(index: $0) }
        let tag = "term"
        let sent = DispatchSemaphore(value: 0)
        let stopped = DispatchSemaphore(value: 0)
        let status = ClientLog(index: -1)  // registrations holds the exit status
        let stopper = Thread {
            for _ in 0..<clients { sent.wait() }
            usleep(50_000)
            status.registrations = Int(daemon.stop())
            stopped.signal()
        }
        stopper.start()
        try onThreads(clients, timeout: 60) { c in
            let log = logs[c]
            var signalled = false
            defer { if !signalled { sent.signal() } }
            guard let conn = try? daemon.connect() else { return log.fail("connect") }
            defer { conn.close() }
            // All registrations in one write, then read until EOF.
            var bytes: [UInt8] = []
            var plans: [Int: Planned] = [:]
            for n in 0..<perClient {
                let p = plan(client: c, n: n, tag: tag, webKeys: webKeys)
                plans[n + 1] = p
                log.attempted[p.user, default: []].insert(p.deviceID)
                bytes += (try? encode(n + 1, "device.register", p.json)) ?? []
            }
            do { try conn.send(bytes) } catch { return }
            sent.signal()
            signalled = true
            while let line = conn.readLine(timeout: 20) {
                guard let r = decode(line), let id = r["id"] as? Int, let p = plans[id] else {
                    log.fail("bad response \(line.prefix(200))")
                    continue
                }
                if let result = r.result, result["device_id"] as? String == p.deviceID {
                    log.answered[p.user, default: []].insert(p.deviceID)
                    log.registrations += 1
                } else {
                    log.fail("response \(r)")
                }
            }
        }
        #expect(stopped.wait(timeout: .now() + 30) == .success, "the daemon exits after SIGTERM")
        #expect(status.registrations == 0, "exit status after SIGTERM")
        let errors = logs.flatMap(\.errors)
        #expect(errors.isEmpty, "\(errors.prefix(5))")
        try daemon.start()
        var expected: [String: Set<String>] = [:]
        var attempted: [String: Set<String>] = [:]
        for log in logs {
            expected.merge(log.answered) { $0.union($1) }
            attempted.merge(log.attempted) { $0.union($1) }
        }
        try verifyRegistry(daemon, expected: expected, allowedExtra: attempted)
        let answered = logs.reduce(0) { $0 + $1.registrations }
        let stored = try totalDevices(daemon)
        print("sigterm: \(answered) of \(clients * perClient) registrations answered before exit, \(stored) stored")
        // A graceful stop answers and flushes every request it completed.
        #expect(answered == stored, "every request the daemon completed before exiting is answered")
        #expect(daemon.stop() == 0)
    }

    @Test("kill -9 during registrations: every registration answered with success survives (synchronous = full)")
    func crashKeepsAnswered() throws {
        let daemon = try DaemonProcess(appSections: "[app.default]\ndevice_cap = 1000\n", synchronous: "full")
        defer { daemon.cleanup() }
        let webKeys = try makeWebKeys()
        let clients = 8
        let window = 16
        let logs = (0..<clients).map { ClientLog(index: $0) }
        let tag = "crash"
        let killed = DispatchSemaphore(value: 0)
        // The kill comes in the middle of the run however fast the machine is:
        // once the clients have had a few hundred registrations answered.
        let answeredSoFar = AnsweredCount()
        let killer = Thread {
            let deadline = Date().addingTimeInterval(60)
            while answeredSoFar.value < 400 && Date() < deadline { usleep(5_000) }
            daemon.kill9()
            killed.signal()
        }
        killer.start()
        try onThreads(clients, timeout: 60) { c in
            let log = logs[c]
            guard let conn = try? daemon.connect() else { return log.fail("connect") }
            defer { conn.close() }
            var n = 0
            while true {
                // A window of pipelined registrations, then their answers.
                var bytes: [UInt8] = []
                var plans: [Int: Planned] = [:]
                for _ in 0..<window {
                    let p = plan(client: c, n: n, tag: tag, webKeys: webKeys)
                    n += 1
                    plans[n] = p
                    log.attempted[p.user, default: []].insert(p.deviceID)
                    bytes += (try? encode(n, "device.register", p.json)) ?? []
                }
                do { try conn.send(bytes) } catch { return }
                var got = 0
                while got < window {
                    guard let line = conn.readLine(timeout: 10) else { return }  // killed: EOF
                    got += 1
                    guard let r = decode(line), let id = r["id"] as? Int, let p = plans[id] else {
                        log.fail("bad response \(line.prefix(200))")
                        continue
                    }
                    if let result = r.result, result["device_id"] as? String == p.deviceID {
                        log.answered[p.user, default: []].insert(p.deviceID)
                        log.registrations += 1
                        answeredSoFar.add()
                    } else {
                        log.fail("response \(r)")
                    }
                }
            }
        }
        // Clients see EOF the moment the kernel kills the daemon; wait for the
        // killer to have reaped it before looking.
        killed.wait()
        #expect(!daemon.isRunning)
        let errors = logs.flatMap(\.errors)
        #expect(errors.isEmpty, "\(errors.prefix(5))")
        let answered = logs.reduce(0) { $0 + $1.registrations }
        #expect(answered >= 400, "the kill came after some registrations were answered")

        try daemon.start()
        var expected: [String: Set<String>] = [:]
        var attempted: [String: Set<String>] = [:]
        // Every registration a client sent may be present (answered or in flight), nothing else.
        for log in logs {
            expected.merge(log.answered) { $0.union($1) }
            attempted.merge(log.attempted) { $0.union($1) }
        }
        try verifyRegistry(daemon, expected: expected, allowedExtra: attempted)
        let stored = try totalDevices(daemon)
        #expect(stored >= answered)
        print("crash: \(answered) registrations answered before kill -9, \(stored) stored after restart")
        // The store is healthy after recovery.
        #expect(try daemon.call("system.health").result?["status"] as? String == "ok")
        let fresh = plan(client: 99, n: 0, tag: tag, webKeys: webKeys)
        #expect(try daemon.call("device.register", fresh.json).result?["created"] as? Bool == true)
        #expect(daemon.stop() == 0)
    }
}
