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

    /// Sends one request and waits for its response object.
    func call(_ method: String, _ params: JSONObject) throws(CommandFailure) -> Result<JSON, RPCError> {
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
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            if let frame = framer.next() {
                guard case .message(let message) = frame,
                    let response = try? JSONParser.parse(message), case .object(let object) = response
                else { throw CommandFailure("herald sent a malformed response", status: 1) }
                if let error = object["error"]?.objectValue {
                    return .failure(
                        RPCError(
                            code: Int(error["code"]?.numberValue?.int64 ?? 0),
                            message: error["message"]?.stringValue ?? "", data: error["data"]))
                }
                return .success(object["result"] ?? .null)
            }
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n < 0 && errno == EINTR { continue }
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
