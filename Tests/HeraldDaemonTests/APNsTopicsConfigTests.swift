import Foundation
import HeraldCrypto
import HeraldTestSupport
import Testing

@testable import HeraldDaemon
@testable import HeraldConfiguration

/// `apns_topics`: several bundle ids per app, the first the default, next to
/// the older single `apns_topic`.
@Suite("apns_topics in the app section")
struct APNsTopicsConfigTests {
    static let file = "/etc/herald/herald.conf"

    func app(_ text: String) throws -> AppConfig {
        try #require(try HeraldConfig.parse("[app.default]\n" + text, file: Self.file).apps["default"])
    }

    @Test("a list: every id kept in order, the first the default; spaces around commas are fine")
    func list() throws {
        let a = try app("apns_topics = com.example.app,  com.example.app.dev ,com.example.beta\n")
        #expect(a.apnsTopics == ["com.example.app", "com.example.app.dev", "com.example.beta"])
        #expect(a.apnsBundleIDs == a.apnsTopics)
        #expect(a.defaultAPNsTopic == "com.example.app")
        #expect(a.description.contains("apns_topics = com.example.app, com.example.app.dev, com.example.beta\n"))
    }

    @Test("apns_topic alone still works: one bundle id, the default")
    func single() throws {
        let a = try app("apns_topic = com.example.app\n")
        #expect(a.apnsTopics.isEmpty)
        #expect(a.apnsBundleIDs == ["com.example.app"] && a.defaultAPNsTopic == "com.example.app")
        let none = try app("")
        #expect(none.apnsBundleIDs.isEmpty && none.defaultAPNsTopic == nil)
    }

    @Test("both keys: accepted when apns_topic is the first of apns_topics")
    func bothConsistent() throws {
        let a = try app("apns_topic = com.example.app\napns_topics = com.example.app, com.example.app.dev\n")
        #expect(a.defaultAPNsTopic == "com.example.app")
        #expect(a.apnsBundleIDs == ["com.example.app", "com.example.app.dev"])
        // The effective config prints both and reads back the same.
        let again = try #require(try HeraldConfig.parse(a.description, file: Self.file).apps["default"])
        #expect(again.apnsTopic == a.apnsTopic && again.apnsTopics == a.apnsTopics)
    }

    @Test("both keys disagreeing: refused on the apns_topic line, naming both")
    func bothInconsistent() throws {
        for topics in ["com.example.app.dev, com.example.app", "com.example.other"] {
            let error = try #require(throws: ConfigError.self) {
                try HeraldConfig.parse(
                    "[app.default]\napns_topics = \(topics)\napns_topic = com.example.app\n", file: Self.file)
            }
            #expect(error.line == 3 && error.section == "app.default" && error.key == "apns_topic", "\(error)")
            #expect(error.message.contains("apns_topic (com.example.app)"), "\(error)")
            #expect(error.message.contains("apns_topics (\(topics))"), "\(error)")
            #expect(error.message.contains("the first of apns_topics"))
        }
    }

    @Test(
        "bad lists are refused on their line",
        arguments: [
            ("com.example.app,,com.example.dev", "comma-separated list of bundle IDs"),
            ("com.example.app, ", "comma-separated list of bundle IDs"),
            ("com example app", "comma-separated list of bundle IDs"),
            ("com.example.app, .com.example", "comma-separated list of bundle IDs"),
            ("com.example.app, com.example.app", "lists com.example.app twice"),
            ("com.example.app, com.example.app.voip", "VoIP pushes add .voip themselves"),
            ("com.example_app", "comma-separated list of bundle IDs"),
        ])
    func bad(value: String, message: String) throws {
        let error = try #require(throws: ConfigError.self) {
            try HeraldConfig.parse("[app.default]\napns_topics = \(value)\n", file: Self.file)
        }
        #expect(error.line == 2 && error.key == "apns_topics", "\(error)")
        #expect(error.message.contains(message), "\(error)")
    }

    @Test("an APNs key with apns_topics and no apns_topic loads, its default topic the first")
    func credentials() throws {
        let dir = try ConfigTests.TemporaryDirectory()
        try dir.write("apns.p8", try P256PrivateKey.generate().pem())
        let ids = "apns_key_id = ABC123DEFG\napns_team_id = TEAM123456\n"
        let config = try HeraldConfig.parse(
            "[app.default]\n\(ids)apns_topics = com.example.app.dev, com.example.app\napns_key = apns.p8\n",
            file: dir.path + "/herald.conf")
        let loaded = try LoadedCredentials.load(config)
        let apns = try #require(loaded["default"]?.apns.value)
        #expect(apns.topic == "com.example.app.dev")

        // Neither key: APNs needs a topic.
        let error = try #require(throws: ConfigError.self) {
            try HeraldConfig.parse("[app.default]\n\(ids)apns_key = apns.p8\n", file: dir.path + "/herald.conf")
        }
        #expect(error.key == "apns_key" && error.message.contains("apns_topic"))
    }
}
