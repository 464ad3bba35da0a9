/// One step of a `push.send` `shrink` list: what Herald does to a
/// `web_payload` that does not fit one Web Push record, before it tries again.
/// Pointers are RFC 6901 JSON pointers (`/caller/name`), checked by
/// `push.send`.
public enum ShrinkStep: Sendable, Hashable {
    /// Removes each pointed member or array element that exists.
    case drop([String])
    /// Cuts the pointed string (at a character boundary, ending in `…`) so
    /// that the whole payload fits; a string of nothing that fits becomes "".
    case shorten(String)
    /// Keeps only the pointed values, each at its place; the rest goes.
    case keep([String])

    /// The step's member name in `push.send`: `drop`, `shorten` or `keep`.
    public var name: String {
        switch self {
        case .drop: "drop"
        case .shorten: "shorten"
        case .keep: "keep"
        }
    }
}

/// The content a Web Push-form record carries instead of Herald's own
/// `{kind, data, badge}`: the caller's JSON object, compact, and the steps
/// that shrink it to fit a record. Never sent to a legacy-form device.
public struct WebContent: Sendable, Hashable {
    /// The `web_payload` object as compact JSON text.
    public var payload: String
    /// The `shrink` steps, in the order they are tried.
    public var shrink: [ShrinkStep]

    public init(payload: String, shrink: [ShrinkStep] = []) {
        self.payload = payload
        self.shrink = shrink
    }
}

/// Which shrink step a sealed record's `web_payload` needed.
public enum ShrinkOutcome: Sendable, Hashable {
    /// The payload fitted whole.
    case whole
    /// Steps 0 to N were applied; N is the last (`push.status` `shrunk: N`).
    case step(Int)

    /// N, or nil for a payload that fitted whole.
    public var index: Int? {
        if case .step(let n) = self { n } else { nil }
    }
}
