/* Single-shot AES-128-GCM with any nonce and tag length the API allows. The
 * record sealer keeps its own reusable context (webpush.c). */
#include "internal.h"

#include <openssl/core_names.h>
#include <openssl/err.h>
#include <sodium.h>
#include <string.h>

static int gcm_setup(EVP_CIPHER_CTX *ctx, int enc, const uint8_t key[16], const uint8_t *iv,
                     size_t iv_len, const uint8_t *aad, size_t aad_len)
{
    int n = 0;
    OSSL_PARAM params[2] = {OSSL_PARAM_END, OSSL_PARAM_END};
    params[0] = OSSL_PARAM_construct_size_t(OSSL_CIPHER_PARAM_AEAD_IVLEN, &iv_len);
    if (!EVP_CipherInit_ex2(ctx, hc_aes128gcm_cipher(), NULL, NULL, enc, params) ||
        !EVP_CipherInit_ex2(ctx, NULL, key, iv, enc, NULL))
        return 0;
    return aad_len == 0 || EVP_CipherUpdate(ctx, NULL, &n, aad, (int)aad_len);
}

static int gcm_args(const uint8_t *key, const uint8_t *iv, size_t iv_len, const uint8_t *aad,
                    size_t aad_len, const uint8_t *in, size_t in_len, const uint8_t *out,
                    const uint8_t *tag, size_t tag_len)
{
    if (key == NULL || iv == NULL || iv_len == 0 || tag == NULL || tag_len < 4 || tag_len > 16 ||
        (aad == NULL && aad_len > 0) || (in_len > 0 && (in == NULL || out == NULL)) ||
        in_len > INT32_MAX || aad_len > INT32_MAX || iv_len > HC_AES128GCM_MAX_IV)
        return HC_E_INVALID_ARGUMENT;
    return hc_init() == HC_OK ? HC_OK : HC_E_CRYPTO;
}

int hc_aes128gcm_encrypt(const uint8_t key[16], const uint8_t *iv, size_t iv_len,
                         const uint8_t *aad, size_t aad_len, const uint8_t *in, size_t in_len,
                         uint8_t *out, uint8_t *tag, size_t tag_len)
{
    int rc = gcm_args(key, iv, iv_len, aad, aad_len, in, in_len, out, tag, tag_len);
    if (rc != HC_OK) return rc;
    int n = 0;
    uint8_t full[16], tail[16];
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    if (ctx == NULL) return HC_E_NO_MEMORY;
    rc = HC_E_CRYPTO;
    if (gcm_setup(ctx, 1, key, iv, iv_len, aad, aad_len) &&
        (in_len == 0 || EVP_EncryptUpdate(ctx, out, &n, in, (int)in_len)) &&
        EVP_EncryptFinal_ex(ctx, tail, &n) &&
        EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, 16, full)) {
        memcpy(tag, full, tag_len);
        rc = HC_OK;
    }
    EVP_CIPHER_CTX_free(ctx);
    ERR_clear_error();
    return rc;
}

int hc_aes128gcm_decrypt(const uint8_t key[16], const uint8_t *iv, size_t iv_len,
                         const uint8_t *aad, size_t aad_len, const uint8_t *in, size_t in_len,
                         const uint8_t *tag, size_t tag_len, uint8_t *out)
{
    int rc = gcm_args(key, iv, iv_len, aad, aad_len, in, in_len, out, tag, tag_len);
    if (rc != HC_OK) return rc;
    int n = 0;
    uint8_t tail[16];
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    if (ctx == NULL) return HC_E_NO_MEMORY;
    rc = HC_E_CRYPTO;
    if (gcm_setup(ctx, 0, key, iv, iv_len, aad, aad_len) &&
        (in_len == 0 || EVP_DecryptUpdate(ctx, out, &n, in, (int)in_len)) &&
        EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, (int)tag_len, (void *)tag)) {
        if (EVP_DecryptFinal_ex(ctx, tail, &n) > 0) {
            rc = HC_OK;
        } else {
            rc = HC_E_DECRYPT;
            if (in_len > 0) sodium_memzero(out, in_len);
        }
    }
    EVP_CIPHER_CTX_free(ctx);
    ERR_clear_error();
    return rc;
}
