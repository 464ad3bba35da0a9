import Foundation

// herald: the push gateway daemon and its command-line tools.

let usage = """
    usage: herald COMMAND [ARGS]

    Daemon:
      herald serve [--config FILE]

    Clients (each takes --socket PATH; default $HERALD_SOCKET, then the config's socket):
      herald call METHOD [JSON-PARAMS]
      herald register --user U --platform apns|apns_voip|apns_widgets|apns_location|apns_pushtotalk|fcm|web|unified_push
                      --token T [--environment E]
                      [--p256dh B64 --auth B64] [--name N] [--app-version V] [--session S]
                      [--registration-id R --version N] [--bundle-id B] [--application-server-key B64]
                      [--app-id BUILD] [--user-agent UA] [--app A] [--time-zone TZ]
                      [--quiet-hours HH:MM-HH:MM [--quiet-days D,D...] [--during hold|silent|drop]]
                      [--topics T,T...]
                      (--p256dh and --auth with an https endpoint as --token: the Web Push form,
                      for web and unified_push always, for fcm and apns_voip optionally;
                      --app-id: the client build, default stable, part of the registration's identity;
                      the device's own rules: 'herald device help')
      herald devices USER [--app A]  (each device's form, app_id, user_agent, time_zone, quiet_hours
                      and topics too)
      herald activity register|list|unregister ...  (Live Activity tokens: 'herald activity help')
      herald channel create|list|delete|broadcast ...  (APNs broadcast channels: 'herald channel help')
      herald device rename DEVICE_ID NAME [--user U] [--app A]
      herald device disable DEVICE_ID [--user U] [--app A] (kept; sends skip it)
      herald device enable DEVICE_ID [--user U] [--app A]
      herald device prefs DEVICE_ID [--user U] [--app A] [--time-zone TZ | --clear-time-zone]
                  [--quiet-hours HH:MM-HH:MM [--quiet-days D,D...] [--during M] | --clear-quiet-hours]
                  [--topics T,T... | --clear-topics]
      herald send (--user U ... | --device ID ...) [--kind K] [--data KEY=VALUE ...] [--badge N]
                  [--loc-key K] [--collapse-key K] [--priority P] [--ttl S] [--idempotency-key K]
                  [--wait [--timeout-ms N]] [--app A] [--interruption-level L] [--relevance-score N]
                  [--thread-id T] [--category C] [--android-channel-id C] [--topics T,T...]
                  [--not-before TIME | --at-local HH:MM]
      herald status MESSAGE_ID [--detail] [--watch [--interval-ms N]] [--app A]
      herald events [--follow] [--since CURSOR] [--kinds K,K...] [--app A]
                    (one JSON event a line; without --follow, from the oldest kept until
                    caught up; 'herald events --help' for more)
      herald health [--app A]      (exit 0 only when healthy)
      herald stats

    Key tooling:
      herald vapid generate [--out FILE]
      herald vapid public-key --key FILE
      herald vapid verify --key FILE --public-key B64
      herald vapid token --key FILE --aud URL --sub SUBJECT [--exp SECONDS]
      herald webpush encrypt --p256dh B64 --auth B64 [--pad BYTES]

      herald help | version

    Bad input exits with status 2 and one line on stderr; a client whose call
    fails prints the JSON-RPC error on stderr and exits with status 1.
    """

let heraldVersion = "0.1.0"

func dispatch(_ arguments: [String]) throws(CommandFailure) -> Int32 {
    guard let command = arguments.first else {
        Terminal.out(usage)
        return 0
    }
    let rest = Array(arguments.dropFirst())
    switch command {
    case "serve": return try ServeCommand.serve(rest)
    case "call": return try ClientCommands.call(rest)
    case "register": return try ClientCommands.register(rest)
    case "devices": return try ClientCommands.devices(rest)
    case "device": return try DeviceCommand.run(rest)
    case "activity": return try ActivityCommand.run(rest)
    case "channel": return try ChannelCommand.run(rest)
    case "send": return try PushCommands.send(rest)
    case "status": return try PushCommands.status(rest)
    case "events": return try EventsCommand.run(rest)
    case "health": return try ClientCommands.health(rest)
    case "stats": return try ClientCommands.stats(rest)
    case "vapid": return try VapidCommand.run(rest)
    case "webpush": return try WebPushCommand.run(rest)
    case "help", "--help", "-h":
        Terminal.out(usage)
        return 0
    case "version", "--version":
        Terminal.out("herald \(heraldVersion)")
        return 0
    default:
        throw CommandFailure("unknown command '\(command)' (try 'herald help')")
    }
}

let status: Int32
do {
    status = try dispatch(Array(CommandLine.arguments.dropFirst()))
} catch {
    Terminal.err("herald: \(error.message)")
    status = error.status
}
exit(status)
