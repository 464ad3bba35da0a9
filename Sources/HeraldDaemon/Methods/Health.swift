/// The store's last probe, as `system.health` reports it.
enum StoreHealth: Equatable, Sendable {
    case ok
    case degraded(String)

    /// `ok` or `degraded:<why>`.
    var wire: String {
        switch self {
        case .ok: "ok"
        case .degraded(let why): "degraded:\(why)"
        }
    }

    var isOK: Bool { self == .ok }
}

/// One transport of an app, as `system.health` and the metrics report it.
enum TransportState: Equatable, Sendable {
    case ready
    /// No usable credentials (the reason names what is missing).
    case disabled(String)
    /// Configured, but the provider refuses it or cannot be reached.
    case degraded(String)

    /// The state's name alone: `ready`, `disabled` or `degraded` (a metrics label).
    var kind: String {
        switch self {
        case .ready: "ready"
        case .disabled: "disabled"
        case .degraded: "degraded"
        }
    }

    static let kinds = ["ready", "disabled", "degraded"]

    /// Ready, or disabled for `reason` (a credential's state at load).
    init(_ disabledReason: String?) {
        self = disabledReason.map { .disabled($0) } ?? .ready
    }

    /// `ready`, `disabled:<why>` or `degraded:<why>`.
    var wire: String {
        switch self {
        case .ready: "ready"
        case .disabled(let why): "disabled:\(why)"
        case .degraded(let why): "degraded:\(why)"
        }
    }
}
