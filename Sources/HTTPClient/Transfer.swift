import CHeraldCurl
import HeraldNet

#if canImport(Glibc)
    import Glibc
#endif

/// C callbacks. They reach the transfer through an unretained `Unmanaged` pointer; the engine
/// keeps the transfer alive while its easy handle is in the multi handle.
private let writeCallback: herald_curl_data_cb = { ptr, size, nmemb, userdata in
    guard let userdata else { return 0 }
    let transfer = Unmanaged<Transfer>.fromOpaque(userdata).takeUnretainedValue()
    let n = size * nmemb
    if n == 0 { return 0 }
    guard let ptr else { return 0 }
    if transfer.body.count + n > transfer.maxBody {
        transfer.bodyTooLarge = true
        return 0  // CURLE_WRITE_ERROR: abort the transfer
    }
    ptr.withMemoryRebound(to: UInt8.self, capacity: n) {
        transfer.body.append(contentsOf: UnsafeBufferPointer(start: $0, count: n))
    }
    return n
}

private let headerCallback: herald_curl_data_cb = { ptr, size, nmemb, userdata in
    guard let userdata else { return 0 }
    let transfer = Unmanaged<Transfer>.fromOpaque(userdata).takeUnretainedValue()
    let n = size * nmemb
    guard let ptr, n > 0 else { return n }
    let line = ptr.withMemoryRebound(to: UInt8.self, capacity: n) { p -> String in
        var len = n
        while len > 0, p[len - 1] == 13 || p[len - 1] == 10 { len -= 1 }  // strip CR LF
        return String(decoding: UnsafeBufferPointer(start: p, count: len), as: UTF8.self)
    }
    transfer.headerLine(line)
    return n
}

/// One request: its easy handle, the C memory it needs, and the response
/// being built. Made on the sender's thread, then handed to the engine
/// (``Engine/enqueue(_:)`` takes it `sending`), whose thread is its only user.
final class Transfer {
    let easy: UnsafeMutableRawPointer
    let maxBody: Int
    private let completion: @Sendable (Result<HTTPResponse, HTTPError>) -> Void
    private var headerList: UnsafeMutablePointer<curl_slist>?
    private var resolveList: UnsafeMutablePointer<curl_slist>?
    private let errorBuffer: UnsafeMutablePointer<CChar>
    private var completed = false

    var body: [UInt8] = []
    var headers: [(name: String, value: String)] = []
    var bodyTooLarge = false

    private init(
        easy: UnsafeMutableRawPointer, maxBody: Int,
        completion: @escaping @Sendable (Result<HTTPResponse, HTTPError>) -> Void
    ) {
        self.easy = easy
        self.maxBody = maxBody
        self.completion = completion
        let size = Int(herald_curl_error_size())
        errorBuffer = .allocate(capacity: size)
        errorBuffer.initialize(repeating: 0, count: size)
    }

    deinit {
        curl_easy_cleanup(easy)
        if let headerList { curl_slist_free_all(headerList) }
        if let resolveList { curl_slist_free_all(resolveList) }
        errorBuffer.deallocate()
    }

    func finish(_ result: Result<HTTPResponse, HTTPError>) {
        if completed { return }
        completed = true
        completion(result)
    }

    func headerLine(_ raw: String) {
        let line = Substring(raw)
        if line.isEmpty { return }
        if line.hasPrefix("HTTP/") {
            headers.removeAll()  // a new response (after 1xx, or the first status line)
            return
        }
        guard let colon = line.firstIndex(of: ":") else { return }
        let name = line[..<colon].lowercased()
        let value = line[line.index(after: colon)...].trimmingSpaces()
        headers.append((name: name, value: value))
    }

    // MARK: result

    func result(for code: CURLcode) -> Result<HTTPResponse, HTTPError> {
        var status = 0
        _ = herald_curl_easy_getinfo_long(easy, CURLINFO_RESPONSE_CODE, &status)
        // curl 7.88 reports an RST_STREAM(NO_ERROR) after a complete 2xx as error 92: the provider
        // accepted the request, so count it as success (see bench-sink.md).
        let h2ResetAfter2xx = code == CURLE_HTTP2_STREAM && (200..<300).contains(status)
        if code == CURLE_OK || h2ResetAfter2xx {
            var version = 0
            _ = herald_curl_easy_getinfo_long(easy, CURLINFO_HTTP_VERSION, &version)
            var ipPtr: UnsafePointer<CChar>?
            _ = herald_curl_easy_getinfo_string(easy, CURLINFO_PRIMARY_IP, &ipPtr)
            let ip = ipPtr.map { String(cString: $0) } ?? ""
            return .success(
                HTTPResponse(
                    status: status, headers: headers, body: body,
                    httpVersion: Transfer.versionString(version), primaryIP: ip))
        }
        if bodyTooLarge && code == CURLE_WRITE_ERROR {
            return .failure(.bodyTooLarge(limit: maxBody))
        }
        let message = errorMessage(code)
        switch code {
        case CURLE_OPERATION_TIMEDOUT:
            return .failure(.timeout(message))
        case CURLE_COULDNT_RESOLVE_HOST:
            return .failure(.dnsFailure(message))
        case CURLE_COULDNT_CONNECT:
            return .failure(.connectFailed(message))
        case CURLE_SSL_CONNECT_ERROR, CURLE_PEER_FAILED_VERIFICATION, CURLE_SSL_ENGINE_NOTFOUND,
            CURLE_SSL_ENGINE_SETFAILED, CURLE_SSL_CERTPROBLEM, CURLE_SSL_CIPHER, CURLE_SSL_ENGINE_INITFAILED,
            CURLE_SSL_CACERT_BADFILE, CURLE_SSL_SHUTDOWN_FAILED, CURLE_SSL_CRL_BADFILE, CURLE_SSL_ISSUER_ERROR,
            CURLE_SSL_PINNEDPUBKEYNOTMATCH, CURLE_SSL_INVALIDCERTSTATUS, CURLE_SSL_CLIENTCERT:
            return .failure(.tls(message))
        case CURLE_HTTP2, CURLE_HTTP2_STREAM:
            return .failure(.http2Stream(message))
        case CURLE_UNSUPPORTED_PROTOCOL, CURLE_URL_MALFORMAT:
            return .failure(.invalidRequest(message))
        default:
            return .failure(.other(code: Int(code.rawValue), message: message))
        }
    }

    private func errorMessage(_ code: CURLcode) -> String {
        let buffered = String(cString: errorBuffer)
        if !buffered.isEmpty { return buffered }
        return String(cString: curl_easy_strerror(code))
    }

    static func versionString(_ v: Int) -> String {
        switch v {
        case 1: return "1.0"  // CURL_HTTP_VERSION_1_0
        case 2: return "1.1"  // CURL_HTTP_VERSION_1_1
        case 3: return "2"  // CURL_HTTP_VERSION_2_0
        case 30: return "3"  // CURL_HTTP_VERSION_3
        default: return "unknown"
        }
    }

    /// OpenSSL's hashed system trust directory on Debian, when present.
    static let systemCertificateDirectory: String? = {
        var st = stat()
        return stat("/etc/ssl/certs", &st) == 0 && (st.st_mode & S_IFMT) == S_IFDIR ? "/etc/ssl/certs" : nil
    }()

    // MARK: setup

    static func make(
        _ request: HTTPRequest,
        configuration: HTTPClient.Configuration,
        completion: @escaping @Sendable (Result<HTTPResponse, HTTPError>) -> Void
    ) throws(HTTPError) -> Transfer {
        let target = try Target.parse(request.url)
        let scheme = target.scheme
        var pins = request.pinnedAddresses
        if let list = pins {
            if list.isEmpty { throw .invalidRequest("pinnedAddresses is empty") }
            for a in list where IPAddress(literal: a) == nil {
                throw .invalidRequest("pinned address is not an IP literal: \(a)")
            }
        }
        let protocols: String
        switch scheme {
        case "https":
            protocols = "https"
        case "http":
            guard configuration.allowPlainHTTPToLoopback else {
                throw .invalidRequest("plain http is not allowed")
            }
            let bare = target.host.hasPrefix("[") ? String(target.host.dropFirst().dropLast()) : target.host
            guard IPAddress.isLoopbackHost(bare) else {
                throw .invalidRequest("plain http is only allowed to loopback hosts")
            }
            if let list = pins, !list.allSatisfy({ IPAddress(literal: $0)?.isLoopback == true }) {
                throw .invalidRequest("plain http is only allowed to loopback addresses")
            }
            if target.host == "localhost" && pins == nil { pins = ["127.0.0.1"] }
            protocols = "http,https"
        default:
            throw .invalidRequest("unsupported scheme: \(scheme)")
        }
        if let list = pins, let hostAddress = IPAddress(literal: target.bareHost) {
            // Nothing to resolve: the URL's address must itself be one of the checked ones.
            guard list.contains(where: { IPAddress(literal: $0) == hostAddress }) else {
                throw .invalidRequest("URL host \(target.host) is not among the pinned addresses")
            }
            pins = nil
        }
        guard let method = validMethod(request.method) else {
            throw .invalidRequest("invalid method: \(request.method)")
        }
        guard let easy = curl_easy_init() else {
            throw .other(code: -1, message: "curl_easy_init failed")
        }
        let t = Transfer(easy: easy, maxBody: configuration.maxResponseBodyBytes, completion: completion)
        // From here on `t` owns `easy` and frees it (and its lists) in deinit, also on throw.
        let ctx = Unmanaged.passUnretained(t).toOpaque()
        try t.set(CURLOPT_ERRORBUFFER, pointer: UnsafeMutableRawPointer(t.errorBuffer))
        try t.set(CURLOPT_URL, string: request.url)
        try t.set(CURLOPT_PROTOCOLS_STR, string: protocols)
        try t.set(CURLOPT_REDIR_PROTOCOLS_STR, string: "https")
        try t.set(CURLOPT_FOLLOWLOCATION, 0)
        try t.set(CURLOPT_MAXREDIRS, 0)
        try t.set(CURLOPT_PROXY, string: "")
        try t.set(CURLOPT_NOPROXY, string: "*")
        try t.set(CURLOPT_SSL_VERIFYPEER, 1)
        try t.set(CURLOPT_SSL_VERIFYHOST, 2)
        if let ca = configuration.caFile {
            // The extra bundle replaces libcurl's default bundle file; the system
            // store stays trusted through its hashed directory.
            try t.set(CURLOPT_CAINFO, string: ca)
            try t.set(CURLOPT_CAPATH, string: Transfer.systemCertificateDirectory)
        }
        try t.set(CURLOPT_HTTP_VERSION, herald_curl_http_version_2tls())
        try t.set(CURLOPT_PIPEWAIT, 1)
        try t.set(CURLOPT_NOSIGNAL, 1)
        try t.set(CURLOPT_TCP_KEEPALIVE, 1)
        try t.set(CURLOPT_TIMEOUT_MS, milliseconds(request.timeout))
        try t.set(CURLOPT_CONNECTTIMEOUT_MS, milliseconds(request.connectTimeout))
        try t.set(CURLOPT_WRITEFUNCTION, callback: writeCallback)
        try t.set(CURLOPT_WRITEDATA, pointer: ctx)
        try t.set(CURLOPT_HEADERFUNCTION, callback: headerCallback)
        try t.set(CURLOPT_HEADERDATA, pointer: ctx)
        try t.set(CURLOPT_PRIVATE, pointer: ctx)

        // Pinning: CONNECT_TO host:port:addr:port — connect to the first vetted address, keep
        // the name for SNI and verification. Unlike a RESOLVE entry (which lands in the shared
        // DNS cache), connection reuse matches the connect-to address, so a connection opened
        // for one pin never carries a request pinned elsewhere.
        if let first = pins?.first {
            let addr = first.contains(":") && !first.hasPrefix("[") ? "[\(first)]" : first
            t.resolveList = try appendList(nil, "\(target.host):\(target.port):\(addr):\(target.port)")
            try t.set(CURLOPT_CONNECT_TO, list: t.resolveList)
        }

        // Headers.
        var list: UnsafeMutablePointer<curl_slist>?
        var sawExpect = false
        for (name, value) in request.headers {
            guard isToken(name), !value.utf8.contains(where: { $0 == 13 || $0 == 10 || $0 == 0 }) else {
                throw .invalidRequest("invalid header: \(name)")
            }
            if name.lowercased() == "expect" { sawExpect = true }
            let line = value.isEmpty ? "\(name);" : "\(name): \(value)"
            list = try appendList(list, line)
            t.headerList = list
        }
        if !sawExpect {
            list = try appendList(list, "Expect:")  // no 100-continue round trip on HTTP/1.1
            t.headerList = list
        }
        try t.set(CURLOPT_HTTPHEADER, list: t.headerList)

        // Method and body.
        switch method {
        case "GET" where request.body.isEmpty:
            try t.set(CURLOPT_HTTPGET, 1)
        case "HEAD" where request.body.isEmpty:
            try t.set(CURLOPT_NOBODY, 1)
        default:
            if method == "POST" || !request.body.isEmpty {
                try t.set(CURLOPT_POST, 1)
                try t.setBody(request.body)
            }
            if method != "POST" {
                try t.set(CURLOPT_CUSTOMREQUEST, string: method)
            }
        }
        return t
    }

    private func setBody(_ body: [UInt8]) throws(HTTPError) {
        var rc = herald_curl_easy_setopt_off(easy, CURLOPT_POSTFIELDSIZE_LARGE, Int64(body.count))
        if rc == CURLE_OK {
            // COPYPOSTFIELDS copies `POSTFIELDSIZE` bytes, so the Swift array need not outlive this call.
            rc = body.withUnsafeBytes { raw -> CURLcode in
                if let base = raw.baseAddress, raw.count > 0 {
                    return herald_curl_easy_setopt_pointer(
                        easy, CURLOPT_COPYPOSTFIELDS, UnsafeMutableRawPointer(mutating: base))
                }
                return "".withCString {
                    herald_curl_easy_setopt_pointer(easy, CURLOPT_COPYPOSTFIELDS, UnsafeMutableRawPointer(mutating: $0))
                }
            }
        }
        if rc != CURLE_OK { throw Transfer.setoptError(rc, "POSTFIELDS") }
    }

    // MARK: typed setopt helpers

    private func set(_ option: CURLoption, _ value: Int) throws(HTTPError) {
        let rc = herald_curl_easy_setopt_long(easy, option, value)
        if rc != CURLE_OK { throw Transfer.setoptError(rc, "\(option.rawValue)") }
    }

    private func set(_ option: CURLoption, string: String?) throws(HTTPError) {
        let rc: CURLcode
        if let string {
            // libcurl copies string options (CURLOPTTYPE_STRINGPOINT).
            rc = string.withCString { herald_curl_easy_setopt_string(easy, option, $0) }
        } else {
            rc = herald_curl_easy_setopt_string(easy, option, nil)
        }
        if rc != CURLE_OK { throw Transfer.setoptError(rc, "\(option.rawValue)") }
    }

    private func set(_ option: CURLoption, pointer: UnsafeMutableRawPointer?) throws(HTTPError) {
        let rc = herald_curl_easy_setopt_pointer(easy, option, pointer)
        if rc != CURLE_OK { throw Transfer.setoptError(rc, "\(option.rawValue)") }
    }

    private func set(_ option: CURLoption, list: UnsafeMutablePointer<curl_slist>?) throws(HTTPError) {
        let rc = herald_curl_easy_setopt_slist(easy, option, list)
        if rc != CURLE_OK { throw Transfer.setoptError(rc, "\(option.rawValue)") }
    }

    private func set(_ option: CURLoption, callback: herald_curl_data_cb) throws(HTTPError) {
        let rc = herald_curl_easy_setopt_data_cb(easy, option, callback)
        if rc != CURLE_OK { throw Transfer.setoptError(rc, "\(option.rawValue)") }
    }

    private static func setoptError(_ rc: CURLcode, _ what: String) -> HTTPError {
        .other(code: Int(rc.rawValue), message: "curl_easy_setopt(\(what)): \(String(cString: curl_easy_strerror(rc)))")
    }
}

private func appendList(
    _ list: UnsafeMutablePointer<curl_slist>?, _ line: String
) throws(HTTPError) -> UnsafeMutablePointer<curl_slist>? {
    guard let new = line.withCString({ curl_slist_append(list, $0) }) else {
        throw .other(code: -1, message: "curl_slist_append failed")
    }
    return new
}

private func milliseconds(_ d: Duration) -> Int {
    let (s, atto) = d.components
    let ms = s * 1000 + atto / 1_000_000_000_000_000
    return Int(max(1, min(ms, Int64(Int32.max))))
}

private func isToken(_ s: String) -> Bool {
    if s.isEmpty { return false }
    return s.utf8.allSatisfy { c in
        switch c {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"):
            return true
        default:
            return "!#$%&'*+-.^_`|~".utf8.contains(c)
        }
    }
}

private func validMethod(_ m: String) -> String? {
    isToken(m) ? m : nil
}

extension Substring {
    func trimmingSpaces() -> String {
        var s = self
        while let f = s.first, f == " " || f == "\t" { s.removeFirst() }
        while let l = s.last, l == " " || l == "\t" { s.removeLast() }
        return String(s)
    }
}

/// Scheme, host and port of a URL, parsed by libcurl's own URL parser (curl_url_get is not variadic):
/// the host checked here must be the host curl connects to, so curl's reading is the one that counts
/// (the URLs the transports pass were read by HeraldNet's URL parser first).
struct Target {
    var scheme: String
    var host: String  // as in the URL; IPv6 literals keep their brackets
    var port: Int
    var bareHost: String { host.hasPrefix("[") && host.hasSuffix("]") ? String(host.dropFirst().dropLast()) : host }

    static func parse(_ url: String) throws(HTTPError) -> Target {
        guard let h = curl_url() else { throw .other(code: -1, message: "curl_url failed") }
        defer { curl_url_cleanup(h) }
        let rc = url.withCString { curl_url_set(h, CURLUPART_URL, $0, 0) }
        guard rc == CURLUE_OK else { throw .invalidRequest("malformed URL: \(url)") }
        func part(_ p: CURLUPart, _ flags: UInt32 = 0) -> String? {
            var out: UnsafeMutablePointer<CChar>?
            guard curl_url_get(h, p, &out, flags) == CURLUE_OK, let out else { return nil }
            defer { curl_free(out) }
            return String(cString: out)
        }
        guard let scheme = part(CURLUPART_SCHEME)?.lowercased(),
            let host = part(CURLUPART_HOST)?.lowercased(),
            let portString = part(CURLUPART_PORT, UInt32(CURLU_DEFAULT_PORT)),
            let port = Int(portString)
        else { throw .invalidRequest("URL needs a scheme, host and port: \(url)") }
        return Target(scheme: scheme, host: host, port: port)
    }
}
