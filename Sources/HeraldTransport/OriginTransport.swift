public import HTTP2
public import HTTPClient
public import HeraldCore
import HeraldIO

/// One request to a provider's origin, in the form either client takes: the
/// HTTP/2 client (libnghttp2) by path on a lane, libcurl by URL.
public struct OriginRequest: Sendable {
    /// The origin's text (`https://host[:port]`): what is remembered when it
    /// refuses HTTP/2.
    public var origin: String
    /// The absolute URL, for libcurl.
    public var url: String
    /// Path and query, for HTTP/2.
    public var path: String
    /// Header fields as the provider writes them; sent lower-cased over
    /// HTTP/2 (with `content-length`), as written over HTTP/1.1.
    public var headers: [(name: String, value: String)]
    public var body: [UInt8]
    /// Wall-clock ms after which the request is not started (see
    /// ``HTTP2Request/notAfter``); a resend through libcurl past it fails
    /// ``OriginFailure/expired``.
    public var notAfter: Int64?
    /// libcurl's budget for the whole transfer and for its connect phase.
    public var timeout: Duration
    public var connectTimeout: Duration
    /// Vetted addresses to dial instead of resolving the host (IP pinning),
    /// over either client; nil resolves.
    public var pinnedAddresses: [String]?

    public init(
        origin: String, url: String, path: String, headers: [(name: String, value: String)], body: [UInt8],
        notAfter: Int64?, timeout: Duration, connectTimeout: Duration = .seconds(5), pinnedAddresses: [String]? = nil
    ) {
        self.origin = origin
        self.url = url
        self.path = path
        self.headers = headers
        self.body = body
        self.notAfter = notAfter
        self.timeout = timeout
        self.connectTimeout = connectTimeout
        self.pinnedAddresses = pinnedAddresses
    }
}

/// An answer, whichever client carried it.
public enum OriginResponse: Sendable {
    case http2(HTTP2Response)
    case http1(HTTPResponse)

    public var status: Int {
        switch self {
        case .http2(let r): r.status
        case .http1(let r): r.status
        }
    }

    /// `"2"`, or libcurl's version (`"1.1"`).
    public var httpVersion: String {
        switch self {
        case .http2: "2"
        case .http1(let r): r.httpVersion
        }
    }

    public var body: [UInt8] {
        switch self {
        case .http2(let r): r.body
        case .http1(let r): r.body
        }
    }

    /// The first value of header `name` (lower case).
    public func header(_ name: String) -> String? {
        switch self {
        case .http2(let r): r.header(name)
        case .http1(let r): r.header(name)
        }
    }
}

/// Why a request got no answer.
public enum OriginFailure: Error, Sendable, Equatable, CustomStringConvertible {
    case http2(HTTP2ClientError)
    case http1(HTTPError)
    /// The origin refused HTTP/2 and `notAfter` had passed before the
    /// request could be sent again through libcurl.
    case expired

    /// Herald's reason for it, the same for every provider.
    public var reason: ProviderReason {
        switch self {
        case .http2(let error): ProviderReason(error)
        case .http1(let error):
            switch error {
            case .timeout: .timeout
            case .connectFailed: .connectFailure
            case .dnsFailure: .dnsFailure
            case .tls: .tlsFailure
            case .http2Stream(let message):
                message.uppercased().contains("REFUSED")
                    ? .refusedStream : message.uppercased().contains("GOAWAY") ? .goAway : .connectionReset
            case .bodyTooLarge: .unknown("response_too_large")
            case .invalidRequest: .unknown("invalid_request")
            case .shutdown: .shutdown
            case .other: .connectionReset
            }
        case .expired: .timeout
        }
    }

    /// What it means for the push: worth a retry, but for a request
    /// libcurl would not make (it would refuse it again).
    public var outcome: Outcome {
        if case .http1(.invalidRequest) = self { return .failed(reason: reason) }
        return .transient(reason: reason)
    }

    public var description: String {
        switch self {
        case .http2(let error): "\(error)"
        case .http1(let error): "\(error)"
        case .expired: "expired before it could be sent again over HTTP/1.1"
        }
    }
}

/// An origin's HTTP/2 lane (long-lived connections to it), made by
/// ``OriginTransport/lane(_:host:port:addresses:idleTimeout:)``.
public struct OriginLane: Sendable {
    fileprivate let handle: HTTP2LaneHandle
}

/// Requests gathered to be handed to the HTTP/2 client at once
/// (``OriginTransport/add(_:lane:to:completion:)``, then
/// ``OriginTransport/send(_:)``): one wake-up of its loop for them all.
public struct OriginBatch: Sendable {
    fileprivate var sends: [HTTP2Send] = []

    public init() {}
}

/// How every provider reaches its origins: over HTTP/2 on libnghttp2 first,
/// and through libcurl (HTTP/1.1) for an origin that does not offer HTTP/2,
/// remembered for ``memory`` so that its next requests go there at once.
/// The fallback is written here once for every provider; a provider gives
/// its requests and reads the answers, and never chooses a client itself.
///
/// Each sender holds its own (the memory is per sender, and so per app, as
/// the lanes are), bounded at ``capacity`` origins, least recently used
/// forgotten first.
public final class OriginTransport: Sendable {
    public static let memory: Duration = .seconds(3600)
    public static let defaultCapacity = 4096

    private let http1: HTTPClient
    private let http2: HTTP2Client?
    private let clock: any WallClock
    private let memoryMs: Int64
    /// Origins that refused HTTP/2, with the wall-clock ms until which they
    /// go through libcurl.
    private let http1Origins: Locked<LRUCache<String, Int64>>

    /// Over `http2` where it is given and an origin offers it, else
    /// through `http1` (libcurl).
    public init(
        http1: HTTPClient, http2: HTTP2Client? = nil, clock: any WallClock, memory: Duration = OriginTransport.memory,
        capacity: Int = OriginTransport.defaultCapacity
    ) {
        self.http1 = http1
        self.http2 = http2
        self.clock = clock
        self.memoryMs = memory.wholeMilliseconds
        self.http1Origins = Locked(LRUCache(capacity: capacity))
    }

    /// Whether `origin` goes through libcurl now, having refused HTTP/2.
    public func usesHTTP1(_ origin: String) -> Bool {
        let now = clock.nowMilliseconds()
        return http1Origins.withLock { known in
            guard let until = known.get(origin) else { return false }
            if now < until { return true }
            known.remove(origin)
            return false
        }
    }

    /// How many origins are remembered as HTTP/1.1-only (at most the capacity).
    public var rememberedHTTP1Origins: Int { http1Origins.withLock { $0.count } }

    /// Whether there is an HTTP/2 client to carry requests.
    public var carriesHTTP2: Bool { http2 != nil }

    /// The lane named `name` of the HTTP/2 client (made on first use, kept
    /// while it carries requests; closed after `idleTimeout` without one),
    /// dialling `addresses` when given, else resolving `host`. nil without
    /// an HTTP/2 client. The client speaks TLS only: no lane for `http`.
    public func lane(
        _ name: String, host: String, port: Int, addresses: [String]? = nil, idleTimeout: Duration
    ) -> OriginLane? {
        guard let http2 else { return nil }
        return OriginLane(
            handle: http2.lane(
                HTTP2LaneKey(name), endpoint: HTTP2Endpoint(host: host, port: port, addresses: addresses),
                options: HTTP2LaneOptions(idleTimeout: idleTimeout)))
    }

    /// Sends `request`: on the lane `lane` gives (HTTP/2) unless it gives
    /// none (no HTTP/2 client, a plain `http` origin) or the origin is
    /// remembered as HTTP/1.1-only, else through libcurl. The completion
    /// runs once, on a client's thread.
    public func send(
        _ request: OriginRequest, lane: () -> OriginLane?,
        completion: @escaping @Sendable (Result<OriginResponse, OriginFailure>) -> Void
    ) {
        guard let send = http2Send(request, lane: lane, completion: completion) else { return }
        send.lane.send(send.request, completion: send.completion)
    }

    /// Adds `request` to `batch` when it goes over HTTP/2; else sends it
    /// through libcurl at once. The completion runs as for
    /// ``send(_:lane:completion:)``.
    public func add(
        _ request: OriginRequest, lane: () -> OriginLane?, to batch: inout OriginBatch,
        completion: @escaping @Sendable (Result<OriginResponse, OriginFailure>) -> Void
    ) {
        if let send = http2Send(request, lane: lane, completion: completion) { batch.sends.append(send) }
    }

    /// Hands the batch's requests to the HTTP/2 client.
    public func send(_ batch: OriginBatch) {
        http2?.send(batch.sends)
    }

    /// Sends `request` through libcurl, whatever its origin offers: for a
    /// request too rare to keep a connection for (the OAuth token exchange,
    /// once an hour).
    public func sendHTTP1(
        _ request: OriginRequest, completion: @escaping @Sendable (Result<OriginResponse, OriginFailure>) -> Void
    ) {
        if let notAfter = request.notAfter, clock.nowMilliseconds() > notAfter {
            completion(.failure(.expired))
            return
        }
        let curl = HTTPRequest(
            method: "POST", url: request.url, headers: request.headers.map { ($0.name, $0.value) }, body: request.body,
            timeout: request.timeout, connectTimeout: request.connectTimeout,
            pinnedAddresses: request.pinnedAddresses)
        http1.send(curl) { result in
            switch result {
            case .success(let response): completion(.success(.http1(response)))
            case .failure(let error): completion(.failure(.http1(error)))
            }
        }
    }

    /// The HTTP/2 send of `request`, or nil when it went through libcurl.
    private func http2Send(
        _ request: OriginRequest, lane: () -> OriginLane?,
        completion: @escaping @Sendable (Result<OriginResponse, OriginFailure>) -> Void
    ) -> HTTP2Send? {
        guard !usesHTTP1(request.origin), let lane = lane()?.handle else {
            sendHTTP1(request, completion: completion)
            return nil
        }
        var fields = request.headers.map { (name: $0.name.lowercased(), value: $0.value) }
        fields.append(("content-length", String(request.body.count)))
        return HTTP2Send(
            lane: lane,
            request: HTTP2Request(path: request.path, headers: fields, body: request.body, notAfter: request.notAfter)
        ) { [self] result in
            switch result {
            case .success(let response):
                completion(.success(.http2(response)))
            case .failure(.noHTTP2):
                // The origin speaks HTTP/1.1 only: libcurl carries it (and this request).
                rememberHTTP1(request.origin)
                sendHTTP1(request, completion: completion)
            case .failure(let error):
                completion(.failure(.http2(error)))
            }
        }
    }

    private func rememberHTTP1(_ origin: String) {
        let until = clock.nowMilliseconds() + memoryMs
        http1Origins.withLock { known in
            let old = known.peek(origin) ?? 0
            _ = known.set(origin, max(old, until))
        }
    }
}
