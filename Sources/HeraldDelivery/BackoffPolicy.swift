/// When to try a failed delivery again: exponential backoff with full jitter,
/// a provider's `Retry-After` as a floor, at most `maxRetries` retries, and
/// never at or past the message's TTL deadline.
///
/// Pure and deterministic given the random source, so it can be tested and
/// replayed with a seeded generator.
public struct BackoffPolicy: Sendable, Hashable {
    /// Retries allowed after the first attempt (`[delivery] max_retries`).
    public var maxRetries: Int
    /// The jitter cap of the first retry (`backoff_base_ms`).
    public var base: Duration
    /// The largest jitter cap (`backoff_max_ms`).
    public var max: Duration

    public init(maxRetries: Int = 5, base: Duration = .milliseconds(1000), max: Duration = .milliseconds(300_000)) {
        self.maxRetries = maxRetries
        self.base = base
        self.max = max
    }

    public enum GiveUp: String, Sendable, Hashable {
        /// `maxRetries` retries were already made: the delivery ends `failed`.
        case exhausted
        /// No retry fits before the TTL deadline: the delivery ends `expired`.
        case expired
    }

    public enum Decision: Sendable, Hashable {
        /// Send again at this time (ms since the epoch), which is before the deadline.
        case retry(at: Int64)
        case giveUp(GiveUp)
    }

    /// The jitter cap for retry number `attempt + 1`: `min(max, base · 2^attempt)`, in ms.
    public func cap(attempt: Int) -> Int64 {
        let baseMs = Swift.max(0, base.wholeMilliseconds)
        let maxMs = Swift.max(0, max.wholeMilliseconds)
        let shift = Swift.max(0, attempt)
        guard baseMs > 0 else { return 0 }
        // base · 2^shift ≥ maxMs as soon as 2^shift ≥ maxMs / base; stop before overflowing.
        guard shift < 63, baseMs <= maxMs >> Int64(shift) else { return maxMs }
        return Swift.min(maxMs, baseMs << Int64(shift))
    }

    /// Decides the next step after a failed attempt.
    ///
    /// - Parameters:
    ///   - attempt: retries already made for this delivery (0 after the first send fails).
    ///   - retryAfter: the provider's `Retry-After`, a lower bound on the delay; not capped by `max`.
    ///   - now: the current time, ms since the epoch.
    ///   - deadline: the end of the message's TTL, ms since the epoch.
    ///   - random: the jitter source.
    ///
    /// The delay is drawn uniformly from `[0, cap(attempt)]` (full jitter) and
    /// raised to `retryAfter`. If that would land at or past `deadline`, the draw
    /// is confined to the time left, so an unlucky draw never forfeits a retry;
    /// only when even `retryAfter` does not fit is the answer `expired`.
    /// Exhaustion is checked first.
    public func next(
        attempt: Int, retryAfter: Duration?, now: Int64, deadline: Int64, random: inout some RandomNumberGenerator
    ) -> Decision {
        if attempt >= maxRetries { return .giveUp(.exhausted) }
        let floor = Swift.max(0, retryAfter?.wholeMilliseconds(roundingUp: true) ?? 0)
        let (earliest, overflow) = now.addingReportingOverflow(floor)
        guard !overflow, earliest < deadline else { return .giveUp(.expired) }
        let room = deadline - 1 - now  // the largest delay that stays before the deadline; ≥ floor here
        let upper = Swift.min(cap(attempt: attempt), room)
        let jitter = upper > 0 ? Int64.random(in: 0...upper, using: &random) : 0
        return .retry(at: now + Swift.max(floor, jitter))
    }
}
