import Foundation
import HeraldCrypto
import HeraldTestSupport
import Testing

/// The parts of `vapid t=<JWT>, k=<public key>`.
struct VapidAuthorization {
    let headerPart: String
    let claimsPart: String
    let signaturePart: String
    let k: String

    struct Claims: Decodable {
        let aud: String
        let exp: Int64
        let sub: String
    }

    init(_ line: String) throws {
        let prefix = "vapid t="
        try #require(line.hasPrefix(prefix), "does not start with 'vapid t=': \(line)")
        let rest = line.dropFirst(prefix.count)
        let halves = rest.components(separatedBy: ", k=")
        try #require(halves.count == 2, "no single ', k=' in \(line)")
        let jwt = halves[0].split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        try #require(jwt.count == 3, "JWT has \(jwt.count) parts")
        headerPart = jwt[0]
        claimsPart = jwt[1]
        signaturePart = jwt[2]
        k = halves[1]
    }

    var header: [UInt8] { get throws { try unb64url(headerPart) } }
    var claimsBytes: [UInt8] { get throws { try unb64url(claimsPart) } }
    var claims: Claims {
        get throws { try JSONDecoder().decode(Claims.self, from: Data(try claimsBytes)) }
    }
    var signature: [UInt8] { get throws { try unb64url(signaturePart) } }
    var signingInput: [UInt8] { Array("\(headerPart).\(claimsPart)".utf8) }
}

private func now() -> Int64 { Int64(Date().timeIntervalSince1970) }

@Suite("herald vapid token")
struct VapidTokenTests {
    let dir: TempDir
    let key: (path: String, publicKey: String)

    init() throws {
        dir = try TempDir()
        key = try generatedKey(in: dir)
    }

    private func token(
        _ extra: [String], aud: String = "https://push.example.net",
        sub: String = "mailto:ops@example.com"
    ) throws -> RunResult {
        try herald(["vapid", "token", "--key", key.path, "--aud", aud, "--sub", sub] + extra)
    }

    @Test("prints 'vapid t=<JWT>, k=<key>' with the exact ES256 header and a signature that verifies")
    func wellFormed() throws {
        let before = now()
        let result = try token([])
        let after = now()
        #expect(result.status == 0, "\(result)")
        #expect(result.stderr.isEmpty, "\(result)")
        #expect(isSingleLine(result.stdoutText), "\(result)")
        let auth = try VapidAuthorization(result.stdoutLine)

        #expect(try auth.header == Array(#"{"typ":"JWT","alg":"ES256"}"#.utf8))
        let claims = try auth.claims
        #expect(claims.aud == "https://push.example.net")
        #expect(claims.sub == "mailto:ops@example.com")
        #expect(
            claims.exp >= before + 43_200 && claims.exp <= after + 43_200,
            "exp \(claims.exp) not within now+12h [\(before + 43_200), \(after + 43_200)]")

        #expect(auth.k == key.publicKey)
        let publicKey = try unb64url(auth.k)
        let signature = try auth.signature
        #expect(signature.count == 64)
        // OpenSSL checks the signature, with k and with the key file as OpenSSL reads it.
        #expect(try OpenSSLVerifier.verifyES256(message: auth.signingInput, signature: signature, publicKey: publicKey))
        let keyPEM = try String(contentsOfFile: key.path, encoding: .utf8)
        #expect(try OpenSSLVerifier.verifyES256(message: auth.signingInput, signature: signature, keyPEM: keyPEM))

        // The check is meaningful: a changed claim or another key fails.
        var tampered = auth.signingInput
        tampered[tampered.count - 1] ^= 0x01
        #expect(try !OpenSSLVerifier.verifyES256(message: tampered, signature: signature, publicKey: publicKey))
        let other = try P256PrivateKey.generate().publicKey
        #expect(try !OpenSSLVerifier.verifyES256(message: auth.signingInput, signature: signature, publicKey: other))
    }

    @Test("k equals the key's public key as public-key prints it")
    func kMatchesPublicKey() throws {
        let printed = try herald("vapid", "public-key", "--key", key.path)
        let auth = try VapidAuthorization(try token([]).stdoutLine)
        #expect(auth.k == printed.stdoutLine)
    }

    @Test("works with a raw base64url key file and a SEC1 PEM")
    func otherKeyFormats() throws {
        let (scalar, raw) = try randomRawKey()
        let rawPath = try dir.write("raw.key", b64url(scalar))
        let sec1Path = try dir.write(
            "sec1.pem", pem(label: "EC PRIVATE KEY", der: sec1DER(scalar: scalar, publicKey: raw.publicKey)))
        for path in [rawPath, sec1Path] {
            let result = try herald(
                "vapid", "token", "--key", path, "--aud", "https://a.example", "--sub", "https://b.example/contact")
            #expect(result.status == 0, "\(result)")
            let auth = try VapidAuthorization(result.stdoutLine)
            #expect(auth.k == raw.publicKeyBase64URL)
            #expect(
                try OpenSSLVerifier.verifyES256(
                    message: auth.signingInput, signature: auth.signature, publicKey: raw.publicKey))
        }
    }

    @Test("--exp sets the lifetime in seconds", arguments: [1, 60, 3600, 86_400])
    func lifetime(seconds: Int64) throws {
        let before = now()
        let result = try token(["--exp", String(seconds)])
        let after = now()
        #expect(result.status == 0, "\(result)")
        let claims = try VapidAuthorization(result.stdoutLine).claims
        #expect(
            claims.exp >= before + seconds && claims.exp <= after + seconds,
            "exp \(claims.exp) not within now+\(seconds)")
    }

    @Test("--exp=60 inline form works")
    func inlineExp() throws {
        let before = now()
        let result = try token(["--exp=60"])
        #expect(result.status == 0, "\(result)")
        let claims = try VapidAuthorization(result.stdoutLine).claims
        #expect(claims.exp >= before + 60 && claims.exp <= now() + 60)
    }

    @Test(
        "--exp over 24 h, zero, negative or not a number is bad input",
        arguments: ["86401", "172800", "0", "-1", "1e3", "60s", "", "99999999999999999999"])
    func badLifetime(value: String) throws {
        expectBadInput(try token(["--exp", value]), mentioning: ["--exp"])
    }

    @Test(
        "a full endpoint URL given as --aud is reduced to its origin",
        arguments: [
            ("https://fcm.googleapis.com/fcm/send/abc", "https://fcm.googleapis.com"),
            ("https://h.example:8443/x", "https://h.example:8443"),
            ("https://h.example:443/x", "https://h.example"),
            ("https://h.example", "https://h.example"),
            ("https://h.example/", "https://h.example"),
            (
                "https://updates.push.services.mozilla.com/wpush/v2/gAAAAAB?x=1#frag",
                "https://updates.push.services.mozilla.com"
            ),
            ("https://web.push.apple.com/QGuQyavXutnMH6ZHlHz", "https://web.push.apple.com"),
            ("https://Push.Example.COM/Path", "https://push.example.com"),
            ("https://[2001:DB8::1]:8443/x", "https://[2001:db8::1]:8443"),
            ("HTTPS://h.example?x=1", "https://h.example"),
        ])
    func audienceOrigin(input: String, expected: String) throws {
        let result = try token([], aud: input)
        #expect(result.status == 0, "\(result)")
        #expect(try VapidAuthorization(result.stdoutLine).claims.aud == expected)
    }

    @Test(
        "--aud must be an https URL",
        arguments: [
            "http://fcm.googleapis.com/fcm/send/abc", "ftp://h.example", "h.example",
            "https://", "not a url", "https://user:pw@h.example/", "https://h.example:99999/",
            "https://[fe80::1%25eth0]/",
        ])
    func badAudience(aud: String) throws {
        expectBadInput(try token([], aud: aud), mentioning: ["aud"])
    }

    @Test(
        "the subject may be mailto: or https:",
        arguments: ["mailto:ops@example.com", "https://example.com/contact"])
    func goodSubject(sub: String) throws {
        let result = try token([], sub: sub)
        #expect(result.status == 0, "\(result)")
        #expect(try VapidAuthorization(result.stdoutLine).claims.sub == sub)
    }

    @Test(
        "any other subject is bad input",
        arguments: ["ops@example.com", "http://example.com", "mailto:", "tel:+123", "example.com"])
    func badSubject(sub: String) throws {
        expectBadInput(try token([], sub: sub), mentioning: ["sub"])
    }

    @Test("--key, --aud and --sub are required")
    func required() throws {
        expectBadInput(
            try herald("vapid", "token", "--aud", "https://a.example", "--sub", "mailto:a@b.c"),
            mentioning: ["--key"])
        expectBadInput(
            try herald("vapid", "token", "--key", key.path, "--sub", "mailto:a@b.c"),
            mentioning: ["--aud"])
        expectBadInput(
            try herald("vapid", "token", "--key", key.path, "--aud", "https://a.example"),
            mentioning: ["--sub"])
        expectBadInput(try token([], sub: ""), mentioning: ["--sub"])
    }

    @Test("a broken or missing key file is bad input")
    func badKey() throws {
        let broken = try dir.write(
            "broken.pem", "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEI\n-----END EC PRIVATE KEY-----\n")
        expectBadInput(
            try herald("vapid", "token", "--key", broken, "--aud", "https://a.example", "--sub", "mailto:a@b.c"))
        expectBadInput(
            try herald(
                "vapid", "token", "--key", dir.path("gone.pem"), "--aud", "https://a.example",
                "--sub", "mailto:a@b.c"),
            mentioning: ["gone.pem"])
    }
}
