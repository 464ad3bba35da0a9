import Foundation
import HeraldJSON

#if canImport(Glibc)
    import Glibc
#endif

/// `herald send` and `herald status`: push.send and push.status from the shell.
enum PushCommands {
    static let sendUsage = """
        usage: herald send (--user U ... | --device ID ...)
                   [--kind notification|clear|call_ring|widgets|location|pushtotalk]
                   [--data KEY=VALUE ...] [--badge N] [--loc-key K] [--collapse-key K]
                   [--priority high|normal|low] [--ttl SECONDS] [--idempotency-key K]
                   [--wait [--timeout-ms N]] [--app A]
                   [--interruption-level passive|active|time-sensitive|critical] [--relevance-score 0..1]
                   [--thread-id T] [--category C] [--android-channel-id C]
                   [--web-payload JSON | --notification JSON] [--shrink JSON] [--topics T,T...]
                   [--not-before TIME | --at-local HH:MM]
                   [--live-activity start|update|end [--activity-id ID] [--attributes-type T]
                    [--attributes JSON] [--content-state JSON] [--timestamp T] [--stale-date T]
                    [--dismissal-date T] [--channel CHANNEL_ID]]
          --live-activity E   kind live_activity: start (to the push-to-start tokens of
                              --attributes-type; needs --attributes, --content-state and --loc-key),
                              update or end (to the update tokens of --activity-id); T is Unix
                              seconds or RFC 3339 ('herald activity help' for the tokens)
          --kind K            widgets, location and pushtotalk go to apns_widgets, apns_location
                              and apns_pushtotalk tokens only
          --web-payload JSON  a JSON object: the content of Web Push-form records
                              (never sent to APNs or FCM legacy-form devices); with "web_push": 8030,
                              Declarative Web Push, checked as WebKit reads it
          --notification JSON Declarative Web Push built for you:
                              {"title":"…","navigate":"https://…","body":"…","app_badge":3}
          --shrink JSON       a JSON array of steps that bring it under the record, in order:
                              [{"drop":["/media"]},{"shorten":"/body"},{"keep":["/type"]}]
          --topics T,T...     what the message is about: a device with topics gets it only when
                              they share one (the others are skipped, not_subscribed)
          --not-before TIME   held until then: RFC 3339 with Z or an offset, 2026-12-24T09:00:00+01:00
          --at-local HH:MM    held until each device's own clock next reads HH:MM (a device
                              without a time zone is sent at once)
        """

    static func send(_ arguments: [String]) throws(CommandFailure) -> Int32 {
        let options = try Options(
            arguments,
            values: ClientCommands.clientOptions.union([
                "app", "kind", "badge", "loc-key", "collapse-key", "priority", "ttl", "idempotency-key", "timeout-ms",
                "interruption-level", "relevance-score", "thread-id", "category", "android-channel-id",
                "web-payload", "shrink", "notification", "live-activity", "activity-id", "attributes-type",
                "attributes", "content-state", "timestamp", "stale-date", "dismissal-date", "channel",
            ]).union(PreferenceOptions.sendValues), flags: ["wait"], repeated: ["user", "device", "data"])
        try options.noPositional()
        let users = options.all("user")
        let devices = options.all("device")
        guard users.isEmpty != devices.isEmpty else {
            throw CommandFailure("give --user or --device (one or more times), not both\n" + sendUsage)
        }
        var params = JSONObject()
        if let app = options.value("app") { params.append("app", .string(app)) }
        params.append(
            "to",
            users.isEmpty ? ["devices": .array(devices.map(JSON.string))] : ["users": .array(users.map(JSON.string))])
        if let event = options.value("live-activity") {
            if let kind = options.value("kind"), kind != "live_activity" {
                throw CommandFailure("--live-activity sends kind live_activity, not \(kind)")
            }
            params.append("kind", "live_activity")
            params.append("event", .string(event))
        } else if let kind = options.value("kind") {
            params.append("kind", .string(kind))
        }
        for (option, key) in [
            ("activity-id", "activity_id"), ("attributes-type", "attributes_type"), ("channel", "channel_id"),
        ] {
            if let v = options.value(option) { params.append(key, .string(v)) }
        }
        for (option, key) in [("attributes", "attributes"), ("content-state", "content_state")] {
            guard let text = options.value(option) else { continue }
            guard let value = try? JSONParser.parse(text) else {
                throw CommandFailure("--\(option) must be JSON, got '\(text)'")
            }
            params.append(key, value)
        }
        for (option, key) in [
            ("timestamp", "timestamp"), ("stale-date", "stale_date"), ("dismissal-date", "dismissal_date"),
        ] {
            guard let text = options.value(option) else { continue }
            params.append(key, Int64(text).map { .int($0) } ?? .string(text))
        }
        if !options.all("data").isEmpty {
            var data = JSONObject()
            for pair in options.all("data") {
                guard let eq = pair.firstIndex(of: "="), eq != pair.startIndex else {
                    throw CommandFailure("--data takes KEY=VALUE, got '\(pair)'")
                }
                data.append(String(pair[..<eq]), .string(String(pair[pair.index(after: eq)...])))
            }
            params.append("data", .object(data))
        }
        if options.value("badge") != nil {
            params.append("badge", .int(try options.integer("badge", default: 0, in: 0...999_999)))
        }
        if let key = options.value("loc-key") { params.append("alert", ["loc_key": .string(key)]) }
        for (option, key) in [
            ("collapse-key", "collapse_key"), ("priority", "priority"), ("idempotency-key", "idempotency_key"),
            ("interruption-level", "interruption_level"), ("thread-id", "thread_id"), ("category", "category"),
            ("android-channel-id", "android_channel_id"),
        ] {
            if let v = options.value(option) { params.append(key, .string(v)) }
        }
        if let v = options.value("relevance-score") {
            guard let score = Double(v), score.isFinite, (0...1).contains(score) else {
                throw CommandFailure("--relevance-score must be a number from 0 to 1")
            }
            params.append("relevance_score", .double(score))
        }
        for (option, key) in [("web-payload", "web_payload"), ("notification", "notification"), ("shrink", "shrink")] {
            guard let text = options.value(option) else { continue }
            guard let value = try? JSONParser.parse(text) else {
                throw CommandFailure("--\(option) must be JSON, got '\(text)'")
            }
            params.append(key, value)
        }
        try PreferenceOptions.appendSendRules(options, to: &params)
        if options.value("ttl") != nil {
            params.append("ttl", .int(try options.integer("ttl", default: 0, in: 0...2_419_200)))
        }
        if options.flag("wait") {
            params.append("wait", true)
            if options.value("timeout-ms") != nil {
                params.append("timeout_ms", .int(try options.integer("timeout-ms", default: 0, in: 0...300_000)))
            }
        } else if options.value("timeout-ms") != nil {
            throw CommandFailure("--timeout-ms goes with --wait")
        }
        let client = try RPCClient(socketPath: socketPath(options))
        return ClientCommands.output(try client.call("push.send", params))
    }

    /// `herald status ID [--detail] [--watch [--interval-ms N]]`. With
    /// `--watch`, a progress line (redrawn in place on a terminal) on stderr
    /// until the message is complete, then the final status on stdout.
    static func status(_ arguments: [String]) throws(CommandFailure) -> Int32 {
        let options = try Options(
            arguments, values: ClientCommands.clientOptions.union(["app", "interval-ms"]), flags: ["watch", "detail"])
        guard options.positional.count == 1 else {
            throw CommandFailure("usage: herald status MESSAGE_ID [--detail] [--watch [--interval-ms N]] [--app A]")
        }
        var params: JSONObject = ["message_id": .string(options.positional[0])]
        if let app = options.value("app") { params.append("app", .string(app)) }
        if options.flag("detail") { params.append("detail", true) }
        let client = try RPCClient(socketPath: socketPath(options))
        guard options.flag("watch") else { return ClientCommands.output(try client.call("push.status", params)) }
        let interval = try options.integer("interval-ms", default: 200, in: 10...60_000)
        let terminal = isatty(2) == 1
        var last = ""
        while true {
            let result = try client.call("push.status", params)
            guard case .success(let status) = result else { return ClientCommands.output(result) }
            let line = progressLine(status)
            if line != last {
                if terminal {
                    FileHandle.standardError.write(Data(("\r\u{1B}[K" + line).utf8))
                } else {
                    Terminal.err(line)
                }
                last = line
            }
            if status["state"]?.stringValue == "complete" {
                if terminal { FileHandle.standardError.write(Data("\n".utf8)) }
                return ClientCommands.output(result)
            }
            usleep(UInt32(interval) * 1000)
        }
    }

    /// `pending 412/500 done: delivered 400, failed 2, … | waiting: queued 80, …`
    static func progressLine(_ status: JSON) -> String {
        let counts = status["counts"]?.objectValue ?? JSONObject()
        func n(_ key: String) -> Int { Int(counts[key]?.numberValue?.int64 ?? 0) }
        let final = ["delivered", "failed", "expired", "superseded", "skipped", "removed_stale"]
        let open = ["queued", "held", "in_flight", "retrying"]
        let done = final.reduce(0) { $0 + n($1) }
        let total = done + open.reduce(0) { $0 + n($1) }
        let parts = (final + open).filter { n($0) > 0 }.map { "\($0) \(n($0))" }
        return "\(status["state"]?.stringValue ?? "?") \(done)/\(total): " + parts.joined(separator: ", ")
    }
}
