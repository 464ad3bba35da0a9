import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// Why a zone could not be loaded.
public enum TimeZoneError: Error, Sendable, Equatable {
    /// The name is not a zone name's shape (checked before any file is opened).
    case invalidName(String)
    /// No zone file by that name.
    case unknown(String)
    /// The file exists but is not a valid TZif file (or cannot be read).
    case unreadable(String)
}

/// The system's tz database: loads zones by IANA name ("Europe/Paris",
/// "Asia/Kolkata", "UTC") from TZif files and keeps the most recently used
/// ones. Safe to use from any thread.
public final class TimeZoneDatabase: Sendable {
    /// The database shared by the process: `$TZDIR` or /usr/share/zoneinfo.
    public static let shared = TimeZoneDatabase()

    /// A TZif file larger than this is refused (the largest in tzdata is a few KiB).
    static let maximumFileSize = 1 << 20

    /// The folder zone names are looked up in.
    public let directory: String
    /// At most this many zones are kept loaded; the least recently used one goes first.
    public let cacheLimit: Int

    private struct Cache {
        var zones: [String: (zone: Zone, lastUse: UInt64)] = [:]
        var uses: UInt64 = 0
    }

    private let cache = Mutex(Cache())

    /// A database reading `directory` (nil: `$TZDIR` when set and not empty,
    /// else /usr/share/zoneinfo), keeping at most `cacheLimit` zones loaded.
    public init(directory: String? = nil, cacheLimit: Int = 1024) {
        if let directory, !directory.isEmpty {
            self.directory = directory
        } else {
            self.directory = Self.defaultDirectory(tzdir: getenv("TZDIR").map { String(cString: $0) })
        }
        self.cacheLimit = Swift.max(0, cacheLimit)
    }

    /// The folder a database without one of its own reads: `tzdir` (the
    /// value of `$TZDIR`) when set and not empty, else /usr/share/zoneinfo.
    public static func defaultDirectory(tzdir: String?) -> String {
        if let tzdir, !tzdir.isEmpty { return tzdir }
        return "/usr/share/zoneinfo"
    }

    /// How many zones are loaded now (never more than `cacheLimit`).
    public var cachedCount: Int {
        cache.withLock { $0.zones.count }
    }

    /// The zone named `name`, from the cache or its file.
    ///
    /// A name is 1–64 bytes of letters, digits, '_', '+', '-' and '/', with
    /// no empty component and no leading '/' (so no "." or ".." component
    /// either); anything else is `invalidName` before a file is opened. A name
    /// that is no file, or a folder, is `unknown`; a file that is not TZif
    /// (or over 1 MiB) is `unreadable`.
    public func zone(_ name: String) throws(TimeZoneError) -> Zone {
        guard Self.isValidName(name) else { throw .invalidName(name) }
        if let zone = cache.withLock({ cache -> Zone? in
            guard let entry = cache.zones[name] else { return nil }
            cache.uses += 1
            cache.zones[name] = (entry.zone, cache.uses)
            return entry.zone
        }) {
            return zone
        }
        let bytes = try Self.read(path: directory + "/" + name, name: name)
        guard let rules = TZifRules(bytes: bytes) else { throw .unreadable(name) }
        let zone = Zone(name: name, rules: rules)
        let limit = cacheLimit
        cache.withLock { cache in
            guard limit > 0 else { return }
            cache.uses += 1
            if cache.zones[name] == nil, cache.zones.count >= limit,
                let oldest = cache.zones.min(by: { $0.value.lastUse < $1.value.lastUse })?.key
            {
                // A scan: eviction happens only once more distinct zones are used than the limit holds.
                cache.zones[oldest] = nil
            }
            cache.zones[name] = (zone, cache.uses)
        }
        return zone
    }

    /// Whether `name` has the shape of a zone name (see `zone(_:)`).
    static func isValidName(_ name: String) -> Bool {
        let bytes = Array(name.utf8)
        guard (1...64).contains(bytes.count) else { return false }
        var componentLength = 0
        for byte in bytes {
            switch byte {
            case UInt8(ascii: "/"):
                // Also refuses a leading '/', a trailing one and "//".
                guard componentLength > 0 else { return false }
                componentLength = 0
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "_"), UInt8(ascii: "+"), UInt8(ascii: "-"):
                componentLength += 1
            default:
                // '.', NUL, spaces and every non-ASCII byte: "." and ".." cannot be spelled.
                return false
            }
        }
        return componentLength > 0
    }

    /// The whole file at `path`, at most `maximumFileSize` bytes.
    private static func read(path: String, name: String) throws(TimeZoneError) -> [UInt8] {
        // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below.
        var descriptor: Int32
        repeat {
            descriptor = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)
        } while descriptor < 0 && errno == EINTR
        guard descriptor >= 0 else {
            switch errno {
            case ENOENT, ENOTDIR, ENAMETOOLONG, ELOOP: throw .unknown(name)
            default: throw .unreadable(name)
            }
        }
        defer { close(descriptor) }
        var status = stat()
        guard fstat(descriptor, &status) == 0 else { throw .unreadable(name) }
        let kind = status.st_mode & S_IFMT
        if kind == S_IFDIR { throw .unknown(name) }
        guard kind == S_IFREG, status.st_size <= maximumFileSize else { throw .unreadable(name) }
        // One byte past the size fstat gave: a file that grew since is refused, never read unbounded.
        var bytes = [UInt8](repeating: 0, count: Int(status.st_size) + 1)
        var count = 0
        while count < bytes.count {
            let result = bytes.withUnsafeMutableBytes { buffer in
                Glibc.read(descriptor, buffer.baseAddress.map { $0 + count }, buffer.count - count)
            }
            if result < 0 && errno == EINTR { continue }
            guard result >= 0 else { throw .unreadable(name) }
            if result == 0 { break }
            count += result
        }
        guard count < bytes.count else { throw .unreadable(name) }
        bytes.removeSubrange(count...)
        return bytes
    }
}
