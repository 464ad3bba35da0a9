// Numeric host parsing, done by hand so the endpoint guard reads a host exactly
// as the C library (and WHATWG URL parsers) would before connecting, and
// address literals are read exactly as `inet_pton` reads them.

private let dot = UInt8(ascii: ".")
private let colon = UInt8(ascii: ":")

private func isDigit(_ byte: UInt8) -> Bool {
    byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9")
}

private func hexValue(_ byte: UInt8) -> UInt64? {
    switch byte {
    case UInt8(ascii: "0")...UInt8(ascii: "9"): UInt64(byte - UInt8(ascii: "0"))
    case UInt8(ascii: "a")...UInt8(ascii: "f"): UInt64(byte - UInt8(ascii: "a") + 10)
    case UInt8(ascii: "A")...UInt8(ascii: "F"): UInt64(byte - UInt8(ascii: "A") + 10)
    default: nil
    }
}

/// Splits a dotted host into labels, dropping one trailing empty label (`a.b.`).
func hostLabels(_ host: ArraySlice<UInt8>) -> [ArraySlice<UInt8>] {
    var labels = host.split(separator: dot, omittingEmptySubsequences: false)
    if labels.count > 1, labels.last?.isEmpty == true { labels.removeLast() }
    return labels
}

/// Whether a host must be read as IPv4 because its last label is a number
/// (WHATWG "ends in a number"): all digits, or `0x` followed by hex digits.
/// Such a host is never a DNS name, so failing to parse it is an error.
func endsInNumber(_ host: ArraySlice<UInt8>) -> Bool {
    guard let last = hostLabels(host).last, !last.isEmpty else { return false }
    if last.allSatisfy(isDigit) { return true }
    guard last.count >= 2, last.first == UInt8(ascii: "0"),
        last[last.startIndex + 1] | 0x20 == UInt8(ascii: "x")
    else { return false }
    return last.dropFirst(2).allSatisfy { hexValue($0) != nil }
}

/// One `inet_aton` part: decimal, `0`-prefixed octal or `0x`-prefixed hex.
/// Nil when empty, malformed or above 32 bits.
private func parseIPv4Part(_ part: ArraySlice<UInt8>) -> UInt64? {
    guard let first = part.first, isDigit(first) else { return nil }
    var digits = part
    var radix: UInt64 = 10
    if first == UInt8(ascii: "0"), part.count > 1 {
        if part[part.startIndex + 1] | 0x20 == UInt8(ascii: "x") {
            radix = 16
            digits = part.dropFirst(2)
            guard !digits.isEmpty else { return nil }
        } else {
            radix = 8
            digits = part.dropFirst()
        }
    }
    var value: UInt64 = 0
    for byte in digits {
        guard let digit = hexValue(byte), digit < radix else { return nil }
        value = value * radix + digit
        if value > 0xffff_ffff { return nil }
    }
    return value
}

/// Parses IPv4 in any `inet_aton` form (1 to 4 parts, the last filling the
/// remaining bytes) with an optional single trailing dot.
func parseIPv4(_ text: ArraySlice<UInt8>) -> UInt32? {
    let labels = hostLabels(text)
    guard (1...4).contains(labels.count) else { return nil }
    var parts: [UInt64] = []
    for label in labels {
        guard let part = parseIPv4Part(label) else { return nil }
        parts.append(part)
    }
    var value: UInt64 = 0
    for part in parts.dropLast() {
        guard part <= 0xff else { return nil }
        value = value << 8 | part
    }
    let lastBits = UInt64(8 * (5 - parts.count))
    guard let last = parts.last, last >> lastBits == 0 else { return nil }
    value = value << lastBits | last
    return UInt32(value)
}

/// The strict dotted quad allowed at the end of an IPv6 literal: four decimal
/// parts, no leading zeros (as `inet_pton` requires).
func parseDottedQuad(_ text: ArraySlice<UInt8>) -> UInt32? {
    let parts = text.split(separator: dot, omittingEmptySubsequences: false)
    guard parts.count == 4 else { return nil }
    var value: UInt32 = 0
    for part in parts {
        guard (1...3).contains(part.count), part.allSatisfy(isDigit) else { return nil }
        if part.count > 1 && part.first == UInt8(ascii: "0") { return nil }
        let number = part.reduce(UInt32(0)) { $0 * 10 + UInt32($1 - UInt8(ascii: "0")) }
        guard number <= 255 else { return nil }
        value = value << 8 | number
    }
    return value
}

/// Parses an IPv6 literal (RFC 4291 §2.2 text forms, no brackets, no zone id).
func parseIPv6(_ text: ArraySlice<UInt8>) -> IPAddress? {
    let bytes = Array(text)
    let count = bytes.count
    guard count >= 2 else { return nil }
    var words: [UInt16] = []
    var gap: Int?
    var index = 0
    if bytes[0] == colon {
        guard bytes[1] == colon else { return nil }
        gap = 0
        index = 2
    }
    while index < count {
        guard words.count < 8 else { return nil }
        var end = index
        while end < count && bytes[end] != colon { end += 1 }
        let piece = bytes[index..<end]
        if piece.contains(dot) {
            guard end == count, words.count <= 6, let v4 = parseDottedQuad(piece) else { return nil }
            words.append(UInt16(truncatingIfNeeded: v4 >> 16))
            words.append(UInt16(truncatingIfNeeded: v4))
            index = end
            break
        }
        guard (1...4).contains(piece.count) else { return nil }
        var word: UInt64 = 0
        for byte in piece {
            guard let digit = hexValue(byte) else { return nil }
            word = word << 4 | digit
        }
        words.append(UInt16(word))
        index = end
        guard index < count else { break }
        if index + 1 < count && bytes[index + 1] == colon {
            guard gap == nil else { return nil }
            gap = words.count
            index += 2
        } else {
            index += 1
            guard index < count else { return nil }
        }
    }
    if let gap {
        guard words.count <= 7 else { return nil }
        words.insert(contentsOf: [UInt16](repeating: 0, count: 8 - words.count), at: gap)
    }
    guard words.count == 8 else { return nil }
    var high: UInt64 = 0
    var low: UInt64 = 0
    for word in words[0..<4] { high = high << 16 | UInt64(word) }
    for word in words[4..<8] { low = low << 16 | UInt64(word) }
    return .v6(high: high, low: low)
}
