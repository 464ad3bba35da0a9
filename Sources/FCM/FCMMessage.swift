public import HeraldCore
internal import HeraldJSON

/// What an app section says about FCM.
public struct FCMAppSettings: Sendable, Hashable {
    /// `android_channel_id`: the notification channel visible notifications
    /// post to. The app must have created it; without one Android 8+ falls back
    /// to a default-importance channel.
    public var channelID: String?
    /// `alert_loc_key`: the `body_loc_key` when the message names none.
    public var defaultAlertLocKey: String?

    public init(channelID: String? = nil, defaultAlertLocKey: String? = nil) {
        self.channelID = channelID
        self.defaultAlertLocKey = defaultAlertLocKey
    }
}

/// `android.priority` of an FCM v1 message.
public enum FCMAndroidPriority: String, Sendable, Hashable, CaseIterable {
    case high = "HIGH"
    case normal = "NORMAL"
}

/// The body of one FCM HTTP v1 `messages:send` request for one device.
///
/// Pure: the sender posts `body` to `/v1/projects/<project>/messages:send` with
/// `authorization: Bearer <access token>` and `content-type: application/json`.
///
/// ```
/// {"message":{"token":…,"data":{"kind":…,"badge":"n",…data},
///   "android":{"priority":"HIGH","ttl":"86400s","collapse_key":…,
///     "notification":{"channel_id":…,"title_loc_key":…,"body_loc_key":…,"body_loc_args":[…]}}}}
/// ```
///
/// - `data` always carries `kind`, then `badge` (a decimal string) when the
///   user has one, then the caller's data in order. FCM data values are strings.
/// - `android.notification` only for `kind: notification`, with the members that
///   have a value: `channel_id` is the message's `android_channel_id`, else the
///   app's; `body_loc_key` is the alert's `body_loc_key`, else its
///   `loc_key`, else the app's `alert_loc_key`; `body_loc_args` are the alert's
///   `loc_args`. A `clear` and a `call_ring` are data-only messages, handled by
///   the app's own code.
/// - `android.priority`: `HIGH` for `high`, `NORMAL` for `normal` and `low`, and
///   `NORMAL` for every `clear` whatever it asked: a high-priority message that
///   shows nothing counts against the app, and Android lowers the priority of
///   apps that do that (the APNs twin is the forced priority 5 of a background
///   push). A `call_ring` keeps its priority (`high` by default).
/// - `android.ttl`: the TTL in seconds as `"<n>s"`, clamped to 0…2419200 (the
///   four weeks FCM allows). A `call_ring` goes with `"0s"`: now or never.
/// - `android.collapse_key`: the message's collapse key as it is (FCM keeps at
///   most four distinct keys per device).
public struct FCMMessage: Sendable, Hashable {
    /// FCM's limit on a message's payload, in bytes.
    public static let payloadLimit = 4096
    /// The longest TTL FCM accepts (four weeks).
    public static let maximumTTLSeconds = 2_419_200

    /// Whether `key` may not appear in the caller's `data`: FCM's reserved words
    /// (`from`, `message_type`, `collapse_key`, and any key starting with
    /// `google` or `gcm`) and the two keys Herald adds (`kind`, `badge`).
    public static func isReservedDataKey(_ key: String) -> Bool {
        switch key {
        case "kind", "badge", "from", "message_type", "collapse_key": true
        default: key.hasPrefix("google") || key.hasPrefix("gcm")
        }
    }

    /// The JSON body, compact, U+2028/U+2029 escaped.
    public let body: [UInt8]
    public let priority: FCMAndroidPriority
    /// The TTL sent, after clamping.
    public let ttlSeconds: Int
    /// What was checked against `payloadLimit`: the UTF-8 bytes of every key and
    /// value in `data` (Herald's `kind` and `badge` included) plus, for a
    /// notification, the keys and values of `android.notification` (each
    /// `body_loc_args` element counted as a value of that key). FCM counts "both
    /// the keys and the values" of the payload; the JSON punctuation, the token
    /// and the `android` options are not counted.
    public let payloadSize: Int

    /// Builds the message for one device.
    ///
    /// - Parameters:
    ///   - message: the message as `push.send` accepted it.
    ///   - token: the device's FCM registration token.
    ///   - user: the device's user, for a per-user badge.
    ///   - settings: the app's channel id and default loc key.
    public init(
        message: PushMessage, token: String, user: String, settings: FCMAppSettings
    ) throws(FCMMessageError) {
        self.init(try Template(message: message, user: user, settings: settings), token: token)
    }

    /// The message for `token` from its template.
    public init(_ template: Template, token: String) {
        var body = template.prefix
        body.reserveCapacity(template.prefix.count + token.utf8.count + 2 + template.suffix.count)
        body += JSON.string(token).serialized()
        body += template.suffix
        self.body = body
        self.priority = template.priority
        self.ttlSeconds = template.ttlSeconds
        self.payloadSize = template.payloadSize
    }
}

extension FCMMessage {
    /// Everything of a message but the device's token: the same for every
    /// device of a user (the badge may be per user), so a fan-out builds it,
    /// and checks its size, once.
    public struct Template: Sendable, Hashable {
        /// The body up to the token's value (`{"message":{"token":`).
        let prefix: [UInt8]
        /// The body after the token's value.
        let suffix: [UInt8]
        public let priority: FCMAndroidPriority
        public let ttlSeconds: Int
        public let payloadSize: Int

        /// Builds the template; see ``FCMMessage/init(message:token:user:settings:)``.
        public init(message: PushMessage, user: String, settings: FCMAppSettings) throws(FCMMessageError) {
            var seen = Set<String>()
            for (key, _) in message.data {
                if FCMMessage.isReservedDataKey(key) { throw .reservedDataKey(key) }
                if !seen.insert(key).inserted { throw .duplicateDataKey(key) }
            }

            var size = 0
            var data = JSONObject()
            func put(_ key: String, _ value: String, into object: inout JSONObject) {
                object.append(key, .string(value))
                size += key.utf8.count + value.utf8.count
            }
            put("kind", message.kind.rawValue, into: &data)
            if let badge = message.badge(for: user) {
                put("badge", String(badge), into: &data)
            }
            for (key, value) in message.data { put(key, value, into: &data) }

            let priority: FCMAndroidPriority =
                message.kind != .clear && message.priority == .high ? .high : .normal
            let ttl = min(max(message.ttlSeconds, 0), FCMMessage.maximumTTLSeconds)
            var android = JSONObject()
            android.append("priority", .string(priority.rawValue))
            android.append("ttl", .string("\(ttl)s"))
            if let collapseKey = message.collapseKey, !collapseKey.isEmpty {
                android.append("collapse_key", .string(collapseKey))
            }
            if message.kind == .notification {
                var notification = JSONObject()
                if let channelID = message.androidChannelID ?? settings.channelID {
                    put("channel_id", channelID, into: &notification)
                }
                if let titleLocKey = message.alert?.titleLocKey {
                    put("title_loc_key", titleLocKey, into: &notification)
                }
                let bodyLocKey = message.alert?.bodyLocKey ?? message.alert?.locKey ?? settings.defaultAlertLocKey
                if let bodyLocKey { put("body_loc_key", bodyLocKey, into: &notification) }
                if let args = message.alert?.locArgs {
                    notification.append("body_loc_args", .array(args.map(JSON.string)))
                    size += "body_loc_args".utf8.count + args.reduce(0) { $0 + $1.utf8.count }
                }
                if message.silent {
                    // The device's quiet hours: shown without sound or a heads-up banner.
                    notification.append("notification_priority", .string("PRIORITY_MIN"))
                }
                if !notification.isEmpty { android.append("notification", .object(notification)) }
            }
            guard size <= FCMMessage.payloadLimit else {
                throw .payloadTooLarge(PayloadTooLarge(platform: .fcm, limit: FCMMessage.payloadLimit, size: size))
            }

            // The token first, empty: what comes before its value is the
            // prefix, what follows it the suffix.
            let inner: JSONObject = [
                "token": .string(""),
                "data": .object(data),
                "android": .object(android),
            ]
            let whole = JSON.object(["message": .object(inner)]).serialized()
            let opening = Array(#"{"message":{"token":"#.utf8)
            precondition(whole.starts(with: opening + [0x22, 0x22]), "the token leads the FCM body")
            self.prefix = opening
            self.suffix = Array(whole[(opening.count + 2)...])
            self.priority = priority
            self.ttlSeconds = ttl
            self.payloadSize = size
        }
    }
}
