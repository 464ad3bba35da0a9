import Foundation
import HeraldJSON

/// `herald device rename | disable | enable | prefs`: `device.update` of one
/// device by its id (as `herald devices USER` lists it), without its raw token.
enum DeviceCommand {
    static let usage = """
        usage: herald device rename DEVICE_ID NAME [--user U] [--app A]
               herald device disable DEVICE_ID [--user U] [--app A]
               herald device enable DEVICE_ID [--user U] [--app A]
               herald device prefs DEVICE_ID [--user U] [--app A] [--time-zone TZ | --clear-time-zone]
                   [--quiet-hours HH:MM-HH:MM [--quiet-days D,D...] [--during hold|silent|drop] | --clear-quiet-hours]
                   [--topics T,T... | --clear-topics]

        DEVICE_ID is the device's id in the app, as `herald devices USER` lists
        it; with --user it must be that user's. A disabled device is kept and listed ("enabled": false); sends skip it
        with reason device_disabled until it is enabled again. Registering its
        token again does not enable it. Each prints the device as device.list
        shows it.

        prefs sets the device's own rules; a rule not named keeps its value:
          --time-zone TZ           an IANA time zone (Europe/Paris), which quiet hours and
                                   `herald send --at-local` are read in
          --quiet-hours S-E        a quiet period from S to E (22:00-07:00 spans midnight) on the
                                   device's clock, every day or the --quiet-days it starts on
                                   (mon,...,sun); needs a time zone
          --during M               what a push due inside it does: hold (default; sent when it
                                   ends), silent (sent without sound) or drop
          --topics T,T...          the message topics the device wants ('' for none); a message
                                   with topics reaches it only when they share one
          --clear-time-zone, --clear-quiet-hours, --clear-topics   remove that rule
        """

    static func run(_ arguments: [String]) throws(CommandFailure) -> Int32 {
        guard let sub = arguments.first, !sub.hasPrefix("--") || sub == "--help" else {
            throw CommandFailure("device needs a command: rename, disable, enable or prefs")
        }
        let rest = Array(arguments.dropFirst())
        switch sub {
        case "rename": return try update(rest, command: sub, positional: ["DEVICE_ID", "NAME"])
        case "disable", "enable", "prefs": return try update(rest, command: sub, positional: ["DEVICE_ID"])
        case "help", "--help", "-h":
            Terminal.out(usage)
            return 0
        default: throw CommandFailure("unknown device command '\(sub)' (try 'herald device help')")
        }
    }

    /// One `device.update` call: `rename` sets the name, `disable` and
    /// `enable` the enabled flag, `prefs` the device's own rules.
    private static func update(
        _ arguments: [String], command: String, positional names: [String]
    ) throws(CommandFailure) -> Int32 {
        let prefs = command == "prefs"
        let options = try Options(
            arguments,
            values: ClientCommands.clientOptions.union(["app", "user"]).union(
                prefs ? PreferenceOptions.deviceValues : []),
            flags: prefs ? PreferenceOptions.clearFlags : [])
        guard options.positional.count == names.count else {
            let expected = names.joined(separator: " ")
            throw CommandFailure("usage: herald device \(command) \(expected) [--user U] [--app A] [--socket PATH]")
        }
        var params = JSONObject()
        if let app = options.value("app") { params.append("app", .string(app)) }
        if let user = options.value("user") { params.append("user", .string(user)) }
        params.append("device_id", .string(options.positional[0]))
        switch command {
        case "rename": params.append("name", .string(options.positional[1]))
        case "prefs":
            guard try PreferenceOptions.appendDeviceRules(options, to: &params) else {
                throw CommandFailure(
                    "device prefs needs --time-zone, --quiet-hours, --topics or a --clear- option (try 'herald device help')"
                )
            }
        default: params.append("enabled", .bool(command == "enable"))
        }
        let client = try RPCClient(socketPath: socketPath(options))
        return ClientCommands.output(try client.call("device.update", params))
    }
}
