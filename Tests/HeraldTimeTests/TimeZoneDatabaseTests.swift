import Foundation
import HeraldTime
import XCTest

#if canImport(Glibc)
    import Glibc
#endif

final class TimeZoneDatabaseTests: XCTestCase {
    private var directory: TemporaryDirectory!

    override func setUpWithError() throws {
        directory = try TemporaryDirectory()
    }

    override func tearDown() {
        directory.remove()
    }

    private func assertError(
        _ database: TimeZoneDatabase, _ name: String, _ expected: TimeZoneError, file: StaticString = #filePath,
        line: UInt = #line
    ) {
        do {
            _ = try database.zone(name)
            XCTFail("\(name.debugDescription) loaded", file: file, line: line)
        } catch {
            XCTAssertEqual(error, expected, file: file, line: line)
        }
    }

    func testLoadsZonesByName() throws {
        for name in ["Europe/Paris", "Asia/Kolkata", "UTC", "Etc/GMT+5", "America/Argentina/Buenos_Aires"] {
            XCTAssertEqual(try systemDatabase.zone(name).name, name)
        }
        XCTAssertEqual(try systemDatabase.zone("Etc/GMT+5").offsetSeconds(at: 0), -18000)
        XCTAssertEqual(try systemDatabase.zone("UTC").offsetSeconds(at: utc(2026, 6, 1)), 0)
    }

    func testRefusesNamesBeforeOpeningAFile() {
        let tooLong = String(repeating: "A", count: 65)
        XCTAssertEqual(tooLong.utf8.count, 65)
        for name in [
            "../etc/passwd", "/etc/passwd", "Europe/../UTC", "", tooLong, "Europe/Paris\0", "Europe//Paris", "Europe/",
            "./UTC", "Europe/.", "..", ".", "zone.tab", "Europe/Paris ", "Europe\\Paris", "Éurope/Paris",
        ] {
            assertError(systemDatabase, name, .invalidName(name))
        }
        // 64 bytes is a valid shape: merely unknown.
        let longest = String(repeating: "A", count: 64)
        assertError(systemDatabase, longest, .unknown(longest))
    }

    func testUnknownNames() {
        assertError(systemDatabase, "Mars/Olympus", .unknown("Mars/Olympus"))
        assertError(systemDatabase, "Europe/Paris/Left_Bank", .unknown("Europe/Paris/Left_Bank"))
        // A folder is no zone.
        assertError(systemDatabase, "Europe", .unknown("Europe"))
        assertError(systemDatabase, "right", .unknown("right"))
    }

    func testFilesThatAreNotTZif() throws {
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

        XCTAssertEqual(try database.zone("Paris").offsetSeconds(at: utc(2026, 7, 1)), 7200)
        for name in ["Text", "Empty", "Truncated", "Header_Only", "Bad_Magic", "Huge"] {
            assertError(database, name, .unreadable(name))
        }
        // The tz folder's own text files: the text "leapseconds" and, with dots, "zone.tab".
        assertError(systemDatabase, "leapseconds", .unreadable("leapseconds"))
    }

    func testAFifoIsRefusedWithoutBlocking() throws {
        XCTAssertEqual(mkfifo(directory.path + "/Pipe", 0o600), 0)
        assertError(TimeZoneDatabase(directory: directory.path), "Pipe", .unreadable("Pipe"))
    }

    func testTZDIRChoosesTheDefaultFolder() throws {
        let saved = getenv("TZDIR").map { String(cString: $0) }
        defer {
            if let saved { setenv("TZDIR", saved, 1) } else { unsetenv("TZDIR") }
        }
        setenv("TZDIR", directory.path, 1)
        XCTAssertEqual(TimeZoneDatabase().directory, directory.path)
        XCTAssertEqual(TimeZoneDatabase(directory: "/usr/share/zoneinfo").directory, "/usr/share/zoneinfo")
        unsetenv("TZDIR")
        XCTAssertEqual(TimeZoneDatabase().directory, "/usr/share/zoneinfo")
    }

    func testCacheStaysWithinItsLimitAndEvictsTheLeastRecentlyUsed() throws {
        let names = ["A", "B", "C", "D", "E", "F"]
        for name in names { try directory.copySystemZone("Europe/Paris", as: name) }
        let database = TimeZoneDatabase(directory: directory.path, cacheLimit: 3)
        for name in ["A", "B", "C"] { _ = try database.zone(name) }
        XCTAssertEqual(database.cachedCount, 3)
        _ = try database.zone("A")  // B is now the least recently used
        _ = try database.zone("D")
        XCTAssertEqual(database.cachedCount, 3)
        // With the files gone, only what the cache holds still loads.
        for name in names { try directory.remove(name) }
        XCTAssertNoThrow(try database.zone("A"))
        XCTAssertNoThrow(try database.zone("C"))
        XCTAssertNoThrow(try database.zone("D"))
        assertError(database, "B", .unknown("B"))

        let uncached = TimeZoneDatabase(directory: "/usr/share/zoneinfo", cacheLimit: 0)
        _ = try uncached.zone("UTC")
        XCTAssertEqual(uncached.cachedCount, 0)
    }

    func testConcurrentLoads() throws {
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
        XCTAssertEqual(failures.all, [])
        XCTAssertLessThanOrEqual(database.cachedCount, 5)
    }

    func testSharedDatabase() throws {
        XCTAssertEqual(try TimeZoneDatabase.shared.zone("UTC").offsetSeconds(at: 0), 0)
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
