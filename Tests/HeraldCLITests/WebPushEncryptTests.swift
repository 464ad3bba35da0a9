import Foundation
import HeraldCrypto
import Testing

/// The RFC 8188 header of an aes128gcm body.
struct AES128GCMHeader {
    let salt: [UInt8]
    let recordSize: UInt32
    let idlen: Int
    let keyid: [UInt8]

    init(_ body: [UInt8]) throws {
        try #require(body.count >= 86, "body of \(body.count) bytes has no full header")
        salt = Array(body[0..<16])
        recordSize = body[16..<20].reduce(0) { $0 << 8 | UInt32($1) }
        idlen = Int(body[20])
        keyid = Array(body[21..<(21 + min(idlen, body.count - 21))])
    }
}

@Suite("herald webpush encrypt")
struct WebPushEncryptTests {
    let p256dh: String
    let auth: String
    let point: [UInt8]

    init() throws {
        (p256dh, auth, point) = try subscriberKeys()
    }

    private func encrypt(_ plaintext: [UInt8], _ extra: [String] = []) throws -> RunResult {
        try herald(["webpush", "encrypt", "--p256dh", p256dh, "--auth", auth] + extra, stdin: plaintext)
    }

    @Test("pads every body to 2816 bytes by default", arguments: [0, 1, 100, 1000, 2713])
    func defaultSize(length: Int) throws {
        let result = try encrypt(bytes(length))
        #expect(result.status == 0, "\(result)")
        #expect(result.stderr.isEmpty, "\(result)")
        #expect(result.stdout.count == 2816)
    }

    @Test(
        "--pad gives the exact total body size",
        arguments: [
            (104, 0), (104, 1), (200, 0), (200, 97), (1000, 500), (2816, 2713),
            (3000, 10), (4096, 0), (4096, 3993),
        ])
    func exactPad(pad: Int, length: Int) throws {
        let result = try encrypt(bytes(length), ["--pad", String(pad)])
        #expect(result.status == 0, "\(result)")
        #expect(result.stdout.count == pad)
    }

    @Test(
        "--pad 0 adds only the 103 bytes of header, delimiter and tag",
        arguments: [0, 1, 100, 2713, 3993])
    func noPadding(length: Int) throws {
        let result = try encrypt(bytes(length), ["--pad", "0"])
        #expect(result.status == 0, "\(result)")
        #expect(result.stdout.count == length + 103)
    }

    @Test("--pad=N inline form works")
    func inlinePad() throws {
        let result = try herald(
            ["webpush", "encrypt", "--p256dh=\(p256dh)", "--auth=\(auth)", "--pad=500"],
            stdin: bytes(10))
        #expect(result.status == 0, "\(result)")
        #expect(result.stdout.count == 500)
    }

    @Test("the header has a random salt, rs 4096, idlen 65 and a fresh P-256 key id")
    func header() throws {
        let plaintext = Array("hello, push".utf8)
        let first = try encrypt(plaintext)
        let second = try encrypt(plaintext)
        #expect(first.status == 0 && second.status == 0)
        let a = try AES128GCMHeader(first.stdout)
        let b = try AES128GCMHeader(second.stdout)
        for h in [a, b] {
            #expect(h.recordSize == 4096)
            #expect(h.idlen == 65)
            #expect(h.keyid.count == 65)
            #expect(h.keyid.first == 0x04)
            #expect((try? P256.checkPublicKey(h.keyid)) != nil, "key id is a point on P-256")
            #expect(h.keyid != point, "the key id is the sender's ephemeral key, not the subscriber's")
        }
        #expect(a.salt != b.salt, "salt is fresh per message")
        #expect(a.keyid != b.keyid, "ephemeral key is fresh per message")
        #expect(first.stdout != second.stdout, "two encryptions of the same plaintext differ")
        #expect(Array(first.stdout[86...]) != Array(second.stdout[86...]))
    }

    @Test("the plaintext does not appear in the body")
    func notPlain() throws {
        let marker = Array("SECRET-MARKER-SECRET-MARKER".utf8)
        let result = try encrypt(marker, ["--pad", "0"])
        #expect(result.status == 0)
        let body = result.stdout
        let found = (0...(body.count - marker.count)).contains { Array(body[$0..<($0 + marker.count)]) == marker }
        #expect(!found)
    }

    @Test(
        "a plaintext that does not fit the record is bad input",
        arguments: [
            (2714, nil), (4000, nil), (3994, "0"), (98, "200"), (2, "104"), (3994, "4096"),
        ] as [(Int, String?)])
    func tooLarge(length: Int, pad: String?) throws {
        let result = try encrypt(bytes(length), pad.map { ["--pad", $0] } ?? [])
        expectBadInput(result, mentioning: ["plaintext", "fit"])
    }

    @Test(
        "--pad outside 0...4096 or below the record overhead is bad input",
        arguments: ["5000", "4097", "-1", "abc", "", "50", "103", "1"])
    func badPad(pad: String) throws {
        // An empty plaintext, so that only the pad itself can be at fault.
        let result = try encrypt([], ["--pad", pad])
        expectBadInput(result, mentioning: ["pad", "body size"])
    }

    @Test("--pad 50 with a plaintext is bad input")
    func smallPadWithPlaintext() throws {
        expectBadInput(try encrypt(bytes(10), ["--pad", "50"]), mentioning: ["pad", "body size"])
    }

    @Test("malformed, short, long, compressed or off-curve p256dh is bad input")
    func badP256dh() throws {
        let cases: [(String, String)] = [
            ("malformed", "not base64url!"),
            ("standard alphabet", "+" + p256dh.dropFirst()),
            ("wrong padding", p256dh + "=="),
            ("short text", String(p256dh.prefix(20))),
            ("64 bytes", b64url(Array(point.prefix(64)))),
            ("66 bytes", b64url(point + [0])),
            ("compressed", b64url([0x02 | (point[64] & 1)] + Array(point[1..<33]))),
            ("off-curve", b64url(offCurve(point))),
            ("zero point", b64url([0x04] + [UInt8](repeating: 0, count: 64))),
            ("bad prefix", b64url([0x05] + Array(point[1...]))),
        ]
        for (name, value) in cases {
            let result = try herald(
                ["webpush", "encrypt", "--p256dh", value, "--auth", auth], stdin: Array("hi".utf8))
            #expect(result.status == 2, "\(name): \(result)")
            expectBadInput(result, mentioning: ["p256dh", "public key", "base64"])
        }
    }

    @Test("the off-curve message says so")
    func offCurveMessage() throws {
        let result = try herald(
            ["webpush", "encrypt", "--p256dh", b64url(offCurve(point)), "--auth", auth],
            stdin: Array("hi".utf8))
        expectBadInput(result, mentioning: ["curve", "point"])
    }

    @Test(
        "auth must be 16 bytes of base64url",
        arguments: [
            b64url([UInt8](repeating: 7, count: 15)), b64url([UInt8](repeating: 7, count: 17)),
            b64url([]), "AAAAAAAAAAAAAAAAAAAAA!", "AAAAAAAAAAAAAAAAAAAAAA===",
        ])
    func badAuth(value: String) throws {
        let result = try herald(
            ["webpush", "encrypt", "--p256dh", p256dh, "--auth", value], stdin: Array("hi".utf8))
        expectBadInput(result, mentioning: ["auth"])
    }

    @Test("--p256dh and --auth are required")
    func required() throws {
        expectBadInput(try herald(["webpush", "encrypt", "--auth", auth], stdin: [1]), mentioning: ["--p256dh"])
        expectBadInput(try herald(["webpush", "encrypt", "--p256dh", p256dh], stdin: [1]), mentioning: ["--auth"])
        expectBadInput(
            try herald(["webpush", "encrypt", "--p256dh", p256dh, "--auth"], stdin: [1]),
            mentioning: ["--auth"])
    }

    @Test("unknown options and stray arguments are bad input")
    func unknownOption() throws {
        expectBadInput(try encrypt([1], ["--ttl", "60"]), mentioning: ["--ttl"])
        expectBadInput(try encrypt([1], ["--urgency=high"]), mentioning: ["--urgency"])
        expectBadInput(try encrypt([1], ["plaintext.txt"]), mentioning: ["plaintext.txt"])
        expectBadInput(try encrypt([1], ["--pad", "200", "--pad", "300"]), mentioning: ["--pad"])
    }
}
