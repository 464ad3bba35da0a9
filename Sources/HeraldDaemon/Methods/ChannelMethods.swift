import APNs
import HeraldCore
import HeraldIO
import HeraldScheduler
import HeraldJSON
import HeraldStore
import JSONRPC

extension HeraldService {
    // MARK: channel.create, channel.list, channel.delete, push.broadcast

    /// `channel.create {bundle_id?, environment?, storage: none|latest}`:
    /// APNs creates the channel (its management host); Herald records it.
    func createChannel(_ p: inout ParamReader, _ context: CallContext, _ reply: @escaping Reply) throws(RPCError) {
        let runtime = try app(&p, context)
        let bundle = try p.string("bundle_id", maxBytes: 256, content: .text)
        let environment = APNsEnvironment(
            rawValue: try p.enumeration("environment", allowed: APNsEnvironment.allCases.map(\.rawValue))
                ?? "production")!
        let storage = ChannelStorage(
            rawValue: try p.enumeration("storage", required: true, allowed: ChannelStorage.allCases.map(\.rawValue))!)!
        try p.finish()
        guard let manager = delivery?.channelManager(runtime.config.name) else {
            throw .invalidParams(field: "app", reason: "has no APNs credentials: channels are APNs'")
        }
        let topics = runtime.config.apnsBundleIDs.isEmpty ? [manager.topic] : runtime.config.apnsBundleIDs
        let bundleID = bundle ?? topics[0]
        guard topics.contains(bundleID) else {
            throw p.invalid("bundle_id", "must be one of the app's apns_topics: " + topics.joined(separator: ", "))
        }
        let store = self.store
        let app = runtime.config.name
        let log = self.log
        manager.perform(.create(bundleID: bundleID, storage: storage), environment: environment) { result in
            switch result {
            case .success(.created(let id)):
                store.recordChannel(
                    app: app, channelID: id, environment: environment, bundleID: bundleID,
                    storesLatest: storage == .latest
                ) { recorded in
                    switch recorded {
                    case .success(let c): reply(.success(Self.channelJSON(c)))
                    case .failure(let error):
                        log.error("store_failed", ["error": String(describing: error)])
                        reply(.failure(.storeUnavailable))
                    }
                }
            case .success(let answer):
                reply(.failure(Self.channelRefusal(answer)))
            case .failure(let error):
                reply(
                    .failure(RPCError(.overloaded("APNs channel management unreachable: \(error)", retryAfterMs: 1000)))
                )
            }
        }
    }

    /// `channel.list`: the app's channels Herald created, newest first.
    func listChannels(_ p: inout ParamReader, _ context: CallContext, _ reply: @escaping Reply) throws(RPCError) {
        let runtime = try app(&p, context)
        try p.finish()
        store.channels(
            app: runtime.config.name, channelID: nil,
            completion: finish(reply) { ["channels": .array($0.map(Self.channelJSON))] })
    }

    /// `channel.delete {channel_id}`: APNs deletes it (one it no longer
    /// knows is gone already); Herald forgets it.
    func deleteChannel(_ p: inout ParamReader, _ context: CallContext, _ reply: @escaping Reply) throws(RPCError) {
        let runtime = try app(&p, context)
        let channelID = try Self.channelIDParam(&p)
        try p.finish()
        guard let manager = delivery?.channelManager(runtime.config.name) else {
            throw .invalidParams(field: "app", reason: "has no APNs credentials: channels are APNs'")
        }
        let store = self.store
        let app = runtime.config.name
        store.channels(app: app, channelID: channelID) { found in
            guard case .success(let list) = found else {
                reply(.failure(.storeUnavailable))
                return
            }
            guard let channel = list.first else {
                reply(
                    .failure(.invalidParams(field: "channel_id", reason: "names no channel of the app (channel.list)")))
                return
            }
            manager.perform(
                .delete(bundleID: channel.bundleID ?? manager.topic, channelID: channelID),
                environment: channel.environment ?? .production
            ) { result in
                switch result {
                case .success(let answer)
                where answer == .deleted || answer == .refused(status: 400, reason: "ChannelNotRegistered"):
                    // Gone at APNs (now, or before): Herald forgets it.
                    store.forgetChannel(app: app, channelID: channelID) { _ in reply(.success(["removed": 1])) }
                case .success(let answer): reply(.failure(Self.channelRefusal(answer)))
                case .failure(let error):
                    reply(
                        .failure(
                            RPCError(.overloaded("APNs channel management unreachable: \(error)", retryAfterMs: 1000))))
                }
            }
        }
    }

    static func channelIDParam(_ p: inout ParamReader) throws(RPCError) -> String {
        let id = try p.string("channel_id", required: true, maxBytes: 64, content: .text)!
        guard
            id.utf8.allSatisfy({
                ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x41 && $0 <= 0x5A) || ($0 >= 0x61 && $0 <= 0x7A) || $0 == 0x2B
                    || $0 == 0x2F || $0 == 0x3D
            })
        else { throw p.invalid("channel_id", "must be a channel id as APNs gave it (base64)") }
        return id
    }

    static func channelJSON(_ c: ChannelRecord) -> JSON {
        [
            "channel_id": .string(c.channelID), "bundle_id": c.bundleID.map(JSON.string) ?? .null,
            "environment": .string((c.environment ?? .production).rawValue),
            "storage": .string(c.storesLatest ? "latest" : "none"),
            "created_at": .string(Timestamp.rfc3339(c.createdAt)),
        ]
    }

    /// APNs refused a management request: its reason, as 1009 `provider_refused`? No: -32602 where the
    /// caller can fix it, else 1007 with APNs' status and reason.
    static func channelRefusal(_ answer: ChannelAnswer) -> RPCError {
        guard case .refused(let status, let reason) = answer else {
            return RPCError(.overloaded("APNs answered unexpectedly", retryAfterMs: 1000))
        }
        let why = reason ?? "status \(status)"
        if status == 400 || status == 403 {
            return .invalidParams(field: "channel_id", reason: "APNs refused it: \(why)")
        }
        return RPCError(.overloaded("APNs channel management answered \(status) \(why)", retryAfterMs: 1000))
    }
}

extension HeraldService {
    /// `push.broadcast {channel_id, event: update|end, content_state?, alert?,
    /// timestamp?, stale_date?, dismissal_date?, relevance_score?, priority?,
    /// ttl?, idempotency_key?, wait?, timeout_ms?}`: one request to APNs'
    /// broadcast endpoint reaches every Live Activity subscribed to the
    /// channel; durable like any message (a delivery to the channel's row).
    func pushBroadcast(_ p: inout ParamReader, _ context: CallContext, _ reply: @escaping Reply) throws(RPCError) {
        let runtime = try app(&p, context)
        let channelID = try Self.channelIDParam(&p)
        let event = ActivityEvent(
            rawValue: try p.enumeration("event", required: true, allowed: ["update", "end"])!)!
        let alert = try Self.alert(&p)
        let priority = try p.enumeration("priority", allowed: PushPriority.allCases.map(\.rawValue))
            .flatMap(PushPriority.init(rawValue:))
        let ttl = try p.int("ttl", range: 0...28_800)
        let idempotencyKey = try p.string("idempotency_key", maxBytes: PushLimits.maxIdempotencyKeyBytes)
        let wait = try p.bool("wait") ?? false
        let timeout = try p.int("timeout_ms", range: 0...PushLimits.maxWaitMs)
        if timeout != nil && !wait { throw p.invalid("timeout_ms", "requires wait: true") }
        let now = SystemClock().nowMilliseconds()
        // The Live Activity members, read as push.send reads them (activity_id is not one here).
        let read = try Self.broadcastActivity(&p, event: event, nowSeconds: now / 1000)
        try p.finish()
        guard let scheduler = delivery?.scheduler else {
            throw RPCError(.overloaded("delivery is not running", retryAfterMs: 1000))
        }
        let store = self.store
        let app = runtime.config.name
        store.channels(app: app, channelID: channelID) { [self] found in
            guard case .success(let list) = found else {
                reply(.failure(.storeUnavailable))
                return
            }
            guard let channel = list.first else {
                reply(
                    .failure(.invalidParams(field: "channel_id", reason: "names no channel of the app (channel.list)")))
                return
            }
            var activity = read
            activity.channelID = channelID
            activity.channelStoresLatest = channel.storesLatest
            var message = PushMessage(
                kind: .liveActivity, alert: alert, priority: priority,
                ttlSeconds: ttl ?? (channel.storesLatest ? 3600 : 0))
            message.liveActivity = activity
            message.collapseKey = activity.supersedeKey
            var enqueue = Enqueue(
                app: app, message: message, recipients: .devices([channel.rowID]), idempotencyKey: idempotencyKey,
                disabled: runtime.disabled, pendingLimit: delivery?.maxQueued ?? .max)
            enqueue.awaitsResults = wait
            enqueue.pendingApps = apps.count
            accept(enqueue, runtime, scheduler: scheduler, wait: wait, timeoutMs: timeout, reply)
        }
    }

    /// A broadcast's Live Activity content: content_state (required for an
    /// update), timestamp, stale_date, dismissal_date (end), relevance_score.
    static func broadcastActivity(
        _ p: inout ParamReader, event: ActivityEvent, nowSeconds: Int64
    ) throws(RPCError) -> LiveActivity {
        let contentState = try jsonObjectText(&p, "content_state")
        if event == .update && contentState == nil { throw p.invalid("content_state", "is required for event update") }
        let timestamp = try unixSeconds(&p, "timestamp")
        let staleDate = try unixSeconds(&p, "stale_date")
        let dismissalDate = try unixSeconds(&p, "dismissal_date")
        if dismissalDate != nil && event != .end { throw p.invalid("dismissal_date", "is only for event end") }
        var relevance: Double?
        switch p.value("relevance_score") {
        case nil, .null?: break
        case .number(let n)?
        where !n.text.utf8.contains(where: { $0 == UInt8(ascii: "e") || $0 == UInt8(ascii: "E") })
            && (0...1_000_000).contains(n.double):
            relevance = n.double
        default: throw p.invalid("relevance_score", "must be a number from 0 to 1000000, written without an exponent")
        }
        return LiveActivity(
            event: event, contentState: contentState, timestamp: timestamp ?? nowSeconds, staleDate: staleDate,
            dismissalDate: dismissalDate, relevanceScore: relevance)
    }
}
