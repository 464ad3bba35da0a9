/*
 * h2.c — a client HTTP/2 connection over TLS for Herald's HTTP/2 client
 * (Sources/HTTP2), through which the APNs, FCM and Web Push transports all
 * send (FCM and Web Push fall back to libcurl for an HTTP/1.1-only origin).
 * OpenSSL 3 for TLS (ALPN h2, verification, SNI), nghttp2 for framing; the
 * caller's event loop drives both through the functions in herald_h2.h.
 */
#define _GNU_SOURCE
#include "herald_h2.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nghttp2/nghttp2.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#define HH2_READ_CHUNK 16384
/* Plaintext one hh2_conn_read() call takes at most: a peer that never stops
 * sending (a flood of frames) gets its turn, and the event loop serves every
 * other connection between two. */
#define HH2_READ_BUDGET (16 * HH2_READ_CHUNK)
#define HH2_WRITE_BATCH 65536
#define HH2_ERROR_TEXT 256

struct hh2_tls {
    SSL_CTX *ctx;
};

/* One submitted request and the response being gathered. */
typedef struct hh2_stream {
    struct hh2_stream *prev, *next;
    int32_t id;
    uint64_t token;
    uint8_t *req_body;
    size_t req_len, req_off;
    int status;
    char *headers;
    size_t headers_len, headers_cap;
    uint8_t *body;
    size_t body_len, body_cap;
    int truncated;
} hh2_stream;

enum hh2_state { HH2_HANDSHAKE, HH2_OPEN, HH2_FAILED };

struct hh2_conn {
    int fd;
    SSL *ssl;
    nghttp2_session *session;
    enum hh2_state state;
    hh2_callbacks cb;
    void *ctx;
    hh2_stream *streams; /* every stream not yet reported */
    size_t open_streams;
    uint8_t *out;        /* bytes taken from nghttp2, not yet accepted by SSL_write */
    size_t out_len, out_off, out_cap;
    int read_wants_write; /* SSL_read asked for writability (TLS-level) */
    int read_more;        /* the last read stopped at its budget: more may be waiting */
    int peer_goaway;
    char error[HH2_ERROR_TEXT];
};

/* ---------------------------------------------------------------- errors */

static void set_error(char *buf, size_t len, const char *fmt, ...) {
    if (!buf || len == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, len, fmt, ap);
    va_end(ap);
}

/* Appends the first queued OpenSSL error (if any) and clears the queue. */
static void append_openssl_error(char *buf, size_t len) {
    unsigned long e = ERR_get_error();
    if (e != 0 && buf && len > 0) {
        size_t used = strlen(buf);
        if (used + 3 < len) {
            char text[160];
            ERR_error_string_n(e, text, sizeof text);
            snprintf(buf + used, len - used, ": %s", text);
        }
    }
    ERR_clear_error();
}

static int fail(hh2_conn *c, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->error, sizeof c->error, fmt, ap);
    va_end(ap);
    c->state = HH2_FAILED;
    return code;
}

/* ---------------------------------------------------------------- TLS context */

hh2_tls *hh2_tls_new(const char *ca_file, char *err, size_t err_len) {
    hh2_tls *tls = calloc(1, sizeof *tls);
    if (!tls) {
        set_error(err, err_len, "out of memory");
        return NULL;
    }
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) {
        set_error(err, err_len, "SSL_CTX_new failed");
        append_openssl_error(err, err_len);
        goto fail;
    }
    tls->ctx = ctx;
    if (SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) != 1) {
        set_error(err, err_len, "cannot require TLS 1.2");
        append_openssl_error(err, err_len);
        goto fail;
    }
    SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                              SSL_MODE_RELEASE_BUFFERS);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
        ERR_clear_error(); /* no system store is not fatal when ca_file is given */
    }
    if (ca_file && ca_file[0]) {
        if (SSL_CTX_load_verify_locations(ctx, ca_file, NULL) != 1) {
            set_error(err, err_len, "cannot load CA file %s", ca_file);
            append_openssl_error(err, err_len);
            goto fail;
        }
    }
    static const unsigned char alpn[] = {2, 'h', '2'};
    if (SSL_CTX_set_alpn_protos(ctx, alpn, sizeof alpn) != 0) {
        set_error(err, err_len, "cannot set ALPN");
        append_openssl_error(err, err_len);
        goto fail;
    }
    return tls;
fail:
    hh2_tls_free(tls);
    return NULL;
}

void hh2_tls_free(hh2_tls *tls) {
    if (!tls) return;
    SSL_CTX_free(tls->ctx);
    free(tls);
}

/* ---------------------------------------------------------------- sockets */

int hh2_tcp_connect(const char *address, int port, int *in_progress) {
    if (!address || !in_progress || port <= 0 || port > 65535) return -EINVAL;
    *in_progress = 0;
    struct sockaddr_storage ss;
    socklen_t len;
    memset(&ss, 0, sizeof ss);
    struct sockaddr_in *v4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&ss;
    /* The caller passes an address it has already read (HeraldNet); inet_pton
     * only turns the text into a sockaddr. */
    if (inet_pton(AF_INET, address, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)port);
        len = sizeof *v4;
    } else if (inet_pton(AF_INET6, address, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)port);
        len = sizeof *v6;
    } else {
        return -EINVAL;
    }
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -errno;
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    (void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    int rc;
    do {
        rc = connect(fd, (struct sockaddr *)&ss, len);
    } while (rc != 0 && errno == EINTR);
    if (rc == 0) return fd;
    if (errno == EINPROGRESS) {
        *in_progress = 1;
        return fd;
    }
    int e = errno;
    close(fd);
    return -e;
}

int hh2_socket_error(int fd) {
    int value = 0;
    socklen_t len = sizeof value;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &value, &len) != 0) return errno;
    return value;
}

/* ---------------------------------------------------------------- streams */

static void stream_unlink(hh2_conn *c, hh2_stream *s) {
    if (s->prev) s->prev->next = s->next;
    else c->streams = s->next;
    if (s->next) s->next->prev = s->prev;
    s->prev = s->next = NULL;
}

static void stream_free(hh2_stream *s) {
    if (!s) return;
    free(s->req_body);
    free(s->headers);
    free(s->body);
    free(s);
}

/* Appends to a growable buffer up to limit bytes; returns 0, or 1 when cut. */
static int append_capped(uint8_t **buf, size_t *len, size_t *cap, const uint8_t *data, size_t n, size_t limit) {
    int cut = 0;
    if (*len + n > limit) {
        n = limit > *len ? limit - *len : 0;
        cut = 1;
    }
    if (n == 0) return cut;
    if (*len + n > *cap) {
        size_t want = *cap ? *cap : 256;
        while (want < *len + n) want *= 2;
        if (want > limit) want = limit;
        uint8_t *grown = realloc(*buf, want);
        if (!grown) return 1;
        *buf = grown;
        *cap = want;
    }
    memcpy(*buf + *len, data, n);
    *len += n;
    return cut;
}

/* ---------------------------------------------------------------- nghttp2 callbacks */

static int on_begin_headers(nghttp2_session *session, const nghttp2_frame *frame, void *user_data) {
    (void)session;
    (void)frame;
    (void)user_data;
    return 0;
}

static int on_header(nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
                     const uint8_t *value, size_t valuelen, uint8_t flags, void *user_data) {
    (void)flags;
    (void)user_data;
    if (frame->hd.type != NGHTTP2_HEADERS) return 0;
    hh2_stream *s = nghttp2_session_get_stream_user_data(session, frame->hd.stream_id);
    if (!s) return 0;
    if (namelen == 7 && memcmp(name, ":status", 7) == 0) {
        int status = 0;
        for (size_t i = 0; i < valuelen && i < 3; i++) {
            if (value[i] < '0' || value[i] > '9') return 0;
            status = status * 10 + (value[i] - '0');
        }
        if (status >= 200 || s->status == 0) s->status = status; /* a final status replaces 1xx */
        return 0;
    }
    if (namelen > 0 && name[0] == ':') return 0;
    int cut = 0;
    cut |= append_capped((uint8_t **)&s->headers, &s->headers_len, &s->headers_cap, name, namelen,
                         HH2_MAX_RESPONSE_HEADERS);
    cut |= append_capped((uint8_t **)&s->headers, &s->headers_len, &s->headers_cap, (const uint8_t *)": ", 2,
                         HH2_MAX_RESPONSE_HEADERS);
    cut |= append_capped((uint8_t **)&s->headers, &s->headers_len, &s->headers_cap, value, valuelen,
                         HH2_MAX_RESPONSE_HEADERS);
    cut |= append_capped((uint8_t **)&s->headers, &s->headers_len, &s->headers_cap, (const uint8_t *)"\n", 1,
                         HH2_MAX_RESPONSE_HEADERS);
    if (cut) s->truncated = 1;
    return 0;
}

static int on_data_chunk(nghttp2_session *session, uint8_t flags, int32_t stream_id, const uint8_t *data,
                         size_t len, void *user_data) {
    (void)flags;
    (void)user_data;
    hh2_stream *s = nghttp2_session_get_stream_user_data(session, stream_id);
    if (!s) return 0;
    if (append_capped(&s->body, &s->body_len, &s->body_cap, data, len, HH2_MAX_RESPONSE_BODY)) s->truncated = 1;
    return 0;
}

static int on_stream_close(nghttp2_session *session, int32_t stream_id, uint32_t error_code, void *user_data) {
    hh2_conn *c = user_data;
    hh2_stream *s = nghttp2_session_get_stream_user_data(session, stream_id);
    if (!s) return 0;
    (void)nghttp2_session_set_stream_user_data(session, stream_id, NULL);
    stream_unlink(c, s);
    if (c->open_streams > 0) c->open_streams--;
    hh2_response r;
    memset(&r, 0, sizeof r);
    r.stream_id = stream_id;
    r.token = s->token;
    r.status = s->status;
    r.error_code = error_code;
    r.headers = s->headers ? s->headers : "";
    r.headers_len = s->headers_len;
    r.body = s->body;
    r.body_len = s->body_len;
    r.truncated = s->truncated;
    if (c->cb.on_response) c->cb.on_response(c->ctx, &r);
    stream_free(s);
    return 0;
}

static int on_frame_recv(nghttp2_session *session, const nghttp2_frame *frame, void *user_data) {
    hh2_conn *c = user_data;
    switch (frame->hd.type) {
    case NGHTTP2_SETTINGS:
        if (!(frame->hd.flags & NGHTTP2_FLAG_ACK) && c->cb.on_settings) {
            c->cb.on_settings(c->ctx,
                              nghttp2_session_get_remote_settings(session, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS));
        }
        break;
    case NGHTTP2_GOAWAY:
        c->peer_goaway = 1;
        if (c->cb.on_goaway) {
            c->cb.on_goaway(c->ctx, frame->goaway.last_stream_id, frame->goaway.error_code,
                            frame->goaway.opaque_data, frame->goaway.opaque_data_len);
        }
        break;
    case NGHTTP2_PING:
        if ((frame->hd.flags & NGHTTP2_FLAG_ACK) && c->cb.on_ping_ack) c->cb.on_ping_ack(c->ctx);
        break;
    default:
        break;
    }
    return 0;
}

static ssize_t read_body(nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
                         uint32_t *data_flags, nghttp2_data_source *source, void *user_data) {
    (void)session;
    (void)stream_id;
    (void)user_data;
    hh2_stream *s = source->ptr;
    size_t left = s->req_len - s->req_off;
    size_t n = left < length ? left : length;
    if (n) memcpy(buf, s->req_body + s->req_off, n);
    s->req_off += n;
    if (s->req_off == s->req_len) *data_flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

/* ---------------------------------------------------------------- connection */

hh2_conn *hh2_conn_new(hh2_tls *tls, int fd, const char *host, int host_is_address, const hh2_callbacks *callbacks,
                       void *ctx, char *err, size_t err_len) {
    if (!tls || fd < 0 || !host || !host[0] || !callbacks) {
        set_error(err, err_len, "bad arguments");
        if (fd >= 0) close(fd);
        return NULL;
    }
    hh2_conn *c = calloc(1, sizeof *c);
    if (!c) {
        set_error(err, err_len, "out of memory");
        close(fd);
        return NULL;
    }
    c->fd = fd;
    c->cb = *callbacks;
    c->ctx = ctx;
    c->state = HH2_HANDSHAKE;
    c->ssl = SSL_new(tls->ctx);
    if (!c->ssl || SSL_set_fd(c->ssl, fd) != 1) {
        set_error(err, err_len, "SSL_new failed");
        append_openssl_error(err, err_len);
        goto fail;
    }
    SSL_set_connect_state(c->ssl);
    /* Whether host is an IP literal is decided on the Swift side (HeraldNet), the
     * one place that reads addresses; OpenSSL parses the text again here. */
    if (host_is_address) {
        if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(c->ssl), host) != 1) {
            set_error(err, err_len, "cannot check the certificate against %s", host);
            append_openssl_error(err, err_len);
            goto fail;
        }
    } else {
        if (SSL_set_tlsext_host_name(c->ssl, host) != 1 || SSL_set1_host(c->ssl, host) != 1) {
            set_error(err, err_len, "cannot set the server name %s", host);
            append_openssl_error(err, err_len);
            goto fail;
        }
    }
    return c;
fail:
    hh2_conn_free(c);
    return NULL;
}

void hh2_conn_free(hh2_conn *c) {
    if (!c) return;
    if (c->session) nghttp2_session_del(c->session); /* runs no callbacks */
    hh2_stream *s = c->streams;
    while (s) {
        hh2_stream *next = s->next;
        stream_free(s);
        s = next;
    }
    if (c->ssl) SSL_free(c->ssl);
    if (c->fd >= 0) close(c->fd);
    free(c->out);
    free(c);
}

int hh2_conn_fd(const hh2_conn *c) { return c ? c->fd : -1; }

const char *hh2_conn_error(const hh2_conn *c) { return c ? c->error : ""; }

/* Describes why a TLS call failed, certificate verification first. */
static int tls_failure(hh2_conn *c, const char *during, int ssl_error) {
    long verify = SSL_get_verify_result(c->ssl);
    if (verify != X509_V_OK) {
        ERR_clear_error();
        return fail(c, HH2_ERR_TLS, "%s: certificate verification failed: %s", during,
                    X509_verify_cert_error_string(verify));
    }
    if (ssl_error == SSL_ERROR_SYSCALL) {
        int e = errno;
        ERR_clear_error();
        if (e == 0) return fail(c, HH2_ERR_EOF, "%s: connection closed by peer", during);
        return fail(c, HH2_ERR_IO, "%s: %s", during, strerror(e));
    }
    if (ssl_error == SSL_ERROR_ZERO_RETURN) {
        ERR_clear_error();
        return fail(c, HH2_ERR_EOF, "%s: connection closed by peer", during);
    }
    snprintf(c->error, sizeof c->error, "%s: TLS error %d", during, ssl_error);
    append_openssl_error(c->error, sizeof c->error);
    c->state = HH2_FAILED;
    return HH2_ERR_TLS;
}

static int start_session(hh2_conn *c) {
    nghttp2_session_callbacks *cbs = NULL;
    nghttp2_option *opt = NULL;
    int rv = HH2_OK;
    if (nghttp2_session_callbacks_new(&cbs) != 0 || nghttp2_option_new(&opt) != 0) {
        rv = fail(c, HH2_ERR_NOMEM, "out of memory");
        goto out;
    }
    nghttp2_session_callbacks_set_on_begin_headers_callback(cbs, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cbs, on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data_chunk);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, on_stream_close);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, on_frame_recv);
    /* Until the server's SETTINGS arrive, assume the strictest limit (APNs
     * starts token-auth connections at one stream). */
    nghttp2_option_set_peer_max_concurrent_streams(opt, 1);
    if (nghttp2_session_client_new2(&c->session, cbs, c, opt) != 0) {
        rv = fail(c, HH2_ERR_NOMEM, "cannot create the HTTP/2 session");
        goto out;
    }
    nghttp2_settings_entry settings[] = {
        {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, 0}, /* the server may not open streams */
    };
    if (nghttp2_submit_settings(c->session, NGHTTP2_FLAG_NONE, settings, sizeof settings / sizeof settings[0]) != 0) {
        rv = fail(c, HH2_ERR_PROTOCOL, "cannot queue SETTINGS");
        goto out;
    }
    c->state = HH2_OPEN;
out:
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cbs);
    return rv;
}

int hh2_conn_handshake(hh2_conn *c) {
    if (!c) return HH2_ERR_ARGUMENT;
    if (c->state == HH2_OPEN) return HH2_OK;
    if (c->state != HH2_HANDSHAKE) return HH2_ERR_STATE;
    ERR_clear_error();
    int rc = SSL_connect(c->ssl);
    if (rc != 1) {
        int e = SSL_get_error(c->ssl, rc);
        if (e == SSL_ERROR_WANT_READ) return HH2_WANT_READ;
        if (e == SSL_ERROR_WANT_WRITE) return HH2_WANT_WRITE;
        return tls_failure(c, "TLS handshake", e);
    }
    const unsigned char *proto = NULL;
    unsigned int proto_len = 0;
    SSL_get0_alpn_selected(c->ssl, &proto, &proto_len);
    if (proto_len != 2 || memcmp(proto, "h2", 2) != 0) {
        return fail(c, HH2_ERR_ALPN, "the server did not select HTTP/2 (ALPN h2)");
    }
    return start_session(c);
}

int hh2_conn_read(hh2_conn *c) {
    if (!c) return HH2_ERR_ARGUMENT;
    if (c->state != HH2_OPEN) return HH2_ERR_STATE;
    uint8_t buf[HH2_READ_CHUNK];
    c->read_wants_write = 0;
    c->read_more = 0;
    size_t taken = 0;
    for (;;) {
        if (taken >= HH2_READ_BUDGET) {
            /* Some may be in OpenSSL's buffer, where the socket's readiness
             * does not show it: the caller reads again, after a turn. */
            c->read_more = 1;
            return HH2_OK;
        }
        ERR_clear_error();
        int n = SSL_read(c->ssl, buf, sizeof buf);
        if (n > 0) {
            ssize_t used = nghttp2_session_mem_recv(c->session, buf, (size_t)n);
            if (used < 0) return fail(c, HH2_ERR_PROTOCOL, "HTTP/2: %s", nghttp2_strerror((int)used));
            if (c->state != HH2_OPEN) return HH2_ERR_STATE;
            taken += (size_t)n;
            continue;
        }
        int e = SSL_get_error(c->ssl, n);
        if (e == SSL_ERROR_WANT_READ) return HH2_OK;
        if (e == SSL_ERROR_WANT_WRITE) {
            c->read_wants_write = 1;
            return HH2_OK;
        }
        return tls_failure(c, "read", e);
    }
}

/* Moves frames from nghttp2 into the output buffer, up to a batch. */
static int fill_output(hh2_conn *c) {
    if (c->out_off == c->out_len) c->out_off = c->out_len = 0;
    while (c->out_len < HH2_WRITE_BATCH) {
        const uint8_t *data = NULL;
        ssize_t n = nghttp2_session_mem_send(c->session, &data);
        if (n < 0) return fail(c, HH2_ERR_PROTOCOL, "HTTP/2: %s", nghttp2_strerror((int)n));
        if (n == 0) break;
        if (c->out_len + (size_t)n > c->out_cap) {
            size_t want = c->out_cap ? c->out_cap : 16384;
            while (want < c->out_len + (size_t)n) want *= 2;
            uint8_t *grown = realloc(c->out, want);
            if (!grown) return fail(c, HH2_ERR_NOMEM, "out of memory");
            c->out = grown;
            c->out_cap = want;
        }
        memcpy(c->out + c->out_len, data, (size_t)n);
        c->out_len += (size_t)n;
    }
    return HH2_OK;
}

int hh2_conn_write(hh2_conn *c) {
    if (!c) return HH2_ERR_ARGUMENT;
    if (c->state != HH2_OPEN) return HH2_ERR_STATE;
    for (;;) {
        if (c->out_off == c->out_len) {
            int rv = fill_output(c);
            if (rv != HH2_OK) return rv;
            if (c->out_len == 0) return HH2_OK;
        }
        ERR_clear_error();
        int n = SSL_write(c->ssl, c->out + c->out_off, (int)(c->out_len - c->out_off));
        if (n > 0) {
            c->out_off += (size_t)n;
            continue;
        }
        int e = SSL_get_error(c->ssl, n);
        if (e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ) return HH2_OK;
        return tls_failure(c, "write", e);
    }
}

int hh2_conn_read_more(const hh2_conn *c) { return c && c->read_more; }

int hh2_conn_wants(const hh2_conn *c) {
    if (!c || c->state == HH2_FAILED) return 0;
    if (c->state == HH2_HANDSHAKE) return HH2_WANT_READ;
    int pending_out = c->out_off < c->out_len;
    int want_read = nghttp2_session_want_read(c->session);
    int want_write = nghttp2_session_want_write(c->session) || pending_out || c->read_wants_write;
    if (!want_read && !want_write) return 0;
    /* Always read while open: TLS records (alerts, key updates) may arrive. */
    return HH2_WANT_READ | (want_write ? HH2_WANT_WRITE : 0);
}

int32_t hh2_conn_submit(hh2_conn *c, const char *method, const char *path, const char *authority,
                        const hh2_header *headers, size_t header_count, const uint8_t *body, size_t body_len,
                        uint64_t token) {
    if (!c || !method || !path || !authority || (header_count && !headers) || (body_len && !body)) {
        return HH2_ERR_ARGUMENT;
    }
    if (c->state != HH2_OPEN) return HH2_ERR_STATE;
    if (c->peer_goaway || !nghttp2_session_check_request_allowed(c->session)) return HH2_ERR_REFUSED;
    size_t count = 4 + header_count;
    nghttp2_nv *nva = calloc(count, sizeof *nva);
    hh2_stream *s = calloc(1, sizeof *s);
    int32_t rv;
    if (!nva || !s) {
        rv = HH2_ERR_NOMEM;
        goto out;
    }
    if (body_len) {
        s->req_body = malloc(body_len);
        if (!s->req_body) {
            rv = HH2_ERR_NOMEM;
            goto out;
        }
        memcpy(s->req_body, body, body_len);
    }
    s->req_len = body_len;
    s->token = token;
    const char *names[4] = {":method", ":scheme", ":path", ":authority"};
    const char *values[4] = {method, "https", path, authority};
    for (size_t i = 0; i < 4; i++) {
        nva[i].name = (uint8_t *)names[i];
        nva[i].namelen = strlen(names[i]);
        nva[i].value = (uint8_t *)values[i];
        nva[i].valuelen = strlen(values[i]);
        nva[i].flags = NGHTTP2_NV_FLAG_NONE;
    }
    for (size_t i = 0; i < header_count; i++) {
        if (!headers[i].name || !headers[i].value) {
            rv = HH2_ERR_ARGUMENT;
            goto out;
        }
        nva[4 + i].name = (uint8_t *)headers[i].name;
        nva[4 + i].namelen = strlen(headers[i].name);
        nva[4 + i].value = (uint8_t *)headers[i].value;
        nva[4 + i].valuelen = strlen(headers[i].value);
        nva[4 + i].flags = NGHTTP2_NV_FLAG_NONE;
    }
    nghttp2_data_provider provider;
    provider.source.ptr = s;
    provider.read_callback = read_body;
    rv = nghttp2_submit_request(c->session, NULL, nva, count, &provider, s);
    if (rv < 0) {
        if (rv == NGHTTP2_ERR_STREAM_ID_NOT_AVAILABLE) {
            rv = HH2_ERR_REFUSED;
        } else if (rv == NGHTTP2_ERR_NOMEM) {
            rv = HH2_ERR_NOMEM;
        } else {
            snprintf(c->error, sizeof c->error, "HTTP/2: %s", nghttp2_strerror(rv));
            rv = HH2_ERR_ARGUMENT;
        }
        goto out;
    }
    s->id = rv;
    s->next = c->streams;
    if (c->streams) c->streams->prev = s;
    c->streams = s;
    c->open_streams++;
    s = NULL; /* owned by the connection now */
out:
    free(nva);
    stream_free(s);
    return rv;
}

int hh2_conn_cancel(hh2_conn *c, int32_t stream_id) {
    if (!c || stream_id <= 0) return HH2_ERR_ARGUMENT;
    if (c->state != HH2_OPEN) return HH2_ERR_STATE;
    int rv = nghttp2_submit_rst_stream(c->session, NGHTTP2_FLAG_NONE, stream_id, NGHTTP2_CANCEL);
    return rv == 0 ? HH2_OK : HH2_ERR_ARGUMENT;
}

int hh2_conn_ping(hh2_conn *c) {
    if (!c) return HH2_ERR_ARGUMENT;
    if (c->state != HH2_OPEN) return HH2_ERR_STATE;
    return nghttp2_submit_ping(c->session, NGHTTP2_FLAG_NONE, NULL) == 0 ? HH2_OK : HH2_ERR_NOMEM;
}

int hh2_conn_shutdown(hh2_conn *c) {
    if (!c) return HH2_ERR_ARGUMENT;
    if (c->state != HH2_OPEN) return HH2_ERR_STATE;
    int rv = nghttp2_submit_goaway(c->session, NGHTTP2_FLAG_NONE,
                                   nghttp2_session_get_last_proc_stream_id(c->session), NGHTTP2_NO_ERROR, NULL, 0);
    return rv == 0 ? HH2_OK : HH2_ERR_PROTOCOL;
}

uint32_t hh2_conn_remote_max_streams(const hh2_conn *c) {
    if (!c || !c->session) return 1;
    return nghttp2_session_get_remote_settings(c->session, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS);
}

int hh2_conn_accepts_streams(const hh2_conn *c) {
    if (!c || c->state != HH2_OPEN || c->peer_goaway) return 0;
    return nghttp2_session_check_request_allowed(c->session) != 0;
}

size_t hh2_conn_open_streams(const hh2_conn *c) { return c ? c->open_streams : 0; }

int hh2_conn_stream_blocked(const hh2_conn *c, int32_t stream_id) {
    if (!c || !c->session || c->state != HH2_OPEN || stream_id <= 0) return 0;
    for (const hh2_stream *s = c->streams; s; s = s->next) {
        if (s->id != stream_id) continue;
        if (s->req_off >= s->req_len) return 0;
        return nghttp2_session_get_stream_remote_window_size(c->session, stream_id) <= 0 ||
               nghttp2_session_get_remote_window_size(c->session) <= 0;
    }
    return 0;
}

int32_t hh2_conn_send_window(const hh2_conn *c) {
    if (!c || !c->session || c->state != HH2_OPEN) return 0;
    int32_t window = nghttp2_session_get_remote_window_size(c->session);
    uint32_t initial = nghttp2_session_get_remote_settings(c->session, NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE);
    if (initial < (uint32_t)INT32_MAX && (int32_t)initial < window) window = (int32_t)initial;
    return window;
}
