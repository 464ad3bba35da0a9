extension Duration {
    /// The duration in whole milliseconds, truncated (or rounded up), saturating.
    public func wholeMilliseconds(roundingUp: Bool) -> Int64 {
        let (seconds, attoseconds) = components
        let perMs: Int64 = 1_000_000_000_000_000
        var ms = attoseconds / perMs
        if roundingUp, attoseconds % perMs > 0 { ms += 1 }
        let (whole, overflow) = seconds.multipliedReportingOverflow(by: 1000)
        if overflow { return seconds < 0 ? .min : .max }
        let (sum, overflow2) = whole.addingReportingOverflow(ms)
        if overflow2 { return seconds < 0 ? .min : .max }
        return sum
    }

    public var wholeMilliseconds: Int64 { wholeMilliseconds(roundingUp: false) }
}
