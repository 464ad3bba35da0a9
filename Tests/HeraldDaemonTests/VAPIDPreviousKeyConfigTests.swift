import Foundation
import HeraldCrypto
import HeraldTestSupport
import Testing

@testable import HeraldDaemon
@testable import HeraldConfiguration

@Suite("Configuration: vapid_key_previous (VAPID key rotation)")
struct VAPIDPreviousKeyConfigTests {
    typealias Dir = ConfigTests.TemporaryDirectory

    static func section(_ lines: String) -> String {
        "[app.default]\nvapid_subject = mailto:ops@example.com\n\(lines)"
    }

    @Test("the previous key loads beside the current one, in the same forms (PEM or raw), and is never shown")
    func loads() throws {
        let dir = try Dir()
        let current = try P256PrivateKey.generate()
        let previousRaw = [UInt8](repeating: 0x22, count: 32)
        let previous = try P256PrivateKey(raw: SecretBytes(copying: previousRaw))
        try dir.write("vapid.pem", try current.pem())
        try dir.write("old.raw", Base64URL.encode(previousRaw) + "\n")
        let config = try HeraldConfig.parse(
            Self.section("vapid_key = vapid.pem\nvapid_key_previous = old.raw\n"), file: dir.path + "/herald.conf")
        #expect(config.apps["default"]?.vapidKeyPrevious?.path == dir.path + "/old.raw")
        let vapid = try #require(try LoadedCredentials.load(config)["default"]?.webPush.value)
        #expect(vapid.publicKey == current.publicKeyBase64URL)
        #expect(vapid.previousPublicKey == previous.publicKeyBase64URL)
        #expect(vapid.previous?.publicKey == previous.publicKey)
        #expect(vapid.acceptedPublicKeys == [current.publicKeyBase64URL, previous.publicKeyBase64URL])
        let shown = "\(vapid) \(String(reflecting: vapid))"
        #expect(!shown.contains(Base64URL.encode(previousRaw)) && !shown.contains("BEGIN"), "\(shown)")
        #expect(config.description.contains("vapid_key_previous = \(dir.path)/old.raw"), "paths only")

        let none = try HeraldConfig.parse(Self.section("vapid_key = vapid.pem\n"), file: dir.path + "/herald.conf")
        let only = try #require(try LoadedCredentials.load(none)["default"]?.webPush.value)
        #expect(only.previous == nil && only.acceptedPublicKeys == [current.publicKeyBase64URL])
    }

    @Test("vapid_key_previous without vapid_key, the same key twice, or an unreadable file is refused, naming the key")
    func refused() throws {
        let dir = try Dir()
        let secret = "SECRET-CONTENT-DO-NOT-PRINT"
        let current = try P256PrivateKey.generate()
        try dir.write("vapid.pem", try current.pem())
        try dir.write("copy.pem", try current.pem())
        try dir.write("garbage.pem", "-----BEGIN PRIVATE KEY-----\n\(secret)\n-----END PRIVATE KEY-----\n")
        let file = dir.path + "/herald.conf"

        var error = try #require(throws: ConfigError.self) {
            try HeraldConfig.parse(Self.section("vapid_key_previous = copy.pem\n"), file: file)
        }
        #expect(error.line == 3 && error.key == "vapid_key_previous" && error.message.contains("needs vapid_key"))

        func loadError(_ lines: String) throws -> ConfigError {
            let config = try HeraldConfig.parse(Self.section(lines), file: file)
            return try #require(throws: ConfigError.self) { try LoadedCredentials.load(config) }
        }
        error = try loadError("vapid_key = vapid.pem\nvapid_key_previous = copy.pem\n")
        #expect(error.key == "vapid_key_previous" && error.message.contains("same key"), "\(error)")
        error = try loadError("vapid_key = vapid.pem\nvapid_key_previous = missing.pem\n")
        #expect(error.line == 4 && error.key == "vapid_key_previous" && error.message.contains("cannot read"))
        error = try loadError("vapid_key = vapid.pem\nvapid_key_previous = garbage.pem\n")
        #expect(error.key == "vapid_key_previous" && error.message.contains("is not a P-256 private key"))
        #expect(!error.description.contains(secret))
    }
}

@Suite("herald register --application-server-key")
struct RegisterServerKeyCommandTests {
    @Test("the option reaches device.register as application_server_key")
    func passedOn() throws {
        let d = try DaemonProcess()
        defer { d.cleanup() }
        let key = try P256PrivateKey.generate().publicKeyBase64URL
        let (status, out, err) = try runHerald([
            "register", "--user", "alice", "--platform", "fcm", "--token", "fcm-alice", "--application-server-key", key,
            "--socket", d.socketPath,
        ])
        #expect(status == 1 && out.isEmpty, "\(out)")
        #expect(err.contains("\"field\":\"application_server_key\"") && err.contains("is only for web"), "\(err)")
    }
}
