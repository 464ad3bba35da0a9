public import HeraldCore
internal import HeraldCrypto
internal import HeraldJSON

/// The plaintext Herald seals into a Web Push record for one device, and the
/// smaller one it falls back to when a push service answers 413.
///
/// Full form: `{"kind":…,"data":{…},"badge":n}` — `data` always present (`{}`
/// when empty), string values in the caller's order; `badge` a JSON number, left
/// out when the user has none; `"silent":true` when the device's quiet hours
/// ask for a silent delivery (in every form, the step-down ones too). The
/// service worker reads the JSON itself, so there are no reserved data keys.
///
/// Every record is padded to one fixed body size (2816 bytes by default, which
/// holds 2713 bytes of plaintext) so that its length says nothing about what it
/// carries. A plaintext that does not fit is refused before queueing.
///
/// 413 step-down: a push service may take less than RFC 8030's 4096 bytes
/// (Mozilla's FCM bridge about 2744, Firefox for Android 3070, some 2048). The
/// sender then tries once more with `minimalPlaintext` sealed to
/// `stepDownBodySize` (2048 by default), still padded to a fixed size. The
/// minimal form drops the badge and keeps `{"kind","data"}` when that fits the
/// smaller record, else it is `{"kind"}` alone: the push stays a wake-up, the
/// app refetches over its own session, and clients must tolerate missing fields.
///
/// With `web_payload` (``PushMessage/webContent``) the plaintext is that
/// object instead, compact, brought under the record by the caller's shrink
/// steps (``WebContentFit``); the 413 retry applies the same steps against
/// the smaller record, and fails when none brings it under.
public struct WebPushPayload: Sendable, Hashable {
    /// Herald's record body size: 2816 bytes.
    public static let defaultBodySize: Int = WebPushSealer.defaultBodySize
    /// The record body size of the one retry after a 413: 2048 bytes.
    public static let defaultStepDownBodySize = 2048

    /// The largest plaintext a record of `bodySize` bytes holds: the body less
    /// the 86-byte header, the padding delimiter and the 16-byte tag (2713 for
    /// 2816). 0 is an unpadded record of up to 4096 bytes (3993). Returns 0 for a
    /// body size no record can have.
    public static func plaintextCapacity(bodySize: Int) -> Int {
        bodySize < 0 ? 0 : WebPushSealer.maximumPlaintext(bodySize: bodySize)
    }

    public let kind: PushKind
    /// The body size `plaintext` is checked against and must be sealed to.
    public let bodySize: Int
    /// The full form, at most `plaintextCapacity(bodySize:)` bytes.
    public let plaintext: [UInt8]
    /// The body size to seal `minimalPlaintext` to on the 413 retry.
    public let stepDownBodySize: Int
    /// The step-down form: `{"kind","data"}` when it fits a record of
    /// `stepDownBodySize`, else `{"kind"}`.
    public let minimalPlaintext: [UInt8]
    /// Whether `minimalPlaintext` kept the data.
    public let minimalKeepsData: Bool
    /// With `web_payload`: whether `plaintext` is it whole or which shrink
    /// step made it fit; nil for Herald's own form.
    public let shrink: ShrinkOutcome?
    /// The same for `minimalPlaintext` (the 413 retry).
    public let minimalShrink: ShrinkOutcome?
    /// False when no shrink step brings `web_payload` under the step-down
    /// record: a 413 then fails the delivery (`web_payload_too_large`).
    public let minimalFits: Bool

    /// A `web_payload` fitted to the record and to the 413 step-down record.
    /// It depends on the message alone, not on the device.
    public struct FittedContent: Sendable {
        public let full: Result<WebContentFit.Fitted, WebContentFit.TooLarge>
        public let stepDown: Result<WebContentFit.Fitted, WebContentFit.TooLarge>
    }

    /// Fits `content` to both record sizes.
    public static func fit(
        _ content: WebContent, bodySize: Int = WebPushPayload.defaultBodySize,
        stepDownBodySize: Int = WebPushPayload.defaultStepDownBodySize
    ) -> FittedContent {
        FittedContent(
            full: WebContentFit.fit(content, capacity: plaintextCapacity(bodySize: bodySize)),
            stepDown: WebContentFit.fit(content, capacity: plaintextCapacity(bodySize: stepDownBodySize)))
    }

    /// Builds both plaintexts for one device.
    ///
    /// - Parameters:
    ///   - message: the message as `push.send` accepted it.
    ///   - user: the device's user, for a per-user badge.
    ///   - bodySize: the record body size (default 2816).
    ///   - stepDownBodySize: the body size of the 413 retry (default 2048).
    ///   - fitted: `message.webContent` already fitted to both sizes
    ///     (``fit(_:bodySize:stepDownBodySize:)``; the same for every device
    ///     of a message), or nil to fit it here.
    public init(
        message: PushMessage, user: String, bodySize: Int = WebPushPayload.defaultBodySize,
        stepDownBodySize: Int = WebPushPayload.defaultStepDownBodySize, fitted: FittedContent? = nil
    ) throws(WebPushPayloadError) {
        let capacity = Self.plaintextCapacity(bodySize: bodySize)
        guard capacity > 0 else { throw .invalidBodySize(bodySize) }
        let stepDownCapacity = Self.plaintextCapacity(bodySize: stepDownBodySize)
        guard stepDownCapacity > 0 else { throw .invalidBodySize(stepDownBodySize) }

        if let content = message.webContent {
            // The caller's content instead of Herald's own form, shrunk to
            // fit each record size by the caller's steps.
            let fits =
                fitted ?? Self.fit(content, bodySize: bodySize, stepDownBodySize: stepDownBodySize)
            switch fits.full {
            case .failure(let e):
                throw .payloadTooLarge(PayloadTooLarge(platform: .web, limit: capacity, size: e.size))
            case .success(let fitted):
                self.kind = message.kind
                self.bodySize = bodySize
                self.plaintext = fitted.plaintext
                self.stepDownBodySize = stepDownBodySize
                self.shrink = fitted.shrink
                switch fits.stepDown {
                case .success(let smaller):
                    self.minimalPlaintext = smaller.plaintext
                    self.minimalShrink = smaller.shrink
                    self.minimalFits = true
                case .failure:
                    self.minimalPlaintext = []
                    self.minimalShrink = nil
                    self.minimalFits = false
                }
                self.minimalKeepsData = false
            }
            return
        }

        var seen = Set<String>()
        var data = JSONObject()
        for (key, value) in message.data {
            if !seen.insert(key).inserted { throw .duplicateDataKey(key) }
            data.append(key, .string(value))
        }
        let kind = JSON.string(message.kind.rawValue)
        var full: JSONObject = ["kind": kind, "data": .object(data)]
        if let badge = message.badge(for: user) { full.append("badge", .int(badge)) }
        // The device's quiet hours: a hint for the service worker to show
        // the notification without sound or vibration.
        if message.silent { full.append("silent", true) }
        let plaintext = JSON.object(full).serialized()
        guard plaintext.count <= capacity else {
            throw .payloadTooLarge(PayloadTooLarge(platform: .web, limit: capacity, size: plaintext.count))
        }

        var stepDown: JSONObject = ["kind": kind, "data": .object(data)]
        if message.silent { stepDown.append("silent", true) }
        let withData = JSON.object(stepDown).serialized()
        let keepsData = withData.count <= stepDownCapacity
        self.kind = message.kind
        self.bodySize = bodySize
        self.plaintext = plaintext
        self.stepDownBodySize = stepDownBodySize
        self.minimalKeepsData = keepsData
        var bare: JSONObject = ["kind": kind]
        if message.silent { bare.append("silent", true) }
        self.minimalPlaintext = keepsData ? withData : JSON.object(bare).serialized()
        self.shrink = nil
        self.minimalShrink = nil
        self.minimalFits = true
    }
}
