import HeraldCore
import Testing

@testable import WebPush

/// The transport's memo of fitted `web_payload`s (WebContentFitCache).
@Suite("Web Push content fits, once per message")
struct WebContentFitCacheTests {
    private let content = WebContent(
        payload: #"{"body":"\#(String(repeating: "x", count: 3000))","media":"m"}"#,
        shrink: [.drop(["/media"]), .shorten("/body")])

    @Test("the devices of one message share one fit, equal to fitting each")
    func oneFitPerMessage() throws {
        let cache = WebContentFitCache()
        for _ in 0..<500 {
            let fitted = cache.fitted(messageID: "m1", content: content)
            let alone = WebPushPayload.fit(content)
            #expect(try fitted.full.get() == alone.full.get())
            #expect(try fitted.stepDown.get() == alone.stepDown.get())
        }
        #expect(cache.computed == 1 && cache.count == 1)
    }

    @Test("at most 64 messages are kept; past them the least recently used is fitted again")
    func bounded() {
        let cache = WebContentFitCache()
        #expect(cache.capacity == 64)
        for i in 0...64 { _ = cache.fitted(messageID: "m\(i)", content: content) }
        #expect(cache.count == 64 && cache.computed == 65)
        _ = cache.fitted(messageID: "m64", content: content)
        #expect(cache.computed == 65, "the newest is still there")
        _ = cache.fitted(messageID: "m0", content: content)
        #expect(cache.computed == 66, "the oldest was forgotten")
        #expect(cache.count == 64)
    }
}
