/// The daemon's parts, stopped in the reverse order they started: one
/// shutdown path for a normal stop and for a start that fails half way
/// (everything already started is stopped, nothing else).
/// Used on the thread that runs `Daemon.run` only.
final class ServiceStack {
    private var running: [(name: String, stop: () -> Void)] = []

    /// `name` is up; `stop` undoes it.
    func started(_ name: String, stop: @escaping () -> Void) {
        running.append((name, stop))
    }

    /// Forgets `name`'s stop: a part that took it over stops it now.
    func handedOver(_ name: String) {
        running.removeAll { $0.name == name }
    }

    /// The names of the running parts, in start order.
    var names: [String] { running.map(\.name) }

    /// Stops every part, newest first; a second call does nothing.
    func stopAll() {
        while let part = running.popLast() { part.stop() }
    }
}
