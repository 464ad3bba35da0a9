public import HeraldCore
public import HeraldCrypto
internal import Dispatch
internal import Foundation
import HeraldIO
public import HeraldTransport

/// Sends one sealed Web Push record to one subscription (webpush.md §3.4).
///
/// Sends are worked off in chunks (up to `chunk` at a time, by at most one
/// worker per core on the sender's concurrent queue): a worker checks and
/// seals a chunk, then hands its HTTP/2 requests to the client in one batch,
/// so a fan-out wakes the client's thread and writes to each connection once
/// per chunk rather than once per push. A worker's first chunk is
/// `firstChunk`, and each next one twice the last up to `chunk`: the first
/// requests of a burst leave after one or two seals, not sixteen.
///
/// Per send:
/// 1. The endpoint is checked again with the ``EndpointGuard`` (DNS rebinding
///    and changed answers are caught at send time). With an
///    ``AsyncHostResolver`` (the daemon's ``CachingResolver`` on c-ares) a
///    name not in its cache is looked up without a thread: the worker moves
///    on to the next send, and the push goes back into the backlog when the
///    answer comes (at most 2 s later; no answer by then is a DNS failure), so
///    a slow name server never holds up sends to other endpoints. Another
///    resolver is called on the worker. A refused endpoint (no longer public) is
///    `.failed(reason:)` with reason `endpoint_refused`: never `.stale`, so a
///    guard refusal never deletes a subscription. A name that does not resolve
///    now is a DNS failure like any other: a retry (`dns_failure`).
/// 2. The plaintext is sealed to `payload.bodySize`. Sealers hold scratch state
///    and serve one thread at a time: the sender keeps a small pool; a send
///    takes one (or makes a new one), seals, and puts it back (the pool keeps
///    at most `maxPooledSealers`).
/// 3. `POST` with `TTL`, `Urgency`, `Topic` (when set), `Content-Encoding:
///    aes128gcm`, `Content-Type: application/octet-stream` and the VAPID
///    `Authorization` from the ``VAPIDTokenCache`` (per app and origin),
///    pinned to the vetted addresses. With an HTTP/2 client in its
///    ``OriginTransport`` the request goes on the lane of its origin and
///    addresses (long-lived HTTP/2
///    connections, closed after `http2IdleTimeout`, by default `idleTimeout`,
///    without a request); an origin that does not offer HTTP/2 in ALPN is
///    sent through the libcurl client (HTTP/1.1 or HTTP/2) for the next
///    `http1Memory`.
/// 4. The answer goes through ``WebPushClassifier``; a 401/403 also drops
///    the cached VAPID token of that origin and key. The first 413 makes the
///    sender seal `payload.minimalPlaintext` to `payload.stepDownBodySize` and
///    send once more (`steppedDown: true`; a second 413 is `.failed`).
///    A request that got no answer ends as ``OriginFailure/outcome`` says
///    (the same for every provider): transient, with Herald's reason.
///
/// VAPID key rotation: a subscription is bound to the key it was made with
/// (``Prepared/serverKey``). One made under the current key, or recording
/// none, is signed with the current key; one made under `previousVapidKey`
/// with that key (the JWT and `k=`). One made under a key the app no longer
/// holds (retired) is signed with the current key, so that a push service
/// that does not bind subscriptions to a key still delivers it; its 401/403
/// is `.failed(reason:)` with reason `vapid_key_retired` (the subscription
/// cannot be served until the browser subscribes again), never
/// `authRejected`: it says nothing about the push service or Herald's keys.
///
/// The completion gets the outcome and the HTTP status of the last answer (nil
/// when no request was answered). It runs on an HTTP client, sender queue or
/// resolver thread.
public final class WebPushSender: Sendable {
    public static let maxPooledSealers = 16
    public static let endpointRefused = ProviderReason("endpoint_refused")
    public static let vapidFailure = ProviderReason("vapid_failure")
    public static let sealFailure = ProviderReason("seal_failure")
    public static let invalidKeys = ProviderReason("invalid_subscription_keys")
    /// A 401/403 to a subscription made under a VAPID key the app no longer holds.
    public static let vapidKeyRetired = ProviderReason("vapid_key_retired")
    /// A `web_payload` that no shrink step brings under the record (only the
    /// smaller record of a 413 retry can come to this: `push.send` refuses
    /// one that does not fit the full record).
    public static let webPayloadTooLarge = ProviderReason("web_payload_too_large")

    /// By default, an HTTP/2 lane with no request for this long closes its connection.
    public static let idleTimeout: Duration = .seconds(120)
    /// How long an origin that refused HTTP/2 is sent through libcurl.
    public static let http1Memory: Duration = OriginTransport.memory
    /// The most origins remembered as HTTP/1.1-only (LRU).
    public static let maxRememberedHTTP1Origins = OriginTransport.defaultCapacity

    public let endpointGuard: EndpointGuard
    public let app: String
    public let subject: String
    public let clock: any WallClock
    public let tokens: VAPIDTokenCache
    /// The per-request deadline of libcurl sends; requests carried over
    /// HTTP/2 have that client's `requestTimeout`.
    public let timeout: Duration
    /// The connect and TLS handshake deadline of libcurl sends (the HTTP/2
    /// client has its own `connectTimeout`).
    public let connectTimeout: Duration
    /// An HTTP/2 connection (and lane) of an origin that carried no request for this long is closed.
    public let http2IdleTimeout: Duration
    private let vapidKey: P256PrivateKey
    /// The current key's public key (base64url), as `vapid.public_key` gives it.
    public let currentKeyID: String
    /// The previous key (rotation) and its public key, if the app holds one.
    private let previousVapidKey: P256PrivateKey?
    public let previousKeyID: String?
    private let queue = DispatchQueue(label: "herald.webpush.sender", attributes: .concurrent)
    /// Idle sealers; each is used under its own lock (never contended: one
    /// send at a time takes it from the pool).
    private let sealers = Locked<[Locked<WebPushSealer>]>([])
    /// HTTP/2 first, libcurl for an origin that does not offer it (remembered per origin).
    private let transport: OriginTransport
    /// Sends not yet taken by a worker, and how many workers run.
    private let backlog = Locked(Backlog())
    /// The most sends one worker checks and seals before handing them over.
    static let chunk = 16
    /// The most a worker takes in its first chunk; each next one may be twice the last.
    static let firstChunk = 2
    static let maxWorkers = max(1, ProcessInfo.processInfo.activeProcessorCount)

    private struct Backlog {
        var items: [Work] = []
        var next = 0
        var workers = 0
    }

    private struct Work {
        let endpoint: String
        let prepare: @Sendable () -> Preparation
        let completion: Completion
        /// Set once the endpoint passed the send-time check (after a lookup that did not answer at once).
        var checked: CheckedEndpoint?
    }

    /// The outcome, the HTTP status of the last answer, what the sealed
    /// record's `web_payload` needed (nil: none sealed, or Herald's own
    /// form), and the last request's receipt (nil: none was sent).
    typealias Completion = @Sendable (Outcome, Int?, ShrinkOutcome?, ProviderReceipt?) -> Void

    /// What `prepare` of ``send(endpoint:prepare:completion:)`` gives: the
    /// push, or the outcome to report instead of sending it.
    public enum Preparation: Sendable {
        case ready(Prepared)
        case refused(Outcome)
    }

    /// What one push needs, made on a worker by ``send(endpoint:prepare:completion:)``.
    public struct Prepared: Sendable {
        public let subscriber: WebPushSubscriber
        public let payload: WebPushPayload
        public let headers: WebPushHeaders
        /// Wall-clock ms after which the push is no longer started (its TTL
        /// ended while it waited for a lookup, a stream or a retry): it ends as
        /// a `timeout`, unsent.
        public let notAfter: Int64?
        /// The VAPID public key (base64url) the subscription was made with;
        /// nil: the current key.
        public let serverKey: String?

        public init(
            subscriber: WebPushSubscriber, payload: WebPushPayload, headers: WebPushHeaders, notAfter: Int64? = nil,
            serverKey: String? = nil
        ) {
            self.subscriber = subscriber
            self.payload = payload
            self.headers = headers
            self.notAfter = notAfter
            self.serverKey = serverKey
        }
    }

    public init(
        guard endpointGuard: EndpointGuard, transport: OriginTransport, vapidKey: P256PrivateKey,
        subject: String, app: String, clock: any WallClock = SystemClock(), tokens: VAPIDTokenCache? = nil,
        timeout: Duration = .seconds(15), connectTimeout: Duration = .seconds(5),
        http2IdleTimeout: Duration = WebPushSender.idleTimeout, previousVapidKey: P256PrivateKey? = nil
    ) {
        self.endpointGuard = endpointGuard
        self.vapidKey = vapidKey
        currentKeyID = vapidKey.publicKeyBase64URL
        self.previousVapidKey = previousVapidKey
        previousKeyID = previousVapidKey?.publicKeyBase64URL
        self.subject = subject
        self.app = app
        self.clock = clock
        self.tokens = tokens ?? VAPIDTokenCache(clock: clock)
        self.timeout = timeout
        self.connectTimeout = connectTimeout
        self.http2IdleTimeout = http2IdleTimeout
        self.transport = transport
    }

    /// Sends with the subscription's keys as a browser gives them (base64url).
    public func send(
        endpoint: String, p256dh: String, auth: String, payload: WebPushPayload, headers: WebPushHeaders,
        completion: @escaping @Sendable (Outcome, Int?) -> Void
    ) {
        let subscriber: WebPushSubscriber
        do {
            subscriber = try WebPushSubscriber(p256dh: p256dh, auth: auth)
        } catch {
            queue.async { completion(.failed(reason: Self.invalidKeys), nil) }
            return
        }
        send(endpoint: endpoint, subscriber: subscriber, payload: payload, headers: headers, completion: completion)
    }

    /// Sends one push; see the type's documentation. Returns at once.
    public func send(
        endpoint: String, subscriber: WebPushSubscriber, payload: WebPushPayload, headers: WebPushHeaders,
        completion: @escaping @Sendable (Outcome, Int?) -> Void
    ) {
        let ready = Prepared(subscriber: subscriber, payload: payload, headers: headers)
        send(endpoint: endpoint, prepare: { .ready(ready) }, completion: completion)
    }

    /// Sends one push whose subscriber, payload and headers `prepare` makes
    /// on the worker that seals it (in parallel with the other sends, not on
    /// the caller's thread); a failure is reported as the push's outcome.
    public func send(
        endpoint: String, prepare: @escaping @Sendable () -> Preparation,
        completion: @escaping @Sendable (Outcome, Int?) -> Void
    ) {
        enqueue(
            Work(
                endpoint: endpoint, prepare: prepare,
                completion: { outcome, status, _, _ in completion(outcome, status) })
        )
    }

    /// ``send(endpoint:prepare:completion:)``, answering with an
    /// ``AttemptReport`` that also says which shrink step the sealed
    /// record's `web_payload` needed.
    public func send(
        endpoint: String, prepare: @escaping @Sendable () -> Preparation,
        report: @escaping @Sendable (AttemptReport) -> Void
    ) {
        enqueue(
            Work(
                endpoint: endpoint, prepare: prepare,
                completion: { outcome, status, shrink, receipt in
                    report(AttemptReport(outcome: outcome, httpStatus: status, shrink: shrink, receipt: receipt))
                }))
    }

    /// Adds a send to the backlog, starting a worker if fewer than `maxWorkers` run.
    private func enqueue(_ work: Work) {
        let start = backlog.withLock { b -> Bool in
            b.items.append(work)
            guard b.workers < Self.maxWorkers else { return false }
            b.workers += 1
            return true
        }
        if start { queue.async { [self] in drain() } }
    }

    /// How many sends a worker takes next: at most `limit` (which doubles
    /// from `firstChunk` to `chunk` over a worker's run), and a share of a
    /// small backlog, which is split between the workers, not taken whole by one.
    static func take(left: Int, workers: Int, limit: Int) -> Int {
        min(limit, max(1, left / max(1, workers)))
    }

    /// Takes chunks of the backlog until it is empty.
    private func drain() {
        var limit = Self.firstChunk
        while true {
            let chunk = backlog.withLock { b -> ArraySlice<Work> in
                let left = b.items.count - b.next
                guard left > 0 else {
                    b.items.removeAll(keepingCapacity: true)
                    b.next = 0
                    b.workers -= 1
                    return []
                }
                let take = Self.take(left: left, workers: b.workers, limit: limit)
                defer {
                    b.next += take
                    // Under a steady stream the backlog never empties: drop what was taken.
                    if b.next >= 1024 && b.next * 2 >= b.items.count {
                        b.items.removeFirst(b.next)
                        b.next = 0
                    }
                }
                return b.items[b.next..<(b.next + take)]
            }
            guard !chunk.isEmpty else { return }
            limit = min(Self.chunk, limit * 2)
            var outgoing = OriginBatch()
            for w in chunk { process(w, into: &outgoing) }
            transport.send(outgoing)
        }
    }

    private func process(_ w: Work, into outgoing: inout OriginBatch) {
        let checked: CheckedEndpoint
        if let known = w.checked {
            checked = known
        } else {
            let now = endpointGuard.check(w.endpoint) { [self] result in
                // On a resolver thread: the push goes back to the backlog, or ends here.
                switch result {
                case .success(let checked):
                    var again = w
                    again.checked = checked
                    enqueue(again)
                case .failure(let error):
                    w.completion(Self.outcome(refusedBy: error), nil, nil, nil)
                }
            }
            // The lookup is under way: this worker goes on with the next send.
            guard let now else { return }
            switch now {
            case .success(let c): checked = c
            case .failure(let error):
                w.completion(Self.outcome(refusedBy: error), nil, nil, nil)
                return
            }
        }
        let prepared: Prepared
        switch w.prepare() {
        case .ready(let p): prepared = p
        case .refused(let outcome):
            w.completion(outcome, nil, nil, nil)
            return
        }
        attempt(
            checked, subscriber: prepared.subscriber, payload: prepared.payload, headers: prepared.headers,
            notAfter: prepared.notAfter, steppedDown: false, signing: signing(for: prepared.serverKey),
            outgoing: &outgoing, completion: w.completion)
    }

    /// The key a push is signed with, and whether the subscription's own key is retired.
    struct Signing: Sendable {
        let key: P256PrivateKey
        let keyID: String
        /// The subscription was made under a key the app no longer holds
        /// (signed with the current key all the same).
        let retired: Bool
    }

    /// The key that signs a push to a subscription made under `serverKey`
    /// (nil: the current key); see the type's documentation.
    func signing(for serverKey: String?) -> Signing {
        guard let serverKey, serverKey != currentKeyID else {
            return Signing(key: vapidKey, keyID: currentKeyID, retired: false)
        }
        if let previousVapidKey, let previousKeyID, serverKey == previousKeyID {
            return Signing(key: previousVapidKey, keyID: previousKeyID, retired: false)
        }
        return Signing(key: vapidKey, keyID: currentKeyID, retired: true)
    }

    /// Seals and sends one push; a request for the HTTP/2 client is added to
    /// `outgoing` for the caller to hand over, libcurl's go at once.
    private func attempt(
        _ checked: CheckedEndpoint, subscriber: WebPushSubscriber, payload: WebPushPayload, headers: WebPushHeaders,
        notAfter: Int64?, steppedDown: Bool, signing: Signing, outgoing: inout OriginBatch,
        completion finished: @escaping Completion
    ) {
        if let notAfter, clock.nowMilliseconds() > notAfter {
            finished(.transient(reason: .timeout), nil, nil, nil)
            return
        }
        let plaintext = steppedDown ? payload.minimalPlaintext : payload.plaintext
        let bodySize = steppedDown ? payload.stepDownBodySize : payload.bodySize
        guard let body = seal(plaintext, for: subscriber, bodySize: bodySize) else {
            finished(.failed(reason: Self.sealFailure), nil, nil, nil)
            return
        }
        // Sealed: from here every answer says what the record's content needed.
        let shrink = steppedDown ? payload.minimalShrink : payload.shrink
        let completion: @Sendable (Outcome, Int?, ProviderReceipt?) -> Void = { outcome, status, receipt in
            finished(outcome, status, shrink, receipt)
        }
        let origin = checked.origin
        let authorization: String
        do {
            authorization = try tokens.authorization(
                app: app, origin: origin, key: signing.key, keyID: signing.keyID, subject: subject)
        } catch {
            completion(.failed(reason: Self.vapidFailure), nil, nil)
            return
        }
        let answered: @Sendable (ServiceAnswer, ProviderReceipt) -> Void = {
            [self] result, receipt in
            switch result {
            case .unanswered(let failure):
                completion(failure.outcome, nil, receipt)
            case .answered(let status, let retryAfterField):
                let retryAfter = retryAfterField.flatMap { RetryAfter.parse($0, now: clock.nowMilliseconds()) }
                let outcome = WebPushClassifier.classify(
                    status: status, retryAfter: retryAfter, steppedDown: steppedDown)
                if case .authRejected = outcome {
                    if signing.retired {
                        // The subscription is bound to a key Herald no longer
                        // holds: this delivery cannot succeed, and neither the
                        // service nor the current key's token is at fault.
                        completion(.failed(reason: Self.vapidKeyRetired), status, receipt)
                        return
                    }
                    // The service refused the VAPID token: sign a fresh one for the next send.
                    tokens.remove(app: app, origin: origin, keyID: signing.keyID)
                }
                if outcome == .tooLarge && !steppedDown {
                    guard payload.minimalFits else {
                        // No shrink step brings web_payload under the smaller record.
                        completion(.failed(reason: Self.webPayloadTooLarge), status, receipt)
                        return
                    }
                    queue.async { [self] in
                        var again = OriginBatch()
                        attempt(
                            checked, subscriber: subscriber, payload: payload, headers: headers, notAfter: notAfter,
                            steppedDown: true, signing: signing, outgoing: &again, completion: finished)
                        transport.send(again)
                    }
                    return
                }
                completion(outcome, status, receipt)
            }
        }
        var fields = headers.fields
        fields.append(("Authorization", authorization))
        let pinned = checked.addresses.map(\.description)
        let started = monotonicMilliseconds()
        let request = OriginRequest(
            origin: origin, url: checked.url, path: checked.pathAndQuery, headers: fields, body: body,
            notAfter: notAfter, timeout: timeout, connectTimeout: connectTimeout, pinnedAddresses: pinned)
        transport.add(
            request,
            lane: { [transport, http2IdleTimeout] in
                guard transport.carriesHTTP2 else { return nil }
                // Sorted: a resolver that rotates its answers must not open a
                // new connection (lane) per order.
                let addresses = pinned.sorted()
                return transport.lane(
                    "web:\(origin)@\(addresses.joined(separator: ","))", host: checked.host, port: checked.port,
                    addresses: addresses, idleTimeout: http2IdleTimeout)
            }, to: &outgoing
        ) { result in
            var receipt = ProviderReceipt(origin: origin, elapsedMs: monotonicMilliseconds() - started)
            switch result {
            case .success(let response):
                // RFC 8030 §5: the push message's URL, on a 201.
                receipt.location = response.header("location")
                answered(.answered(status: response.status, retryAfter: response.header("retry-after")), receipt)
            case .failure(let failure):
                answered(.unanswered(failure), receipt)
            }
        }
    }

    /// Whether `origin` is currently sent through libcurl because it refused HTTP/2.
    public func usesHTTP1(_ origin: String) -> Bool { transport.usesHTTP1(origin) }

    /// How many origins are remembered as HTTP/1.1-only (at most `maxRememberedHTTP1Origins`).
    public var rememberedHTTP1Origins: Int { transport.rememberedHTTP1Origins }

    private func seal(_ plaintext: [UInt8], for subscriber: WebPushSubscriber, bodySize: Int) -> [UInt8]? {
        let sealer: Locked<WebPushSealer>
        if let pooled = sealers.withLock({ $0.popLast() }) {
            sealer = pooled
        } else {
            guard let made = try? WebPushSealer() else { return nil }
            sealer = Locked(made)
        }
        let body = sealer.withLock { try? $0.seal(plaintext, for: subscriber, bodySize: bodySize) }
        sealers.withLock { pool in
            if pool.count < Self.maxPooledSealers { pool.append(sealer) }
        }
        return body
    }

    /// What a failed send-time check means for the delivery.
    static func outcome(refusedBy error: EndpointError) -> Outcome {
        switch error {
        case .unresolvable, .resolutionFailed:
            // SPEC: DNS failures are transient (the name may come back; the device is kept).
            .transient(reason: .dnsFailure)
        case .malformed, .notPubliclyRoutable:
            .failed(reason: endpointRefused)
        }
    }
}

/// What a push service said to one request, whichever client carried it.
enum ServiceAnswer: Sendable {
    case answered(status: Int, retryAfter: String?)
    case unanswered(OriginFailure)
}
