import Foundation
import HeraldTime
import Testing

#if canImport(Glibc)
    import Glibc
#endif

@Suite("The tz database: names, files and cache")
struct TimeZoneDatabaseTests {
    private let directory: TemporaryDirectory

    init() throws {
        directory = try TemporaryDirectory()
    }

    private func expectError(
        _ database: TimeZoneDatabase, _ name: String, _ expected: TimeZoneError,
        sourceLocation: SourceLocation = #_sourceLocation
    ) {
        do {
            _ = try database.zone(name)
            Issue.record("\(name.debugDescription) loaded", sourceLocation: sourceLocation)
        } catch {
            #expect(error == expected, sourceLocation: sourceLocation)
        }
    }

    @Test(
        "a zone loads by its name, at any depth",
        arguments: ["Europe/Paris", "Asia/Kolkata", "UTC", "Etc/GMT+5", "America/Argentina/Buenos_Aires"])
    func loadsZonesByName(_ name: String) throws {
        #expect(try systemDatabase.zone(name).name == name)
    }

    @Test("Etc/GMT+5 is five hours behind UTC, and UTC is UTC")
    func fixedOffsetZones() throws {
        #expect(try systemDatabase.zone("Etc/GMT+5").offsetSeconds(at: 0) == -18000)
        #expect(try systemDatabase.zone("UTC").offsetSeconds(at: utc(2026, 6, 1)) == 0)
    }

    static let tooLong = String(repeating: "A", count: 65)

    @Test(
        "a name of the wrong shape is refused before a file is opened",
        arguments: [
            "../etc/passwd", "/etc/passwd", "Europe/../UTC", "", tooLong, "Europe/Paris\0", "Europe//Paris", "Europe/",
            "./UTC", "Europe/.", "..", ".", "zone.tab", "Europe/Paris ", "Europe\\Paris", "Éurope/Paris",
        ])
    func refusesNamesBeforeOpeningAFile(_ name: String) {
        expectError(systemDatabase, name, .invalidName(name))
    }

    @Test("a name of 64 bytes is a valid shape, merely unknown; one of 65 is too long")
    func longestName() {
        #expect(Self.tooLong.utf8.count == 65)
        let longest = String(repeating: "A", count: 64)
        expectError(systemDatabase, longest, .unknown(longest))
    }

    @Test(
        "a well-formed name with no zone file, or naming a folder, is unknown",
        arguments: ["Mars/Olympus", "Europe/Paris/Left_Bank", "Europe", "right"])
    func unknownNames(_ name: String) {
        expectError(systemDatabase, name, .unknown(name))
    }

    @Test("a file that is not TZif is unreadable, among them the tz folder's own text files")
    func filesThatAreNotTZif() throws {
        let database = TimeZoneDatabase(directory: directory.path)
        try directory.write(Array("not a zone\n".utf8), to: "Text")
        try directory.write([], to: "Empty")
        try directory.copySystemZone("Europe/Paris", as: "Paris")
        let paris = try Data(contentsOf: URL(fileURLWithPath: "/usr/share/zoneinfo/Europe/Paris"))
        try directory.write(Array(paris.prefix(paris.count - 10)), to: "Truncated")
        try directory.write(Array(paris.prefix(100)), to: "Header_Only")
        var badMagic = Array(paris)
        badMagic[0] = UInt8(ascii: "X")
        try directory.write(badMagic, to: "Bad_Magic")
        // A TZif header over 1 MiB of padding.
        try directory.write(Array(paris) + [UInt8](repeating: 0, count: 1 << 20), to: "Huge")

        #expect(try database.zone("Paris").offsetSeconds(at: utc(2026, 7, 1)) == 7200)
        for name in ["Text", "Empty", "Truncated", "Header_Only", "Bad_Magic", "Huge"] {
            expectError(database, name, .unreadable(name))
        }
        // The tz folder's own text files: the text "leapseconds" and, with dots, "zone.tab".
        expectError(systemDatabase, "leapseconds", .unreadable("leapseconds"))
    }

    @Test("a FIFO is refused without blocking")
    func aFifoIsRefusedWithoutBlocking() throws {
        #expect(mkfifo(directory.path + "/Pipe", 0o600) == 0)
        expectError(TimeZoneDatabase(directory: directory.path), "Pipe", .unreadable("Pipe"))
    }

    @Test("TZDIR chooses the default folder; a folder given explicitly wins")
    func tzdirChoosesTheDefaultFolder() throws {
        // The environment is left alone (tests run in parallel, and setenv races getenv):
        // the rule is checked on the value it reads.
        #expect(TimeZoneDatabase.defaultDirectory(tzdir: directory.path) == directory.path)
        #expect(TimeZoneDatabase.defaultDirectory(tzdir: "") == "/usr/share/zoneinfo")
        #expect(TimeZoneDatabase.defaultDirectory(tzdir: nil) == "/usr/share/zoneinfo")
        #expect(TimeZoneDatabase(directory: "/usr/share/zoneinfo").directory == "/usr/share/zoneinfo")
        #expect(TimeZoneDatabase(directory: directory.path).directory == directory.path)
    }

    @Test("the cache stays within its limit and evicts the least recently used zone")
    func cacheStaysWithinItsLimitAndEvictsTheLeastRecentlyUsed() throws {
        let names = ["A", "B", "C", "D", "E", "F"]
        for name in names { try directory.copySystemZone("Europe/Paris", as: name) }
        let database = TimeZoneDatabase(directory: directory.path, cacheLimit: 3)
        for name in ["A", "B", "C"] { _ = try database.zone(name) }
        #expect(database.cachedCount == 3)
        _ = try database.zone("A")  // B is now the least recently used
        _ = try database.zone("D")
        #expect(database.cachedCount == 3)
        // With the files gone, only what the cache holds still loads.
        for name in names { try directory.remove(name) }
        #expect(throws: Never.self) { try database.zone("A") }
        #expect(throws: Never.self) { try database.zone("C") }
        #expect(throws: Never.self) { try database.zone("D") }
        expectError(database, "B", .unknown("B"))

        let uncached = TimeZoneDatabase(directory: "/usr/share/zoneinfo", cacheLimit: 0)
        _ = try uncached.zone("UTC")
        #expect(uncached.cachedCount == 0)
    }

    @Test("concurrent loads each get the zone they asked for, within the cache's limit")
    func concurrentLoads() throws {
        let names = ZoneOffsetTests.sweepZones + ["Europe/Berlin", "Asia/Shanghai", "Africa/Cairo", "America/Chicago"]
        let database = TimeZoneDatabase(directory: "/usr/share/zoneinfo", cacheLimit: 5)
        let failures = Failures()
        DispatchQueue.concurrentPerform(iterations: 8) { thread in
            for round in 0..<50 {
                let name = names[(thread * 7 + round) % names.count]
                do {
                    let zone = try database.zone(name)
                    if zone.name != name { failures.add("\(name) came back as \(zone.name)") }
                } catch {
                    failures.add("\(name): \(error)")
                }
            }
        }
        #expect(failures.all == [])
        #expect(database.cachedCount <= 5)
    }

    @Test("the shared database loads UTC")
    func sharedDatabase() throws {
        #expect(try TimeZoneDatabase.shared.zone("UTC").offsetSeconds(at: 0) == 0)
    }
}

/// Failures collected from several threads.
private final class Failures: @unchecked Sendable {
    private let lock = NSLock()
    private var list: [String] = []

    func add(_ failure: String) {
        lock.lock()
        list.append(failure)
        lock.unlock()
    }

    var all: [String] {
        lock.lock()
        defer { lock.unlock() }
        return list
    }
}
