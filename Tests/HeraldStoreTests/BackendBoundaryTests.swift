import Foundation
import Testing

/// The daemon and the scheduler hold the store as a `DeliveryStore`: no
/// backend's own type or library appears in their sources, so that another
/// backend serves them through `StoreLocation` alone.
@Suite("the store's backend stays behind its protocol")
struct BackendBoundaryTests {
    static let root = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    /// What only the SQLite backend may name.
    static let sqliteOnly = ["SQLiteStore", "StoreReader", "CSQLite", "sqlite3", "Schema.", "Tables("]

    @Test("HeraldDaemon and HeraldScheduler name no SQLite type; they open the store through StoreLocation")
    func daemonAndSchedulerUseTheProtocol() throws {
        var files: [String] = []
        for module in ["Sources/HeraldDaemon", "Sources/HeraldScheduler"] {
            let dir = Self.root.appendingPathComponent(module).path
            for name in try FileManager.default.contentsOfDirectory(atPath: dir) where name.hasSuffix(".swift") {
                files.append("\(module)/\(name)")
            }
        }
        #expect(files.contains("Sources/HeraldScheduler/Scheduler.swift"))
        var opened = false
        for file in files {
            let text = try String(contentsOf: Self.root.appendingPathComponent(file), encoding: .utf8)
            for word in Self.sqliteOnly {
                #expect(!text.contains(word), "\(file) names \(word)")
            }
            opened = opened || text.contains("-> StoreLocation")
        }
        #expect(opened, "the daemon opens its store through StoreLocation")
    }
}
