/*
 * herald_h2.h — one client HTTP/2 connection over TLS (OpenSSL 3 + nghttp2),
 * driven by the caller's event loop. Its one caller is Herald's HTTP/2 client
 * (Sources/HTTP2), which the APNs, FCM and Web Push transports all send through.
 *
 * Conventions
 * - Everything public is prefixed hh2_ / HH2_. No OpenSSL or nghttp2 type
 *   appears here: handles are opaque.
 * - Non-blocking throughout. The caller owns the event loop: it polls the
 *   connection's fd for what hh2_conn_wants() asks, then calls
 *   hh2_conn_handshake() until it returns 0, and afterwards hh2_conn_read()
 *   on readability and hh2_conn_write() on writability (and after every
 *   submit, ping or cancel).
 * - Functions return 0 (or a positive value where documented) on success and
 *   a negative HH2_ERR_* code on failure; hh2_conn_error() describes the
 *   last failure in words. After any failure other than HH2_ERR_ARGUMENT the
 *   connection is unusable: free it.
 * - Callbacks run inside hh2_conn_read() and hh2_conn_write(). They may call
 *   hh2_conn_submit(), hh2_conn_cancel() and the query functions; they must
 *   not call hh2_conn_free().
 * - Strings are NUL-terminated UTF-8 unless a length is given. Buffers passed
 *   in are copied before the call returns; buffers passed to callbacks are
 *   valid only during the callback.
 */
#ifndef HERALD_H2_H
#define HERALD_H2_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Return codes. */
#define HH2_OK 0
#define HH2_ERR_ARGUMENT -1   /* a bad argument; the connection is unchanged */
#define HH2_ERR_NOMEM -2      /* out of memory */
#define HH2_ERR_TLS -3        /* TLS handshake, certificate or record failure */
#define HH2_ERR_ALPN -4       /* the server did not select h2 */
#define HH2_ERR_EOF -5        /* the peer closed the connection */
#define HH2_ERR_IO -6         /* a socket error (reset, …) */
#define HH2_ERR_PROTOCOL -7   /* an HTTP/2 protocol error (nghttp2) */
#define HH2_ERR_STATE -8      /* the call does not fit the connection's state */
#define HH2_ERR_REFUSED -9    /* no new stream may be opened (GOAWAY, ids exhausted) */

/* hh2_conn_wants() bits, and hh2_conn_handshake() results above zero. */
#define HH2_WANT_READ 1
#define HH2_WANT_WRITE 2

/* HTTP/2 error codes the caller acts on (RFC 9113 §7). */
#define HH2_NO_ERROR 0u
#define HH2_REFUSED_STREAM 7u
#define HH2_CANCEL 8u

/* Response bodies and header blocks beyond these are cut (and flagged). */
#define HH2_MAX_RESPONSE_BODY 65536
#define HH2_MAX_RESPONSE_HEADERS 16384

typedef struct hh2_tls hh2_tls;
typedef struct hh2_conn hh2_conn;

/* One request header. Names must be lower case (HTTP/2). */
typedef struct {
    const char *name;
    const char *value;
} hh2_header;

/* A finished stream.
 * - status: the :status of the response, 0 when none arrived (reset, GOAWAY).
 * - error_code: the RST_STREAM / close code (HH2_NO_ERROR after a clean end;
 *   HH2_REFUSED_STREAM when the server refused the stream or a GOAWAY left it
 *   unprocessed, so it may be sent again).
 * - headers: the response's regular header fields as "name: value\n" lines.
 * - truncated: nonzero when the body or headers exceeded the limits above. */
typedef struct {
    int32_t stream_id;
    uint64_t token;
    int status;
    uint32_t error_code;
    const char *headers;
    size_t headers_len;
    const uint8_t *body;
    size_t body_len;
    int truncated;
} hh2_response;

typedef struct {
    /* Every SETTINGS frame from the server, with its current
     * SETTINGS_MAX_CONCURRENT_STREAMS (after applying the frame). */
    void (*on_settings)(void *ctx, uint32_t max_concurrent_streams);
    /* A GOAWAY: streams above last_stream_id were not processed. debug holds
     * the frame's opaque data (APNs puts {"reason": …} there). */
    void (*on_goaway)(void *ctx, int32_t last_stream_id, uint32_t error_code, const uint8_t *debug,
                      size_t debug_len);
    /* The acknowledgement of a PING sent with hh2_conn_ping(). */
    void (*on_ping_ack)(void *ctx);
    /* A stream closed, answered or not. Called exactly once per submitted stream. */
    void (*on_response)(void *ctx, const hh2_response *response);
} hh2_callbacks;

/* A TLS client context: TLS 1.2 or later, ALPN h2, peer verification against
 * the system trust store plus ca_file (a PEM bundle; NULL for none). NULL on
 * failure, with the reason in err. */
hh2_tls *hh2_tls_new(const char *ca_file, char *err, size_t err_len);
void hh2_tls_free(hh2_tls *tls);

/* Starts a non-blocking TCP connection to a numeric IPv4 or IPv6 address.
 * Returns the new fd (>= 0) with *in_progress set when the connect has not
 * finished yet (wait for writability, then call hh2_socket_error()), or a
 * negative errno. */
int hh2_tcp_connect(const char *address, int port, int *in_progress);

/* The pending error of a socket whose connect finished (0 when connected),
 * as an errno value. */
int hh2_socket_error(int fd);

/* A connection on a connected socket, which it owns from now on (closed by
 * hh2_conn_free). host is the name the certificate must match and the SNI;
 * when host_is_address is non-zero, host is an IP literal (the caller has
 * parsed it), matched against IP SANs, and no SNI is sent. NULL on failure,
 * with the reason in err; the fd is then closed. */
hh2_conn *hh2_conn_new(hh2_tls *tls, int fd, const char *host, int host_is_address, const hh2_callbacks *callbacks,
                       void *ctx, char *err, size_t err_len);

/* Frees the connection and closes its socket. No callback runs. */
void hh2_conn_free(hh2_conn *conn);

int hh2_conn_fd(const hh2_conn *conn);

/* Drives the TLS handshake. 0 when it is done (ALPN h2 checked, the HTTP/2
 * preface and SETTINGS queued: call hh2_conn_write next); HH2_WANT_READ or
 * HH2_WANT_WRITE while it needs the socket; a negative code on failure. */
int hh2_conn_handshake(hh2_conn *conn);

/* Reads and processes what the socket has, up to a budget of 256 KiB of
 * plaintext per call (callbacks run here): see hh2_conn_read_more(). */
int hh2_conn_read(hh2_conn *conn);

/* 1 when the last hh2_conn_read() stopped at its budget: call it again soon
 * (after the event loop's turn), whether or not the socket shows readable,
 * since what is left may sit in the TLS layer's buffer. */
int hh2_conn_read_more(const hh2_conn *conn);

/* Writes what the session has to send, as far as the socket takes it. */
int hh2_conn_write(hh2_conn *conn);

/* HH2_WANT_READ and/or HH2_WANT_WRITE; 0 when the session is over (both
 * sides are done after a GOAWAY, or the connection failed). */
int hh2_conn_wants(const hh2_conn *conn);

/* Submits a request with a body (may be empty). headers are the request's
 * fields after the pseudo-headers, which this builds from method, path and
 * authority. token comes back in the response. Returns the stream id (> 0)
 * or a negative code; HH2_ERR_REFUSED when the connection takes no new
 * streams. */
int32_t hh2_conn_submit(hh2_conn *conn, const char *method, const char *path, const char *authority,
                        const hh2_header *headers, size_t header_count, const uint8_t *body, size_t body_len,
                        uint64_t token);

/* Resets a stream (RST_STREAM CANCEL); its on_response follows with
 * error_code HH2_CANCEL unless it already finished. */
int hh2_conn_cancel(hh2_conn *conn, int32_t stream_id);

/* Sends a PING; on_ping_ack runs when it is acknowledged. */
int hh2_conn_ping(hh2_conn *conn);

/* Sends GOAWAY (NO_ERROR): the session ends once open streams finish. */
int hh2_conn_shutdown(hh2_conn *conn);

/* The server's SETTINGS_MAX_CONCURRENT_STREAMS (1 until its first SETTINGS). */
uint32_t hh2_conn_remote_max_streams(const hh2_conn *conn);

/* Nonzero while new streams may be opened (no GOAWAY either way). */
int hh2_conn_accepts_streams(const hh2_conn *conn);

/* Streams submitted and not yet finished. */
size_t hh2_conn_open_streams(const hh2_conn *conn);

/* Nonzero when the stream's request body is not all sent because HTTP/2
 * flow control holds it (the stream's or the connection's send window is
 * used up); 0 otherwise, and for an unknown stream. */
int hh2_conn_stream_blocked(const hh2_conn *conn, int32_t stream_id);

/* What a new stream could send now: the smaller of the connection's send
 * window and the server's SETTINGS_INITIAL_WINDOW_SIZE (0 or less: a
 * request body would wait for a WINDOW_UPDATE). */
int32_t hh2_conn_send_window(const hh2_conn *conn);

/* The last failure in words (empty when none). */
const char *hh2_conn_error(const hh2_conn *conn);

#ifdef __cplusplus
}
#endif

#endif /* HERALD_H2_H */
