/* At-rest sealing of small secrets (device tokens, Web Push keys). */
#include "internal.h"

#include <sodium.h>
#include <string.h>

#define VERSION 0x01
#define NONCE crypto_aead_xchacha20poly1305_ietf_NPUBBYTES

int hc_secretbox_seal(const uint8_t key[HC_SECRETBOX_KEY_BYTES], const uint8_t *ad,
                      size_t ad_len, const uint8_t *in, size_t in_len, uint8_t *out, size_t *len)
{
    if (key == NULL || len == NULL || (ad == NULL && ad_len > 0) || (in == NULL && in_len > 0))
        return HC_E_INVALID_ARGUMENT;
    if (hc_init() != HC_OK) return HC_E_RANDOM;
    size_t need = in_len + HC_SECRETBOX_OVERHEAD;
    if (out == NULL || *len < need) {
        *len = need;
        return HC_E_BUFFER_TOO_SMALL;
    }
    unsigned long long clen = 0;
    out[0] = VERSION;
    randombytes_buf(out + 1, NONCE);
    crypto_aead_xchacha20poly1305_ietf_encrypt(out + 1 + NONCE, &clen, in, in_len, ad, ad_len,
                                               NULL, out + 1, key);
    *len = 1 + NONCE + (size_t)clen;
    return HC_OK;
}

int hc_secretbox_open(const uint8_t key[HC_SECRETBOX_KEY_BYTES], const uint8_t *ad,
                      size_t ad_len, const uint8_t *in, size_t in_len, uint8_t *out, size_t *len)
{
    if (key == NULL || len == NULL || in == NULL || (ad == NULL && ad_len > 0))
        return HC_E_INVALID_ARGUMENT;
    if (hc_init() != HC_OK) return HC_E_CRYPTO;
    if (in_len < HC_SECRETBOX_OVERHEAD || in[0] != VERSION) return HC_E_SEALED_FORMAT;
    size_t need = in_len - HC_SECRETBOX_OVERHEAD;
    if ((out == NULL && need > 0) || *len < need) {
        *len = need;
        return HC_E_BUFFER_TOO_SMALL;
    }
    unsigned long long mlen = 0;
    if (crypto_aead_xchacha20poly1305_ietf_decrypt(out, &mlen, NULL, in + 1 + NONCE,
                                                   in_len - 1 - NONCE, ad, ad_len, in + 1,
                                                   key) != 0) {
        sodium_memzero(out, need);
        return HC_E_DECRYPT;
    }
    *len = (size_t)mlen;
    return HC_OK;
}
