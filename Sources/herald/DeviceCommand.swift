import Foundation
import HeraldJSON

/// `herald device rename | disable | enable`: `device.update` of one device by
/// its id (as `herald devices USER` lists it), without its raw token.
enum DeviceCommand {
    static let usage = """
        usage: herald device rename DEVICE_ID NAME [--user U] [--app A]
               herald device disable DEVICE_ID [--user U] [--app A]
               herald device enable DEVICE_ID [--user U] [--app A]

        DEVICE_ID is the device's id in the app, as `herald devices USER` lists
        it; with --user it must be that user's. A disabled device is kept and listed ("enabled": false); sends skip it
        with reason device_disabled until it is enabled again. Registering its
        token again does not enable it. Each prints the device as device.list
        shows it.
        """

    static func run(_ arguments: [String]) throws(CommandFailure) -> Int32 {
        guard let sub = arguments.first, !sub.hasPrefix("--") || sub == "--help" else {
            throw CommandFailure("device needs a command: rename, disable or enable")
        }
        let rest = Array(arguments.dropFirst())
        switch sub {
        case "rename": return try update(rest, command: sub, positional: ["DEVICE_ID", "NAME"])
        case "disable", "enable": return try update(rest, command: sub, positional: ["DEVICE_ID"])
        case "help", "--help", "-h":
            Terminal.out(usage)
            return 0
        default: throw CommandFailure("unknown device command '\(sub)' (try 'herald device help')")
        }
    }

    /// One `device.update` call: `rename` sets the name, `disable` and
    /// `enable` the enabled flag.
    private static func update(
        _ arguments: [String], command: String, positional names: [String]
    ) throws(CommandFailure) -> Int32 {
        let options = try Options(arguments, values: ClientCommands.clientOptions.union(["app", "user"]))
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
        default: params.append("enabled", .bool(command == "enable"))
        }
        let client = try RPCClient(socketPath: socketPath(options))
        return ClientCommands.output(try client.call("device.update", params))
    }
}
