import Foundation
import HeraldCrypto
import Testing

/// What can be observed of SecretBytes from outside: the bytes go in and come
/// back out unchanged (to the C core too), sizes are still checked by the
/// keys built from them, and no description shows them. (That they are wiped
/// on release cannot be looked at safely: the memory is gone by then.)
@Suite("SecretBytes")
struct SecretBytesTests {
    /// Bytes no rendering could contain by chance.
    static let marker = Array("K3Y-M4T3R1AL-7f3a".utf8)

    @Test("bytes copied in are the bytes lent out")
    func roundTrip() throws {
        let s = SecretBytes(copying: Self.marker)
        #expect(s.count == Self.marker.count)
        #expect(s.withUnsafeBytes { Array($0) } == Self.marker)
        let empty = SecretBytes(copying: [UInt8]())
        #expect(empty.count == 0)
        #expect(empty.withUnsafeBytes { $0.count } == 0)
    }

    @Test("a reader fills what it read; a shorter fill keeps only those bytes")
    func fill() throws {
        let s = SecretBytes(capacity: 64) { buffer in
            buffer.copyBytes(from: Self.marker)
            return Self.marker.count
        }
        #expect(s.count == Self.marker.count)
        #expect(s.withUnsafeBytes { Array($0) } == Self.marker)
    }

    @Test("a reader's error passes through")
    func fillThrows() {
        struct ReadFailed: Error, Equatable {}
        #expect(throws: ReadFailed()) {
            try SecretBytes(capacity: 32) { (_) throws(ReadFailed) -> Int in throw ReadFailed() }
        }
    }

    @Test("random bytes have the size asked for and differ between draws")
    func random() throws {
        let a = try SecretBytes.random(count: 32)
        let b = try SecretBytes.random(count: 32)
        #expect(a.count == 32 && b.count == 32)
        #expect(!a.isEqual(to: b))
        #expect(a.isEqual(to: SecretBytes(copying: a.withUnsafeBytes { Array($0) })))
        #expect(!a.isEqual(to: SecretBytes(copying: a.withUnsafeBytes { Array($0.prefix(31)) })))
    }

    @Test("no description, debug description, mirror or interpolation shows the bytes")
    func redacted() {
        let s = SecretBytes(copying: Self.marker)
        let markerText = String(decoding: Self.marker, as: UTF8.self)
        let renderings = [
            s.description, s.debugDescription, String(describing: s), String(reflecting: s), "\(s)",
            "\(Optional(s) as Any)", "\([s])", dumped(s),
        ]
        for text in renderings {
            #expect(!text.contains(markerText), "\(text)")
            #expect(!text.contains(Self.marker.hexString), "\(text)")
            #expect(!text.contains("\(Self.marker[0]), \(Self.marker[1])"), "\(text)")
            #expect(!text.contains("K3Y"), "\(text)")
        }
        #expect(s.description.contains("\(Self.marker.count) bytes"))
    }

    private func dumped(_ value: some Any) -> String {
        var out = ""
        dump(value, to: &out)
        return out
    }

    @Test("the bytes reach the C core unchanged: keys built from them match the vectors")
    func reachesTheCore() throws {
        #expect(try P256PrivateKey(raw: SecretBytes(copying: RFC8291.asPrivate)).publicKey == RFC8291.asPublic)
        let v = LibsodiumXChaChaVector.self
        let key = try StoreKey(SecretBytes(copying: v.key))
        #expect(try key.open([0x01] + v.nonce + v.sealed, context: v.ad) == v.message)
    }

    @Test("a key of the wrong size is still refused")
    func wrongSize() throws {
        for n in [0, 16, 31, 33, 64] {
            #expect(throws: CryptoError.invalidArgument) {
                try StoreKey(SecretBytes(copying: [UInt8](repeating: 7, count: n)))
            }
        }
        _ = try StoreKey(SecretBytes.random(count: StoreKey.byteCount))
        #expect(throws: CryptoError.privateKeyLength) {
            try P256PrivateKey(raw: SecretBytes(copying: [UInt8](repeating: 7, count: 31)))
        }
    }
}
