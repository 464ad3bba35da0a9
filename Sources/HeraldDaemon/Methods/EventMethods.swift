import HeraldJSON
import HeraldStore
import JSONRPC

extension HeraldService {
    // MARK: events.subscribe, events.unsubscribe

    /// Turns the connection into a stream of `events` notifications: every
    /// app the peer may use (or the one named), the kinds asked for (all
    /// by default), from `since` (a cursor an earlier notification carried)
    /// or from now.
    func subscribe(_ p: inout ParamReader, _ context: CallContext, _ reply: @escaping Reply) throws(RPCError) {
        // The app first, as every method checks it: a peer it does not admit hears only that.
        var apps: Set<String>?
        if let named = try p.string("app", maxBytes: 64) {
            apps = [try runtime(named: named, context).config.name]
        } else {
            apps = visibleApps(context)
            if apps?.isEmpty == true { throw RPCError(.forbidden(app: "default")) }
        }
        let kindNames = try p.stringArray(
            "kinds", minCount: 1, maxCount: EventKind.allCases.count, maxBytes: 32, content: .text)
        let sinceText = try p.string("since", maxBytes: 64, content: .text)
        try p.finish()
        var kinds: Set<String>?
        if let kindNames {
            for (i, name) in kindNames.enumerated() where EventKind(rawValue: name) == nil {
                throw .invalidParams(
                    field: "kinds[\(i)]",
                    reason: "must be one of " + EventKind.allCases.map(\.rawValue).joined(separator: ", "))
            }
            kinds = Set(kindNames)
        }
        var since: EventCursor?
        if let sinceText {
            guard let cursor = EventCursor(sinceText) else {
                throw .invalidParams(field: "since", reason: "must be a cursor from an events notification")
            }
            since = cursor
        }
        guard let events else { throw RPCError.internalError("events_unavailable") }
        let listed = JSON.array((apps ?? Set(self.apps.keys)).sorted().map { .string($0) })
        let kindList = JSON.array(
            (kinds.map { Array($0) } ?? EventKind.allCases.map(\.rawValue)).sorted().map {
                .string($0)
            })
        events.subscribe(connID: context.connectionID, apps: apps, kinds: kinds, since: since) { cursor in
            reply(
                .success([
                    "cursor": cursor.map { .string($0.description) } ?? .null, "apps": listed, "kinds": kindList,
                ]))
        }
    }

    func unsubscribe(_ p: inout ParamReader, _ context: CallContext, _ reply: @escaping Reply) throws(RPCError) {
        // `app`, as every method takes it: checked to exist and to admit the peer.
        _ = try app(&p, context)
        try p.finish()
        let ended = events?.remove(context.connectionID) ?? false
        reply(.success(["unsubscribed": .bool(ended)]))
    }
}
