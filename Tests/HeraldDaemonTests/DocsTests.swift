import Foundation
import HeraldTestSupport
import Testing
@testable import HeraldDaemon
@testable import HeraldConfiguration

// The README and docs/ describe the product as it is: every make target,
// config key and CLI subcommand they name exists, every one that exists is
// named, and no text points at the issue tracker instead of saying what is.

@Suite("docs describe the product as it is")
struct DocsTests {
    static let root = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    /// README.md and every docs/*.md, by path relative to the package root.
    static func documents() throws -> [(path: String, text: String)] {
        let docs = try FileManager.default.contentsOfDirectory(atPath: root.appendingPathComponent("docs").path)
            .filter { $0.hasSuffix(".md") }.sorted().map { "docs/\($0)" }
        return try (["README.md"] + docs).map {
            ($0, try String(contentsOf: root.appendingPathComponent($0), encoding: .utf8))
        }
    }

    /// The code of a Markdown text: fenced blocks, then inline code spans.
    static func code(of text: String) -> [String] {
        var blocks: [String] = []
        var prose: [Substring] = []
        var fence: [Substring]?
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            if line.trimmingCharacters(in: .whitespaces).hasPrefix("```") {
                if let open = fence {
                    blocks.append(open.joined(separator: "\n"))
                    fence = nil
                } else {
                    fence = []
                }
            } else if fence != nil {
                fence!.append(line)
            } else {
                prose.append(line)
            }
        }
        for line in prose {
            let parts = line.split(separator: "`", omittingEmptySubsequences: false)
            // Odd-numbered parts lie between backticks.
            for (i, part) in parts.enumerated() where i % 2 == 1 && !part.isEmpty { blocks.append(String(part)) }
        }
        return blocks
    }

    static func words(_ code: String) -> [String] {
        code.split(whereSeparator: { $0 == " " || $0 == "\n" || $0 == "\t" }).map(String.init)
    }

    static func isWord(_ s: String) -> Bool {
        guard let first = s.unicodeScalars.first, ("a"..."z").contains(first) else { return false }
        return s.unicodeScalars.allSatisfy { ("a"..."z").contains($0) || ("0"..."9").contains($0) || $0 == "-" }
    }

    /// `herald COMMAND [SUB]` uses in `text`: the command (with `|`
    /// alternatives, as in `herald help | version`) and a lower-case word
    /// after it, which is a subcommand for commands that have them.
    static func heraldUses(_ text: String) -> [(command: String, next: String?)] {
        var uses: [(String, String?)] = []
        for line in text.split(separator: "\n") { uses += heraldUses(line: String(line)) }
        return uses
    }

    static func heraldUses(line: String) -> [(command: String, next: String?)] {
        var uses: [(String, String?)] = []
        let w = words(line)
        var i = 0
        while i < w.count {
            defer { i += 1 }
            guard w[i] == "herald" || w[i].hasSuffix("/herald"), i + 1 < w.count, isWord(w[i + 1]) else { continue }
            var j = i + 1
            uses.append((w[j], j + 1 < w.count && isWord(w[j + 1]) ? w[j + 1] : nil))
            while j + 2 < w.count && w[j + 1] == "|" && isWord(w[j + 2]) {
                j += 2
                uses.append((w[j], nil))
            }
        }
        return uses
    }

    /// The commands `herald help` prints, with their subcommands.
    static func usage() throws -> [String: Set<String>] {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: heraldBinary())
        p.arguments = ["help"]
        let out = Pipe()
        p.standardOutput = out
        p.standardError = out
        try p.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        #expect(p.terminationStatus == 0)
        var commands: [String: Set<String>] = [:]
        for line in String(decoding: data, as: UTF8.self).split(separator: "\n") {
            let trimmed = line.trimmingCharacters(in: .whitespaces)
            guard trimmed.hasPrefix("herald ") else { continue }
            for use in heraldUses(trimmed) {
                commands[use.command, default: []].formUnion(use.next.map { [$0] } ?? [])
            }
        }
        return commands
    }

    @Test("every herald subcommand the docs name exists, and every one that exists is named")
    func cliSubcommands() throws {
        let commands = try Self.usage()
        #expect(commands.count >= 10, "herald help lists \(commands.keys.sorted())")
        #expect(commands["vapid"] == ["generate", "public-key", "verify", "token"])
        var named: Set<String> = []
        for doc in try Self.documents() {
            for snippet in Self.code(of: doc.text) {
                for use in Self.heraldUses(snippet) {
                    let subs = commands[use.command]
                    #expect(subs != nil, "\(doc.path) names `herald \(use.command)`, which herald help does not list")
                    named.insert(use.command)
                    guard let subs, !subs.isEmpty, let next = use.next else { continue }
                    #expect(subs.contains(next), "\(doc.path) names `herald \(use.command) \(next)`, not a subcommand")
                    named.insert("\(use.command) \(next)")
                }
            }
        }
        for (command, subs) in commands {
            #expect(named.contains(command), "`herald \(command)` is named nowhere in README.md or docs/")
            for sub in subs {
                #expect(
                    named.contains("\(command) \(sub)"),
                    "`herald \(command) \(sub)` is named nowhere in README.md or docs/")
            }
        }
    }

    /// Targets of the Makefile and mk/*.mk: every rule target, and the public
    /// ones (declared .PHONY).
    static func makeTargets() throws -> (defined: Set<String>, phony: Set<String>) {
        let mk = try FileManager.default.contentsOfDirectory(atPath: root.appendingPathComponent("mk").path)
            .filter { $0.hasSuffix(".mk") }.map { "mk/\($0)" }
        var defined: Set<String> = []
        var phony: Set<String> = []
        for file in ["Makefile"] + mk {
            let text = try String(contentsOf: root.appendingPathComponent(file), encoding: .utf8)
                .replacingOccurrences(of: "\\\n", with: " ")
            for line in text.split(separator: "\n") {
                guard let first = line.first, first != "\t", first != "#", first != " " else { continue }
                guard let colon = line.firstIndex(of: ":") else { continue }
                let after = line[line.index(after: colon)...]
                if after.hasPrefix("=") { continue }  // `X := value`
                let head = line[..<colon]
                if head.contains("=") || head.contains("$") || head.contains("%") { continue }
                let names = words(String(head))
                if names == [".PHONY"] {
                    phony.formUnion(words(String(after)))
                } else if !head.hasPrefix(".") {
                    defined.formUnion(names)
                }
            }
        }
        return (defined, phony)
    }

    @Test("every make target the docs name exists, and every public one is named")
    func makeTargetsNamed() throws {
        let (defined, phony) = try Self.makeTargets()
        #expect(phony.isSuperset(of: ["run", "test", "bench", "install", "test-crash", "fuzz"]), "\(phony.sorted())")
        #expect(
            defined.isSuperset(of: phony), "\(phony.subtracting(defined).sorted()) declared .PHONY but never defined")
        var named: Set<String> = []
        for doc in try Self.documents() {
            for snippet in Self.code(of: doc.text) {
                let w = Self.words(snippet)
                for (i, word) in w.enumerated() where word == "make" && i + 1 < w.count && Self.isWord(w[i + 1]) {
                    let target = w[i + 1]
                    #expect(defined.contains(target), "\(doc.path) names `make \(target)`, which no Makefile defines")
                    named.insert(target)
                }
            }
        }
        for target in phony.sorted() {
            #expect(named.contains(target), "`make \(target)` is named nowhere in README.md or docs/")
        }
    }

    @Test("every config key the docs name exists, and configuration.md documents every key in its section")
    func configKeysNamed() throws {
        let sections = ConfigInterpreter.sectionKeys
        func keys(of section: String) -> [String]? {
            sections[section.hasPrefix("app.") ? "app" : section]
        }
        // configuration.md: a table per `### \`[section]\`` heading.
        let reference = try String(
            contentsOf: Self.root.appendingPathComponent("docs/configuration.md"), encoding: .utf8)
        var documented: [String: Set<String>] = [:]
        var current: String?
        for line in reference.split(separator: "\n") {
            if line.hasPrefix("#") {
                current = nil
                if line.hasPrefix("### `["), let close = line.firstIndex(of: "]") {
                    let name = String(line[line.index(line.startIndex, offsetBy: 6)..<close])
                    current = name.hasPrefix("app.") ? "app" : name
                    #expect(
                        sections[current!] != nil, "configuration.md has a section [\(name)] the parser does not know")
                }
                continue
            }
            guard let section = current, line.hasPrefix("| `") else { continue }
            let key = String(line.dropFirst(3).prefix { $0 != "`" })
            #expect(
                sections[section]?.contains(key) == true,
                "configuration.md documents [\(section)] \(key), which the parser does not know")
            documented[section, default: []].insert(key)
        }
        for (section, known) in sections {
            for key in known {
                #expect(
                    documented[section]?.contains(key) == true,
                    "[\(section)] \(key) is missing from docs/configuration.md")
            }
        }

        // `[section] key` anywhere in the code of README.md and docs/.
        var mentions = 0
        for doc in try Self.documents() {
            for snippet in Self.code(of: doc.text) {
                var rest = Substring(snippet)
                while let open = rest.firstIndex(of: "[") {
                    rest = rest[rest.index(after: open)...]
                    guard let close = rest.firstIndex(of: "]") else { break }
                    let section = String(rest[..<close])
                    let after = rest[rest.index(after: close)...]
                    guard section.first.map({ ("a"..."z").contains($0) }) == true,
                        section.allSatisfy({ $0.isLetter || $0 == "." || $0 == "_" || $0.isNumber }),
                        after.hasPrefix(" "), section != "section"
                    else { continue }
                    let key = String(after.dropFirst().prefix { $0.isLetter || $0 == "_" || $0.isNumber })
                    guard !key.isEmpty, key.first!.isLowercase else { continue }
                    mentions += 1
                    // Startup-error examples name a wrong key on purpose.
                    let wrongOnPurpose = after.dropFirst(1 + key.count).hasPrefix(": unknown key")
                    let known = keys(of: section)?.contains(key) == true
                    #expect(known != wrongOnPurpose, "\(doc.path) names [\(section)] \(key)")
                }
            }
        }
        #expect(mentions > 10)
    }

    @Test("the startup errors configuration.md shows for an unknown key or section are what the parser prints")
    func startupErrorExamples() throws {
        let reference = try String(
            contentsOf: Self.root.appendingPathComponent("docs/configuration.md"), encoding: .utf8)
        let cases = [
            ("[server]\nsocket_mod = 0660\n", "[server] socket_mod: "), ("[srever]\nsocket = /x\n", "[srever]: "),
        ]
        for (text, prefix) in cases {
            do {
                _ = try HeraldConfig.parse(text, file: "/etc/herald/herald.conf")
                Issue.record("\(text) parsed")
            } catch {
                let message = String(describing: error)
                let shown = try #require(message.range(of: prefix).map { String(message[$0.lowerBound...]) })
                #expect(reference.contains(shown), "configuration.md should show: \(shown)")
            }
        }
    }

    @Test("README.md and docs/ point at no issue numbers")
    func noIssueNumbers() throws {
        for doc in try Self.documents() {
            for (n, line) in doc.text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
                let lower = line.lowercased()
                var hit = lower.contains("the issue") || lower.contains("issues ")
                if let r = lower.range(of: "issue") {
                    let after = lower[r.upperBound...].drop { $0 == " " || $0 == "-" || $0 == "#" }
                    if after.first?.isNumber == true { hit = true }
                }
                #expect(!hit, "\(doc.path):\(n + 1): \(line)")
            }
        }
    }
}
