import CInih

/// A `[section]` header as written, with its line.
struct ConfigSectionHeader: Sendable, Equatable {
    let name: String
    let line: Int
}

/// One `key = value` line, with the section it sits under.
struct ConfigEntry: Sendable, Equatable {
    let section: ConfigSectionHeader
    let key: String
    let value: String
    let line: Int
}

/// The syntax of a config file: its section headers and key lines, in file
/// order. Meaning is given to them by `HeraldConfig`.
///
/// libinih does the tokenising; the reader callback below hands it one line at
/// a time so that every key carries its line number, refuses lines too long for
/// inih's buffer (which it would otherwise split into two bogus lines), and
/// strips leading whitespace so an indented key is a key rather than a
/// continuation of the previous value. Section names are taken from the line
/// itself because inih truncates them to 49 bytes, shorter than an app section
/// may be.
struct ConfigDocument: Sendable {
    var sections: [ConfigSectionHeader] = []
    var entries: [ConfigEntry] = []

    /// Parses the bytes of `file`; throws the problem on the earliest line.
    static func parse(_ bytes: [UInt8], file: String) throws(ConfigError) -> ConfigDocument {
        let context = ConfigParseContext(bytes: bytes, file: file)
        let reader: ini_reader = { buffer, capacity, stream in
            guard let buffer, let stream else { return nil }
            let context = Unmanaged<ConfigParseContext>.fromOpaque(stream).takeUnretainedValue()
            return context.nextLine(into: buffer, capacity: Int(capacity)) ? buffer : nil
        }
        let handler: ini_handler = { user, _, name, value in
            guard let user, let name, let value else { return 0 }
            let context = Unmanaged<ConfigParseContext>.fromOpaque(user).takeUnretainedValue()
            return context.entry(name: name, value: value) ? 1 : 0
        }
        let opaque = Unmanaged.passUnretained(context).toOpaque()
        let rc = withExtendedLifetime(context) { ini_parse_stream(reader, opaque, handler, opaque) }
        if rc > 0 && !context.problems.contains(where: { $0.line == Int(rc) }) {
            context.problem(line: Int(rc), "expected a [section] header or a key = value line")
        } else if rc < 0 {
            context.problem(line: nil, "the INI parser failed (code \(rc))")
        }
        if let first = ConfigError.earliest(context.problems) { throw first }
        return ConfigDocument(sections: context.sections, entries: context.entries)
    }
}

/// State shared with the C callbacks for one parse, reached through the
/// context pointer.
private final class ConfigParseContext {
    let bytes: [UInt8]
    let file: String
    var offset = 0
    var lineNumber = 0
    var stopped = false
    var section: ConfigSectionHeader?
    var sections: [ConfigSectionHeader] = []
    var entries: [ConfigEntry] = []
    var problems: [ConfigError] = []

    init(bytes: [UInt8], file: String) {
        self.bytes = bytes
        self.file = file
    }

    func problem(line: Int?, section: String? = nil, key: String? = nil, _ message: String) {
        problems.append(
            ConfigError(file: file, line: line, section: section, key: key, message: message))
    }

    /// Copies the next line (with its newline) into inih's buffer, fgets-style.
    func nextLine(into buffer: UnsafeMutablePointer<CChar>, capacity: Int) -> Bool {
        guard !stopped, offset < bytes.count else { return false }
        let start = offset
        var end = start
        while end < bytes.count && bytes[end] != UInt8(ascii: "\n") { end += 1 }
        let next = end < bytes.count ? end + 1 : end
        offset = next
        lineNumber += 1

        if next - start > capacity - 1 {
            // inih would see this line as two; refuse rather than misparse.
            problem(line: lineNumber, "line is too long (at most \(capacity - 2) bytes)")
            stopped = true
            return false
        }
        if bytes[start..<end].contains(0) {
            problem(line: lineNumber, "line contains a NUL byte")
            stopped = true
            return false
        }

        var from = start
        if lineNumber == 1 && bytes[start..<end].starts(with: [0xEF, 0xBB, 0xBF]) { from += 3 }
        while from < end && isINISpace(bytes[from]) { from += 1 }
        classify(bytes[from..<end])

        let count = next - from
        bytes.withUnsafeBufferPointer { source in
            UnsafeMutableRawPointer(buffer).copyMemory(
                from: source.baseAddress! + from, byteCount: count)
        }
        buffer[count] = 0
        return true
    }

    /// Mirrors inih's view of a (left-trimmed) line to learn section headers
    /// in full.
    private func classify(_ line: ArraySlice<UInt8>) {
        guard let first = line.first, first == UInt8(ascii: "[") else { return }
        var wasSpace = false
        var index = line.startIndex + 1
        while index < line.endIndex {
            let byte = line[index]
            if byte == UInt8(ascii: "]") { break }
            if wasSpace && byte == UInt8(ascii: ";") {
                index = line.endIndex
                break
            }
            wasSpace = isINISpace(byte)
            index += 1
        }
        guard index < line.endIndex else {
            problem(line: lineNumber, "section header has no closing ']'")
            return
        }
        guard let name = String(validating: line[(line.startIndex + 1)..<index], as: UTF8.self)
        else {
            problem(line: lineNumber, "section name is not valid UTF-8")
            return
        }
        let header = ConfigSectionHeader(name: name, line: lineNumber)
        section = header
        sections.append(header)
    }

    /// Records one `key = value` line reported by inih.
    func entry(name: UnsafePointer<CChar>, value: UnsafePointer<CChar>) -> Bool {
        guard let key = String(validatingCString: name),
            let text = String(validatingCString: value)
        else {
            problem(line: lineNumber, section: section?.name, "line is not valid UTF-8")
            return false
        }
        guard let section else {
            problem(line: lineNumber, key: key, "key outside any section (add a [section] header above it)")
            return false
        }
        guard !key.isEmpty else {
            problem(line: lineNumber, section: section.name, "missing key name before '='")
            return false
        }
        entries.append(ConfigEntry(section: section, key: key, value: text, line: lineNumber))
        return true
    }
}

/// C `isspace` in the C locale, which is what inih trims.
private func isINISpace(_ byte: UInt8) -> Bool {
    byte == 0x20 || (0x09...0x0D).contains(byte)
}
