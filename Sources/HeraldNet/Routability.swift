/// IPv4 ranges that must never be dialled on a user's behalf (RFC 6890 and
/// the IANA special-purpose registry: "this network", private, CGNAT,
/// loopback, link-local, IETF protocol assignments, documentation, 6to4 relay
/// anycast, benchmarking, multicast, reserved, limited broadcast).
private let refusedIPv4: [(network: UInt32, length: Int)] = [
    (0x0000_0000, 8),  // 0.0.0.0/8
    (0x0a00_0000, 8),  // 10.0.0.0/8
    (0x6440_0000, 10),  // 100.64.0.0/10
    (0x7f00_0000, 8),  // 127.0.0.0/8
    (0xa9fe_0000, 16),  // 169.254.0.0/16
    (0xac10_0000, 12),  // 172.16.0.0/12
    (0xc000_0000, 24),  // 192.0.0.0/24
    (0xc000_0200, 24),  // 192.0.2.0/24
    (0xc058_6300, 24),  // 192.88.99.0/24
    (0xc0a8_0000, 16),  // 192.168.0.0/16
    (0xc612_0000, 15),  // 198.18.0.0/15
    (0xc633_6400, 24),  // 198.51.100.0/24
    (0xcb00_7100, 24),  // 203.0.113.0/24
    (0xe000_0000, 4),  // 224.0.0.0/4
    (0xf000_0000, 4),  // 240.0.0.0/4 (includes 255.255.255.255)
]

/// IPv6 ranges refused outright, as (first 64 bits, prefix length ≤ 64).
private let refusedIPv6: [(high: UInt64, length: Int)] = [
    (0x0000_0000_0000_0000, 8),  // ::/8 outside the embedded forms: reserved by the IETF
    (0x0064_ff9b_0001_0000, 48),  // 64:ff9b:1::/48 local-use NAT64
    (0x0100_0000_0000_0000, 64),  // 100::/64 discard-only
    (0x2001_0000_0000_0000, 32),  // 2001::/32 Teredo
    (0x2001_0002_0000_0000, 48),  // 2001:2::/48 benchmarking
    (0x2001_0010_0000_0000, 28),  // 2001:10::/28 ORCHID
    (0x2001_0020_0000_0000, 28),  // 2001:20::/28 ORCHIDv2
    (0x2001_0db8_0000_0000, 32),  // 2001:db8::/32 documentation
    (0x3fff_0000_0000_0000, 20),  // 3fff::/20 documentation (RFC 9637)
    (0x5f00_0000_0000_0000, 16),  // 5f00::/16 SRv6 SIDs
    (0xfc00_0000_0000_0000, 7),  // fc00::/7 unique local
    (0xfe80_0000_0000_0000, 10),  // fe80::/10 link-local
    (0xfec0_0000_0000_0000, 10),  // fec0::/10 site-local
    (0xff00_0000_0000_0000, 8),  // ff00::/8 multicast
]

private func inPrefix<T: FixedWidthInteger & UnsignedInteger>(_ value: T, _ network: T, _ length: Int) -> Bool {
    length == 0 || (value ^ network) >> (T.bitWidth - length) == 0
}

extension IPAddress {
    /// Whether the address may be dialled for a user-supplied endpoint: false
    /// for loopback, private, link-local, CGNAT, multicast, documentation and
    /// other special-purpose ranges, and for IPv6 forms that embed such an IPv4
    /// address (IPv4-mapped, IPv4-compatible, NAT64 64:ff9b::/96, 6to4). Teredo
    /// is refused whole rather than decoded. This is the SSRF guard's test.
    public var isPubliclyRoutable: Bool {
        switch storage {
        case .v4(let value):
            return !refusedIPv4.contains { inPrefix(value, $0.network, $0.length) }
        case .v6(let high, let low):
            if let embedded = ipv4Embedded(high: high, low: low) {
                return IPAddress.v4(embedded).isPubliclyRoutable
            }
            return !refusedIPv6.contains { inPrefix(high, $0.high, $0.length) }
        }
    }
}

extension IPAddress {
    /// The IPv4 address an IPv6 address carries when its prefix says packets to
    /// it reach that IPv4 host: ::/96 (compatible, and :: and ::1), ::ffff:0:0/96
    /// (mapped), 64:ff9b::/96 (NAT64) and 2002::/16 (6to4, bits 16–47).
    public var embeddedIPv4: IPAddress? {
        guard case .v6(let high, let low) = storage,
            let value = ipv4Embedded(high: high, low: low)
        else { return nil }
        return .v4(value)
    }
}

private func ipv4Embedded(high: UInt64, low: UInt64) -> UInt32? {
    let low32 = UInt32(truncatingIfNeeded: low)
    if high == 0 && (low >> 32 == 0 || low >> 32 == 0xffff) { return low32 }
    if high == 0x0064_ff9b_0000_0000 && low >> 32 == 0 { return low32 }
    if high >> 48 == 0x2002 { return UInt32(truncatingIfNeeded: high >> 16) }
    return nil
}
