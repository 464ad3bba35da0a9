/// A request for ``HTTPClient/send(_:completion:)``.
public struct HTTPRequest: Sendable {
    /// HTTP method. `POST` by default.
    public var method: String
    /// Absolute `https://` URL (or `http://` to a loopback host when the client allows it).
    public var url: String
    /// Request headers, sent in order. Names are sent as given.
    public var headers: [(String, String)]
    /// Request body (sent for every method except GET/HEAD; an empty body is sent as `Content-Length: 0` for POST).
    public var body: [UInt8]
    /// Total time budget for the transfer, including connect and TLS. Default 15 s.
    public var timeout: Duration
    /// Time budget for the TCP + TLS connect phase. Default 5 s.
    public var connectTimeout: Duration
    /// IP literals the connection must go to (already checked by the caller).
    ///
    /// The connection goes to the first of them (`CURLOPT_CONNECT_TO`): the resolver is bypassed,
    /// TLS SNI and the certificate host check still use the URL's host name, and a connection is
    /// reused only for requests pinned to the same address.
    public var pinnedAddresses: [String]?

    public init(
        method: String = "POST",
        url: String,
        headers: [(String, String)] = [],
        body: [UInt8] = [],
        timeout: Duration = .seconds(15),
        connectTimeout: Duration = .seconds(5),
        pinnedAddresses: [String]? = nil
    ) {
        self.method = method
        self.url = url
        self.headers = headers
        self.body = body
        self.timeout = timeout
        self.connectTimeout = connectTimeout
        self.pinnedAddresses = pinnedAddresses
    }
}

/// A response. Any HTTP status (including 3xx, 4xx and 5xx) is a response, not an error.
public struct HTTPResponse: Sendable {
    /// The final status code.
    public var status: Int
    /// Response headers of the final response, names lowercased, in arrival order.
    public var headers: [(name: String, value: String)]
    /// The response body (at most ``HTTPClient/Configuration/maxResponseBodyBytes``).
    public var body: [UInt8]
    /// The HTTP version used: `"1.0"`, `"1.1"`, `"2"` or `"3"`.
    public var httpVersion: String
    /// The IP address the connection actually went to (`CURLINFO_PRIMARY_IP`).
    public var primaryIP: String

    public init(
        status: Int, headers: [(name: String, value: String)], body: [UInt8], httpVersion: String, primaryIP: String
    ) {
        self.status = status
        self.headers = headers
        self.body = body
        self.httpVersion = httpVersion
        self.primaryIP = primaryIP
    }

    /// The first value of a header (name compared case-insensitively).
    public func header(_ name: String) -> String? {
        let lower = name.lowercased()
        return headers.first { $0.name == lower }?.value
    }
}

/// Why a request produced no response.
public enum HTTPError: Error, Sendable, Equatable {
    /// The total or connect timeout elapsed (curl 28).
    case timeout(String)
    /// The TCP connection could not be made (curl 7, and other connect-phase failures).
    case connectFailed(String)
    /// The host name could not be resolved (curl 6).
    case dnsFailure(String)
    /// TLS handshake or certificate / host name verification failed (curl 35, 51, 53, 54, 58, 59, 60, 64, 66, 77, 80, 82, 83, 90, 91).
    case tls(String)
    /// HTTP/2 framing or stream error (curl 16, 92) before a 2xx status was received.
    case http2Stream(String)
    /// The response body exceeded the configured cap; the transfer was aborted.
    case bodyTooLarge(limit: Int)
    /// The request was rejected before any network activity (bad URL, disallowed scheme or host, bad pinned address).
    case invalidRequest(String)
    /// The client was shut down before the request completed.
    case shutdown
    /// Any other libcurl failure, with its code and message.
    case other(code: Int, message: String)
}
