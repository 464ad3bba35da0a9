import Foundation
import HeraldCrypto
import HeraldTestSupport
import Testing

// Every signature Herald makes is checked by OpenSSL (the openssl command line,
// OpenSSLVerifier), not by Herald's own verifier: a bug shared by Herald's
// signer and verifier (a JOSE/DER mix-up, a wrong hash, a short r or s not
// padded) would pass a check by the verifier alone.

@Suite("ES256, VAPID, APNs and FCM tokens")
struct TokenTests {
    @Test("RFC 8292 §2.4: the example token verifies with its k")
    func rfc8292Example() throws {
        let token =
            "eyJ0eXAiOiJKV1QiLCJhbGciOiJFUzI1NiJ9.eyJhdWQiOiJodHRwczovL3B1c2guZXhhbXBsZS5uZXQiLCJleHAiOjE0NTM1MjM3NjgsInN1YiI6Im1haWx0bzpwdXNoQGV4YW1wbGUuY29tIn0.i3CYb7t4xfxCDquptFOepC9GAu_HLGkMlMuCGSK2rpiUfnK9ojFwDXb1JrErtmysazNjjvW2L9OkSSHzvoD1oA"
        let k = b64("BA1Hxzyi1RUM1b5wjxsn7nGxAszw2u61m164i3MrAIxHF6YK5h4SDYic-dRuU_RCPCfA5aq9ojSwk5Y2EmClBPs")
        let parts = try #require(jwsParts(token))
        #expect(parts.header == #"{"typ":"JWT","alg":"ES256"}"#)
        #expect(try P256.verify(signature: parts.signature, message: parts.signingInput, publicKey: k))
        // The published token checks the OpenSSL helper itself.
        #expect(try OpenSSLVerifier.verifyES256(message: parts.signingInput, signature: parts.signature, publicKey: k))
        var bad = parts.signature
        bad[10] ^= 1
        #expect(try !P256.verify(signature: bad, message: parts.signingInput, publicKey: k))
        #expect(try !OpenSSLVerifier.verifyES256(message: parts.signingInput, signature: bad, publicKey: k))
        #expect(throws: CryptoError.signatureLength) {
            try P256.verify(signature: Array(bad.prefix(63)), message: parts.signingInput, publicKey: k)
        }
    }

    @Test("signatures are fixed-width 64 bytes and OpenSSL verifies them, short r or s included")
    func es256() throws {
        // About one signature in 128 has an r or s with a leading zero byte, the
        // case a signer that does not left-pad to 32 bytes gets wrong: sign until
        // two such signatures are found, and have OpenSSL check them and 20 others.
        let key = try P256PrivateKey.generate()
        var ordinary = 0
        var short = 0
        for i in 0..<5000 where short < 2 || ordinary < 20 {
            let msg = Array("message \(i)".utf8)
            let sig = try key.sign(msg)
            try #require(sig.count == 64)
            let isShort = sig[0] == 0 || sig[32] == 0
            guard isShort || ordinary < 20 else { continue }
            if isShort { short += 1 } else { ordinary += 1 }
            #expect(
                try OpenSSLVerifier.verifyES256(message: msg, signature: sig, publicKey: key.publicKey),
                "OpenSSL refuses signature \(i)\(isShort ? " (short r or s)" : "")")
            if i % 8 == 0 || isShort {
                #expect(try !OpenSSLVerifier.verifyES256(message: msg + [0], signature: sig, publicKey: key.publicKey))
            }
        }
        #expect(short == 2 && ordinary == 20, "short \(short), ordinary \(ordinary)")
    }

    @Test("keys round trip through PEM and the raw form")
    func keyForms() throws {
        let key = try P256PrivateKey.generate()
        let pem = try key.pem()
        #expect(pem.hasPrefix("-----BEGIN PRIVATE KEY-----"))
        #expect(try P256PrivateKey(text: secret(pem)).publicKey == key.publicKey)
        #expect(try P256PrivateKey(text: secret("\n  " + pem + "\n")).publicKey == key.publicKey)
        #expect(throws: CryptoError.malformedPEM) {
            try P256PrivateKey(text: secret("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"))
        }
        #expect(throws: CryptoError.privateKeyLength) { try P256PrivateKey(raw: secret([1, 2, 3])) }
        #expect(throws: CryptoError.privateKeyLength) {
            try P256PrivateKey(raw: secret([UInt8](repeating: 1, count: 33)))
        }
        #expect(throws: CryptoError.privateKeyRange) {
            try P256PrivateKey(raw: secret([UInt8](repeating: 0, count: 32)))
        }
        #expect(throws: CryptoError.privateKeyRange) {
            try P256PrivateKey(raw: secret([UInt8](repeating: 0xff, count: 32)))
        }
        let raw = RFC8291.asPrivate
        #expect(try P256PrivateKey(raw: secret(raw)).publicKey == RFC8291.asPublic)
        #expect(try P256PrivateKey(text: secret(Base64URL.encode(raw))).publicKey == RFC8291.asPublic)
        #expect(try P256PrivateKey(text: secret(Base64URL.encode(raw) + "\r\n")).publicKey == RFC8291.asPublic)
        #expect(throws: CryptoError.privateKeyLength) {
            try P256PrivateKey(text: secret(Base64URL.encode(raw + [0])))
        }
        #expect(throws: CryptoError.self) { try P256PrivateKey(text: secret("")) }
    }

    @Test("a VAPID token has the RFC 8292 header and claims and verifies")
    func vapid() throws {
        let key = try P256PrivateKey.generate()
        let now: Int64 = 1_800_000_000
        let auth = try VAPID.authorization(
            key: key, audience: "https://fcm.googleapis.com", subject: "mailto:ops@example.com",
            expiresAt: now + 43_200, now: now)
        #expect(auth.hasPrefix("vapid t="))
        #expect(auth.hasSuffix(", k=" + key.publicKeyBase64URL))
        let token = String(auth.dropFirst(8).prefix { $0 != "," })
        let parts = try #require(jwsParts(token))
        #expect(parts.header == #"{"typ":"JWT","alg":"ES256"}"#)
        #expect(
            parts.claims
                == #"{"aud":"https://fcm.googleapis.com","exp":1800043200,"sub":"mailto:ops@example.com"}"#
        )
        #expect(
            try OpenSSLVerifier.verifyES256(
                message: parts.signingInput, signature: parts.signature, publicKey: key.publicKey))
        #expect(
            try OpenSSLVerifier.verifyES256(message: parts.signingInput, signature: parts.signature, keyPEM: key.pem()))
    }

    @Test("VAPID refuses a bad audience or expiry and writes the subject it is given")
    func vapidErrors() throws {
        let key = try P256PrivateKey.generate()
        let now: Int64 = 1_800_000_000
        func token(_ aud: String, _ sub: String, _ exp: Int64) throws -> String {
            try VAPID.token(key: key, audience: aud, subject: sub, expiresAt: exp, now: now)
        }
        #expect(throws: CryptoError.audience) { try token("http://push.example.net", "mailto:a@b.c", now + 60) }
        #expect(throws: CryptoError.audience) { try token("https://push.example.net/p/1", "mailto:a@b.c", now + 60) }
        // The subject is checked where it is configured (VAPIDSubject in HeraldDaemon).
        for sub in ["ops@example.com", "http://example.com", #"a "quoted" \ subject"#] {
            let parts = try #require(jwsParts(try token("https://push.example.net", sub, now + 60)))
            let claims = try JSONSerialization.jsonObject(with: Data(parts.claims.utf8)) as? [String: Any]
            #expect(claims?["sub"] as? String == sub)
        }
        #expect(throws: CryptoError.expiry) { try token("https://push.example.net", "mailto:a@b.c", now) }
        #expect(throws: CryptoError.expiry) { try token("https://push.example.net", "mailto:a@b.c", now + 86_401) }
        #expect(try token("https://push.example.net:8443", "https://example.com/contact", now + 86_400).count > 0)
    }

    @Test("an APNs provider token carries kid, iss and iat")
    func apns() throws {
        let key = try P256PrivateKey.generate()
        let token = try APNsProviderToken.make(
            key: key, keyID: "ABC123DEFG", teamID: "TEAM123456", issuedAt: 1_800_000_000)
        let parts = try #require(jwsParts(token))
        #expect(parts.header == #"{"alg":"ES256","kid":"ABC123DEFG"}"#)
        #expect(parts.claims == #"{"iss":"TEAM123456","iat":1800000000}"#)
        #expect(
            try OpenSSLVerifier.verifyES256(
                message: parts.signingInput, signature: parts.signature, publicKey: key.publicKey))
        #expect(
            try OpenSSLVerifier.verifyES256(message: parts.signingInput, signature: parts.signature, keyPEM: key.pem()))
        #expect(throws: CryptoError.claim) {
            try APNsProviderToken.make(key: key, keyID: "ABC123", teamID: "TEAM123456", issuedAt: 1)
        }
    }

    @Test("an FCM service account signs the OAuth assertion with RS256")
    func fcm() throws {
        let pem = String(
            decoding: try run(
                "/usr/bin/openssl",
                [
                    "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
                ]), as: UTF8.self)
        try #require(pem.contains("BEGIN PRIVATE KEY"))
        let object: [String: String] = [
            "type": "service_account", "project_id": "herald-test",
            "client_email": "push@herald-test.iam.gserviceaccount.com",
            "token_uri": "https://oauth2.googleapis.com/token", "private_key": pem,
        ]
        let json = try JSONSerialization.data(withJSONObject: object)
        let account = try FCMServiceAccount(json: SecretBytes(copying: json))
        #expect(account.projectID == "herald-test")
        let scope = "https://www.googleapis.com/auth/firebase.messaging"
        let parts = try #require(jwsParts(try account.assertion(scope: scope, issuedAt: 1_800_000_000)))
        #expect(parts.header == #"{"alg":"RS256","typ":"JWT"}"#)
        #expect(
            parts.claims
                == #"{"iss":"push@herald-test.iam.gserviceaccount.com","scope":"https://www.googleapis.com/auth/firebase.messaging","aud":"https://oauth2.googleapis.com/token","iat":1800000000,"exp":1800003600}"#
        )
        #expect(parts.signature.count == 256)
        #expect(try OpenSSLVerifier.verifyRS256(message: parts.signingInput, signature: parts.signature, keyPEM: pem))
        var tampered = parts.signingInput
        tampered[tampered.count - 1] ^= 1
        #expect(try !OpenSSLVerifier.verifyRS256(message: tampered, signature: parts.signature, keyPEM: pem))
        #expect(throws: CryptoError.expiry) {
            try account.assertion(scope: scope, issuedAt: 1_800_000_000, lifetime: 3601)
        }
        // The scope is the caller's; one outside RFC 6749's grammar is refused.
        let other = try #require(
            jwsParts(
                try account.assertion(scope: "https://www.googleapis.com/auth/cloud-platform", issuedAt: 1_800_000_000))
        )
        #expect(other.claims.contains(#""scope":"https://www.googleapis.com/auth/cloud-platform""#))
        for bad in ["", " \(scope)", "\(scope)  x", "a\"b", "a\nb"] {
            #expect(throws: CryptoError.claim) { try account.assertion(scope: bad, issuedAt: 1_800_000_000) }
        }

        var missing = object
        missing["client_email"] = nil
        #expect(throws: CryptoError.serviceAccount) {
            try FCMServiceAccount(json: SecretBytes(copying: try JSONSerialization.data(withJSONObject: missing)))
        }
        #expect(throws: CryptoError.json) { try FCMServiceAccount(json: secret("{nope")) }
        var ecKey = object
        ecKey["private_key"] = try P256PrivateKey.generate().pem()
        #expect(throws: CryptoError.rsaKey) {
            try FCMServiceAccount(json: SecretBytes(copying: try JSONSerialization.data(withJSONObject: ecKey)))
        }
    }
}
