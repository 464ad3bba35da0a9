/// Polls `condition` every 50 ms until it holds; throws after `timeout`
/// (a wait for a condition, never a timing assertion).
public func waitUntil(
    _ what: String, timeout: Duration = .seconds(10), _ condition: () async throws -> Bool
) async throws {
    let clock = ContinuousClock()
    let deadline = clock.now + timeout
    while try await !condition() {
        guard clock.now < deadline else { throw TestSupportError("timed out waiting until \(what)") }
        try await Task.sleep(for: .milliseconds(50))
    }
}
