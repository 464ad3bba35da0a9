import Foundation
import HeraldCrypto
import Testing

/// A base64url public key as the CLI prints it: 65 bytes, uncompressed, on P-256.
private func expectPublicKey(
    _ text: String, sourceLocation: SourceLocation = #_sourceLocation
) {
    guard let point = try? unb64url(text) else {
        Issue.record("not base64url: \(text.debugDescription)", sourceLocation: sourceLocation)
        return
    }
    #expect(point.count == 65, "public key length", sourceLocation: sourceLocation)
    #expect(point.first == 0x04, "uncompressed point prefix", sourceLocation: sourceLocation)
    #expect(
        (try? P256.checkPublicKey(point)) != nil, "point on P-256",
        sourceLocation: sourceLocation)
}

@Suite("herald vapid generate")
struct VapidGenerateTests {
    @Test("--out writes a 0600 PKCS#8 PEM and prints the public key on stdout")
    func generateToFile() throws {
        let dir = try TempDir()
        let path = dir.path("key.pem")
        let result = try herald("vapid", "generate", "--out", path)
        #expect(result.status == 0, "\(result)")
        #expect(result.stderr.isEmpty, "\(result)")
        #expect(isSingleLine(result.stdoutText), "stdout is one line: \(result)")
        let publicKey = result.stdoutLine
        expectPublicKey(publicKey)

        let attributes = try FileManager.default.attributesOfItem(atPath: path)
        let mode = (attributes[.posixPermissions] as? NSNumber)?.intValue
        #expect(mode == 0o600, "file mode is \(String(mode ?? -1, radix: 8))")

        let pem = try String(contentsOfFile: path, encoding: .utf8)
        #expect(pem.hasPrefix("-----BEGIN PRIVATE KEY-----\n"))
        #expect(pem.hasSuffix("-----END PRIVATE KEY-----\n"))

        // The library reads the same key back and agrees on its public half.
        let key = try P256PrivateKey(text: SecretBytes(copying: pem.utf8))
        #expect(key.publicKeyBase64URL == publicKey)
    }

    @Test("--out refuses to overwrite an existing file and leaves it untouched")
    func refusesOverwrite() throws {
        let dir = try TempDir()
        let path = try dir.write("existing.pem", "precious contents\n")
        try FileManager.default.setAttributes(
            [.posixPermissions: NSNumber(value: 0o644)], ofItemAtPath: path)

        let result = try herald("vapid", "generate", "--out", path)
        expectBadInput(result, mentioning: ["existing.pem", "exists"])
        #expect(try String(contentsOfFile: path, encoding: .utf8) == "precious contents\n")
        let mode = try FileManager.default.attributesOfItem(atPath: path)[.posixPermissions]
        #expect((mode as? NSNumber)?.intValue == 0o644)
    }

    @Test("--out refuses to overwrite a file it wrote itself")
    func refusesOverwriteOfOwnKey() throws {
        let dir = try TempDir()
        let first = try generatedKey(in: dir)
        let before = try Data(contentsOf: URL(fileURLWithPath: first.path))
        let again = try herald("vapid", "generate", "--out", first.path)
        expectBadInput(again)
        #expect(try Data(contentsOf: URL(fileURLWithPath: first.path)) == before)
    }

    @Test("--out does not follow a dangling symlink")
    func refusesSymlink() throws {
        let dir = try TempDir()
        let target = dir.path("target.pem")
        let link = dir.path("link.pem")
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: target)
        let result = try herald("vapid", "generate", "--out", link)
        expectBadInput(result)
        #expect(!FileManager.default.fileExists(atPath: target))
    }

    @Test("--out into a missing directory is bad input")
    func missingDirectory() throws {
        let dir = try TempDir()
        let result = try herald("vapid", "generate", "--out", dir.path("no/such/dir/key.pem"))
        expectBadInput(result, mentioning: ["key.pem"])
    }

    @Test("without --out the PEM goes to stdout and the public key to stderr")
    func generateToStdout() throws {
        let dir = try TempDir()
        let result = try herald("vapid", "generate")
        #expect(result.status == 0, "\(result)")
        let pem = result.stdoutText
        #expect(pem.hasPrefix("-----BEGIN PRIVATE KEY-----\n"))
        #expect(pem.hasSuffix("-----END PRIVATE KEY-----\n"))
        #expect(!pem.contains("public key"))

        #expect(isSingleLine(result.stderr), "\(result)")
        let printed = try #require(
            result.stderr.split(whereSeparator: { $0 == " " || $0 == "\n" }).last.map(String.init))
        expectPublicKey(printed)

        let keyPath = try dir.write("stdout.pem", pem)
        let check = try herald("vapid", "public-key", "--key", keyPath)
        #expect(check.status == 0, "\(check)")
        #expect(check.stdoutLine == printed)
    }

    @Test("every run makes a new key")
    func freshKeys() throws {
        let dir = try TempDir()
        let a = try generatedKey(in: dir, name: "a.pem")
        let b = try generatedKey(in: dir, name: "b.pem")
        #expect(a.publicKey != b.publicKey)
    }

    @Test("a stray positional argument is bad input")
    func positional() throws {
        expectBadInput(try herald("vapid", "generate", "key.pem"), mentioning: ["key.pem"])
    }
}

@Suite("herald vapid public-key")
struct VapidPublicKeyTests {
    @Test("agrees with what generate printed")
    func agreesWithGenerate() throws {
        let dir = try TempDir()
        let key = try generatedKey(in: dir)
        let result = try herald("vapid", "public-key", "--key", key.path)
        #expect(result.status == 0, "\(result)")
        #expect(result.stderr.isEmpty)
        #expect(result.stdoutText == key.publicKey + "\n")
    }

    @Test("reads a PKCS#8 PEM written by HeraldCrypto")
    func pkcs8() throws {
        let dir = try TempDir()
        let key = try P256PrivateKey.generate()
        let path = try dir.write("pkcs8.pem", try key.pem())
        let result = try herald("vapid", "public-key", "--key", path)
        #expect(result.status == 0, "\(result)")
        #expect(result.stdoutLine == key.publicKeyBase64URL)
    }

    @Test("reads a SEC1 'EC PRIVATE KEY' PEM")
    func sec1() throws {
        let dir = try TempDir()
        let (scalar, key) = try randomRawKey()
        let text = pem(label: "EC PRIVATE KEY", der: sec1DER(scalar: scalar, publicKey: key.publicKey))
        let path = try dir.write("sec1.pem", text)
        let result = try herald("vapid", "public-key", "--key", path)
        #expect(result.status == 0, "\(result)")
        #expect(result.stdoutLine == key.publicKeyBase64URL)
    }

    @Test(
        "reads a base64url raw 32-byte key file",
        arguments: ["", "\n", "\r\n", "  \n\n"])
    func rawKey(trailer: String) throws {
        let dir = try TempDir()
        let (scalar, key) = try randomRawKey()
        let path = try dir.write("raw.key", b64url(scalar) + trailer)
        let result = try herald("vapid", "public-key", "--key", path)
        #expect(result.status == 0, "\(result)")
        #expect(result.stdoutLine == key.publicKeyBase64URL)
    }

    @Test("a known raw scalar gives its known public key (d = 1 is the generator)")
    func knownScalar() throws {
        let dir = try TempDir()
        let one = [UInt8](repeating: 0, count: 31) + [1]
        let path = try dir.write("one.key", b64url(one))
        let result = try herald("vapid", "public-key", "--key", path)
        #expect(result.status == 0, "\(result)")
        let g =
            "04"
            + "6b17d1f2e12c4247f8bce6e563a440f277037d812deb33a0f4a13945d898c296"
            + "4fe342e2fe1a7f9b8ee7eb4a7c0f9e162bce33576b315ececbb6406837bf51f5"
        #expect(try unb64url(result.stdoutLine).hexString == g)
    }

    @Test(
        "broken key files are bad input",
        arguments: [
            ("garbage.pem", "this is not a key\n"),
            ("empty.pem", ""),
            (
                "truncated.pem",
                "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg\n-----END PRIVATE KEY-----\n"
            ),
            ("nobody.pem", "-----BEGIN PRIVATE KEY-----\n-----END PRIVATE KEY-----\n"),
            ("noend.pem", "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg\n"),
            ("badb64.pem", "-----BEGIN PRIVATE KEY-----\n!!!!not base64!!!!\n-----END PRIVATE KEY-----\n"),
            ("short.key", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"),  // 31 bytes
            ("long.key", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"),  // 33 bytes
            ("zero.key", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"),  // scalar 0
            // The group order n: not a valid scalar.
            ("order.key", "_____wAAAAD__________7zm-q2nF56E87nKwvxjJVE"),
            ("std-b64.key", "+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/8="),
        ])
    func brokenKeyFile(name: String, contents: String) throws {
        let dir = try TempDir()
        let path = try dir.write(name, contents)
        expectBadInput(try herald("vapid", "public-key", "--key", path))
    }

    @Test("a PEM of a public key (not a private key) is bad input")
    func publicKeyPEM() throws {
        let dir = try TempDir()
        let key = try P256PrivateKey.generate()
        // SubjectPublicKeyInfo for P-256.
        let spki: [UInt8] =
            [0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01]
            + [0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07]
            + [0x03, 0x42, 0x00] + key.publicKey
        let path = try dir.write("pub.pem", pem(label: "PUBLIC KEY", der: spki))
        expectBadInput(try herald("vapid", "public-key", "--key", path))
    }

    @Test("a missing key file is bad input naming the file")
    func missingFile() throws {
        let dir = try TempDir()
        let result = try herald("vapid", "public-key", "--key", dir.path("absent.pem"))
        expectBadInput(result, mentioning: ["absent.pem"])
    }

    @Test("a directory given as the key file is bad input")
    func directoryAsKey() throws {
        let dir = try TempDir()
        expectBadInput(try herald("vapid", "public-key", "--key", dir.url.path))
    }

    @Test("--key is required")
    func keyRequired() throws {
        expectBadInput(try herald("vapid", "public-key"), mentioning: ["--key"])
        expectBadInput(try herald("vapid", "public-key", "--key"), mentioning: ["--key"])
    }
}

@Suite("herald vapid verify")
struct VapidVerifyTests {
    @Test("exit 0 when the public key belongs to the private key")
    func matching() throws {
        let dir = try TempDir()
        let key = try generatedKey(in: dir)
        let result = try herald("vapid", "verify", "--key", key.path, "--public-key", key.publicKey)
        #expect(result.status == 0, "\(result)")
    }

    @Test("exit 0 for a raw key file and its public key")
    func matchingRaw() throws {
        let dir = try TempDir()
        let (scalar, key) = try randomRawKey()
        let path = try dir.write("raw.key", b64url(scalar) + "\n")
        let result = try herald(
            "vapid", "verify", "--key", path, "--public-key", key.publicKeyBase64URL)
        #expect(result.status == 0, "\(result)")
    }

    @Test("exit 1 for another valid public key")
    func mismatch() throws {
        let dir = try TempDir()
        let key = try generatedKey(in: dir, name: "a.pem")
        let other = try generatedKey(in: dir, name: "b.pem")
        let result = try herald(
            "vapid", "verify", "--key", key.path, "--public-key", other.publicKey)
        #expect(result.status == 1, "\(result)")
        #expect(result.stdout.isEmpty, "\(result)")
    }

    @Test("exit 2 for a malformed, short or off-curve public key")
    func badPublicKey() throws {
        let dir = try TempDir()
        let key = try generatedKey(in: dir)
        let point = try unb64url(key.publicKey)
        let cases: [(String, [String])] = [
            ("not*base64url", ["base64"]),
            (key.publicKey + "==", ["base64"]),  // wrong padding for 65 bytes
            ("+" + key.publicKey.dropFirst(), ["base64"]),  // standard-alphabet character
            (b64url(Array(point.prefix(33))), ["65", "length", "public key"]),
            (b64url(Array(point.prefix(64))), ["65", "length", "public key"]),
            (b64url([0x02] + point[1..<33]), ["public key"]),  // compressed form
            (b64url(offCurve(point)), ["curve", "point"]),
            (b64url([0x04] + [UInt8](repeating: 0, count: 64)), ["curve", "public key"]),
        ]
        for (publicKey, words) in cases {
            let result = try herald(
                "vapid", "verify", "--key", key.path, "--public-key", publicKey)
            expectBadInput(result, mentioning: words)
        }
    }

    @Test("exit 2 for a broken or missing key file")
    func badKey() throws {
        let dir = try TempDir()
        let key = try generatedKey(in: dir)
        let broken = try dir.write("broken.pem", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
        expectBadInput(try herald("vapid", "verify", "--key", broken, "--public-key", key.publicKey))
        expectBadInput(
            try herald("vapid", "verify", "--key", dir.path("none.pem"), "--public-key", key.publicKey),
            mentioning: ["none.pem"])
        expectBadInput(try herald("vapid", "verify", "--key", key.path), mentioning: ["--public-key"])
    }
}
