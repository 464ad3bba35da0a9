import HeraldCore
import JSONRPC

/// The interface's application errors (SPEC "Errors"), as values. `rpcError`
/// is the one place they become JSON-RPC errors: code, message and `data`.
enum ApplicationError: Error, Equatable {
    /// 1001: a Web Push endpoint resolves to an address that is not
    /// publicly routable. The answer does not say which: a caller must not
    /// learn what a name resolves to inside the host's network.
    case notPubliclyRoutable
    /// 1002: a per-user limit; a token comes back after `retryAfterMs`.
    case rateLimited(retryAfterMs: Int64)
    /// 1003: no such message in the app.
    case notFound(messageID: String)
    /// 1004
    case unknownApp(String)
    /// 1005: a transport's payload would pass its limit.
    case payloadTooLarge(PayloadTooLarge)
    /// 1006: the peer may not call the app.
    case forbidden(app: String)
    /// 1007: a bound was reached; try again after `retryAfterMs`.
    case overloaded(String, retryAfterMs: Int64)
    /// 1008: a registration older than the stored one.
    case conflict(reason: String, storedVersion: Int64)
    /// 1003: no such device of the user in the app (`device.update`).
    case deviceNotFound(deviceID: String)

    var code: Int {
        switch self {
        case .notPubliclyRoutable: 1001
        case .rateLimited: 1002
        case .notFound: 1003
        case .unknownApp: 1004
        case .payloadTooLarge: 1005
        case .forbidden: 1006
        case .overloaded: 1007
        case .conflict: 1008
        case .deviceNotFound: 1003
        }
    }

    /// `data.reason`, stable for clients to branch on.
    var reason: String {
        switch self {
        case .notPubliclyRoutable: "not_publicly_routable"
        case .rateLimited: "rate_limited"
        case .notFound: "not_found"
        case .unknownApp: "unknown_app"
        case .payloadTooLarge: "payload_too_large"
        case .forbidden: "forbidden"
        case .overloaded: "overloaded"
        case .conflict: "conflict"
        case .deviceNotFound: "not_found"
        }
    }

    var rpcError: RPCError {
        switch self {
        case .notPubliclyRoutable:
            .application(
                code: code, reason: reason, message: "endpoint resolves to an address that is not publicly routable",
                extra: [("field", "token")])
        case .rateLimited(let ms):
            .application(
                code: code, reason: reason, message: "rate limit reached", extra: [("retry_after_ms", .int(ms))])
        case .notFound(let messageID):
            .application(
                code: code, reason: reason, message: "no such message: \(messageID)",
                extra: [("message_id", .string(messageID))])
        case .unknownApp(let app):
            .application(code: code, reason: reason, message: "no such app: \(app)", extra: [("app", .string(app))])
        case .payloadTooLarge(let e):
            .application(
                code: code, reason: reason, message: e.description,
                extra: [("platform", .string(e.platform.rawValue)), ("limit", .int(e.limit)), ("size", .int(e.size))])
        case .forbidden(let app):
            .application(code: code, reason: reason, message: "this peer may not call app \(app)")
        case .overloaded(let message, let ms):
            .application(code: code, reason: reason, message: message, extra: [("retry_after_ms", .int(ms))])
        case .conflict(let why, let version):
            .application(code: code, reason: reason, message: why, extra: [("version", .int(version))])
        case .deviceNotFound(let deviceID):
            .application(
                code: code, reason: reason, message: "no such device: \(deviceID)",
                extra: [("device_id", .string(deviceID))])
        }
    }
}

extension RPCError {
    init(_ error: ApplicationError) { self = error.rpcError }
}
