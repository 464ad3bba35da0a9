import HeraldTime

/// RFC 3339 UTC times with milliseconds, as the interface shows them
/// (`2026-12-02T14:50:00.123Z`).
///
/// Written digit by digit: a `device.list` of 20 devices formats up to 100
/// of them, and Foundation's `String(format:)` made that the largest cost of
/// the call (most of the read thread's time in a load test once users had
/// their full set of devices).
enum Timestamp {
    static func rfc3339(_ ms: Int64) -> String {
        let (secondsSinceEpoch, millis) = floorDivision(ms, 1000)
        let (days, secondOfDay) = floorDivision(secondsSinceEpoch, 86_400)
        let (year, month, day) = civil(fromDays: days)
        var bytes = [UInt8]()
        bytes.reserveCapacity(24)
        if year < 0 || year > 9999 {
            // Outside RFC 3339's four-digit years: clamp rather than mis-shape.
            return year < 0 ? "0000-01-01T00:00:00.000Z" : "9999-12-31T23:59:59.999Z"
        }
        append(&bytes, Int(year), digits: 4)
        bytes.append(UInt8(ascii: "-"))
        append(&bytes, month, digits: 2)
        bytes.append(UInt8(ascii: "-"))
        append(&bytes, day, digits: 2)
        bytes.append(UInt8(ascii: "T"))
        append(&bytes, Int(secondOfDay / 3600), digits: 2)
        bytes.append(UInt8(ascii: ":"))
        append(&bytes, Int(secondOfDay / 60 % 60), digits: 2)
        bytes.append(UInt8(ascii: ":"))
        append(&bytes, Int(secondOfDay % 60), digits: 2)
        bytes.append(UInt8(ascii: "."))
        append(&bytes, Int(millis), digits: 3)
        bytes.append(UInt8(ascii: "Z"))
        return String(decoding: bytes, as: UTF8.self)
    }

    /// The instant an RFC 3339 date-time names, in milliseconds since the
    /// Unix epoch: `YYYY-MM-DDTHH:MM:SS`, an optional fraction (digits past
    /// the millisecond are dropped), then `Z` or an offset `±HH:MM`. nil for
    /// anything else (a date alone, a local time without offset, `24:00:00`,
    /// a day the month does not have). A leap second (`:60`) reads as the
    /// next second's start.
    static func parse(_ text: String) -> Int64? {
        let b = Array(text.utf8)
        guard b.count >= 20, b.count <= 40 else { return nil }
        func digits(_ at: Int, _ n: Int) -> Int? {
            guard at + n <= b.count else { return nil }
            var v = 0
            for i in at..<(at + n) {
                guard (0x30...0x39).contains(b[i]) else { return nil }
                v = v * 10 + Int(b[i] - 0x30)
            }
            return v
        }
        guard let year = digits(0, 4), b[4] == UInt8(ascii: "-"), let month = digits(5, 2),
            b[7] == UInt8(ascii: "-"), let day = digits(8, 2), b[10] == UInt8(ascii: "T") || b[10] == UInt8(ascii: "t"),
            let hour = digits(11, 2), b[13] == UInt8(ascii: ":"), let minute = digits(14, 2),
            b[16] == UInt8(ascii: ":"), let second = digits(17, 2)
        else { return nil }
        guard (1...12).contains(month), day >= 1, day <= CivilCalendar.daysInMonth(year: year, month: month), hour < 24,
            minute < 60,
            second <= 60
        else { return nil }
        var i = 19
        var millis = 0
        if i < b.count, b[i] == UInt8(ascii: ".") {
            i += 1
            let start = i
            while i < b.count, (0x30...0x39).contains(b[i]) {
                if i - start < 3 { millis = millis * 10 + Int(b[i] - 0x30) }
                i += 1
            }
            guard i > start else { return nil }
            for _ in min(3, i - start)..<3 { millis *= 10 }
        }
        guard i < b.count else { return nil }
        var offsetMinutes = 0
        switch b[i] {
        case UInt8(ascii: "Z"), UInt8(ascii: "z"):
            i += 1
        case UInt8(ascii: "+"), UInt8(ascii: "-"):
            guard let oh = digits(i + 1, 2), i + 3 < b.count, b[i + 3] == UInt8(ascii: ":"),
                let om = digits(i + 4, 2), oh < 24, om < 60
            else { return nil }
            offsetMinutes = (oh * 60 + om) * (b[i] == UInt8(ascii: "-") ? -1 : 1)
            i += 6
        default:
            return nil
        }
        guard i == b.count else { return nil }
        let days = Int64(CivilCalendar.days(year: year, month: month, day: day))
        let seconds = days * 86_400 + Int64(hour * 3600 + minute * 60 + second) - Int64(offsetMinutes * 60)
        return seconds * 1000 + Int64(millis)
    }

    /// Quotient rounded toward minus infinity, and a remainder in 0..<divisor.
    private static func floorDivision(_ value: Int64, _ divisor: Int64) -> (Int64, Int64) {
        let q = value / divisor
        let r = value % divisor
        return r < 0 ? (q - 1, r + divisor) : (q, r)
    }

    /// The proleptic Gregorian date of a day count from 1970-01-01
    /// (H. Hinnant's `civil_from_days`).
    private static func civil(fromDays days: Int64) -> (year: Int64, month: Int, day: Int) {
        let z = days + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let doe = z - era * 146_097
        let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let day = Int(doy - (153 * mp + 2) / 5 + 1)
        let month = Int(mp < 10 ? mp + 3 : mp - 9)
        return (yoe + era * 400 + (month <= 2 ? 1 : 0), month, day)
    }

    private static func append(_ bytes: inout [UInt8], _ value: Int, digits: Int) {
        var divisor = 1
        for _ in 1..<digits { divisor *= 10 }
        var v = value
        while divisor > 0 {
            bytes.append(UInt8(ascii: "0") + UInt8(v / divisor))
            v %= divisor
            divisor /= 10
        }
    }
}
