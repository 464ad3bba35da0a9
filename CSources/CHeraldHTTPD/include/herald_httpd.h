#ifndef HERALD_HTTPD_H
#define HERALD_HTTPD_H

/* A small HTTP listener on libmicrohttpd for the metrics and health
 * endpoints: GET and HEAD only, bodies produced by a callback. libmicrohttpd
 * does the HTTP parsing; this file only adapts its variadic API. */

#include <stddef.h>
#include <stdint.h>

typedef struct hh_server hh_server;

/* Fills the answer to GET `path`: *status (200, 404, 503…), *body (malloc'd,
 * taken over and freed by the listener; may stay NULL for an empty body),
 * *body_len and *content_type (a static string). Runs on the listener's own
 * thread (one per connection); may block briefly. */
typedef void (*hh_handler)(void *context, const char *path, int *status, char **body, size_t *body_len,
                           const char **content_type);

/* Connections served at once, each on a thread of its own; past it a new
 * connection is refused. */
#define HH_MAX_CONNECTIONS 128
/* The stack of each connection's thread, in KiB. */
#define HH_THREAD_STACK_KIB 256

/* Listens on the numeric `address` (IPv4, or IPv6 without brackets) and
 * `port` (0: the kernel picks; see hh_port). With `token` (`token_len`
 * bytes, copied), /metrics answers 401 unless the request carries
 * `Authorization: Bearer <token>`; /livez and /readyz never ask. NULL on
 * failure, with the reason in `error`. */
hh_server *hh_start(const char *address, uint16_t port, const unsigned char *token, size_t token_len,
                    hh_handler handler, void *context, char *error, size_t error_len);

/* The port actually bound. */
uint16_t hh_port(const hh_server *server);

/* Stops the listener thread and closes the socket; waits for a running
 * handler to return. */
void hh_stop(hh_server *server);

#endif
