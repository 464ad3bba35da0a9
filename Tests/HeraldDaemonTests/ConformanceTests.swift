import Foundation
import HeraldTestSupport
import HeraldJSON
import JSONRPC
import Testing

#if canImport(Glibc)
    import Glibc
#endif

// MARK: - One daemon per suite

/// Starts one `herald serve` before a suite's first test and stops it after the
/// last; the suite's tests reach it through ``SuiteDaemon/current``.
///
/// `appSections` receives a scratch directory (removed afterwards) where it may
/// write key files, and returns the app sections of the configuration.
struct SuiteDaemon: SuiteTrait, TestScoping {
    @TaskLocal static var current: DaemonProcess?

    let appSections: @Sendable (_ scratch: String) throws -> String
    let allowPrivate: Bool
    /// Extra `[server]` lines.
    var server = ""

    var isRecursive: Bool { false }

    func provideScope(
        for test: Test, testCase: Test.Case?, performing function: @Sendable () async throws -> Void
    ) async throws {
        let scratch = "/tmp/hds-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: scratch, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let daemon = try DaemonProcess(
            appSections: try appSections(scratch), allowPrivate: allowPrivate, server: server)
        defer { daemon.cleanup() }
        try await Self.$current.withValue(daemon) { try await function() }
        #expect(daemon.isRunning, "the daemon exited during the suite:\n\(daemon.log(tail: 40))")
        #expect(daemon.stop() == 0, "the daemon did not stop cleanly:\n\(daemon.log(tail: 40))")
    }

    /// The daemon of the enclosing suite.
    static func daemon() throws -> DaemonProcess {
        guard let current else { throw HarnessError("no SuiteDaemon trait on this suite") }
        return current
    }
}

extension Trait where Self == SuiteDaemon {
    /// One daemon for the suite, with these app sections.
    static func sharedDaemon(
        allowPrivate: Bool = false, server: String = "",
        appSections: @escaping @Sendable (_ scratch: String) throws -> String
    ) -> Self {
        SuiteDaemon(appSections: appSections, allowPrivate: allowPrivate, server: server)
    }
}

// MARK: - Response matching

/// Matching of JSON-RPC responses against expectations written as JSON
/// (see Tests/Fixtures/conformance/README.md).
enum ResponseMatch {
    /// The wildcard string of expectations.
    static let any = "<any>"

    /// `expected` matches `actual`: objects without regard to member order,
    /// arrays in order, numbers by their text, `"<any>"` matches anything.
    static func matches(_ expected: JSON, _ actual: JSON) -> Bool {
        if case .string(any) = expected { return true }
        switch (expected, actual) {
        case (.null, .null): return true
        case (.bool(let e), .bool(let a)): return e == a
        case (.number(let e), .number(let a)): return e.text == a.text
        case (.string(let e), .string(let a)): return e == a
        case (.array(let e), .array(let a)):
            return e.count == a.count && zip(e, a).allSatisfy { matches($0, $1) }
        case (.object(let e), .object(let a)):
            guard e.count == a.count, !e.hasDuplicateKeys, !a.hasDuplicateKeys else { return false }
            return e.members.allSatisfy { member in a[member.key].map { matches(member.value, $0) } ?? false }
        default:
            return false
        }
    }

    /// One response line: a top-level array (a batch response) is a multiset.
    static func matchesResponse(_ expected: JSON, _ actual: JSON) -> Bool {
        if case .array(let e) = expected, case .array(let a) = actual {
            return multisetMatches(e, a, matches)
        }
        return matches(expected, actual)
    }

    /// Every expected item pairs with a distinct actual item (bipartite matching).
    static func multisetMatches(_ expected: [JSON], _ actual: [JSON], _ match: (JSON, JSON) -> Bool) -> Bool {
        guard expected.count == actual.count else { return false }
        let edges = expected.map { e in actual.indices.filter { match(e, actual[$0]) } }
        var owner = [Int?](repeating: nil, count: actual.count)
        func augment(_ i: Int, _ seen: inout [Bool]) -> Bool {
            for j in edges[i] where !seen[j] {
                seen[j] = true
                if owner[j] == nil || augment(owner[j]!, &seen) {
                    owner[j] = i
                    return true
                }
            }
            return false
        }
        for i in expected.indices {
            var seen = [Bool](repeating: false, count: actual.count)
            if !augment(i, &seen) { return false }
        }
        return true
    }

    /// What every response line must be, whatever was asked: strict compact
    /// JSON with U+2028/U+2029 escaped. Returns the parsed value or a complaint.
    static func checkLine(_ line: String) -> Result<JSON, HarnessError> {
        if line.unicodeScalars.contains(where: { $0 == "\u{2028}" || $0 == "\u{2029}" }) {
            return .failure(HarnessError("raw U+2028/U+2029 in the response (must be escaped): \(line)"))
        }
        let value: JSON
        do {
            value = try JSONParser.parse(line)
        } catch {
            return .failure(HarnessError("response is not JSON (\(error)): \(line)"))
        }
        if value.serialized() != Array(line.utf8) {
            return .failure(HarnessError("response is not compact JSON: \(line)"))
        }
        return .success(value)
    }
}

// MARK: - Fixture files

/// One request/expectation pair of a fixture file.
struct ConformanceCase: Sendable {
    let number: Int
    let line: Int
    let request: [UInt8]
    let requestText: String
    /// Empty for `<no response>`.
    let expected: [JSON]
    let expectedText: String
}

enum ConformanceFixtures {
    static var directory: URL {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Fixtures/conformance")
    }

    /// The fixture file names, sorted.
    static func fileNames() -> [String] {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: directory.path)) ?? []
        return names.filter { $0.hasSuffix(".jsonl") }.sorted()
    }

    static func load(_ name: String) throws -> [ConformanceCase] {
        let data = try Data(contentsOf: directory.appendingPathComponent(name))
        // Only LF separates lines: U+2028 and friends are content.
        let lines = data.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false)
            .map { String(decoding: $0, as: UTF8.self) }
        var cases: [ConformanceCase] = []
        var pending: (line: Int, text: String)? = nil
        for (index, text) in lines.enumerated() {
            if text.isEmpty || text.hasPrefix("#") { continue }
            guard let request = pending else {
                pending = (index + 1, text)
                continue
            }
            pending = nil
            let where_ = "\(name):\(request.line)"
            cases.append(
                ConformanceCase(
                    number: cases.count + 1, line: request.line,
                    request: try requestBytes(request.text, where_), requestText: request.text,
                    expected: try expectations(text, "\(name):\(index + 1)"), expectedText: text))
        }
        if let pending { throw HarnessError("\(name):\(pending.line): a request without an expected line") }
        return cases
    }

    private static func requestBytes(_ text: String, _ where_: String) throws -> [UInt8] {
        if text.hasPrefix("@raw ") {
            guard case .string(let raw) = try JSONParser.parse(String(text.dropFirst(5))) else {
                throw HarnessError("\(where_): @raw takes one JSON string")
            }
            return Array(raw.utf8)
        }
        if text.hasPrefix("@hex ") {
            let hex = Array(text.dropFirst(5).utf8)
            guard hex.count % 2 == 0 else { throw HarnessError("\(where_): odd number of hex digits") }
            var bytes: [UInt8] = []
            for i in stride(from: 0, to: hex.count, by: 2) {
                guard let byte = UInt8(String(decoding: hex[i...i + 1], as: UTF8.self), radix: 16) else {
                    throw HarnessError("\(where_): not hex")
                }
                bytes.append(byte)
            }
            return bytes
        }
        return Array(text.utf8) + [UInt8(ascii: "\n")]
    }

    private static func expectations(_ text: String, _ where_: String) throws -> [JSON] {
        if text == "<no response>" { return [] }
        var framer = JSONFramer()
        framer.append(Array(text.utf8))
        var values: [JSON] = []
        while let frame = framer.finish() {
            guard case .message(let bytes) = frame else { throw HarnessError("\(where_): expectation too large") }
            do {
                values.append(try JSONParser.parse(bytes))
            } catch {
                throw HarnessError("\(where_): expectation is not JSON: \(error)")
            }
        }
        guard !values.isEmpty else { throw HarnessError("\(where_): empty expectation") }
        return values
    }
}

// MARK: - The runner

@Suite(
    "JSON-RPC conformance fixtures", .serialized,
    .sharedDaemon { scratch in
        // A fixed VAPID key, so vapid.public_key has a known answer.
        let key = "\(scratch)/vapid.key"
        try "qS1-ymX1VPQrqX07r9b3zRmhM2gN4aUu3Zf0JmaCFLE".write(toFile: key, atomically: true, encoding: .utf8)
        try makeKeyFilePrivate(key)
        return """
            [app.default]
            device_cap = 20
            vapid_key = \(key)
            vapid_subject = mailto:ops@example.com

            [app.locked]
            allow_uids = 4242
            """
    })
struct ConformanceTests {
    /// Sent after every case: a request answered at once, and one answered by the
    /// store, whose queue is first in first out, so that a late response to the
    /// case (a store call that should not have been answered) shows up before it.
    static let syncRequest = Array(
        (#"{"jsonrpc":"2.0","id":"sync","method":"system.health"}"# + "\n"
            + #"{"jsonrpc":"2.0","id":"sync-store","method":"device.list","params":{"user":"sync"}}"# + "\n").utf8)

    @Test("the fixture folder has cases")
    func fixturesExist() throws {
        let names = ConformanceFixtures.fileNames()
        #expect(!names.isEmpty, "no *.jsonl in \(ConformanceFixtures.directory.path)")
        for name in names {
            #expect(try !ConformanceFixtures.load(name).isEmpty, "\(name) has no cases")
        }
    }

    @Test("fixture file", arguments: ConformanceFixtures.fileNames())
    func fixture(_ name: String) throws {
        let daemon = try SuiteDaemon.daemon()
        let cases = try ConformanceFixtures.load(name)
        var connection = try daemon.connect()
        defer { connection.close() }
        for c in cases {
            let label = "\(name) case \(c.number) (line \(c.line))"
            if let problem = run(c, on: connection, label: label) {
                Issue.record("\(problem)")
                if !daemon.isRunning {
                    Issue.record("\(label): the daemon died:\n\(daemon.log(tail: 30))")
                    return
                }
                // The connection's state is unknown now: carry on with a fresh one.
                connection.close()
                connection = try daemon.connect()
            }
        }
    }

    /// Sends one case and checks what comes back; returns a complaint, or nil.
    private func run(_ c: ConformanceCase, on connection: TestConnection, label: String) -> String? {
        let context = "\(label)\n  request:  \(c.requestText)\n  expected: \(c.expectedText)"
        do {
            try connection.send(c.request)
        } catch {
            return "\(context)\n  send failed: \(error)"
        }
        var actual: [JSON] = []
        var lines: [String] = []
        for _ in c.expected.indices {
            guard let line = connection.readLine(timeout: 10) else {
                return "\(context)\n  got only \(lines.count) of \(c.expected.count) responses: \(lines)"
            }
            lines.append(line)
            switch ResponseMatch.checkLine(line) {
            case .success(let value): actual.append(value)
            case .failure(let error): return "\(context)\n  \(error)"
            }
        }
        if !ResponseMatch.multisetMatches(c.expected, actual, ResponseMatch.matchesResponse) {
            return "\(context)\n  actual:   \(lines.joined(separator: " "))"
        }
        // Nothing more may come: the next line must answer the sync request.
        do {
            try connection.send(Self.syncRequest)
        } catch {
            return "\(context)\n  sync send failed: \(error)"
        }
        var pending: Set<String> = ["sync", "sync-store"]
        while !pending.isEmpty {
            guard let line = connection.readLine(timeout: 10) else {
                return "\(context)\n  no answer to the sync requests \(pending.sorted())"
            }
            guard case .success(let sync) = ResponseMatch.checkLine(line), case .string(let id)? = sync["id"],
                sync["result"] != nil, pending.remove(id) != nil
            else {
                return "\(context)\n  unexpected extra response: \(line)"
            }
        }
        return nil
    }
}
