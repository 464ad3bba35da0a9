import Foundation
import HeraldTime
import Testing

/// The system tz database, named explicitly so that a TZDIR in the test environment changes nothing.
let systemDatabase = TimeZoneDatabase(directory: "/usr/share/zoneinfo")

func systemZone(_ name: String) throws -> Zone {
    try systemDatabase.zone(name)
}

/// Milliseconds since the epoch of a UTC date and time, through Foundation's
/// Gregorian calendar: an oracle that shares no code with HeraldTime.
func utc(_ year: Int, _ month: Int, _ day: Int, _ hour: Int = 0, _ minute: Int = 0, _ second: Int = 0) -> Int64 {
    var calendar = Calendar(identifier: .gregorian)
    calendar.timeZone = TimeZone(secondsFromGMT: 0) ?? calendar.timeZone
    let components = DateComponents(year: year, month: month, day: day, hour: hour, minute: minute, second: second)
    guard let date = calendar.date(from: components) else {
        Issue.record("no date for \(components)")
        return 0
    }
    return Int64(date.timeIntervalSince1970.rounded()) * 1000
}

let hour: Int64 = 3_600_000
let minute: Int64 = 60_000

/// A temporary folder for zone files, removed when the value goes away.
final class TemporaryDirectory: Sendable {
    let path: String

    init() throws {
        path = NSTemporaryDirectory() + "herald-time-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }

    func write(_ bytes: [UInt8], to name: String) throws {
        let url = URL(fileURLWithPath: path + "/" + name)
        try FileManager.default.createDirectory(
            at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        try Data(bytes).write(to: url)
    }

    func copySystemZone(_ name: String, as newName: String? = nil) throws {
        let bytes = try Data(contentsOf: URL(fileURLWithPath: "/usr/share/zoneinfo/" + name))
        try write(Array(bytes), to: newName ?? name)
    }

    func remove(_ name: String) throws {
        try FileManager.default.removeItem(atPath: path + "/" + name)
    }

    deinit {
        try? FileManager.default.removeItem(atPath: path)
    }
}

/// A local time type of a TZif file.
struct TimeType {
    var offset: Int32
    var isDaylight: Bool
    var designation: UInt8
}

/// Writes TZif files (RFC 8536) by hand, so that tests can shape what Debian does not ship:
/// slim files, version 1 files, footers of every kind, broken files.
struct TZifWriter {
    /// 0 for version 1, else an ASCII digit ("2", "3", "4").
    var version: UInt8 = UInt8(ascii: "2")
    var transitions: [(at: Int64, type: UInt8)] = []
    var types: [TimeType]
    var designations = Array("UTC\0".utf8)
    /// The version 2+ footer's TZ string.
    var footer = ""
    /// What the 32-bit block of a version 2+ file holds: by default one type, offset 0, as zic's slim output.
    var legacyTypes = [TimeType(offset: 0, isDaylight: false, designation: 0)]

    var bytes: [UInt8] {
        if version == 0 {
            return Self.block(
                version: 0, timeSize: 4, transitions: transitions, types: types, designations: designations)
        }
        return Self.block(
            version: version, timeSize: 4, transitions: [], types: legacyTypes, designations: designations)
            + Self.block(
                version: version, timeSize: 8, transitions: transitions, types: types, designations: designations)
            + Array("\n\(footer)\n".utf8)
    }

    static func block(
        version: UInt8, timeSize: Int, transitions: [(at: Int64, type: UInt8)], types: [TimeType], designations: [UInt8]
    ) -> [UInt8] {
        var out = Array("TZif".utf8) + [version] + [UInt8](repeating: 0, count: 15)
        for count in [0, 0, 0, transitions.count, types.count, designations.count] {
            out += bigEndian(Int64(count), size: 4)
        }
        for transition in transitions { out += bigEndian(transition.at, size: timeSize) }
        out += transitions.map(\.type)
        for type in types {
            out += bigEndian(Int64(type.offset), size: 4)
            out += [type.isDaylight ? 1 : 0, type.designation]
        }
        return out + designations
    }

    static func bigEndian(_ value: Int64, size: Int) -> [UInt8] {
        (0..<size).reversed().map { UInt8(truncatingIfNeeded: value >> (8 * $0)) }
    }
}

/// Where `zdump` is installed, if it is.
let zdumpPath = ["/usr/bin/zdump", "/usr/sbin/zdump"].first(where: {
    FileManager.default.isExecutableFile(atPath: $0)
})

/// The offsets `zdump -v` (libc-bin: glibc's reading of the same files) reports
/// at each transition it lists between two years, as (UTC milliseconds, offset);
/// nil when zdump is not installed.
func zdumpOffsets(zone: String, fromYear: Int, toYear: Int) throws -> [(instant: Int64, offset: Int)]? {
    guard let path = zdumpPath else { return nil }
    let process = Process()
    process.executableURL = URL(fileURLWithPath: path)
    process.arguments = ["-v", "-c", "\(fromYear),\(toYear)", zone]
    var environment = ProcessInfo.processInfo.environment
    environment["TZDIR"] = "/usr/share/zoneinfo"
    process.environment = environment
    let pipe = Pipe()
    process.standardOutput = pipe
    try process.run()
    let output = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
    process.waitUntilExit()
    let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
    var result: [(instant: Int64, offset: Int)] = []
    for line in output.split(separator: "\n") where line.contains(" UT = ") {
        // "Europe/Paris  Sun Mar 26 01:00:00 2090 UT = Sun Mar 26 03:00:00 2090 CEST isdst=1 gmtoff=7200"
        let words = line.split(separator: " ")
        guard let ut = words.firstIndex(of: "UT"), ut >= 5,
            let month = months.firstIndex(of: String(words[ut - 4])).map({ $0 + 1 }),
            let day = Int(words[ut - 3]), let year = Int(words[ut - 1]),
            let gmtoff = words.last.flatMap({ $0.hasPrefix("gmtoff=") ? Int($0.dropFirst(7)) : nil })
        else {
            Issue.record("unexpected zdump line: \(line)")
            continue
        }
        let clock = words[ut - 2].split(separator: ":").compactMap { Int($0) }
        guard clock.count == 3 else { continue }
        result.append((utc(year, month, day, clock[0], clock[1], clock[2]), gmtoff))
    }
    return result
}
