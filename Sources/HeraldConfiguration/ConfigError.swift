/// A configuration problem found at startup (or reload). It names the file,
/// the line and the key, e.g.
/// `/etc/herald/herald.conf:12: [server] socket_mode: must be an octal mode such as 0660 (got "abc")`.
///
/// Messages never carry secret material: a credential file's contents are not
/// quoted, and a value that looks like a key pasted inline is not echoed.
public struct ConfigError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The config file (or, for a store key error without a config, the key file).
    public let file: String
    /// The line of the offending key; nil when the problem is the file as a
    /// whole or a setting left at its default.
    public let line: Int?
    /// The section the key sits in, without brackets.
    public let section: String?
    public let key: String?
    /// What is wrong, in a sentence fragment that reads after the key.
    public let message: String

    public init(file: String, line: Int?, section: String?, key: String?, message: String) {
        self.file = file
        self.line = line
        self.section = section
        self.key = key
        self.message = message
    }

    /// A problem with a setting, located where the setting was made.
    public init(_ location: ConfigLocation, _ message: String) {
        self.init(
            file: location.file, line: location.line, section: location.section,
            key: location.key, message: message)
    }

    public var description: String {
        var text = file
        if let line { text += ":\(line)" }
        text += ": "
        switch (section, key) {
        case let (section?, key?): text += "[\(section)] \(key): "
        case let (section?, nil): text += "[\(section)]: "
        case let (nil, key?): text += "\(key): "
        case (nil, nil): break
        }
        return text + message
    }

    /// The problem on the earliest line; file-level problems (no line) first.
    static func earliest(_ problems: [ConfigError]) -> ConfigError? {
        problems.enumerated().min { a, b in
            let la = a.element.line ?? 0
            let lb = b.element.line ?? 0
            return la != lb ? la < lb : a.offset < b.offset
        }?.element
    }
}

/// Where a setting was made: file, line (nil for a default), section and key.
public struct ConfigLocation: Sendable, Equatable, CustomStringConvertible {
    public let file: String
    public let line: Int?
    public let section: String
    public let key: String

    public init(file: String, line: Int?, section: String, key: String) {
        self.file = file
        self.line = line
        self.section = section
        self.key = key
    }

    public var description: String {
        (line.map { "\(file):\($0)" } ?? file) + ": [\(section)] \(key)"
    }
}
