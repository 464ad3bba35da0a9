import APNs
import FCM
import HeraldCore
import HeraldIO
import HeraldScheduler
import HeraldStore
import HeraldJSON
import JSONRPC
import WebPush
import HeraldConfiguration

/// Limits of `push.send` params.
enum PushLimits {
    static let maxRecipients = 10_000
    static let maxDataMembers = 64
    static let maxKeyBytes = 64
    static let maxValueBytes = 1024
    static let maxLocArgs = 16
    static let maxLocBytes = 256
    static let maxCollapseKeyBytes = 256
    static let maxIdempotencyKeyBytes = 256
    static let maxBadge = 999_999
    static let defaultWaitMs = 30_000
    static let maxWaitMs = 300_000
    /// `thread_id`: APNs sets no limit of its own; 128 bytes group any
    /// conversation or mailbox id and keep the 4 KB payload for the rest.
    static let maxThreadIDBytes = 128
    /// `category`: an identifier the app registered (`UNNotificationCategory`).
    static let maxCategoryBytes = 64
    /// `android_channel_id`: as the app section's `android_channel_id`.
    static let maxChannelIDBytes = 128
    /// `web_payload`: at most 16 KiB of compact JSON (six records' worth, for
    /// the shrink steps to cut down), nested at most 32 deep.
    static let maxWebPayloadBytes = 16_384
    static let maxWebPayloadDepth = 32
    /// `shrink`: at most 16 steps of at most 64 pointers of at most 256 bytes.
    static let maxShrinkSteps = 16
    static let maxShrinkPointers = 64
    static let maxPointerBytes = 256
}

extension HeraldService {
    // MARK: push.send

    func pushSend(_ p: inout ParamReader, _ context: CallContext, _ reply: @escaping Reply) throws(RPCError) {
        let runtime = try app(&p, context)
        let recipients: Recipients = try p.object("to", required: true) { (to: inout ParamReader) throws(RPCError) in
            let users = try to.stringArray(
                "users", minCount: 1, maxCount: PushLimits.maxRecipients, maxBytes: 256)
            let devices = try to.stringArray(
                "devices", minCount: 1, maxCount: PushLimits.maxRecipients, maxBytes: 32, content: .text)
            switch (users, devices) {
            case (let users?, nil): return .users(users)
            case (nil, let devices?):
                for (i, id) in devices.enumerated() where !Self.isDeviceID(id) {
                    throw .invalidParams(field: "to.devices[\(i)]", reason: "must be 32 lowercase hex characters")
                }
                return .devices(devices)
            default:
                throw to.invalid("users", "give exactly one of users or devices")
            }
        }!
        let kind = PushKind(
            rawValue: try p.enumeration("kind", allowed: PushKind.allCases.map(\.rawValue)) ?? "notification")!
        let data =
            try p.stringMap(
                "data", maxCount: PushLimits.maxDataMembers, maxKeyBytes: PushLimits.maxKeyBytes,
                maxValueBytes: PushLimits.maxValueBytes) ?? []
        let alert = try Self.alert(&p)
        let (badge, badges) = try Self.badge(&p)
        let collapseKey = try p.string("collapse_key", maxBytes: PushLimits.maxCollapseKeyBytes)
        let priority = try p.enumeration("priority", allowed: PushPriority.allCases.map(\.rawValue))
            .flatMap(PushPriority.init(rawValue:))
        let ttl = try p.int("ttl", range: 0...APNsRequest.maximumTTLSeconds)
        let idempotencyKey = try p.string("idempotency_key", maxBytes: PushLimits.maxIdempotencyKeyBytes)
        let wait = try p.bool("wait") ?? false
        let timeout = try p.int("timeout_ms", range: 0...PushLimits.maxWaitMs)
        if timeout != nil && !wait { throw p.invalid("timeout_ms", "requires wait: true") }
        let presentation = try Self.presentation(&p, kind: kind)
        let webContent = try Self.webContent(&p, data: data)
        // A message about no topic at all says so by leaving `topics` out.
        let topics = try Self.topics(&p, "topics", minCount: 1, maxCount: PreferenceLimits.maxMessageTopics)
        let now = SystemClock().nowMilliseconds()
        let sendTime = try Self.sendTime(&p, kind: kind, now: now)
        var liveActivity = try Self.liveActivity(&p, kind: kind, alert: alert, nowSeconds: now / 1000)
        try p.finish()
        if kind == .liveActivity {
            if case .devices = recipients {
                throw .invalidParams(field: "to.devices", reason: "a Live Activity is addressed by to.users")
            }
            if !data.isEmpty { throw p.invalid("data", "is not for kind live_activity: put it in content_state") }
            if collapseKey != nil {
                throw p.invalid(
                    "collapse_key", "is not for kind live_activity: a newer update to the activity supersedes an older")
            }
            if badge != nil || !badges.isEmpty {
                throw p.invalid("badge", "is not for kind live_activity: the activity shows its content_state")
            }
            if webContent != nil {
                let field = p.params["web_payload"] != nil ? "web_payload" : "notification"
                throw p.invalid(
                    field, "kind live_activity goes to apns_liveactivity tokens only, never to a Web Push record")
            }
            liveActivity?.relevanceScore = presentation.relevanceScore
        }
        if let platform = kind.ownPlatform, kind != .liveActivity {
            try Self.checkOwnKind(
                kind, platform: platform, data: data, alert: alert, badged: badge != nil || !badges.isEmpty,
                priority: priority, ttl: ttl,
                webField: webContent == nil ? nil : p.params["web_payload"] != nil ? "web_payload" : "notification")
        }

        var message = PushMessage(
            kind: kind, data: data, alert: alert, badge: badge, badgePerUser: badges, collapseKey: collapseKey,
            priority: priority, ttlSeconds: ttl)
        presentation.apply(to: &message)
        if let liveActivity {
            message.relevanceScore = nil
            message.liveActivity = liveActivity
            message.collapseKey = liveActivity.supersedeKey
        }
        message.webContent = webContent
        message.topics = topics
        message.sendTime = sendTime
        message.quietBypass = PushMessage.quietBypass(
            kind: kind, interruptionLevel: message.interruptionLevel, topics: topics,
            bypassTopics: runtime.config.quietHoursBypassTopics)
        try checkPayloads(message, runtime)
        guard let scheduler = delivery?.scheduler else {
            throw RPCError(.overloaded("delivery is not running", retryAfterMs: 1000))
        }
        var enqueue = Enqueue(
            app: runtime.config.name, message: message, recipients: recipients, idempotencyKey: idempotencyKey,
            disabled: runtime.disabled, pendingLimit: delivery?.maxQueued ?? .max)
        enqueue.awaitsResults = wait
        enqueue.activityHighPerHour = runtime.config.liveActivityHighPerHour
        enqueue.pendingApps = apps.count
        accept(enqueue, runtime, scheduler: scheduler, wait: wait, timeoutMs: timeout, reply)
    }

    /// Queues a message (push.send, push.broadcast) and answers: at once,
    /// or with `wait` when every delivery is final or the timeout passes.
    func accept(
        _ enqueue: Enqueue, _ runtime: AppRuntime, scheduler: Scheduler, wait: Bool, timeoutMs timeout: Int?,
        _ reply: @escaping Reply
    ) {
        let waitMs = Int64(timeout ?? PushLimits.defaultWaitMs)
        let log = self.log
        scheduler.enqueue(enqueue) { [self] result in
            switch result {
            case .success(let e):
                log.info(
                    "push_accepted",
                    [
                        "app": runtime.config.name, "message": e.messageID, "devices": String(e.devices),
                        "skipped": String(e.skipped), "duplicate": String(e.duplicate),
                    ])
                if wait {
                    waitForMessage(app: runtime.config.name, accepted: e, timeoutMs: waitMs, reply: reply)
                } else {
                    reply(.success(Self.acceptedJSON(e)))
                }
            case .failure(EnqueueError.queueFull(let pending, let limit)):
                log.warning(
                    "push_refused", ["app": runtime.config.name, "pending": String(pending), "limit": String(limit)])
                reply(
                    .failure(
                        RPCError(.overloaded("the delivery queue is full (\(pending) of \(limit))", retryAfterMs: 1000))
                    ))
            case .failure(EnqueueError.keyWaitersFull(let limit)):
                log.warning("push_refused", ["app": runtime.config.name, "key_waiters": String(limit)])
                reply(
                    .failure(
                        RPCError(
                            .overloaded(
                                "\(limit) sends already wait for a message with their idempotency key being written",
                                retryAfterMs: 250))
                    ))
            case .failure(EnqueueError.tooManyDevices(let count, let limit)):
                reply(.failure(.invalidParams(field: "to", reason: "addresses \(count) devices, more than \(limit)")))
            case .failure(let error):
                log.error("store_failed", ["error": String(describing: error)])
                reply(.failure(.storeUnavailable))
            }
        }
    }

    /// `alert`: localisation keys only (`push.send`, `push.broadcast`).
    static func alert(_ p: inout ParamReader) throws(RPCError) -> PushAlert? {
        try p.object("alert") { (a: inout ParamReader) throws(RPCError) in
            PushAlert(
                locKey: try a.string("loc_key", maxBytes: PushLimits.maxLocBytes),
                locArgs: try a.stringArray(
                    "loc_args", maxCount: PushLimits.maxLocArgs, maxBytes: PushLimits.maxLocBytes, allowEmpty: true),
                titleLocKey: try a.string("title_loc_key", maxBytes: PushLimits.maxLocBytes),
                bodyLocKey: try a.string("body_loc_key", maxBytes: PushLimits.maxLocBytes))
        }
    }

    /// A kind with a platform of its own (widgets, location, pushtotalk)
    /// goes as Apple wants it or not at all: what APNs would refuse or the
    /// device could not show is refused here, at the param.
    static func checkOwnKind(
        _ kind: PushKind, platform: Platform, data: [(key: String, value: String)], alert: PushAlert?,
        badged: Bool, priority: PushPriority?, ttl: Int?, webField: String?
    ) throws(RPCError) {
        let only = "goes to \(platform.rawValue) tokens only, which show nothing of it"
        if alert != nil { throw .invalidParams(field: "alert", reason: "kind \(kind.rawValue) \(only)") }
        if badged { throw .invalidParams(field: "badge", reason: "kind \(kind.rawValue) \(only)") }
        if let webField {
            throw .invalidParams(
                field: webField,
                reason: "kind \(kind.rawValue) goes to \(platform.rawValue) tokens only, never to a Web Push record")
        }
        switch kind {
        case .widgets:
            if !data.isEmpty {
                throw .invalidParams(
                    field: "data",
                    reason: "kind widgets carries no data: WidgetKit takes exactly {\"aps\":{\"content-changed\":true}}"
                )
            }
        case .pushToTalk:
            if let priority, priority != .high {
                throw .invalidParams(field: "priority", reason: "kind pushtotalk is always sent at once (priority 10)")
            }
            if let ttl, ttl != 0 {
                throw .invalidParams(
                    field: "ttl", reason: "kind pushtotalk is sent once, never stored (apns-expiration 0): must be 0")
            }
        default: break
        }
    }

    /// The graded-intrusiveness params of `push.send`, checked.
    struct Presentation {
        var interruptionLevel: InterruptionLevel?
        var relevanceScore: Double?
        var threadID: String?
        var category: String?
        var androidChannelID: String?

        func apply(to m: inout PushMessage) {
            m.interruptionLevel = interruptionLevel
            m.relevanceScore = relevanceScore
            m.threadID = threadID
            m.category = category
            m.androidChannelID = androidChannelID
        }
    }

    /// `interruption_level`, `relevance_score`, `thread_id`, `category` and
    /// `android_channel_id`: for `kind: notification` only (a background push,
    /// a call ring and a data-only FCM message show nothing they could shape).
    static func presentation(_ p: inout ParamReader, kind: PushKind) throws(RPCError) -> Presentation {
        var out = Presentation()
        out.interruptionLevel = try p.enumeration(
            "interruption_level", allowed: InterruptionLevel.allCases.map(\.rawValue)
        ).flatMap(InterruptionLevel.init(rawValue:))
        // Written without an exponent: a score is a plain decimal, and
        // 4.9e-324 or 1e-400 are more likely a bug than a score.
        switch p.value("relevance_score") {
        case nil, .null?: break
        case .number(let n)?
        where !n.text.utf8.contains(where: { $0 == UInt8(ascii: "e") || $0 == UInt8(ascii: "E") })
            && (kind == .liveActivity ? (0...1_000_000).contains(n.double) : (0...1).contains(n.double)):
            out.relevanceScore = n.double
        default:
            throw p.invalid(
                "relevance_score",
                kind == .liveActivity
                    ? "must be a number from 0 to 1000000 (which activity the Dynamic Island shows first)"
                    : "must be a number from 0 to 1, written without an exponent")
        }
        func label(_ name: String, maxBytes: Int) throws(RPCError) -> String? {
            guard let text = try p.string(name, maxBytes: maxBytes, content: .text) else { return nil }
            if text.unicodeScalars.contains(where: { $0.value < 0x20 || (0x7F...0x9F).contains($0.value) }) {
                throw p.invalid(name, "must not contain control characters")
            }
            return text
        }
        out.threadID = try label("thread_id", maxBytes: PushLimits.maxThreadIDBytes)
        out.category = try label("category", maxBytes: PushLimits.maxCategoryBytes)
        out.androidChannelID = try label("android_channel_id", maxBytes: PushLimits.maxChannelIDBytes)
        if kind != .notification {
            let given: [(String, Bool)] = [
                ("interruption_level", out.interruptionLevel != nil),
                ("relevance_score", out.relevanceScore != nil && kind != .liveActivity),
                ("thread_id", out.threadID != nil), ("category", out.category != nil),
                ("android_channel_id", out.androidChannelID != nil),
            ]
            if let first = given.first(where: { $0.1 }) {
                throw p.invalid(first.0, "is only for kind notification")
            }
        }
        return out
    }

    /// `web_payload` (a JSON object, checked against the declarative form
    /// when it names `web_push`) or the `notification` shorthand that builds
    /// one, and `shrink` (its steps), checked.
    static func webContent(
        _ p: inout ParamReader, data: [(key: String, value: String)]
    ) throws(RPCError) -> WebContent? {
        var payload: JSON?
        var declarative = false
        switch p.value("web_payload") {
        case nil, .null?: break
        case .object(let o)?:
            if let problem = Self.webPayloadProblem(.object(o), depth: 1) {
                throw p.invalid("web_payload", problem)
            }
            if DeclarativeWebPush.isDeclarative(o) {
                try DeclarativeWebPush.check(o, field: p.path("web_payload"))
                declarative = true
            }
            payload = .object(o)
        default: throw p.invalid("web_payload", "must be an object")
        }
        if let built = try DeclarativeWebPush.shorthand(&p, data: data) {
            if payload != nil { throw p.invalid("notification", "give web_payload or notification, not both") }
            payload = built
            declarative = true
        }
        var steps: [ShrinkStep]?
        switch p.value("shrink") {
        case nil, .null?: break
        case .array(let items)?:
            if items.count > PushLimits.maxShrinkSteps {
                throw p.invalid("shrink", "must have at most \(PushLimits.maxShrinkSteps) items")
            }
            var out: [ShrinkStep] = []
            for (i, item) in items.enumerated() {
                out.append(try Self.shrinkStep(item, field: p.path("shrink") + "[\(i)]"))
            }
            steps = out
        default: throw p.invalid("shrink", "must be an array")
        }
        guard let payload else {
            if steps != nil { throw p.invalid("shrink", "requires web_payload or notification") }
            return nil
        }
        if declarative, let steps { try DeclarativeWebPush.checkShrink(steps, field: p.path("shrink")) }
        let text = String(decoding: payload.serialized(), as: UTF8.self)
        if text.utf8.count > PushLimits.maxWebPayloadBytes {
            throw p.invalid(
                "web_payload",
                "must be at most \(PushLimits.maxWebPayloadBytes) bytes as compact JSON (is \(text.utf8.count))")
        }
        return WebContent(payload: text, shrink: steps ?? [])
    }

    /// Why a `web_payload` value is refused: too deep, or an object with a
    /// name twice (a pointer could not say which one it means).
    private static func webPayloadProblem(_ value: JSON, depth: Int) -> String? {
        switch value {
        case .object(let o):
            if depth > PushLimits.maxWebPayloadDepth {
                return "must be nested at most \(PushLimits.maxWebPayloadDepth) deep"
            }
            if o.firstDuplicateKey != nil { return "must not have a duplicate key in any object" }
            for member in o.members {
                if let problem = webPayloadProblem(member.value, depth: depth + 1) { return problem }
            }
        case .array(let a):
            if depth > PushLimits.maxWebPayloadDepth {
                return "must be nested at most \(PushLimits.maxWebPayloadDepth) deep"
            }
            for element in a {
                if let problem = webPayloadProblem(element, depth: depth + 1) { return problem }
            }
        default: break
        }
        return nil
    }

    /// One `shrink` step: `{"drop": [pointers]}`, `{"shorten": pointer}` or
    /// `{"keep": [pointers]}`.
    private static func shrinkStep(_ item: JSON, field: String) throws(RPCError) -> ShrinkStep {
        let shape = "must be an object with exactly one of drop, shorten, keep"
        if case .object(let o) = item, let duplicate = o.firstDuplicateKey {
            throw .invalidParams(field: field + "." + duplicate, reason: "duplicate key")
        }
        guard case .object(let o) = item, o.count == 1, let member = o.first else {
            throw .invalidParams(field: field, reason: shape)
        }
        let name = field + "." + member.key
        func pointer(_ value: JSON, _ at: String) throws(RPCError) -> String {
            guard case .string(let text) = value else { throw .invalidParams(field: at, reason: "must be a string") }
            if text.utf8.count > PushLimits.maxPointerBytes {
                throw .invalidParams(field: at, reason: "must be at most \(PushLimits.maxPointerBytes) bytes")
            }
            guard !text.isEmpty, JSONPointer(text) != nil else {
                throw .invalidParams(
                    field: at,
                    reason: "must be a JSON pointer (RFC 6901) below the root: /name/…, with ~0 for ~ and ~1 for /")
            }
            return text
        }
        func pointers(_ value: JSON) throws(RPCError) -> [String] {
            guard case .array(let list) = value else { throw .invalidParams(field: name, reason: "must be an array") }
            if list.isEmpty { throw .invalidParams(field: name, reason: "must not be empty") }
            if list.count > PushLimits.maxShrinkPointers {
                throw .invalidParams(field: name, reason: "must have at most \(PushLimits.maxShrinkPointers) items")
            }
            var out: [String] = []
            for (i, v) in list.enumerated() { out.append(try pointer(v, name + "[\(i)]")) }
            return out
        }
        switch member.key {
        case "drop": return .drop(try pointers(member.value))
        case "keep": return .keep(try pointers(member.value))
        case "shorten": return .shorten(try pointer(member.value, name))
        default: throw .invalidParams(field: field, reason: shape)
        }
    }

    static func isDeviceID(_ id: String) -> Bool {
        id.utf8.count == 32 && id.utf8.allSatisfy { ($0 >= 48 && $0 <= 57) || ($0 >= 97 && $0 <= 102) }
    }

    /// `badge`: an integer for everyone, or `{user: integer}`.
    private static func badge(_ p: inout ParamReader) throws(RPCError) -> (Int?, [String: Int]) {
        switch p.value("badge") {
        case nil, .null?:
            return (nil, [:])
        case .number(let n)?:
            guard n.isIntegerLiteral, let v = n.int64, (0...Int64(PushLimits.maxBadge)).contains(v) else {
                throw p.invalid(
                    "badge", "must be an integer between 0 and \(PushLimits.maxBadge), or an object of them")
            }
            return (Int(v), [:])
        case .object(let object)?:
            if object.count > PushLimits.maxRecipients {
                throw p.invalid("badge", "must have at most \(PushLimits.maxRecipients) members")
            }
            if let key = object.firstDuplicateKey { throw p.invalid("badge.\(key)", "duplicate key") }
            var out: [String: Int] = [:]
            for (user, value) in object.members {
                guard !user.isEmpty, user.utf8.count <= 256 else {
                    throw p.invalid("badge.\(user)", "key must be a user (1 to 256 bytes)")
                }
                guard case .number(let n) = value, n.isIntegerLiteral, let v = n.int64,
                    (0...Int64(PushLimits.maxBadge)).contains(v)
                else { throw p.invalid("badge.\(user)", "must be an integer between 0 and \(PushLimits.maxBadge)") }
                out[user] = Int(v)
            }
            return (nil, out)
        default:
            throw p.invalid("badge", "must be an integer between 0 and \(PushLimits.maxBadge), or an object of them")
        }
    }

    /// Builds the payload of every enabled platform the kind reaches, with the
    /// widest badge any recipient gets, and refuses what a transport would.
    private func checkPayloads(_ message: PushMessage, _ runtime: AppRuntime) throws(RPCError) {
        // A device's quiet hours may send it silently: that form (APNs
        // `interruption-level` for `sound`, the record's `silent` member) must
        // fit as well.
        if !message.silent && message.kind == .notification {
            var silent = message
            silent.silent = true
            try checkPayloads(silent, runtime)
        }
        // web_payload goes to every Web Push-form record, whatever its
        // platform: refused up front when not even the last shrink step
        // brings it under the record.
        if let web = message.webContent {
            let capacity = WebPushPayload.plaintextCapacity(bodySize: WebPushPayload.defaultBodySize)
            if case .failure(let e) = WebContentFit.fit(web, capacity: capacity) {
                throw RPCError(.payloadTooLarge(PayloadTooLarge(platform: .web, limit: e.capacity, size: e.size)))
            }
        }
        // The user whose badge has the most digits stands for every recipient.
        let widest = message.badgePerUser.max { String($0.value).count < String($1.value).count }
        let users = [""] + (widest.map { [$0.key] } ?? [])
        // Every kind reaches some Web Push-form registration (a ring: Web Push
        // fcm ones), so the Web Push record is built whenever VAPID is on.
        let sent = Platform.allCases.filter {
            $0 != .unifiedPush
                && (($0 == .web && message.kind.ownPlatform == nil) || message.kind.reaches($0, webPushForm: false))
        }
        for platform in sent where runtime.disabled[platform] == nil {
            for user in users {
                switch platform {
                case .apns, .apnsVoIP, .apnsWidgets, .apnsLocation, .apnsPushToTalk, .apnsLiveActivity, .apnsChannel:
                    guard let apns = runtime.credentials.apns.value else { continue }
                    do {
                        _ = try APNsRequest(
                            message: message, platform: platform, user: user,
                            settings: APNsAppSettings(
                                topic: apns.topic, defaultAlertLocKey: runtime.config.alertLocKey),
                            now: 0)
                    } catch {
                        switch error {
                        case .payloadTooLarge(let e): throw RPCError(.payloadTooLarge(e))
                        case .reservedDataKey(let key):
                            throw .invalidParams(field: "data.\(key)", reason: "is reserved by APNs")
                        case .duplicateDataKey(let key):
                            throw .invalidParams(field: "data.\(key)", reason: "duplicate key")
                        case .notAPNs, .kindNotRouted: continue
                        }
                    }
                case .fcm:
                    do {
                        _ = try FCMMessage(
                            message: message, token: "", user: user,
                            settings: FCMAppSettings(
                                channelID: runtime.config.androidChannelID,
                                defaultAlertLocKey: runtime.config.alertLocKey))
                    } catch {
                        switch error {
                        case .payloadTooLarge(let e): throw RPCError(.payloadTooLarge(e))
                        case .reservedDataKey(let key):
                            throw .invalidParams(field: "data.\(key)", reason: "is reserved by FCM")
                        case .duplicateDataKey(let key):
                            throw .invalidParams(field: "data.\(key)", reason: "duplicate key")
                        }
                    }
                case .web, .unifiedPush:
                    do {
                        _ = try WebPushPayload(message: message, user: user)
                    } catch {
                        switch error {
                        case .payloadTooLarge(let e): throw RPCError(.payloadTooLarge(e))
                        case .duplicateDataKey(let key):
                            throw .invalidParams(field: "data.\(key)", reason: "duplicate key")
                        case .invalidBodySize: throw .internalError("web push record size")
                        }
                    }
                }
            }
        }
    }

    static func acceptedJSON(_ e: Enqueued) -> JSON {
        ["message_id": .string(e.messageID), "devices": .int(e.devices), "skipped": .int(e.skipped)]
    }

    static func countsJSON(_ counts: [DeliveryState: Int]) -> JSON {
        var o = JSONObject()
        for state in DeliveryState.allCases { o.append(state.rawValue, .int(counts[state] ?? 0)) }
        return .object(o)
    }

    // MARK: push.status, push.cancel

    private func messageID(_ p: inout ParamReader) throws(RPCError) -> String {
        let id = try p.string("message_id", required: true, maxBytes: 64, content: .text)!
        guard Self.isDeviceID(id) else { throw p.invalid("message_id", "must be 32 lowercase hex characters") }
        return id
    }

    func pushStatus(_ p: inout ParamReader, _ context: CallContext, _ reply: @escaping Reply) throws(RPCError) {
        let runtime = try app(&p, context)
        let id = try messageID(&p)
        let detail = try p.bool("detail") ?? false
        try p.finish()
        store.status(app: runtime.config.name, messageID: id, detail: detail) { [log] result in
            switch result {
            case .success(let status?): reply(.success(Self.statusJSON(status)))
            case .success(nil): reply(.failure(RPCError(.notFound(messageID: id))))
            case .failure(let error):
                log.error("store_failed", ["error": String(describing: error)])
                reply(.failure(.storeUnavailable))
            }
        }
    }

    static func statusJSON(_ s: MessageStatus) -> JSON {
        var o: JSONObject = [
            "message_id": .string(s.messageID), "created_at": .string(Timestamp.rfc3339(s.createdAt)),
            "state": .string(s.isComplete ? "complete" : "pending"), "counts": countsJSON(s.counts),
        ]
        if let devices = s.devices {
            o.append(
                "devices",
                .array(
                    devices.map { d in
                        [
                            "device_id": .string(d.deviceID), "platform": .string(d.platform.rawValue),
                            "state": .string(d.state.rawValue), "attempts": .int(d.attempts),
                            "http_status": d.httpStatus.map { .int($0) } ?? .null,
                            "reason": d.reason.map { .string($0) } ?? .null,
                            "updated_at": .string(Timestamp.rfc3339(d.updatedAt)),
                            "sent_by": d.sentBy.map { .string($0) } ?? .null,
                            "shrunk": d.shrunk.map { .int($0) } ?? .null,
                            "due_at": d.heldUntil.map { .string(Timestamp.rfc3339($0)) } ?? .null,
                            "timing": .array(
                                (d.timing?.split(separator: ",").map { .string(String($0)) }) ?? []),
                        ]
                    }))
        }
        if let a = s.liveActivity {
            o.append(
                "live_activity",
                [
                    "event": .string(a.event.rawValue), "activity_id": a.activityID.map(JSON.string) ?? .null,
                    "attributes_type": a.attributesType.map(JSON.string) ?? .null,
                    "timestamp": .int(a.timestamp), "priority_lowered": .bool(a.priorityLowered),
                ])
        }
        if let attempts = s.attempts {
            o.append(
                "attempts",
                .array(
                    attempts.map { a in
                        var entry: JSONObject = [
                            "device_id": .string(a.deviceID), "platform": .string(a.platform.rawValue),
                            "attempt": .int(a.number), "at": .string(Timestamp.rfc3339(a.at)),
                            "state": .string(a.state), "http_status": a.httpStatus.map { .int($0) } ?? .null,
                            "reason": a.reason.map { .string($0) } ?? .null,
                        ]
                        if let id = a.requestID { entry.append("apns_id", .string(id)) }
                        entry.append("provider_id", a.providerID.map { .string($0) } ?? .null)
                        entry.append("origin", a.origin.map { .string($0) } ?? .null)
                        entry.append("elapsed_ms", a.elapsedMs.map { .int(Int($0)) } ?? .null)
                        entry.append("sent_by", a.sentBy.map { .string($0) } ?? .null)
                        return .object(entry)
                    }))
        }
        return .object(o)
    }

    func pushCancel(_ p: inout ParamReader, _ context: CallContext, _ reply: @escaping Reply) throws(RPCError) {
        let runtime = try app(&p, context)
        let id = try messageID(&p)
        try p.finish()
        store.cancel(app: runtime.config.name, messageID: id) { [self] result in
            switch result {
            case .success(let n?):
                log.info("push_cancelled", ["message": id, "cancelled": String(n)])
                messagesProgressed([id])
                reply(.success(["cancelled": .int(n)]))
            case .success(nil): reply(.failure(RPCError(.notFound(messageID: id))))
            case .failure(let error):
                log.error("store_failed", ["error": String(describing: error)])
                reply(.failure(.storeUnavailable))
            }
        }
    }
}

extension HeraldService {
    /// Answers `reply` once the message is complete or `timeoutMs` passed.
    func waitForMessage(app: String, accepted: Enqueued, timeoutMs: Int64, reply: @escaping Reply) {
        guard let waiters = delivery?.waiters else {
            reply(.success(Self.acceptedJSON(accepted)))
            return
        }
        waiters.add(app: app, accepted: accepted, timeoutMs: timeoutMs, reply: reply)
    }

    /// Deliveries of these messages changed: waiters may be done.
    func messagesProgressed(_ ids: Set<String>) {
        delivery?.waiters.progressed(ids)
    }
}
