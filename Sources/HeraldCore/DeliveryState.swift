/// Where one device's delivery of a message stands, as `push.status` reports it.
public enum DeliveryState: String, Sendable, Hashable, CaseIterable {
    case queued
    /// Queued, and waiting for its time (`not_before`, `at_local`, the
    /// device's quiet hours): the status shows when it is due.
    case held
    case inFlight = "in_flight"
    case delivered
    case retrying
    case failed
    case expired
    case superseded
    case skipped
    case removedStale = "removed_stale"

    /// Whether no further attempt will be made.
    public var isFinal: Bool {
        switch self {
        case .queued, .held, .inFlight, .retrying: false
        case .delivered, .failed, .expired, .superseded, .skipped, .removedStale: true
        }
    }
}

/// Reasons the scheduler and the store both name.
public enum DeliveryReason {
    /// A delivery waiting (`retrying`) because the provider rejected Herald's
    /// credential: not counted toward `max_retries`; due again at once when a
    /// reload brings new credentials, or at a slow cadence, until its TTL passes.
    public static let credentialRejected = "credential_rejected"
    /// A delivery to a device turned off with `device.update` (`enabled:
    /// false`): `skipped` when the message is accepted, or at its next claim
    /// when the device was turned off after that; never sent to a provider.
    public static let deviceDisabled = "device_disabled"
    /// A Web Push delivery waiting (`retrying`) because its push service's
    /// origin stopped answering (`[delivery] webpush_origin_timeouts`
    /// timeouts in a row): not counted toward `max_retries`; tried again
    /// later, one probe at a time, until the origin answers or its TTL passes.
    public static let originUnresponsive = "origin_unresponsive"
}
