/// A C object shared between threads that only read it: its pointer is set
/// at init and never changes, every call made on it reads it, and `free`
/// runs once, when the last owner lets it go.
///
/// The crypto core's keys and secrets (`P256PrivateKey`, `SecretBytes`,
/// `FCMServiceAccount`, `WebPushSubscriber`) and the HTTP/2 client's
/// `SSL_CTX` each keep theirs in one, and so are checked `Sendable`
/// themselves: this is the one place that vouches for them.
// @unchecked: immutable after init; OpenSSL 3 allows concurrent reads of a key (and of an SSL_CTX once set up), and what the core holds here it only reads.
public final class SharedHandle: @unchecked Sendable {
    public let pointer: OpaquePointer
    private let free: (OpaquePointer) -> Void

    /// Takes `pointer`, set up and never written again; `free` releases it.
    public init(_ pointer: OpaquePointer, free: @escaping (OpaquePointer) -> Void) {
        self.pointer = pointer
        self.free = free
    }

    deinit { free(pointer) }
}
