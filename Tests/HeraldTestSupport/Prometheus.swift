import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// One sample of a Prometheus text exposition.
public struct PrometheusSample: Sendable, Equatable {
    public let name: String
    public let labels: [String: String]
    public let value: Double
}

/// A strict reader of the Prometheus text format (0.0.4): every family has
/// `# HELP` and `# TYPE` before its samples, names and labels are well formed,
/// values are numbers, histograms are cumulative and end in `+Inf` = `_count`.
public struct PrometheusExposition: Sendable {
    public let samples: [PrometheusSample]
    /// Family name → type (`counter`, `gauge`, `histogram`).
    public let types: [String: String]

    public init(_ text: String) throws {
        var samples: [PrometheusSample] = []
        var types: [String: String] = [:]
        var helped: Set<String> = []
        guard text.hasSuffix("\n") else { throw HarnessError("the exposition must end with a newline") }
        for (n, raw) in text.split(separator: "\n", omittingEmptySubsequences: false).dropLast().enumerated() {
            let line = String(raw)
            let where_ = "line \(n + 1): \(line)"
            if line.hasPrefix("# HELP ") {
                let parts = line.dropFirst(7).split(separator: " ", maxSplits: 1)
                guard parts.count == 2, Self.isName(String(parts[0])) else { throw HarnessError("bad HELP, \(where_)") }
                guard helped.insert(String(parts[0])).inserted else { throw HarnessError("HELP twice, \(where_)") }
            } else if line.hasPrefix("# TYPE ") {
                let parts = line.dropFirst(7).split(separator: " ")
                guard parts.count == 2,
                    ["counter", "gauge", "histogram", "summary", "untyped"].contains(String(parts[1]))
                else { throw HarnessError("bad TYPE, \(where_)") }
                guard types[String(parts[0])] == nil else { throw HarnessError("TYPE twice, \(where_)") }
                types[String(parts[0])] = String(parts[1])
            } else if line.hasPrefix("#") || line.isEmpty {
                throw HarnessError("unexpected comment or blank, \(where_)")
            } else {
                let sample = try Self.sample(line, where_)
                let family = Self.family(of: sample.name, types)
                guard types[family] != nil, helped.contains(family) else {
                    throw HarnessError("sample before its HELP/TYPE, \(where_)")
                }
                samples.append(sample)
            }
        }
        self.samples = samples
        self.types = types
        try checkHistograms()
    }

    /// The value of the sample with exactly these labels.
    public func value(_ name: String, _ labels: [String: String] = [:]) -> Double? {
        samples.first { $0.name == name && $0.labels == labels }?.value
    }

    private func checkHistograms() throws {
        for (family, type) in types where type == "histogram" {
            var series: [[String: String]: [(Double, Double)]] = [:]
            for s in samples where s.name == family + "_bucket" {
                var key = s.labels
                guard let le = key.removeValue(forKey: "le") else { throw HarnessError("\(family) bucket without le") }
                series[key, default: []].append((le == "+Inf" ? .infinity : Double(le)!, s.value))
            }
            for (labels, buckets) in series {
                for i in buckets.indices.dropFirst() {
                    guard buckets[i].0 > buckets[i - 1].0, buckets[i].1 >= buckets[i - 1].1 else {
                        throw HarnessError("\(family)\(labels) buckets not increasing")
                    }
                }
                guard buckets.last?.0 == .infinity, buckets.last?.1 == value(family + "_count", labels),
                    value(family + "_sum", labels) != nil
                else { throw HarnessError("\(family)\(labels): +Inf, _count and _sum do not agree") }
            }
        }
    }

    private static func family(of name: String, _ types: [String: String]) -> String {
        for suffix in ["_bucket", "_sum", "_count"] where name.hasSuffix(suffix) {
            let base = String(name.dropLast(suffix.count))
            if types[base] == "histogram" || types[base] == "summary" { return base }
        }
        return name
    }

    static func isName(_ s: String) -> Bool {
        guard let first = s.unicodeScalars.first, first.properties.isAlphabetic || first == "_" || first == ":" else {
            return false
        }
        return s.unicodeScalars.allSatisfy {
            $0.isASCII && ($0.properties.isAlphabetic || ("0"..."9").contains($0) || $0 == "_" || $0 == ":")
        }
    }

    private static func sample(_ line: String, _ where_: String) throws -> PrometheusSample {
        var rest = Substring(line)
        let nameEnd = rest.firstIndex { $0 == "{" || $0 == " " } ?? rest.endIndex
        let name = String(rest[..<nameEnd])
        guard isName(name) else { throw HarnessError("bad metric name, \(where_)") }
        rest = rest[nameEnd...]
        var labels: [String: String] = [:]
        if rest.first == "{" {
            rest = rest.dropFirst()
            while rest.first != "}" {
                guard let eq = rest.firstIndex(of: "=") else { throw HarnessError("bad label, \(where_)") }
                let key = String(rest[..<eq])
                guard isName(key), rest[rest.index(after: eq)...].first == "\"" else {
                    throw HarnessError("bad label, \(where_)")
                }
                rest = rest[rest.index(eq, offsetBy: 2)...]
                var value = ""
                while let c = rest.first, c != "\"" {
                    rest = rest.dropFirst()
                    if c == "\\" {
                        guard let e = rest.first else { throw HarnessError("bad escape, \(where_)") }
                        rest = rest.dropFirst()
                        switch e {
                        case "\\": value.append("\\")
                        case "\"": value.append("\"")
                        case "n": value.append("\n")
                        default: throw HarnessError("bad escape, \(where_)")
                        }
                    } else {
                        value.append(c)
                    }
                }
                guard rest.first == "\"" else { throw HarnessError("unterminated label, \(where_)") }
                rest = rest.dropFirst()
                guard labels.updateValue(value, forKey: key) == nil else {
                    throw HarnessError("label twice, \(where_)")
                }
                if rest.first == "," { rest = rest.dropFirst() }
            }
            rest = rest.dropFirst()
        }
        guard rest.first == " ", let value = Double(rest.dropFirst()) ?? (rest.dropFirst() == "+Inf" ? .infinity : nil)
        else { throw HarnessError("bad value, \(where_)") }
        return PrometheusSample(name: name, labels: labels, value: value)
    }
}

/// A plain HTTP/1.1 request to 127.0.0.1:`port`; (status, headers lowercased, body).
public func httpRequest(
    port: Int, method: String = "GET", path: String, headers extra: [String: String] = [:], timeout: Double = 10
) throws -> (status: Int, headers: [String: String], body: String) {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { throw HarnessError("socket: \(String(cString: strerror(errno)))") }
    defer { close(fd) }
    var addr = sockaddr_in()
    addr.sin_family = sa_family_t(AF_INET)
    addr.sin_port = in_port_t(UInt16(port).bigEndian)
    addr.sin_addr.s_addr = inet_addr("127.0.0.1")
    let rc = withUnsafePointer(to: &addr) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
            connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
        }
    }
    guard rc == 0 else { throw HarnessError("connect 127.0.0.1:\(port): \(String(cString: strerror(errno)))") }
    let fields = extra.sorted { $0.key < $1.key }.map { "\($0.key): \($0.value)\r\n" }.joined()
    let request = Array(
        "\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\n\(fields)Connection: close\r\n\r\n".utf8)
    _ = request.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
    var data: [UInt8] = []
    let deadline = Date().addingTimeInterval(timeout)
    while deadline.timeIntervalSinceNow > 0 {
        var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        guard poll(&pfd, 1, Int32(deadline.timeIntervalSinceNow * 1000)) > 0 else { break }
        var chunk = [UInt8](repeating: 0, count: 65536)
        let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        if n <= 0 { break }
        data += chunk[0..<n]
    }
    let text = String(decoding: data, as: UTF8.self)
    guard let split = text.range(of: "\r\n\r\n") else { throw HarnessError("no HTTP answer: \(text)") }
    let head = text[..<split.lowerBound].components(separatedBy: "\r\n")
    let statusParts = head[0].split(separator: " ")
    guard statusParts.count >= 2, let status = Int(statusParts[1]) else {
        throw HarnessError("bad status line \(head[0])")
    }
    var headers: [String: String] = [:]
    for line in head.dropFirst() {
        if let colon = line.firstIndex(of: ":") {
            headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(
                in: .whitespaces)
        }
    }
    var body = String(text[split.upperBound...])
    if headers["transfer-encoding"]?.lowercased() == "chunked" {
        var decoded = ""
        var rest = Substring(body)
        while let nl = rest.range(of: "\r\n"), let size = Int(rest[..<nl.lowerBound], radix: 16), size > 0 {
            let start = nl.upperBound
            let utf8 = rest[start...].utf8
            let end = utf8.index(utf8.startIndex, offsetBy: size)
            decoded += String(rest[start..<end])
            rest = rest[end...].dropFirst(2)
        }
        body = decoded
    }
    return (status, headers, body)
}
