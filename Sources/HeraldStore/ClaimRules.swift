import HeraldCore
import HeraldCrypto

/// What a claim runs besides reading the due rows, inside the caller's
/// transaction: one conformance per backend.
protocol ClaimStatements {
    /// The deliveries of each batch of these messages not yet final
    /// (queued, retrying or in flight), but for those held past `now` (a
    /// held delivery joins its batch when it is claimed).
    func batchSizes(_ messageIDs: [String], now: Int64) throws -> [BatchKey: Int]
    /// Ends a delivery that is not sent: `state` with `reason`.
    func mark(_ id: Int64, _ state: DeliveryState, reason: String, now: Int64) throws
    /// Fails a delivery whose device row does not open, and says so on the
    /// device (`device.list` shows `last_failure_reason`).
    func markUnreadable(_ id: Int64, now: Int64) throws
    /// Marks the jobs' deliveries in flight, one more attempt each, sent by
    /// this instance (and, where instances share the queue, leased to it).
    func take(_ ids: [Int64], now: Int64) throws
    /// When the next waiting delivery is due, if any waits.
    func nextDueAt() throws -> Int64?
}

/// A claim's rules, for every backend: which due rows become jobs and which
/// end unsent, and why. A backend reads its due rows (its statement text,
/// its locks) and gives each to ``sort(_:)``, then calls ``finish(counted:_:)``.
///
/// A due row has the columns, in this order: delivery id, message id, app,
/// device id, user, platform, attempts, `expires_at`, the message's payload,
/// then the device's (NULL when it is gone): environment, sealed token,
/// sealed keys, token hash, `registered_at`; then the message's
/// `created_at`, and the device's bundle id, VAPID key and enabled flag;
/// then the delivery's `timing` notes (a silent send among them); then the
/// message id of a newer delivery to the same device with the same collapse
/// key, waiting, in flight or delivered (NULL when none).
struct ClaimSorting {
    private let key: StoreKey
    private let now: Int64
    /// Lanes whose raw-token (not Web Push-form) registrations no instance
    /// can send: their deliveries end skipped.
    private let noSender: Set<QueueLane>

    private var jobs: [DeliveryJob] = []
    private var expired: [(Int64, BatchKey)] = []
    private var gone: [(Int64, BatchKey)] = []
    /// Deliveries a newer message with the same collapse key overtook while
    /// they waited for a retry: never sent again (the message id of the newer).
    private var overtaken: [(Int64, BatchKey, String)] = []
    private var disabled: [(Int64, BatchKey)] = []
    private var unsendable: [(Int64, BatchKey)] = []
    private var unreadable: [(Int64, BatchKey)] = []
    private var unreadableDevices: [(deliveryID: Int64, deviceID: String)] = []
    /// Deliveries of a message this version cannot read.
    private var unreadableMessages: [Int64] = []
    /// Each message read once per claim (nil: it does not decode).
    private var messages: [String: PushMessage?] = [:]

    init(key: StoreKey, now: Int64, noSender: Set<QueueLane> = []) {
        self.key = key
        self.now = now
        self.noSender = noSender
    }

    /// The verdict on one due row.
    mutating func sort(_ r: some StoreRow) throws {
        let id = try r.int64(0)
        let messageID = try r.text(1)
        let platform = Platform(rawValue: try r.text(5)) ?? .apns
        let batch = BatchKey(messageID: messageID, platform: platform)
        let expiresAt = try r.int64(7)
        // Never sent past `accepted_at + ttl + 2 s`, attempted before or
        // not (a backlog, a restart after downtime).
        if now > DeliveryJob.sendDeadline(expiresAt: expiresAt) {
            expired.append((id, batch))
            return
        }
        guard let tokenSealed = try r.optionalBytes(10) else {
            gone.append((id, batch))
            return
        }
        if let newer = try r.optionalText(19) {
            // In flight when the newer message came (so not superseded
            // then), and to be retried: the newer one stands for it.
            overtaken.append((id, batch, newer))
            return
        }
        if try r.optionalFlag(17) == false {
            // Turned off by device.update since the message was accepted.
            disabled.append((id, batch))
            return
        }
        let keysSealed = try r.optionalBytes(11)
        if keysSealed == nil, !noSender.isEmpty, noSender.contains(QueueLane(app: try r.text(2), platform: platform)) {
            unsendable.append((id, batch))
            return
        }
        if messages[messageID] == nil {
            var decoded = MessageCodec.decode(try r.text(8), messageID: messageID, key: key)
            if var m = decoded, m.collapseKey?.isEmpty ?? true, m.collapseID == nil {
                // Stored before messages carried their own collapse id.
                m.collapseID = MessageRules.collapseID(app: try r.text(2), idempotencyKey: nil, messageID: messageID)
                decoded = m
            }
            messages[messageID] = decoded
        }
        guard let message = messages[messageID] ?? nil else {
            // A payload this version cannot read: fail it rather than retry forever.
            unreadableMessages.append(id)
            return
        }
        let deviceID = try r.text(3)
        guard let secrets = DeviceSecrets.open(token: tokenSealed, keys: keysSealed, deviceID: deviceID, key: key)
        else {
            // A row that does not open (damaged, or sealed under another
            // key) fails this delivery alone.
            unreadable.append((id, batch))
            unreadableDevices.append((id, deviceID))
            return
        }
        var job = DeliveryJob(
            deliveryID: id, messageID: messageID, app: try r.text(2), deviceID: deviceID,
            user: try r.clientText(4), platform: platform,
            environment: try r.optionalText(9).flatMap(APNsEnvironment.init(rawValue:)),
            token: secrets.token, keys: secrets.keys, tokenHash: try r.text(12), registeredAt: try r.int64(13),
            message: message, acceptedAt: try r.int64(14), expiresAt: expiresAt,
            previousAttempts: Int(try r.int64(6)), bundleID: try r.optionalText(15),
            serverKey: try r.optionalText(16))
        job.silent = TimingRules.isSilent(try r.optionalText(18))
        jobs.append(job)
    }

    /// Writes the verdicts and answers the claim. The batch sizes are read
    /// before anything changes state, so that every delivery counted there
    /// is later reported once; batches in `counted` were counted before.
    func finish(counted: Set<BatchKey>, _ s: some ClaimStatements) throws -> Claim {
        let finished = (expired + gone + disabled + unsendable + unreadable).map(\.1) + overtaken.map(\.1)
        let touched = Queue.uncounted(jobs.map(\.batch) + finished, counted)
        let sizes = touched.isEmpty ? [:] : try s.batchSizes(touched, now: now)
        for id in unreadableMessages { try s.mark(id, .failed, reason: "unreadable stored message", now: now) }
        for (id, _) in expired { try s.mark(id, .expired, reason: "ttl elapsed", now: now) }
        for (id, _) in gone { try s.mark(id, .skipped, reason: "device removed", now: now) }
        for (id, _, newer) in overtaken { try s.mark(id, .superseded, reason: "superseded by \(newer)", now: now) }
        for (id, _) in disabled { try s.mark(id, .skipped, reason: DeliveryReason.deviceDisabled, now: now) }
        for (id, _) in unsendable {
            try s.mark(id, .skipped, reason: "transport_disabled: no live instance can send it", now: now)
        }
        for (id, _) in unreadable { try s.markUnreadable(id, now: now) }
        if !jobs.isEmpty { try s.take(jobs.map(\.deliveryID), now: now) }
        return Claim(
            jobs: jobs, finished: finished, batchSizes: sizes, nextDueAt: try s.nextDueAt(),
            unreadable: unreadableDevices)
    }
}
