import HTTP2
import HeraldCore
import HeraldIO
import HeraldScheduler
import HeraldStore
import JSONRPC
import HeraldNet

/// The Prometheus text exposition format (version 0.0.4): `# HELP` and
/// `# TYPE` once per family, then its samples.
struct PrometheusText {
    static let contentType = "text/plain; version=0.0.4; charset=utf-8"

    private(set) var text = ""

    enum Kind: String {
        case counter, gauge, histogram
    }

    mutating func family(_ name: String, _ kind: Kind, _ help: String) {
        text += "# HELP \(name) \(help)\n# TYPE \(name) \(kind.rawValue)\n"
    }

    mutating func sample(_ name: String, _ labels: KeyValuePairs<String, String> = [:], _ value: Int) {
        sample(name, labels, String(value))
    }

    mutating func sample(_ name: String, _ labels: KeyValuePairs<String, String> = [:], _ value: String) {
        text += name
        if !labels.isEmpty {
            text += "{" + labels.map { "\($0.key)=\"\(Self.escape($0.value))\"" }.joined(separator: ",") + "}"
        }
        text += " \(value)\n"
    }

    /// A family with one sample, for the common case.
    mutating func single(_ name: String, _ kind: Kind, _ help: String, _ value: Int) {
        family(name, kind, help)
        sample(name, [:], value)
    }

    /// Label values escape backslash, double quote and newline.
    static func escape(_ value: String) -> String {
        var out = ""
        for c in value {
            switch c {
            case "\\": out += "\\\\"
            case "\"": out += "\\\""
            case "\n": out += "\\n"
            default: out.append(c)
            }
        }
        return out
    }

    /// Seconds with microsecond precision, as Prometheus expects floats.
    static func seconds(microseconds: Int64) -> String {
        let whole = microseconds / 1_000_000
        let fraction = String(microseconds % 1_000_000)
        return "\(whole).\(String(repeating: "0", count: 6 - fraction.count))\(fraction)"
    }

    /// A bucket bound as Prometheus writes it (`0.005`, `1`, `+Inf`).
    static func bound(_ value: Double) -> String {
        value == value.rounded() ? String(Int(value)) : String(value)
    }
}

extension HeraldService {
    /// The daemon's figures in the Prometheus text format, for
    /// `system.metrics` and the `/metrics` listener. Runs on the loop thread;
    /// `completion` runs on the store's thread. With `only` (a peer that may
    /// call only those apps): the app figures over those apps, and none of the
    /// figures kept for the daemon as a whole (sends, outcomes, provider connections).
    /// `appFigures`: each app's transport states (`herald_transport_state`,
    /// with an `app` label); else how many apps are in each state
    /// (`herald_transport_apps`), for a listener whose scrapers should not
    /// learn the apps' names (`[metrics] app_figures`).
    func metrics(
        only: Set<String>? = nil, appFigures: Bool, completion: @escaping @Sendable (Result<String, RPCError>) -> Void
    ) {
        // What the loop owns is read here; the text is made on the figures'
        // queue (``storeFigures``), not on the loop.
        let server = serverStats()
        let instance = self.instance
        let uptime = Int((monotonicMilliseconds() - startedAt) / 1000)
        let ready = serving && storeHealth.isOK
        let rateLimited = self.rateLimited
        let reloads = self.reloads
        let degraded = delivery?.scheduler.degradedLanes ?? [:]
        let transports: [(String, [Platform])] = [
            ("apns", Platform.allCases.filter(\.isAPNs)), ("fcm", [.fcm]), ("web", [.web, .unifiedPush]),
        ]
        var states: [(app: String, transport: String, kind: String)] = []
        for name in apps.keys.sorted() where only?.contains(name) ?? true {
            for (transport, platforms) in transports {
                states.append((name, transport, transportState(apps[name]!, platforms, degraded: degraded).kind))
            }
        }
        let credentials = (credentialHealth?.states ?? [:]).filter { only?.contains($0.key.app) ?? true }
        let daemonWide =
            only == nil
            ? (
                scheduler: delivery?.scheduler.stats ?? SchedulerStats(),
                connections: delivery?.providers.connectionStats ?? [:],
                dns: delivery?.providers.resolvers.stats ?? []
            ) : nil
        storeFigures(for: "metrics", failure: { completion(.failure($0)) }) { [states, credentials] figures in
            var m = PrometheusText()
            m.family("herald_build_info", .gauge, "Herald's version and this instance's name; always 1.")
            m.sample("herald_build_info", ["version": Self.version, "herald_instance": instance], 1)
            m.single("herald_uptime_seconds", .gauge, "Seconds since the daemon started.", uptime)
            m.single("herald_ready", .gauge, "1 while the daemon serves and its store answers, else 0.", ready ? 1 : 0)
            m.single("herald_client_connections", .gauge, "Client connections open on the socket.", server.open)
            m.single(
                "herald_client_connections_accepted_total", .counter, "Client connections accepted.",
                server.counters.accepted)
            m.single(
                "herald_client_connections_refused_total", .counter,
                "Client connections refused (connection limit reached).", server.counters.refused)
            m.single(
                "herald_client_accept_pauses_total", .counter,
                "Times the socket's listener was left alone until the next sweep: accept found no free descriptor or memory.",
                server.counters.acceptPauses)
            m.single(
                "herald_client_budget_pauses_total", .counter,
                "Times a connection stopped being read because its uid's connections (max_uid_bytes) or all of them (max_client_bytes) held their budget.",
                server.counters.budgetPauses)
            m.single(
                "herald_client_connections_shed_total", .counter,
                "Connections closed because all connections together held past max_client_bytes for a second.",
                server.counters.shed)
            m.single(
                "herald_client_held_bytes", .gauge,
                "Bytes the client connections hold: answers owed and decoded calls not yet run (against max_client_bytes).",
                server.counters.heldBytes)
            m.single("herald_rpc_requests_total", .counter, "JSON-RPC requests answered.", server.counters.requests)
            m.single(
                "herald_rpc_errors_total", .counter, "JSON-RPC requests answered with an error.", server.counters.errors
            )
            m.single("herald_rpc_rate_limited_total", .counter, "Calls refused with rate_limited.", rateLimited)
            m.single(
                "herald_rpc_overloaded_total", .counter,
                "Answers replaced by overloaded (a connection's max_reply_bytes) and batches refused as too large.",
                server.counters.overloaded)
            m.single(
                "herald_client_request_timeouts_total", .counter,
                "Connections closed because a message was not complete within request_timeout_ms.",
                server.counters.timedOut)
            m.family("herald_config_reloads_total", .counter, "Configuration reloads (SIGHUP), by result.")
            m.sample("herald_config_reloads_total", ["result": "applied"], reloads.applied)
            m.sample("herald_config_reloads_total", ["result": "refused"], reloads.refused)

            if appFigures {
                m.family(
                    "herald_transport_state", .gauge,
                    "1 for the state each app's transport is in (ready, disabled or degraded).")
                for state in states {
                    for candidate in TransportState.kinds {
                        m.sample(
                            "herald_transport_state",
                            ["app": state.app, "transport": state.transport, "state": candidate],
                            candidate == state.kind ? 1 : 0)
                    }
                }
            } else {
                m.family(
                    "herald_transport_apps", .gauge,
                    "Apps whose transport is in each state (ready, disabled or degraded).")
                for (transport, _) in transports {
                    for candidate in TransportState.kinds {
                        m.sample(
                            "herald_transport_apps", ["transport": transport, "state": candidate],
                            states.filter { $0.transport == transport && $0.kind == candidate }.count)
                    }
                }
            }

            Self.credentialMetrics(credentials, perApp: appFigures, into: &m)

            if let daemonWide {
                Self.schedulerMetrics(daemonWide.scheduler, into: &m)
                Self.connectionMetrics(daemonWide.connections, into: &m)
                Self.dnsMetrics(daemonWide.dns, into: &m)
            }

            let depth = figures.depth(only: only)
            let counts = figures.devices(only: only)
            m.single("herald_queue_depth", .gauge, "Deliveries waiting (due now or later).", depth.waiting)
            m.single(
                "herald_queue_in_flight", .gauge, "Deliveries claimed and not yet recorded (in the store).",
                depth.inFlight)
            m.family("herald_devices", .gauge, "Registered devices, by platform.")
            for platform in Platform.allCases where platform.isDevicePlatform {
                m.sample("herald_devices", ["platform": platform.rawValue], counts[platform] ?? 0)
            }
            completion(.success(m.text))
        }
    }

    /// `herald_credential_ok` and `herald_credential_last_success_seconds`,
    /// declared even before any check. `perApp`: per app and platform;
    /// otherwise per platform over every app (the least proven one), so a
    /// scraper does not learn the apps' names. A credential not yet checked
    /// has no `ok` sample, one never proven no `last_success` sample.
    static func credentialMetrics(
        _ credentials: [CredentialKey: CredentialState], perApp: Bool, into m: inout PrometheusText
    ) {
        m.family(
            "herald_credential_ok", .gauge,
            "1 when the credential's last check proved it, 0 when the provider refused it or could not be reached.")
        if perApp {
            for (key, state) in credentials.sorted(by: { $0.key < $1.key }) where state.checkedAt != nil {
                m.sample(
                    "herald_credential_ok", ["app": key.app, "platform": key.platform], state.status == "ok" ? 1 : 0)
            }
        } else {
            for platform in Set(credentials.keys.map(\.platform)).sorted() {
                let checked = credentials.filter { $0.key.platform == platform && $0.value.checkedAt != nil }
                guard !checked.isEmpty else { continue }
                m.sample(
                    "herald_credential_ok", ["platform": platform],
                    checked.allSatisfy { $0.value.status == "ok" } ? 1 : 0)
            }
        }
        m.family(
            "herald_credential_last_success_seconds", .gauge,
            "Unix time of the credential's last successful check; absent before the first.")
        if perApp {
            for (key, state) in credentials.sorted(by: { $0.key < $1.key }) {
                guard let at = state.lastSuccessAt else { continue }
                m.sample(
                    "herald_credential_last_success_seconds", ["app": key.app, "platform": key.platform], Int(at / 1000)
                )
            }
        } else {
            for platform in Set(credentials.keys.map(\.platform)).sorted() {
                let times = credentials.filter { $0.key.platform == platform }.map { $0.value.lastSuccessAt }
                // The oldest success over the apps, once every app has one.
                guard !times.isEmpty, times.allSatisfy({ $0 != nil }) else { continue }
                m.sample(
                    "herald_credential_last_success_seconds", ["platform": platform],
                    Int(times.compactMap { $0 }.min()! / 1000))
            }
        }
    }

    private static func schedulerMetrics(_ s: SchedulerStats, into m: inout PrometheusText) {
        m.single("herald_in_flight", .gauge, "Sends in flight or waiting for room on their lane.", s.inFlight)
        m.single("herald_stale_held", .gauge, "Stale devices waiting for their batch's verdict.", s.staleHeld)
        m.single(
            "herald_store_held_results", .gauge,
            "Results the store failed to take (a database outage), held in memory and written again.", s.heldResults)
        m.single(
            "herald_store_held_results_dropped_total", .counter,
            "Held results dropped past the bound (their deliveries stay in flight in the store and are sent again).",
            s.heldResultsDropped)
        m.single(
            "herald_handed_over_total", .counter, "Deliveries sent straight from their message's commit (no claim).",
            s.handedOver)
        m.single(
            "herald_webpush_origin_waiting", .gauge,
            "Web Push deliveries claimed and waiting for a slot of their origin (webpush_origin_inflight).",
            s.originWaiting)
        m.single(
            "herald_webpush_origins_unresponsive", .gauge,
            "Web Push origins whose requests timed out webpush_origin_timeouts times in a row, probed one send at a time.",
            s.originsUnresponsive)
        m.single(
            "herald_webpush_origin_deferred_total", .counter,
            "Web Push deliveries put back in the queue because their origin is unresponsive (origin_unresponsive).",
            s.originDeferred)
        m.single("herald_lane_floor", .gauge, "Send slots each lane keeps for itself out of max_inflight.", s.laneFloor)
        let platforms = Platform.allCases
        func counter(_ name: String, _ help: String, _ value: (PlatformCounters) -> Int) {
            m.family(name, .counter, help)
            for p in platforms {
                m.sample(name, ["platform": p.rawValue], value(s.platforms[p] ?? PlatformCounters()))
            }
        }
        counter("herald_sends_total", "Attempts handed to the transport.") { $0.sent }
        m.family(
            "herald_outcomes_total", .counter,
            "Attempts by outcome: delivered, failed (final), expired (TTL passed), auth_rejected (credentials refused; retried)."
        )
        for p in platforms {
            let c = s.platforms[p] ?? PlatformCounters()
            for (outcome, value) in [
                ("delivered", c.delivered), ("failed", c.failed), ("expired", c.expired),
                ("auth_rejected", c.authRejected),
            ] {
                m.sample("herald_outcomes_total", ["platform": p.rawValue, "outcome": outcome], value)
            }
        }
        counter("herald_retries_total", "Attempts that ended with a retry scheduled.") { $0.retried }
        counter("herald_stale_removed_total", "Devices deleted after a stale answer (410, Unregistered…).") {
            $0.removedStale
        }
        counter("herald_stale_refused_total", "Stale deletions refused by the batch breaker or the window cap.") {
            $0.staleRefused
        }
        counter("herald_breaker_trips_total", "Times the stale batch breaker tripped.") { $0.breakerTrips }

        let name = "herald_send_duration_seconds"
        m.family(name, .histogram, "Time from handing an attempt to the transport to its answer.")
        for p in platforms {
            let h = (s.platforms[p] ?? PlatformCounters()).sendLatency
            var cumulative = 0
            for (i, bound) in LatencyHistogram.bounds.enumerated() {
                cumulative += h.counts[i]
                m.sample(name + "_bucket", ["platform": p.rawValue, "le": PrometheusText.bound(bound)], cumulative)
            }
            m.sample(name + "_bucket", ["platform": p.rawValue, "le": "+Inf"], h.count)
            m.sample(name + "_sum", ["platform": p.rawValue], PrometheusText.seconds(microseconds: h.sumMicroseconds))
            m.sample(name + "_count", ["platform": p.rawValue], h.count)
        }
    }

    private static func connectionMetrics(_ stats: [String: HTTP2ClientStats], into m: inout PrometheusText) {
        let transports = ["apns", "fcm", "web"]
        func family(_ name: String, _ kind: PrometheusText.Kind, _ help: String, _ value: (HTTP2ClientStats) -> Int) {
            m.family(name, kind, help)
            for t in transports { m.sample(name, ["transport": t], value(stats[t] ?? HTTP2ClientStats())) }
        }
        family("herald_provider_connections", .gauge, "HTTP/2 connections open to the providers.") {
            $0.connectionsOpen
        }
        family("herald_provider_connections_opened_total", .counter, "HTTP/2 connections opened to the providers.") {
            $0.connectionsOpened
        }
        family("herald_provider_connect_failures_total", .counter, "Failed attempts to connect to a provider.") {
            $0.connectFailures
        }
        family("herald_provider_goaways_total", .counter, "GOAWAY frames received from providers.") { $0.goaways }
        family("herald_provider_timeouts_total", .counter, "Provider requests that passed their deadline.") {
            $0.timeouts
        }
        family(
            "herald_provider_silent_closes_total", .counter,
            "Provider connections closed as silent: a PING (or a shut flow-control window) not answered within ping_timeout."
        ) { $0.silentConnectionsClosed }
    }

    /// `herald_dns_*`: each resolver's lookups (`webpush` at send time, `registration`, `provider`).
    private static func dnsMetrics(_ stats: [(name: String, stats: ResolverStats)], into m: inout PrometheusText) {
        let resolvers = ["webpush", "registration", "provider"]
        func family(_ name: String, _ kind: PrometheusText.Kind, _ help: String, _ value: (ResolverStats) -> Int) {
            m.family(name, kind, help)
            for r in resolvers {
                m.sample(name, ["resolver": r], value(stats.first { $0.name == r }?.stats ?? ResolverStats()))
            }
        }
        family("herald_dns_lookups_total", .counter, "Name lookups asked of the name servers (cache misses).") {
            $0.lookups
        }
        family("herald_dns_timeouts_total", .counter, "Name lookups asked and not answered within 2 s.") {
            $0.timeouts
        }
        family(
            "herald_dns_dropped_total", .counter,
            "Names that waited 2 s for a lookup slot and were dropped from the queue unasked."
        ) { $0.dropped }
        family("herald_dns_refused_total", .counter, "Names refused at once: their wait queue was full.") {
            $0.refused
        }
        family(
            "herald_dns_outstanding", .gauge,
            "Name lookups asked and not yet ended (hung ones until their own timeout)."
        ) { $0.outstanding }
        family("herald_dns_queued", .gauge, "Names waiting for a lookup slot.") { $0.queued }
    }
}
