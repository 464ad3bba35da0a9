import Foundation
import Testing

@testable import HeraldDaemon

#if canImport(Glibc)
    import Glibc
#endif

/// `Timestamp.rfc3339` against the C library's `gmtime_r` and `strftime`.
@Suite struct TimestampTests {
    private func reference(_ ms: Int64) -> String {
        var seconds = time_t(ms >= 0 ? ms / 1000 : (ms - 999) / 1000)
        let millis = ((ms % 1000) + 1000) % 1000
        var parts = tm()
        gmtime_r(&seconds, &parts)
        var buffer = [CChar](repeating: 0, count: 32)
        let n = strftime(&buffer, buffer.count, "%Y-%m-%dT%H:%M:%S", &parts)
        let head = String(decoding: buffer[..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        let tail = String(millis + 1000).dropFirst()
        return "\(head).\(tail)Z"
    }

    @Test func knownValues() {
        #expect(Timestamp.rfc3339(0) == "1970-01-01T00:00:00.000Z")
        #expect(Timestamp.rfc3339(1_764_687_000_123) == "2025-12-02T14:50:00.123Z")
        #expect(Timestamp.rfc3339(951_782_400_000) == "2000-02-29T00:00:00.000Z")
        #expect(Timestamp.rfc3339(-1) == "1969-12-31T23:59:59.999Z")
        #expect(Timestamp.rfc3339(253_402_300_799_999) == "9999-12-31T23:59:59.999Z")
    }

    @Test func agreesWithTheCLibrary() {
        var rng = SystemRandomNumberGenerator()
        // Every day boundary of four leap cycles, then random instants up to 9999.
        for day in stride(from: Int64(-800), through: 4 * 1461 + 800, by: 1) {
            let ms = day * 86_400_000 + Int64(day & 0xff) * 1000 + 7
            #expect(Timestamp.rfc3339(ms) == reference(ms))
        }
        for _ in 0..<20_000 {
            let ms = Int64.random(in: 0...253_402_300_799_999, using: &rng)
            #expect(Timestamp.rfc3339(ms) == reference(ms))
        }
    }
}
