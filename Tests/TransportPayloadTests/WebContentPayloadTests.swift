import APNs
import FCM
import HeraldCore
import HeraldJSON
import Testing
import WebPush

/// `web_payload` and `shrink` at the payload level: JSON pointers, the
/// shrink steps, the Web Push plaintext, and the legacy payloads untouched.
@Suite("web_payload and shrink payloads")
struct WebContentPayloadTests {
    static func json(_ text: String) throws -> JSON { try JSONParser.parse(text) }

    @Test("RFC 6901 pointers: escapes, array indices, and what is not a pointer")
    func pointers() throws {
        #expect(JSONPointer("")?.tokens == [])
        #expect(JSONPointer("/a~1b/~0c/0")?.tokens == ["a/b", "~c", "0"])
        #expect(JSONPointer("/")?.tokens == [""])
        for bad in ["a", "/a~", "/a~2", "~1"] { #expect(JSONPointer(bad) == nil, "\(bad)") }
        let doc = try Self.json(#"{"a/b":{"~c":[10,11]},"":1,"01":2}"#)
        #expect(doc.value(at: JSONPointer("/a~1b/~0c/1")!) == 11)
        #expect(doc.value(at: JSONPointer("/a~1b/~0c/01")!) == nil)  // no leading zeros for an index
        #expect(doc.value(at: JSONPointer("/a~1b/~0c/-")!) == nil)
        #expect(doc.value(at: JSONPointer("/01")!) == 2)  // but a member may be named so
        #expect(doc.value(at: JSONPointer("/")!) == 1)
    }

    @Test("drop removes members and elements; keep keeps the pointed values at their places")
    func dropAndKeep() throws {
        var doc = try Self.json(#"{"a":[1,2,3],"b":{"c":1,"d":2},"e":3}"#)
        let removed = ["/a/0", "/b/d", "/nothing", ""].map { doc.remove(at: JSONPointer($0)!) }
        #expect(removed == [true, true, false, false])
        #expect(doc.description == #"{"a":[2,3],"b":{"c":1},"e":3}"#)
        let full = try Self.json(#"{"t":"m","x":{"y":1,"z":2},"l":[{"u":1,"v":2},{"u":3}],"n":null}"#)
        let kept = full.keeping(["/x/z", "/l/1/u", "/t", "/missing", "/n"].map { JSONPointer($0)! })
        #expect(kept.description == #"{"t":"m","x":{"z":2},"l":[{"u":3}],"n":null}"#)
        #expect(full.keeping([JSONPointer("/missing")!]).description == "{}")
    }

    static func content(_ payload: String, _ steps: [ShrinkStep]) -> WebContent {
        WebContent(payload: payload, shrink: steps)
    }

    @Test("steps apply one at a time, in order, until the payload fits; the index of the last one is reported")
    func order() throws {
        let steps: [ShrinkStep] = [.drop(["/media"]), .drop(["/icon"]), .shorten("/body"), .keep(["/type"])]
        let big = String(repeating: "x", count: 60)
        func fit(_ payload: String, _ capacity: Int) throws -> WebContentFit.Fitted {
            try WebContentFit.fit(Self.content(payload, steps), capacity: capacity).get()
        }
        let p = #"{"type":"m","body":"hello","icon":"\#(big)","media":"\#(big)"}"#
        #expect(try fit(p, 1000).shrink == .whole)
        #expect(try fit(p, 1000).plaintext == Array(p.utf8))
        #expect(try fit(p, 100).shrink == .step(0))
        #expect(try fit(p, 40).shrink == .step(1))
        #expect(String(decoding: try fit(p, 40).plaintext, as: UTF8.self) == #"{"type":"m","body":"hello"}"#)
        #expect(try fit(p, 26).shrink == .step(2))
        #expect(String(decoding: try fit(p, 26).plaintext, as: UTF8.self) == #"{"type":"m","body":"h…"}"#)
        #expect(try fit(p, 20).shrink == .step(3))
        #expect(String(decoding: try fit(p, 20).plaintext, as: UTF8.self) == #"{"type":"m"}"#)
        // Nothing fits: refused with the size after the last step.
        let refused = WebContentFit.fit(Self.content(p, steps), capacity: 5)
        guard case .failure(let e) = refused else {
            Issue.record("fitted in 5 bytes")
            return
        }
        #expect(e.size == 12 && e.capacity == 5)
    }

    @Test("shorten cuts at a character boundary, counts escapes, and ends in …")
    func shorten() throws {
        let body = String(repeating: "é🙂\"", count: 20)  // quotes serialise as \"
        let payload = String(decoding: JSON.object(["body": .string(body)]).serialized(), as: UTF8.self)
        for capacity in 12...payload.utf8.count - 1 {
            let fitted = try WebContentFit.fit(Self.content(payload, [.shorten("/body")]), capacity: capacity).get()
            #expect(fitted.plaintext.count <= capacity, "\(capacity)")
            let cut = try #require(try JSONParser.parse(fitted.plaintext)["body"]?.stringValue)
            if cut.isEmpty { continue }
            #expect(cut.hasSuffix("…"))
            #expect(body.hasPrefix(String(cut.dropLast())), "\(capacity): \(cut)")
            // The most that fits: one more character would not.
            let more = String(body.prefix(cut.count)) + "…"
            #expect(JSON.object(["body": .string(more)]).serialized().count > capacity, "\(capacity)")
        }
        // Not even one character: "" (and the next step goes on); a non-string does nothing.
        let none = WebContentFit.fit(
            Self.content(#"{"body":"abcdef","n":1}"#, [.shorten("/body"), .shorten("/n")]), capacity: 17)
        #expect(try none.get().plaintext == Array(#"{"body":"","n":1}"#.utf8))
    }

    @Test("the Web Push plaintext is the web_payload; a 413 retry shrinks for the smaller record, or cannot")
    func webPushPayload() throws {
        var m = PushMessage(kind: .callRing, data: [("call", "1")])
        m.webContent = Self.content(
            #"{"type":"call_ring","caller":{"name":"Zoë","avatar":"\#(String(repeating: "a", count: 2000))"}}"#,
            [.drop(["/caller/avatar"])])
        let p = try WebPushPayload(message: m, user: "u")
        #expect(p.shrink == .whole && p.minimalShrink == .step(0) && p.minimalFits)
        #expect(String(decoding: p.minimalPlaintext, as: UTF8.self) == #"{"type":"call_ring","caller":{"name":"Zoë"}}"#)
        m.webContent?.shrink = []
        let unfit = try WebPushPayload(message: m, user: "u")
        #expect(!unfit.minimalFits && unfit.minimalShrink == nil)
        m.webContent?.payload = #"{"x":"\#(String(repeating: "a", count: 2800))"}"#
        #expect(throws: WebPushPayloadError.self) { try WebPushPayload(message: m, user: "u") }
    }

    @Test(
        "APNs and FCM bodies and headers are byte-for-byte the same with web_payload",
        arguments: PushKind.allCases.filter { $0.ownPlatform == nil })
    func legacyUntouched(_ kind: PushKind) throws {
        var plain = PushMessage(kind: kind, data: [("m", "1")], collapseKey: "k")
        plain.collapseID = nil
        var rich = plain
        rich.webContent = Self.content(#"{"secret":"zq-marker-71"}"#, [.keep(["/secret"])])
        let platform: Platform = kind == .callRing ? .apnsVoIP : .apns
        let settings = APNsAppSettings(topic: "t", defaultAlertLocKey: "NEW")
        let a = try APNsRequest(message: plain, platform: platform, user: "u", settings: settings, now: 7)
        let b = try APNsRequest(message: rich, platform: platform, user: "u", settings: settings, now: 7)
        #expect(a.payload == b.payload && a.headers.map(\.value) == b.headers.map(\.value))
        let fa = try FCMMessage(message: plain, token: "t", user: "u", settings: FCMAppSettings())
        let fb = try FCMMessage(message: rich, token: "t", user: "u", settings: FCMAppSettings())
        #expect(fa.body == fb.body)
        #expect(!String(decoding: fb.body + b.payload, as: UTF8.self).contains("zq-marker"))
    }

    @Test("a ring and a notification with one collapse_key get one apns-collapse-id, Topic and FCM collapse_key")
    func sharedCollapse() throws {
        let key = "call:c-1:m-9"
        let ring = PushMessage(kind: .callRing, collapseKey: key)
        let note = PushMessage(kind: .notification, collapseKey: key)
        let settings = APNsAppSettings(topic: "t")
        let r = try APNsRequest(message: ring, platform: .apnsVoIP, user: "u", settings: settings, now: 0)
        let n = try APNsRequest(message: note, platform: .apns, user: "u", settings: settings, now: 0)
        #expect(r.collapseID == key && n.collapseID == key)
        #expect(WebPushHeaders(message: ring).topic == WebPushHeaders(message: note).topic)
        #expect(WebPushHeaders(message: ring).topic != nil)
        for m in [ring, note] {
            let body = try FCMMessage(message: m, token: "t", user: "u", settings: FCMAppSettings()).body
            #expect(try JSONParser.parse(body)["message"]?["android"]?["collapse_key"] == .string(key))
        }
    }
}
