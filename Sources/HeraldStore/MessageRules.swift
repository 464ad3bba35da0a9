import HeraldCore
import HeraldCrypto

/// What both backends decide when a message comes, whichever writes it and
/// however (SQLite whole or in parts, PostgreSQL in one transaction that a
/// lost race runs again).
enum MessageRules {
    /// How long an idempotency key names its message: a send with the same
    /// key within it is answered with the first message, not queued again.
    static let idempotencyWindowMs: Int64 = 24 * 3600 * 1000
    /// The most devices one message may reach, skipped ones counted.
    static let maxDevicesPerMessage = 10_000

    /// What the store keeps of an idempotency key: its hash, never the key.
    static func idempotencyHash(_ key: String) -> [UInt8] {
        SHA256.hash(Array(("idem:" + key).utf8))
    }

    /// When a message accepted `now` stops being sent (its TTL).
    static func expiresAt(_ e: Enqueue, now: Int64) -> Int64 {
        now + Int64(e.message.ttlSeconds) * 1000
    }

    /// The message as stored: one without a collapse key gets its own
    /// collapse id (so that its retries and a resend with its idempotency
    /// key collapse with it at the provider).
    static func stored(_ e: Enqueue, messageID: String) -> PushMessage {
        var message = e.message
        if message.collapseKey?.isEmpty ?? true {
            message.collapseID = collapseID(app: e.app, idempotencyKey: e.idempotencyKey, messageID: messageID)
        }
        return message
    }

    /// A message's own collapse id (for one without a collapse key): 32
    /// base64url characters of SHA-256 over the app and its idempotency key,
    /// else its message id. The same key gives the same id, so a resend of
    /// the same notification (Herald's after an ambiguous failure, or the
    /// caller's with its idempotency key) replaces the first on the device.
    static func collapseID(app: String, idempotencyKey: String?, messageID: String) -> String {
        let source =
            if let k = idempotencyKey { "herald-collapse:idem:\(app.utf8.count):\(app):\(k)" } else {
                "herald-collapse:msg:\(messageID)"
            }
        return Base64URL.encode(SHA256.hash(Array(source.utf8)).prefix(24))
    }

    /// Which rows of `devices` a message goes to: ordinary devices (no
    /// activity role), or for a Live Activity the tokens of its activity:
    /// the push-to-start tokens of its type (start), the update tokens of
    /// its id (update, end). `role` nil: ordinary devices; `key` is the
    /// activity type or id.
    static func targetRows(_ m: PushMessage) -> (role: ActivityRole?, key: String) {
        guard m.kind == .liveActivity, let a = m.liveActivity else { return (nil, "") }
        if let channel = a.channelID { return (.channel, channel) }
        return a.event == .start ? (.start, a.attributesType ?? "") : (.update, a.activityID ?? "")
    }

    /// A Live Activity push asked at priority 10 goes at 10 while its
    /// activity has sent fewer than `e.activityHighPerHour` of them in the
    /// last hour (then this one is noted), else at 5, marked lowered. Apple
    /// budgets priority-10 Live Activity pushes per hour and throttles
    /// past it; 5 does not count.
    static func budgeted(
        _ m: PushMessage, _ e: Enqueue, now: Int64, _ s: some ActivityBudgetStatements
    ) throws -> PushMessage {
        guard var activity = m.liveActivity, m.priority == .high, let id = activity.activityID else { return m }
        let used = try s.highSends(app: e.app, activityID: id, since: now - 3_600_000)
        if used < e.activityHighPerHour {
            try s.noteHighSend(app: e.app, activityID: id, at: now)
            return m
        }
        var lowered = m
        lowered.priority = .normal
        activity.priorityLowered = true
        lowered.liveActivity = activity
        return lowered
    }

    /// What `push.status` shows of a Live Activity message: its event,
    /// activity and whether its priority was lowered, without its content.
    static func activityOutline(_ payload: String, messageID: String, key: StoreKey) -> LiveActivity? {
        guard payload.contains("\"activity\":"),
            let a = MessageCodec.decode(payload, messageID: messageID, key: key)?.liveActivity
        else { return nil }
        var outline = LiveActivity(
            event: a.event, activityID: a.activityID, attributesType: a.attributesType, timestamp: a.timestamp)
        outline.priorityLowered = a.priorityLowered
        return outline
    }

    /// Refuses a message to more devices than ``maxDevicesPerMessage``.
    static func checkSize(_ devices: Int) throws(EnqueueError) {
        guard devices <= maxDevicesPerMessage else {
            throw EnqueueError.tooManyDevices(count: devices, limit: maxDevicesPerMessage)
        }
    }

    /// Why a device is skipped by the message, or nil when it is sent to. A
    /// lane whose transport is disabled here is skipped only when
    /// `sentElsewhere` says no other live instance can send it (one SQLite
    /// instance: none can).
    static func skipReason(
        enabled: Bool, platform: Platform, webPushForm: Bool, _ e: Enqueue,
        sentElsewhere: (Platform) -> Bool = { _ in false }
    ) -> String? {
        if !enabled { return DeliveryReason.deviceDisabled }
        if !e.message.kind.reaches(platform, webPushForm: webPushForm) { return "kind_not_for_platform" }
        if let why = e.disabled[webPushForm ? .web : platform], !sentElsewhere(platform) {
            return "transport_disabled: \(why)"
        }
        return nil
    }
}

/// What the Live Activity budget reads and writes, inside the enqueue's
/// transaction (and, where instances share the store, under a lock on the
/// activity).
protocol ActivityBudgetStatements {
    /// Priority-10 pushes the app's activity sent since `since`.
    func highSends(app: String, activityID: String, since: Int64) throws -> Int
    /// Notes one sent at `at`, and lets go of the app's notes older than an hour.
    func noteHighSend(app: String, activityID: String, at: Int64) throws
}

/// What the idempotency rule reads and writes, inside the caller's
/// transaction (and, where instances share the store, under its lock on
/// the key): one conformance per backend.
protocol IdempotencyStatements {
    /// The app's message recorded with this key's hash, and when it was accepted.
    func message(app: String, idempotencyHash: [UInt8]) throws -> (id: String, acceptedAt: Int64)?
    /// Lets the message's key go: a later send with it is a new message.
    func clearIdempotencyKey(messageID: String) throws
    /// The message's deliveries by state.
    func stateCounts(_ messageID: String) throws -> [DeliveryState: Int]
}

extension IdempotencyStatements {
    /// The answer to a send whose key names a message accepted within the
    /// window: that message, its counts, `duplicate`. nil when the key names
    /// none (a key past the window is let go here).
    func duplicate(app: String, idempotencyHash hash: [UInt8], now: Int64) throws -> Enqueued? {
        guard let found = try message(app: app, idempotencyHash: hash) else { return nil }
        guard now - found.acceptedAt < MessageRules.idempotencyWindowMs else {
            try clearIdempotencyKey(messageID: found.id)
            return nil
        }
        let counts = try stateCounts(found.id)
        let skipped = counts[.skipped] ?? 0
        return Enqueued(
            messageID: found.id, devices: counts.values.reduce(0, +) - skipped, skipped: skipped, duplicate: true)
    }
}
