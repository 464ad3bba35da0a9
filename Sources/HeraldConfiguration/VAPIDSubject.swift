/// The one check of a VAPID subject (the JWT's `sub`, RFC 8292 §2.1): the
/// configuration applies it when it loads and `herald vapid token` to its
/// `--sub`; the crypto core writes the subject it is given without checking.
public enum VAPIDSubject {
    /// True for a `mailto:` address with a local part and a domain, or an
    /// `https:` URL with a host; never with whitespace or control characters.
    public static func isValid(_ text: String) -> Bool {
        guard !text.contains(where: \.isWhitespace), !ConfigValue.hasControl(text) else { return false }
        if text.hasPrefix("mailto:") {
            let address = text.dropFirst(7)
            guard !address.hasPrefix("mailto:"), let at = address.firstIndex(of: "@") else { return false }
            return at != address.startIndex && address.index(after: at) != address.endIndex
        }
        if text.hasPrefix("https://") {
            guard let first = text.dropFirst(8).first else { return false }
            return first != "/" && first != ":" && first != "@"
        }
        return false
    }
}
