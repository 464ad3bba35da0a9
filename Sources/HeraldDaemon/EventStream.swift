import HeraldIO
import HeraldJSON
import HeraldStore

/// What the event stream needs of the socket server (loop thread only).
protocol StreamSink: AnyObject {
    /// Queues one line (a notification) for the connection; false when it is gone.
    func streamWrite(_ connID: UInt64, _ bytes: [UInt8]) -> Bool
    /// The connection's unsent output; nil when it is gone.
    func streamUnsent(_ connID: UInt64) -> Int?
    /// Counts `n` bytes held for the connection against its `max_reply_bytes`,
    /// its uid's and the process's budgets, if they fit.
    func streamReserve(_ connID: UInt64, _ n: Int) -> Bool
    func streamRelease(_ connID: UInt64, _ n: Int)
    /// The connection streams from now on (not closed for idling); false when it is gone.
    func streamStart(_ connID: UInt64) -> Bool
    func streamStop(_ connID: UInt64)
    /// Calls the stream's `drained` once the unsent output falls below ``EventStream/lowWater``.
    func streamWantsDrain(_ connID: UInt64)
}

/// The event stream of `events.subscribe` (loop thread only).
///
/// Every event is in the store, written with the change it reports. One
/// feed per process reads what is new (every ``pollMs`` while anyone
/// subscribes) and hands it to the live subscribers; a subscriber that
/// gave `since` first reads its backlog from the store itself, page by
/// page as its connection takes them, and joins the feed once it has
/// caught up. A live subscriber's waiting events are bounded by
/// `[server] event_buffer_bytes` (and the connection's budgets): past it
/// they are dropped, and once its connection drains it is sent one `gap`
/// event with the cursor to replay from, then what comes after. A slow
/// subscriber therefore costs its buffer, never the delivery's pace.
// @unchecked: every mutable field is touched on the event loop's thread only.
final class EventStream: @unchecked Sendable {
    /// Notifications are written while the connection's unsent output is below this.
    static let lowWater = 64 * 1024
    /// Events in one notification at the most.
    static let batchEvents = 256
    /// Events read from the store in one page.
    static let pageLimit = 512
    /// Before every event: where a stream starts when there is none yet.
    static let origin = EventCursor(low: 0)
    /// How often the feed looks for new events while anyone subscribes.
    static let pollMs: Int64 = 100

    enum Mode {
        /// Waiting for the feed's head to start from (no `since`).
        case starting
        /// Reading its backlog from the store.
        case replaying
        /// Fed by the feed.
        case live
        /// Its buffer overflowed: a `gap` event waits for the connection to drain.
        case gapped
    }

    // @unchecked: touched on the event loop's thread only (store answers hop back to it).
    final class Subscriber: @unchecked Sendable {
        let connID: UInt64
        /// nil: every app (the peer is allowed for all).
        let apps: Set<String>?
        /// nil: every kind.
        let kinds: Set<String>?
        /// The last event examined: the next read starts after it.
        var cursor: EventCursor?
        /// The cursor through which the connection was written what it
        /// wants (from its start cursor on): a gap resumes from it.
        var sent: EventCursor
        var mode: Mode
        var queue: [Rendered] = []
        var queueHead = 0
        var queuedBytes = 0
        /// A store read of its backlog is on its way.
        var reading = false
        /// Whether the retention was checked against `since`.
        var retentionChecked = false

        init(connID: UInt64, apps: Set<String>?, kinds: Set<String>?, cursor: EventCursor?, mode: Mode) {
            self.connID = connID
            self.apps = apps
            self.kinds = kinds
            self.cursor = cursor
            sent = cursor ?? EventStream.origin
            self.mode = mode
            retentionChecked = mode != .replaying
        }

        func wants(_ e: StoredEvent) -> Bool {
            (apps?.contains(e.app) ?? true) && (kinds?.contains(e.kind) ?? true)
        }
    }

    /// An event serialised once, for every subscriber it goes to.
    struct Rendered {
        let cursor: EventCursor
        let bytes: [UInt8]
    }

    private let store: any EventLog
    private unowned(unsafe) let sink: any StreamSink
    private let loop: EventLoop
    private let log: Logger
    let bufferBytes: Int
    private var subscribers: [UInt64: Subscriber] = [:]
    /// The newest event the feed has handed out (nil: none exists).
    private var head: EventCursor?
    private var headKnown = false
    private var headAsked = false
    private var polling = false
    /// Subscriptions waiting for the head before they are answered.
    private var waitingForHead: [(Subscriber, @Sendable (EventCursor?) -> Void)] = []
    /// The store failed the last read: logged once, until one succeeds.
    private var failing = false

    init(store: any EventLog, sink: any StreamSink, loop: EventLoop, log: Logger, bufferBytes: Int) {
        self.store = store
        self.sink = sink
        self.loop = loop
        self.log = log
        self.bufferBytes = bufferBytes
    }

    /// Starts the feed's timer (on the loop thread, before `run`).
    func start() {
        loop.every(milliseconds: Self.pollMs) { [self] in poll() }
    }

    // MARK: Subscribing

    /// Subscribes the connection: from `since` (nil: from now). `started`
    /// runs on the loop with the cursor it starts from, before any event
    /// is written to it; the call's answer goes out there.
    func subscribe(
        connID: UInt64, apps: Set<String>?, kinds: Set<String>?, since: EventCursor?,
        started: @escaping @Sendable (EventCursor?) -> Void
    ) {
        loop.preconditionInLoop()
        remove(connID)
        guard sink.streamStart(connID) else { return }
        if let since {
            let s = Subscriber(connID: connID, apps: apps, kinds: kinds, cursor: since, mode: .replaying)
            subscribers[connID] = s
            started(since)
            askHead()
            // The answer is written first: the backlog is read on a later turn.
            loop.execute { [self] in readBacklog(s) }
            return
        }
        let s = Subscriber(connID: connID, apps: apps, kinds: kinds, cursor: nil, mode: .starting)
        subscribers[connID] = s
        if headKnown {
            s.cursor = head ?? Self.origin
            s.sent = s.cursor!
            s.mode = .live
            started(s.cursor)
        } else {
            waitingForHead.append((s, started))
            askHead()
        }
    }

    /// Ends the connection's subscription: unsubscribed, or the connection
    /// closed (its budgets and output are gone with it; what is released
    /// here then touches nothing).
    @discardableResult
    func remove(_ connID: UInt64) -> Bool {
        loop.preconditionInLoop()
        guard let s = subscribers.removeValue(forKey: connID) else { return false }
        drop(s)
        sink.streamStop(connID)
        if subscribers.isEmpty {
            // The head goes stale while no one reads: asked again by the next.
            headKnown = false
            waitingForHead.removeAll()
        }
        return true
    }

    /// The connection's unsent output fell below ``lowWater``.
    func drained(_ connID: UInt64) {
        loop.preconditionInLoop()
        guard let s = subscribers[connID] else { return }
        switch s.mode {
        case .replaying: readBacklog(s)
        case .live, .gapped: pump(s)
        case .starting: break
        }
    }

    // MARK: The feed

    private func askHead() {
        guard !headKnown, !headAsked else { return }
        headAsked = true
        store.eventsHead { [self] result in
            loop.execute { [self] in
                headAsked = false
                switch result {
                case .success(let cursor):
                    guard !subscribers.isEmpty else { return }
                    head = cursor
                    headKnown = true
                    let waiting = waitingForHead
                    waitingForHead.removeAll()
                    for (s, started) in waiting where subscribers[s.connID] === s {
                        s.cursor = cursor ?? Self.origin
                        s.sent = s.cursor!
                        s.mode = .live
                        started(s.cursor)
                    }
                case .failure(let error):
                    readFailed(error)
                }
            }
        }
    }

    private func poll() {
        guard !subscribers.isEmpty else { return }
        for s in subscribers.values where s.mode == .replaying && !s.reading { readBacklog(s) }
        guard headKnown else { return askHead() }
        guard !polling else { return }
        polling = true
        store.events(after: head, limit: Self.pageLimit) { [self] result in
            loop.execute { [self] in
                polling = false
                switch result {
                case .success(let page):
                    readSucceeded()
                    feed(page.events)
                    // A full page: more is waiting.
                    if page.events.count == Self.pageLimit { poll() }
                case .failure(let error):
                    readFailed(error)
                }
            }
        }
    }

    /// Logs the first of a run of failed reads (tried again every ``pollMs``), and the recovery.
    private func readFailed(_ error: any Error) {
        guard !failing else { return }
        failing = true
        log.warning("events_read_failed", ["error": String(describing: error)])
    }

    private func readSucceeded() {
        guard failing else { return }
        failing = false
        log.info("events_read_recovered", [:])
    }

    /// Hands new events to the live subscribers.
    private func feed(_ events: [StoredEvent]) {
        guard headKnown, let last = events.last else { return }
        if let head, last.cursor <= head { return }
        let live = subscribers.values.filter { $0.mode == .live || $0.mode == .gapped }
        for e in events {
            if let head, e.cursor <= head { continue }
            var rendered: Rendered?
            for s in live where s.mode == .live {
                if let c = s.cursor, e.cursor <= c { continue }
                s.cursor = e.cursor
                guard s.wants(e) else { continue }
                if rendered == nil { rendered = Rendered(cursor: e.cursor, bytes: Self.render(e)) }
                enqueue(rendered!, to: s)
            }
        }
        head = last.cursor
        for s in live { pump(s) }
    }

    private func enqueue(_ r: Rendered, to s: Subscriber) {
        let n = r.bytes.count
        // Written first, what the connection takes now.
        if s.queuedBytes + n > bufferBytes { pump(s) }
        guard s.mode == .live, s.queuedBytes + n <= bufferBytes, sink.streamReserve(s.connID, n) else {
            // Past its buffer: what waits is dropped, and the subscriber is
            // told where to replay from once it reads again.
            drop(s)
            s.mode = .gapped
            return
        }
        s.queue.append(r)
        s.queuedBytes += n
    }

    private func drop(_ s: Subscriber) {
        if s.queuedBytes > 0 { sink.streamRelease(s.connID, s.queuedBytes) }
        s.queue.removeAll()
        s.queueHead = 0
        s.queuedBytes = 0
    }

    /// Writes what waits while the connection takes it.
    private func pump(_ s: Subscriber) {
        while let unsent = sink.streamUnsent(s.connID), unsent < Self.lowWater {
            if s.mode == .gapped {
                let resume = s.sent
                log.info("events_gap", ["conn": String(s.connID), "resume": resume.description, "reason": "slow"])
                _ = sink.streamWrite(s.connID, Self.notification(cursor: resume, [Self.gap(resume, reason: "slow")]))
                // Live again from the newest event the feed handed out.
                s.cursor = head ?? Self.origin
                s.sent = s.cursor!
                s.mode = .live
                continue
            }
            guard s.queueHead < s.queue.count else { return }
            let end = min(s.queue.count, s.queueHead + Self.batchEvents)
            let batch = s.queue[s.queueHead..<end]
            let bytes = batch.reduce(0) { $0 + $1.bytes.count }
            let last = batch.last!.cursor
            _ = sink.streamWrite(s.connID, Self.notification(cursor: last, batch.map(\.bytes)))
            sink.streamRelease(s.connID, bytes)
            s.queuedBytes -= bytes
            s.sent = last
            s.queueHead = end
            if s.queueHead == s.queue.count {
                s.queue.removeAll(keepingCapacity: true)
                s.queueHead = 0
            }
        }
        if sink.streamUnsent(s.connID) != nil, s.mode == .gapped || s.queueHead < s.queue.count {
            sink.streamWantsDrain(s.connID)
        }
    }

    // MARK: A subscriber's backlog

    /// Reads the next page after the subscriber's cursor, if its connection takes it.
    private func readBacklog(_ s: Subscriber) {
        guard subscribers[s.connID] === s, s.mode == .replaying, !s.reading else { return }
        guard let unsent = sink.streamUnsent(s.connID) else { return }
        guard unsent < Self.lowWater else { return sink.streamWantsDrain(s.connID) }
        s.reading = true
        store.events(after: s.cursor, limit: Self.pageLimit) { [self] result in
            loop.execute { [self] in
                s.reading = false
                guard subscribers[s.connID] === s else { return }
                switch result {
                case .success(let page):
                    replayed(s, page)
                case .failure(let error):
                    // Read again on the feed's next turn.
                    readFailed(error)
                }
            }
        }
    }

    private func replayed(_ s: Subscriber, _ page: EventPage) {
        if !s.retentionChecked {
            s.retentionChecked = true
            if let purged = page.purgedThrough, let since = s.cursor, since < purged {
                // Events between `since` and the oldest kept are gone.
                _ = sink.streamWrite(
                    s.connID, Self.notification(cursor: purged, [Self.gap(purged, reason: "retention")]))
            }
        }
        var batch: [[UInt8]] = []
        for e in page.events {
            s.cursor = e.cursor
            guard s.wants(e) else { continue }
            batch.append(Self.render(e))
            if batch.count == Self.batchEvents {
                _ = sink.streamWrite(s.connID, Self.notification(cursor: e.cursor, batch))
                s.sent = e.cursor
                batch.removeAll(keepingCapacity: true)
            }
        }
        if !batch.isEmpty, let c = s.cursor {
            _ = sink.streamWrite(s.connID, Self.notification(cursor: c, batch))
            s.sent = c
        }
        let caughtUp = page.events.count < Self.pageLimit
        if caughtUp && headKnown && (head == nil || (s.cursor.map { $0 >= head! } ?? false)) {
            // Everything the feed handed out is behind it: fed from now on.
            s.mode = .live
            return
        }
        if caughtUp {
            // The feed is ahead (or its head unknown): read again on its next turn.
            if !headKnown { askHead() }
        } else {
            readBacklog(s)
        }
    }

    // MARK: Wire form

    /// `{"jsonrpc":"2.0","method":"events","params":{"cursor":…,"events":[…]}}`
    static func notification(cursor: EventCursor?, _ events: [[UInt8]]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(events.reduce(96) { $0 + $1.count + 1 })
        out += Array(#"{"jsonrpc":"2.0","method":"events","params":{"cursor":"#.utf8)
        out += cursor.map { JSON.string($0.description).serialized() } ?? Array("null".utf8)
        out += Array(#","events":["#.utf8)
        for (i, e) in events.enumerated() {
            if i > 0 { out.append(UInt8(ascii: ",")) }
            out += e
        }
        out += Array("]}}".utf8)
        return out
    }

    static func gap(_ resume: EventCursor?, reason: String) -> [UInt8] {
        JSON.object([
            "kind": "gap", "cursor": resume.map { .string($0.description) } ?? .null, "reason": .string(reason),
        ]).serialized()
    }

    /// One event as subscribers read it.
    static func render(_ e: StoredEvent) -> [UInt8] {
        var o: JSONObject = [
            "cursor": .string(e.cursor.description), "kind": .string(e.kind), "at": .string(Timestamp.rfc3339(e.at)),
            "app": .string(e.app),
        ]
        if let v = e.messageID { o.append("message_id", .string(v)) }
        if let v = e.deviceID { o.append("device_id", .string(v)) }
        if let v = e.user { o.append("user", .string(v)) }
        if let v = e.platform { o.append("platform", .string(v)) }
        if let v = e.state { o.append("state", .string(v)) }
        if e.kind == EventKind.delivery.rawValue || e.reason != nil {
            o.append("reason", e.reason.map { .string($0) } ?? .null)
        }
        if e.kind == EventKind.delivery.rawValue {
            o.append("http_status", e.httpStatus.map { .int($0) } ?? .null)
            if let v = e.requestID { o.append("apns_id", .string(v)) }
            o.append("provider_id", e.providerID.map { .string($0) } ?? .null)
        }
        if let detail = e.detail, let parsed = try? JSONParser.parse(Array(detail.utf8)) {
            if e.kind == EventKind.delivery.rawValue {
                // A held delivery: when it is due, and why it waits.
                if let due = parsed["due_at"]?.numberValue?.int64 {
                    o.append("due_at", .string(Timestamp.rfc3339(due)))
                }
                let notes = parsed["timing"]?.stringValue?.split(separator: ",").map { JSON.string(String($0)) }
                o.append("timing", .array(notes ?? []))
            } else if e.kind == EventKind.messageComplete.rawValue {
                o.append("counts", parsed)
            } else {
                o.append("detail", parsed)
            }
        } else if e.kind == EventKind.messageComplete.rawValue {
            o.append("counts", .object([:]))
        }
        return JSON.object(o).serialized()
    }
}
