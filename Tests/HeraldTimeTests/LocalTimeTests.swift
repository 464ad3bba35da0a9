import HeraldTime
import Testing

@Suite("Times of day and weekday names")
struct LocalTimeTests {
    @Test("two-digit hours and minutes are accepted, and read back as such")
    func accepts() {
        #expect(LocalTime(parsing: "00:00")?.minutes == 0)
        #expect(LocalTime(parsing: "23:59")?.minutes == 1439)
        #expect(LocalTime(parsing: "07:05")?.minutes == 425)
        #expect(LocalTime(parsing: "22:00")?.text == "22:00")
        #expect(LocalTime(minutes: 425)?.text == "07:05")
    }

    @Test(
        "any other text is refused",
        arguments: [
            "25:00", "24:00", "7:00", "07:0", "07:60", "12:60", "", "07:00 ", " 07:00", "0700", "07-00", "+7:00",
            "07:0a", "٠٧:٠٠", "07:00\0",
        ])
    func refusesText(_ text: String) {
        #expect(LocalTime(parsing: text) == nil, "\(text.debugDescription) was accepted")
    }

    @Test("minutes outside the day are refused")
    func refusesMinutes() {
        #expect(LocalTime(minutes: -1) == nil)
        #expect(LocalTime(minutes: 1440) == nil)
    }

    @Test("times order by minute")
    func ordersByMinute() throws {
        let early = try #require(LocalTime(parsing: "06:59"))
        let late = try #require(LocalTime(parsing: "22:00"))
        #expect(early < late)
    }

    @Test("weekdays are named mon to sun and numbered 1 to 7")
    func weekdayNames() {
        #expect(Weekday.allCases.map(\.name) == ["mon", "tue", "wed", "thu", "fri", "sat", "sun"])
        #expect(Weekday.monday.rawValue == 1)
        #expect(Weekday.sunday.rawValue == 7)
    }

    @Test("each weekday's name reads back as that day", arguments: Weekday.allCases)
    func weekdayNameRoundTrips(_ day: Weekday) {
        #expect(Weekday(name: day.name) == day)
    }

    @Test("any other weekday name is refused", arguments: ["Mon", "MON", "monday", "", "mo", "sun "])
    func refusesWeekdayName(_ name: String) {
        #expect(Weekday(name: name) == nil)
    }
}
