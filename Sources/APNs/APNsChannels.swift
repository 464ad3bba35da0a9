public import HTTP2
public import HeraldCore
import HeraldCrypto
internal import HeraldJSON

/// What a broadcast channel keeps for devices that subscribe later
/// (`message-storage-policy`, immutable once created).
public enum ChannelStorage: String, Sendable, CaseIterable, Hashable {
    /// No message stored (0): a higher publishing budget; every broadcast goes with `apns-expiration: 0`.
    case none
    /// The most recent message stored (1), for up to 8 hours.
    case latest

    /// The API's `message-storage-policy`.
    public var policy: Int { self == .none ? 0 : 1 }
}

/// One channel management request (Apple, "Sending channel management
/// requests to APNs"): paths name the bare bundle id; the channel id goes
/// in `apns-channel-id`, never in the path.
public enum ChannelRequest: Sendable, Hashable {
    case create(bundleID: String, storage: ChannelStorage)
    case read(bundleID: String, channelID: String)
    case delete(bundleID: String, channelID: String)
    case list(bundleID: String)

    public var method: String {
        switch self {
        case .create: "POST"
        case .read, .list: "GET"
        case .delete: "DELETE"
        }
    }

    public var path: String {
        switch self {
        case .create(let b, _), .read(let b, _), .delete(let b, _): "/1/apps/\(b)/channels"
        case .list(let b): "/1/apps/\(b)/all-channels"
        }
    }

    public var headers: [(name: String, value: String)] {
        switch self {
        case .read(_, let id), .delete(_, let id): [("apns-channel-id", id)]
        case .create: [("content-type", "application/json")]
        case .list: []
        }
    }

    /// `{"message-storage-policy": 0|1, "push-type": "LiveActivity"}` for a create; empty otherwise.
    public var body: [UInt8] {
        guard case .create(_, let storage) = self else { return [] }
        let o: JSONObject = ["message-storage-policy": .int(storage.policy), "push-type": "LiveActivity"]
        return JSON.object(o).serialized()
    }
}

/// What a channel management answer says.
public enum ChannelAnswer: Sendable, Hashable {
    /// 201 with the new id (`apns-channel-id`).
    case created(channelID: String)
    /// 200: the channel's storage.
    case read(storage: ChannelStorage?)
    /// 204.
    case deleted
    /// 200: every channel id of the bundle in this environment.
    case listed([String])
    /// APNs refused: status and reason (`ChannelNotRegistered`, `CannotCreateChannelConfig`, …).
    case refused(status: Int, reason: String?)

    /// Reads the answer to `request`.
    public static func read(_ r: HTTP2Response, for request: ChannelRequest) -> ChannelAnswer {
        let json = r.body.isEmpty ? nil : try? JSONParser.parse(r.body)
        switch (request, r.status) {
        case (.create, 201):
            guard let id = r.header("apns-channel-id"), !id.isEmpty else {
                return .refused(status: r.status, reason: "no apns-channel-id in the answer")
            }
            return .created(channelID: id)
        case (.read, 200):
            let policy = json?["message-storage-policy"]?.numberValue?.int64
            return .read(storage: policy.map { $0 == 0 ? .none : .latest })
        case (.delete, 204), (.delete, 200):
            return .deleted
        case (.list, 200):
            return .listed(json?["channels"]?.arrayValue?.compactMap(\.stringValue) ?? [])
        default:
            return .refused(status: r.status, reason: json?["reason"]?.stringValue)
        }
    }
}

/// One app's channel management: a lane to each environment's management
/// host (Apple's `api-manage-broadcast…`), signed with the app's key.
public final class APNsChannelManager: Sendable {
    private let production: APNsLaneHandle
    private let development: APNsLaneHandle
    /// The app's default bundle id.
    public let topic: String

    public init(
        client: APNsClient, app: String, signer: APNsSigner, topic: String, production: APNsEndpoint,
        development: APNsEndpoint
    ) {
        self.topic = topic
        let keyTag = "manage-" + String(SHA256.hex(signer.key.publicKey).prefix(16))
        func lane(_ env: APNsEnvironment, _ endpoint: APNsEndpoint) -> APNsLaneHandle {
            client.lane(
                APNsLaneKey(app: app, keyID: signer.keyID, teamID: signer.teamID, environment: env, keyTag: keyTag),
                endpoint: endpoint, signer: signer)
        }
        self.production = lane(.production, production)
        self.development = lane(.development, development)
    }

    /// Sends one management request to the environment's host.
    public func perform(
        _ request: ChannelRequest, environment: APNsEnvironment,
        completion: @escaping @Sendable (Result<ChannelAnswer, APNsClientError>) -> Void
    ) {
        let lane = environment == .development ? development : production
        lane.request(method: request.method, path: request.path, headers: request.headers, body: request.body) {
            result in
            completion(result.map { ChannelAnswer.read($0, for: request) })
        }
    }
}
