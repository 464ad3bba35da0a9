public import HeraldJSON

/// A JSON-RPC 2.0 error object: what a method throws and what the client receives.
///
/// Standard errors carry `data.reason` (a short lowercase phrase) and, for
/// -32602, `data.field`. Application errors use positive codes with a stable
/// `data.reason` a client can branch on.
public struct RPCError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The error codes of the JSON-RPC 2.0 specification.
    public enum Code {
        public static let parseError = -32700
        public static let invalidRequest = -32600
        public static let methodNotFound = -32601
        public static let invalidParams = -32602
        public static let internalError = -32603
    }

    public var code: Int
    public var message: String
    public var data: JSON?

    public init(code: Int, message: String, data: JSON? = nil) {
        self.code = code
        self.message = message
        self.data = data
    }

    /// -32700: the text is not JSON. `data` = `{"reason", "offset"?}`.
    public static func parseError(_ reason: String, offset: Int? = nil) -> RPCError {
        var data: JSONObject = ["reason": .string(reason)]
        if let offset { data["offset"] = .int(offset) }
        return RPCError(code: Code.parseError, message: "Parse error", data: .object(data))
    }

    /// -32600: the JSON is not a valid request object. `data` = `{"reason"}`.
    public static func invalidRequest(_ reason: String) -> RPCError {
        RPCError(
            code: Code.invalidRequest, message: "Invalid Request", data: ["reason": .string(reason)]
        )
    }

    /// -32600 for a message longer than the framer's limit: `data` =
    /// `{"reason": "message too large", "limit"}`. Send it with id null, then close.
    public static func messageTooLarge(limit: Int) -> RPCError {
        RPCError(
            code: Code.invalidRequest, message: "Invalid Request",
            data: ["reason": "message too large", "limit": .int(limit)])
    }

    /// -32600 for a batch of more calls than the server takes: `data` =
    /// `{"reason": "batch_too_large", "limit"}`, with id null; no call of it is run.
    public static func batchTooLarge(limit: Int) -> RPCError {
        RPCError(
            code: Code.invalidRequest, message: "Invalid Request",
            data: ["reason": "batch_too_large", "limit": .int(limit)])
    }

    /// -32600 for a message of more JSON values than the server parses: `data` =
    /// `{"reason": "too_many_values", "limit"}`, with id null.
    public static func tooManyValues(limit: Int) -> RPCError {
        RPCError(
            code: Code.invalidRequest, message: "Invalid Request",
            data: ["reason": "too_many_values", "limit": .int(limit)])
    }

    /// -32601. `data` = `{"method"}`.
    public static func methodNotFound(_ method: String) -> RPCError {
        RPCError(
            code: Code.methodNotFound, message: "Method not found",
            data: ["method": .string(method)])
    }

    /// -32602. `data` = `{"field", "reason"}`, where `field` is a dotted path such as
    /// `keys.p256dh` or `to.users[3]`.
    public static func invalidParams(field: String, reason: String) -> RPCError {
        RPCError(
            code: Code.invalidParams, message: "Invalid params",
            data: ["field": .string(field), "reason": .string(reason)])
    }

    /// -32603. `data` = `{"reason"}` when a reason is given.
    public static func internalError(_ reason: String? = nil) -> RPCError {
        RPCError(
            code: Code.internalError, message: "Internal error",
            data: reason.map { ["reason": .string($0)] })
    }

    /// An application error: `data` = `{"reason": reason, …extra}`.
    public static func application(
        code: Int, reason: String, message: String, extra: [(String, JSON)] = []
    ) -> RPCError {
        var data: JSONObject = ["reason": .string(reason)]
        for (key, value) in extra { data.append(key, value) }
        return RPCError(code: code, message: message, data: .object(data))
    }

    /// `data.reason`, when present.
    public var reason: String? { data?["reason"]?.stringValue }

    /// `data.field`, when present.
    public var field: String? { data?["field"]?.stringValue }

    /// The error object as sent: `{"code", "message", "data"?}`.
    public var json: JSON {
        var object: JSONObject = ["code": .int(code), "message": .string(message)]
        if let data { object.append("data", data) }
        return .object(object)
    }

    public var description: String {
        "\(code) \(message)" + (data.map { " \($0)" } ?? "")
    }
}
