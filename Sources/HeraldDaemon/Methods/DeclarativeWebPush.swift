import HeraldCore
import HeraldJSON
import HeraldNet
import JSONRPC

/// Declarative Web Push (WebKit, Safari 18.4): a Web Push record whose JSON
/// says `"web_push": 8030` is shown by the browser itself, without a service
/// worker; a browser that does not know the form hands the same JSON to the
/// service worker's `push` event. WebKit drops a declarative message it
/// cannot read (no `title`, no `navigate`), so `push.send` refuses one.
enum DeclarativeWebPush {
    /// The `web_push` member's value that marks the form (the RFC number of Web Push).
    static let marker = 8030
    static let maxTitleBytes = 256
    /// A body longer than a record holds is for the shrink steps to shorten.
    static let maxBodyBytes = PushLimits.maxWebPayloadBytes
    static let maxURLBytes = 2048
    static let maxLangBytes = 35
    static let maxTagBytes = 256
    static let maxBadge = 999_999
    static let directions = ["auto", "ltr", "rtl"]
    /// The members a shrink step must leave as they are: without them the
    /// message is no longer one WebKit shows.
    static let required = ["/web_push", "/notification/title", "/notification/navigate"]

    /// Whether a `web_payload` object is in the declarative form (it names `web_push`).
    static func isDeclarative(_ payload: JSONObject) -> Bool { payload["web_push"] != nil }

    /// Checks a `web_payload` object that names `web_push` against the
    /// declarative form WebKit reads; members it does not know pass as they are.
    static func check(_ payload: JSONObject, field: String) throws(RPCError) {
        guard case .number(let n)? = payload["web_push"], n.isIntegerLiteral, n.int64 == Int64(marker) else {
            throw .invalidParams(
                field: field + ".web_push", reason: "must be \(marker) (Declarative Web Push); leave it out otherwise")
        }
        let at = field + ".notification"
        guard case .object(let notification)? = payload["notification"] else {
            throw .invalidParams(field: at, reason: "is required: an object with title and navigate")
        }
        if let duplicate = notification.firstDuplicateKey {
            throw .invalidParams(field: at + "." + duplicate, reason: "duplicate key")
        }
        func string(_ name: String, maxBytes: Int, required: Bool = false) throws(RPCError) -> String? {
            switch notification[name] {
            case nil, .null?:
                if required {
                    throw .invalidParams(
                        field: at + "." + name, reason: "is required (WebKit drops a message without it)")
                }
                return nil
            case .string(let s)?:
                if s.utf8.count > maxBytes {
                    throw .invalidParams(field: at + "." + name, reason: "must be at most \(maxBytes) bytes")
                }
                return s
            default:
                throw .invalidParams(field: at + "." + name, reason: "must be a string")
            }
        }
        let title = try string("title", maxBytes: maxTitleBytes, required: true)!
        if title.isEmpty { throw .invalidParams(field: at + ".title", reason: "must not be empty") }
        let navigate = try string("navigate", maxBytes: maxURLBytes, required: true)!
        if let problem = urlProblem(navigate) { throw .invalidParams(field: at + ".navigate", reason: problem) }
        _ = try string("body", maxBytes: maxBodyBytes)
        _ = try string("lang", maxBytes: maxLangBytes)
        _ = try string("tag", maxBytes: maxTagBytes)
        if let icon = try string("icon", maxBytes: maxURLBytes), let problem = urlProblem(icon) {
            throw .invalidParams(field: at + ".icon", reason: problem)
        }
        if let dir = try string("dir", maxBytes: 8), !directions.contains(dir) {
            throw .invalidParams(field: at + ".dir", reason: "must be one of: " + directions.joined(separator: ", "))
        }
        for name in ["silent", "mutable"] {
            switch notification[name] {
            case nil, .null?, .bool?: break
            default: throw .invalidParams(field: at + "." + name, reason: "must be a boolean")
            }
        }
        switch notification["app_badge"] {
        case nil, .null?: break
        case .number(let badge)?:
            guard badge.isIntegerLiteral, let v = badge.int64, (1...Int64(maxBadge)).contains(v) else {
                throw .invalidParams(
                    field: at + ".app_badge",
                    reason: "must be an integer from 1 to \(maxBadge), or a string of digits (\"0\" clears the badge)")
            }
        case .string(let digits)?:
            guard !digits.isEmpty, digits.utf8.count <= 6, digits.utf8.allSatisfy({ (0x30...0x39).contains($0) })
            else {
                throw .invalidParams(
                    field: at + ".app_badge", reason: "must be a string of 1 to 6 digits, or an integer")
            }
        default:
            throw .invalidParams(field: at + ".app_badge", reason: "must be an integer or a string of digits")
        }
    }

    /// Why `text` is not a URL a notification may open (nil when it is): an
    /// absolute https URL without spaces or control characters.
    static func urlProblem(_ text: String) -> String? {
        let bytes = Array(text.utf8)
        if bytes.contains(where: { $0 <= 0x20 || $0 == 0x7F }) {
            return "must be an absolute https URL without spaces or control characters"
        }
        guard let url = try? HTTPURL(parsing: text), url.scheme == .https, !url.host.isEmpty else {
            return "must be an absolute https URL"
        }
        return nil
    }

    /// The `push.send` `notification` shorthand, built into a declarative
    /// `web_payload`: `{"web_push": 8030, "notification": {…}}`, with the
    /// message's `data` as `notification.data` (for a service worker, or a
    /// `mutable` one, to read).
    static func shorthand(
        _ p: inout ParamReader, data: [(key: String, value: String)]
    ) throws(RPCError) -> JSON? {
        try p.object("notification") { (n: inout ParamReader) throws(RPCError) -> JSON in
            var out = JSONObject()
            let title = try n.string("title", required: true, maxBytes: maxTitleBytes)!
            out.append("title", .string(title))
            let navigate = try n.string("navigate", required: true, maxBytes: maxURLBytes)!
            if let problem = urlProblem(navigate) { throw n.invalid("navigate", problem) }
            out.append("navigate", .string(navigate))
            if let body = try n.string("body", maxBytes: maxBodyBytes, allowEmpty: true) {
                out.append("body", .string(body))
            }
            if let lang = try n.string("lang", maxBytes: maxLangBytes) { out.append("lang", .string(lang)) }
            if let dir = try n.enumeration("dir", allowed: directions) { out.append("dir", .string(dir)) }
            if let tag = try n.string("tag", maxBytes: maxTagBytes) { out.append("tag", .string(tag)) }
            if let icon = try n.string("icon", maxBytes: maxURLBytes) {
                if let problem = urlProblem(icon) { throw n.invalid("icon", problem) }
                out.append("icon", .string(icon))
            }
            if let silent = try n.bool("silent") { out.append("silent", .bool(silent)) }
            // WebKit reads a badge of 0 as a string only.
            if let badge = try n.int("app_badge", range: 0...maxBadge) {
                out.append("app_badge", badge == 0 ? .string("0") : .int(badge))
            }
            if let mutable = try n.bool("mutable") { out.append("mutable", .bool(mutable)) }
            if !data.isEmpty {
                var members = JSONObject()
                for (key, value) in data { members.append(key, .string(value)) }
                out.append("data", .object(members))
            }
            var payload = JSONObject()
            payload.append("web_push", .int(marker))
            payload.append("notification", .object(out))
            return .object(payload)
        }
    }

    /// Refuses a shrink step that would take a declarative payload out of
    /// its form: dropping, shortening or not keeping `web_push`,
    /// `notification`, its `title` or its `navigate`.
    static func checkShrink(_ steps: [ShrinkStep], field: String) throws(RPCError) {
        func touchesRequired(_ pointer: String) -> Bool {
            // A pointer at a required member or at one holding it (`/notification`).
            required.contains { $0 == pointer || $0.hasPrefix(pointer + "/") }
        }
        for (i, step) in steps.enumerated() {
            let at = "\(field)[\(i)].\(step.name)"
            let reason =
                "would take the declarative payload out of its form (web_push, notification.title and "
                + "notification.navigate must stay as they are)"
            switch step {
            case .drop(let pointers):
                if pointers.contains(where: touchesRequired) { throw .invalidParams(field: at, reason: reason) }
            case .shorten(let pointer):
                if touchesRequired(pointer) { throw .invalidParams(field: at, reason: reason) }
            case .keep(let pointers):
                // Each required member is kept: named itself, or inside a kept one.
                let kept = required.allSatisfy { member in
                    pointers.contains { $0 == member || member.hasPrefix($0 + "/") }
                }
                if !kept { throw .invalidParams(field: at, reason: reason) }
            }
        }
    }
}
