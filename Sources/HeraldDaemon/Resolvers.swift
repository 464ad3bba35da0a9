import HeraldIO
import HeraldNet

/// The daemon's name lookups (SPEC.md Revision 3, "Shared bounds": name
/// lookups never hold a thread per hung query): one c-ares thread, and three
/// resolvers on it with caches and bounds of their own, so that hung name
/// servers behind Web Push endpoints starve neither registrations nor the
/// provider hosts.
struct Resolvers: Sendable {
    /// Web Push endpoints at send time: answers and failures kept 30 s.
    let webPush: CachingResolver
    /// Web Push endpoints at registration: nothing remembered (current DNS), still bounded.
    let registration: CachingResolver
    /// APNs and FCM hosts: answers and failures kept 30 s.
    let providers: CachingResolver

    /// Loads the Public Suffix List (or logs that the last two labels stand in
    /// for it) and starts the c-ares thread.
    static func start(log: Logger, suffixListPath: String = PublicSuffixList.debianPath) throws -> Resolvers {
        let suffixes: PublicSuffixList
        if let loaded = PublicSuffixList.load(path: suffixListPath) {
            suffixes = loaded
        } else {
            log.warning("public_suffix_list_missing", ["path": suffixListPath, "domains": "last two labels"])
            suffixes = .lastTwoLabels
        }
        let ares = try AresResolver()
        return Resolvers(
            webPush: CachingResolver(ares, suffixes: suffixes),
            registration: CachingResolver(
                ares, ttl: .zero, negativeTTL: .zero, maxOutstanding: 32, reservedForKnown: 8, suffixes: suffixes),
            providers: CachingResolver(ares, maxOutstanding: 16, reservedForKnown: 8, suffixes: suffixes))
    }

    /// Each resolver's figures by its name in the metrics (`webpush`, `registration`, `provider`).
    var stats: [(name: String, stats: ResolverStats)] {
        [("webpush", webPush.stats), ("registration", registration.stats), ("provider", providers.stats)]
    }
}
