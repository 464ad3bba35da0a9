/// The push transports a device can be registered for.
public enum Platform: String, Sendable, CaseIterable, Hashable {
    case apns
    case apnsVoIP = "apns_voip"
    /// A WidgetKit push token (iOS 26): widget reloads (`kind: widgets`).
    case apnsWidgets = "apns_widgets"
    /// A Core Location push token: location queries (`kind: location`).
    case apnsLocation = "apns_location"
    /// A PushToTalk channel's ephemeral token (`kind: pushtotalk`).
    case apnsPushToTalk = "apns_pushtotalk"
    /// A Live Activity token (`kind: live_activity`): a push-to-start token
    /// of a device and an activity type, or a running activity's update
    /// token. Registered with `activity.register`, never `device.register`.
    case apnsLiveActivity = "apns_liveactivity"
    /// An APNs broadcast channel (iOS 18): one request reaches every Live
    /// Activity subscribed to it. Created with `channel.create`; its
    /// deliveries are `push.broadcast`'s.
    case apnsChannel = "apns_channel"
    case fcm
    case web
    /// UnifiedPush: always the Web Push form (an https endpoint and its keys).
    case unifiedPush = "unified_push"

    /// A token APNs issued (sent by the app's APNs transport).
    public var isAPNs: Bool {
        switch self {
        case .apns, .apnsVoIP, .apnsWidgets, .apnsLocation, .apnsPushToTalk, .apnsLiveActivity, .apnsChannel: true
        case .fcm, .web, .unifiedPush: false
        }
    }

    /// APNs tokens are bound to an APNs environment; the others are not.
    public var hasEnvironment: Bool { isAPNs }

    /// Whether a registration of this platform may take the Web Push form
    /// (an https endpoint with `p256dh` and `auth`): every platform but the
    /// APNs ones, `apns_voip` aside.
    public var acceptsWebPushForm: Bool { !isAPNs || self == .apnsVoIP }

    /// What APNs adds to the bundle id for this platform's `apns-topic`
    /// ("" for `apns`; nil off APNs).
    public var apnsTopicSuffix: String? {
        switch self {
        case .apns: ""
        case .apnsVoIP: ".voip"
        case .apnsWidgets: ".push-type.widgets"
        case .apnsLocation: ".location-query"
        case .apnsPushToTalk: ".voip-ptt"
        case .apnsLiveActivity: ".push-type.liveactivity"
        // A broadcast names its bundle in the path and has no apns-topic.
        case .apnsChannel: ""
        case .fcm, .web, .unifiedPush: nil
        }
    }

    /// Whether `device.register` takes this platform (Live Activity tokens
    /// come through `activity.register`).
    public var isDevicePlatform: Bool { self != .apnsLiveActivity && self != .apnsChannel }

    /// Whether a registration of this platform must take the Web Push form.
    public var requiresWebPushForm: Bool { self == .web || self == .unifiedPush }
}

/// The client build a registration belongs to when none is given.
public enum ClientBuild {
    public static let defaultAppID = "stable"
}

/// The APNs environment a token was issued for.
public enum APNsEnvironment: String, Sendable, CaseIterable, Hashable {
    case production
    case development
}

/// A Web Push subscription's keys (raw bytes, already checked).
public struct WebPushKeys: Sendable, Equatable {
    public let p256dh: [UInt8]
    public let auth: [UInt8]

    public init(p256dh: [UInt8], auth: [UInt8]) {
        self.p256dh = p256dh
        self.auth = auth
    }
}

/// One `device.register` call, validated.
public struct Registration: Sendable {
    public var app: String
    public var user: String
    public var platform: Platform
    /// For APNs platforms only; nil for FCM and Web Push.
    public var environment: APNsEnvironment?
    public var token: String
    public var keys: WebPushKeys?
    public var name: String?
    public var appVersion: String?
    public var session: String?
    public var registrationID: String?
    public var version: Int64?
    /// APNs platforms only: one of the app's `apns_topics` (the base id for
    /// `apns_voip` too); nil keeps the stored one, or the app's default.
    public var bundleID: String?
    /// Web Push only: the VAPID public key (base64url, uncompressed P-256)
    /// the subscription was made with; stored as given (nil: not recorded,
    /// taken as the app's current key).
    public var serverKey: String?
    /// The client build (`stable`, `beta`, …): part of the registration's
    /// identity, so one token under two builds is two registrations.
    public var appID: String
    /// The client's user agent as it gave it (nil: not given).
    public var userAgent: String?
    /// Its time zone, quiet hours and topics as given: what is not named is
    /// kept from the stored registration (a new one starts without).
    public var preferences = PreferenceChanges()

    public init(
        app: String, user: String, platform: Platform, environment: APNsEnvironment?,
        token: String, keys: WebPushKeys? = nil, name: String? = nil, appVersion: String? = nil,
        session: String? = nil, registrationID: String? = nil, version: Int64? = nil, bundleID: String? = nil,
        serverKey: String? = nil, appID: String = ClientBuild.defaultAppID, userAgent: String? = nil
    ) {
        self.app = app
        self.user = user
        self.platform = platform
        self.environment = environment
        self.token = token
        self.keys = keys
        self.name = name
        self.appVersion = appVersion
        self.session = session
        self.registrationID = registrationID
        self.version = version
        self.bundleID = bundleID
        self.serverKey = serverKey
        self.appID = appID
        self.userAgent = userAgent
    }

    /// Whether this is a Web Push-form registration (endpoint and keys).
    public var isWebPushForm: Bool { keys != nil }
}

/// What `device.register` did.
public struct RegistrationOutcome: Sendable, Equatable {
    public let deviceID: String
    public let tokenHash: String
    public let created: Bool
    public let reclaimed: Bool
    public let evicted: [String]

    public init(deviceID: String, tokenHash: String, created: Bool, reclaimed: Bool, evicted: [String]) {
        self.deviceID = deviceID
        self.tokenHash = tokenHash
        self.created = created
        self.reclaimed = reclaimed
        self.evicted = evicted
    }
}

/// Which device(s) a `device.unregister` call names.
public enum UnregisterSelector: Sendable {
    case deviceID(String)
    case binding(
        platform: Platform, environment: APNsEnvironment?, token: String, appID: String = ClientBuild.defaultAppID)
    case registration(id: String, version: Int64)
}

/// A device as `device.list` shows it: never a raw token or key.
public struct DeviceSummary: Sendable, Equatable {
    public let deviceID: String
    public let platform: Platform
    public let environment: APNsEnvironment?
    public let name: String?
    public let appVersion: String?
    public let tokenHash: String
    /// Milliseconds since the Unix epoch.
    public let createdAt: Int64
    public let registeredAt: Int64
    public let lastSuccessAt: Int64?
    public let lastFailureAt: Int64?
    public let lastFailureReason: String?
    /// The stored bundle id of an APNs device; nil: the app's default topic.
    public let bundleID: String?
    /// False when turned off by `device.update`: kept and listed, skipped by sends.
    public let enabled: Bool
    /// The client build the registration belongs to.
    public let appID: String
    /// The user agent the client gave, if any.
    public let userAgent: String?
    /// True for the Web Push form (endpoint and keys), false for a raw token.
    public let webPushForm: Bool
    /// Its time zone, quiet hours and topics.
    public var preferences = DevicePreferences.none

    public init(
        deviceID: String, platform: Platform, environment: APNsEnvironment?, name: String?,
        appVersion: String?, tokenHash: String, createdAt: Int64, registeredAt: Int64,
        lastSuccessAt: Int64?, lastFailureAt: Int64?, lastFailureReason: String?, bundleID: String? = nil,
        enabled: Bool = true, appID: String = ClientBuild.defaultAppID, userAgent: String? = nil,
        webPushForm: Bool = false
    ) {
        self.deviceID = deviceID
        self.platform = platform
        self.environment = environment
        self.name = name
        self.appVersion = appVersion
        self.tokenHash = tokenHash
        self.createdAt = createdAt
        self.registeredAt = registeredAt
        self.lastSuccessAt = lastSuccessAt
        self.lastFailureAt = lastFailureAt
        self.lastFailureReason = lastFailureReason
        self.bundleID = bundleID
        self.enabled = enabled
        self.appID = appID
        self.userAgent = userAgent
        self.webPushForm = webPushForm
    }
}

/// A registration refused by the ordering rules: the stored version wins.
public struct RegistrationConflict: Error, Sendable, Equatable {
    public let storedVersion: Int64
    public let reason: String

    public init(storedVersion: Int64, reason: String) {
        self.storedVersion = storedVersion
        self.reason = reason
    }
}
