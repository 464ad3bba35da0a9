import Foundation
@testable import HeraldDaemon
import HeraldCrypto
import Testing
@testable import HeraldConfiguration

#if canImport(Glibc)
    import Glibc
#endif

/// The VAPID subject is checked in one place, when the configuration loads
/// (the crypto core writes whatever it is given). These are the cases the core
/// used to refuse, with the configuration's own.
@Suite("VAPID subject")
struct VAPIDSubjectTests {
    static let file = "/etc/herald/herald.conf"

    @Test(
        "a mailto: address or an https: URL is a subject",
        arguments: [
            "mailto:push@example.com", "mailto:a@b.c", "https://example.com/contact", "https://example.com",
            "https://example.com:8443/x", "mailto:ops@example.com;x",
        ])
    func good(subject: String) throws {
        #expect(VAPIDSubject.isValid(subject))
        let config = try HeraldConfig.parse("[app.default]\nvapid_subject = \(subject)\n", file: Self.file)
        #expect(config.apps["default"]?.vapidSubject == subject)
    }

    @Test(
        "anything else is refused when the configuration loads",
        arguments: [
            "ops@example.com", "http://x", "http://example.com", "ftp://example.com", "tel:+123",
            "example.com", "mailto:", "mailto:ops", "mailto:@example.com", "mailto:ops@",
            "mailto:mailto:a@b.c", "https://", "https:///contact", "https://:443", "https://@example.com",
            "mailto:ops @example.com", "mailto:ops@exam\u{7f}ple.com", "https://exam\u{85}ple.com",
            "mailto:ops@example.com\u{a0}", "MAILTO:ops@example.com",
        ])
    func bad(subject: String) throws {
        #expect(!VAPIDSubject.isValid(subject))
        let error = try #require(throws: ConfigError.self) {
            try HeraldConfig.parse("[app.default]\nvapid_subject = \(subject)\n", file: Self.file)
        }
        #expect(error.key == "vapid_subject")
        #expect(error.description.contains("mailto: or https:"), "\(error)")
    }

    @Test("control characters and tabs are refused")
    func control() {
        for subject in ["mailto:a@b.c\n", "mailto:a\t@b.c", "https://a\u{0}.example", "https://a.example\r"] {
            #expect(!VAPIDSubject.isValid(subject), "\(subject.debugDescription)")
        }
    }
}

/// The readers hand key files over as SecretBytes, never as `String` or `Array`.
@Suite("Key file readers")
struct KeyFileReaderTests {
    @Test("a credential file comes back as SecretBytes holding exactly its bytes")
    func readSecret() throws {
        let dir = try KeyDirectory()
        let bytes = Array("-----BEGIN PRIVATE KEY-----\nnot really\n-----END PRIVATE KEY-----\n".utf8)
        let path = try dir.write("key.pem", bytes)
        let secret: SecretBytes = try ConfigIO.readSecret(path, limit: 64 * 1024)
        #expect(secret.count == bytes.count)
        #expect(secret.withUnsafeBytes { Array($0) } == bytes)
        #expect(!"\(secret)".contains("PRIVATE"))
        #expect(throws: ConfigIOError.self) { try ConfigIO.readSecret(path, limit: bytes.count - 1) }
        #expect(throws: ConfigIOError.self) { try ConfigIO.readSecret(dir.path, limit: 64 * 1024) }
        #expect(throws: ConfigIOError.self) { try ConfigIO.readSecret(dir.path + "/absent", limit: 64) }
        let empty = try ConfigIO.readSecret(try dir.write("empty", [UInt8]()), limit: 64)
        #expect(empty.count == 0)
    }

    @Test("the store key file is read into a StoreKey that opens what a key of the same bytes sealed")
    func storeKey() throws {
        let dir = try KeyDirectory()
        let raw = (0..<32).map { UInt8($0 * 7 & 0xff) }
        let path = try dir.write("store.key", raw, mode: 0o600)
        let loaded = try #require(try loadStoreKey(path: path))
        let sealed = try StoreKey(SecretBytes(copying: raw)).seal([1, 2, 3], context: [9])
        #expect(try loaded.open(sealed, context: [9]) == [1, 2, 3])
        let short = try dir.write("short.key", Array(raw.prefix(31)), mode: 0o600)
        let error = try #require(throws: ConfigError.self) { try loadStoreKey(path: short) }
        #expect(error.description.contains("exactly 32 bytes"), "\(error)")
    }
}

/// A scratch directory for key files, removed afterwards.
private final class KeyDirectory {
    let path: String

    init() throws {
        var template = Array("/tmp/herald-keys-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { throw CocoaError(.fileWriteUnknown) }
        path = String(cString: made)
    }

    func write(_ name: String, _ bytes: [UInt8], mode: mode_t = 0o600) throws -> String {
        let file = path + "/" + name
        try Data(bytes).write(to: URL(fileURLWithPath: file))
        guard chmod(file, mode) == 0 else { throw CocoaError(.fileWriteNoPermission) }
        return file
    }

    deinit { try? FileManager.default.removeItem(atPath: path) }
}
