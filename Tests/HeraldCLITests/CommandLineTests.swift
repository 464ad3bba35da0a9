import Foundation
import Testing

@Suite("herald command line")
struct CommandLineTests {
    @Test("the binary is found and runs")
    func binaryFound() throws {
        let url = try Herald.binary()
        #expect(FileManager.default.isExecutableFile(atPath: url.path))
        let result = try herald("version")
        #expect(result.status == 0, "\(result)")
        #expect(result.stdoutText.hasPrefix("herald "))
    }

    @Test("an unknown command is bad input", arguments: ["bogus", "encrypt", "--frobnicate", "VAPID"])
    func unknownCommand(command: String) throws {
        expectBadInput(try herald(command), mentioning: [command])
    }

    @Test(
        "an unknown subcommand is bad input (one line naming it)",
        arguments: [["vapid", "bogus"], ["vapid", "sign"], ["webpush", "decrypt"], ["webpush", "bogus"]])
    func unknownSubcommand(arguments: [String]) throws {
        expectBadInput(try herald(arguments), mentioning: [arguments[1]])
    }

    @Test("a missing subcommand is bad input (one line)", arguments: ["vapid", "webpush"])
    func missingSubcommand(command: String) throws {
        expectBadInput(try herald(command))
    }

    @Test(
        "unknown options are bad input naming the option",
        arguments: [
            ["vapid", "generate", "--force"],
            ["vapid", "generate", "--out=x.pem", "--format", "der"],
            ["vapid", "public-key", "--key", "k.pem", "--json"],
            ["vapid", "verify", "--key", "k.pem", "--public-key", "AAAA", "--quiet"],
            ["vapid", "token", "--key", "k.pem", "--aud", "https://a.example", "--sub", "mailto:a@b.c", "--iat", "1"],
            ["webpush", "encrypt", "--p256dh", "AAAA", "--auth", "AAAA", "--ttl", "60"],
        ])
    func unknownOption(arguments: [String]) throws {
        let option = try #require(
            arguments.first { ["--force", "--format", "--json", "--quiet", "--iat", "--ttl"].contains($0) })
        let dir = try TempDir()
        expectBadInput(try herald(arguments, in: dir.url), mentioning: [option])
        #expect(!FileManager.default.fileExists(atPath: dir.path("x.pem")))
    }

    @Test("an option given twice is bad input")
    func duplicateOption() throws {
        let dir = try TempDir()
        let key = try generatedKey(in: dir)
        expectBadInput(try herald("vapid", "public-key", "--key", key.path, "--key", key.path), mentioning: ["--key"])
    }

    @Test(
        "help and version go to stdout with status 0",
        arguments: [["help"], ["--help"], ["vapid", "help"], ["webpush", "help"]])
    func help(arguments: [String]) throws {
        let result = try herald(arguments)
        #expect(result.status == 0, "\(result)")
        #expect(result.stdoutText.contains("usage"))
        #expect(result.stderr.isEmpty)
    }
}
