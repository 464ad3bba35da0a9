#if canImport(Glibc)
    import Glibc
#endif

/// Wall-clock time in milliseconds since the Unix epoch, injectable so that
/// expiry and ordering rules can be tested without sleeping.
public protocol WallClock: Sendable {
    func nowMilliseconds() -> Int64
}

/// The system's real-time clock.
public struct SystemClock: WallClock {
    public init() {}

    public func nowMilliseconds() -> Int64 {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return Int64(ts.tv_sec) * 1000 + Int64(ts.tv_nsec) / 1_000_000
    }
}
