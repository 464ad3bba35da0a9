/* Shared internals of the C core; not part of the public API. */
#ifndef HC_INTERNAL_H
#define HC_INTERNAL_H

/* The library keeps its run-time NULL checks: its own declarations carry no
 * nonnull attribute, so the compiler may not assume the checks away. */
#define HC_NO_NONNULL
#include "herald_crypto.h"

#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <pthread.h>

/* The process-wide P-256 group (read-only after hc_init). */
const EC_GROUP *hc_p256_group(void);

struct hc_p256_key {
    EVP_PKEY *pkey;                       /* for ECDSA signing */
    pthread_mutex_t sign_lock;            /* guards sign_ctx */
    EVP_PKEY_CTX *sign_ctx;               /* initialised once, reused while uncontended */
    BIGNUM *d;                            /* the private scalar (constant time) */
    uint8_t pub[HC_P256_PUBLIC_BYTES];    /* uncompressed public point */
};

/* Builds a key object from a scalar already checked to be in [1, n-1]. */
int hc_p256_key_from_scalar(BIGNUM *d, BN_CTX *bn, hc_p256_key **out);

/* The fetched AES-128-GCM implementation (read-only after hc_init). */
const EVP_CIPHER *hc_aes128gcm_cipher(void);

/* The fetched SHA-256 implementation (read-only after hc_init): OpenSSL's,
 * which uses the CPU's SHA extensions where there are any. */
const EVP_MD *hc_sha256_md(void);

/* Parses an uncompressed public point into an EC_POINT on the shared group. */
int hc_p256_point_parse(const uint8_t *pub, size_t pub_len, EC_POINT **out, BN_CTX *bn);

/* X coordinate of d * peer, written into secret[32]. */
int hc_p256_mul_x(const BIGNUM *d, const EC_POINT *peer, BN_CTX *bn, uint8_t secret[32]);

/* Frees (and wipes) memory allocated by jansson. */
void hc_json_free(void *p);

/* Copies a NUL-terminated string into out (capacity *len), with the
 * buffer-too-small contract of the public API. */
int hc_copy_out(const char *s, size_t s_len, char *out, size_t *len);

/* Signs header.claims and returns the compact JWS ("a.b.c"): ES256 with
 * es_key or RS256 with rsa_key (exactly one of them is given). */
int hc_jws_compact(const char *header_json, const char *claims_json,
                   const hc_p256_key *es_key, const hc_rsa_key *rsa_key, char *out,
                   size_t *len);

/* Serialises both jansson objects compactly (insertion order kept), signs them
 * with hc_jws_compact and releases them (either may be NULL: HC_E_JSON). */
struct json_t;
int hc_jws_sign_json(struct json_t *header, struct json_t *claims, const hc_p256_key *es_key,
                     const hc_rsa_key *rsa_key, char *out, size_t *len);

/* 1 when s holds a space, a control character or DEL. */
int hc_has_space_or_control(const char *s);

/* The size of an RS256 signature made with key, in bytes. */
size_t hc_rsa_signature_size(const hc_rsa_key *key);

/* The callback that refuses encrypted PEM files instead of prompting. */
int hc_no_password(char *buf, int size, int rwflag, void *u);

#endif
