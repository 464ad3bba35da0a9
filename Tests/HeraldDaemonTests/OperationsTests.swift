import Foundation
import HeraldTestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// A datagram socket standing in for systemd's `NOTIFY_SOCKET`.
final class NotifyCapture: @unchecked Sendable {
    let path: String
    private let fd: Int32
    private(set) var messages: [String] = []

    init() throws {
        path = "/tmp/hn-\(UUID().uuidString.prefix(8)).sock"
        fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &addr.sun_path) { $0.copyBytes(from: Array(path.utf8)) }
        let rc = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        guard rc == 0 else { throw HarnessError("bind \(path): \(String(cString: strerror(errno)))") }
    }

    /// Reads datagrams until `until` holds for one (returned) or the timeout passes (nil).
    @discardableResult
    func wait(timeout: Double = 10, until: (String) -> Bool) -> String? {
        let deadline = Date().addingTimeInterval(timeout)
        while deadline.timeIntervalSinceNow > 0 {
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&pfd, 1, Int32(max(1, deadline.timeIntervalSinceNow * 1000))) > 0 else { continue }
            var buffer = [UInt8](repeating: 0, count: 4096)
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            guard n > 0 else { continue }
            let message = String(decoding: buffer[0..<n], as: UTF8.self)
            messages.append(message)
            if until(message) { return message }
        }
        return nil
    }

    /// Every datagram that arrives within `seconds`.
    func collect(for seconds: Double) -> [String] {
        let before = messages.count
        wait(timeout: seconds) { _ in false }
        return Array(messages[before...])
    }

    func close() {
        Glibc.close(fd)
        unlink(path)
    }
}

func monotonicMicros() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Int64(ts.tv_sec) * 1_000_000 + Int64(ts.tv_nsec) / 1000
}

@Suite("Operations: systemd notify, watchdog, reload, metrics", .serialized)
struct OperationsTests {
    @Test(
        "notify: READY=1 once serving, STATUS with the queue, WATCHDOG=1 at half WATCHDOG_USEC, RELOADING=1 with MONOTONIC_USEC, STOPPING=1"
    )
    func notifyProtocol() throws {
        let notify = try NotifyCapture()
        defer { notify.close() }
        let d = try DaemonProcess(environment: ["NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "400000"])
        defer { d.cleanup() }
        let ready = notify.wait { $0.contains("READY=1") }
        #expect(ready != nil, "READY=1 arrives")
        #expect(notify.messages.first?.hasPrefix("READY=1") == true, "nothing comes before READY=1: \(notify.messages)")
        // The socket was listening before READY=1 (start() connected already); the store answers too.
        #expect(try d.call("system.health").result?["status"] as? String == "ok")

        // Every 200 ms. Waited for, not timed: a loaded machine may delay them, but they come.
        var pings = 0
        let pingDeadline = Date().addingTimeInterval(20)
        while pings < 3, pingDeadline.timeIntervalSinceNow > 0 {
            if notify.wait(timeout: pingDeadline.timeIntervalSinceNow, until: { $0 == "WATCHDOG=1" }) != nil {
                pings += 1
            }
        }
        #expect(pings >= 3, "WATCHDOG=1 pings: \(pings)")

        let status = notify.wait(timeout: 8) { $0.hasPrefix("STATUS=serving: queue=") }
        #expect(status?.contains("in_flight=") == true, "periodic STATUS: \(status ?? "none")")

        let before = monotonicMicros()
        d.signal(SIGHUP)
        let reloading = notify.wait { $0.hasPrefix("RELOADING=1") }
        let after = monotonicMicros()
        let usec = reloading?.split(separator: "\n").first { $0.hasPrefix("MONOTONIC_USEC=") }
            .flatMap { Int64($0.dropFirst("MONOTONIC_USEC=".count)) }
        #expect(usec != nil, "RELOADING=1 carries MONOTONIC_USEC: \(reloading ?? "none")")
        if let usec { #expect(usec >= before && usec <= after, "MONOTONIC_USEC is CLOCK_MONOTONIC now") }
        #expect(notify.wait { $0.hasPrefix("READY=1") } != nil, "READY=1 again after the reload")

        d.signal(SIGTERM)
        #expect(notify.wait { $0.hasPrefix("STOPPING=1") } != nil)
        #expect(d.stop() == 0)
    }

    @Test("WATCHDOG_PID naming another process: no pings; no WATCHDOG_USEC: no pings")
    func watchdogForSomeoneElse() throws {
        for env in [["WATCHDOG_USEC": "200000", "WATCHDOG_PID": "1"], [:]] {
            let notify = try NotifyCapture()
            defer { notify.close() }
            var environment = env
            environment["NOTIFY_SOCKET"] = notify.path
            let d = try DaemonProcess(environment: environment)
            defer { d.cleanup() }
            #expect(notify.wait { $0.contains("READY=1") } != nil)
            let window = notify.collect(for: 1)
            #expect(!window.contains("WATCHDOG=1"), "\(env): \(window)")
        }
    }

    @Test("systemd-socket-activate: the daemon serves the socket it is given and creates none")
    func systemdSocketActivate() throws {
        let tool = "/usr/bin/systemd-socket-activate"
        #expect(FileManager.default.isExecutableFile(atPath: tool), "systemd-socket-activate (Debian package systemd)")
        let d = try DaemonProcess()
        defer { d.cleanup() }
        d.stop()
        let activated = d.dir.appendingPathComponent("activated.sock").path
        let p = Process()
        p.executableURL = URL(fileURLWithPath: tool)
        p.arguments = ["--listen=\(activated)", heraldBinary(), "serve", "--config", d.configPath]
        let log = d.dir.appendingPathComponent("activate.log").path
        _ = FileManager.default.createFile(atPath: log, contents: nil)
        p.standardError = FileHandle(forWritingAtPath: log) ?? FileHandle.nullDevice
        try p.run()
        defer {
            if p.isRunning { kill(p.processIdentifier, SIGKILL) }
            p.waitUntilExit()
        }
        // systemd-socket-activate listens first and starts herald on the first connection.
        var response: [String: Any]?
        for _ in 0..<200 {
            if let c = try? TestConnection(path: activated) {
                response = try? c.call("system.health")
                c.close()
                if response != nil { break }
            }
            usleep(25_000)
        }
        #expect(response?.result?["status"] as? String == "ok")
        #expect(!FileManager.default.fileExists(atPath: d.socketPath), "the configured socket is not created")
        let text = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
        #expect(text.contains("socket=systemd"), "herald says it serves systemd's socket")
        // systemd-socket-activate exec'd herald: the same process, stopped as systemd stops it.
        #expect(judgeShutdown(p) { (try? String(contentsOfFile: log, encoding: .utf8)) ?? "" } == 0)
    }

    @Test("a bad reload is refused with the file and line; the running config stays and connections keep working")
    func badReloadRefused() throws {
        let d = try DaemonProcess()
        defer { d.cleanup() }
        let c = try d.connect()
        defer { c.close() }
        #expect(try c.call("system.health").result?["status"] as? String == "ok")
        let good = try String(contentsOfFile: d.configPath, encoding: .utf8)

        // An unknown key.
        try (good + "\n[app.extra]\nbogus_key = 1\n").write(toFile: d.configPath, atomically: true, encoding: .utf8)
        d.signal(SIGHUP)
        #expect(d.waitForLog("reload_refused"))
        #expect(d.log().contains("herald.conf:"), "the refusal names the file and line")
        #expect(d.log().contains("bogus_key"))
        #expect(try c.call("system.health", ["app": "extra"]).errorCode == 1004, "the new app did not come in")

        // A credential file that cannot be read.
        try (good + "\n[app.extra]\nvapid_key = /nonexistent/vapid.pem\nvapid_subject = mailto:a@example.com\n")
            .write(toFile: d.configPath, atomically: true, encoding: .utf8)
        d.signal(SIGHUP)
        #expect(d.waitForLog("reload_refused", count: 2))
        #expect(try c.call("system.health", ["app": "extra"]).errorCode == 1004)

        // A good one: the same connection sees the new app.
        try (good + "\n[app.extra]\ndevice_cap = 3\n").write(toFile: d.configPath, atomically: true, encoding: .utf8)
        d.signal(SIGHUP)
        #expect(d.waitForLog("config_reloaded"))
        #expect(try c.call("system.health", ["app": "extra"]).result?["status"] as? String == "ok")
        let metrics = try PrometheusExposition(c.call("system.metrics").result?["text"] as? String ?? "")
        #expect(metrics.value("herald_config_reloads_total", ["result": "refused"]) == 2)
        #expect(metrics.value("herald_config_reloads_total", ["result": "applied"]) == 1)
        #expect(d.isRunning)
    }

    @Test("a reload applies app settings and says which startup-bound settings need a restart")
    func restartOnlySettings() throws {
        let d = try DaemonProcess()
        defer { d.cleanup() }
        let good = try String(contentsOfFile: d.configPath, encoding: .utf8)
        let changed = good.replacingOccurrences(of: "socket_mode = 0600", with: "socket_mode = 0660")
            .replacingOccurrences(of: "device_cap = 20", with: "device_cap = 1")
            .replacingOccurrences(of: "log_level = debug", with: "log_level = info")
        #expect(changed != good)
        try changed.write(toFile: d.configPath, atomically: true, encoding: .utf8)
        d.signal(SIGHUP)
        #expect(d.waitForLog("config_reloaded"))
        #expect(d.log().contains("reload_needs_restart settings=server.socket_mode"))
        var st = stat()
        #expect(
            stat(d.socketPath, &st) == 0 && st.st_mode & 0o777 == 0o600, "the socket keeps its mode until a restart")
        // device_cap = 1 is in effect: a second device evicts the first.
        let first =
            try d.call(
                "device.register", ["user": "u", "platform": "fcm", "token": "t1"]
            ).result?["device_id"] as? String
        let second = try d.call("device.register", ["user": "u", "platform": "fcm", "token": "t2"]).result
        #expect(second?["evicted"] as? [String] == [first].compactMap { $0 })
        // log_level = info is in effect: debug lines stop.
        let lines = d.log().split(separator: "\n").count
        _ = try d.call("system.health")
        #expect(!d.log().split(separator: "\n").dropFirst(lines).contains { $0.hasPrefix("<7>") })
    }

    @Test("metrics: /metrics in the Prometheus text format, /livez and /readyz, 404 and 405; system.metrics the same")
    func metricsListener() throws {
        let d = try DaemonProcess(server: "instance_id = ops-1.a_b", metrics: "listen = 127.0.0.1:0")
        defer { d.cleanup() }
        #expect(d.waitForLog("metrics_listening"))
        let port = try #require(d.metricsPort)
        _ = try d.call("device.register", ["user": "m", "platform": "fcm", "token": "metrics-token"])

        let scrape = try httpRequest(port: port, path: "/metrics")
        #expect(scrape.status == 200)
        #expect(scrape.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8")
        let m = try PrometheusExposition(scrape.body)
        #expect(m.value("herald_ready") == 1)
        #expect(m.value("herald_devices", ["platform": "fcm"]) == 1)
        #expect(m.value("herald_queue_depth") == 0)
        #expect(m.value("herald_build_info", ["version": "0.1.0", "herald_instance": "ops-1.a_b"]) == 1)
        #expect(try d.call("system.stats").result?["instance"] as? String == "ops-1.a_b")
        let storeStats = try d.call("system.stats").result?["store"] as? [String: Any]
        #expect(storeStats?["backend"] as? String == "sqlite" && storeStats?["held_results"] as? Int == 0)
        #expect(storeStats?["pool_size"] == nil && storeStats?["lease_ms"] == nil)
        #expect(m.value("herald_store_held_results") == 0)
        #expect(m.value("herald_store_held_results_dropped_total") == 0)
        // No app names on the listener by default: how many apps are in each state.
        #expect(m.value("herald_transport_apps", ["transport": "fcm", "state": "disabled"]) == 1)
        #expect(m.value("herald_transport_apps", ["transport": "fcm", "state": "ready"]) == 0)
        #expect(m.types["herald_transport_state"] == nil)
        for family in [
            "herald_sends_total", "herald_outcomes_total", "herald_retries_total", "herald_stale_removed_total",
            "herald_stale_refused_total", "herald_breaker_trips_total", "herald_in_flight", "herald_queue_in_flight",
            "herald_provider_connections", "herald_client_connections", "herald_send_duration_seconds",
            "herald_webpush_origin_waiting", "herald_webpush_origins_unresponsive",
            "herald_webpush_origin_deferred_total", "herald_lane_floor",
        ] {
            #expect(m.types[family] != nil, "\(family) is exposed")
        }
        #expect(m.types["herald_send_duration_seconds"] == "histogram")
        for platform in ["apns", "apns_voip", "fcm", "web"] {
            #expect(m.value("herald_send_duration_seconds_count", ["platform": platform]) == 0)
        }

        // system.metrics names the caller's apps (it may call them).
        let rpc = try PrometheusExposition(d.call("system.metrics").result?["text"] as? String ?? "")
        #expect(
            Set(rpc.types.keys).subtracting(["herald_transport_state"])
                == Set(m.types.keys).subtracting(["herald_transport_apps"]))
        #expect(rpc.value("herald_transport_state", ["app": "default", "transport": "fcm", "state": "disabled"]) == 1)
        #expect(try d.call("system.metrics").result?["content_type"] as? String == scrape.headers["content-type"])

        #expect(try httpRequest(port: port, path: "/livez").status == 200)
        let ready = try httpRequest(port: port, path: "/readyz")
        #expect(ready.status == 200 && ready.body == "ok\n")
        #expect(try httpRequest(port: port, path: "/secret").status == 404)
        let post = try httpRequest(port: port, method: "POST", path: "/metrics")
        #expect(post.status == 405 && post.headers["allow"] == "GET, HEAD")
        let head = try httpRequest(port: port, method: "HEAD", path: "/livez")
        #expect(head.status == 200 && head.body.isEmpty)
        // Params are checked like every method's.
        #expect(try d.call("system.metrics", ["bogus": 1]).errorCode == -32602)
    }

    @Test("app_figures shows each app's transport states; bearer_token_file guards /metrics, never the probes")
    func metricsListenerOptions() throws {
        let token = "metrics-token-\(UInt64.random(in: 1...UInt64.max))"
        let tokenPath = NSTemporaryDirectory() + "herald-metrics-token-\(getpid())-\(UInt32.random(in: 1...1_000_000))"
        defer { unlink(tokenPath) }
        try (token + "\n").write(toFile: tokenPath, atomically: false, encoding: .utf8)
        chmod(tokenPath, 0o600)

        let d = try DaemonProcess(
            metrics: "listen = 127.0.0.1:0\napp_figures = true\nbearer_token_file = \(tokenPath)")
        defer { d.cleanup() }
        #expect(d.waitForLog("metrics_listening"))
        let port = try #require(d.metricsPort)
        for headers in [[:], ["Authorization": "Bearer wrong-\(token)"], ["Authorization": "Basic \(token)"]] {
            let refused = try httpRequest(port: port, path: "/metrics", headers: headers)
            #expect(refused.status == 401, "\(headers)")
            #expect(refused.headers["www-authenticate"] == "Bearer realm=\"herald\"")
            #expect(!refused.body.contains("herald_"))
        }
        let scrape = try httpRequest(port: port, path: "/metrics", headers: ["Authorization": "Bearer \(token)"])
        #expect(scrape.status == 200)
        let m = try PrometheusExposition(scrape.body)
        #expect(m.value("herald_transport_state", ["app": "default", "transport": "fcm", "state": "disabled"]) == 1)
        #expect(m.types["herald_transport_apps"] == nil)
        #expect(try httpRequest(port: port, path: "/livez").status == 200)
        #expect(try httpRequest(port: port, path: "/readyz").status == 200)
        #expect(!d.log().contains(token), "the token never reaches the log")

        // Readable by others: refused at start, like every key file.
        d.stop()
        chmod(tokenPath, 0o644)
        let (status, _, err) = try runHerald(["serve", "--config", d.configPath])
        #expect(status == 1)
        #expect(err.contains("too open") && !err.contains(token), "\(err)")
    }

    @Test("a metrics address that cannot be bound stops the start with a clear error")
    func metricsBindFailure() throws {
        let d = try DaemonProcess(metrics: "listen = 127.0.0.1:0")
        defer { d.cleanup() }
        #expect(d.waitForLog("metrics_listening"))
        let port = try #require(d.metricsPort)
        let other = try DaemonProcess()
        defer { other.cleanup() }
        other.stop()
        let text = try String(contentsOfFile: other.configPath, encoding: .utf8)
        try text.replacingOccurrences(of: "[metrics]\n", with: "[metrics]\nlisten = 127.0.0.1:\(port)\n")
            .write(toFile: other.configPath, atomically: true, encoding: .utf8)
        let (status, _, err) = try runHerald(["serve", "--config", other.configPath])
        #expect(status == 1)
        #expect(err.contains("[metrics] listen 127.0.0.1:\(port)"), "\(err)")
        #expect(err.contains("in use"), "\(err)")
        #expect(!FileManager.default.fileExists(atPath: other.socketPath), "the socket is removed again")
        // The first daemon still serves its metrics.
        #expect(try httpRequest(port: port, path: "/livez").status == 200)
    }
}
