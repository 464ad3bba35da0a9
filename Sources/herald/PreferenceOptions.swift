import HeraldJSON

/// The options of each device's own rules (`herald register`, `herald device
/// prefs`) and of a message's topics and send time (`herald send`). Their
/// form is checked here, before any call; whether a time zone exists, and
/// the limits on topics, are the daemon's to judge.
enum PreferenceOptions {
    /// The device rules `register` and `device prefs` take.
    static let deviceValues: Set<String> = ["time-zone", "quiet-hours", "quiet-days", "during", "topics"]
    /// `device prefs` only: each clears one rule (null).
    static let clearFlags: Set<String> = ["clear-time-zone", "clear-quiet-hours", "clear-topics"]
    /// What `send` takes.
    static let sendValues: Set<String> = ["topics", "not-before", "at-local"]

    static let quietModes = ["hold", "silent", "drop"]
    static let dayNames = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]

    /// Appends `time_zone`, `quiet_hours` and `topics` as the options give
    /// them (null for a `--clear-…` flag); whether any was given.
    @discardableResult
    static func appendDeviceRules(_ options: Options, to params: inout JSONObject) throws(CommandFailure) -> Bool {
        var given = false
        for name in ["time-zone", "quiet-hours", "topics"] where options.value(name) != nil {
            if options.flag("clear-" + name) { throw CommandFailure("give --\(name) or --clear-\(name), not both") }
        }
        for name in ["quiet-days", "during"] where options.value(name) != nil && options.value("quiet-hours") == nil {
            throw CommandFailure("--\(name) goes with --quiet-hours")
        }
        if let zone = options.value("time-zone") {
            guard !zone.isEmpty, !zone.contains(where: \.isWhitespace) else {
                throw CommandFailure("--time-zone takes an IANA time zone such as Europe/Paris, got '\(zone)'")
            }
            params.append("time_zone", .string(zone))
            given = true
        } else if options.flag("clear-time-zone") {
            params.append("time_zone", .null)
            given = true
        }
        if let range = options.value("quiet-hours") {
            params.append("quiet_hours", .object(try quietHours(range, options)))
            given = true
        } else if options.flag("clear-quiet-hours") {
            params.append("quiet_hours", .null)
            given = true
        }
        if let text = options.value("topics") {
            // An empty --topics '' is the empty list: the device wants none.
            params.append("topics", .array(try topics(text).map(JSON.string)))
            given = true
        } else if options.flag("clear-topics") {
            params.append("topics", .null)
            given = true
        }
        return given
    }

    /// Appends `push.send`'s `topics`, `not_before` and `at_local`.
    static func appendSendRules(_ options: Options, to params: inout JSONObject) throws(CommandFailure) {
        if let text = options.value("topics") {
            let list = try topics(text)
            if list.isEmpty { throw CommandFailure("--topics needs at least one topic") }
            params.append("topics", .array(list.map(JSON.string)))
        }
        let notBefore = options.value("not-before")
        let atLocal = options.value("at-local")
        if notBefore != nil && atLocal != nil { throw CommandFailure("give --not-before or --at-local, not both") }
        if let text = notBefore {
            guard isRFC3339(text) else {
                throw CommandFailure(
                    "--not-before takes an RFC 3339 date-time with Z or an offset, such as 2026-12-24T09:00:00+01:00, got '\(text)'"
                )
            }
            params.append("not_before", .string(text))
        }
        if let text = atLocal {
            guard minutes(text) != nil else {
                throw CommandFailure("--at-local takes a time of day HH:MM, 00:00 to 23:59, got '\(text)'")
            }
            params.append("at_local", .string(text))
        }
    }

    /// `--quiet-hours 22:00-07:00` with `--quiet-days` and `--during`:
    /// `{start, end, days?, during?}`.
    private static func quietHours(_ range: String, _ options: Options) throws(CommandFailure) -> JSONObject {
        let parts = range.split(separator: "-", omittingEmptySubsequences: false).map(String.init)
        guard parts.count == 2, let start = minutes(parts[0]), let end = minutes(parts[1]) else {
            throw CommandFailure(
                "--quiet-hours takes HH:MM-HH:MM, times of day from 00:00 to 23:59, got '\(range)'")
        }
        if start == end { throw CommandFailure("--quiet-hours needs two different times, got '\(range)'") }
        var quiet: JSONObject = ["start": .string(parts[0]), "end": .string(parts[1])]
        if let text = options.value("quiet-days") {
            let days = text.split(separator: ",", omittingEmptySubsequences: false).map { $0.lowercased() }
            let expected = "days among \(dayNames.joined(separator: ",")) separated by commas"
            for (i, day) in days.enumerated() {
                guard dayNames.contains(day) else {
                    throw CommandFailure("--quiet-days takes \(expected), got '\(text)'")
                }
                if days[..<i].contains(day) { throw CommandFailure("--quiet-days lists '\(day)' twice") }
            }
            quiet.append("days", .array(days.map(JSON.string)))
        }
        if let during = options.value("during") {
            guard quietModes.contains(during) else {
                throw CommandFailure("--during takes hold, silent or drop, got '\(during)'")
            }
            quiet.append("during", .string(during))
        }
        return quiet
    }

    /// `a,b,c` as a list; `""` is the empty one. Each topic is non-empty,
    /// without spaces or control characters, and listed once.
    static func topics(_ text: String) throws(CommandFailure) -> [String] {
        if text.isEmpty { return [] }
        let list = text.split(separator: ",", omittingEmptySubsequences: false).map(String.init)
        for (i, topic) in list.enumerated() {
            let bad = topic.unicodeScalars.contains {
                $0.value <= 0x20 || (0x7F...0x9F).contains($0.value) || $0.properties.isWhitespace
            }
            guard !topic.isEmpty, !bad else {
                throw CommandFailure(
                    "--topics takes topics separated by commas, each without spaces or control characters, got '\(text)'"
                )
            }
            if list[..<i].contains(topic) { throw CommandFailure("--topics lists '\(topic)' twice") }
        }
        return list
    }

    /// Minutes past midnight of `"HH:MM"`, 00:00 to 23:59.
    static func minutes(_ text: String) -> Int? {
        let b = Array(text.utf8)
        guard b.count == 5, b[2] == UInt8(ascii: ":"), let h = number(b[0..<2]), let m = number(b[3..<5]),
            h < 24, m < 60
        else { return nil }
        return h * 60 + m
    }

    /// `2026-12-24T09:00:00+01:00`, `2026-12-24T08:00:00.250Z`: a date-time
    /// with seconds, an optional fraction, and `Z` or a `±HH:MM` offset.
    static func isRFC3339(_ text: String) -> Bool {
        let b = Array(text.utf8)
        guard b.count >= 20, b.count <= 40 else { return false }
        func separator(_ i: Int, _ c: Character) -> Bool { b[i] == c.asciiValue }
        guard let year = number(b[0..<4]), separator(4, "-"), let month = number(b[5..<7]), separator(7, "-"),
            let day = number(b[8..<10]), separator(10, "T") || separator(10, "t"), let hour = number(b[11..<13]),
            separator(13, ":"), let minute = number(b[14..<16]), separator(16, ":"), let second = number(b[17..<19]),
            (1...12).contains(month), day >= 1, day <= daysIn(month: month, year: year), hour < 24, minute < 60,
            second <= 60
        else { return false }
        var i = 19
        if separator(i, ".") {
            let digits = b[(i + 1)...].prefix { (0x30...0x39).contains($0) }.count
            guard digits > 0 else { return false }
            i += 1 + digits
        }
        let zone = b[i...]
        if zone.count == 1 { return zone.first == UInt8(ascii: "Z") || zone.first == UInt8(ascii: "z") }
        guard zone.count == 6, zone.first == UInt8(ascii: "+") || zone.first == UInt8(ascii: "-"),
            let offsetHours = number(zone.dropFirst().prefix(2)), separator(i + 3, ":"),
            let offsetMinutes = number(zone.suffix(2))
        else { return false }
        return offsetHours < 24 && offsetMinutes < 60
    }

    private static func number(_ digits: ArraySlice<UInt8>) -> Int? {
        var value = 0
        for c in digits {
            guard (0x30...0x39).contains(c) else { return nil }
            value = value * 10 + Int(c - 0x30)
        }
        return digits.isEmpty ? nil : value
    }

    private static func daysIn(month: Int, year: Int) -> Int {
        switch month {
        case 2: year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) ? 29 : 28
        case 4, 6, 9, 11: 30
        default: 31
        }
    }
}
