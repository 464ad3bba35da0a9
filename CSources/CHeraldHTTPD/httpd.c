#include "herald_httpd.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

struct hh_server {
    struct MHD_Daemon *daemon;
    hh_handler handler;
    void *context;
    uint16_t port;
    /* The bearer token /metrics requires (NULL: none), wiped at stop. */
    unsigned char *token;
    size_t token_len;
};

/* Whether the request carries `Authorization: Bearer <token>`; the token is
 * compared in time that does not depend on where it differs. */
static int authorized(const hh_server *server, struct MHD_Connection *connection) {
    if (server->token == NULL) return 1;
    const char *header = MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    static const char scheme[] = "Bearer ";
    if (header == NULL || strncasecmp(header, scheme, sizeof scheme - 1) != 0) return 0;
    const unsigned char *given = (const unsigned char *)header + sizeof scheme - 1;
    size_t given_len = strlen((const char *)given);
    unsigned char diff = given_len == server->token_len ? 0 : 1;
    for (size_t i = 0; i < server->token_len; i++) {
        diff |= server->token[i] ^ (i < given_len ? given[i] : 0);
    }
    return diff == 0;
}

static void wipe_token(hh_server *server) {
    if (server->token == NULL) return;
    explicit_bzero(server->token, server->token_len);
    free(server->token);
    server->token = NULL;
}

static enum MHD_Result queue(struct MHD_Connection *connection, unsigned int status, char *body, size_t len,
                             const char *content_type, int is_head) {
    struct MHD_Response *response;
    if (body == NULL || is_head) {
        free(body);
        response = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    } else {
        response = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    }
    if (response == NULL) return MHD_NO;
    if (content_type != NULL) MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    MHD_add_response_header(response, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    enum MHD_Result r = MHD_queue_response(connection, status, response);
    MHD_destroy_response(response);
    return r;
}

/* A refusal with a fixed text and one header of its own (405's Allow, 401's
 * WWW-Authenticate). */
static enum MHD_Result refuse(struct MHD_Connection *connection, unsigned int status, const char *text,
                              const char *header, const char *value) {
    struct MHD_Response *response =
        MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
    if (response == NULL) return MHD_NO;
    MHD_add_response_header(response, header, value);
    MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    enum MHD_Result r = MHD_queue_response(connection, status, response);
    MHD_destroy_response(response);
    return r;
}

static enum MHD_Result answer(void *cls, struct MHD_Connection *connection, const char *url, const char *method,
                              const char *version, const char *upload_data, size_t *upload_data_size,
                              void **request_state) {
    (void)version;
    (void)upload_data;
    hh_server *server = cls;
    int is_get = strcmp(method, MHD_HTTP_METHOD_GET) == 0;
    int is_head = strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
    if (*request_state == NULL) {
        /* First call: headers only. Answer on the second, after any body. */
        *request_state = server;
        return MHD_YES;
    }
    if (*upload_data_size != 0) {
        *upload_data_size = 0; /* a body is read and ignored */
        return MHD_YES;
    }
    if (!is_get && !is_head) {
        return refuse(connection, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed\n", MHD_HTTP_HEADER_ALLOW,
                      "GET, HEAD");
    }
    if (strcmp(url, "/metrics") == 0 && !authorized(server, connection)) {
        return refuse(connection, MHD_HTTP_UNAUTHORIZED, "a bearer token is required: Authorization: Bearer <token>\n",
                      MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"herald\"");
    }
    int status = 500;
    char *body = NULL;
    size_t len = 0;
    const char *content_type = "text/plain; charset=utf-8";
    server->handler(server->context, url, &status, &body, &len, &content_type);
    return queue(connection, (unsigned int)status, body, len, content_type, is_head);
}

hh_server *hh_start(const char *address, uint16_t port, const unsigned char *token, size_t token_len,
                    hh_handler handler, void *context, char *error, size_t error_len) {
    struct sockaddr_storage storage;
    memset(&storage, 0, sizeof storage);
    /* A thread per connection: a /metrics answer waits for the daemon's
     * loop, and must not hold up a /livez probe on another connection. */
    unsigned int flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL;
    if (strchr(address, ':') != NULL) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&storage;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons(port);
        if (inet_pton(AF_INET6, address, &a->sin6_addr) != 1) {
            snprintf(error, error_len, "not an IPv6 address: %s", address);
            return NULL;
        }
        flags |= MHD_USE_IPv6;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&storage;
        a->sin_family = AF_INET;
        a->sin_port = htons(port);
        if (inet_pton(AF_INET, address, &a->sin_addr) != 1) {
            snprintf(error, error_len, "not an IPv4 address: %s", address);
            return NULL;
        }
    }
    hh_server *server = calloc(1, sizeof *server);
    if (server == NULL) {
        snprintf(error, error_len, "out of memory");
        return NULL;
    }
    server->handler = handler;
    server->context = context;
    if (token != NULL && token_len > 0) {
        server->token = malloc(token_len);
        if (server->token == NULL) {
            snprintf(error, error_len, "out of memory");
            free(server);
            return NULL;
        }
        memcpy(server->token, token, token_len);
        server->token_len = token_len;
    }
    errno = 0;
    /* HH_MAX_CONNECTIONS threads at most, each with a small stack; no limit
     * per address: scrapers and probes often share one (a Prometheus and a
     * kubelet on one host), and a probe must not be refused for them. */
    server->daemon = MHD_start_daemon(
        flags, port, NULL, NULL, answer, server, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&storage,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned int)HH_MAX_CONNECTIONS, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)10,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024), MHD_OPTION_THREAD_STACK_SIZE,
        (size_t)(HH_THREAD_STACK_KIB * 1024), MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned int)256, MHD_OPTION_END);
    if (server->daemon == NULL) {
        int e = errno;
        snprintf(error, error_len, "cannot listen on %s port %u: %s", address, (unsigned)port,
                 e ? strerror(e) : "libmicrohttpd refused to start");
        wipe_token(server);
        free(server);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(server->daemon, MHD_DAEMON_INFO_BIND_PORT);
    server->port = info != NULL ? info->port : port;
    return server;
}

uint16_t hh_port(const hh_server *server) { return server->port; }

void hh_stop(hh_server *server) {
    if (server == NULL) return;
    MHD_stop_daemon(server->daemon);
    wipe_token(server);
    free(server);
}
