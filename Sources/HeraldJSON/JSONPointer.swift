/// An RFC 6901 JSON pointer: `""` is the whole document, `/a/0/b~1c` the
/// member `b/c` of element 0 of member `a` (`~0` is `~`, `~1` is `/`).
///
/// An array is indexed only by a decimal without leading zeros (`0`, `12`);
/// `-` and any other token name no element. Evaluation never fails: a
/// pointer that names nothing is simply absent.
public struct JSONPointer: Sendable, Hashable, CustomStringConvertible {
    /// The reference tokens, unescaped.
    public let tokens: [String]
    /// The pointer as written.
    public let text: String

    /// Nil when `text` is not a pointer: it must be empty or start with `/`,
    /// and every `~` must be followed by `0` or `1`.
    public init?(_ text: String) {
        if text.isEmpty {
            self.tokens = []
            self.text = text
            return
        }
        guard text.utf8.first == UInt8(ascii: "/") else { return nil }
        var tokens: [String] = []
        for raw in text.utf8.dropFirst().split(separator: UInt8(ascii: "/"), omittingEmptySubsequences: false) {
            var token: [UInt8] = []
            var escape = false
            for b in raw {
                if escape {
                    switch b {
                    case UInt8(ascii: "0"): token.append(UInt8(ascii: "~"))
                    case UInt8(ascii: "1"): token.append(UInt8(ascii: "/"))
                    default: return nil
                    }
                    escape = false
                } else if b == UInt8(ascii: "~") {
                    escape = true
                } else {
                    token.append(b)
                }
            }
            if escape { return nil }
            tokens.append(String(decoding: token, as: UTF8.self))
        }
        self.tokens = tokens
        self.text = text
    }

    public var description: String { text }

    /// The array index a token names, if it is one.
    static func index(_ token: String) -> Int? {
        let u = token.utf8
        guard !u.isEmpty, u.count <= 9, u.allSatisfy({ $0 >= 48 && $0 <= 57 }) else { return nil }
        if u.count > 1 && u.first == 48 { return nil }
        return Int(token)
    }
}

extension JSON {
    /// The value `pointer` names, or nil.
    public func value(at pointer: JSONPointer) -> JSON? {
        var current = self
        for token in pointer.tokens {
            switch current {
            case .object(let o):
                guard let v = o[token] else { return nil }
                current = v
            case .array(let a):
                guard let i = JSONPointer.index(token), i < a.count else { return nil }
                current = a[i]
            default:
                return nil
            }
        }
        return current
    }

    /// Replaces the value `pointer` names (which must exist); false when it does not.
    @discardableResult
    public mutating func replace(at pointer: JSONPointer, with value: JSON) -> Bool {
        Self.edit(&self, pointer.tokens[...]) { target in
            target = value
            return true
        }
    }

    /// Removes the member or element `pointer` names; false when it names
    /// nothing (or the whole document, which cannot be removed).
    @discardableResult
    public mutating func remove(at pointer: JSONPointer) -> Bool {
        guard let last = pointer.tokens.last else { return false }
        return Self.edit(&self, pointer.tokens.dropLast()[...]) { parent in
            switch parent {
            case .object(var o):
                guard o[last] != nil else { return false }
                o[last] = nil
                parent = .object(o)
                return true
            case .array(var a):
                guard let i = JSONPointer.index(last), i < a.count else { return false }
                a.remove(at: i)
                parent = .array(a)
                return true
            default:
                return false
            }
        }
    }

    /// Only the values the pointers name, each at its place: objects on the
    /// way keep just those members (in their order), arrays just those
    /// elements (in their order, so indices close up). A pointer that names
    /// nothing adds nothing; keeping nothing of an object leaves `{}`.
    public func keeping(_ pointers: [JSONPointer]) -> JSON {
        Self.prune(self, pointers.map { $0.tokens[...] }) ?? Self.emptyLike(self)
    }

    private static func emptyLike(_ value: JSON) -> JSON {
        switch value {
        case .array: .array([])
        default: .object(JSONObject())
        }
    }

    private static func prune(_ value: JSON, _ paths: [ArraySlice<String>]) -> JSON? {
        if paths.contains(where: \.isEmpty) { return value }
        switch value {
        case .object(let o):
            var out = JSONObject()
            for member in o.members {
                let tails = paths.filter { $0.first == member.key }.map { $0.dropFirst() }
                if tails.isEmpty { continue }
                if let kept = prune(member.value, tails) { out.append(member.key, kept) }
            }
            return out.isEmpty ? nil : .object(out)
        case .array(let a):
            var out: [JSON] = []
            for (i, element) in a.enumerated() {
                let tails = paths.filter { $0.first.flatMap(JSONPointer.index) == i }.map { $0.dropFirst() }
                if tails.isEmpty { continue }
                if let kept = prune(element, tails) { out.append(kept) }
            }
            return out.isEmpty ? nil : .array(out)
        default:
            return nil
        }
    }

    private static func edit(
        _ value: inout JSON, _ path: ArraySlice<String>, _ body: (inout JSON) -> Bool
    ) -> Bool {
        guard let token = path.first else { return body(&value) }
        switch value {
        case .object(var o):
            guard let i = o.members.firstIndex(where: { $0.key == token }) else { return false }
            var child = o.members[i].value
            value = .null  // let the members be mutated in place
            let done = edit(&child, path.dropFirst(), body)
            o.members[i].value = child
            value = .object(o)
            return done
        case .array(var a):
            guard let i = JSONPointer.index(token), i < a.count else { return false }
            var child = a[i]
            value = .null
            let done = edit(&child, path.dropFirst(), body)
            a[i] = child
            value = .array(a)
            return done
        default:
            return false
        }
    }
}
