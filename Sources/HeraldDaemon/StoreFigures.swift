import HeraldCore
import HeraldIO
import HeraldStore
import Synchronization

/// What `system.stats`, `system.metrics` and `/metrics` read from the store:
/// the queue's depth, the devices and the Web Push subscriptions, per app.
struct StoreFigures: Sendable {
    let depthByApp: [String: QueueDepth]
    let devicesByApp: [String: [Platform: Int]]
    let webSubscriptions: [ServerKeyCount]

    /// Deliveries waiting and in flight over `only`'s apps, or over every app.
    func depth(only: Set<String>?) -> (waiting: Int, inFlight: Int) {
        var total = (waiting: 0, inFlight: 0)
        for (app, depth) in depthByApp where only?.contains(app) ?? true {
            total.waiting += depth.waiting
            total.inFlight += depth.inFlight
        }
        return total
    }

    /// Devices per platform over `only`'s apps, or over every app.
    func devices(only: Set<String>?) -> [Platform: Int] {
        var total: [Platform: Int] = [:]
        for (app, counts) in devicesByApp where only?.contains(app) ?? true {
            for (platform, n) in counts { total[platform, default: 0] += n }
        }
        return total
    }
}

/// The store's figures, read at most once per `maxAgeMs` however many callers
/// ask: the figures are counts over the whole queue and registry, and a
/// client asking in a loop must not turn into a scan per call (issue 27: a
/// stats loop on 20,000 devices made `device.register` 20 times slower). A
/// caller gets figures at most `maxAgeMs` old; callers arriving while a read
/// runs wait for that read and share its answer. A failed read is not kept:
/// every caller waiting on it gets the failure, and the next caller reads again.
///
/// The reads go to the store's reader (SQLite) or its pool (PostgreSQL),
/// never to the SQLite writer. Thread-safe; `completion` runs on a store thread,
/// or on the caller's when the figures are fresh.
final class StoreFiguresCache: Sendable {
    typealias Completion = @Sendable (Result<StoreFigures, any Error>) -> Void

    private struct State {
        var figures: StoreFigures?
        /// Monotonic ms the kept figures were read at.
        var readAt: Int64 = 0
        /// Callers waiting on the read under way (nil: none running).
        var waiting: [Completion]?
        /// Reads made, for tests and `system.stats`.
        var reads = 0
    }

    private let store: any StoreAdministration
    let maxAgeMs: Int64
    private let state = Mutex(State())

    init(store: any StoreAdministration, maxAgeMs: Int64 = 1000) {
        self.store = store
        self.maxAgeMs = maxAgeMs
    }

    /// Store reads made so far.
    var reads: Int { state.withLock { $0.reads } }

    func get(_ completion: @escaping Completion) {
        let now = monotonicMilliseconds()
        enum Next {
            case answer(StoreFigures)
            case wait
            case read
        }
        let next: Next = state.withLock { s in
            if let figures = s.figures, now - s.readAt < maxAgeMs { return .answer(figures) }
            if s.waiting != nil {
                s.waiting!.append(completion)
                return .wait
            }
            s.waiting = [completion]
            s.reads += 1
            return .read
        }
        switch next {
        case .answer(let figures): completion(.success(figures))
        case .wait: break
        case .read: read()
        }
    }

    private func read() {
        let store = self.store
        store.queueDepthByApp { [self] depth in
            do {
                let depthByApp = try depth.get()
                store.deviceCountsByApp { [self] devices in
                    do {
                        let devicesByApp = try devices.get()
                        store.webSubscriptionsByKey { [self] web in
                            finish(
                                web.map {
                                    StoreFigures(
                                        depthByApp: depthByApp, devicesByApp: devicesByApp, webSubscriptions: $0)
                                })
                        }
                    } catch {
                        finish(.failure(error))
                    }
                }
            } catch {
                finish(.failure(error))
            }
        }
    }

    /// Hands `result` to every caller waiting; keeps it when it is figures.
    private func finish(_ result: Result<StoreFigures, any Error>) {
        let waiting: [Completion] = state.withLock { s in
            if case .success(let figures) = result {
                s.figures = figures
                s.readAt = monotonicMilliseconds()
            }
            defer { s.waiting = nil }
            return s.waiting ?? []
        }
        for completion in waiting { completion(result) }
    }
}
