/* HKDF-SHA256 (RFC 5869) over libsodium's HMAC-SHA256. */
#include "internal.h"

#include <sodium.h>
#include <string.h>

void hc_hkdf_extract(const uint8_t *salt, size_t salt_len, const uint8_t *ikm,
                     size_t ikm_len, uint8_t prk[HC_SHA256_BYTES])
{
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, salt, salt_len);
    crypto_auth_hmacsha256_update(&st, ikm, ikm_len);
    crypto_auth_hmacsha256_final(&st, prk);
    sodium_memzero(&st, sizeof st);
}

int hc_hkdf_expand(const uint8_t prk[HC_SHA256_BYTES], const uint8_t *info,
                   size_t info_len, uint8_t *out, size_t out_len)
{
    if (prk == NULL || (out == NULL && out_len > 0) || (info == NULL && info_len > 0))
        return HC_E_INVALID_ARGUMENT;
    if (out_len > HC_HKDF_MAX_OUTPUT) return HC_E_HKDF_LENGTH;
    uint8_t t[HC_SHA256_BYTES];
    size_t t_len = 0, done = 0;
    crypto_auth_hmacsha256_state st;
    for (uint8_t counter = 1; done < out_len; counter++) {
        crypto_auth_hmacsha256_init(&st, prk, HC_SHA256_BYTES);
        crypto_auth_hmacsha256_update(&st, t, t_len);
        crypto_auth_hmacsha256_update(&st, info, info_len);
        crypto_auth_hmacsha256_update(&st, &counter, 1);
        crypto_auth_hmacsha256_final(&st, t);
        t_len = HC_SHA256_BYTES;
        size_t take = out_len - done < HC_SHA256_BYTES ? out_len - done : HC_SHA256_BYTES;
        memcpy(out + done, t, take);
        done += take;
    }
    sodium_memzero(&st, sizeof st);
    sodium_memzero(t, sizeof t);
    return HC_OK;
}

int hc_hkdf(const uint8_t *salt, size_t salt_len, const uint8_t *ikm, size_t ikm_len,
            const uint8_t *info, size_t info_len, uint8_t *out, size_t out_len)
{
    if ((ikm == NULL && ikm_len > 0) || (salt == NULL && salt_len > 0))
        return HC_E_INVALID_ARGUMENT;
    if (out_len > HC_HKDF_MAX_OUTPUT) return HC_E_HKDF_LENGTH;
    uint8_t prk[HC_SHA256_BYTES];
    hc_hkdf_extract(salt, salt_len, ikm, ikm_len, prk);
    int rc = hc_hkdf_expand(prk, info, info_len, out, out_len);
    sodium_memzero(prk, sizeof prk);
    return rc;
}
