/*
 * test_ossl.c - an independent implementation of the receiving side built on
 * OpenSSL 3 EVP only (no deprecated API), used to check what the library
 * produces: key import/export, ECDH, HKDF, AES-128-GCM, ES256/RS256 verify
 * and a full RFC 8291 decrypt.
 */
#include <stdlib.h>
#include <string.h>

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/ec.h>
#include <openssl/encoder.h>
#include <openssl/kdf.h>
#include <openssl/param_build.h>
#include <openssl/pem.h>

#include "test.h"

EVP_PKEY *t_p256_pkey(const uint8_t *priv32, const uint8_t pub[HC_P256_PUBLIC_BYTES]) {
    EVP_PKEY *pkey = NULL;
    BIGNUM *d = NULL;
    OSSL_PARAM *params = NULL;
    OSSL_PARAM_BLD *bld = OSSL_PARAM_BLD_new();
    EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_from_name(NULL, "EC", NULL);
    if (bld == NULL || ctx == NULL) {
        goto done;
    }
    if (!OSSL_PARAM_BLD_push_utf8_string(bld, OSSL_PKEY_PARAM_GROUP_NAME, "prime256v1", 0) ||
        !OSSL_PARAM_BLD_push_octet_string(bld, OSSL_PKEY_PARAM_PUB_KEY, pub,
                                          HC_P256_PUBLIC_BYTES)) {
        goto done;
    }
    if (priv32 != NULL) {
        d = BN_bin2bn(priv32, 32, NULL);
        if (d == NULL || !OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_PRIV_KEY, d)) {
            goto done;
        }
    }
    params = OSSL_PARAM_BLD_to_param(bld);
    if (params == NULL || EVP_PKEY_fromdata_init(ctx) != 1 ||
        EVP_PKEY_fromdata(ctx, &pkey, priv32 != NULL ? EVP_PKEY_KEYPAIR : EVP_PKEY_PUBLIC_KEY,
                          params) != 1) {
        pkey = NULL;
    }
done:
    OSSL_PARAM_free(params);
    BN_clear_free(d);
    OSSL_PARAM_BLD_free(bld);
    EVP_PKEY_CTX_free(ctx);
    return pkey;
}

int t_pkey_public(const EVP_PKEY *pkey, uint8_t pub[HC_P256_PUBLIC_BYTES]) {
    size_t len = 0;
    return EVP_PKEY_get_octet_string_param(pkey, OSSL_PKEY_PARAM_PUB_KEY, pub,
                                           HC_P256_PUBLIC_BYTES, &len) == 1 &&
           len == HC_P256_PUBLIC_BYTES && pub[0] == 0x04;
}

int t_pkey_private(const EVP_PKEY *pkey, uint8_t priv[HC_P256_PRIVATE_BYTES]) {
    BIGNUM *d = NULL;
    int ok = EVP_PKEY_get_bn_param(pkey, OSSL_PKEY_PARAM_PRIV_KEY, &d) == 1 &&
             BN_bn2binpad(d, priv, HC_P256_PRIVATE_BYTES) == HC_P256_PRIVATE_BYTES;
    BN_clear_free(d);
    return ok;
}

static char *t_bio_string(BIO *bio) {
    char *data = NULL;
    long len = BIO_get_mem_data(bio, &data);
    return len > 0 ? t_strndup(data, (size_t)len) : NULL;
}

char *t_pem_pkcs8(const EVP_PKEY *pkey) {
    BIO *bio = BIO_new(BIO_s_mem());
    char *pem = NULL;
    if (bio != NULL && PEM_write_bio_PrivateKey(bio, pkey, NULL, NULL, 0, NULL, NULL) == 1) {
        pem = t_bio_string(bio);
    }
    BIO_free(bio);
    return pem;
}

char *t_pem_type_specific(const EVP_PKEY *pkey) {
    unsigned char *data = NULL;
    size_t len = 0;
    char *pem = NULL;
    OSSL_ENCODER_CTX *ectx =
        OSSL_ENCODER_CTX_new_for_pkey(pkey, EVP_PKEY_KEYPAIR, "PEM", "type-specific", NULL);
    if (ectx != NULL && OSSL_ENCODER_CTX_get_num_encoders(ectx) > 0 &&
        OSSL_ENCODER_to_data(ectx, &data, &len) == 1) {
        pem = t_strndup((const char *)data, len);
    }
    OPENSSL_free(data);
    OSSL_ENCODER_CTX_free(ectx);
    return pem;
}

char *t_pem_public(const EVP_PKEY *pkey) {
    BIO *bio = BIO_new(BIO_s_mem());
    char *pem = NULL;
    if (bio != NULL && PEM_write_bio_PUBKEY(bio, pkey) == 1) {
        pem = t_bio_string(bio);
    }
    BIO_free(bio);
    return pem;
}

EVP_PKEY *t_pem_read_private(const char *pem) {
    BIO *bio = BIO_new_mem_buf(pem, -1);
    EVP_PKEY *pkey = bio != NULL ? PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL) : NULL;
    BIO_free(bio);
    return pkey;
}

int t_ossl_ecdh(EVP_PKEY *priv, const uint8_t peer_pub[HC_P256_PUBLIC_BYTES], uint8_t secret[32]) {
    int ok = 0;
    EVP_PKEY *peer = t_p256_pkey(NULL, peer_pub);
    EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_from_pkey(NULL, priv, NULL);
    size_t len = 32;
    if (peer != NULL && ctx != NULL && EVP_PKEY_derive_init(ctx) == 1 &&
        EVP_PKEY_derive_set_peer(ctx, peer) == 1 && EVP_PKEY_derive(ctx, secret, &len) == 1 &&
        len == 32) {
        ok = 1;
    }
    EVP_PKEY_CTX_free(ctx);
    EVP_PKEY_free(peer);
    return ok;
}

int t_ossl_hkdf(const uint8_t *salt, size_t salt_len, const uint8_t *ikm, size_t ikm_len,
                const uint8_t *info, size_t info_len, uint8_t *out, size_t out_len) {
    EVP_KDF *kdf = EVP_KDF_fetch(NULL, "HKDF", NULL);
    EVP_KDF_CTX *kctx = kdf != NULL ? EVP_KDF_CTX_new(kdf) : NULL;
    OSSL_PARAM params[5];
    OSSL_PARAM *p = params;
    *p++ = OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, (char *)"SHA256", 0);
    *p++ = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, (void *)ikm, ikm_len);
    *p++ = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, (void *)salt, salt_len);
    *p++ = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, (void *)info, info_len);
    *p = OSSL_PARAM_construct_end();
    int ok = kctx != NULL && EVP_KDF_derive(kctx, out, out_len, params) == 1;
    EVP_KDF_CTX_free(kctx);
    EVP_KDF_free(kdf);
    return ok;
}

int t_ossl_gcm_open(const uint8_t key[16], const uint8_t iv[12], const uint8_t *in, size_t in_len,
                    const uint8_t tag[16], uint8_t *out) {
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    int len = 0, fin = 0;
    int ok = ctx != NULL && EVP_DecryptInit_ex(ctx, EVP_aes_128_gcm(), NULL, NULL, NULL) == 1 &&
             EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_IVLEN, 12, NULL) == 1 &&
             EVP_DecryptInit_ex(ctx, NULL, NULL, key, iv) == 1 &&
             EVP_DecryptUpdate(ctx, out, &len, in, (int)in_len) == 1 &&
             EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, 16, (void *)tag) == 1 &&
             EVP_DecryptFinal_ex(ctx, out + len, &fin) == 1 && (size_t)(len + fin) == in_len;
    EVP_CIPHER_CTX_free(ctx);
    return ok;
}

static int t_ossl_verify(EVP_PKEY *pub, const uint8_t *msg, size_t msg_len, const uint8_t *sig,
                         size_t sig_len) {
    static const uint8_t empty[1] = {0};
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    int ok = md != NULL && EVP_DigestVerifyInit_ex(md, NULL, "SHA256", NULL, NULL, pub, NULL) == 1 &&
             EVP_DigestVerify(md, sig, sig_len, msg_len > 0 ? msg : empty, msg_len) == 1;
    EVP_MD_CTX_free(md);
    return ok;
}

int t_ossl_es256_verify(EVP_PKEY *pub, const uint8_t *msg, size_t msg_len,
                        const uint8_t sig[HC_ES256_SIGNATURE_BYTES]) {
    int ok = 0;
    unsigned char *der = NULL;
    ECDSA_SIG *es = ECDSA_SIG_new();
    BIGNUM *r = BN_bin2bn(sig, 32, NULL);
    BIGNUM *s = BN_bin2bn(sig + 32, 32, NULL);
    if (es == NULL || r == NULL || s == NULL || ECDSA_SIG_set0(es, r, s) != 1) {
        BN_free(r);
        BN_free(s);
        goto done;
    }
    int der_len = i2d_ECDSA_SIG(es, &der);
    if (der_len > 0) {
        ok = t_ossl_verify(pub, msg, msg_len, der, (size_t)der_len);
    }
done:
    OPENSSL_free(der);
    ECDSA_SIG_free(es);
    return ok;
}

int t_ossl_rs256_verify(EVP_PKEY *pub, const uint8_t *msg, size_t msg_len, const uint8_t *sig,
                        size_t sig_len) {
    return t_ossl_verify(pub, msg, msg_len, sig, sig_len);
}

static uint32_t t_be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

int t_webpush_open(EVP_PKEY *ua, const uint8_t auth[16], const uint8_t *body, size_t body_len,
                   uint8_t *pt, size_t *pt_len, uint32_t *rs, unsigned *idlen) {
    static const char key_label[] = "WebPush: info"; /* + NUL */
    static const char cek_label[] = "Content-Encoding: aes128gcm";
    static const char nonce_label[] = "Content-Encoding: nonce";
    if (body_len < 21) {
        return -1;
    }
    *rs = t_be32(body + 16);
    *idlen = body[20];
    if (*idlen != HC_P256_PUBLIC_BYTES || body_len < 21 + *idlen + 16 + 1) {
        return -1;
    }
    const uint8_t *salt = body, *as_public = body + 21;
    const uint8_t *ct = body + 21 + *idlen;
    size_t ct_len = body_len - 21 - *idlen - 16;
    if (ct_len + 16 > *rs) {
        return -1; /* the single record must fit the record size */
    }

    uint8_t ua_public[HC_P256_PUBLIC_BYTES], ecdh[32], ikm[32], cek[16], nonce[12];
    uint8_t key_info[sizeof key_label + 2 * HC_P256_PUBLIC_BYTES];
    if (!t_pkey_public(ua, ua_public) || !t_ossl_ecdh(ua, as_public, ecdh)) {
        return -2;
    }
    memcpy(key_info, key_label, sizeof key_label);
    memcpy(key_info + sizeof key_label, ua_public, HC_P256_PUBLIC_BYTES);
    memcpy(key_info + sizeof key_label + HC_P256_PUBLIC_BYTES, as_public, HC_P256_PUBLIC_BYTES);
    if (!t_ossl_hkdf(auth, 16, ecdh, 32, key_info, sizeof key_info, ikm, 32) ||
        !t_ossl_hkdf(salt, 16, ikm, 32, (const uint8_t *)cek_label, sizeof cek_label, cek, 16) ||
        !t_ossl_hkdf(salt, 16, ikm, 32, (const uint8_t *)nonce_label, sizeof nonce_label, nonce,
                     12)) {
        return -3;
    }
    if (!t_ossl_gcm_open(cek, nonce, ct, ct_len, ct + ct_len, pt)) {
        return -4;
    }
    size_t end = ct_len;
    while (end > 0 && pt[end - 1] == 0) {
        end--;
    }
    if (end == 0 || pt[end - 1] != 0x02) {
        return -5;
    }
    *pt_len = end - 1;
    return 0;
}
