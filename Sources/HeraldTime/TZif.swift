/// What a TZif file (RFC 8536, versions 1 to 4) says about UTC offsets:
/// its transitions, the offset each one brings, and the footer's rule for
/// the instants after the last one. Leap-second records, abbreviations and
/// the standard/UT indicators are read past, not kept.
struct TZifRules: Sendable {
    /// Transition instants, UTC seconds, strictly ascending.
    let transitions: [Int]
    /// The offset each transition brings, in step with `transitions`.
    let offsets: [Int]
    /// The offset before the first transition (time type 0).
    let initialOffset: Int
    /// The footer's rule (versions 2 and later); nil for version 1 or an empty footer.
    let footer: PosixTimeZone?

    /// Offsets beyond these (RFC 8536 §3.2: -89999 to 93599 seconds) are refused,
    /// so that every local time lies within a day and a bit of its instant.
    static let offsetRange = -89_999...93_599

    /// Parses a whole file; nil when it is not a valid TZif file.
    init?(bytes: [UInt8]) {
        var reader = ByteReader(bytes: bytes)
        guard let first = reader.header() else { return nil }
        var header = first
        var timeSize = 4
        if first.version >= 2 {
            // The version 1 block only serves version 1 readers: skip it and read the 64-bit one.
            guard reader.skip(first.dataLength(timeSize: 4)), let second = reader.header() else { return nil }
            header = second
            timeSize = 8
        }
        guard let block = reader.dataBlock(header, timeSize: timeSize) else { return nil }
        var footer: PosixTimeZone?
        if first.version >= 2 {
            guard let text = reader.footer() else { return nil }
            if !text.isEmpty {
                guard let rule = PosixTimeZone(parsing: text) else { return nil }
                footer = rule
            }
        }
        transitions = block.transitions
        offsets = block.offsets
        initialOffset = block.initialOffset
        self.footer = footer
    }

    /// The offset in effect at `seconds` since the epoch.
    func offset(atSeconds seconds: Int) -> Int {
        guard let last = transitions.last else { return footer?.offset(atSeconds: seconds) ?? initialOffset }
        if seconds > last, let footer { return footer.offset(atSeconds: seconds) }
        guard seconds >= transitions[0] else { return initialOffset }
        // The last transition at or before `seconds`.
        var low = 0
        var high = transitions.count - 1
        while low < high {
            let middle = (low + high + 1) / 2
            if transitions[middle] <= seconds { low = middle } else { high = middle - 1 }
        }
        return offsets[low]
    }

    /// The changes of offset in `(after, through]`, in order: each instant
    /// with the offsets before and after it (transitions that keep the offset
    /// left out).
    func changes(after: Int, through: Int) -> [(at: Int, before: Int, after: Int)] {
        var result: [(at: Int, before: Int, after: Int)] = []
        var current = offset(atSeconds: after)
        var index = transitions.partitionPoint { $0 <= after }
        while index < transitions.count && transitions[index] <= through {
            if offsets[index] != current {
                result.append((transitions[index], current, offsets[index]))
                current = offsets[index]
            }
            index += 1
        }
        if let footer {
            let from = Swift.max(after, transitions.last ?? Int.min)
            for change in footer.changes(after: from, through: through, current: current) {
                result.append((change.at, current, change.offset))
                current = change.offset
            }
        }
        return result
    }
}

extension Array where Element == Int {
    /// The index of the first element for which `belongs` is false, `belongs` holding for a prefix.
    fileprivate func partitionPoint(_ belongs: (Int) -> Bool) -> Int {
        var low = 0
        var high = count
        while low < high {
            let middle = (low + high) / 2
            if belongs(self[middle]) { low = middle + 1 } else { high = middle }
        }
        return low
    }
}

/// The counts of a TZif header (RFC 8536 §3.1).
private struct Header {
    var version: Int
    var isUTCount: Int
    var isStandardCount: Int
    var leapCount: Int
    var timeCount: Int
    var typeCount: Int
    var characterCount: Int

    func dataLength(timeSize: Int) -> Int {
        timeCount * timeSize + timeCount + typeCount * 6 + characterCount + leapCount * (timeSize + 4)
            + isStandardCount + isUTCount
    }
}

/// The parts of a data block that are kept.
private struct DataBlock {
    var transitions: [Int]
    var offsets: [Int]
    var initialOffset: Int
}

/// A bounds-checked cursor: every read past the end fails instead of trapping.
private struct ByteReader {
    let bytes: [UInt8]
    var index = 0

    mutating func skip(_ count: Int) -> Bool {
        guard count >= 0, count <= bytes.count - index else { return false }
        index += count
        return true
    }

    /// A big-endian signed integer of `size` bytes (4 or 8).
    mutating func integer(size: Int) -> Int? {
        guard size <= bytes.count - index else { return nil }
        var value: UInt64 = 0
        for byte in bytes[index..<(index + size)] { value = value << 8 | UInt64(byte) }
        index += size
        if size == 4 { return Int(Int32(bitPattern: UInt32(truncatingIfNeeded: value))) }
        return Int(Int64(bitPattern: value))
    }

    mutating func byte() -> UInt8? {
        guard index < bytes.count else { return nil }
        defer { index += 1 }
        return bytes[index]
    }

    mutating func header() -> Header? {
        guard bytes.count - index >= 44, bytes[index..<(index + 4)].elementsEqual("TZif".utf8) else { return nil }
        let versionByte = bytes[index + 4]
        let version: Int
        switch versionByte {
        case 0: version = 1
        // Versions after 4 are read as 4 (RFC 8536 §4: readers should not reject them outright).
        case UInt8(ascii: "2")...UInt8(ascii: "9"): version = Int(versionByte - UInt8(ascii: "0"))
        default: return nil
        }
        index += 20
        var counts: [Int] = []
        for _ in 0..<6 {
            guard let count = integer(size: 4), count >= 0 else { return nil }
            counts.append(count)
        }
        let header = Header(
            version: version, isUTCount: counts[0], isStandardCount: counts[1], leapCount: counts[2],
            timeCount: counts[3], typeCount: counts[4], characterCount: counts[5])
        guard header.typeCount > 0, header.characterCount > 0,
            header.isUTCount == 0 || header.isUTCount == header.typeCount,
            header.isStandardCount == 0 || header.isStandardCount == header.typeCount,
            header.dataLength(timeSize: 4) <= bytes.count - index
        else { return nil }
        return header
    }

    mutating func dataBlock(_ header: Header, timeSize: Int) -> DataBlock? {
        var transitions: [Int] = []
        transitions.reserveCapacity(header.timeCount)
        for _ in 0..<header.timeCount {
            guard let time = integer(size: timeSize) else { return nil }
            if let previous = transitions.last, time <= previous { return nil }
            transitions.append(time)
        }
        var typeIndices: [Int] = []
        typeIndices.reserveCapacity(header.timeCount)
        for _ in 0..<header.timeCount {
            guard let index = byte(), Int(index) < header.typeCount else { return nil }
            typeIndices.append(Int(index))
        }
        var typeOffsets: [Int] = []
        for _ in 0..<header.typeCount {
            guard let offset = integer(size: 4), TZifRules.offsetRange.contains(offset),
                let isDaylight = byte(), isDaylight <= 1,
                let designation = byte(), Int(designation) < header.characterCount
            else { return nil }
            typeOffsets.append(offset)
        }
        let rest = header.characterCount + header.leapCount * (timeSize + 4) + header.isStandardCount + header.isUTCount
        guard skip(rest) else { return nil }
        return DataBlock(
            transitions: transitions, offsets: typeIndices.map { typeOffsets[$0] }, initialOffset: typeOffsets[0])
    }

    /// The footer: a TZ string between two newlines.
    mutating func footer() -> String? {
        guard byte() == UInt8(ascii: "\n") else { return nil }
        let start = index
        while let next = byte() {
            if next == UInt8(ascii: "\n") {
                return String(decoding: bytes[start..<(index - 1)], as: UTF8.self)
            }
        }
        return nil
    }
}
