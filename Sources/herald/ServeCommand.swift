import HeraldDaemon

/// `herald serve`: the daemon itself, in this process. The one file of the
/// executable that imports HeraldDaemon; the other commands are clients of
/// its socket and read only the configuration (HeraldConfiguration).
enum ServeCommand {
    static func serve(_ arguments: [String]) throws(CommandFailure) -> Int32 {
        let options = try Options(arguments, values: ["config"])
        try options.noPositional()
        return Daemon.run(configPath: options.value("config"))
    }
}
