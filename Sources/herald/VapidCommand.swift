import Foundation
import HeraldCrypto
import HeraldConfiguration
import HeraldNet

/// `herald vapid …`: generate, inspect and use VAPID keys.
enum VapidCommand {
    static let usage = """
        usage: herald vapid generate [--out FILE]
               herald vapid public-key --key FILE
               herald vapid verify --key FILE --public-key B64
               herald vapid token --key FILE --aud URL --sub SUBJECT [--exp SECONDS]
        """

    static func run(_ arguments: [String]) throws(CommandFailure) -> Int32 {
        guard let sub = arguments.first else {
            throw CommandFailure("vapid needs a command: generate, public-key, verify or token")
        }
        let rest = Array(arguments.dropFirst())
        switch sub {
        case "generate": return try generate(rest)
        case "public-key": return try publicKey(rest)
        case "verify": return try verify(rest)
        case "token": return try token(rest)
        case "help", "--help", "-h":
            Terminal.out(usage)
            return 0
        default: throw CommandFailure("unknown vapid command '\(sub)' (try 'herald vapid help')")
        }
    }

    /// A new key: with --out, the PEM goes to FILE (0600) and the public key
    /// to stdout; without it the PEM goes to stdout and the public key to stderr.
    static func generate(_ arguments: [String]) throws(CommandFailure) -> Int32 {
        let options = try Options(arguments, values: ["out"])
        try options.noPositional()
        let key = try crypto { () throws(CryptoError) in try P256PrivateKey.generate() }
        let pem = try crypto { () throws(CryptoError) in try key.pem() }
        if let out = options.value("out") {
            try writeSecretFile(out, Array(pem.utf8))
            Terminal.out(key.publicKeyBase64URL)
        } else {
            Terminal.writeOut(Array(pem.utf8))
            Terminal.err("public key: \(key.publicKeyBase64URL)")
        }
        return 0
    }

    static func publicKey(_ arguments: [String]) throws(CommandFailure) -> Int32 {
        let options = try Options(arguments, values: ["key"])
        try options.noPositional()
        let key = try loadKey(try options.required("key"))
        Terminal.out(key.publicKeyBase64URL)
        return 0
    }

    /// Exit 0 when the public key belongs to the private key, 1 when not.
    static func verify(_ arguments: [String]) throws(CommandFailure) -> Int32 {
        let options = try Options(arguments, values: ["key", "public-key"])
        try options.noPositional()
        let key = try loadKey(try options.required("key"))
        let text = try options.required("public-key")
        let given = try crypto("--public-key") { () throws(CryptoError) -> [UInt8] in
            let bytes = try Base64URL.decode(text)
            try P256.checkPublicKey(bytes)
            return bytes
        }
        if given == key.publicKey {
            Terminal.out("ok: the public key matches the private key")
            return 0
        }
        Terminal.err("mismatch: the public key does not belong to the private key")
        return 1
    }

    static func token(_ arguments: [String]) throws(CommandFailure) -> Int32 {
        let options = try Options(arguments, values: ["key", "aud", "sub", "exp"])
        try options.noPositional()
        let key = try loadKey(try options.required("key"))
        let audience = try origin(of: try options.required("aud"))
        let subject = try options.required("sub")
        guard VAPIDSubject.isValid(subject) else {
            throw CommandFailure("--sub: subject must be a mailto: or https: URL, got '\(subject)'")
        }
        let lifetime = try options.integer(
            "exp", default: VAPID.defaultLifetime, in: 1...VAPID.maximumLifetime)
        let now = Int64(Date().timeIntervalSince1970)
        let value = try crypto { () throws(CryptoError) in
            try VAPID.authorization(
                key: key, audience: audience, subject: subject, expiresAt: now + lifetime,
                now: now)
        }
        Terminal.out(value)
        return 0
    }

    /// The `aud` claim is the push service's origin: an endpoint URL given in
    /// full is reduced to scheme, host and any non-default port.
    static func origin(of url: String) throws(CommandFailure) -> String {
        guard let parsed = try? HTTPURL(parsing: url), parsed.scheme == .https else {
            throw CommandFailure("--aud must be an https URL, got '\(url)'")
        }
        return parsed.origin.description
    }

    static func loadKey(_ path: String) throws(CommandFailure) -> P256PrivateKey {
        let text = try readSecretFile(path)
        return try crypto(path) { () throws(CryptoError) in try P256PrivateKey(text: text) }
    }
}

/// Runs a crypto call, turning its error into a one-line failure that names
/// what was being read.
func crypto<T>(
    _ subject: String? = nil, _ body: () throws(CryptoError) -> T
)
    throws(CommandFailure) -> T
{
    do {
        return try body()
    } catch {
        if let subject { throw CommandFailure("\(subject): \(error.description)") }
        throw CommandFailure(error.description)
    }
}
