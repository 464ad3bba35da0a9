import HeraldCrypto

/// `herald webpush encrypt`: seal stdin into one aes128gcm record.
enum WebPushCommand {
    static let usage = """
        usage: herald webpush encrypt --p256dh B64 --auth B64 [--pad BYTES] < plaintext > body
          --pad BYTES  total body size to pad to (default \(WebPushSealer.defaultBodySize), \
        at most \(WebPushSealer.maximumBodySize)); 0 pads nothing beyond the delimiter
        """

    static func run(_ arguments: [String]) throws(CommandFailure) -> Int32 {
        guard let sub = arguments.first else {
            throw CommandFailure("webpush needs a command: encrypt")
        }
        switch sub {
        case "encrypt": return try encrypt(Array(arguments.dropFirst()))
        case "help", "--help", "-h":
            Terminal.out(usage)
            return 0
        default: throw CommandFailure("unknown webpush command '\(sub)' (try 'herald webpush help')")
        }
    }

    static func encrypt(_ arguments: [String]) throws(CommandFailure) -> Int32 {
        let options = try Options(arguments, values: ["p256dh", "auth", "pad"])
        try options.noPositional()
        let p256dhText = try options.required("p256dh")
        let authText = try options.required("auth")
        let pad = try options.integer(
            "pad", default: Int64(WebPushSealer.defaultBodySize),
            in: 0...Int64(WebPushSealer.maximumBodySize))
        let p256dh = try crypto("--p256dh") { () throws(CryptoError) in
            try Base64URL.decode(p256dhText)
        }
        let auth = try crypto("--auth") { () throws(CryptoError) in try Base64URL.decode(authText) }
        try crypto("--p256dh") { () throws(CryptoError) in try P256.checkPublicKey(p256dh) }
        let subscriber = try crypto("--auth") { () throws(CryptoError) in
            try WebPushSubscriber(p256dh: p256dh, auth: auth)
        }
        let plaintext = Terminal.readStandardInput()
        if pad != 0 && WebPushSealer.maximumPlaintext(bodySize: Int(pad)) == 0 {
            throw CommandFailure("--pad must be 0 or from 104 to \(WebPushSealer.maximumBodySize)")
        }
        let limit = WebPushSealer.maximumPlaintext(bodySize: Int(pad))
        if plaintext.count > limit {
            throw CommandFailure(
                "plaintext of \(plaintext.count) bytes does not fit the record "
                    + "(at most \(limit) bytes for --pad \(pad))")
        }
        let body = try crypto { () throws(CryptoError) in
            try WebPushSealer().seal(plaintext, for: subscriber, bodySize: Int(pad))
        }
        Terminal.writeOut(body)
        return 0
    }
}
