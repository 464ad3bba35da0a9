import HeraldIO
import Dispatch
import Foundation
import HeraldCore
import HeraldCrypto
import APNs
import HeraldScheduler
import HeraldStore
import HeraldJSON
import JSONRPC
import Synchronization
import WebPush

// system.health, system.stats, system.metrics (Metrics.swift), vapid.public_key.
extension HeraldService {
    // MARK: system.*, vapid.public_key

    /// The state of one transport of an app.
    func transportState(_ runtime: AppRuntime, _ platforms: [Platform], degraded: [QueueLane: String]) -> TransportState
    {
        if let why = platforms.compactMap({ runtime.disabled[$0] }).first { return .disabled(why) }
        if let why = platforms.compactMap({ degraded[QueueLane(app: runtime.config.name, platform: $0)] }).first {
            return .degraded(why)
        }
        return .ready
    }

    func health(_ p: inout ParamReader, _ context: CallContext) throws(RPCError) -> JSON {
        // With `app`, that app (checked like any call); without, every app this peer may call.
        let only = try p.string("app", maxBytes: 64).map { name throws(RPCError) in
            try runtime(named: name, context).config.name
        }
        try p.finish()
        let degraded = delivery?.scheduler.degradedLanes ?? [:]
        let checked = credentialHealth?.states ?? [:]
        var transports = JSONObject()
        var credentials = JSONObject()
        var anyDegraded = false
        for name in apps.keys.sorted()
        where (only == nil || only == name)
            && apps[name]!.config.allows(uid: context.uid, gid: context.gid, groups: context.groups)
        {
            let runtime = apps[name]!
            var states = JSONObject()
            var proven = JSONObject()
            for (transport, platforms) in [
                ("apns", Platform.allCases.filter(\.isAPNs)), ("fcm", [.fcm]), ("web", [.web, .unifiedPush]),
            ] {
                let state = transportState(runtime, platforms, degraded: degraded)
                if case .degraded = state { anyDegraded = true }
                states.append(transport, .string(state.wire))
                if let credential = checked[CredentialKey(app: name, platform: transport)] {
                    // A credential the provider refused is an alert: degraded.
                    if credential.status == CredentialVerdict.Status.rejected.rawValue { anyDegraded = true }
                    proven.append(transport, CredentialMonitor.json(credential))
                }
            }
            transports.append(name, .object(states))
            credentials.append(name, .object(proven))
        }
        let status = storeHealth.isOK && !anyDegraded ? "ok" : "degraded"
        return [
            "status": .string(status), "store": .string(storeHealth.wire), "transports": .object(transports),
            "credentials": .object(credentials),
        ]
    }

    /// The apps this peer may call, or nil when it may call every app (it sees all figures then).
    func visibleApps(_ context: CallContext) -> Set<String>? {
        let allowed = apps.filter { $0.value.config.allows(uid: context.uid, gid: context.gid, groups: context.groups) }
        return allowed.count == apps.count ? nil : Set(allowed.keys)
    }

    func stats(_ p: inout ParamReader, _ context: CallContext, _ reply: @escaping Reply) throws(RPCError) {
        _ = try app(&p, context)
        try p.finish()
        let only = visibleApps(context)
        var configuredKeys: [String: [String]] = [:]
        for (name, runtime) in apps where only?.contains(name) ?? true {
            configuredKeys[name] = runtime.credentials.webPush.value?.acceptedPublicKeys ?? []
        }
        let server = serverStats()
        let uptime = (monotonicMilliseconds() - startedAt) / 1000
        let rateLimited = self.rateLimited
        let scheduler = delivery?.scheduler.stats
        let apns = delivery?.providers.apns?.stats
        let summary = storeSummary
        storeFigures(for: "stats", failure: { reply(.failure($0)) }) { [configuredKeys] figures in
            let depth = figures.depth(only: only)
            let counts = figures.devices(only: only)
            let webKeys = Self.webSubscriptionsByKey(figures.webSubscriptions, configuredKeys)
            var devices = JSONObject()
            for platform in Platform.allCases where platform.isDevicePlatform {
                devices.append(platform.rawValue, .int(counts[platform] ?? 0))
            }
            var transports = JSONObject()
            for platform in Platform.allCases {
                let c = scheduler?.platforms[platform] ?? PlatformCounters()
                transports.append(
                    platform.rawValue,
                    [
                        "sent": .int(c.sent), "delivered": .int(c.delivered), "failed": .int(c.failed),
                        "retried": .int(c.retried), "expired": .int(c.expired),
                        "auth_rejected": .int(c.authRejected), "removed_stale": .int(c.removedStale),
                        "stale_refused": .int(c.staleRefused), "breaker_trips": .int(c.breakerTrips),
                    ])
            }
            // A peer limited to some apps sees figures over those only: the
            // send counters and provider connections, kept for the daemon as
            // a whole, are left out for it.
            var result: JSONObject = [
                "version": .string(Self.version), "instance": .string(self.instance), "uptime_s": .int(uptime),
                "connections": [
                    "open": .int(server.open), "accepted": .int(server.counters.accepted),
                    "refused": .int(server.counters.refused), "accept_pauses": .int(server.counters.acceptPauses),
                    "budget_pauses": .int(server.counters.budgetPauses), "shed": .int(server.counters.shed),
                    "held_bytes": .int(server.counters.heldBytes),
                ],
                "requests": [
                    "total": .int(server.counters.requests), "errors": .int(server.counters.errors),
                    "rate_limited": .int(rateLimited),
                ],
                "devices": .object(devices),
                "queue": [
                    "depth": .int(depth.waiting), "in_flight": .int(depth.inFlight),
                    "stale_held": .int(only == nil ? scheduler?.staleHeld ?? 0 : 0),
                ],
                "store": .object(Self.storeJSON(summary, heldResults: only == nil ? scheduler?.heldResults ?? 0 : 0)),
            ]
            if let only {
                result.append("apps", .array(only.sorted().map { .string($0) }))
                result.append("web_subscriptions_by_key", .object(webKeys))
                reply(.success(.object(result)))
                return
            }
            result.append("transports", .object(transports))
            if let scheduler {
                result.append(
                    "slots",
                    [
                        "lane_floor": .int(scheduler.laneFloor),
                        "webpush_origin_waiting": .int(scheduler.originWaiting),
                        "webpush_origins_unresponsive": .int(scheduler.originsUnresponsive),
                        "webpush_origin_deferred": .int(scheduler.originDeferred),
                    ])
            }
            if let apns {
                result.append(
                    "apns",
                    [
                        "connections": .int(apns.connectionsOpen), "connections_opened": .int(apns.connectionsOpened),
                        "connect_failures": .int(apns.connectFailures), "goaways": .int(apns.goaways),
                        "last_goaway_reason": apns.lastGoAwayReason.map { .string($0) } ?? .null,
                        "tokens_signed": .int(apns.tokensMinted), "timeouts": .int(apns.timeouts),
                    ])
            }
            result.append("web_subscriptions_by_key", .object(webKeys))
            reply(.success(.object(result)))
        }
    }

    /// `system.stats` `store`: the backend, for PostgreSQL its pool size and
    /// lease, and the results held in memory until the store takes them.
    static func storeJSON(_ summary: StoreSummary, heldResults: Int) -> JSONObject {
        var object: JSONObject = ["backend": .string(summary.backend)]
        if let poolSize = summary.poolSize { object.append("pool_size", .int(poolSize)) }
        if let leaseMs = summary.leaseMs { object.append("lease_ms", .int(Int(leaseMs))) }
        object.append("held_results", .int(heldResults))
        return object
    }

    /// The store's figures (``StoreFiguresCache``: at most a second old, one
    /// read shared by every caller); a store failure is logged (naming
    /// `what`) and given to `failure` as -32603.
    func storeFigures(
        for what: String, failure: @escaping @Sendable (RPCError) -> Void,
        _ body: @escaping @Sendable (StoreFigures) -> Void
    ) {
        let log = self.log
        let queue = figuresQueue
        figures.get { result in
            switch result {
            case .success(let figures):
                // Fresh figures answer on the caller's thread, the loop's:
                // the answer (a stats object, a metrics text) is made on the
                // figures' own queue instead, so a client asking in a loop
                // costs the loop no more than any small call.
                queue.async { body(figures) }
            case .failure(let error):
                log.error("store_failed", ["error": "\(what): \(error)"])
                failure(.storeUnavailable)
            }
        }
    }

    /// `system.stats` `web_subscriptions_by_key`: per app (those in
    /// `configured`, which names each shown app's accepted keys, current
    /// first; `{}` for one without Web Push), the app's Web Push
    /// subscriptions per VAPID public key they were made with.
    /// The app's current and previous keys are always listed (0 when none is
    /// left: the previous key may be dropped); subscriptions that record no
    /// key count with the current key (they are sent with it), or under
    /// `unrecorded` when the app has no VAPID key.
    static func webSubscriptionsByKey(_ counts: [ServerKeyCount], _ configured: [String: [String]]) -> JSONObject {
        var byApp: [String: [String: Int]] = [:]
        for (app, keys) in configured {
            byApp[app] = [:]
            for key in keys { byApp[app]![key] = 0 }
        }
        for c in counts where configured[c.app] != nil {
            let key = c.serverKey ?? configured[c.app]!.first ?? "unrecorded"
            byApp[c.app, default: [:]][key, default: 0] += c.count
        }
        var out = JSONObject()
        for app in byApp.keys.sorted() {
            var keys = JSONObject()
            for key in byApp[app]!.keys.sorted() { keys.append(key, .int(byApp[app]![key]!)) }
            out.append(app, .object(keys))
        }
        return out
    }

    func vapidPublicKey(_ p: inout ParamReader, _ context: CallContext) throws(RPCError) -> JSON {
        let runtime = try app(&p, context)
        try p.finish()
        guard let vapid = runtime.credentials.webPush.value else {
            throw RPCError.invalidParams(field: "app", reason: "web push is disabled for this app (no vapid_key)")
        }
        return ["public_key": .string(vapid.key.publicKeyBase64URL)]
    }

    /// Takes a reloaded configuration's apps (on the loop thread): calls from
    /// now on see the new limits, peers and credentials.
}
