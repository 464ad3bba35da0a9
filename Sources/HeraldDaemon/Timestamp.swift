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
