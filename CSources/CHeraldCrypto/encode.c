/* base64url, SHA-256, randomness, comparison and wiping. */
#include "internal.h"

#include <sodium.h>
#include <string.h>

size_t hc_base64url_encoded_length(size_t n)
{
    return (n / 3) * 4 + ((n % 3) ? (n % 3) + 1 : 0);
}

int hc_base64url_encode(const uint8_t *in, size_t in_len, char *out, size_t *len)
{
    if (len == NULL || (in == NULL && in_len > 0)) return HC_E_INVALID_ARGUMENT;
    size_t need = hc_base64url_encoded_length(in_len);
    if (out == NULL || *len < need + 1) {
        *len = need + 1;
        return HC_E_BUFFER_TOO_SMALL;
    }
    sodium_bin2base64(out, need + 1, in, in_len, sodium_base64_VARIANT_URLSAFE_NO_PADDING);
    *len = need;
    return HC_OK;
}

int hc_base64url_decode(const char *in, size_t in_len, uint8_t *out, size_t *len)
{
    if (len == NULL || (in == NULL && in_len > 0)) return HC_E_INVALID_ARGUMENT;
    size_t n = in_len;
    /* Accept correct '=' padding only: the padded text has a length that is a
     * multiple of four and at most two '='. */
    size_t pad = 0;
    while (n > 0 && in[n - 1] == '=') {
        n--;
        pad++;
    }
    if (pad > 0 && (pad > 2 || in_len % 4 != 0)) return HC_E_BASE64;
    if (n % 4 == 1) return HC_E_BASE64;
    /* The alphabet is checked here, before asking for more room, and not left to
     * libsodium: 1.0.18 reads every byte >= 0x80 as '_' (found by fuzzing). */
    for (size_t i = 0; i < n; i++) {
        char c = in[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_'))
            return HC_E_BASE64;
    }
    size_t need = (n / 4) * 3 + ((n % 4) ? (n % 4) - 1 : 0);
    if (out == NULL || *len < need) {
        *len = need;
        return HC_E_BUFFER_TOO_SMALL;
    }
    size_t got = 0;
    const char *end = NULL;
    if (n == 0) {
        *len = 0;
        return HC_OK;
    }
    if (sodium_base642bin(out, *len, in, n, NULL, &got, &end,
                          sodium_base64_VARIANT_URLSAFE_NO_PADDING) != 0 ||
        end != in + n || got != need) {
        sodium_memzero(out, *len);
        return HC_E_BASE64;
    }
    *len = got;
    return HC_OK;
}

void hc_sha256(const uint8_t *in, size_t in_len, uint8_t out[HC_SHA256_BYTES])
{
    crypto_hash_sha256(out, in, in_len);
}

int hc_random(uint8_t *out, size_t len)
{
    if (out == NULL && len > 0) return HC_E_INVALID_ARGUMENT;
    if (hc_init() != HC_OK) return HC_E_RANDOM;
    randombytes_buf(out, len);
    return HC_OK;
}

int hc_equal(const uint8_t *a, const uint8_t *b, size_t len)
{
    return sodium_memcmp(a, b, len) == 0;
}

void hc_wipe(void *p, size_t len)
{
    if (p != NULL) sodium_memzero(p, len);
}
