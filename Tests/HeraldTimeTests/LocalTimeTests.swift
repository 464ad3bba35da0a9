import HeraldTime
import XCTest

final class LocalTimeTests: XCTestCase {
    func testAcceptsTwoDigitHoursAndMinutes() {
        XCTAssertEqual(LocalTime(parsing: "00:00")?.minutes, 0)
        XCTAssertEqual(LocalTime(parsing: "23:59")?.minutes, 1439)
        XCTAssertEqual(LocalTime(parsing: "07:05")?.minutes, 425)
        XCTAssertEqual(LocalTime(parsing: "22:00")?.text, "22:00")
        XCTAssertEqual(LocalTime(minutes: 425)?.text, "07:05")
    }

    func testRefusesEverythingElse() {
        for text in [
            "25:00", "24:00", "7:00", "07:0", "07:60", "12:60", "", "07:00 ", " 07:00", "0700", "07-00", "+7:00",
            "07:0a", "٠٧:٠٠", "07:00\0",
        ] {
            XCTAssertNil(LocalTime(parsing: text), "\(text.debugDescription) was accepted")
        }
        XCTAssertNil(LocalTime(minutes: -1))
        XCTAssertNil(LocalTime(minutes: 1440))
    }

    func testOrdersByMinute() throws {
        let early = try XCTUnwrap(LocalTime(parsing: "06:59"))
        let late = try XCTUnwrap(LocalTime(parsing: "22:00"))
        XCTAssertLessThan(early, late)
    }

    func testWeekdayNames() {
        XCTAssertEqual(Weekday.allCases.map(\.name), ["mon", "tue", "wed", "thu", "fri", "sat", "sun"])
        for day in Weekday.allCases { XCTAssertEqual(Weekday(name: day.name), day) }
        XCTAssertEqual(Weekday.monday.rawValue, 1)
        XCTAssertEqual(Weekday.sunday.rawValue, 7)
        for name in ["Mon", "MON", "monday", "", "mo", "sun "] { XCTAssertNil(Weekday(name: name), name) }
    }
}
