internal import Foundation

/// The Public Suffix List (publicsuffix.org): which part of a name anyone may
/// register under, so that names one registrant controls are counted as one
/// domain (`a.example.co.uk` and `b.example.co.uk` are `example.co.uk`; two
/// names under `co.uk` are not one domain).
///
/// Rules are matched as the list's own algorithm says: the longest matching
/// rule wins, `*.` matches any one label, an exception (`!`) beats the
/// wildcard it carves out of, and a name no rule matches has its last label as
/// public suffix (the implicit `*`). Rules outside ASCII (IDN TLDs in their
/// Unicode form) are skipped: names arrive in their ASCII form, so such a name
/// falls to the implicit rule, as it would under the last-two-labels rule.
public struct PublicSuffixList: Sendable {
    /// Where Debian's `publicsuffix` package puts the list.
    public static let debianPath = "/usr/share/publicsuffix/public_suffix_list.dat"

    private let rules: Set<String>
    private let wildcards: Set<String>
    private let exceptions: Set<String>

    /// The rules loaded (normal, wildcard and exception); 0 for the fallback.
    public var ruleCount: Int { rules.count + wildcards.count + exceptions.count }

    /// No rules: every name's public suffix is its last label, so its domain
    /// is its last two labels (the rule used when the list is missing).
    public static let lastTwoLabels = PublicSuffixList(parsing: "")

    /// Parses the list's text format: one rule per line, `//` comments, a rule
    /// ending at the first white space.
    public init(parsing text: String) {
        var rules = Set<String>()
        var wildcards = Set<String>()
        var exceptions = Set<String>()
        for line in text.split(whereSeparator: \.isNewline) {
            guard let word = line.split(whereSeparator: { $0 == " " || $0 == "\t" }).first,
                !word.hasPrefix("//"), word.utf8.allSatisfy({ $0 < 0x80 })
            else { continue }
            let rule = word.lowercased()
            if rule.hasPrefix("!") {
                exceptions.insert(String(rule.dropFirst()))
            } else if rule.hasPrefix("*.") {
                wildcards.insert(String(rule.dropFirst(2)))
            } else {
                rules.insert(rule)
            }
        }
        self.rules = rules
        self.wildcards = wildcards
        self.exceptions = exceptions
    }

    /// Reads the list at `path`; nil when it cannot be read or holds no rule.
    public static func load(path: String = debianPath) -> PublicSuffixList? {
        guard let data = FileManager.default.contents(atPath: path) else { return nil }
        let list = PublicSuffixList(parsing: String(decoding: data, as: UTF8.self))
        return list.ruleCount > 0 ? list : nil
    }

    /// The public suffix of `host` (lowercase, no trailing dot).
    public func publicSuffix(of host: String) -> String {
        let labels = Self.labels(host)
        return labels[suffixStart(labels)...].joined(separator: ".")
    }

    /// The registrable domain of `host`: its public suffix and one more label.
    /// A name that is itself a public suffix (or a single label) is its own domain.
    public func registrableDomain(of host: String) -> String {
        let labels = Self.labels(host)
        let start = suffixStart(labels)
        return labels[max(0, start - 1)...].joined(separator: ".")
    }

    private static func labels(_ host: String) -> [Substring] {
        var name = Substring(host.lowercased())
        while name.hasSuffix(".") { name = name.dropLast() }
        return name.split(separator: ".", omittingEmptySubsequences: false)
    }

    /// The index of the first label of the public suffix.
    private func suffixStart(_ labels: [Substring]) -> Int {
        guard labels.count > 1 else { return 0 }
        // Longest candidate first: the first rule that matches is the longest.
        for i in 0..<labels.count {
            let candidate = labels[i...].joined(separator: ".")
            if exceptions.contains(candidate) { return i + 1 }
            if rules.contains(candidate) { return i }
            if i + 1 < labels.count, wildcards.contains(labels[(i + 1)...].joined(separator: ".")) { return i }
        }
        return labels.count - 1
    }
}
