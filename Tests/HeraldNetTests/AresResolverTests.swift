import Foundation
import Glibc
import HeraldTestSupport
import Testing
@testable import HeraldNet

/// A UDP socket on 127.0.0.1 that is never read: a name server that never answers.
private final class SilentNameServer {
    let fd: Int32
    let port: Int

    init() throws {
        let fd = socket(AF_INET, Int32(SOCK_DGRAM.rawValue), 0)
        self.fd = fd
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = UInt32(0x7f00_0001).bigEndian
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) }
        }
        guard bound == 0 else { throw POSIXError(.EADDRINUSE) }
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        port = Int(UInt16(bigEndian: address.sin_port))
    }

    deinit { close(fd) }
}

/// Threads of this process now.
private var threadCount: Int {
    (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task").count) ?? -1
}

@Suite("AresResolver (c-ares)", .serialized)
struct AresResolverTests {
    @Test("100 lookups on a name server that never answers hold no thread, and each ends at the timeout")
    func hungLookupsHoldNoThread() throws {
        let server = try SilentNameServer()
        let resolver = try AresResolver(timeout: .milliseconds(500), servers: "127.0.0.1:\(server.port)")
        let answers = Answers()
        Thread.sleep(forTimeInterval: 0.1)
        let before = threadCount
        let start = Date()
        for i in 0..<100 {
            resolver.lookup(host: "n\(i).hang\(i).example", port: 443, completion: answers.record("n\(i)"))
        }
        Thread.sleep(forTimeInterval: 0.2)
        #expect(resolver.outstanding == 100)
        #expect(threadCount <= before + 1, "threads: \(before) before, \(threadCount) with 100 hung lookups")
        #expect(answers.wait(for: 100, seconds: 10))
        #expect(Date().timeIntervalSince(start) >= 0.45)
        #expect(resolver.outstanding == 0)
        #expect(answers["n7"] == .failure(.failed(host: "n7.hang7.example", reason: "no answer within 500 ms")))
    }

    @Test("names in /etc/hosts are answered from it (when nsswitch.conf reads it)")
    func hostsFile() throws {
        let nsswitch = FileManager.default.contents(atPath: "/etc/nsswitch.conf").map {
            String(decoding: $0, as: UTF8.self)
        }
        let hosts = String(decoding: FileManager.default.contents(atPath: "/etc/hosts") ?? Data(), as: UTF8.self)
        guard AresResolver.hostsFileIsSource(nsswitch: nsswitch),
            hosts.split(whereSeparator: \.isNewline).contains(where: {
                $0.hasPrefix("127.0.0.1") && $0.split(whereSeparator: \.isWhitespace).contains("localhost")
            })
        else { return }
        // A silent name server: the answer can only come from the file.
        let server = try SilentNameServer()
        let resolver = try AresResolver(timeout: .milliseconds(500), servers: "127.0.0.1:\(server.port)")
        #expect(try resolver.resolve(host: "localhost", port: 443).contains(ip("127.0.0.1")))
    }

    @Test("nsswitch.conf's hosts line decides whether /etc/hosts is read")
    func nsswitch() {
        #expect(AresResolver.hostsFileIsSource(nsswitch: "passwd: files\nhosts: files dns\n"))
        #expect(AresResolver.hostsFileIsSource(nsswitch: "hosts:\tdns files mdns4\n"))
        #expect(!AresResolver.hostsFileIsSource(nsswitch: "passwd: files\nhosts: dns\n"))
        #expect(AresResolver.hostsFileIsSource(nsswitch: "passwd: files\n"))
        #expect(AresResolver.hostsFileIsSource(nsswitch: nil))
    }

    @Test("an empty name or one with a NUL does not exist, at once")
    func badNames() throws {
        let resolver = try AresResolver()
        #expect(throws: ResolverError.notFound(host: "")) { try resolver.resolve(host: "", port: 443) }
        #expect(throws: ResolverError.notFound(host: "a\u{0}b")) { try resolver.resolve(host: "a\u{0}b", port: 443) }
    }
}
