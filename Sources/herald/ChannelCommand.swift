import Foundation
import HeraldJSON

/// `herald channel create | list | delete` and `herald channel broadcast`:
/// APNs broadcast channels (`channel.create`, `channel.list`,
/// `channel.delete`, `push.broadcast`).
enum ChannelCommand {
    static let usage = """
        usage: herald channel create --storage none|latest [--bundle-id B] [--environment E] [--app A]
               herald channel list [--app A]
               herald channel delete CHANNEL_ID [--app A]
               herald channel broadcast CHANNEL_ID --event update|end [--content-state JSON]
                   [--loc-key K] [--priority P] [--ttl S] [--stale-date T] [--dismissal-date T]
                   [--wait [--timeout-ms N]] [--app A]

        A channel reaches every Live Activity subscribed to it with one request to APNs (iOS 18).
        Start activities on it with `herald send --live-activity start --channel CHANNEL_ID …`.
        --storage none keeps no message (a higher budget; sent with apns-expiration 0);
        latest keeps the most recent one for devices that subscribe later (up to 8 hours).
        """

    static func run(_ arguments: [String]) throws(CommandFailure) -> Int32 {
        guard let sub = arguments.first, !sub.hasPrefix("--") || sub == "--help" else {
            throw CommandFailure("channel needs a command: create, list, delete or broadcast")
        }
        let options = try Options(
            Array(arguments.dropFirst()),
            values: ClientCommands.clientOptions.union([
                "app", "storage", "bundle-id", "environment", "event", "content-state", "loc-key", "priority", "ttl",
                "stale-date", "dismissal-date", "timeout-ms",
            ]), flags: ["wait"])
        var params = JSONObject()
        if let app = options.value("app") { params.append("app", .string(app)) }
        let method: String
        switch sub {
        case "create":
            try options.noPositional()
            for (option, key) in [("storage", "storage"), ("bundle-id", "bundle_id"), ("environment", "environment")] {
                if let v = options.value(option) { params.append(key, .string(v)) }
            }
            method = "channel.create"
        case "list":
            try options.noPositional()
            method = "channel.list"
        case "delete", "broadcast":
            guard options.positional.count == 1 else {
                throw CommandFailure("usage: herald channel \(sub) CHANNEL_ID …\n" + usage)
            }
            params.append("channel_id", .string(options.positional[0]))
            method = sub == "delete" ? "channel.delete" : "push.broadcast"
            if sub == "broadcast" {
                if let event = options.value("event") { params.append("event", .string(event)) }
                if let text = options.value("content-state") {
                    guard let value = try? JSONParser.parse(text) else {
                        throw CommandFailure("--content-state must be JSON, got '\(text)'")
                    }
                    params.append("content_state", value)
                }
                if let key = options.value("loc-key") { params.append("alert", ["loc_key": .string(key)]) }
                if let v = options.value("priority") { params.append("priority", .string(v)) }
                if options.value("ttl") != nil {
                    params.append("ttl", .int(try options.integer("ttl", default: 0, in: 0...28_800)))
                }
                for (option, key) in [("stale-date", "stale_date"), ("dismissal-date", "dismissal_date")] {
                    guard let text = options.value(option) else { continue }
                    params.append(key, Int64(text).map { .int($0) } ?? .string(text))
                }
                if options.flag("wait") {
                    params.append("wait", true)
                    if options.value("timeout-ms") != nil {
                        params.append(
                            "timeout_ms", .int(try options.integer("timeout-ms", default: 0, in: 0...300_000)))
                    }
                }
            }
        case "help", "--help", "-h":
            Terminal.out(usage)
            return 0
        default: throw CommandFailure("unknown channel command '\(sub)' (try 'herald channel help')")
        }
        let client = try RPCClient(socketPath: socketPath(options))
        return ClientCommands.output(try client.call(method, params))
    }
}
