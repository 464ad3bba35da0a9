import Foundation
import HeraldTestSupport
import HeraldJSON
import Testing

/// One bad call and the error it must get.
struct BadInput: Sendable, CustomStringConvertible {
    let method: String
    /// What is wrong, for failure messages.
    let label: String
    /// The params member as raw JSON text (so duplicate keys can be sent).
    /// `$WITNESS_FCM` is replaced by the witness's fcm device id.
    let params: String
    let code: Int
    /// The expected `data.field` (-32602, 1001), nil for errors without one.
    let field: String?
    /// The expected `data.reason` for application errors.
    let reason: String?

    var description: String { "\(method) — \(label)" }
}

/// Builds the corpus.
private enum Corpus {
    static let p256dh = "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4"
    static let auth = "BTBZMqHH6r4Tts7J_aSIgg"
    static let keys = #"{"p256dh":"\#(p256dh)","auth":"\#(auth)"}"#
    static let apnsToken = "00112233445566778899aabbccddeeff"
    static let webEndpoint = "https://93.184.216.34/push/bad-input"
    /// The user of the bad calls; it never gets a device.
    static let user = "bi-user"
    /// A user with two devices that bad calls aim at; they must stay as they are.
    static let witness = "bi-witness"
    static let witnessToken = "bi-witness-token"
    static let witnessAPNs = "ffeeddccbbaa99887766554433221100"
    static let witnessSession = "bi-session"

    static func x(_ n: Int, _ c: Character = "x") -> String { String(repeating: c, count: n) }

    static func bad(_ method: String, _ label: String, _ params: String, _ field: String) -> BadInput {
        BadInput(method: method, label: label, params: params, code: -32602, field: field, reason: nil)
    }

    static func app(_ method: String, _ label: String, _ params: String, _ code: Int, _ reason: String) -> BadInput {
        BadInput(
            method: method, label: label, params: params, code: code, field: code == 1001 ? "token" : nil,
            reason: reason)
    }

    /// `device.register` params: a valid fcm registration with `extra` members spliced in.
    static func fcm(_ extra: String = "") -> String {
        #"{"user":"\#(user)","platform":"fcm","token":"bi-token"\#(extra.isEmpty ? "" : ",")\#(extra)}"#
    }

    static func apns(_ extra: String = "", token: String = apnsToken, platform: String = "apns") -> String {
        #"{"user":"\#(user)","platform":"\#(platform)","token":"\#(token)"\#(extra.isEmpty ? "" : ",")\#(extra)}"#
    }

    static func web(token: String = webEndpoint, keys: String = keys, _ extra: String = "") -> String {
        #"{"user":"\#(user)","platform":"web","token":"\#(token)","keys":\#(keys)\#(extra.isEmpty ? "" : ",")\#(extra)}"#
    }

    static func webKeys(
        p256dh: String = #""\#(p256dh)""#, auth: String = #""\#(auth)""#, _ extra: String = ""
    ) -> String {
        web(keys: #"{"p256dh":\#(p256dh),"auth":\#(auth)\#(extra.isEmpty ? "" : ",")\#(extra)}"#)
    }

    /// Cases every method shares: the `app` param and the params container.
    static func common(_ method: String, _ required: String) -> [BadInput] {
        let sep = required.isEmpty ? "" : ","
        return [
            bad(method, "params by position", #"["\#(user)"]"#, "params"),
            bad(method, "unknown param", #"{\#(required)\#(sep)"bogus":1}"#, "bogus"),
            bad(method, "unknown param differing only in case", #"{\#(required)\#(sep)"App":"default"}"#, "App"),
            bad(method, "app not a string", #"{\#(required)\#(sep)"app":5}"#, "app"),
            bad(method, "app an array", #"{\#(required)\#(sep)"app":["default"]}"#, "app"),
            bad(method, "app empty", #"{\#(required)\#(sep)"app":""}"#, "app"),
            bad(method, "app over 64 bytes", #"{\#(required)\#(sep)"app":"\#(x(65, "a"))"}"#, "app"),
            bad(method, "app given twice", #"{\#(required)\#(sep)"app":"default","app":"default"}"#, "app"),
            app(method, "unknown app", #"{\#(required)\#(sep)"app":"nope"}"#, 1004, "unknown_app"),
            app(method, "forbidden app", #"{\#(required)\#(sep)"app":"locked"}"#, 1006, "forbidden"),
            app(method, "forbidden app, params otherwise bad", #"{"app":"locked","bogus":[]}"#, 1006, "forbidden"),
        ]
    }

    static let register: [BadInput] = {
        let m = "device.register"
        return common(m, #""user":"\#(user)","platform":"fcm","token":"bi-token""#) + [
            // Missing required params.
            bad(m, "no params at all", "{}", "user"),
            bad(m, "user missing", #"{"platform":"fcm","token":"bi-token"}"#, "user"),
            bad(m, "platform missing", #"{"user":"\#(user)","token":"bi-token"}"#, "platform"),
            bad(m, "token missing", #"{"user":"\#(user)","platform":"fcm"}"#, "token"),
            bad(m, "web without keys", #"{"user":"\#(user)","platform":"web","token":"\#(webEndpoint)"}"#, "keys"),
            bad(m, "web with keys null", web(keys: "null"), "keys"),
            bad(m, "web keys without p256dh", web(keys: #"{"auth":"\#(auth)"}"#), "keys.p256dh"),
            bad(m, "web keys without auth", web(keys: #"{"p256dh":"\#(p256dh)"}"#), "keys.auth"),
            bad(m, "web keys empty object", web(keys: "{}"), "keys.p256dh"),
            bad(m, "user null", #"{"user":null,"platform":"fcm","token":"bi-token"}"#, "user"),
            bad(m, "token null", #"{"user":"\#(user)","platform":"fcm","token":null}"#, "token"),
            // Wrong types.
            bad(m, "user a number", #"{"user":5,"platform":"fcm","token":"bi-token"}"#, "user"),
            bad(m, "user an array", #"{"user":["\#(user)"],"platform":"fcm","token":"bi-token"}"#, "user"),
            bad(m, "user an object", #"{"user":{"name":"\#(user)"},"platform":"fcm","token":"bi-token"}"#, "user"),
            bad(m, "user a boolean", #"{"user":true,"platform":"fcm","token":"bi-token"}"#, "user"),
            bad(m, "platform a number", #"{"user":"\#(user)","platform":1,"token":"bi-token"}"#, "platform"),
            bad(m, "platform an array", #"{"user":"\#(user)","platform":["fcm"],"token":"bi-token"}"#, "platform"),
            bad(m, "platform unknown", #"{"user":"\#(user)","platform":"pigeon","token":"bi-token"}"#, "platform"),
            bad(m, "platform in upper case", #"{"user":"\#(user)","platform":"FCM","token":"bi-token"}"#, "platform"),
            bad(m, "platform empty", #"{"user":"\#(user)","platform":"","token":"bi-token"}"#, "platform"),
            bad(m, "token a number", #"{"user":"\#(user)","platform":"fcm","token":123}"#, "token"),
            bad(m, "token an object", #"{"user":"\#(user)","platform":"fcm","token":{}}"#, "token"),
            bad(m, "token an array", #"{"user":"\#(user)","platform":"fcm","token":["bi-token"]}"#, "token"),
            bad(m, "keys a string", web(keys: #""\#(p256dh)""#), "keys"),
            bad(m, "keys an array", web(keys: #"["\#(p256dh)","\#(auth)"]"#), "keys"),
            bad(m, "keys.p256dh a number", webKeys(p256dh: "5"), "keys.p256dh"),
            bad(m, "keys.auth an object", webKeys(auth: "{}"), "keys.auth"),
            bad(m, "environment a number", apns(#""environment":1"#), "environment"),
            bad(m, "environment unknown", apns(#""environment":"sandbox""#), "environment"),
            bad(m, "environment in mixed case", apns(#""environment":"Production""#), "environment"),
            bad(m, "name a number", fcm(#""name":5"#), "name"),
            bad(m, "app_version a number", fcm(#""app_version":1.2"#), "app_version"),
            bad(m, "session an object", fcm(#""session":{}"#), "session"),
            bad(m, "registration_id a number", fcm(#""registration_id":5"#), "registration_id"),
            bad(m, "version a string", fcm(#""registration_id":"r","version":"3""#), "version"),
            bad(m, "version a boolean", fcm(#""registration_id":"r","version":true"#), "version"),
            // Empty strings.
            bad(m, "user empty", #"{"user":"","platform":"fcm","token":"bi-token"}"#, "user"),
            bad(m, "fcm token empty", #"{"user":"\#(user)","platform":"fcm","token":""}"#, "token"),
            bad(m, "apns token empty", apns(token: ""), "token"),
            bad(m, "web endpoint empty", web(token: ""), "token"),
            bad(m, "session empty", fcm(#""session":"""#), "session"),
            bad(m, "registration_id empty", fcm(#""registration_id":"""#), "registration_id"),
            bad(m, "keys.p256dh empty", webKeys(p256dh: #""""#), "keys.p256dh"),
            bad(m, "keys.auth empty", webKeys(auth: #""""#), "keys.auth"),
            // Oversize strings.
            bad(m, "user of 257 bytes", #"{"user":"\#(x(257))","platform":"fcm","token":"bi-token"}"#, "user"),
            bad(
                m, "user of 129 characters, 258 bytes",
                #"{"user":"\#(x(129, "é"))","platform":"fcm","token":"bi-token"}"#, "user"),
            bad(m, "name of 257 bytes", fcm(#""name":"\#(x(257))""#), "name"),
            bad(m, "app_version of 65 bytes", fcm(#""app_version":"\#(x(65, "1"))""#), "app_version"),
            bad(
                m, "fcm token of 4097 bytes", #"{"user":"\#(user)","platform":"fcm","token":"\#(x(4097, "t"))"}"#,
                "token"),
            bad(m, "apns token of 514 hex digits", apns(token: x(514, "a")), "token"),
            bad(m, "web endpoint of 2049 bytes", web(token: "https://93.184.216.34/" + x(2049 - 22, "p")), "token"),
            bad(m, "session of 513 bytes", fcm(#""session":"\#(x(513))""#), "session"),
            bad(
                m, "registration_id of 129 bytes", fcm(#""registration_id":"\#(x(129))","version":1"#),
                "registration_id"),
            bad(m, "keys.p256dh of 129 bytes", webKeys(p256dh: #""\#(x(129, "A"))""#), "keys.p256dh"),
            bad(m, "keys.auth of 65 bytes", webKeys(auth: #""\#(x(65, "A"))""#), "keys.auth"),
            // Forms that do not fit the platform.
            bad(m, "apns token not hex", apns(token: "0011223344556677889900112233445g"), "token"),
            bad(m, "apns token of odd length", apns(token: "00112233445566778"), "token"),
            bad(m, "apns token too short (14)", apns(token: "00112233445566"), "token"),
            bad(m, "apns token with a 0x prefix", apns(token: "0x112233445566778899"), "token"),
            bad(m, "apns token with spaces", apns(token: "00112233 44556677 8899aabb ccddeeff"), "token"),
            bad(m, "apns_voip token not hex", apns(token: "not-a-hex-token-at-all", platform: "apns_voip"), "token"),
            bad(m, "keys for apns", apns(#""keys":\#(keys)"#), "keys"),
            bad(m, "keys with a raw token for apns_voip", apns(#""keys":\#(keys)"#, platform: "apns_voip"), "token"),
            bad(m, "keys with a raw token for fcm", fcm(#""keys":\#(keys)"#), "token"),
            bad(m, "empty keys object for fcm", fcm(#""keys":{}"#), "keys.p256dh"),
            // The Web Push form on fcm, apns_voip and unified_push.
            bad(m, "fcm keys without auth", fcm(#""keys":{"p256dh":"\#(p256dh)"}"#), "keys.auth"),
            bad(m, "fcm keys without p256dh", fcm(#""keys":{"auth":"\#(auth)"}"#), "keys.p256dh"),
            bad(
                m, "fcm endpoint URL without keys", #"{"user":"\#(user)","platform":"fcm","token":"\#(webEndpoint)"}"#,
                "keys"),
            bad(
                m, "apns_voip endpoint URL without keys",
                #"{"user":"\#(user)","platform":"apns_voip","token":"\#(webEndpoint)"}"#, "keys"),
            bad(
                m, "unified_push without keys",
                #"{"user":"\#(user)","platform":"unified_push","token":"\#(webEndpoint)"}"#, "keys"),
            bad(
                m, "unified_push raw token", #"{"user":"\#(user)","platform":"unified_push","token":"bi-token"}"#,
                "keys"),
            bad(
                m, "unified_push raw token with keys",
                #"{"user":"\#(user)","platform":"unified_push","token":"bi-token","keys":\#(keys)}"#, "token"),
            bad(
                m, "unified_push endpoint over http",
                #"{"user":"\#(user)","platform":"unified_push","token":"http://93.184.216.34/up","keys":\#(keys)}"#,
                "token"),
            app(
                m, "unified_push endpoint on a private address",
                #"{"user":"\#(user)","platform":"unified_push","token":"https://10.0.0.1/up","keys":\#(keys)}"#, 1001,
                "not_publicly_routable"),
            app(
                m, "fcm Web Push form on loopback",
                #"{"user":"\#(user)","platform":"fcm","token":"https://127.0.0.1/wp","keys":\#(keys)}"#, 1001,
                "not_publicly_routable"),
            app(
                m, "apns_voip Web Push form on a private address",
                #"{"user":"\#(user)","platform":"apns_voip","token":"https://192.168.1.1/v","keys":\#(keys)}"#, 1001,
                "not_publicly_routable"),
            bad(
                m, "application_server_key on a legacy fcm device", fcm(#""application_server_key":"x""#),
                "application_server_key"),
            // Client builds.
            bad(m, "app_id empty", fcm(#""app_id":"""#), "app_id"),
            bad(m, "app_id over 64 bytes", fcm(#""app_id":"\#(x(65, "b"))""#), "app_id"),
            bad(m, "app_id with a space", fcm(#""app_id":"be ta""#), "app_id"),
            bad(m, "app_id with a slash", fcm(#""app_id":"beta/1""#), "app_id"),
            bad(m, "app_id non-ASCII", fcm(#""app_id":"bêta""#), "app_id"),
            bad(m, "app_id a number", fcm(#""app_id":5"#), "app_id"),
            bad(m, "user_agent empty", fcm(#""user_agent":"""#), "user_agent"),
            bad(m, "user_agent over 1024 characters", fcm(#""user_agent":"\#(x(1025, "u"))""#), "user_agent"),
            bad(
                m, "user_agent over 1024 characters of two bytes", fcm(#""user_agent":"\#(x(1025, "é"))""#),
                "user_agent"),
            bad(m, "user_agent with a newline", fcm(#""user_agent":"a\nb""#), "user_agent"),
            bad(m, "user_agent an object", fcm(#""user_agent":{}"#), "user_agent"),
            bad(m, "environment for fcm", fcm(#""environment":"production""#), "environment"),
            bad(m, "environment for web", web(#""environment":"production""#), "environment"),
            bad(m, "fcm token with a space", #"{"user":"\#(user)","platform":"fcm","token":"bi token"}"#, "token"),
            bad(
                m, "fcm token with a control character",
                #"{"user":"\#(user)","platform":"fcm","token":"bi\u0001token"}"#, "token"),
            bad(
                m, "p256dh in standard base64 with padding",
                webKeys(
                    p256dh:
                        #""BCVxsr7N/eNgVRqvHtD0zTZsEc6+VV+JvLexhqUzORcxaOzi6+AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4=""#),
                "keys.p256dh"),
            bad(m, "p256dh not base64 at all", webKeys(p256dh: #""!!not base64!!""#), "keys.p256dh"),
            bad(
                m, "p256dh of 64 bytes (no 0x04 prefix)",
                webKeys(
                    p256dh: #""JXGyvs3942BVGq8e0PTNNmwRzr5VX4m8t7GGpTM5FzFo7OLr4BhZe9MEebhuPI-OztV3ylkYfpJGmQ22ggCLDg""#
                ),
                "keys.p256dh"),
            bad(
                m, "p256dh off the curve",
                webKeys(
                    p256dh:
                        #""BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw8""#),
                "keys.p256dh"),
            bad(
                m, "p256dh a compressed point", webKeys(p256dh: #""AiVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcx""#),
                "keys.p256dh"),
            bad(
                m, "p256dh of 65 bytes with prefix 0x05",
                webKeys(
                    p256dh:
                        #""BSVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4""#),
                "keys.p256dh"),
            bad(m, "p256dh the point (0, 0)", webKeys(p256dh: #""BA\#(x(85, "A"))""#), "keys.p256dh"),
            bad(m, "auth of 15 bytes", webKeys(auth: #""BTBZMqHH6r4Tts7J_aSI""#), "keys.auth"),
            bad(m, "auth of 17 bytes", webKeys(auth: #""BTBZMqHH6r4Tts7J_aSIggA""#), "keys.auth"),
            bad(m, "auth not base64url", webKeys(auth: #""BTBZMqHH6r4Tts7J/aSIgg==""#), "keys.auth"),
            bad(m, "version without registration_id", fcm(#""version":1"#), "version"),
            bad(m, "registration_id without version", fcm(#""registration_id":"r""#), "version"),
            bad(m, "version negative", fcm(#""registration_id":"r","version":-1"#), "version"),
            bad(m, "version fractional", fcm(#""registration_id":"r","version":1.5"#), "version"),
            bad(m, "version written 1.0", fcm(#""registration_id":"r","version":1.0"#), "version"),
            bad(m, "version written 1e3", fcm(#""registration_id":"r","version":1e3"#), "version"),
            bad(m, "version above 2^53", fcm(#""registration_id":"r","version":9007199254740993"#), "version"),
            bad(m, "version beyond 64 bits", fcm(#""registration_id":"r","version":99999999999999999999"#), "version"),
            // Web Push endpoints.
            bad(m, "web endpoint over http", web(token: "http://93.184.216.34/push"), "token"),
            bad(m, "web endpoint with userinfo", web(token: "https://user:pw@93.184.216.34/push"), "token"),
            bad(m, "web endpoint on port 8443", web(token: "https://93.184.216.34:8443/push"), "token"),
            bad(m, "web endpoint with a fragment", web(token: "https://93.184.216.34/push#frag"), "token"),
            bad(m, "web endpoint not a URL", web(token: "not a url"), "token"),
            bad(m, "web endpoint with a non-ASCII host", web(token: "https://püsh.example/x"), "token"),
            bad(m, "web endpoint with a backslash", web(token: #"https://93.184.216.34\\push"#), "token"),
            app(
                m, "web endpoint on a private address", web(token: "https://10.0.0.1/push"), 1001,
                "not_publicly_routable"),
            app(m, "web endpoint on loopback IPv6", web(token: "https://[::1]/x"), 1001, "not_publicly_routable"),
            // Unknown and duplicate params.
            bad(m, "unknown param among valid ones", fcm(#""device_name":"x""#), "device_name"),
            bad(m, "id as a param", fcm(#""id":1"#), "id"),
            bad(m, "unknown member inside keys", webKeys(#""extra":1"#), "keys.extra"),
            bad(m, "keys member in the wrong case", webKeys(#""P256DH":"x""#), "keys.P256DH"),
            bad(
                m, "user given twice", #"{"user":"\#(user)","user":"bi-other","platform":"fcm","token":"bi-token"}"#,
                "user"),
            bad(m, "token given twice", fcm(#""token":"bi-token-2""#), "token"),
            bad(m, "keys given twice", web(#""keys":\#(keys)"#), "keys"),
            bad(m, "keys.p256dh given twice", webKeys(#""p256dh":"\#(p256dh)""#), "keys.p256dh"),
            bad(m, "keys.auth given twice", webKeys(#""auth":"\#(auth)""#), "keys.auth"),
            // Aimed at the witness: must not touch its devices.
            bad(
                m, "witness binding with a new name and an unknown param",
                #"{"user":"\#(witness)","platform":"fcm","token":"\#(witnessToken)","name":"changed","bogus":1}"#,
                "bogus"),
            bad(
                m, "witness binding with a name of 257 bytes",
                #"{"user":"\#(witness)","platform":"fcm","token":"\#(witnessToken)","name":"\#(x(257))"}"#, "name"),
            bad(
                m, "witness apns binding given keys",
                #"{"user":"\#(witness)","platform":"apns","token":"\#(witnessAPNs)","keys":\#(keys)}"#, "keys"),
        ]
    }()

    static let unregister: [BadInput] = {
        let m = "device.unregister"
        let id = #""device_id":"0123456789abcdef0123456789abcdef""#
        func u(_ body: String) -> String { #"{"user":"\#(user)",\#(body)}"# }
        return common(m, #""user":"\#(user)",\#(id)"#) + [
            bad(m, "no params at all", "{}", "user"),
            bad(m, "user missing", "{\(id)}", "user"),
            bad(m, "no form at all", #"{"user":"\#(user)"}"#, "device_id"),
            bad(m, "app_id with device_id", u(#"\#(id),"app_id":"beta""#), "app_id"),
            bad(m, "app_id malformed", u(#""platform":"fcm","token":"bi-token","app_id":"be ta""#), "app_id"),
            bad(m, "app_id over 64 bytes", u(#""platform":"fcm","token":"bi-token","app_id":"\#(x(65))""#), "app_id"),
            bad(m, "user a number", #"{"user":5,\#(id)}"#, "user"),
            bad(m, "user empty", #"{"user":"",\#(id)}"#, "user"),
            bad(m, "user of 257 bytes", #"{"user":"\#(x(257))",\#(id)}"#, "user"),
            bad(m, "device_id a number", u(#""device_id":5"#), "device_id"),
            bad(m, "device_id empty", u(#""device_id":"""#), "device_id"),
            bad(m, "device_id of 31 hex digits", u(#""device_id":"\#(x(31, "a"))""#), "device_id"),
            bad(m, "device_id of 33 hex digits", u(#""device_id":"\#(x(33, "a"))""#), "device_id"),
            bad(m, "device_id in upper case", u(#""device_id":"\#(x(32, "A"))""#), "device_id"),
            bad(m, "device_id not hex", u(#""device_id":"\#(x(32, "z"))""#), "device_id"),
            bad(m, "device_id and token", u(#"\#(id),"platform":"fcm","token":"bi-token""#), "device_id"),
            bad(m, "device_id and registration_id", u(#"\#(id),"registration_id":"r","version":1"#), "device_id"),
            bad(
                m, "binding and registration",
                u(#""platform":"fcm","token":"bi-token","registration_id":"r","version":1"#),
                "device_id"),
            bad(
                m, "all three forms", u(#"\#(id),"platform":"fcm","token":"t","registration_id":"r","version":1"#),
                "device_id"),
            bad(m, "device_id with environment", u(#"\#(id),"environment":"production""#), "environment"),
            bad(m, "platform without token", u(#""platform":"fcm""#), "token"),
            bad(m, "token without platform", u(#""token":"bi-token""#), "platform"),
            bad(m, "platform unknown", u(#""platform":"pigeon","token":"bi-token""#), "platform"),
            bad(m, "platform a number", u(#""platform":5,"token":"bi-token""#), "platform"),
            bad(m, "token a number", u(#""platform":"fcm","token":5"#), "token"),
            bad(m, "token empty", u(#""platform":"fcm","token":"""#), "token"),
            bad(m, "token of 4097 bytes", u(#""platform":"fcm","token":"\#(x(4097))""#), "token"),
            bad(m, "apns token not hex", u(#""platform":"apns","token":"\#(x(32, "g"))""#), "token"),
            bad(m, "apns token of odd length", u(#""platform":"apns","token":"\#(x(17, "a"))""#), "token"),
            bad(
                m, "environment for fcm", u(#""platform":"fcm","token":"bi-token","environment":"production""#),
                "environment"),
            bad(
                m, "environment for web", u(#""platform":"web","token":"\#(webEndpoint)","environment":"development""#),
                "environment"),
            bad(
                m, "environment unknown", u(#""platform":"apns","token":"\#(apnsToken)","environment":"staging""#),
                "environment"),
            bad(m, "registration_id without version", u(#""registration_id":"r""#), "version"),
            bad(m, "version without registration_id", u(#""version":1"#), "version"),
            bad(m, "registration_id empty", u(#""registration_id":"","version":1"#), "registration_id"),
            bad(
                m, "registration_id of 129 bytes", u(#""registration_id":"\#(x(129))","version":1"#), "registration_id"),
            bad(m, "registration_id a number", u(#""registration_id":5,"version":1"#), "registration_id"),
            bad(m, "version negative", u(#""registration_id":"r","version":-1"#), "version"),
            bad(m, "version fractional", u(#""registration_id":"r","version":1.5"#), "version"),
            bad(m, "version a string", u(#""registration_id":"r","version":"1""#), "version"),
            bad(
                m, "registration with environment", u(#""registration_id":"r","version":1,"environment":"production""#),
                "environment"),
            bad(m, "device_id given twice", u(#"\#(id),\#(id)"#), "device_id"),
            bad(m, "user given twice", #"{"user":"\#(user)","user":"\#(user)",\#(id)}"#, "user"),
            // Aimed at the witness.
            bad(
                m, "witness device_id and its binding",
                #"{"user":"\#(witness)","device_id":"$WITNESS_FCM","platform":"fcm","token":"\#(witnessToken)"}"#,
                "device_id"),
            bad(
                m, "witness device_id with an unknown param",
                #"{"user":"\#(witness)","device_id":"$WITNESS_FCM","bogus":1}"#,
                "bogus"),
            bad(
                m, "witness binding with environment",
                #"{"user":"\#(witness)","platform":"fcm","token":"\#(witnessToken)","environment":"production"}"#,
                "environment"),
            bad(
                m, "witness apns binding in the wrong environment form",
                #"{"user":"\#(witness)","platform":"apns","token":"\#(witnessAPNs)","environment":"Production"}"#,
                "environment"),
            bad(
                m, "witness registration with an unknown param",
                #"{"user":"\#(witness)","registration_id":"bi-reg","version":9,"bogus":true}"#, "bogus"),
        ]
    }()

    static func userOnly(_ m: String) -> [BadInput] {
        common(m, #""user":"\#(user)""#) + [
            bad(m, "no params at all", "{}", "user"),
            bad(m, "user null", #"{"user":null}"#, "user"),
            bad(m, "user a number", #"{"user":5}"#, "user"),
            bad(m, "user an array", #"{"user":["\#(user)"]}"#, "user"),
            bad(m, "user an object", #"{"user":{}}"#, "user"),
            bad(m, "user empty", #"{"user":""}"#, "user"),
            bad(m, "user of 257 bytes", #"{"user":"\#(x(257))"}"#, "user"),
            bad(m, "users instead of user", #"{"users":["\#(user)"]}"#, "user"),
            bad(m, "user given twice", #"{"user":"\#(witness)","user":"\#(user)"}"#, "user"),
            bad(m, "witness with an unknown param", #"{"user":"\#(witness)","all":true}"#, "all"),
        ]
    }

    static let sessionEnd: [BadInput] = {
        let m = "session.end"
        return common(m, #""user":"\#(user)","session":"s""#) + [
            bad(m, "no params at all", "{}", "user"),
            bad(m, "session missing", #"{"user":"\#(user)"}"#, "session"),
            bad(m, "user missing", #"{"session":"s"}"#, "user"),
            bad(m, "user a number", #"{"user":5,"session":"s"}"#, "user"),
            bad(m, "user of 257 bytes", #"{"user":"\#(x(257))","session":"s"}"#, "user"),
            bad(m, "session null", #"{"user":"\#(user)","session":null}"#, "session"),
            bad(m, "session empty", #"{"user":"\#(user)","session":""}"#, "session"),
            bad(m, "session a number", #"{"user":"\#(user)","session":5}"#, "session"),
            bad(m, "session an array", #"{"user":"\#(user)","session":["s"]}"#, "session"),
            bad(m, "session of 513 bytes", #"{"user":"\#(user)","session":"\#(x(513))"}"#, "session"),
            bad(m, "session given twice", #"{"user":"\#(user)","session":"s","session":"t"}"#, "session"),
            bad(
                m, "witness session with an unknown param",
                #"{"user":"\#(witness)","session":"\#(witnessSession)","everywhere":true}"#, "everywhere"),
            bad(
                m, "witness session given twice",
                #"{"user":"\#(witness)","session":"\#(witnessSession)","session":"\#(witnessSession)"}"#, "session"),
        ]
    }()

    static let push: [BadInput] = {
        let m = "push.send"
        let to = #""to":{"users":["\#(witness)"]}"#
        func send(_ extra: String) -> String { "{\(to),\(extra)}" }
        let tenThousandOne = "[" + (0...10_000).map { #""u\#($0)""# }.joined(separator: ",") + "]"
        let sixtyFive = "{" + (0..<65).map { #""k\#($0)":"v""# }.joined(separator: ",") + "}"
        let seventeen = "[" + (0..<17).map { _ in #""a""# }.joined(separator: ",") + "]"
        return common(m, to) + [
            bad(m, "no to", "{}", "to"),
            bad(m, "to not an object", #"{"to":["\#(witness)"]}"#, "to"),
            bad(m, "to empty", #"{"to":{}}"#, "to.users"),
            bad(
                m, "to with users and devices", #"{"to":{"users":["\#(witness)"],"devices":["$WITNESS_FCM"]}}"#,
                "to.users"),
            bad(m, "to.users empty", #"{"to":{"users":[]}}"#, "to.users"),
            bad(m, "to.users not an array", #"{"to":{"users":"\#(witness)"}}"#, "to.users"),
            bad(m, "to.users with a number", #"{"to":{"users":[1]}}"#, "to.users[0]"),
            bad(m, "to.users with an empty user", #"{"to":{"users":["\#(witness)",""]}}"#, "to.users[1]"),
            bad(m, "to.users over 10,000", #"{"to":{"users":\#(tenThousandOne)}}"#, "to.users"),
            bad(m, "to.devices not a device id", #"{"to":{"devices":["zz"]}}"#, "to.devices[0]"),
            bad(m, "to.devices in upper case", #"{"to":{"devices":["\#(x(32, "A"))"]}}"#, "to.devices[0]"),
            bad(m, "to with an unknown member", #"{"to":{"users":["\#(witness)"],"groups":["g"]}}"#, "to.groups"),
            bad(m, "kind unknown", send(#""kind":"shout""#), "kind"),
            bad(m, "kind a number", send(#""kind":1"#), "kind"),
            bad(m, "data not an object", send(#""data":"x""#), "data"),
            bad(m, "data with a number", send(#""data":{"n":1}"#), "data.n"),
            bad(m, "data with an empty key", send(#""data":{"":"v"}"#), "data."),
            bad(m, "data with a duplicate key", send(#""data":{"k":"a","k":"b"}"#), "data.k"),
            bad(m, "data with 65 members", send(#""data":\#(sixtyFive)"#), "data"),
            bad(m, "data value over 1024 bytes", send(#""data":{"k":"\#(x(1025))"}"#), "data.k"),
            bad(m, "data key over 64 bytes", send(#""data":{"\#(x(65))":"v"}"#), "data.\(x(65))"),
            bad(m, "alert not an object", send(#""alert":"NEW""#), "alert"),
            bad(m, "alert.loc_key a number", send(#""alert":{"loc_key":1}"#), "alert.loc_key"),
            bad(m, "alert with content", send(#""alert":{"title":"hi"}"#), "alert.title"),
            bad(m, "alert.loc_args not an array", send(#""alert":{"loc_args":"a"}"#), "alert.loc_args"),
            bad(m, "alert.loc_args with 17 items", send(#""alert":{"loc_args":\#(seventeen)}"#), "alert.loc_args"),
            bad(m, "badge negative", send(#""badge":-1"#), "badge"),
            bad(m, "badge a fraction", send(#""badge":1.5"#), "badge"),
            bad(m, "badge a string", send(#""badge":"3""#), "badge"),
            bad(m, "badge over 999999", send(#""badge":1000000"#), "badge"),
            bad(m, "badge of a user negative", send(#""badge":{"\#(witness)":-1}"#), "badge.\(witness)"),
            bad(m, "badge of an empty user", send(#""badge":{"":1}"#), "badge."),
            bad(m, "collapse_key empty", send(#""collapse_key":"""#), "collapse_key"),
            bad(m, "collapse_key a number", send(#""collapse_key":7"#), "collapse_key"),
            bad(m, "collapse_key over 256 bytes", send(#""collapse_key":"\#(x(257))""#), "collapse_key"),
            bad(m, "priority unknown", send(#""priority":"urgent""#), "priority"),
            bad(m, "ttl negative", send(#""ttl":-1"#), "ttl"),
            bad(m, "ttl over four weeks", send(#""ttl":2419201"#), "ttl"),
            bad(m, "ttl a string", send(#""ttl":"60""#), "ttl"),
            bad(m, "idempotency_key empty", send(#""idempotency_key":"""#), "idempotency_key"),
            bad(m, "wait a string", send(#""wait":"yes""#), "wait"),
            bad(m, "timeout_ms without wait", send(#""timeout_ms":100"#), "timeout_ms"),
            bad(m, "timeout_ms over 300000", send(#""wait":true,"timeout_ms":300001"#), "timeout_ms"),
            bad(m, "content smuggled in", send(#""body":"hello""#), "body"),
        ]
    }()

    static func messageMethod(_ m: String, extra: [BadInput] = []) -> [BadInput] {
        let id = #""message_id":"\#(x(32, "0"))""#
        return common(m, id) + [
            bad(m, "no message_id", "{}", "message_id"),
            bad(m, "message_id a number", #"{"message_id":7}"#, "message_id"),
            bad(m, "message_id not hex", #"{"message_id":"\#(x(32, "g"))"}"#, "message_id"),
            bad(m, "message_id too short", #"{"message_id":"abc"}"#, "message_id"),
            app(m, "unknown message", "{\(id)}", 1003, "not_found"),
        ] + extra
    }

    static func appOnly(_ m: String) -> [BadInput] {
        common(m, "") + [
            bad(m, "user is not a param here", #"{"user":"\#(user)"}"#, "user"),
            bad(m, "app null then unknown param", #"{"app":null,"x":1}"#, "x"),
        ]
    }

    static let all: [BadInput] =
        register + unregister + userOnly("device.list") + sessionEnd + userOnly("user.forget")
        + appOnly("system.health") + appOnly("system.stats") + appOnly("rpc.discover")
        + push
        + messageMethod(
            "push.status",
            extra: [bad("push.status", "detail a string", #"{"message_id":"\#(x(32, "0"))","detail":"yes"}"#, "detail")]
        )
        + messageMethod("push.cancel")
        + appOnly("vapid.public_key") + [
            // This daemon has no VAPID key.
            bad("vapid.public_key", "web push disabled for the app", "{}", "app")
        ]
}

@Suite(
    "bad input for every method", .serialized,
    // Two system.* calls follow each of the corpus's inputs.
    .sharedDaemon(server: "system_calls_per_minute = 1000000") { _ in
        """
        [app.default]
        device_cap = 20

        [app.locked]
        allow_uids = 4242
        """
    })
struct BadInputTests {
    /// A connection that numbers its requests and parses answers strictly.
    final class Client {
        let connection: TestConnection
        var nextID = 1

        init(_ connection: TestConnection) { self.connection = connection }

        /// Sends `{"jsonrpc":"2.0","id":N,"method":…,"params":<raw>}` and returns the response.
        func call(_ method: String, rawParams: String?) throws -> JSON {
            let id = nextID
            nextID += 1
            let params = rawParams.map { #","params":\#($0)"# } ?? ""
            try connection.send(#"{"jsonrpc":"2.0","id":\#(id),"method":"\#(method)"\#(params)}"# + "\n")
            guard let line = connection.readLine(timeout: 10) else {
                throw HarnessError("no response to \(method) (id \(id))")
            }
            let response = try JSONParser.parse(line)
            guard response["id"] == .number(JSONNumber(id)) else {
                throw HarnessError("response with the wrong id (expected \(id)): \(line)")
            }
            return response
        }

        func result(_ method: String, _ rawParams: String? = nil) throws -> JSON {
            let response = try call(method, rawParams: rawParams)
            guard let result = response["result"] else {
                throw HarnessError("\(method) \(rawParams ?? "") failed: \(response)")
            }
            return result
        }
    }

    @Test("every method refuses bad input with the right code and field, stores nothing, and the connection goes on")
    func corpus() throws {
        let daemon = try SuiteDaemon.daemon()
        let client = Client(try daemon.connect())
        defer { client.connection.close() }

        // The witness: two devices that calls aimed at them must leave alone.
        let registered = try client.result(
            "device.register",
            #"{"user":"\#(Corpus.witness)","platform":"fcm","token":"\#(Corpus.witnessToken)","name":"witness","#
                + #""session":"\#(Corpus.witnessSession)","registration_id":"bi-reg","version":3}"#)
        let witnessID = try #require(registered["device_id"]?.stringValue)
        _ = try client.result(
            "device.register",
            #"{"user":"\#(Corpus.witness)","platform":"apns","token":"\#(Corpus.witnessAPNs)","session":"\#(Corpus.witnessSession)"}"#
        )
        let list = { (user: String) throws -> JSON in
            try client.result("device.list", #"{"user":\#(JSON.string(user))}"#)
        }
        let witnessDevices = try list(Corpus.witness)
        #expect(witnessDevices["devices"]?.arrayValue?.count == 2)
        let deviceCounts = { () throws -> JSON? in try client.result("system.stats")["devices"] }
        let baseline = try deviceCounts()

        #expect(Corpus.all.count > 200)
        for bad in Corpus.all {
            let params = bad.params.replacingOccurrences(of: "$WITNESS_FCM", with: witnessID)
            let response = try client.call(bad.method, rawParams: params)
            let error = response["error"]
            let data = error?["data"]
            #expect(response["result"] == nil, "\(bad): succeeded: \(response)")
            #expect(
                error?["code"]?.numberValue?.text == String(bad.code),
                "\(bad): expected code \(bad.code), got \(response)")
            if let field = bad.field {
                #expect(data?["field"]?.stringValue == field, "\(bad): expected data.field \(field), got \(response)")
            }
            if let reason = bad.reason {
                #expect(
                    data?["reason"]?.stringValue == reason, "\(bad): expected data.reason \(reason), got \(response)")
            } else {
                #expect(data?["reason"]?.stringValue?.isEmpty == false, "\(bad): no data.reason in \(response)")
            }

            // The same connection keeps working.
            let health = try client.result("system.health")
            #expect(health["status"]?.stringValue == "ok", "\(bad): system.health afterwards: \(health)")
            // Nothing was stored, nothing removed or changed.
            #expect(try list(Corpus.user)["devices"] == .array([]), "\(bad): a device was stored for \(Corpus.user)")
            #expect(try list(Corpus.witness) == witnessDevices, "\(bad): the witness's devices changed")
            #expect(try deviceCounts() == baseline, "\(bad): the device counts changed")
        }
        #expect(daemon.isRunning)
    }
}
