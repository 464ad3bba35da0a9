import HeraldNet

/// A deterministic generator so property tests are reproducible.
struct SplitMix64: RandomNumberGenerator {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9e37_79b9_7f4a_7c15
        var z = state
        z = (z ^ (z >> 30)) &* 0xbf58_476d_1ce4_e5b9
        z = (z ^ (z >> 27)) &* 0x94d0_49bb_1331_11eb
        return z ^ (z >> 31)
    }
}

func ip(_ text: String) -> IPAddress {
    guard let address = IPAddress(numericHost: text) else { fatalError("bad test address \(text)") }
    return address
}
