/*
 * test.h - the tiny harness shared by the C core tests.
 *
 * Every CHECK / CHECK_RC / CHECK_MEM invocation is one counted check. Loops
 * over many random cases fold their iterations into one check per property
 * (see test_roundtrip.c) so a broken build does not print thousands of lines;
 * the Wycheproof runner counts one check per test case.
 */
#ifndef HC_TEST_H
#define HC_TEST_H

#include <stddef.h>
#include <stdint.h>

#include <openssl/evp.h>

#include "herald_crypto.h"

/* Herald's policy, passed in by the Swift side and fixed here for the tests:
 * the padded Web Push body, the rs it writes and the FCM OAuth scope. */
#define T_BODY_SIZE 2816
#define T_RECORD_SIZE 4096
#define T_FCM_SCOPE "https://www.googleapis.com/auth/firebase.messaging"

/* ---- harness (test_main.c) ---- */

extern const char *t_fixtures; /* argv[1], e.g. "Tests/Fixtures" */

int t_check(int ok, const char *file, int line, const char *expr, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
int t_check_mem(const void *got, const void *want, size_t len, const char *file, int line,
                const char *what);
/* Prints an informational line (used for per-file Wycheproof counts). */
void t_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define CHECK(cond, ...) t_check(!!(cond), __FILE__, __LINE__, #cond, __VA_ARGS__)

#define CHECK_RC(expr, want)                                                              \
    do {                                                                                  \
        int t_rc_ = (expr);                                                               \
        int t_want_ = (want);                                                             \
        t_check(t_rc_ == t_want_, __FILE__, __LINE__, #expr, "got %d (%s), want %d (%s)", \
                t_rc_, hc_strerror(t_rc_), t_want_, hc_strerror(t_want_));                \
    } while (0)

#define CHECK_MEM(got, want, len, what) t_check_mem((got), (want), (len), __FILE__, __LINE__, (what))

/* ---- test groups ---- */

void test_vectors_rfc5869(void);
void test_vectors_rfc8188(void);
void test_vectors_rfc8291(void);
void test_vectors_rfc8292(void);
void test_wycheproof_ecdh(void);
void test_wycheproof_ecdsa(void);
void test_wycheproof_aes_gcm(void);
void test_roundtrip_webpush(void);
void test_roundtrip_es256(void);
void test_roundtrip_threads(void);
void test_errors_encoding(void);
void test_errors_keys(void);
void test_errors_webpush(void);
void test_errors_jwt(void);
void test_errors_secretbox(void);
void test_errors_strerror(void);
void test_errors_null(void);
void test_api_basics(void);
void test_api_pem(void);
void test_api_jwt(void);
void test_api_fcm(void);
void test_api_secretbox(void);

/* ---- helpers (test_util.c) ---- */

/* Decodes hex into a fresh buffer (never NULL, at least one byte allocated);
 * returns NULL on bad hex. */
uint8_t *t_unhex(const char *hex, size_t *len);
/* Decodes base64url (optionally padded) written independently of the code
 * under test; returns the length or (size_t)-1. */
size_t t_b64url_decode(const char *in, uint8_t *out, size_t cap);
/* Encodes unpadded base64url; out needs 4*ceil(n/3)+1 bytes. Returns strlen. */
size_t t_b64url_encode(const uint8_t *in, size_t n, char *out);
/* Writes the hex form of in (2n+1 bytes) into out. */
void t_hex(const uint8_t *in, size_t n, char *out);

/* Frees text returned by json_dumps (see test_util.c). */
void t_json_text_free(char *text);

char *t_strndup(const char *s, size_t n);
char *t_strdup(const char *s);

/* Deterministic PRNG for sizes and plaintexts (seeded in test_main.c). */
uint64_t t_prng(void);
size_t t_prng_range(size_t lo, size_t hi); /* inclusive */
void t_prng_fill(uint8_t *out, size_t n);
void t_prng_seed(uint64_t seed);

/* ---- independent OpenSSL helpers (test_ossl.c) ---- */

/* A P-256 EVP_PKEY from an uncompressed public point and an optional raw
 * private scalar (NULL for a public-only key). */
EVP_PKEY *t_p256_pkey(const uint8_t *priv32, const uint8_t pub[HC_P256_PUBLIC_BYTES]);
int t_pkey_public(const EVP_PKEY *pkey, uint8_t pub[HC_P256_PUBLIC_BYTES]);
int t_pkey_private(const EVP_PKEY *pkey, uint8_t priv[HC_P256_PRIVATE_BYTES]);
/* PEM texts as fresh NUL-terminated strings (free()). t_pem_pkcs8 writes
 * "PRIVATE KEY"; t_pem_type_specific writes the key type's own structure
 * ("EC PRIVATE KEY" = SEC1, "RSA PRIVATE KEY" = PKCS#1). */
char *t_pem_pkcs8(const EVP_PKEY *pkey);
char *t_pem_type_specific(const EVP_PKEY *pkey);
char *t_pem_public(const EVP_PKEY *pkey);
/* A Google service-account JSON around private_key; omit names a field to leave
 * out (NULL: none). Free with t_json_text_free. */
char *t_service_account_json(const char *private_key, const char *omit);
EVP_PKEY *t_pem_read_private(const char *pem);
/* Plain ECDH through EVP_PKEY_derive. Returns 1 on success. */
int t_ossl_ecdh(EVP_PKEY *priv, const uint8_t peer[HC_P256_PUBLIC_BYTES], uint8_t secret[32]);
/* HKDF-SHA256 through EVP_KDF "HKDF". Returns 1 on success. */
int t_ossl_hkdf(const uint8_t *salt, size_t salt_len, const uint8_t *ikm, size_t ikm_len,
                const uint8_t *info, size_t info_len, uint8_t *out, size_t out_len);
/* AES-128-GCM decrypt with a 12-byte IV and a 16-byte tag. Returns 1 when the tag verifies. */
int t_ossl_gcm_open(const uint8_t key[16], const uint8_t iv[12], const uint8_t *in, size_t in_len,
                    const uint8_t tag[16], uint8_t *out);
/* ES256 verify of raw r||s: converts to DER, then EVP_DigestVerify. 1 = valid. */
int t_ossl_es256_verify(EVP_PKEY *pub, const uint8_t *msg, size_t msg_len,
                        const uint8_t sig[HC_ES256_SIGNATURE_BYTES]);
/* RS256 verify with EVP_DigestVerify. 1 = valid. */
int t_ossl_rs256_verify(EVP_PKEY *pub, const uint8_t *msg, size_t msg_len, const uint8_t *sig,
                        size_t sig_len);

/* Independent RFC 8291 receiver. Returns 0 on success and fills pt/pt_len
 * (pt needs body_len bytes), rs and idlen; a negative stage number on failure:
 * -1 header, -2 keyid/ECDH, -3 HKDF, -4 tag, -5 padding. */
int t_webpush_open(EVP_PKEY *ua, const uint8_t auth[16], const uint8_t *body, size_t body_len,
                   uint8_t *pt, size_t *pt_len, uint32_t *rs, unsigned *idlen);

/* ---- JWT helper (test_util.c) ---- */

typedef struct {
    char *header;  /* decoded header JSON, NUL-terminated */
    size_t header_len;
    char *claims;  /* decoded claims JSON, NUL-terminated */
    size_t claims_len;
    uint8_t *sig;  /* decoded signature */
    size_t sig_len;
    char *signing_input; /* "<b64 header>.<b64 claims>" */
    size_t signing_input_len;
} t_jwt;

/* Splits and decodes a compact JWS; returns 1 on success. */
int t_jwt_parse(const char *jwt, size_t len, t_jwt *out);
void t_jwt_free(t_jwt *jwt);

#endif /* HC_TEST_H */
