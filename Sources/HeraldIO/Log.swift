import Foundation

/// Log levels with their journald priority prefixes.
public enum LogLevel: Int, Sendable, Comparable {
    case error = 3
    case warning = 4
    case info = 6
    case debug = 7

    public init?(name: String) {
        switch name {
        case "error": self = .error
        case "warning": self = .warning
        case "info": self = .info
        case "debug": self = .debug
        default: return nil
        }
    }

    /// Ordered by verbosity: error < warning < info < debug.
    public static func < (a: LogLevel, b: LogLevel) -> Bool { a.rawValue < b.rawValue }
}

/// One line per event on stderr: `<6>event key=value …`. Values are quoted
/// when they contain spaces or quotes. Callers pass identifiers (device ids,
/// token-hash prefixes), never tokens, keys or JWTs.
public final class Logger: Sendable {
    private let threshold: Locked<LogLevel>
    /// One line at a time on stderr, whichever logger writes it. (The
    /// handle rather than `()`: ThreadSanitizer takes an access to an empty
    /// value for one of the object's header, which other threads read without
    /// the lock, and reports a race.)
    private static let stderr = Locked(FileHandle.standardError)

    public init(level: LogLevel) { threshold = Locked(level) }

    public var level: LogLevel {
        get { threshold.withLock { $0 } }
        set { threshold.withLock { $0 = newValue } }
    }

    /// Whether lines of `level` are written (to skip building fields that would be dropped).
    public func enabled(_ level: LogLevel) -> Bool { level.rawValue <= self.level.rawValue }

    public func log(_ level: LogLevel, _ event: String, _ fields: KeyValuePairs<String, String> = [:]) {
        guard level.rawValue <= self.level.rawValue else { return }
        var line = "<\(level.rawValue)>\(event)"
        for (key, value) in fields {
            line += " \(key)=\(Logger.quote(value))"
        }
        line += "\n"
        Self.stderr.withLock { $0.write(Data(line.utf8)) }
    }

    public func error(_ event: String, _ fields: KeyValuePairs<String, String> = [:]) { log(.error, event, fields) }
    public func warning(_ event: String, _ fields: KeyValuePairs<String, String> = [:]) { log(.warning, event, fields) }
    public func info(_ event: String, _ fields: KeyValuePairs<String, String> = [:]) { log(.info, event, fields) }
    public func debug(_ event: String, _ fields: KeyValuePairs<String, String> = [:]) { log(.debug, event, fields) }

    static func quote(_ value: String) -> String {
        let needs = value.isEmpty || value.contains { $0 == " " || $0 == "\"" || $0 == "=" || $0.isNewline }
        guard needs else { return value }
        let escaped = value.replacingOccurrences(of: "\\", with: "\\\\")
            .replacingOccurrences(of: "\"", with: "\\\"").replacingOccurrences(of: "\n", with: "\\n")
        return "\"\(escaped)\""
    }
}
