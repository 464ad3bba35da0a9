public import HeraldJSON

/// A request id: a string, a number (echoed with its exact source text) or null.
public enum RPCID: Sendable, Hashable, CustomStringConvertible {
    case number(JSONNumber)
    case string(String)
    case null

    /// The id as it goes back in the response.
    public var json: JSON {
        switch self {
        case .number(let number): .number(number)
        case .string(let string): .string(string)
        case .null: .null
        }
    }

    public var description: String { json.description }
}

/// A well-formed request or notification.
public struct RPCRequest: Sendable, Equatable {
    /// Case-sensitive, as sent.
    public var method: String
    /// Named params; empty when the request had none.
    public var params: JSONObject
    /// Nil for a notification, which gets no response whatever happens.
    public var id: RPCID?

    public init(method: String, params: JSONObject = [:], id: RPCID?) {
        self.method = method
        self.params = params
        self.id = id
    }

    public var isNotification: Bool { id == nil }
}

/// A call that failed before reaching a method, and how to answer it.
public struct RPCFailure: Error, Sendable, Equatable {
    /// The id to answer with: the request's id when it could be read, `.null` when
    /// it could not (or the request was invalid and had none), nil when the call was
    /// a well-formed notification, which must not be answered.
    public var id: RPCID?
    public var error: RPCError

    public init(id: RPCID?, error: RPCError) {
        self.id = id
        self.error = error
    }

    /// The error response, or nil when none is due.
    public var response: JSON? {
        id.map { RPCResponse.failure(id: $0, error: error) }
    }
}

/// One call of a message: a request to dispatch, or a failure to answer as is.
public typealias RPCCall = Result<RPCRequest, RPCFailure>

extension Result where Success == RPCRequest, Failure == RPCFailure {
    /// True when the call is owed a response: a request with an id, or a failure
    /// with an id.
    public var expectsResponse: Bool {
        switch self {
        case .success(let request): request.id != nil
        case .failure(let failure): failure.id != nil
        }
    }
}

/// A decoded JSON-RPC 2.0 message.
///
/// Answer a `.single` with a bare response object (if one is due) and a `.batch`
/// with an array of the responses due, or with nothing at all when none is.
public enum RPCMessage: Sendable, Equatable {
    case single(RPCCall)
    case batch([RPCCall])

    /// The number of responses owed: the requests with ids plus the failures with ids.
    public var expectedResponseCount: Int {
        switch self {
        case .single(let call): call.expectsResponse ? 1 : 0
        case .batch(let calls): calls.reduce(0) { $0 + ($1.expectsResponse ? 1 : 0) }
        }
    }

    /// True when `bytes` is (or starts like) a batch of more than `limit`
    /// members. Counts the top-level array's members without parsing them and
    /// stops as soon as the count passes `limit`, so a huge batch costs a scan
    /// of its first `limit` members only. Anything that is not an array is false.
    public static func batchExceeds(_ bytes: some Collection<UInt8>, limit: Int) -> Bool {
        let scan = bytes.withContiguousStorageIfAvailable { batchExceeds(buffer: $0, limit: limit) }
        return scan ?? Array(bytes).withUnsafeBufferPointer { batchExceeds(buffer: $0, limit: limit) }
    }

    private static func batchExceeds(buffer: UnsafeBufferPointer<UInt8>, limit: Int) -> Bool {
        var i = 0
        let n = buffer.count
        while i < n, buffer[i] == 0x20 || buffer[i] == 0x09 || buffer[i] == 0x0A || buffer[i] == 0x0D { i += 1 }
        guard i < n, buffer[i] == 0x5B else { return false }  // [
        i += 1
        var depth = 1
        var members = 0
        var sawValue = false
        while i < n {
            let byte = buffer[i]
            i += 1
            switch byte {
            case 0x22:  // "
                sawValue = true
                while i < n {
                    let c = buffer[i]
                    i += 1
                    if c == 0x5C {  // backslash
                        i += 1
                    } else if c == 0x22 {
                        break
                    }
                }
            case 0x5B, 0x7B:  // [ {
                sawValue = true
                depth += 1
            case 0x5D, 0x7D:  // ] }
                depth -= 1
                if depth == 0 { return members + (sawValue ? 1 : 0) > limit }
            case 0x2C:  // ,
                if depth == 1 {
                    members += 1
                    if members >= limit { return true }
                }
            case 0x20, 0x09, 0x0A, 0x0D:
                break
            default:
                sawValue = true
            }
        }
        return members + (sawValue ? 1 : 0) > limit
    }

    /// Decodes one framed JSON text.
    ///
    /// Not JSON → `.single` -32700 (id null). `[]`, or a top level that is neither
    /// object nor array → `.single` -32600 (id null). A batch is decoded member by
    /// member; see ``decodeCall(_:)`` for the rules applied to each.
    public static func decode(_ bytes: some Collection<UInt8>) -> RPCMessage {
        let json: JSON
        do {
            json = try JSONParser.parse(bytes)
        } catch {
            return .single(
                .failure(
                    RPCFailure(id: .null, error: .parseError(error.reason, offset: error.offset))))
        }
        return decode(json)
    }

    /// Decodes one framed JSON text of at most `maxValues` JSON values; one with
    /// more is `.single` -32600 `too_many_values` (id null), found while parsing.
    public static func decode(_ bytes: some Collection<UInt8>, maxValues: Int) -> RPCMessage {
        let json: JSON
        do {
            json = try JSONParser.parse(bytes, maxValues: maxValues)
        } catch  where error.reason == JSONParser.tooManyValues {
            return .single(.failure(RPCFailure(id: .null, error: .tooManyValues(limit: maxValues))))
        } catch {
            return .single(
                .failure(
                    RPCFailure(id: .null, error: .parseError(error.reason, offset: error.offset))))
        }
        return decode(json)
    }

    /// Decodes an already parsed JSON text.
    public static func decode(_ json: JSON) -> RPCMessage {
        switch json {
        case .array(let elements):
            if elements.isEmpty {
                return .single(
                    .failure(RPCFailure(id: .null, error: .invalidRequest("empty batch"))))
            }
            return .batch(elements.map(decodeCall))
        case .object:
            return .single(decodeCall(json))
        default:
            return .single(
                .failure(RPCFailure(id: .null, error: .invalidRequest("request must be an object")))
            )
        }
    }

    /// Decodes one request object.
    ///
    /// Failures are -32600 unless noted, answered with the request's id when it is a
    /// valid id and otherwise with null:
    /// - not an object; `id` not a string, number or null (answered with null);
    /// - a member repeated, or a member other than `jsonrpc`, `method`, `params`, `id`;
    /// - `jsonrpc` not exactly the string "2.0"; `method` not a string;
    /// - `params` neither object nor array; an array `params` is -32602 ("params must
    ///   be an object": Herald takes params by name), which like any failure of a
    ///   well-formed notification gets no response.
    public static func decodeCall(_ json: JSON) -> RPCCall {
        guard case .object(let object) = json else {
            return .failure(
                RPCFailure(id: .null, error: .invalidRequest("request must be an object")))
        }
        var id: RPCID? = nil
        var jsonrpc: JSON? = nil
        var method: JSON? = nil
        var params: JSON? = nil
        var idSeen = false
        var idValid = true
        var duplicate: String? = nil
        var unknown: String? = nil
        for (key, value) in object.members {
            switch key {
            case "id":
                if idSeen {
                    duplicate = duplicate ?? key
                    idValid = false
                }
                idSeen = true
                switch value {
                case .number(let number): id = .number(number)
                case .string(let string): id = .string(string)
                case .null: id = .null
                default:
                    id = nil
                    idValid = false
                }
            case "jsonrpc":
                if jsonrpc != nil { duplicate = duplicate ?? key }
                jsonrpc = value
            case "method":
                if method != nil { duplicate = duplicate ?? key }
                method = value
            case "params":
                if params != nil { duplicate = duplicate ?? key }
                params = value
            default:
                unknown = unknown ?? key
            }
        }
        func invalid(_ reason: String) -> RPCCall {
            .failure(
                RPCFailure(id: idValid ? (id ?? .null) : .null, error: .invalidRequest(reason)))
        }
        if let duplicate { return invalid("duplicate member: \(duplicate)") }
        if !idValid { return invalid("id must be a string, number or null") }
        if let unknown { return invalid("unknown member: \(unknown)") }
        guard case .string("2.0") = jsonrpc else { return invalid("jsonrpc must be \"2.0\"") }
        guard case .string(let name) = method else { return invalid("method must be a string") }
        var named = JSONObject()
        switch params {
        case nil:
            break
        case .object(let object):
            named = object
        case .array:
            return .failure(
                RPCFailure(
                    id: id,
                    error: .invalidParams(field: "params", reason: "params must be an object")))
        default:
            return invalid("params must be an object")
        }
        return .success(RPCRequest(method: name, params: named, id: id))
    }
}
