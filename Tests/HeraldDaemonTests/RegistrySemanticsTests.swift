import Foundation
import HeraldTestSupport
import HeraldCore
import HeraldCrypto
import HeraldStore
import Testing

#if canImport(Glibc)
    import Glibc
#endif

// The `device.*`, `session.end` and `user.forget` rules of SPEC.md, one test
// per rule, every one through the socket of a real `herald serve`.

/// Random material for registrations.
private enum Make {
    /// `bytes` random bytes as lowercase hex (an APNs-style token).
    static func hexToken(bytes: Int = 32) -> String {
        (0..<bytes).map { _ in String(format: "%02x", UInt8.random(in: 0...255)) }.joined()
    }

    static func fcmToken() -> String {
        "fcm:" + UUID().uuidString + "-" + Make.hexToken(bytes: 8) + "_APA91b"
    }

    /// A public IPv4-literal endpoint (no DNS needed), unique per call.
    static func endpoint() -> String {
        "https://93.184.215.14/push/\(Make.hexToken(bytes: 12))"
    }

    /// A valid Web Push subscription key pair: a real P-256 point and 16 random bytes.
    static func webKeys() throws -> [String: String] {
        let point = try P256PrivateKey.generate().publicKey
        return ["p256dh": Base64URL.encode(point), "auth": Base64URL.encode(try SecureRandom.bytes(16))]
    }

    static func user(_ base: String = "u") -> String { "\(base)-\(UUID().uuidString.prefix(8))" }
}

/// One persistent connection with the assertions the tests share.
private final class Client {
    let daemon: DaemonProcess
    private var conn: TestConnection
    private var nextID = 1_000_000

    init(_ daemon: DaemonProcess) throws {
        self.daemon = daemon
        conn = try daemon.connect()
    }

    deinit { conn.close() }

    func call(_ method: String, _ params: [String: Any]) throws -> [String: Any] {
        try conn.call(method, params)
    }

    /// The response line exactly as the daemon wrote it.
    func rawCall(_ method: String, _ params: [String: Any]) throws -> String {
        nextID += 1
        let request: [String: Any] = ["jsonrpc": "2.0", "id": nextID, "method": method, "params": params]
        try conn.send([UInt8](try JSONSerialization.data(withJSONObject: request)) + [10])
        guard let line = conn.readLine() else { throw HarnessError("no response to \(method)") }
        return line
    }

    /// Sends all requests at once, then reads every response; returned in request order.
    func pipeline(_ calls: [(String, [String: Any])]) throws -> [[String: Any]] {
        var bytes: [UInt8] = []
        var ids: [Int] = []
        for (method, params) in calls {
            nextID += 1
            ids.append(nextID)
            let request: [String: Any] = ["jsonrpc": "2.0", "id": nextID, "method": method, "params": params]
            bytes += [UInt8](try JSONSerialization.data(withJSONObject: request)) + [10]
        }
        try conn.send(bytes)
        var byID: [Int: [String: Any]] = [:]
        while byID.count < ids.count {
            guard let line = conn.readLine(timeout: 30) else {
                throw HarnessError("pipeline: \(byID.count) of \(ids.count) responses")
            }
            let object = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] ?? [:]
            guard let id = object["id"] as? Int else { throw HarnessError("response without id: \(line)") }
            byID[id] = object
        }
        return ids.map { byID[$0]! }
    }

    /// A call that must succeed; its `result`.
    @discardableResult
    func ok(
        _ method: String, _ params: [String: Any], sourceLocation: SourceLocation = #_sourceLocation
    ) throws
        -> [String: Any]
    {
        let response = try call(method, params)
        return try #require(response.result, "\(method) \(params) failed: \(response)", sourceLocation: sourceLocation)
    }

    /// A call that must fail; its `error` object.
    @discardableResult
    func fails(
        _ method: String, _ params: [String: Any], code: Int, field: String? = nil,
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws -> [String: Any] {
        let response = try call(method, params)
        let error = try #require(
            response.error, "\(method) should fail with \(code): \(response)", sourceLocation: sourceLocation)
        #expect(error["code"] as? Int == code, "\(method) \(params): \(error)", sourceLocation: sourceLocation)
        if let field {
            #expect(response.errorData?["field"] as? String == field, "\(error)", sourceLocation: sourceLocation)
        }
        return error
    }

    @discardableResult
    func register(_ params: [String: Any], sourceLocation: SourceLocation = #_sourceLocation) throws -> [String: Any] {
        try ok("device.register", params, sourceLocation: sourceLocation)
    }

    func devices(
        _ user: String, app: String? = nil, sourceLocation: SourceLocation = #_sourceLocation
    ) throws
        -> [[String: Any]]
    {
        var params: [String: Any] = ["user": user]
        if let app { params["app"] = app }
        let result = try ok("device.list", params, sourceLocation: sourceLocation)
        return try #require(result["devices"] as? [[String: Any]], sourceLocation: sourceLocation)
    }

    func deviceIDs(_ user: String, app: String? = nil) throws -> Set<String> {
        Set(try devices(user, app: app).compactMap { $0["device_id"] as? String })
    }

    func removed(
        _ method: String, _ params: [String: Any], sourceLocation: SourceLocation = #_sourceLocation
    ) throws
        -> Int?
    {
        try ok(method, params, sourceLocation: sourceLocation)["removed"] as? Int
    }
}

private func isDeviceID(_ value: Any?) -> Bool {
    guard let s = value as? String else { return false }
    return s.utf8.count == 32 && s.utf8.allSatisfy { (48...57).contains($0) || (97...102).contains($0) }
}

/// Long enough for the store clock (milliseconds) to move between two calls.
private func tick() { usleep(15_000) }

/// Runs `body` with a fresh daemon that is stopped and removed afterwards.
private func withDaemon(
    appSections: String = "[app.default]\ndevice_cap = 20\n", _ body: (Client) throws -> Void
) throws {
    let daemon = try DaemonProcess(appSections: appSections, synchronous: "normal")
    defer { daemon.cleanup() }
    try body(try Client(daemon))
}

@Suite("registry semantics over the socket", .serialized)
struct RegistrySemanticsTests {
    // MARK: The three forms

    @Test("apns and apns_voip: hex tokens, environment defaults to production, no keys")
    func apnsForm() throws {
        try withDaemon { c in
            let user = Make.user()
            for platform in ["apns", "apns_voip"] {
                let token = Make.hexToken()
                let r = try c.register(["user": user, "platform": platform, "token": token])
                #expect(r["created"] as? Bool == true)
                #expect(r["reclaimed"] as? Bool == false)
                #expect((r["evicted"] as? [Any])?.isEmpty == true)
                #expect(isDeviceID(r["device_id"]))
                let listed = try #require(
                    try c.devices(user).first { $0["device_id"] as? String == r["device_id"] as? String })
                #expect(listed["platform"] as? String == platform)
                #expect(listed["environment"] as? String == "production")

                // Hex case does not split a binding: uppercase is the same device.
                let upper = try c.register(["user": user, "platform": platform, "token": token.uppercased()])
                #expect(upper["created"] as? Bool == false)
                #expect(upper["device_id"] as? String == r["device_id"] as? String)
                #expect(upper["token_hash"] as? String == SHA256.hex("push:" + token))

                try c.fails(
                    "device.register", ["user": user, "platform": platform, "token": "not-hex-" + token], code: -32602,
                    field: "token")
                try c.fails(
                    "device.register", ["user": user, "platform": platform, "token": token + "a"], code: -32602,
                    field: "token")
                try c.fails(
                    "device.register", ["user": user, "platform": platform, "token": "abcd"], code: -32602,
                    field: "token")
                // Keys with a raw token: apns takes no keys; apns_voip's Web
                // Push form needs an endpoint, so the token is what is wrong.
                try c.fails(
                    "device.register",
                    ["user": user, "platform": platform, "token": token, "keys": try Make.webKeys()],
                    code: -32602, field: platform == "apns" ? "keys" : "token")
                try c.fails(
                    "device.register", ["user": user, "platform": platform, "token": token, "environment": "staging"],
                    code: -32602, field: "environment")
            }
            #expect(try c.devices(user).count == 2)
        }
    }

    @Test("fcm: an opaque token, no environment, no keys (keys with a raw token are refused at token)")
    func fcmForm() throws {
        try withDaemon { c in
            let user = Make.user()
            let token = Make.fcmToken()
            let r = try c.register(["user": user, "platform": "fcm", "token": token])
            #expect(r["created"] as? Bool == true)
            let listed = try #require(try c.devices(user).first)
            #expect(listed["platform"] as? String == "fcm")
            #expect(listed["environment"] is NSNull)

            let long = String(repeating: "x", count: 4096)
            #expect(try c.register(["user": user, "platform": "fcm", "token": long])["created"] as? Bool == true)
            try c.fails(
                "device.register", ["user": user, "platform": "fcm", "token": long + "x"], code: -32602, field: "token")
            try c.fails(
                "device.register", ["user": user, "platform": "fcm", "token": ""], code: -32602, field: "token")
            try c.fails(
                "device.register", ["user": user, "platform": "fcm", "token": "has space"], code: -32602, field: "token"
            )
            try c.fails(
                "device.register", ["user": user, "platform": "fcm", "token": token, "environment": "production"],
                code: -32602, field: "environment")
            try c.fails(
                "device.register", ["user": user, "platform": "fcm", "token": token, "keys": try Make.webKeys()],
                code: -32602, field: "token")
            try c.fails(
                "device.register", ["user": user, "platform": "gcm", "token": token], code: -32602, field: "platform")
            #expect(try c.devices(user).count == 2)
        }
    }

    @Test("web: a public https endpoint with a P-256 point and a 16-byte auth")
    func webForm() throws {
        try withDaemon { c in
            let user = Make.user()
            let keys = try Make.webKeys()
            let endpoint = Make.endpoint()
            let r = try c.register(["user": user, "platform": "web", "token": endpoint, "keys": keys])
            #expect(r["created"] as? Bool == true)
            #expect(r["token_hash"] as? String == SHA256.hex("push:" + endpoint))
            let listed = try #require(try c.devices(user).first)
            #expect(listed["platform"] as? String == "web")
            #expect(listed["environment"] is NSNull)

            func refused(
                _ token: String, _ keys: [String: String]?, code: Int, field: String?,
                _ loc: SourceLocation = #_sourceLocation
            ) throws {
                var params: [String: Any] = ["user": user, "platform": "web", "token": token]
                if let keys { params["keys"] = keys }
                try c.fails("device.register", params, code: code, field: field, sourceLocation: loc)
            }
            try refused(Make.endpoint(), nil, code: -32602, field: "keys")
            // 65 bytes with the 0x04 prefix, but not a point on the curve.
            let offCurve = Base64URL.encode([4] + [UInt8](repeating: 1, count: 64))
            try refused(
                Make.endpoint(), ["p256dh": offCurve, "auth": keys["auth"]!], code: -32602, field: "keys.p256dh")
            let compressed = Base64URL.encode([2] + [UInt8](repeating: 1, count: 32))
            try refused(
                Make.endpoint(), ["p256dh": compressed, "auth": keys["auth"]!], code: -32602, field: "keys.p256dh")
            try refused(
                Make.endpoint(), ["p256dh": "not base64!", "auth": keys["auth"]!], code: -32602, field: "keys.p256dh")
            try refused(
                Make.endpoint(),
                ["p256dh": keys["p256dh"]!, "auth": Base64URL.encode([UInt8](repeating: 7, count: 15))],
                code: -32602, field: "keys.auth")
            try refused(Make.endpoint(), ["p256dh": keys["p256dh"]!], code: -32602, field: "keys.auth")
            try refused(
                Make.endpoint(), ["p256dh": keys["p256dh"]!, "auth": keys["auth"]!, "extra": "x"], code: -32602,
                field: "keys.extra")
            try refused("http://93.184.215.14/push/abc", keys, code: -32602, field: "token")
            try refused("https://93.184.215.14:8443/push/abc", keys, code: -32602, field: "token")
            try refused("https://user@93.184.215.14/push/abc", keys, code: -32602, field: "token")
            for privateHost in [
                "127.0.0.1", "10.1.2.3", "192.168.0.1", "169.254.1.1", "100.64.0.1", "[::1]", "192.0.2.7",
            ] {
                let error = try c.fails(
                    "device.register",
                    ["user": user, "platform": "web", "token": "https://\(privateHost)/push/abc", "keys": keys],
                    code: 1001)
                #expect((error["data"] as? [String: Any])?["reason"] as? String == "not_publicly_routable")
            }
            try c.fails(
                "device.register",
                ["user": user, "platform": "web", "token": Make.endpoint(), "keys": keys, "environment": "production"],
                code: -32602, field: "environment")
            #expect(try c.devices(user).count == 1)
        }
    }

    // MARK: The binding

    @Test("the APNs environment is part of the binding: one token, two devices")
    func environmentSplitsBinding() throws {
        try withDaemon { c in
            let user = Make.user()
            let token = Make.hexToken()
            let prod = try c.register(["user": user, "platform": "apns", "token": token])
            let dev = try c.register(["user": user, "platform": "apns", "token": token, "environment": "development"])
            #expect(prod["created"] as? Bool == true)
            #expect(dev["created"] as? Bool == true)
            #expect(dev["reclaimed"] as? Bool == false)
            #expect(prod["device_id"] as? String != dev["device_id"] as? String)
            #expect(prod["token_hash"] as? String == dev["token_hash"] as? String)
            let environments = try c.devices(user).compactMap { $0["environment"] as? String }.sorted()
            #expect(environments == ["development", "production"])
            // Explicit production is the default binding, not a third one.
            let explicit = try c.register([
                "user": user, "platform": "apns", "token": token, "environment": "production",
            ])
            #expect(explicit["created"] as? Bool == false)
            #expect(explicit["device_id"] as? String == prod["device_id"] as? String)
            // apns and apns_voip are different platforms: another binding.
            let voip = try c.register(["user": user, "platform": "apns_voip", "token": token])
            #expect(voip["created"] as? Bool == true)
            #expect(try c.devices(user).count == 3)
        }
    }

    @Test("same user re-registering: created false, same device_id, registered_at moves, created_at stays")
    func sameUserRefresh() throws {
        try withDaemon { c in
            let user = Make.user()
            let token = Make.fcmToken()
            let first = try c.register(["user": user, "platform": "fcm", "token": token])
            let before = try #require(try c.devices(user).first)
            tick()
            let again = try c.register(["user": user, "platform": "fcm", "token": token])
            #expect(again["created"] as? Bool == false)
            #expect(again["reclaimed"] as? Bool == false)
            #expect((again["evicted"] as? [Any])?.isEmpty == true)
            #expect(again["device_id"] as? String == first["device_id"] as? String)
            let after = try c.devices(user)
            #expect(after.count == 1)
            let row = try #require(after.first)
            #expect(row["created_at"] as? String == before["created_at"] as? String)
            let was = try #require(before["registered_at"] as? String)
            let now = try #require(row["registered_at"] as? String)
            #expect(now > was, "registered_at \(was) -> \(now)")
        }
    }

    @Test("a field left out keeps its stored value; a field given replaces it")
    func absenceNeverErases() throws {
        try withDaemon { c in
            let user = Make.user()
            let token = Make.hexToken()
            let base: [String: Any] = ["user": user, "platform": "apns", "token": token]
            try c.register(base.merging(["name": "Alice's phone", "app_version": "1.0"]) { $1 })
            func row() throws -> [String: Any] { try #require(try c.devices(user).first) }
            try c.register(base)
            #expect(try row()["name"] as? String == "Alice's phone")
            #expect(try row()["app_version"] as? String == "1.0")
            try c.register(base.merging(["app_version": "1.1"]) { $1 })
            #expect(try row()["name"] as? String == "Alice's phone")
            #expect(try row()["app_version"] as? String == "1.1")
            try c.register(base.merging(["name": "Work phone"]) { $1 })
            #expect(try row()["name"] as? String == "Work phone")
            #expect(try row()["app_version"] as? String == "1.1")
            // An empty string is a value, not an absence.
            try c.register(base.merging(["name": ""]) { $1 })
            #expect(try row()["name"] as? String == "")
            #expect(try row()["app_version"] as? String == "1.1")
        }
    }

    @Test("a binding owned by another user is reclaimed: fresh device, nothing inherited")
    func crossUserReclaim() throws {
        try withDaemon { c in
            let alice = Make.user("alice")
            let bob = Make.user("bob")
            for (platform, token, keys) in [
                ("fcm", Make.fcmToken(), nil), ("apns", Make.hexToken(), nil),
                ("web", Make.endpoint(), try Make.webKeys()),
            ] as [(String, String, [String: String]?)] {
                var params: [String: Any] = ["user": alice, "platform": platform, "token": token, "name": "alice's"]
                if let keys { params["keys"] = keys }
                let a = try c.register(params.merging(["session": "alice-session", "app_version": "9"]) { $1 })
                tick()
                params["user"] = bob
                params["name"] = nil
                let b = try c.register(params)
                #expect(b["created"] as? Bool == true, "\(platform)")
                #expect(b["reclaimed"] as? Bool == true, "\(platform)")
                #expect(b["device_id"] as? String != a["device_id"] as? String, "\(platform)")
                #expect(b["token_hash"] as? String == a["token_hash"] as? String)
                #expect(try c.devices(alice).isEmpty, "\(platform)")
                let row = try #require(
                    try c.devices(bob).first { $0["device_id"] as? String == b["device_id"] as? String })
                #expect(row["name"] is NSNull, "\(platform): \(row)")
                #expect(row["app_version"] is NSNull, "\(platform): \(row)")
                // Alice's session no longer reaches the device.
                #expect(try c.removed("session.end", ["user": alice, "session": "alice-session"]) == 0)
                // Bob refreshing his reclaimed binding is an ordinary refresh.
                let again = try c.register(params)
                #expect(again["created"] as? Bool == false)
                #expect(again["reclaimed"] as? Bool == false)
                // And alice taking it back is a reclaim again.
                params["user"] = alice
                let back = try c.register(params)
                #expect(back["reclaimed"] as? Bool == true)
                #expect(try c.devices(bob).isEmpty)
                #expect(try c.removed("user.forget", ["user": alice]) == 1)
            }
        }
    }

    @Test("device_id and token_hash are the documented derivations")
    func deterministicIdentity() throws {
        try withDaemon(appSections: "[app.default]\ndevice_cap = 20\n\n[app.other]\ndevice_cap = 20\n") { c in
            let user = Make.user()
            let apnsToken = Make.hexToken().uppercased()
            let fcmToken = Make.fcmToken()
            let endpoint = Make.endpoint()
            let keys = try Make.webKeys()
            let cases: [(app: String, platform: Platform, env: APNsEnvironment?, token: String, stored: String)] = [
                ("default", .apns, .production, apnsToken, apnsToken.lowercased()),
                ("default", .apns, .development, apnsToken, apnsToken.lowercased()),
                ("default", .apnsVoIP, .production, apnsToken, apnsToken.lowercased()),
                ("default", .fcm, nil, fcmToken, fcmToken),
                ("default", .web, nil, endpoint, endpoint),
                ("other", .fcm, nil, fcmToken, fcmToken),
            ]
            var seen = Set<String>()
            for k in cases {
                var params: [String: Any] = [
                    "user": user, "platform": k.platform.rawValue, "token": k.token, "app": k.app,
                ]
                if let env = k.env { params["environment"] = env.rawValue }
                if k.platform == .web { params["keys"] = keys }
                let r = try c.register(params)
                let expected = Identity.deviceID(
                    user: user, app: k.app, platform: k.platform, environment: k.env, token: k.stored)
                #expect(r["device_id"] as? String == expected, "\(k)")
                #expect(r["token_hash"] as? String == SHA256.hex("push:" + k.stored), "\(k)")
                #expect(r["token_hash"] as? String == Identity.tokenHash(k.stored))
                seen.insert(expected)
                // Stable: gone and back again is the same id.
                let id = try #require(r["device_id"] as? String)
                #expect(try c.removed("device.unregister", ["user": user, "device_id": id, "app": k.app]) == 1)
                let back = try c.register(params)
                #expect(back["created"] as? Bool == true)
                #expect(back["device_id"] as? String == expected)
            }
            #expect(seen.count == cases.count, "every binding has its own id")
            #expect(try c.devices(user).count == 5)
            #expect(try c.devices(user, app: "other").count == 1)

            // With a registration_id the id follows (user, app, registration_id), whatever the token.
            let rid = "install-" + UUID().uuidString
            let expected = Identity.deviceID(user: user, app: "default", registrationID: rid)
            let r1 = try c.register([
                "user": user, "platform": "fcm", "token": Make.fcmToken(), "registration_id": rid, "version": 1,
            ])
            #expect(r1["device_id"] as? String == expected)
            #expect(try c.removed("device.unregister", ["user": user, "device_id": expected]) == 1)
            let r2 = try c.register([
                "user": user, "platform": "apns", "token": Make.hexToken(), "registration_id": rid, "version": 1,
            ])
            #expect(r2["device_id"] as? String == expected)
            #expect(r2["created"] as? Bool == true)
            let other = try c.register([
                "user": user, "platform": "fcm", "token": Make.fcmToken(), "registration_id": rid, "version": 1,
                "app": "other",
            ])
            #expect(other["device_id"] as? String == Identity.deviceID(user: user, app: "other", registrationID: rid))
            #expect(other["device_id"] as? String != expected)
        }
    }

    // MARK: Eviction

    @Test("over device_cap the least recently registered device is evicted; a refresh counts")
    func evictionOverCap() throws {
        try withDaemon(appSections: "[app.default]\ndevice_cap = 3\n") { c in
            let user = Make.user()
            let bystander = Make.user("bystander")
            var ids: [String] = []
            var tokens: [String] = []
            for _ in 0..<3 {
                let token = Make.fcmToken()
                let r = try c.register(["user": user, "platform": "fcm", "token": token])
                #expect((r["evicted"] as? [String]) == [])
                ids.append(try #require(r["device_id"] as? String))
                tokens.append(token)
                tick()
            }
            for _ in 0..<3 { _ = try c.register(["user": bystander, "platform": "fcm", "token": Make.fcmToken()]) }
            let (a, b, cc) = (ids[0], ids[1], ids[2])
            // Refreshing A (the oldest) makes B the least recently registered.
            let refreshed = try c.register(["user": user, "platform": "fcm", "token": tokens[0]])
            #expect(refreshed["created"] as? Bool == false)
            #expect((refreshed["evicted"] as? [String]) == [], "a refresh at the cap evicts nothing")
            tick()
            let d = try c.register(["user": user, "platform": "fcm", "token": Make.fcmToken()])
            #expect(d["created"] as? Bool == true)
            #expect((d["evicted"] as? [String]) == [b])
            let dID = try #require(d["device_id"] as? String)
            #expect(try c.deviceIDs(user) == [a, cc, dID])
            tick()
            let e = try c.register(["user": user, "platform": "apns", "token": Make.hexToken()])
            #expect((e["evicted"] as? [String]) == [cc])
            let eID = try #require(e["device_id"] as? String)
            #expect(try c.deviceIDs(user) == [a, dID, eID])
            #expect(try c.devices(bystander).count == 3, "another user's devices are not evicted")
            // The evicted device's token registers as a new device again.
            tick()
            let back = try c.register(["user": user, "platform": "fcm", "token": tokens[1]])
            #expect(back["created"] as? Bool == true)
            #expect(back["device_id"] as? String == b)
            #expect((back["evicted"] as? [String]) == [a])
        }
    }

    @Test("eviction order holds when a refresh and new registrations share one group commit")
    func evictionWithinOneCommit() throws {
        try withDaemon(appSections: "[app.default]\ndevice_cap = 3\n") { c in
            for _ in 0..<3 {
                let user = Make.user()
                let tokens = (0..<4).map { _ in Make.fcmToken() }
                // A, B, C, refresh A, D: pipelined, so the store usually commits them
                // together with one timestamp.
                let calls = [0, 1, 2, 0, 3].map {
                    ("device.register", ["user": user, "platform": "fcm", "token": tokens[$0]] as [String: Any])
                }
                let responses = try c.pipeline(calls)
                let ids = try responses.map { try #require($0.result?["device_id"] as? String, "\($0)") }
                #expect(responses[3].result?["created"] as? Bool == false)
                let evicted = responses[4].result?["evicted"] as? [String]
                // Recency is the registration sequence, exact within one commit.
                #expect(evicted == [ids[1]], "B is the least recently registered")
                #expect(evicted?.count == 1)
                #expect(try c.deviceIDs(user).count == 3)
            }
        }
    }

    // MARK: Sessions and forgetting

    @Test("session.end removes only the devices stamped with that session")
    func sessionEnd() throws {
        try withDaemon { c in
            let user = Make.user()
            let other = Make.user("other")
            let s1 = "session-" + UUID().uuidString
            let s2 = "session-" + UUID().uuidString
            let d1 = try c.register(["user": user, "platform": "fcm", "token": Make.fcmToken(), "session": s1])
            let d1b = try c.register(["user": user, "platform": "apns", "token": Make.hexToken(), "session": s1])
            let d2token = Make.fcmToken()
            let d2 = try c.register(["user": user, "platform": "fcm", "token": d2token, "session": s2])
            let d3 = try c.register(["user": user, "platform": "fcm", "token": Make.fcmToken()])
            let o1 = try c.register(["user": other, "platform": "fcm", "token": Make.fcmToken(), "session": s1])
            // A refresh without a session keeps the stamp.
            _ = try c.register(["user": user, "platform": "fcm", "token": d2token])

            #expect(try c.removed("session.end", ["user": user, "session": "never-used"]) == 0)
            #expect(try c.removed("session.end", ["user": user, "session": s1]) == 2)
            let left = try c.deviceIDs(user)
            #expect(left == Set([d2, d3].compactMap { $0["device_id"] as? String }))
            #expect(!left.contains(d1["device_id"] as! String) && !left.contains(d1b["device_id"] as! String))
            #expect(
                try c.deviceIDs(other) == [o1["device_id"] as! String],
                "the same session string of another user is untouched")
            #expect(try c.removed("session.end", ["user": user, "session": s1]) == 0)
            #expect(try c.removed("session.end", ["user": user, "session": s2]) == 1)
            #expect(try c.deviceIDs(user) == [d3["device_id"] as! String])
            try c.fails("session.end", ["user": user], code: -32602, field: "session")
        }
    }

    @Test("user.forget removes all of the user's devices and nobody else's")
    func userForget() throws {
        try withDaemon(appSections: "[app.default]\ndevice_cap = 20\n\n[app.other]\ndevice_cap = 20\n") { c in
            let user = Make.user()
            let other = Make.user("other")
            _ = try c.register(["user": user, "platform": "fcm", "token": Make.fcmToken()])
            _ = try c.register([
                "user": user, "platform": "apns", "token": Make.hexToken(), "environment": "development",
            ])
            _ = try c.register(["user": user, "platform": "web", "token": Make.endpoint(), "keys": try Make.webKeys()])
            _ = try c.register(["user": user, "platform": "fcm", "token": Make.fcmToken(), "app": "other"])
            _ = try c.register(["user": other, "platform": "fcm", "token": Make.fcmToken()])
            #expect(try c.removed("user.forget", ["user": user]) == 3)
            #expect(try c.devices(user).isEmpty)
            #expect(try c.devices(other).count == 1)
            #expect(try c.devices(user, app: "other").count == 1, "forget is per app")
            #expect(try c.removed("user.forget", ["user": user]) == 0)
            #expect(try c.removed("user.forget", ["user": user, "app": "other"]) == 1)
        }
    }

    // MARK: No raw secrets

    @Test("device.list never shows raw tokens, keys or auth, and the database holds none")
    func noRawSecrets() throws {
        try withDaemon { c in
            let user = Make.user()
            let keys = try Make.webKeys()
            let endpointPath = "sub" + Make.hexToken(bytes: 16)
            let endpoint = "https://93.184.215.14/push/" + endpointPath
            let apns = Make.hexToken()
            let fcm = Make.fcmToken()
            _ = try c.register(["user": user, "platform": "web", "token": endpoint, "keys": keys, "name": "browser"])
            _ = try c.register(["user": user, "platform": "apns", "token": apns])
            _ = try c.register(["user": user, "platform": "fcm", "token": fcm, "session": "sess-secret-\(apns)"])
            let line = try c.rawCall("device.list", ["user": user])
            let object = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
            let devices = try #require((object?["result"] as? [String: Any])?["devices"] as? [[String: Any]])
            #expect(devices.count == 3)
            let secrets = [endpointPath, apns, apns.uppercased(), fcm, keys["p256dh"]!, keys["auth"]!, "sess-secret"]
            for secret in secrets {
                #expect(!line.contains(secret), "device.list shows \(secret)")
            }
            let expectedKeys: Set<String> = [
                "device_id", "platform", "environment", "name", "app_version", "token_hash", "created_at",
                "registered_at", "last_success_at", "last_failure_at", "last_failure_reason", "bundle_id",
                "enabled", "form", "app_id", "user_agent", "time_zone", "quiet_hours", "topics",
            ]
            for d in devices { #expect(Set(d.keys) == expectedKeys) }

            // At rest: neither the database nor its WAL contains a raw token or key.
            c.daemon.stop()
            let files = try FileManager.default.contentsOfDirectory(atPath: c.daemon.dir.path).filter {
                $0.hasPrefix("herald.db")
            }
            #expect(files.contains("herald.db"))
            let p256dhRaw = try Base64URL.decode(keys["p256dh"]!)
            let authRaw = try Base64URL.decode(keys["auth"]!)
            for file in files {
                let data = try Data(contentsOf: c.daemon.dir.appendingPathComponent(file))
                for secret in [endpointPath, apns, fcm, "sess-secret"] {
                    #expect(data.range(of: Data(secret.utf8)) == nil, "\(file) contains \(secret)")
                }
                #expect(data.range(of: Data(p256dhRaw)) == nil, "\(file) contains the raw p256dh")
                #expect(data.range(of: Data(authRaw)) == nil, "\(file) contains the raw auth")
            }
        }
    }

    // MARK: device.unregister

    @Test("unregister by device_id: removed 1, then 0; succeeds for unknown ids")
    func unregisterByDeviceID() throws {
        try withDaemon { c in
            let user = Make.user()
            let r = try c.register(["user": user, "platform": "fcm", "token": Make.fcmToken()])
            let keep = try c.register(["user": user, "platform": "fcm", "token": Make.fcmToken()])
            let id = try #require(r["device_id"] as? String)
            #expect(try c.removed("device.unregister", ["user": user, "device_id": id]) == 1)
            #expect(try c.removed("device.unregister", ["user": user, "device_id": id]) == 0)
            #expect(
                try c.removed("device.unregister", ["user": user, "device_id": String(repeating: "0", count: 32)]) == 0)
            #expect(try c.deviceIDs(user) == [keep["device_id"] as! String])
            try c.fails(
                "device.unregister", ["user": user, "device_id": id.uppercased()], code: -32602, field: "device_id")
            try c.fails("device.unregister", ["user": user, "device_id": "abc"], code: -32602, field: "device_id")
            try c.fails("device.unregister", ["user": user], code: -32602)
            try c.fails(
                "device.unregister", ["user": user, "device_id": id, "platform": "fcm", "token": "x"], code: -32602)
        }
    }

    @Test("unregister by (platform, token, environment): environment defaults to production")
    func unregisterByBinding() throws {
        try withDaemon { c in
            let user = Make.user()
            let apns = Make.hexToken()
            let fcm = Make.fcmToken()
            let endpoint = Make.endpoint()
            _ = try c.register(["user": user, "platform": "apns", "token": apns, "environment": "development"])
            _ = try c.register(["user": user, "platform": "fcm", "token": fcm])
            _ = try c.register(["user": user, "platform": "web", "token": endpoint, "keys": try Make.webKeys()])
            #expect(try c.removed("device.unregister", ["user": user, "platform": "apns", "token": apns]) == 0)
            #expect(
                try c.removed(
                    "device.unregister",
                    ["user": user, "platform": "apns_voip", "token": apns, "environment": "development"]) == 0)
            #expect(
                try c.removed(
                    "device.unregister",
                    ["user": user, "platform": "apns", "token": apns.uppercased(), "environment": "development"])
                    == 1, "hex case does not matter")
            #expect(try c.removed("device.unregister", ["user": user, "platform": "web", "token": fcm]) == 0)
            #expect(try c.removed("device.unregister", ["user": user, "platform": "fcm", "token": fcm]) == 1)
            #expect(try c.removed("device.unregister", ["user": user, "platform": "web", "token": endpoint]) == 1)
            #expect(try c.devices(user).isEmpty)
            try c.fails(
                "device.unregister", ["user": user, "platform": "fcm", "token": fcm, "environment": "production"],
                code: -32602, field: "environment")
            try c.fails("device.unregister", ["user": user, "token": fcm], code: -32602)
            try c.fails("device.unregister", ["user": user, "platform": "fcm"], code: -32602)
        }
    }

    @Test("unregister never touches another user's device")
    func unregisterOtherUser() throws {
        try withDaemon { c in
            let alice = Make.user("alice")
            let bob = Make.user("bob")
            let token = Make.hexToken()
            let rid = "rid-" + UUID().uuidString
            let a1 = try c.register(["user": alice, "platform": "apns", "token": token])
            let a2 = try c.register([
                "user": alice, "platform": "fcm", "token": Make.fcmToken(), "registration_id": rid, "version": 1,
            ])
            let aliceIDs = try c.deviceIDs(alice)
            #expect(aliceIDs.count == 2)
            #expect(try c.removed("device.unregister", ["user": bob, "device_id": a1["device_id"] as! String]) == 0)
            #expect(try c.removed("device.unregister", ["user": bob, "device_id": a2["device_id"] as! String]) == 0)
            #expect(try c.removed("device.unregister", ["user": bob, "platform": "apns", "token": token]) == 0)
            #expect(try c.removed("device.unregister", ["user": bob, "registration_id": rid, "version": 99]) == 0)
            #expect(try c.removed("session.end", ["user": bob, "session": "x"]) == 0)
            #expect(try c.removed("user.forget", ["user": bob]) == 0)
            #expect(try c.deviceIDs(alice) == aliceIDs)
            // Bob's tombstone for the same registration_id is his own: alice may still move on.
            let moved = try c.register([
                "user": alice, "platform": "fcm", "token": Make.fcmToken(), "registration_id": rid, "version": 2,
            ])
            #expect(moved["device_id"] as? String == a2["device_id"] as? String)
        }
    }

    // MARK: Registration ordering

    @Test("versions: newer moves in place, same only as exact retry, older refused with data.version")
    func versionOrdering() throws {
        try withDaemon { c in
            let user = Make.user()
            let rid = "install-" + UUID().uuidString
            let t1 = Make.hexToken(), t2 = Make.hexToken(), t3 = Make.hexToken()
            func reg(
                _ token: String, _ version: Int, env: String = "production", name: String? = nil
            ) throws -> [String: Any] {
                var p: [String: Any] = [
                    "user": user, "platform": "apns", "token": token, "environment": env, "registration_id": rid,
                    "version": version,
                ]
                if let name { p["name"] = name }
                return try c.call("device.register", p)
            }
            let v1 = try #require(try reg(t1, 1, name: "phone").result)
            let id = try #require(v1["device_id"] as? String)
            #expect(id == Identity.deviceID(user: user, app: "default", registrationID: rid))
            #expect(v1["created"] as? Bool == true)
            tick()
            let v2 = try #require(try reg(t2, 2, env: "development").result)
            #expect(v2["device_id"] as? String == id, "moved in place")
            #expect(v2["created"] as? Bool == false)
            #expect(v2["token_hash"] as? String == SHA256.hex("push:" + t2))
            let rows = try c.devices(user)
            #expect(rows.count == 1)
            #expect(rows.first?["token_hash"] as? String == SHA256.hex("push:" + t2))
            #expect(rows.first?["environment"] as? String == "development")
            #expect(rows.first?["name"] as? String == "phone")
            // The old token is free again: unregistering it by binding removes nothing.
            #expect(try c.removed("device.unregister", ["user": user, "platform": "apns", "token": t1]) == 0)

            // Exact retry of version 2.
            let retry = try #require(try reg(t2, 2, env: "development").result)
            #expect(retry["device_id"] as? String == id)
            #expect(retry["created"] as? Bool == false)
            // Same version, another binding (token, or only the environment).
            for (token, env) in [(t3, "development"), (t2, "production")] {
                let clash = try reg(token, 2, env: env)
                #expect(clash.errorCode == 1008, "\(clash)")
                #expect(clash.errorData?["reason"] as? String == "conflict")
                #expect(clash.errorData?["version"] as? Int == 2)
            }
            // Older.
            let older = try reg(t1, 1)
            #expect(older.errorCode == 1008, "\(older)")
            #expect(older.errorData?["version"] as? Int == 2)
            let rows2 = try c.devices(user)
            #expect(rows2.count == 1)
            #expect(rows2.first?["token_hash"] as? String == SHA256.hex("push:" + t2), "refusals change nothing")
            // Newer again.
            let v5 = try #require(try reg(t3, 5).result)
            #expect(v5["device_id"] as? String == id)
            #expect(try c.devices(user).first?["token_hash"] as? String == SHA256.hex("push:" + t3))
        }
    }

    @Test("a version move onto a token held by another user reclaims it")
    func versionMoveReclaims() throws {
        try withDaemon { c in
            let alice = Make.user("alice")
            let bob = Make.user("bob")
            let shared = Make.fcmToken()
            _ = try c.register(["user": alice, "platform": "fcm", "token": shared])
            let rid = "rid-" + UUID().uuidString
            let b1 = try c.register([
                "user": bob, "platform": "fcm", "token": Make.fcmToken(), "registration_id": rid, "version": 1,
            ])
            let b2 = try c.register([
                "user": bob, "platform": "fcm", "token": shared, "registration_id": rid, "version": 2,
            ])
            #expect(b2["device_id"] as? String == b1["device_id"] as? String)
            #expect(b2["reclaimed"] as? Bool == true)
            #expect(try c.devices(alice).isEmpty)
            #expect(try c.devices(bob).count == 1)
        }
    }

    @Test("unregister with registration_id and version leaves a tombstone against delayed registrations")
    func tombstones() throws {
        try withDaemon { c in
            let user = Make.user()
            let rid = "install-" + UUID().uuidString
            func reg(_ version: Int) throws -> [String: Any] {
                try c.call(
                    "device.register",
                    [
                        "user": user, "platform": "fcm", "token": Make.fcmToken(), "registration_id": rid,
                        "version": version,
                    ])
            }
            #expect(try reg(3).result != nil)
            #expect(try c.removed("device.unregister", ["user": user, "registration_id": rid, "version": 3]) == 1)
            #expect(try c.devices(user).isEmpty)
            for delayed in [1, 2, 3] {
                let r = try reg(delayed)
                #expect(r.errorCode == 1008, "version \(delayed): \(r)")
                #expect(r.errorData?["version"] as? Int == 3)
            }
            #expect(try c.devices(user).isEmpty, "a delayed registration cannot bring delivery back")
            // A tombstone survives a repeated unregister with an older version.
            #expect(try c.removed("device.unregister", ["user": user, "registration_id": rid, "version": 1]) == 0)
            #expect(try reg(3).errorCode == 1008)
            let newer = try #require(try reg(4).result)
            #expect(newer["created"] as? Bool == true)
            #expect(newer["device_id"] as? String == Identity.deviceID(user: user, app: "default", registrationID: rid))
            #expect(try c.devices(user).count == 1)
            // An unregister older than the live registration leaves it alone.
            #expect(try c.removed("device.unregister", ["user": user, "registration_id": rid, "version": 3]) == 0)
            #expect(try c.devices(user).count == 1)
            // A tombstone for an id never registered still refuses older versions.
            let fresh = "never-" + UUID().uuidString
            #expect(try c.removed("device.unregister", ["user": user, "registration_id": fresh, "version": 7]) == 0)
            let late = try c.call(
                "device.register",
                ["user": user, "platform": "fcm", "token": Make.fcmToken(), "registration_id": fresh, "version": 6])
            #expect(late.errorCode == 1008)
            #expect(late.errorData?["version"] as? Int == 7)
            try c.fails("device.unregister", ["user": user, "registration_id": rid], code: -32602, field: "version")
            try c.fails(
                "device.register", ["user": user, "platform": "fcm", "token": Make.fcmToken(), "version": 1],
                code: -32602,
                field: "version")
        }
    }

    // MARK: Rate limits

    @Test("the 21st registration of one user within a minute is rate limited; another user is not")
    func registerRateLimit() throws {
        try withDaemon { c in
            let user = Make.user()
            let calls = (0..<21).map { _ in
                ("device.register", ["user": user, "platform": "fcm", "token": Make.fcmToken()] as [String: Any])
            }
            let responses = try c.pipeline(calls)
            #expect(
                responses.prefix(20).allSatisfy { $0.result != nil },
                "\(responses.prefix(20).filter { $0.result == nil })")
            let last = responses[20]
            #expect(last.errorCode == 1002, "\(last)")
            #expect(last.errorData?["reason"] as? String == "rate_limited")
            let wait = try #require(last.errorData?["retry_after_ms"] as? Int)
            #expect(wait > 0 && wait <= 60_000)
            // Refusals do not register anything, and a refresh counts too.
            #expect(try c.devices(user).count == 20)
            try c.fails("device.register", ["user": user, "platform": "fcm", "token": Make.fcmToken()], code: 1002)
            #expect(
                try c.register(["user": Make.user("other"), "platform": "fcm", "token": Make.fcmToken()])["created"]
                    as? Bool == true)
            // Unregistration has its own bucket.
            #expect(
                try c.removed("device.unregister", ["user": user, "device_id": String(repeating: "a", count: 32)]) == 0)
        }
    }

    @Test("the 41st unregistration of one user within a minute is rate limited")
    func unregisterRateLimit() throws {
        try withDaemon { c in
            let user = Make.user()
            let calls = (0..<41).map { i in
                ("device.unregister", ["user": user, "device_id": String(format: "%032x", i)] as [String: Any])
            }
            let responses = try c.pipeline(calls)
            #expect(responses.prefix(40).allSatisfy { ($0.result?["removed"] as? Int) == 0 })
            let last = responses[40]
            #expect(last.errorCode == 1002, "\(last)")
            #expect((last.errorData?["retry_after_ms"] as? Int ?? 0) > 0)
            #expect(
                try c.removed(
                    "device.unregister", ["user": Make.user("other"), "device_id": String(repeating: "b", count: 32)])
                    == 0)
            #expect(
                try c.register(["user": user, "platform": "fcm", "token": Make.fcmToken()])["created"] as? Bool == true)
        }
    }
}
