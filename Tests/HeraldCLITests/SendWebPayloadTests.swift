import Foundation
import HeraldTestSupport
import Testing

/// `herald send --web-payload JSON --shrink JSON`, against a running daemon.
@Suite("herald send --web-payload", .serialized)
struct SendWebPayloadTests {
    @Test("the options reach push.send as JSON; the daemon's refusals name the field")
    func webPayload() throws {
        let d = try DaemonProcess()
        defer { d.cleanup() }
        let socket = ["--socket", d.socketPath]
        let ok = try herald(
            [
                "send", "--user", "u", "--web-payload", #"{"type":"call_ring","caller":{"name":"Zoë"}}"#, "--shrink",
                #"[{"drop":["/caller/avatar"]},{"shorten":"/caller/name"},{"keep":["/type"]}]"#,
            ] + socket)
        #expect(ok.status == 0, "\(ok)")
        #expect(ok.stdoutText.contains("message_id"), "\(ok)")

        let badStep = try herald(
            ["send", "--user", "u", "--web-payload", #"{"a":1}"#, "--shrink", #"[{"drop":"/a"}]"#] + socket)
        #expect(badStep.status != 0)
        #expect((badStep.stdoutText + badStep.stderr).contains("shrink[0].drop"), "\(badStep)")

        let notJSON = try herald(["send", "--user", "u", "--web-payload", "{oops"] + socket)
        #expect(notJSON.status != 0)
        #expect(notJSON.stderr.contains("--web-payload must be JSON"), "\(notJSON)")

        let big = String(repeating: "z", count: 3000)
        let tooBig = try herald(["send", "--user", "u", "--web-payload", #"{"body":"\#(big)"}"#] + socket)
        #expect(tooBig.status != 0)
        #expect((tooBig.stdoutText + tooBig.stderr).contains("payload_too_large"), "\(tooBig)")
        #expect(!(tooBig.stdoutText + tooBig.stderr).contains("zzzz"), "\(tooBig)")
    }
}
