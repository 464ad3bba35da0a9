import Foundation
import HeraldJSON

/// `herald activity register | list | unregister`: the Live Activity tokens
/// of a user's iOS devices (`activity.register`, `activity.list`,
/// `activity.unregister`).
enum ActivityCommand {
    static let usage = """
        usage: herald activity register --user U --device DEVICE_ID
                   (--push-to-start-token HEX --activity-type TYPE | --update-token HEX --activity-id ID) [--app A]
               herald activity list USER [--app A]
               herald activity unregister --user U (--activity-id ID | --device DEVICE_ID --activity-type TYPE)
                   [--app A]

        A push-to-start token (ActivityKit's pushToStartToken) starts activities of its
        ActivityAttributes type (`herald send --live-activity start --attributes-type TYPE`);
        a running activity's update token gets its updates and its end, by the app's own id
        of the activity (`herald send --live-activity update --activity-id ID`). DEVICE_ID is
        the user's apns device the token came from, as `herald devices USER` lists it.
        """

    static func run(_ arguments: [String]) throws(CommandFailure) -> Int32 {
        guard let sub = arguments.first, !sub.hasPrefix("--") || sub == "--help" else {
            throw CommandFailure("activity needs a command: register, list or unregister")
        }
        let rest = Array(arguments.dropFirst())
        let options = try Options(
            rest,
            values: ClientCommands.clientOptions.union([
                "app", "user", "device", "push-to-start-token", "update-token", "activity-type", "activity-id",
            ]))
        var params = JSONObject()
        if let app = options.value("app") { params.append("app", .string(app)) }
        let method: String
        switch sub {
        case "register", "unregister":
            try options.noPositional()
            guard let user = options.value("user") else { throw CommandFailure("\(sub) needs --user\n" + usage) }
            params.append("user", .string(user))
            for (option, key) in [
                ("device", "device_id"), ("push-to-start-token", "push_to_start_token"),
                ("update-token", "update_token"), ("activity-type", "activity_type"), ("activity-id", "activity_id"),
            ] {
                if let v = options.value(option) { params.append(key, .string(v)) }
            }
            method = "activity." + sub
        case "list":
            guard options.positional.count == 1 else { throw CommandFailure("usage: herald activity list USER") }
            params.append("user", .string(options.positional[0]))
            method = "activity.list"
        case "help", "--help", "-h":
            Terminal.out(usage)
            return 0
        default: throw CommandFailure("unknown activity command '\(sub)' (try 'herald activity help')")
        }
        let client = try RPCClient(socketPath: socketPath(options))
        return ClientCommands.output(try client.call(method, params))
    }
}
