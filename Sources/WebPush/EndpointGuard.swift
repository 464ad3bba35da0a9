public import HeraldNet

/// A Web Push endpoint that passed the guard: its normalised parts and the
/// addresses that were vetted, which the transport dials instead of resolving
/// the name again (IP pinning; SNI, `Host` and certificate checks use `host`).
public struct CheckedEndpoint: Sendable, Hashable {
    /// The normalised URL: lowercase scheme and host, canonical IP literals,
    /// no default port, path at least `/`.
    public let url: String
    /// Always `https`.
    public let scheme: String
    /// The lowercase hostname or canonical IP text, without brackets.
    public let host: String
    public let port: Int
    /// The request target: path (at least `/`) and query, as given.
    public let pathAndQuery: String
    /// The host when it is an IP literal (no SNI is sent for these).
    public let hostAddress: IPAddress?
    /// The vetted addresses, in resolver order, without duplicates, at most
    /// ``IPAddress/answerLimit``.
    public let addresses: [IPAddress]

    /// `host[:port]` as written in a URL or `Host` header (IPv6 in brackets).
    public var authority: String { Origin(scheme: .https, host: host, port: port).authority }

    /// `https://host[:port]`, the VAPID `aud` claim and the connection-pool key.
    public var origin: String { Origin(scheme: .https, host: host, port: port).description }
}

/// Decides whether a user-supplied Web Push endpoint may be POSTed to.
///
/// The URL is parsed strictly by hand (https only, no userinfo, no fragment,
/// port 443, LDH or numeric host), then every address the host resolves to
/// must be publicly routable. Run it at registration and again before every
/// send, and dial only `CheckedEndpoint.addresses`, so neither DNS rebinding
/// nor a later change of answer reaches an internal address. `check` calls the
/// resolver, which may block: run it off the event loop.
public struct EndpointGuard: Sendable {
    /// The longest endpoint accepted, in bytes.
    public static let maximumLength = 2048

    /// Skip the address check and allow any port: for tests against loopback
    /// servers only (`webpush_allow_private`).
    public let allowPrivate: Bool
    public let resolver: any HostResolver

    public init(allowPrivate: Bool = false, resolver: any HostResolver = SystemResolver()) {
        self.allowPrivate = allowPrivate
        self.resolver = resolver
    }

    /// The normalised form of an endpoint URL (the `url` that `check` would
    /// return), from parsing alone: no resolution, no address check.
    public func normalize(_ endpoint: String) throws(EndpointError) -> String {
        try EndpointSyntax(parsing: endpoint, allowAnyPort: allowPrivate).normalized
    }

    /// Parses, resolves and vets `endpoint` (blocking while the resolver does).
    public func check(_ endpoint: String) throws(EndpointError) -> CheckedEndpoint {
        let url = try EndpointSyntax(parsing: endpoint, allowAnyPort: allowPrivate)
        if url.address != nil { return try vet(url, .success([])).get() }
        let resolved: Result<[IPAddress], ResolverError>
        do {
            resolved = .success(try resolver.resolve(host: url.host, port: url.port))
        } catch let error as ResolverError {
            resolved = .failure(error)
        } catch {
            resolved = .failure(.failed(host: url.host, reason: String(describing: error)))
        }
        return try vet(url, resolved).get()
    }

    /// `check` without blocking on DNS when the resolver is an
    /// ``AsyncHostResolver``: the result when it is known now (a numeric host,
    /// a cached answer or failure, a malformed URL), else nil and `completion`
    /// gets it later, on another thread. With any other resolver the lookup
    /// is made here and the result returned.
    public func check(
        _ endpoint: String, completion: @escaping @Sendable (Result<CheckedEndpoint, EndpointError>) -> Void
    ) -> Result<CheckedEndpoint, EndpointError>? {
        let url: EndpointSyntax
        do throws(EndpointError) {
            url = try EndpointSyntax(parsing: endpoint, allowAnyPort: allowPrivate)
        } catch {
            return .failure(error)
        }
        guard url.address == nil, let async = resolver as? any AsyncHostResolver else {
            return Result { () throws(EndpointError) in try check(endpoint) }
        }
        let guardian = self
        let now = async.resolve(host: url.host, port: url.port) { resolved in
            completion(guardian.vet(url, resolved))
        }
        return now.map { vet(url, $0) }
    }

    /// The vetted endpoint for `url` given what its host resolved to (ignored for an IP literal).
    private func vet(
        _ url: EndpointSyntax, _ resolved: Result<[IPAddress], ResolverError>
    )
        -> Result<CheckedEndpoint, EndpointError>
    {
        let addresses: [IPAddress]
        if let literal = url.address {
            addresses = [literal]
        } else {
            switch resolved {
            case .failure(.notFound): return .failure(.unresolvable(host: url.host))
            case .failure(.failed(_, let reason)): return .failure(.resolutionFailed(host: url.host, reason: reason))
            case .success(let resolved):
                // Every address kept is vetted and only those are dialled:
                // past the limit, none is either.
                addresses = IPAddress.distinct(resolved)
            }
        }
        guard !addresses.isEmpty else { return .failure(.unresolvable(host: url.host)) }

        if !allowPrivate, let refused = addresses.first(where: { !$0.isPubliclyRoutable }) {
            return .failure(.notPubliclyRoutable(address: refused.description))
        }

        return .success(
            CheckedEndpoint(
                url: url.normalized,
                scheme: "https",
                host: url.host,
                port: url.port,
                pathAndQuery: url.pathAndQuery,
                hostAddress: url.address,
                addresses: addresses
            ))
    }
}
