/*
 * test_util.c - encoding helpers, a seeded PRNG and a JWT splitter, written
 * independently of the library so the tests do not check it against itself.
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "test.h"

static int t_hexval(char c) {
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

uint8_t *t_unhex(const char *hex, size_t *len) {
    size_t n = strlen(hex);
    if (n % 2 != 0) {
        return NULL;
    }
    uint8_t *out = malloc(n / 2 + 1);
    if (out == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < n / 2; i++) {
        int hi = t_hexval(hex[2 * i]), lo = t_hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            free(out);
            return NULL;
        }
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    *len = n / 2;
    return out;
}

void t_hex(const uint8_t *in, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * n] = '\0';
}

static const char t_b64_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

static int t_b64val(char c) {
    const char *p = c == '\0' ? NULL : strchr(t_b64_alphabet, c);
    return p == NULL ? -1 : (int)(p - t_b64_alphabet);
}

size_t t_b64url_decode(const char *in, uint8_t *out, size_t cap) {
    size_t n = strlen(in);
    while (n > 0 && in[n - 1] == '=') {
        n--;
    }
    if (n % 4 == 1) {
        return (size_t)-1;
    }
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        int v = t_b64val(in[i]);
        if (v < 0) {
            return (size_t)-1;
        }
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (o >= cap) {
                return (size_t)-1;
            }
            out[o++] = (uint8_t)(acc >> bits);
        }
    }
    return o;
}

size_t t_b64url_encode(const uint8_t *in, size_t n, char *out) {
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        acc = acc << 8 | in[i];
        bits += 8;
        while (bits >= 6) {
            bits -= 6;
            out[o++] = t_b64_alphabet[(acc >> bits) & 63];
        }
    }
    if (bits > 0) {
        out[o++] = t_b64_alphabet[(acc << (6 - bits)) & 63];
    }
    out[o] = '\0';
    return o;
}

char *t_strndup(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p != NULL) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

char *t_strdup(const char *s) {
    return t_strndup(s, strlen(s));
}

/* xorshift64* */
static uint64_t t_prng_state = 1;

void t_prng_seed(uint64_t seed) {
    t_prng_state = seed == 0 ? 0x9E3779B97F4A7C15u : seed;
}

uint64_t t_prng(void) {
    uint64_t x = t_prng_state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    t_prng_state = x;
    return x * 0x2545F4914F6CDD1Du;
}

size_t t_prng_range(size_t lo, size_t hi) {
    return lo + (size_t)(t_prng() % (uint64_t)(hi - lo + 1));
}

void t_prng_fill(uint8_t *out, size_t n) {
    for (size_t i = 0; i < n; i++) {
        out[i] = (uint8_t)(t_prng() >> 56);
    }
}

static int t_b64_part(const char *s, size_t n, char **out, size_t *out_len) {
    char *tmp = t_strndup(s, n);
    uint8_t *buf = malloc(n + 1);
    if (tmp == NULL || buf == NULL) {
        free(tmp);
        free(buf);
        return 0;
    }
    size_t len = t_b64url_decode(tmp, buf, n);
    free(tmp);
    if (len == (size_t)-1) {
        free(buf);
        return 0;
    }
    buf[len] = '\0';
    *out = (char *)buf;
    *out_len = len;
    return 1;
}

int t_jwt_parse(const char *jwt, size_t len, t_jwt *out) {
    memset(out, 0, sizeof *out);
    const char *d1 = memchr(jwt, '.', len);
    if (d1 == NULL) {
        return 0;
    }
    const char *d2 = memchr(d1 + 1, '.', len - (size_t)(d1 + 1 - jwt));
    if (d2 == NULL || memchr(d2 + 1, '.', len - (size_t)(d2 + 1 - jwt)) != NULL) {
        return 0;
    }
    char *sig = NULL;
    if (!t_b64_part(jwt, (size_t)(d1 - jwt), &out->header, &out->header_len) ||
        !t_b64_part(d1 + 1, (size_t)(d2 - d1 - 1), &out->claims, &out->claims_len) ||
        !t_b64_part(d2 + 1, len - (size_t)(d2 + 1 - jwt), &sig, &out->sig_len)) {
        t_jwt_free(out);
        return 0;
    }
    out->sig = (uint8_t *)sig;
    out->signing_input_len = (size_t)(d2 - jwt);
    out->signing_input = t_strndup(jwt, out->signing_input_len);
    if (out->signing_input == NULL) {
        t_jwt_free(out);
        return 0;
    }
    return 1;
}

void t_jwt_free(t_jwt *jwt) {
    free(jwt->header);
    free(jwt->claims);
    free(jwt->sig);
    free(jwt->signing_input);
    memset(jwt, 0, sizeof *jwt);
}

void t_json_text_free(char *text) {
    /* hc_init installs its own jansson allocator (it wipes freed blocks), so
     * text from json_dumps goes back through jansson's free function. */
    json_malloc_t alloc_fn = NULL;
    json_free_t free_fn = NULL;
    json_get_alloc_funcs(&alloc_fn, &free_fn);
    if (free_fn != NULL) {
        free_fn(text);
    } else {
        free(text);
    }
}

char *t_service_account_json(const char *private_key, const char *omit) {
    json_t *o = json_object();
    json_object_set_new(o, "type", json_string("service_account"));
    json_object_set_new(o, "project_id", json_string("herald-test"));
    json_object_set_new(o, "private_key_id", json_string("0123456789abcdef0123456789abcdef01234567"));
    json_object_set_new(o, "private_key", json_string(private_key));
    json_object_set_new(o, "client_email",
                        json_string("herald-push@herald-test.iam.gserviceaccount.com"));
    json_object_set_new(o, "client_id", json_string("112233445566778899000"));
    json_object_set_new(o, "auth_uri", json_string("https://accounts.google.com/o/oauth2/auth"));
    json_object_set_new(o, "token_uri", json_string("https://oauth2.googleapis.com/token"));
    json_object_set_new(o, "universe_domain", json_string("googleapis.com"));
    if (omit != NULL) {
        json_object_del(o, omit);
    }
    char *s = json_dumps(o, JSON_INDENT(2));
    json_decref(o);
    return s;
}
