/*
 * herald_curl.h — thin, non-variadic wrappers over libcurl for Swift.
 *
 * Swift cannot call C variadic functions (curl_easy_setopt, curl_easy_getinfo,
 * curl_multi_setopt), so each argument type gets its own typed wrapper here.
 * No logic lives in this shim; all policy is in the Swift HTTPClient module.
 */
#ifndef HERALD_CURL_H
#define HERALD_CURL_H

#include <curl/curl.h>
#include <stddef.h>

/* Write/header callback signature (CURLOPT_WRITEFUNCTION / CURLOPT_HEADERFUNCTION). */
typedef size_t (*herald_curl_data_cb)(char *ptr, size_t size, size_t nmemb, void *userdata);

/* curl_global_init(CURL_GLOBAL_DEFAULT). Returns the CURLcode as int. */
int herald_curl_global_init(void);

CURLcode herald_curl_easy_setopt_long(CURL *handle, CURLoption option, long value);
CURLcode herald_curl_easy_setopt_off(CURL *handle, CURLoption option, long long value);
CURLcode herald_curl_easy_setopt_string(CURL *handle, CURLoption option, const char *value);
CURLcode herald_curl_easy_setopt_pointer(CURL *handle, CURLoption option, void *value);
CURLcode herald_curl_easy_setopt_slist(CURL *handle, CURLoption option, struct curl_slist *value);
CURLcode herald_curl_easy_setopt_data_cb(CURL *handle, CURLoption option, herald_curl_data_cb cb);

CURLcode herald_curl_easy_getinfo_long(CURL *handle, CURLINFO info, long *out);
CURLcode herald_curl_easy_getinfo_string(CURL *handle, CURLINFO info, const char **out);
CURLcode herald_curl_easy_getinfo_pointer(CURL *handle, CURLINFO info, void **out);

/* After a transfer that passed its timeout: shuts down the
 * socket of the connection it used, if libcurl still keeps that connection for
 * reuse (a multiplexed connection survives a timed-out stream), so that no
 * later transfer is sent into a connection that stopped answering. Returns 1
 * when a socket was shut down, 0 otherwise. */
int herald_curl_drop_connection(CURL *handle);

CURLMcode herald_curl_multi_setopt_long(CURLM *multi, CURLMoption option, long value);

/* Integer macros / enum values that are awkward to reach from Swift. */
long herald_curl_pipe_multiplex(void);       /* CURLPIPE_MULTIPLEX */
long herald_curl_http_version_2tls(void);    /* CURL_HTTP_VERSION_2TLS */
long herald_curl_error_size(void);           /* CURL_ERROR_SIZE */

#endif /* HERALD_CURL_H */
