import Foundation
import HeraldTime
import Testing

private let est = TimeType(offset: -18000, isDaylight: false, designation: 0)
private let edt = TimeType(offset: -14400, isDaylight: true, designation: 4)

/// Files written by hand (`TZifWriter`) for what Debian's tzdata does not
/// ship: slim files whose footer carries everything after 2007, version 1
/// files with no footer, unusual footers, and broken ones.
@Suite("TZif files written by hand")
struct TZifFormatTests {
    private let directory: TemporaryDirectory
    private let database: TimeZoneDatabase

    init() throws {
        directory = try TemporaryDirectory()
        database = TimeZoneDatabase(directory: directory.path)
    }

    /// A file that must not load, named for what is wrong with it.
    struct UnreadableFile: Sendable, CustomTestStringConvertible {
        var testDescription: String
        var bytes: [UInt8]
    }

    private func load(_ writer: TZifWriter, as name: String = "Test") throws -> Zone {
        try directory.write(writer.bytes, to: name)
        return try database.zone(name)
    }

    /// A slim New York: its 2007 transitions, then only the footer. Every 6 h
    /// of 2007–2036 must agree with Debian's fat file, whose explicit
    /// transitions run to 2037.
    @Test("a slim file agrees with the fat one, its footer standing in for the explicit transitions")
    func slimFileAgreesWithTheFatOne() throws {
        var writer = TZifWriter(types: [est, edt])
        writer.designations = Array("EST\0EDT\0".utf8)
        writer.transitions = [(utc(2007, 3, 11, 7) / 1000, 1), (utc(2007, 11, 4, 6) / 1000, 0)]
        writer.footer = "EST5EDT,M3.2.0,M11.1.0"
        // The 32-bit block says UTC: a reader that used it would fail below.
        let slim = try load(writer, as: "America/New_York")
        let fat = try systemZone("America/New_York")
        for instant in stride(from: utc(2007, 1, 1), to: utc(2037, 1, 1), by: Int(6 * hour)) {
            #expect(slim.offsetSeconds(at: instant) == fat.offsetSeconds(at: instant), "at \(instant)")
        }
        #expect(slim.offsetSeconds(at: utc(2007, 1, 1)) == -18000, "before the first transition: type 0")
    }

    @Test("a version 1 file has no footer: the last transition's type holds")
    func version1FileHasNoFooter() throws {
        var writer = TZifWriter(version: 0, types: [est, edt])
        writer.designations = Array("EST\0EDT\0".utf8)
        writer.transitions = [(utc(2026, 3, 8, 7) / 1000, 1)]
        let zone = try load(writer)
        #expect(zone.offsetSeconds(at: utc(2026, 3, 8, 7) - 1) == -18000)
        #expect(zone.offsetSeconds(at: utc(2026, 3, 8, 7)) == -14400)
        #expect(zone.offsetSeconds(at: utc(2090, 1, 1)) == -14400, "the last transition's type holds")
    }

    @Test("a file without transitions uses its footer, or without one its first type")
    func fileWithoutTransitionsUsesItsFooterOrItsFirstType() throws {
        var writer = TZifWriter(types: [est])
        writer.footer = "EST5EDT,M3.2.0,M11.1.0"
        let zone = try load(writer, as: "Footer_Only")
        #expect(zone.offsetSeconds(at: utc(1990, 7, 1)) == -14400)
        #expect(zone.offsetSeconds(at: utc(1990, 1, 1)) == -18000)
        writer.footer = ""
        #expect(try load(writer, as: "No_Footer").offsetSeconds(at: utc(2026, 7, 1)) == -18000)
    }

    /// Footers exercising the TZ string's corners (POSIX and RFC 8536 §3.3).
    static let footerCases: [(footer: String, instant: Int64, offset: Int)] = [
        // Daylight time all year (RFC 8536 §3.3.1), across new year.
        ("EST5EDT,0/0,J365/25", utc(2030, 1, 1, 0), -14400),
        ("EST5EDT,0/0,J365/25", utc(2030, 12, 31, 23, 59), -14400),
        ("EST5EDT,0/0,J365/25", utc(2032, 7, 1), -14400),
        // Without a rule: the US one.
        ("EST5EDT", utc(2030, 3, 10, 7), -14400),
        ("EST5EDT", utc(2030, 3, 10, 7) - 1000, -18000),
        // Quoted names, a half-hour standard offset, explicit daylight offset.
        ("<+0530>-5:30", utc(2030, 6, 1), 19800),
        ("<-03>3<-02>,M3.5.0/-2,M10.5.0/-1", utc(2030, 6, 1), -7200),
        ("<-03>3<-02>,M3.5.0/-2,M10.5.0/-1", utc(2030, 12, 1), -10800),
        // Negative daylight time (Dublin): +01 in summer is standard, GMT in winter is daylight.
        ("IST-1GMT0,M10.5.0,M3.5.0/1", utc(2030, 1, 15), 0),
        ("IST-1GMT0,M10.5.0,M3.5.0/1", utc(2030, 7, 15), 3600),
        // Julian days: J60 is March 1 in every year; 59 (zero-based) is February 29 in a leap year.
        ("AAA0BBB,J60/0,J300", utc(2028, 3, 1) - 1000, 0),
        ("AAA0BBB,J60/0,J300", utc(2028, 3, 1), 3600),
        ("AAA0BBB,59/0,J300", utc(2028, 2, 29), 3600),
        ("AAA0BBB,59/0,J300", utc(2028, 2, 29) - 1000, 0),
        // Hours past 24 in a transition time (RFC 8536 version 3): 2030-03-30 + 26 h.
        ("AAA0BBB,M3.5.6/26,M10.5.0", utc(2030, 3, 31, 2), 3600),
        ("AAA0BBB,M3.5.6/26,M10.5.0", utc(2030, 3, 31, 2) - 1000, 0),
    ]

    @Test("a footer's TZ string gives the offset at an instant past the transitions", arguments: footerCases)
    func footerRules(footer: String, instant: Int64, offset: Int) throws {
        var writer = TZifWriter(types: [TimeType(offset: 0, isDaylight: false, designation: 0)])
        writer.footer = footer
        let zone = try load(writer, as: "Case")
        #expect(zone.offsetSeconds(at: instant) == offset)
    }

    static let unreadableFiles: [UnreadableFile] = {
        var cases: [UnreadableFile] = []
        for footer in [
            "EST", "EST5EDT,M3.2.0", "EST5EDT,M13.1.0,M11.1.0", "EST25", "<>5", "EST5EDT,M3.2.0,M11.1.0,", "5",
        ] {
            var writer = TZifWriter(types: [est])
            writer.footer = footer
            cases.append(UnreadableFile(testDescription: footer, bytes: writer.bytes))
        }
        var writer = TZifWriter(types: [est, edt])
        writer.designations = Array("EST\0EDT\0".utf8)
        writer.footer = "EST5EDT"
        writer.transitions = [(2_000_000_000, 1), (1_000_000_000, 0)]
        cases.append(UnreadableFile(testDescription: "transitions out of order", bytes: writer.bytes))
        writer.transitions = [(1_000_000_000, 2)]
        cases.append(UnreadableFile(testDescription: "type index past the types", bytes: writer.bytes))
        writer.transitions = []
        writer.types = [TimeType(offset: 100_000, isDaylight: false, designation: 0)]
        cases.append(UnreadableFile(testDescription: "offset beyond 26 hours", bytes: writer.bytes))
        writer.types = [TimeType(offset: 0, isDaylight: false, designation: 9)]
        cases.append(UnreadableFile(testDescription: "designation past the characters", bytes: writer.bytes))
        writer.types = [est]
        var noFooter = writer.bytes
        noFooter.removeLast("\nEST5EDT\n".utf8.count)
        cases.append(UnreadableFile(testDescription: "version 2 without its footer", bytes: noFooter))
        var badVersion = writer.bytes
        badVersion[4] = UInt8(ascii: "1")
        cases.append(UnreadableFile(testDescription: "version byte '1'", bytes: badVersion))
        return cases
    }()

    @Test("an invalid footer or block makes the file unreadable", arguments: unreadableFiles)
    func invalidFootersAndBlocksAreUnreadable(_ file: UnreadableFile) throws {
        let name = "Bad"
        try directory.write(file.bytes, to: name)
        let error = #expect(throws: TimeZoneError.self) { try database.zone(name) }
        #expect(error == .unreadable(name))
    }

    @Test("a future version is read as version 4")
    func futureVersionsAreReadAsVersion4() throws {
        var writer = TZifWriter(version: UInt8(ascii: "5"), types: [est])
        writer.footer = "EST5EDT,M3.2.0,M11.1.0"
        #expect(try load(writer).offsetSeconds(at: utc(2030, 7, 1)) == -14400)
    }
}
