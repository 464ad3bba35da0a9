public import HeraldCore
internal import HeraldJSON

/// Brings a `web_payload` under the plaintext a record holds: the payload
/// whole when it fits, else the caller's shrink steps applied one at a time,
/// in order, until it fits.
///
/// - `drop`: the pointed members and elements are removed (in the order
///   given: removing `/a/0` twice removes the first two elements).
/// - `shorten`: the pointed string keeps as many leading characters (whole
///   grapheme clusters, so never a split UTF-8 sequence) as let the whole
///   payload fit, followed by `…`; when not even one character fits it
///   becomes "" and the next step goes on. A pointer to anything but a
///   string does nothing.
/// - `keep`: only the pointed values stay, each at its place (see
///   `JSON.keeping(_:)`).
///
/// The plaintext is the compact serialisation, as Herald writes JSON.
public enum WebContentFit {
    /// What a fitting payload came to.
    public struct Fitted: Sendable, Hashable {
        public let plaintext: [UInt8]
        public let shrink: ShrinkOutcome
    }

    /// Why nothing fitted: the size after the last step, and the capacity.
    public struct TooLarge: Error, Sendable, Hashable {
        public let size: Int
        public let capacity: Int
    }

    /// The plaintext of `content` for a record holding `capacity` bytes.
    public static func fit(_ content: WebContent, capacity: Int) -> Result<Fitted, TooLarge> {
        guard var doc = try? JSONParser.parse(content.payload) else {
            return .failure(TooLarge(size: content.payload.utf8.count, capacity: capacity))
        }
        var bytes = doc.serialized()
        if bytes.count <= capacity { return .success(Fitted(plaintext: bytes, shrink: .whole)) }
        for (i, step) in content.shrink.enumerated() {
            apply(step, to: &doc, capacity: capacity)
            bytes = doc.serialized()
            if bytes.count <= capacity { return .success(Fitted(plaintext: bytes, shrink: .step(i))) }
        }
        return .failure(TooLarge(size: bytes.count, capacity: capacity))
    }

    static func apply(_ step: ShrinkStep, to doc: inout JSON, capacity: Int) {
        switch step {
        case .drop(let pointers):
            for p in pointers.compactMap(JSONPointer.init) { doc.remove(at: p) }
        case .keep(let pointers):
            doc = doc.keeping(pointers.compactMap(JSONPointer.init))
        case .shorten(let text):
            guard let p = JSONPointer(text), case .string(let s)? = doc.value(at: p) else { return }
            let characters = Array(s)
            func fits(_ k: Int) -> Bool {
                var candidate = doc
                candidate.replace(at: p, with: .string(k == 0 ? "" : String(characters[..<k]) + "…"))
                return candidate.serialized().count <= capacity
            }
            // The most characters (fewer than all: it does not fit whole) that fit.
            var lo = 0
            var hi = max(0, characters.count - 1)
            while lo < hi {
                let mid = (lo + hi + 1) / 2
                if fits(mid) { lo = mid } else { hi = mid - 1 }
            }
            doc.replace(at: p, with: .string(lo == 0 ? "" : String(characters[..<lo]) + "…"))
        }
    }
}
