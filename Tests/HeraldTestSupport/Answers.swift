import Foundation
public import HeraldNet

/// Collects the answers of asynchronous name lookups, by name.
public final class Answers: @unchecked Sendable {
    private let lock = NSCondition()
    private var results: [String: Result<[IPAddress], ResolverError>] = [:]
    private var order: [String] = []

    public init() {}

    public func record(_ name: String) -> @Sendable (Result<[IPAddress], ResolverError>) -> Void {
        { result in
            self.lock.lock()
            self.results[name] = result
            self.order.append(name)
            self.lock.broadcast()
            self.lock.unlock()
        }
    }

    /// Waits (up to `seconds`) until `count` answers came; true if they did.
    public func wait(for count: Int, seconds: Double = 10) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        lock.lock()
        defer { lock.unlock() }
        while results.count < count {
            if !lock.wait(until: deadline) { return results.count >= count }
        }
        return true
    }

    public subscript(_ name: String) -> Result<[IPAddress], ResolverError>? {
        lock.lock()
        defer { lock.unlock() }
        return results[name]
    }

    public var arrivalOrder: [String] {
        lock.lock()
        defer { lock.unlock() }
        return order
    }
}
