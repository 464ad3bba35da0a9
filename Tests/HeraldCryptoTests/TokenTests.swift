import Foundation
import HeraldCrypto
import Testing

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
        var bad = parts.signature
        bad[10] ^= 1
        #expect(try !P256.verify(signature: bad, message: parts.signingInput, publicKey: k))
        #expect(throws: CryptoError.signatureLength) {
            try P256.verify(signature: Array(bad.prefix(63)), message: parts.signingInput, publicKey: k)
        }
    }

    @Test("signatures are fixed-width 64 bytes and verify")
    func es256() throws {
        // The C suite signs 10,000 messages and checks short r or s with an
        // independent verifier; this checks the Swift face end to end.
        let key = try P256PrivateKey.generate()
        for i in 0..<300 {
            let msg = Array("message \(i)".utf8)
            let sig = try key.sign(msg)
            #expect(sig.count == 64)
            #expect(try P256.verify(signature: sig, message: msg, publicKey: key.publicKey))
            #expect(try !P256.verify(signature: sig, message: msg + [0], publicKey: key.publicKey))
        }
    }

    @Test("keys round trip through PEM and the raw form")
    func keyForms() throws {
        let key = try P256PrivateKey.generate()
        let pem = try key.pem()
        #expect(pem.hasPrefix("-----BEGIN PRIVATE KEY-----"))
        #expect(try P256PrivateKey(text: pem).publicKey == key.publicKey)
        #expect(try P256PrivateKey(text: "\n  " + pem + "\n").publicKey == key.publicKey)
        #expect(throws: CryptoError.malformedPEM) {
            try P256PrivateKey(text: "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
        }
        #expect(throws: CryptoError.privateKeyLength) { try P256PrivateKey(raw: [1, 2, 3]) }
        #expect(throws: CryptoError.privateKeyRange) {
            try P256PrivateKey(raw: [UInt8](repeating: 0, count: 32))
        }
        #expect(throws: CryptoError.privateKeyRange) {
            try P256PrivateKey(raw: [UInt8](repeating: 0xff, count: 32))
        }
        let raw = RFC8291.asPrivate
        #expect(try P256PrivateKey(text: Base64URL.encode(raw)).publicKey == RFC8291.asPublic)
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
        #expect(try P256.verify(signature: parts.signature, message: parts.signingInput, publicKey: key.publicKey))
    }

    @Test("VAPID refuses a bad audience, subject or expiry")
    func vapidErrors() throws {
        let key = try P256PrivateKey.generate()
        let now: Int64 = 1_800_000_000
        func token(_ aud: String, _ sub: String, _ exp: Int64) throws -> String {
            try VAPID.token(key: key, audience: aud, subject: sub, expiresAt: exp, now: now)
        }
        #expect(throws: CryptoError.audience) { try token("http://push.example.net", "mailto:a@b.c", now + 60) }
        #expect(throws: CryptoError.audience) { try token("https://push.example.net/p/1", "mailto:a@b.c", now + 60) }
        #expect(throws: CryptoError.subject) { try token("https://push.example.net", "ops@example.com", now + 60) }
        #expect(throws: CryptoError.subject) { try token("https://push.example.net", "http://example.com", now + 60) }
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
        #expect(try P256.verify(signature: parts.signature, message: parts.signingInput, publicKey: key.publicKey))
        #expect(throws: CryptoError.claim) {
            try APNsProviderToken.make(key: key, keyID: "ABC123", teamID: "TEAM123456", issuedAt: 1)
        }
    }

    @Test("an FCM service account signs the OAuth assertion with RS256")
    func fcm() throws {
        let pem = String(decoding: try run("/usr/bin/openssl", [
            "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
        ]), as: UTF8.self)
        try #require(pem.contains("BEGIN PRIVATE KEY"))
        let object: [String: String] = [
            "type": "service_account", "project_id": "herald-test",
            "client_email": "push@herald-test.iam.gserviceaccount.com",
            "token_uri": "https://oauth2.googleapis.com/token", "private_key": pem,
        ]
        let json = try JSONSerialization.data(withJSONObject: object)
        let account = try FCMServiceAccount(json: [UInt8](json))
        #expect(account.projectID == "herald-test")
        let parts = try #require(jwsParts(try account.assertion(issuedAt: 1_800_000_000)))
        #expect(parts.header == #"{"alg":"RS256","typ":"JWT"}"#)
        #expect(
            parts.claims
                == #"{"iss":"push@herald-test.iam.gserviceaccount.com","scope":"https://www.googleapis.com/auth/firebase.messaging","aud":"https://oauth2.googleapis.com/token","iat":1800000000,"exp":1800003600}"#
        )
        #expect(parts.signature.count == 256)
        #expect(throws: CryptoError.expiry) { try account.assertion(issuedAt: 1_800_000_000, lifetime: 3601) }

        var missing = object
        missing["client_email"] = nil
        #expect(throws: CryptoError.serviceAccount) {
            try FCMServiceAccount(json: [UInt8](try JSONSerialization.data(withJSONObject: missing)))
        }
        #expect(throws: CryptoError.json) { try FCMServiceAccount(json: Array("{nope".utf8)) }
        var ecKey = object
        ecKey["private_key"] = try P256PrivateKey.generate().pem()
        #expect(throws: CryptoError.rsaKey) {
            try FCMServiceAccount(json: [UInt8](try JSONSerialization.data(withJSONObject: ecKey)))
        }
    }
}
