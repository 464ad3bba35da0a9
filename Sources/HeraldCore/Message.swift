/// What a push is for; it sets the default TTL, urgency and which platforms get it.
public enum PushKind: String, Sendable, CaseIterable, Hashable {
    /// A new-content notification: TTL 86400 s, urgency high.
    case notification
    /// Clears a shown notification: TTL 3600 s, urgency low (APNs background push).
    case clear
    /// An incoming call: TTL 0, urgency high; goes to apns_voip (either form)
    /// and to Web Push-form fcm registrations only.
    case callRing = "call_ring"
    /// Reloads the app's widgets (`{"aps":{"content-changed":true}}`):
    /// TTL 3600 s, urgency high; goes to `apns_widgets` tokens only.
    case widgets
    /// Asks the app's location push extension where the device is: TTL 60
    /// s, urgency high; goes to `apns_location` tokens only.
    case location
    /// Tells a PushToTalk channel who speaks: sent once (TTL 0) at priority
    /// 10, as Apple asks; goes to `apns_pushtotalk` tokens only.
    case pushToTalk = "pushtotalk"
    /// Starts, updates or ends a Live Activity (``LiveActivity``): TTL 3600
    /// s, priority normal (Apple's budget counts priority 10 only); goes to
    /// `apns_liveactivity` tokens only.
    case liveActivity = "live_activity"

    public var defaultTTLSeconds: Int {
        switch self {
        case .notification: 86_400
        case .clear, .widgets, .liveActivity: 3_600
        case .location: 60
        case .callRing, .pushToTalk: 0
        }
    }

    public var defaultPriority: PushPriority {
        switch self {
        case .notification, .callRing, .widgets, .location, .pushToTalk: .high
        case .liveActivity: .normal
        case .clear: .low
        }
    }

    /// The platform a kind of its own goes to, and only there (nil for the
    /// kinds that go to the ordinary registrations).
    public var ownPlatform: Platform? {
        switch self {
        case .widgets: .apnsWidgets
        case .location: .apnsLocation
        case .pushToTalk: .apnsPushToTalk
        case .liveActivity: .apnsLiveActivity
        case .notification, .clear, .callRing: nil
        }
    }

    /// Whether this kind is delivered to a registration of `platform` in
    /// the given form: a ring goes to an iOS device's VoIP registration
    /// and to Web Push-form `fcm` registrations; widgets, location and
    /// pushtotalk to their own tokens; a notification or a clear to every
    /// other registration (the VoIP, widget, location and PushToTalk tokens
    /// get nothing else).
    public func reaches(_ platform: Platform, webPushForm: Bool) -> Bool {
        switch self {
        case .callRing: platform == .apnsVoIP || (platform == .fcm && webPushForm)
        case .widgets, .location, .pushToTalk: platform == ownPlatform && !webPushForm
        case .liveActivity: (platform == .apnsLiveActivity || platform == .apnsChannel) && !webPushForm
        case .notification, .clear:
            platform == .apns || platform == .fcm || platform == .web || platform == .unifiedPush
        }
    }

    /// Whether this kind is delivered to registrations of `platform` in the
    /// form that platform's own transport (APNs, FCM) sends: the legacy form,
    /// or the Web Push form for `web` and `unified_push`.
    public func reaches(_ platform: Platform) -> Bool {
        reaches(platform, webPushForm: platform.requiresWebPushForm)
    }
}

/// Delivery priority, mapped per transport (APNs 10/5, FCM android.priority, Web Push Urgency).
public enum PushPriority: String, Sendable, CaseIterable, Hashable {
    case high
    case normal
    case low
}

/// How strongly a notification may interrupt (APNs `interruption-level`).
public enum InterruptionLevel: String, Sendable, CaseIterable, Hashable {
    /// Added to the list quietly: no sound, no lit screen.
    case passive
    /// The system default.
    case active
    /// May break through Focus and scheduled summaries.
    case timeSensitive = "time-sensitive"
    /// Breaks through the mute switch and Do Not Disturb; Apple grants it only
    /// with an entitlement.
    case critical
}

/// Localisation keys only: Herald never carries message content.
public struct PushAlert: Sendable, Equatable {
    public var locKey: String?
    public var locArgs: [String]?
    public var titleLocKey: String?
    public var bodyLocKey: String?

    public init(locKey: String? = nil, locArgs: [String]? = nil, titleLocKey: String? = nil, bodyLocKey: String? = nil)
    {
        self.locKey = locKey
        self.locArgs = locArgs
        self.titleLocKey = titleLocKey
        self.bodyLocKey = bodyLocKey
    }
}

/// One message as `push.send` accepted it, before it is addressed to devices.
public struct PushMessage: Sendable, Equatable {
    public var kind: PushKind
    /// Flat routing data (ids, never content), in the caller's order.
    public var data: [(key: String, value: String)]
    public var alert: PushAlert?
    /// A badge for every recipient, or one per user (`badge: {user: n}`).
    public var badge: Int?
    public var badgePerUser: [String: Int]
    public var collapseKey: String?
    public var priority: PushPriority
    public var ttlSeconds: Int
    /// The message's own collapse id when it has no `collapseKey`: 32
    /// base64url characters, stable for the message (derived from its
    /// idempotency key, else its message id; set by the store), so that a
    /// resend after an ambiguous failure replaces the first notification
    /// (APNs `apns-collapse-id`, Web Push `Topic`). Not part of `==`.
    public var collapseID: String?
    /// How the notification may interrupt (APNs `aps.interruption-level`).
    public var interruptionLevel: InterruptionLevel?
    /// 0–1: which of the app's notifications the summary puts first (APNs
    /// `aps.relevance-score`).
    public var relevanceScore: Double?
    /// Groups notifications on the device (APNs `aps.thread-id`).
    public var threadID: String?
    /// The notification category the app registered, for its actions (APNs `aps.category`).
    public var category: String?
    /// The Android notification channel, in place of the app's
    /// `android_channel_id` (FCM `android.notification.channel_id`).
    public var androidChannelID: String?
    /// `web_payload` and `shrink`: what a Web Push-form record carries
    /// instead of `{kind, data, badge}`. Legacy-form devices never get it.
    public var webContent: WebContent?
    /// What the message is about (`push.send` `topics`): a device with its
    /// own `topics` gets it only when one is shared. nil: about nothing in
    /// particular, so every device gets it.
    public var topics: [String]?
    /// When it is sent (`not_before`, `at_local`); nil: at once.
    public var sendTime: SendTime?
    /// Why the message ignores quiet hours (`call_ring`, `critical`,
    /// `time-sensitive`, `topic:<name>` for one of the app's bypassing
    /// topics); nil: quiet hours apply. Set when it is accepted.
    public var quietBypass: String?
    /// This delivery goes without sound or banner (the device's quiet
    /// hours, `during: silent`): set per delivery as it is sent, never stored
    /// with the message.
    public var silent = false
    /// `kind: live_activity`: the event and its content.
    public var liveActivity: LiveActivity?

    public init(
        kind: PushKind, data: [(key: String, value: String)] = [], alert: PushAlert? = nil, badge: Int? = nil,
        badgePerUser: [String: Int] = [:], collapseKey: String? = nil, priority: PushPriority? = nil,
        ttlSeconds: Int? = nil
    ) {
        self.kind = kind
        self.data = data
        self.alert = alert
        self.badge = badge
        self.badgePerUser = badgePerUser
        self.collapseKey = collapseKey
        self.priority = priority ?? kind.defaultPriority
        self.ttlSeconds = ttlSeconds ?? kind.defaultTTLSeconds
    }

    /// The collapse id a transport sends when the message has no collapse
    /// key: ``collapseID`` if it is one (32 characters of `[A-Za-z0-9_-]`).
    public var ownCollapseID: String? {
        guard collapseKey?.isEmpty ?? true, let id = collapseID, id.utf8.count == 32,
            id.utf8.allSatisfy({ b in
                (0x30...0x39).contains(b) || (0x41...0x5A).contains(b) || (0x61...0x7A).contains(b) || b == 0x2D
                    || b == 0x5F
            })
        else { return nil }
        return id
    }

    /// The badge a given user's devices get.
    public func badge(for user: String) -> Int? { badgePerUser[user] ?? badge }

    public static func == (a: PushMessage, b: PushMessage) -> Bool {
        a.kind == b.kind && a.data.map(\.key) == b.data.map(\.key) && a.data.map(\.value) == b.data.map(\.value)
            && a.alert == b.alert && a.badge == b.badge && a.badgePerUser == b.badgePerUser
            && a.collapseKey == b.collapseKey && a.priority == b.priority && a.ttlSeconds == b.ttlSeconds
            && a.interruptionLevel == b.interruptionLevel && a.relevanceScore == b.relevanceScore
            && a.threadID == b.threadID && a.category == b.category && a.androidChannelID == b.androidChannelID
            && a.webContent == b.webContent && a.topics == b.topics && a.sendTime == b.sendTime
            && a.quietBypass == b.quietBypass && a.liveActivity == b.liveActivity
    }

    /// Why a message of this kind, level and topics breaks through quiet
    /// hours, or nil: a call ring or a PushToTalk push (someone speaks
    /// now), a widget reload or a location query (they show nothing), a
    /// critical or time-sensitive interruption level, or a topic among the
    /// app's `bypassTopics`.
    public static func quietBypass(
        kind: PushKind, interruptionLevel: InterruptionLevel?, topics: [String]?, bypassTopics: [String]
    ) -> String? {
        switch kind {
        case .callRing, .pushToTalk, .widgets, .location: return kind.rawValue
        case .notification, .clear, .liveActivity: break
        }
        if let level = interruptionLevel, level == .critical || level == .timeSensitive { return level.rawValue }
        if let topic = topics?.first(where: { bypassTopics.contains($0) }) { return "topic:" + topic }
        return nil
    }
}
