import Foundation
import HeraldTestSupport
@testable import HeraldDaemon
import Testing

@Suite("rpc.discover", .serialized)
struct OpenRPCTests {
    /// docs/openrpc.json, the document kept in the repository.
    static func repositoryDocument() throws -> [String: Any] {
        var dir = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        while !FileManager.default.fileExists(atPath: dir.appendingPathComponent("docs/openrpc.json").path) {
            dir = dir.deletingLastPathComponent()
            guard dir.path != "/" else { throw HarnessError("docs/openrpc.json not found") }
        }
        let data = try Data(contentsOf: dir.appendingPathComponent("docs/openrpc.json"))
        return try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
    }

    @Test("serves the repository's document, and it lists exactly the methods the daemon answers")
    func discover() throws {
        let d = try DaemonProcess()
        defer { d.cleanup() }
        let served = try #require(try d.call("rpc.discover").result)
        let kept = try Self.repositoryDocument()
        #expect(
            NSDictionary(dictionary: served).isEqual(to: kept), "run `make openrpc` after editing docs/openrpc.json")

        let methods = try #require(served["methods"] as? [[String: Any]])
        let names = Set(methods.compactMap { $0["name"] as? String })
        #expect(names.count == methods.count)
        #expect(names == Set(HeraldService.methods), "documented and served methods differ")
        let c = try d.connect()
        defer { c.close() }
        for name in names.sorted() {
            // Every documented method is answered by the running daemon: anything but -32601.
            let response = try c.call(name, [:])
            #expect(response.errorCode != -32601, "\(name) is documented but not served")
        }
    }
}
