import Foundation
import HeraldIO
import HeraldJSON
import JSONRPC
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// `herald events`: the daemon's event stream (`events.subscribe`) as JSON
/// lines, for a shell or `jq`.
enum EventsCommand {
    static let usage = """
        usage: herald events [--follow] [--since CURSOR] [--kinds K,K...] [--app A]
          Prints the daemon's events, one compact JSON object a line, oldest first.
          --since CURSOR  start after this cursor (the "cursor" of an event printed before);
                          default: the oldest event kept, or with --follow what comes from now
          --follow        keep printing events as they come, until SIGINT or SIGTERM (exit 0);
                          without it, exit 0 once no event has come for a second
          --kinds K,K...  only these: delivery, device_removed, message_complete, credential,
                          transport (default all)
          --app A         one app (default every app the caller may use)
          A reader that falls behind the daemon's buffer is not shown the skip: the events
          it missed are read again from where it fell behind, on a new connection. A
          {"kind":"gap","reason":"retention"} line means the events up to its cursor were
          purged before they could be read. If the daemon closes the connection, the
          command exits 1 naming the cursor to resume from with --since.
        """

    /// How long without an event means the backlog has been read (without --follow).
    static let quietMs: Int64 = 1000
    /// How long one wait for the daemon lasts before SIGINT and SIGTERM are looked at again.
    static let sliceMs: Int32 = 200

    static func run(_ arguments: [String]) throws(CommandFailure) -> Int32 {
        if arguments == ["help"] || arguments.contains("--help") || arguments.contains("-h") {
            Terminal.out(usage)
            return 0
        }
        let options = try Options(
            arguments, values: ClientCommands.clientOptions.union(["since", "kinds", "app"]), flags: ["follow"])
        guard options.positional.isEmpty else {
            throw CommandFailure("unexpected argument '\(options.positional[0])' (try 'herald help')")
        }
        var params = JSONObject()
        if let app = options.value("app") { params.append("app", .string(app)) }
        if let text = options.value("kinds") {
            let kinds = text.split(separator: ",", omittingEmptySubsequences: false).map {
                $0.trimmingCharacters(in: .whitespaces)
            }
            guard !kinds.contains(where: \.isEmpty) else {
                throw CommandFailure("--kinds takes kinds separated by commas, got '\(text)'")
            }
            params.append("kinds", .array(kinds.map { .string($0) }))
        }
        if let since = options.value("since"), since.isEmpty { throw CommandFailure("--since needs a cursor") }
        let follow = options.flag("follow")
        // Without --follow: the backlog, from the oldest event kept ("0" comes before every cursor).
        let since = options.value("since") ?? (follow ? nil : "0")
        let path = socketPath(options)

        StopSignal.install()
        var (client, cursor) = try subscribe(path, params, since: since)
        var lastEventAt = monotonicMilliseconds()
        while !StopSignal.requested {
            let incoming: RPCClient.Incoming?
            do {
                incoming = try client.receive(timeoutMs: sliceMs)
            } catch {
                if StopSignal.requested { break }
                throw CommandFailure(error.message + " (resume with --since \(cursor))", status: 1)
            }
            guard let incoming else {
                if !follow && monotonicMilliseconds() - lastEventAt >= quietMs { break }
                continue
            }
            guard case .notification("events", let batch) = incoming else { continue }
            lastEventAt = monotonicMilliseconds()
            var lines: [UInt8] = []
            var fellBehind = false
            for event in batch["events"]?.arrayValue ?? [] {
                if event["kind"]?.stringValue == "gap", event["reason"]?.stringValue == "slow" {
                    fellBehind = true
                    break
                }
                lines += event.serialized()
                lines.append(UInt8(ascii: "\n"))
                if let c = event["cursor"]?.stringValue { cursor = c }
            }
            if !lines.isEmpty { Terminal.writeOut(lines) }
            if fellBehind {
                // Everything before the gap was printed: a new subscription from the
                // last event printed (the gap's cursor) reads what was skipped, then
                // goes on live.
                Terminal.err("herald: events fell behind; reading them again from \(cursor)")
                (client, cursor) = try subscribe(path, params, since: cursor)
            }
        }
        return 0
    }

    /// A new connection subscribed from `since`; the cursor it starts from
    /// ("0" when the daemon has no event yet: every event comes after it).
    static func subscribe(
        _ path: String, _ params: JSONObject, since: String?
    ) throws(CommandFailure) -> (RPCClient, String) {
        var params = params
        if let since { params.append("since", .string(since)) }
        let client = try RPCClient(socketPath: path)
        switch try client.call("events.subscribe", params) {
        case .success(let result):
            return (client, result["cursor"]?.stringValue ?? since ?? "0")
        case .failure(let error):
            throw CommandFailure(ClientCommands.describe(error), status: 1)
        }
    }
}

/// SIGINT and SIGTERM end `herald events --follow` between two lines, not in one.
enum StopSignal {
    private static let received = Atomic<Bool>(false)

    static var requested: Bool { received.load(ordering: .relaxed) }

    static func install() {
        var action = sigaction()
        action.__sigaction_handler.sa_handler = { _ in StopSignal.received.store(true, ordering: .relaxed) }
        sigemptyset(&action.sa_mask)
        // No SA_RESTART: a blocked read returns at once.
        action.sa_flags = 0
        var unblock = sigset_t()
        sigemptyset(&unblock)
        for sig in [SIGINT, SIGTERM] {
            sigaction(sig, &action, nil)
            sigaddset(&unblock, sig)
        }
        // A parent may have left them blocked (a mask is inherited across exec).
        pthread_sigmask(SIG_UNBLOCK, &unblock, nil)
    }
}
