import HeraldIO
import Foundation
import HeraldConfiguration
import HeraldJSON
import JSONRPC

#if canImport(Glibc)
    import Glibc
#endif

/// A blocking JSON-RPC client over the daemon's Unix socket, for the CLI.
final class RPCClient {
    private let fd: Int32
    private var framer = JSONFramer()
    private var nextID = 1
    private var buffer = [UInt8](repeating: 0, count: 65536)

    init(socketPath: String) throws(CommandFailure) {
        do {
            fd = try connectUnixSocket(socketPath)
        } catch let error as SystemError {
            throw CommandFailure(
                "cannot connect to \(socketPath): \(String(cString: strerror(error.errno)))", status: 1)
        } catch {
            throw CommandFailure("cannot connect to \(socketPath): \(error)", status: 1)
        }
    }

    deinit { close(fd) }

    /// What came from the daemon: the answer to a request, or a notification.
    enum Incoming {
        /// `id` is nil when the daemon could not tell which request it answers.
        case response(id: Int?, Result<JSON, RPCError>)
        case notification(method: String, params: JSON)
    }

    /// Sends one request and waits for its response object; notifications
    /// that arrive meanwhile are passed over.
    func call(_ method: String, _ params: JSONObject) throws(CommandFailure) -> Result<JSON, RPCError> {
        let sent = try request(method, params)
        while true {
            // An answer without an id (a request the daemon could not read) is ours too.
            if case .response(let id, let result)? = try receive(timeoutMs: -1), id == nil || id == sent {
                return result
            }
        }
    }

    /// Writes one request; its id.
    func request(_ method: String, _ params: JSONObject) throws(CommandFailure) -> Int {
        let id = nextID
        nextID += 1
        let request: JSON = ["jsonrpc": "2.0", "id": .int(id), "method": .string(method), "params": .object(params)]
        let bytes = RPCResponse.frame(request)
        var sent = 0
        while sent < bytes.count {
            let n = bytes[sent...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n <= 0 {
                if n < 0 && errno == EINTR { continue }
                throw CommandFailure("cannot send to herald: \(String(cString: strerror(errno)))", status: 1)
            }
            sent += n
        }
        return id
    }

    /// The next message from the daemon; nil when none came within
    /// `timeoutMs` (-1: wait for one) or a signal interrupted the wait.
    func receive(timeoutMs: Int32) throws(CommandFailure) -> Incoming? {
        while true {
            if let frame = framer.next() {
                guard case .message(let message) = frame,
                    let parsed = try? JSONParser.parse(message), case .object(let object) = parsed
                else { throw CommandFailure("herald sent a malformed message", status: 1) }
                if object["id"] == nil, let method = object["method"]?.stringValue {
                    return .notification(method: method, params: object["params"] ?? .null)
                }
                let id = object["id"]?.numberValue?.int64.map { Int($0) }
                if let error = object["error"]?.objectValue {
                    return .response(
                        id: id,
                        .failure(
                            RPCError(
                                code: Int(error["code"]?.numberValue?.int64 ?? 0),
                                message: error["message"]?.stringValue ?? "", data: error["data"])))
                }
                return .response(id: id, .success(object["result"] ?? .null))
            }
            if timeoutMs >= 0 {
                var entry = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
                let ready = poll(&entry, 1, timeoutMs)
                if ready < 0 && errno != EINTR {
                    throw CommandFailure("cannot read from herald: \(String(cString: strerror(errno)))", status: 1)
                }
                if ready <= 0 { return nil }
            }
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n < 0 && errno == EINTR {
                if timeoutMs >= 0 { return nil }
                continue
            }
            if n <= 0 { throw CommandFailure("herald closed the connection", status: 1) }
            buffer.withUnsafeBytes { framer.append(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
        }
    }
}

/// The socket a client command talks to: --socket, then HERALD_SOCKET, then
/// the configuration's (from --config or HERALD_CONFIG, if readable).
func socketPath(_ options: Options) -> String {
    if let s = options.value("socket") { return s }
    let env = ProcessInfo.processInfo.environment
    if let s = env["HERALD_SOCKET"], !s.isEmpty { return s }
    let configPath = HeraldConfig.path(option: options.value("config"), environment: env)
    if let config = try? HeraldConfig.load(path: configPath, environment: env) {
        return config.server.socketPath
    }
    return HeraldConfig(environment: env).server.socketPath
}
