import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// Checks of Herald's signatures by a party other than Herald: the `openssl`
/// command line (OpenSSL's own ECDSA and RSA verifiers), never Herald's C core.
public enum OpenSSLVerifier {
    /// True when `openssl dgst -sha256 -verify` accepts `signature`, a JOSE
    /// ES256 signature (r || s, 32 bytes each), over `message` for the P-256
    /// public key `publicKey` (65-byte uncompressed point). A signature that is
    /// not 64 bytes is false: JOSE has no other form.
    public static func verifyES256(message: [UInt8], signature: [UInt8], publicKey: [UInt8]) throws -> Bool {
        guard signature.count == 64, publicKey.count == 65 else { return false }
        return try verify(message: message, signature: derECDSA(signature), publicKeyPEM: spkiPEM(publicKey))
    }

    /// The same check with the key as a PEM file holds it (public, or private:
    /// OpenSSL reads the key itself and takes its public half).
    public static func verifyES256(message: [UInt8], signature: [UInt8], keyPEM: String) throws -> Bool {
        guard signature.count == 64 else { return false }
        return try verify(message: message, signature: derECDSA(signature), publicKeyPEM: try publicPEM(keyPEM))
    }

    /// True when `openssl dgst -sha256 -verify` accepts `signature`, an RS256
    /// (RSASSA-PKCS1-v1_5 with SHA-256) signature, over `message` for the key
    /// whose PEM (public, or private: its public half is taken with `openssl pkey`) is given.
    public static func verifyRS256(message: [UInt8], signature: [UInt8], keyPEM: String) throws -> Bool {
        try verify(message: message, signature: signature, publicKeyPEM: try publicPEM(keyPEM))
    }

    /// A public key PEM as is; a private key's public half, by `openssl pkey -pubout`.
    private static func publicPEM(_ keyPEM: String) throws -> String {
        guard keyPEM.contains("PRIVATE KEY") else { return keyPEM }
        let (status, out, err) = try runOpenSSL(["pkey", "-pubout"], stdin: Array(keyPEM.utf8))
        guard status == 0 else { throw HarnessError("openssl pkey -pubout: \(err)") }
        return out
    }

    /// The DER ECDSA-Sig-Value (SEQUENCE of two INTEGERs) of a JOSE r || s signature.
    public static func derECDSA(_ rs: [UInt8]) -> [UInt8] {
        func integer(_ bytes: ArraySlice<UInt8>) -> [UInt8] {
            var v = Array(bytes.drop { $0 == 0 })
            if v.isEmpty || v[0] & 0x80 != 0 { v.insert(0, at: 0) }
            return [0x02, UInt8(v.count)] + v
        }
        let body = integer(rs[0..<32]) + integer(rs[32..<64])
        return [0x30, UInt8(body.count)] + body
    }

    private static func verify(message: [UInt8], signature: [UInt8], publicKeyPEM: String) throws -> Bool {
        let dir = URL(fileURLWithPath: "/tmp").appendingPathComponent("ossl-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let pub = dir.appendingPathComponent("pub.pem")
        let sig = dir.appendingPathComponent("sig.bin")
        let msg = dir.appendingPathComponent("msg.bin")
        try Data(publicKeyPEM.utf8).write(to: pub)
        try Data(signature).write(to: sig)
        try Data(message).write(to: msg)
        let (status, out, err) = try runOpenSSL([
            "dgst", "-sha256", "-verify", pub.path, "-signature", sig.path, msg.path,
        ])
        // Exit 1 with "Verification failure" is a bad signature; anything else
        // (a key OpenSSL cannot read, a missing file) is a broken test, not a verdict.
        if status == 0 && out.contains("Verified OK") { return true }
        if status == 1 && out.contains("Verification failure") { return false }
        throw HarnessError("openssl dgst -verify: status \(status): \(out) \(err)")
    }

    private static func runOpenSSL(_ arguments: [String], stdin: [UInt8] = []) throws -> (Int32, String, String) {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
        p.arguments = arguments
        let input = Pipe()
        let out = Pipe()
        let err = Pipe()
        p.standardInput = input
        p.standardOutput = out
        p.standardError = err
        try p.run()
        input.fileHandleForWriting.write(Data(stdin))
        try input.fileHandleForWriting.close()
        let o = out.fileHandleForReading.readDataToEndOfFile()
        let e = err.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        return (p.terminationStatus, String(decoding: o, as: UTF8.self), String(decoding: e, as: UTF8.self))
    }
}

/// libsodium's XChaCha20-Poly1305 (IETF) called directly (dlsym), not through
/// Herald's C core: the reference the at-rest sealing format is checked against.
public enum Libsodium {
    /// crypto_aead_xchacha20poly1305_ietf_encrypt(c, clen_p, m, mlen, ad, adlen, nsec, npub, k)
    private typealias Encrypt =
        @convention(c) (
            UnsafeMutablePointer<UInt8>?, UnsafeMutablePointer<UInt64>?, UnsafePointer<UInt8>?, UInt64,
            UnsafePointer<UInt8>?, UInt64, UnsafePointer<UInt8>?, UnsafePointer<UInt8>?, UnsafePointer<UInt8>?
        ) -> Int32

    private static func symbol<T>(_ name: String, as type: T.Type) throws -> T {
        guard let handle = dlopen("libsodium.so.23", RTLD_NOW) else {
            throw HarnessError("dlopen libsodium.so.23: \(String(cString: dlerror()))")
        }
        guard let sym = dlsym(handle, name) else { throw HarnessError("dlsym \(name)") }
        return unsafeBitCast(sym, to: type)
    }

    private static func initialise() throws {
        typealias Init = @convention(c) () -> Int32
        guard try symbol("sodium_init", as: Init.self)() >= 0 else { throw HarnessError("sodium_init failed") }
    }

    /// ciphertext || tag (16 bytes).
    public static func xchacha20poly1305Encrypt(
        message: [UInt8], ad: [UInt8], nonce: [UInt8], key: [UInt8]
    ) throws -> [UInt8] {
        guard nonce.count == 24, key.count == 32 else { throw HarnessError("nonce 24 bytes, key 32") }
        try initialise()
        let encrypt = try symbol("crypto_aead_xchacha20poly1305_ietf_encrypt", as: Encrypt.self)
        var out = [UInt8](repeating: 0, count: message.count + 16)
        var len: UInt64 = 0
        let rc = encrypt(&out, &len, message, UInt64(message.count), ad, UInt64(ad.count), nil, nonce, key)
        guard rc == 0, len == UInt64(out.count) else { throw HarnessError("xchacha20poly1305 encrypt: \(rc)") }
        return out
    }

    /// The plaintext, or nil when the tag does not verify.
    public static func xchacha20poly1305Decrypt(
        ciphertext: [UInt8], ad: [UInt8], nonce: [UInt8], key: [UInt8]
    ) throws -> [UInt8]? {
        guard nonce.count == 24, key.count == 32 else { throw HarnessError("nonce 24 bytes, key 32") }
        guard ciphertext.count >= 16 else { return nil }
        try initialise()
        typealias Decrypt =
            @convention(c) (
                UnsafeMutablePointer<UInt8>?, UnsafeMutablePointer<UInt64>?, UnsafeMutablePointer<UInt8>?,
                UnsafePointer<UInt8>?, UInt64, UnsafePointer<UInt8>?, UInt64, UnsafePointer<UInt8>?,
                UnsafePointer<UInt8>?
            ) -> Int32
        let decrypt = try symbol("crypto_aead_xchacha20poly1305_ietf_decrypt", as: Decrypt.self)
        var out = [UInt8](repeating: 0, count: max(ciphertext.count - 16, 1))
        var len: UInt64 = 0
        let rc = decrypt(&out, &len, nil, ciphertext, UInt64(ciphertext.count), ad, UInt64(ad.count), nonce, key)
        return rc == 0 ? Array(out[0..<Int(len)]) : nil
    }
}
