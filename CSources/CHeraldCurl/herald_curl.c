#include "herald_curl.h"

#include <sys/socket.h>

int herald_curl_global_init(void) {
    return (int)curl_global_init(CURL_GLOBAL_DEFAULT);
}

CURLcode herald_curl_easy_setopt_long(CURL *handle, CURLoption option, long value) {
    return curl_easy_setopt(handle, option, value);
}

CURLcode herald_curl_easy_setopt_off(CURL *handle, CURLoption option, long long value) {
    return curl_easy_setopt(handle, option, (curl_off_t)value);
}

CURLcode herald_curl_easy_setopt_string(CURL *handle, CURLoption option, const char *value) {
    return curl_easy_setopt(handle, option, value);
}

CURLcode herald_curl_easy_setopt_pointer(CURL *handle, CURLoption option, void *value) {
    return curl_easy_setopt(handle, option, value);
}

CURLcode herald_curl_easy_setopt_slist(CURL *handle, CURLoption option, struct curl_slist *value) {
    return curl_easy_setopt(handle, option, value);
}

CURLcode herald_curl_easy_setopt_data_cb(CURL *handle, CURLoption option, herald_curl_data_cb cb) {
    return curl_easy_setopt(handle, option, cb);
}

CURLcode herald_curl_easy_getinfo_long(CURL *handle, CURLINFO info, long *out) {
    return curl_easy_getinfo(handle, info, out);
}

CURLcode herald_curl_easy_getinfo_string(CURL *handle, CURLINFO info, const char **out) {
    char *value = NULL;
    CURLcode rc = curl_easy_getinfo(handle, info, &value);
    *out = value;
    return rc;
}

int herald_curl_drop_connection(CURL *handle) {
    curl_socket_t fd = CURL_SOCKET_BAD;
    /* CURLINFO_ACTIVESOCKET finds the transfer's last connection in the cache. */
    if (curl_easy_getinfo(handle, CURLINFO_ACTIVESOCKET, &fd) != CURLE_OK || fd == CURL_SOCKET_BAD) return 0;
    /* libcurl owns the descriptor: shut it down, never close it. Its liveness
     * check then sees the end of the stream and discards the connection. */
    return shutdown(fd, SHUT_RDWR) == 0;
}

CURLcode herald_curl_easy_getinfo_pointer(CURL *handle, CURLINFO info, void **out) {
    char *value = NULL; /* CURLINFO_PRIVATE is documented as char ** */
    CURLcode rc = curl_easy_getinfo(handle, info, &value);
    *out = value;
    return rc;
}

CURLMcode herald_curl_multi_setopt_long(CURLM *multi, CURLMoption option, long value) {
    return curl_multi_setopt(multi, option, value);
}

long herald_curl_pipe_multiplex(void) { return CURLPIPE_MULTIPLEX; }
long herald_curl_http_version_2tls(void) { return CURL_HTTP_VERSION_2TLS; }
long herald_curl_error_size(void) { return CURL_ERROR_SIZE; }
