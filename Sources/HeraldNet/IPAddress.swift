/// An IPv4 or IPv6 address: the one address type of Herald, for the Web Push
/// endpoint guard, the transports that dial and the config's loopback checks.
///
/// IPv6 addresses are held as two big-endian halves so the value is a cheap,
/// hashable pair; `bytes` gives the network-order form for `sockaddr` building.
public struct IPAddress: Sendable, Hashable, CustomStringConvertible {
    /// The address family.
    public enum Family: Sendable, Hashable {
        case v4
        case v6
    }

    enum Storage: Sendable, Hashable {
        case v4(UInt32)
        case v6(high: UInt64, low: UInt64)
    }

    let storage: Storage

    init(storage: Storage) {
        self.storage = storage
    }

    /// An IPv4 address from its 32-bit value in host order (`0x7f000001` is 127.0.0.1).
    public static func v4(_ value: UInt32) -> IPAddress {
        IPAddress(storage: .v4(value))
    }

    /// An IPv4 address from its four octets.
    public static func v4(_ a: UInt8, _ b: UInt8, _ c: UInt8, _ d: UInt8) -> IPAddress {
        .v4(UInt32(a) << 24 | UInt32(b) << 16 | UInt32(c) << 8 | UInt32(d))
    }

    /// An IPv6 address from its first and last 64 bits.
    public static func v6(high: UInt64, low: UInt64) -> IPAddress {
        IPAddress(storage: .v6(high: high, low: low))
    }

    /// An address from its network-order bytes: 4 for IPv4, 16 for IPv6.
    public init?(bytes: some Collection<UInt8>) {
        let bytes = Array(bytes)
        switch bytes.count {
        case 4:
            self = .v4(bytes[0], bytes[1], bytes[2], bytes[3])
        case 16:
            var high: UInt64 = 0
            var low: UInt64 = 0
            for byte in bytes[0..<8] { high = high << 8 | UInt64(byte) }
            for byte in bytes[8..<16] { low = low << 8 | UInt64(byte) }
            self = .v6(high: high, low: low)
        default:
            return nil
        }
    }

    /// Parses a numeric host the way a connecting client would read it.
    ///
    /// IPv4 is accepted in every `inet_aton` spelling (`127.1`, `0x7f.0.0.1`,
    /// `017700000001`, `2130706433`) and with one trailing dot; IPv6 with or
    /// without URL brackets, including IPv4-embedded forms. Zone ids are refused.
    /// Returns nil for anything else, hostnames included.
    public init?(numericHost text: String) {
        var bytes = Array(text.utf8)
        if bytes.first == UInt8(ascii: "[") {
            guard bytes.count >= 2, bytes.last == UInt8(ascii: "]") else { return nil }
            bytes = Array(bytes[1..<(bytes.count - 1)])
            guard let address = parseIPv6(bytes[...]) else { return nil }
            self = address
        } else if bytes.contains(UInt8(ascii: ":")) {
            guard let address = parseIPv6(bytes[...]) else { return nil }
            self = address
        } else {
            guard let value = parseIPv4(bytes[...]) else { return nil }
            self = .v4(value)
        }
    }

    /// Parses an address literal as `inet_pton` does, and nothing more: IPv4
    /// as a strict dotted quad (`127.0.0.1`, no leading zeros), IPv6 in RFC 4291
    /// text without brackets or zone id. Use it where a peer must get exactly
    /// the address written (certificate IP checks, pinned addresses, listen
    /// addresses); ``init(numericHost:)`` reads hosts as a resolver would.
    public init?(literal text: some StringProtocol) {
        let bytes = Array(text.utf8)
        if bytes.contains(UInt8(ascii: ":")) {
            guard let address = parseIPv6(bytes[...]) else { return nil }
            self = address
        } else {
            guard let value = parseDottedQuad(bytes[...]) else { return nil }
            self = .v4(value)
        }
    }

    /// Whether a host names this machine: `localhost`, or a literal (as
    /// ``init(literal:)`` reads it, no brackets) that ``isLoopback``.
    public static func isLoopbackHost(_ host: some StringProtocol) -> Bool {
        host == "localhost" || IPAddress(literal: host)?.isLoopback == true
    }

    /// 127.0.0.0/8 or ::1. IPv6 forms that embed 127.0.0.0/8 (`::ffff:127.0.0.1`)
    /// do not count: they are refused as not publicly routable, not trusted.
    public var isLoopback: Bool {
        switch storage {
        case .v4(let value): value >> 24 == 127
        case .v6(let high, let low): high == 0 && low == 1
        }
    }

    public var family: Family {
        switch storage {
        case .v4: .v4
        case .v6: .v6
        }
    }

    /// The 32-bit value of an IPv4 address (host order), nil for IPv6.
    public var ipv4Value: UInt32? {
        if case .v4(let value) = storage { return value }
        return nil
    }

    /// The address in network byte order: 4 bytes for IPv4, 16 for IPv6.
    public var bytes: [UInt8] {
        switch storage {
        case .v4(let value):
            return (0..<4).map { UInt8(truncatingIfNeeded: value >> (24 - 8 * $0)) }
        case .v6(let high, let low):
            return (0..<8).map { UInt8(truncatingIfNeeded: high >> (56 - 8 * UInt64($0))) }
                + (0..<8).map { UInt8(truncatingIfNeeded: low >> (56 - 8 * UInt64($0))) }
        }
    }

    /// The canonical text: dotted decimal for IPv4, RFC 5952 for IPv6 (lowercase,
    /// longest zero run compressed, mapped and compatible IPv4 in dotted form as
    /// glibc's `inet_ntop` prints them), never bracketed.
    public var description: String {
        switch storage {
        case .v4(let value):
            return dottedQuad(value)
        case .v6(let high, let low):
            return ipv6Text(high: high, low: low)
        }
    }

    /// The host as it is written inside a URL: IPv6 in brackets.
    public var urlHost: String {
        family == .v6 ? "[\(description)]" : description
    }
}

func dottedQuad(_ value: UInt32) -> String {
    "\(value >> 24).\(value >> 16 & 0xff).\(value >> 8 & 0xff).\(value & 0xff)"
}

private func ipv6Text(high: UInt64, low: UInt64) -> String {
    var words = [UInt16](repeating: 0, count: 8)
    for i in 0..<4 {
        words[i] = UInt16(truncatingIfNeeded: high >> (48 - 16 * UInt64(i)))
        words[i + 4] = UInt16(truncatingIfNeeded: low >> (48 - 16 * UInt64(i)))
    }

    // The first longest run of two or more zero words (RFC 5952 §4.2).
    var bestStart = -1
    var bestLength = 0
    var index = 0
    while index < 8 {
        guard words[index] == 0 else {
            index += 1
            continue
        }
        var end = index
        while end < 8 && words[end] == 0 { end += 1 }
        if end - index > bestLength {
            bestStart = index
            bestLength = end - index
        }
        index = end
    }
    if bestLength < 2 { bestStart = -1 }

    // ::a.b.c.d (compatible, not :: or ::1) and ::ffff:a.b.c.d (mapped).
    let embedded = bestStart == 0 && (bestLength == 6 || (bestLength == 5 && words[5] == 0xffff))

    var text = ""
    var i = 0
    while i < 8 {
        if i == bestStart {
            text += "::"
            i += bestLength
            continue
        }
        if !text.isEmpty && !text.hasSuffix(":") { text += ":" }
        if embedded && i == 6 {
            text += dottedQuad(UInt32(truncatingIfNeeded: low))
            break
        }
        text += String(words[i], radix: 16)
        i += 1
    }
    return text
}

extension IPAddress {
    /// The most addresses kept from one name's answer. A hostile name can
    /// answer thousands (a DNS answer over TCP holds up to 64 KiB); those
    /// past the first few would only be dialled after every earlier one
    /// failed, and each costs a vetting, a cache entry and a connect.
    public static let answerLimit = 16

    /// The distinct addresses of `addresses`, in their order, at most
    /// `limit` of them: one pass over the answer with a set of those seen,
    /// stopping at the limit.
    public static func distinct(_ addresses: some Sequence<IPAddress>, limit: Int = answerLimit) -> [IPAddress] {
        var seen = Set<IPAddress>()
        var kept: [IPAddress] = []
        for address in addresses {
            guard kept.count < limit else { break }
            if seen.insert(address).inserted { kept.append(address) }
        }
        return kept
    }
}
