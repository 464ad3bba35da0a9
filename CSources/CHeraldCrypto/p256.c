/* P-256 keys: generation, import and export, ECDH, ES256 signatures. */
#include "internal.h"

#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/param_build.h>
#include <openssl/pem.h>
#include <sodium.h>
#include <string.h>

/* An EVP_PKEY for the scalar d (may be NULL for a public-only key) and pub. */
static EVP_PKEY *pkey_from_parts(const BIGNUM *d, const uint8_t pub[HC_P256_PUBLIC_BYTES])
{
    EVP_PKEY *pkey = NULL;
    EVP_PKEY_CTX *ctx = NULL;
    OSSL_PARAM *params = NULL;
    OSSL_PARAM_BLD *bld = OSSL_PARAM_BLD_new();
    if (bld == NULL) goto out;
    if (!OSSL_PARAM_BLD_push_utf8_string(bld, OSSL_PKEY_PARAM_GROUP_NAME, "prime256v1", 0) ||
        !OSSL_PARAM_BLD_push_octet_string(bld, OSSL_PKEY_PARAM_PUB_KEY, pub, HC_P256_PUBLIC_BYTES) ||
        (d != NULL && !OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_PRIV_KEY, d)))
        goto out;
    params = OSSL_PARAM_BLD_to_param(bld);
    ctx = EVP_PKEY_CTX_new_from_name(NULL, "EC", NULL);
    if (params == NULL || ctx == NULL || EVP_PKEY_fromdata_init(ctx) <= 0) goto out;
    if (EVP_PKEY_fromdata(ctx, &pkey, d != NULL ? EVP_PKEY_KEYPAIR : EVP_PKEY_PUBLIC_KEY,
                          params) <= 0)
        pkey = NULL;
out:
    EVP_PKEY_CTX_free(ctx);
    OSSL_PARAM_free(params); /* the builder's copy of a private BIGNUM is cleared */
    OSSL_PARAM_BLD_free(bld);
    return pkey;
}

int hc_p256_point_parse(const uint8_t *pub, size_t pub_len, EC_POINT **out, BN_CTX *bn)
{
    if (pub == NULL || out == NULL) return HC_E_INVALID_ARGUMENT;
    if (pub_len != HC_P256_PUBLIC_BYTES) return HC_E_PUBLIC_KEY_LENGTH;
    if (pub[0] != 0x04) return HC_E_PUBLIC_KEY_FORMAT;
    const EC_GROUP *group = hc_p256_group();
    if (group == NULL) return HC_E_CRYPTO;
    EC_POINT *p = EC_POINT_new(group);
    if (p == NULL) return HC_E_NO_MEMORY;
    /* oct2point refuses coordinates >= p and points that are not on the curve. */
    if (!EC_POINT_oct2point(group, p, pub, pub_len, bn) || EC_POINT_is_at_infinity(group, p) ||
        EC_POINT_is_on_curve(group, p, bn) != 1) {
        EC_POINT_free(p);
        ERR_clear_error();
        return HC_E_PUBLIC_KEY_NOT_ON_CURVE;
    }
    *out = p;
    return HC_OK;
}

int hc_p256_public_check(const uint8_t *pub, size_t pub_len)
{
    EC_POINT *p = NULL;
    int rc = hc_p256_point_parse(pub, pub_len, &p, NULL);
    EC_POINT_free(p);
    return rc;
}

int hc_p256_mul_x(const BIGNUM *d, const EC_POINT *peer, BN_CTX *bn, uint8_t secret[32])
{
    const EC_GROUP *group = hc_p256_group();
    int rc = HC_E_CRYPTO;
    BIGNUM *x = NULL;
    EC_POINT *r = EC_POINT_new(group);
    if (r == NULL) return HC_E_NO_MEMORY;
    BN_CTX_start(bn);
    x = BN_CTX_get(bn);
    if (x == NULL) goto out;
    if (!EC_POINT_mul(group, r, NULL, peer, d, bn) || EC_POINT_is_at_infinity(group, r) ||
        !EC_POINT_get_affine_coordinates(group, r, x, NULL, bn) ||
        BN_bn2binpad(x, secret, 32) != 32)
        goto out;
    rc = HC_OK;
out:
    if (x != NULL) BN_clear(x);
    BN_CTX_end(bn);
    EC_POINT_clear_free(r);
    return rc;
}

int hc_p256_key_from_scalar(BIGNUM *d, BN_CTX *bn, hc_p256_key **out)
{
    const EC_GROUP *group = hc_p256_group();
    if (group == NULL) return HC_E_CRYPTO;
    int rc = HC_E_CRYPTO;
    hc_p256_key *key = NULL;
    EC_POINT *pub = EC_POINT_new(group);
    if (pub == NULL) return HC_E_NO_MEMORY;
    if (BN_is_zero(d) || BN_cmp(d, EC_GROUP_get0_order(group)) >= 0 || BN_is_negative(d)) {
        rc = HC_E_PRIVATE_KEY_RANGE;
        goto out;
    }
    key = OPENSSL_zalloc(sizeof *key);
    if (key == NULL) {
        rc = HC_E_NO_MEMORY;
        goto out;
    }
    BN_set_flags(d, BN_FLG_CONSTTIME);
    if (!EC_POINT_mul(group, pub, d, NULL, NULL, bn) ||
        EC_POINT_point2oct(group, pub, POINT_CONVERSION_UNCOMPRESSED, key->pub,
                           HC_P256_PUBLIC_BYTES, bn) != HC_P256_PUBLIC_BYTES)
        goto out;
    key->pkey = pkey_from_parts(d, key->pub);
    if (key->pkey == NULL) goto out;
    pthread_mutex_init(&key->sign_lock, NULL);
    key->d = d;
    *out = key;
    key = NULL;
    rc = HC_OK;
out:
    if (key != NULL) {
        EVP_PKEY_free(key->pkey);
        OPENSSL_clear_free(key, sizeof *key);
    }
    EC_POINT_free(pub);
    ERR_clear_error();
    return rc;
}

int hc_p256_key_generate(hc_p256_key **out)
{
    if (out == NULL) return HC_E_INVALID_ARGUMENT;
    const EC_GROUP *group = hc_p256_group();
    if (group == NULL) return HC_E_CRYPTO;
    BIGNUM *d = BN_secure_new();
    if (d == NULL) return HC_E_NO_MEMORY;
    do {
        if (!BN_priv_rand_range_ex(d, EC_GROUP_get0_order(group), 0, NULL)) {
            BN_clear_free(d);
            return HC_E_RANDOM;
        }
    } while (BN_is_zero(d));
    int rc = hc_p256_key_from_scalar(d, NULL, out);
    if (rc != HC_OK) BN_clear_free(d);
    return rc;
}

int hc_p256_key_from_raw(const uint8_t *raw, size_t raw_len, hc_p256_key **out)
{
    if (raw == NULL || out == NULL) return HC_E_INVALID_ARGUMENT;
    if (raw_len != HC_P256_PRIVATE_BYTES) return HC_E_PRIVATE_KEY_LENGTH;
    if (hc_init() != HC_OK) return HC_E_CRYPTO;
    BIGNUM *d = BN_secure_new();
    if (d == NULL) return HC_E_NO_MEMORY;
    BN_set_flags(d, BN_FLG_CONSTTIME);
    if (BN_bin2bn(raw, (int)raw_len, d) == NULL) {
        BN_clear_free(d);
        return HC_E_NO_MEMORY;
    }
    int rc = hc_p256_key_from_scalar(d, NULL, out);
    if (rc != HC_OK) BN_clear_free(d);
    return rc;
}

int hc_p256_key_from_pem(const char *pem, size_t pem_len, hc_p256_key **out)
{
    if (pem == NULL || out == NULL || pem_len > INT32_MAX) return HC_E_INVALID_ARGUMENT;
    if (hc_init() != HC_OK) return HC_E_CRYPTO;
    int rc = HC_E_PEM;
    EVP_PKEY *pkey = NULL;
    BIGNUM *d = NULL;
    char group[32] = {0};
    size_t group_len = 0;
    BIO *bio = BIO_new_mem_buf(pem, (int)pem_len);
    if (bio == NULL) return HC_E_NO_MEMORY;
    pkey = PEM_read_bio_PrivateKey_ex(bio, NULL, hc_no_password, NULL, NULL, NULL);
    if (pkey == NULL) goto out;
    rc = HC_E_KEY_TYPE;
    if (!EVP_PKEY_is_a(pkey, "EC") ||
        !EVP_PKEY_get_utf8_string_param(pkey, OSSL_PKEY_PARAM_GROUP_NAME, group, sizeof group,
                                        &group_len) ||
        (strcmp(group, "prime256v1") != 0 && strcmp(group, "P-256") != 0))
        goto out;
    rc = HC_E_PEM;
    if (!EVP_PKEY_get_bn_param(pkey, OSSL_PKEY_PARAM_PRIV_KEY, &d)) goto out;
    rc = hc_p256_key_from_scalar(d, NULL, out);
    if (rc == HC_OK) d = NULL;
out:
    BN_clear_free(d);
    EVP_PKEY_free(pkey);
    BIO_free(bio);
    ERR_clear_error();
    return rc;
}

int hc_p256_key_from_text(const char *text, size_t text_len, hc_p256_key **out)
{
    if (text == NULL || out == NULL) return HC_E_INVALID_ARGUMENT;
    while (text_len > 0 && (*text == ' ' || *text == '\t' || *text == '\r' || *text == '\n')) {
        text++;
        text_len--;
    }
    while (text_len > 0 && (text[text_len - 1] == ' ' || text[text_len - 1] == '\t' ||
                            text[text_len - 1] == '\r' || text[text_len - 1] == '\n'))
        text_len--;
    if (text_len >= 5 && memcmp(text, "-----", 5) == 0) return hc_p256_key_from_pem(text, text_len, out);
    uint8_t raw[48];
    size_t raw_len = sizeof raw;
    int rc = hc_base64url_decode(text, text_len, raw, &raw_len);
    if (rc == HC_E_BUFFER_TOO_SMALL) rc = HC_E_PRIVATE_KEY_LENGTH;
    if (rc == HC_OK) rc = hc_p256_key_from_raw(raw, raw_len, out);
    sodium_memzero(raw, sizeof raw);
    return rc;
}

void hc_p256_key_free(hc_p256_key *key)
{
    if (key == NULL) return;
    EVP_PKEY_CTX_free(key->sign_ctx);
    pthread_mutex_destroy(&key->sign_lock);
    EVP_PKEY_free(key->pkey);
    BN_clear_free(key->d);
    OPENSSL_clear_free(key, sizeof *key);
}

void hc_p256_key_public(const hc_p256_key *key, uint8_t out[HC_P256_PUBLIC_BYTES])
{
    memcpy(out, key->pub, HC_P256_PUBLIC_BYTES);
}

int hc_p256_key_to_pem(const hc_p256_key *key, char *out, size_t *len)
{
    if (key == NULL || len == NULL) return HC_E_INVALID_ARGUMENT;
    int rc = HC_E_CRYPTO;
    BIO *bio = BIO_new(BIO_s_mem());
    char *data = NULL;
    if (bio == NULL) return HC_E_NO_MEMORY;
    if (!PEM_write_bio_PrivateKey(bio, key->pkey, NULL, NULL, 0, NULL, NULL)) goto out;
    long n = BIO_get_mem_data(bio, &data);
    if (n <= 0) goto out;
    rc = hc_copy_out(data, (size_t)n, out, len);
out:
    BIO_free(bio); /* a memory BIO clears its buffer when freed */
    ERR_clear_error();
    return rc;
}

int hc_p256_ecdh(const hc_p256_key *key, const uint8_t peer[HC_P256_PUBLIC_BYTES],
                 uint8_t secret[32])
{
    if (key == NULL || peer == NULL || secret == NULL) return HC_E_INVALID_ARGUMENT;
    EC_POINT *p = NULL;
    BN_CTX *bn = BN_CTX_secure_new();
    if (bn == NULL) return HC_E_NO_MEMORY;
    int rc = hc_p256_point_parse(peer, HC_P256_PUBLIC_BYTES, &p, bn);
    if (rc == HC_OK) rc = hc_p256_mul_x(key->d, p, bn, secret);
    EC_POINT_free(p);
    BN_CTX_free(bn);
    ERR_clear_error();
    return rc;
}

/* Signs a digest; returns the DER length or 0. Uses the key's cached context
 * when no other thread holds it, else a fresh one. */
static size_t sign_digest(hc_p256_key *key, const uint8_t digest[HC_SHA256_BYTES], uint8_t *der,
                          size_t der_cap)
{
    size_t n = der_cap;
    if (pthread_mutex_trylock(&key->sign_lock) == 0) {
        if (key->sign_ctx == NULL) {
            key->sign_ctx = EVP_PKEY_CTX_new_from_pkey(NULL, key->pkey, NULL);
            if (key->sign_ctx != NULL && EVP_PKEY_sign_init(key->sign_ctx) <= 0) {
                EVP_PKEY_CTX_free(key->sign_ctx);
                key->sign_ctx = NULL;
            }
        }
        int ok = key->sign_ctx != NULL &&
                 EVP_PKEY_sign(key->sign_ctx, der, &n, digest, HC_SHA256_BYTES) > 0;
        pthread_mutex_unlock(&key->sign_lock);
        return ok ? n : 0;
    }
    EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_from_pkey(NULL, key->pkey, NULL);
    int ok = ctx != NULL && EVP_PKEY_sign_init(ctx) > 0 &&
             EVP_PKEY_sign(ctx, der, &n, digest, HC_SHA256_BYTES) > 0;
    EVP_PKEY_CTX_free(ctx);
    return ok ? n : 0;
}

int hc_es256_sign(const hc_p256_key *key, const uint8_t *msg, size_t msg_len,
                  uint8_t sig[HC_ES256_SIGNATURE_BYTES])
{
    if (key == NULL || sig == NULL || (msg == NULL && msg_len > 0)) return HC_E_INVALID_ARGUMENT;
    int rc = HC_E_CRYPTO;
    uint8_t digest[HC_SHA256_BYTES];
    uint8_t der[80];
    ECDSA_SIG *es = NULL;
    crypto_hash_sha256(digest, msg, msg_len);
    /* The key is logically const: the cached context is an internal detail. */
    size_t der_len = sign_digest((hc_p256_key *)key, digest, der, sizeof der);
    if (der_len == 0) goto out;
    const unsigned char *p = der;
    es = d2i_ECDSA_SIG(NULL, &p, (long)der_len);
    if (es == NULL) goto out;
    /* Fixed width: r and s are each left-padded to 32 bytes. */
    if (BN_bn2binpad(ECDSA_SIG_get0_r(es), sig, 32) != 32 ||
        BN_bn2binpad(ECDSA_SIG_get0_s(es), sig + 32, 32) != 32)
        goto out;
    rc = HC_OK;
out:
    ECDSA_SIG_free(es);
    ERR_clear_error();
    return rc;
}

int hc_es256_verify(const uint8_t *pub, size_t pub_len, const uint8_t *msg, size_t msg_len,
                    const uint8_t *sig, size_t sig_len)
{
    if (pub == NULL || sig == NULL || (msg == NULL && msg_len > 0)) return HC_E_INVALID_ARGUMENT;
    int rc = hc_p256_public_check(pub, pub_len);
    if (rc != HC_OK) return rc;
    if (sig_len != HC_ES256_SIGNATURE_BYTES) return HC_E_SIGNATURE_LENGTH;
    rc = HC_E_CRYPTO;
    unsigned char *der = NULL;
    uint8_t digest[HC_SHA256_BYTES];
    EVP_PKEY_CTX *ctx = NULL;
    ECDSA_SIG *es = ECDSA_SIG_new();
    BIGNUM *r = BN_bin2bn(sig, 32, NULL);
    BIGNUM *s = BN_bin2bn(sig + 32, 32, NULL);
    EVP_PKEY *pkey = pkey_from_parts(NULL, pub);
    if (es == NULL || r == NULL || s == NULL || pkey == NULL) goto out;
    if (!ECDSA_SIG_set0(es, r, s)) goto out;
    r = s = NULL;
    int der_len = i2d_ECDSA_SIG(es, &der);
    if (der_len <= 0) goto out;
    crypto_hash_sha256(digest, msg, msg_len);
    ctx = EVP_PKEY_CTX_new_from_pkey(NULL, pkey, NULL);
    if (ctx == NULL || EVP_PKEY_verify_init(ctx) <= 0) goto out;
    rc = EVP_PKEY_verify(ctx, der, (size_t)der_len, digest, sizeof digest) == 1
             ? HC_OK
             : HC_E_SIGNATURE_INVALID;
out:
    OPENSSL_free(der);
    BN_free(r);
    BN_free(s);
    ECDSA_SIG_free(es);
    EVP_PKEY_CTX_free(ctx);
    EVP_PKEY_free(pkey);
    ERR_clear_error();
    return rc;
}
