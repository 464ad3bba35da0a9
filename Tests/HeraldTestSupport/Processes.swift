public import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// The repository root, found from this file's location (Tests/HeraldTestSupport/Processes.swift).
public let repoRoot: URL = URL(fileURLWithPath: #filePath)
    .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

/// The Python of the test peers (`make deps` creates it).
public let venvPython = repoRoot.appendingPathComponent(".venv/bin/python").path

/// Processes started from a Swift concurrency thread inherit its blocked signal mask, which
/// would make SIGTERM pending forever; Python children unblock everything first.
public let unblockSignalsPrelude = "import signal, sys, runpy; signal.pthread_sigmask(signal.SIG_SETMASK, set())\n"

/// A test set-up problem, with what went wrong.
public struct TestSupportError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// SIGTERM, up to 5 s for a clean exit, then SIGKILL.
///
/// Always ends with `waitUntilExit()`: Foundation's `Process` and the run-loop
/// source `run()` makes hold each other until `waitUntilExit()` lets go of the
/// source, so a process only polled with `isRunning` is never freed
/// (LeakSanitizer reports every such Process in make test-sanitize).
public func stopProcess(_ p: Process) {
    if p.isRunning {
        p.terminate()
        let deadline = Date().addingTimeInterval(5)
        while p.isRunning && Date() < deadline { Thread.sleep(forTimeInterval: 0.02) }
        if p.isRunning { kill(p.processIdentifier, SIGKILL) }
    }
    p.waitUntilExit()
}

/// Runs a command to completion and returns its stdout; throws on a non-zero exit.
public func runCommand(_ path: String, _ args: [String], stdin: Data? = nil) throws -> Data {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: path)
    p.arguments = args
    let out = Pipe()
    p.standardOutput = out
    p.standardError = FileHandle.nullDevice
    let input = Pipe()
    if stdin != nil { p.standardInput = input }
    try p.run()
    if let stdin {
        input.fileHandleForWriting.write(stdin)
        try input.fileHandleForWriting.close()
    }
    let data = out.fileHandleForReading.readDataToEndOfFile()
    p.waitUntilExit()
    guard p.terminationStatus == 0 else { throw TestSupportError("\(path) \(args) failed") }
    return data
}
