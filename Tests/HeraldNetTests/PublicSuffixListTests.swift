import Foundation
import Testing
@testable import HeraldNet

/// A few rules of the real list, in its format: the cases below come from the
/// list's own test file (publicsuffix.org's tests/test_psl.txt).
private let sample = """
    // ===BEGIN ICANN DOMAINS===
    com
    uk
    co.uk
    jp
    ac.jp
    kyoto.jp
    ide.kyoto.jp
    *.kobe.jp
    !city.kobe.jp
    *.ck
    !www.ck
    us
    ak.us
    k12.ak.us
    *.mm
    // Unicode rules are skipped: names arrive in their ASCII form.
    公司.cn
    // ===BEGIN PRIVATE DOMAINS===
    uk.com   trailing words are ignored
    """

@Suite("Public Suffix List")
struct PublicSuffixListTests {
    static func cases(_ list: PublicSuffixList) -> [(String, String)] {
        [
            // The name itself when it is a public suffix (the list's tests say null).
            ("com", "com"), ("example.com", "example.com"), ("b.example.com", "example.com"),
            ("a.b.example.com", "example.com"), ("uk.com", "uk.com"), ("example.uk.com", "example.uk.com"),
            ("a.b.example.uk.com", "example.uk.com"), ("co.uk", "co.uk"), ("example.co.uk", "example.co.uk"),
            ("hang1.example.co.uk", "example.co.uk"), ("jp", "jp"), ("test.jp", "test.jp"),
            ("www.test.jp", "test.jp"), ("ac.jp", "ac.jp"), ("test.ac.jp", "test.ac.jp"),
            ("kyoto.jp", "kyoto.jp"), ("ide.kyoto.jp", "ide.kyoto.jp"), ("b.ide.kyoto.jp", "b.ide.kyoto.jp"),
            ("a.b.ide.kyoto.jp", "b.ide.kyoto.jp"), ("c.kobe.jp", "c.kobe.jp"), ("b.c.kobe.jp", "b.c.kobe.jp"),
            ("a.b.c.kobe.jp", "b.c.kobe.jp"), ("city.kobe.jp", "city.kobe.jp"),
            ("www.city.kobe.jp", "city.kobe.jp"), ("ck", "ck"), ("test.ck", "test.ck"),
            ("b.test.ck", "b.test.ck"), ("a.b.test.ck", "b.test.ck"), ("www.ck", "www.ck"),
            ("www.www.ck", "www.ck"), ("us", "us"), ("test.us", "test.us"), ("www.test.us", "test.us"),
            ("ak.us", "ak.us"), ("test.ak.us", "test.ak.us"), ("www.test.ak.us", "test.ak.us"),
            ("k12.ak.us", "k12.ak.us"), ("test.k12.ak.us", "test.k12.ak.us"),
            ("www.test.k12.ak.us", "test.k12.ak.us"), ("c.mm", "c.mm"), ("b.c.mm", "b.c.mm"),
            ("a.b.c.mm", "b.c.mm"),
            // Case, a trailing dot, and names no rule covers (the implicit `*`).
            ("WWW.Example.COM.", "example.com"), ("a.b.example.test", "example.test"), ("localhost", "localhost"),
        ]
    }

    @Test("the list's own test cases, on rules in its format")
    func sampleRules() {
        let list = PublicSuffixList(parsing: sample)
        #expect(list.ruleCount == 16)
        for (host, domain) in Self.cases(list) {
            #expect(list.registrableDomain(of: host) == domain, "\(host)")
        }
        #expect(list.publicSuffix(of: "a.b.c.kobe.jp") == "c.kobe.jp")
        #expect(list.publicSuffix(of: "www.city.kobe.jp") == "kobe.jp")
        #expect(list.publicSuffix(of: "x.example.test") == "test")
    }

    @Test("Debian's list, when installed, gives the same answers")
    func debianList() throws {
        guard let list = PublicSuffixList.load() else {
            // publicsuffix is in the Makefile's Debian packages; without it the daemon falls back.
            #expect(!FileManager.default.fileExists(atPath: PublicSuffixList.debianPath))
            return
        }
        #expect(list.ruleCount > 5000)
        for (host, domain) in Self.cases(list) {
            #expect(list.registrableDomain(of: host) == domain, "\(host)")
        }
        // Names under a private-section suffix are domains of their own.
        #expect(list.registrableDomain(of: "a.b.blogspot.com") == "b.blogspot.com")
    }

    @Test("without the list: the last two labels, and a missing file loads nothing")
    func fallback() {
        let list = PublicSuffixList.lastTwoLabels
        #expect(list.ruleCount == 0)
        #expect(list.registrableDomain(of: "a.b.example.co.uk") == "co.uk")
        #expect(list.registrableDomain(of: "example.com") == "example.com")
        #expect(list.registrableDomain(of: "com") == "com")
        #expect(PublicSuffixList.load(path: "/nonexistent/public_suffix_list.dat") == nil)
    }
}
