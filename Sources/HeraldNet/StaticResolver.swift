/// A resolver that answers from a fixed table, for tests: no network, no
/// `/etc/hosts`. Names are matched case-insensitively; a name missing from
/// the table is `ResolverError.notFound`.
public struct StaticResolver: HostResolver {
    public let table: [String: [IPAddress]]
    public let failures: [String: ResolverError]

    /// - Parameters:
    ///   - table: host → the addresses it resolves to (an empty list is an
    ///     answer with no addresses).
    ///   - failures: host → the error its lookup throws.
    public init(_ table: [String: [IPAddress]], failures: [String: ResolverError] = [:]) {
        self.table = Dictionary(table.map { ($0.key.lowercased(), $0.value) }) { $1 }
        self.failures = Dictionary(failures.map { ($0.key.lowercased(), $0.value) }) { $1 }
    }

    /// A table written as address text; traps on text that is not an address.
    public init(parsing table: [String: [String]], failures: [String: ResolverError] = [:]) {
        self.init(
            table.mapValues { texts in
                texts.map { text in
                    guard let address = IPAddress(numericHost: text) else {
                        preconditionFailure("StaticResolver: \(text) is not an IP address")
                    }
                    return address
                }
            },
            failures: failures
        )
    }

    public func resolve(host: String, port: Int) throws -> [IPAddress] {
        try resolveTyped(host: host)
    }
}

extension StaticResolver: NonBlockingResolver {
    /// Answers from the table at once, from this call.
    public func lookup(
        host: String, port: Int, completion: @escaping @Sendable (Result<[IPAddress], ResolverError>) -> Void
    ) {
        completion(Result { () throws(ResolverError) in try resolveTyped(host: host) })
    }

    private func resolveTyped(host: String) throws(ResolverError) -> [IPAddress] {
        let key = host.lowercased()
        if let failure = failures[key] { throw failure }
        guard let addresses = table[key] else { throw ResolverError.notFound(host: host) }
        return addresses
    }
}
