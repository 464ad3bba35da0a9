import Foundation
import HeraldJSON
import JSONRPC

/// `herald call`, `register`, `devices`, `health`, `stats`: clients of the daemon.
enum ClientCommands {
    static let clientOptions: Set<String> = ["socket", "config"]

    /// Prints a result on stdout (compact JSON), or the error on stderr with status 1.
    static func output(_ result: Result<JSON, RPCError>) -> Int32 {
        switch result {
        case .success(let value):
            Terminal.out(String(decoding: value.serialized(), as: UTF8.self))
            return 0
        case .failure(let error):
            Terminal.err("herald: " + describe(error))
            return 1
        }
    }

    /// `error CODE: MESSAGE DATA`, as a failed call is reported.
    static func describe(_ error: RPCError) -> String {
        var line = "error \(error.code): \(error.message)"
        if let data = error.data { line += " " + String(decoding: data.serialized(), as: UTF8.self) }
        return line
    }

    static func call(_ arguments: [String]) throws(CommandFailure) -> Int32 {
        let options = try Options(arguments, values: clientOptions)
        guard let method = options.positional.first, options.positional.count <= 2 else {
            throw CommandFailure("usage: herald call METHOD [JSON-PARAMS] [--socket PATH]")
        }
        var params = JSONObject()
        if options.positional.count == 2 {
            guard let parsed = try? JSONParser.parse(Array(options.positional[1].utf8)),
                case .object(let object) = parsed
            else { throw CommandFailure("params must be a JSON object, got '\(options.positional[1])'") }
            params = object
        }
        let client = try RPCClient(socketPath: socketPath(options))
        return output(try client.call(method, params))
    }

    static func register(_ arguments: [String]) throws(CommandFailure) -> Int32 {
        let options = try Options(
            arguments,
            values: clientOptions.union([
                "app", "user", "platform", "token", "environment", "p256dh", "auth", "name", "app-version", "session",
                "registration-id", "version", "bundle-id", "application-server-key", "app-id", "user-agent",
            ]).union(PreferenceOptions.deviceValues))
        try options.noPositional()
        var params = JSONObject()
        if let app = options.value("app") { params.append("app", .string(app)) }
        params.append("user", .string(try options.required("user")))
        params.append("platform", .string(try options.required("platform")))
        params.append("token", .string(try options.required("token")))
        for (option, key) in [
            ("environment", "environment"), ("name", "name"), ("app-version", "app_version"),
            ("session", "session"), ("registration-id", "registration_id"), ("bundle-id", "bundle_id"),
            ("application-server-key", "application_server_key"), ("app-id", "app_id"),
            ("user-agent", "user_agent"),
        ] {
            if let v = options.value(option) { params.append(key, .string(v)) }
        }
        if let v = options.value("version") {
            guard let n = Int64(v) else { throw CommandFailure("--version must be a whole number") }
            params.append("version", .int(n))
        }
        if options.value("p256dh") != nil || options.value("auth") != nil {
            params.append(
                "keys",
                ["p256dh": .string(try options.required("p256dh")), "auth": .string(try options.required("auth"))])
        }
        try PreferenceOptions.appendDeviceRules(options, to: &params)
        let client = try RPCClient(socketPath: socketPath(options))
        return output(try client.call("device.register", params))
    }

    static func devices(_ arguments: [String]) throws(CommandFailure) -> Int32 {
        let options = try Options(arguments, values: clientOptions.union(["app"]))
        guard options.positional.count == 1 else { throw CommandFailure("usage: herald devices USER [--app APP]") }
        var params: JSONObject = ["user": .string(options.positional[0])]
        if let app = options.value("app") { params.append("app", .string(app)) }
        let client = try RPCClient(socketPath: socketPath(options))
        return output(try client.call("device.list", params))
    }

    /// Exit 0 only when the daemon answers and reports status ok.
    static func health(_ arguments: [String]) throws(CommandFailure) -> Int32 {
        let options = try Options(arguments, values: clientOptions.union(["app"]))
        try options.noPositional()
        var params = JSONObject()
        if let app = options.value("app") { params.append("app", .string(app)) }
        let client = try RPCClient(socketPath: socketPath(options))
        let result = try client.call("system.health", params)
        let status = output(result)
        if case .success(let value) = result, value["status"]?.stringValue == "ok" { return status }
        return 1
    }

    static func stats(_ arguments: [String]) throws(CommandFailure) -> Int32 {
        let options = try Options(arguments, values: clientOptions)
        try options.noPositional()
        let client = try RPCClient(socketPath: socketPath(options))
        return output(try client.call("system.stats", [:]))
    }
}
