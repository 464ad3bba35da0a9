internal import CHeraldCrypto

/// A failure reported by the C crypto core, one case per cause.
public enum CryptoError: Error, Equatable, Sendable, CustomStringConvertible {
    case invalidArgument
    case noMemory
    case random
    case crypto
    case bufferTooSmall
    case malformedBase64
    case publicKeyLength
    case publicKeyFormat
    case publicKeyNotOnCurve
    case authLength
    case privateKeyLength
    case privateKeyRange
    case malformedPEM
    case keyType
    case plaintextTooLarge
    case bodySize
    case json
    case audience
    case expiry
    case signatureLength
    case signatureInvalid
    case decrypt
    case sealedFormat
    case rsaKey
    case serviceAccount
    case claim
    case hkdfLength
    case recordSize
    case unknown(Int32)

    init(code: Int32) {
        switch Int(code) {
        case HC_E_INVALID_ARGUMENT: self = .invalidArgument
        case HC_E_NO_MEMORY: self = .noMemory
        case HC_E_RANDOM: self = .random
        case HC_E_CRYPTO: self = .crypto
        case HC_E_BUFFER_TOO_SMALL: self = .bufferTooSmall
        case HC_E_BASE64: self = .malformedBase64
        case HC_E_PUBLIC_KEY_LENGTH: self = .publicKeyLength
        case HC_E_PUBLIC_KEY_FORMAT: self = .publicKeyFormat
        case HC_E_PUBLIC_KEY_NOT_ON_CURVE: self = .publicKeyNotOnCurve
        case HC_E_AUTH_LENGTH: self = .authLength
        case HC_E_PRIVATE_KEY_LENGTH: self = .privateKeyLength
        case HC_E_PRIVATE_KEY_RANGE: self = .privateKeyRange
        case HC_E_PEM: self = .malformedPEM
        case HC_E_KEY_TYPE: self = .keyType
        case HC_E_PLAINTEXT_TOO_LARGE: self = .plaintextTooLarge
        case HC_E_BODY_SIZE: self = .bodySize
        case HC_E_JSON: self = .json
        case HC_E_AUDIENCE: self = .audience
        case HC_E_EXPIRY: self = .expiry
        case HC_E_SIGNATURE_LENGTH: self = .signatureLength
        case HC_E_SIGNATURE_INVALID: self = .signatureInvalid
        case HC_E_DECRYPT: self = .decrypt
        case HC_E_SEALED_FORMAT: self = .sealedFormat
        case HC_E_RSA_KEY: self = .rsaKey
        case HC_E_SERVICE_ACCOUNT: self = .serviceAccount
        case HC_E_CLAIM: self = .claim
        case HC_E_HKDF_LENGTH: self = .hkdfLength
        case HC_E_RECORD_SIZE: self = .recordSize
        default: self = .unknown(code)
        }
    }

    /// The core's result code for this error.
    public var code: Int32 {
        switch self {
        case .invalidArgument: Int32(HC_E_INVALID_ARGUMENT)
        case .noMemory: Int32(HC_E_NO_MEMORY)
        case .random: Int32(HC_E_RANDOM)
        case .crypto: Int32(HC_E_CRYPTO)
        case .bufferTooSmall: Int32(HC_E_BUFFER_TOO_SMALL)
        case .malformedBase64: Int32(HC_E_BASE64)
        case .publicKeyLength: Int32(HC_E_PUBLIC_KEY_LENGTH)
        case .publicKeyFormat: Int32(HC_E_PUBLIC_KEY_FORMAT)
        case .publicKeyNotOnCurve: Int32(HC_E_PUBLIC_KEY_NOT_ON_CURVE)
        case .authLength: Int32(HC_E_AUTH_LENGTH)
        case .privateKeyLength: Int32(HC_E_PRIVATE_KEY_LENGTH)
        case .privateKeyRange: Int32(HC_E_PRIVATE_KEY_RANGE)
        case .malformedPEM: Int32(HC_E_PEM)
        case .keyType: Int32(HC_E_KEY_TYPE)
        case .plaintextTooLarge: Int32(HC_E_PLAINTEXT_TOO_LARGE)
        case .bodySize: Int32(HC_E_BODY_SIZE)
        case .json: Int32(HC_E_JSON)
        case .audience: Int32(HC_E_AUDIENCE)
        case .expiry: Int32(HC_E_EXPIRY)
        case .signatureLength: Int32(HC_E_SIGNATURE_LENGTH)
        case .signatureInvalid: Int32(HC_E_SIGNATURE_INVALID)
        case .decrypt: Int32(HC_E_DECRYPT)
        case .sealedFormat: Int32(HC_E_SEALED_FORMAT)
        case .rsaKey: Int32(HC_E_RSA_KEY)
        case .serviceAccount: Int32(HC_E_SERVICE_ACCOUNT)
        case .claim: Int32(HC_E_CLAIM)
        case .hkdfLength: Int32(HC_E_HKDF_LENGTH)
        case .recordSize: Int32(HC_E_RECORD_SIZE)
        case .unknown(let code): code
        }
    }

    /// The core's one-sentence explanation.
    public var description: String { String(cString: hc_strerror(code)) }
}

/// Throws the typed error for a non-zero result code.
@inline(__always)
func check(_ rc: Int32) throws(CryptoError) {
    if rc != 0 { throw CryptoError(code: rc) }
}
