/*
 * herald_crypto.h - Herald's hot-path cryptography.
 *
 * Conventions
 * - Every public name starts with hc_ / HC_.
 * - Functions return HC_OK (0) on success or one negative HC_E_* code per
 *   cause; hc_strerror() turns a code into a short English sentence.
 * - The caller owns every buffer. Output lengths are in/out: on entry *len is
 *   the capacity of the buffer, on success it is the number of bytes written.
 *   On HC_E_BUFFER_TOO_SMALL *len holds the size that is needed.
 * - Fixed-size inputs and outputs are array parameters with their size macro.
 * - Opaque handles (hc_p256_key, hc_rsa_key, hc_webpush_sub, hc_sealer) are
 *   created by *_new / *_from_* functions and released by *_free, which wipes
 *   the secrets they hold. hc_p256_key, hc_rsa_key and hc_webpush_sub are
 *   immutable after creation and may be shared between threads; an hc_sealer
 *   holds reusable scratch contexts and must be used by one thread at a time.
 * - Every temporary secret is wiped before a function returns.
 * - Strings are NUL-terminated UTF-8 unless a length is given.
 * - No OpenSSL, libsodium or jansson type appears in this header.
 * - hc_init() must be called once before anything else (it is idempotent and
 *   thread-safe).
 * - HC_NODISCARD marks every function whose result must be looked at;
 *   HC_NONNULL(i, ...) the pointer parameters that may never be NULL, so the
 *   compiler checks the call. The library itself still refuses a NULL it is
 *   given with HC_E_INVALID_ARGUMENT (it is built without the attribute, as is
 *   any file that defines HC_NO_NONNULL before including this header).
 * - Policy stays with the caller: the OAuth scope, the Web Push body and
 *   record sizes are parameters, and a VAPID subject is taken as given (the
 *   caller checks it; Herald does so when it loads its configuration).
 */
#ifndef HERALD_CRYPTO_H
#define HERALD_CRYPTO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define HC_NODISCARD __attribute__((warn_unused_result))
#if !defined(HC_NO_NONNULL)
#define HC_NONNULL(...) __attribute__((nonnull(__VA_ARGS__)))
#endif
#else
#define HC_NODISCARD
#endif
#ifndef HC_NONNULL
#define HC_NONNULL(...)
#endif

/* Sizes. */
#define HC_P256_PUBLIC_BYTES 65    /* uncompressed point 0x04 || X || Y */
#define HC_P256_PRIVATE_BYTES 32   /* raw scalar */
#define HC_ES256_SIGNATURE_BYTES 64 /* raw r || s, each 32 bytes */
#define HC_SHA256_BYTES 32
#define HC_WEBPUSH_AUTH_BYTES 16
#define HC_WEBPUSH_SALT_BYTES 16
#define HC_AES128GCM_HEADER_BYTES 86 /* salt 16 || rs 4 || idlen 1 || keyid 65 */
#define HC_AES128GCM_TAG_BYTES 16
#define HC_AES128GCM_MIN_RECORD_SIZE 18 /* RFC 8188 2.1: smaller rs values are invalid */
#define HC_WEBPUSH_MAX_BODY 4096      /* RFC 8030 7.2: every service accepts this */
/* Overhead of one sealed record: header, padding delimiter and tag. */
#define HC_WEBPUSH_OVERHEAD 103 /* 86 + 1 + 16 */
#define HC_SECRETBOX_KEY_BYTES 32
/* Sealed secret: version 1 || nonce 24 || ciphertext || tag 16. */
#define HC_SECRETBOX_OVERHEAD 41 /* 1 + 24 + 16 */
#define HC_HKDF_MAX_OUTPUT 8160 /* 255 * 32 */
#define HC_VAPID_MAX_TTL 86400 /* seconds a VAPID token may live */

/* Result codes: one per cause. */
enum {
    HC_OK = 0,
    HC_E_INVALID_ARGUMENT = -1,      /* a NULL pointer or impossible size */
    HC_E_NO_MEMORY = -2,
    HC_E_RANDOM = -3,                /* the random generator failed */
    HC_E_CRYPTO = -4,                /* an OpenSSL operation failed unexpectedly */
    HC_E_BUFFER_TOO_SMALL = -5,
    HC_E_BASE64 = -6,                /* not valid base64url */
    HC_E_PUBLIC_KEY_LENGTH = -7,     /* a public key that is not 65 bytes */
    HC_E_PUBLIC_KEY_FORMAT = -8,     /* a point that is not uncompressed (0x04) */
    HC_E_PUBLIC_KEY_NOT_ON_CURVE = -9,
    HC_E_AUTH_LENGTH = -10,          /* a Web Push auth secret that is not 16 bytes */
    HC_E_PRIVATE_KEY_LENGTH = -11,   /* a raw private key that is not 32 bytes */
    HC_E_PRIVATE_KEY_RANGE = -12,    /* a scalar that is 0 or not below the order */
    HC_E_PEM = -13,                  /* text that is not a readable PEM private key */
    HC_E_KEY_TYPE = -14,             /* a key of the wrong type or curve */
    HC_E_PLAINTEXT_TOO_LARGE = -15,  /* the plaintext does not fit the record */
    HC_E_BODY_SIZE = -16,            /* a requested body size outside 104..4096 */
    HC_E_JSON = -17,                 /* JSON could not be built or parsed */
    /* -18 is retired: it was a VAPID subject refused here; the caller checks it now. */
    HC_E_AUDIENCE = -19,             /* an audience that is not an https origin */
    HC_E_EXPIRY = -20,               /* an expiry in the past or too far ahead */
    HC_E_SIGNATURE_LENGTH = -21,     /* a signature that is not 64 bytes */
    HC_E_SIGNATURE_INVALID = -22,    /* a signature that does not verify */
    HC_E_DECRYPT = -23,              /* authentication of sealed data failed */
    HC_E_SEALED_FORMAT = -24,        /* sealed data too short or of an unknown version */
    HC_E_RSA_KEY = -25,              /* not an RSA private key of at least 2048 bits */
    HC_E_SERVICE_ACCOUNT = -26,      /* a service-account file missing a required field */
    HC_E_CLAIM = -27,                /* a JWT claim (kid, iss, email, URL) of a bad form */
    HC_E_HKDF_LENGTH = -28,          /* an HKDF output longer than 255 * 32 bytes */
    HC_E_RECORD_SIZE = -29           /* an rs below 18, or not larger than the record */
};

/* Returns a constant sentence for a result code (never NULL). */
HC_NODISCARD const char *hc_strerror(int code);

/* Initialises libsodium and the shared curve tables. Idempotent. It also
 * installs a jansson allocator that wipes memory on free, for the whole
 * process: text from json_dumps() must then be released through jansson's
 * own free function (json_get_alloc_funcs), never plain free(). */
HC_NODISCARD int hc_init(void);

/* ---- Encoding, hashing, randomness (encode.c) ---- */

/* Length of the unpadded base64url text for n bytes (without the NUL). */
HC_NODISCARD size_t hc_base64url_encoded_length(size_t n);
/* Encodes without padding; *len in/out, excluding the terminating NUL that
 * is always written (the capacity must leave room for it). */
HC_NODISCARD HC_NONNULL(4) int hc_base64url_encode(const uint8_t *in, size_t in_len, char *out,
                                                   size_t *len);
/* Decodes base64url. Trailing '=' padding is accepted only when it is
 * correct; whitespace and characters outside the URL-safe alphabet are
 * refused with HC_E_BASE64. */
HC_NODISCARD HC_NONNULL(4) int hc_base64url_decode(const char *in, size_t in_len, uint8_t *out,
                                                   size_t *len);

HC_NONNULL(3) void hc_sha256(const uint8_t *in, size_t in_len, uint8_t out[HC_SHA256_BYTES]);
HC_NODISCARD int hc_random(uint8_t *out, size_t len);
/* Constant-time comparison: 1 when equal, 0 when not. */
HC_NODISCARD int hc_equal(const uint8_t *a, const uint8_t *b, size_t len);
void hc_wipe(void *p, size_t len);

/* ---- HKDF-SHA256, RFC 5869 (hkdf.c) ---- */

HC_NONNULL(5) void hc_hkdf_extract(const uint8_t *salt, size_t salt_len, const uint8_t *ikm,
                                   size_t ikm_len, uint8_t prk[HC_SHA256_BYTES]);
HC_NODISCARD HC_NONNULL(1) int hc_hkdf_expand(const uint8_t prk[HC_SHA256_BYTES],
                                              const uint8_t *info, size_t info_len, uint8_t *out,
                                              size_t out_len);
HC_NODISCARD int hc_hkdf(const uint8_t *salt, size_t salt_len, const uint8_t *ikm, size_t ikm_len,
                         const uint8_t *info, size_t info_len, uint8_t *out, size_t out_len);

/* ---- P-256 keys (p256.c) ---- */

typedef struct hc_p256_key hc_p256_key;

HC_NODISCARD HC_NONNULL(1) int hc_p256_key_generate(hc_p256_key **out);
/* Reads a PEM private key: PKCS#8 ("PRIVATE KEY") or SEC1 ("EC PRIVATE KEY"). */
HC_NODISCARD HC_NONNULL(1, 3) int hc_p256_key_from_pem(const char *pem, size_t pem_len,
                                                        hc_p256_key **out);
HC_NODISCARD HC_NONNULL(1, 3) int hc_p256_key_from_raw(const uint8_t *raw, size_t raw_len,
                                                        hc_p256_key **out);
/* Accepts a PEM text or a base64url raw 32-byte key (surrounding whitespace ignored). */
HC_NODISCARD HC_NONNULL(1, 3) int hc_p256_key_from_text(const char *text, size_t text_len,
                                                         hc_p256_key **out);
void hc_p256_key_free(hc_p256_key *key);
HC_NONNULL(1, 2) void hc_p256_key_public(const hc_p256_key *key,
                                         uint8_t out[HC_P256_PUBLIC_BYTES]);
/* PKCS#8 PEM of the private key; *len in/out including room for the NUL. */
HC_NODISCARD HC_NONNULL(1, 3) int hc_p256_key_to_pem(const hc_p256_key *key, char *out,
                                                      size_t *len);
/* Checks that bytes are an uncompressed point on P-256. */
HC_NODISCARD HC_NONNULL(1) int hc_p256_public_check(const uint8_t *pub, size_t pub_len);
/* Plain ECDH: the X coordinate of priv * peer. */
HC_NODISCARD HC_NONNULL(1, 2, 3) int hc_p256_ecdh(const hc_p256_key *key,
                                                   const uint8_t peer[HC_P256_PUBLIC_BYTES],
                                                   uint8_t secret[32]);

/* ---- ES256: ECDSA P-256, SHA-256, raw r || s (p256.c) ---- */

HC_NODISCARD HC_NONNULL(1, 4) int hc_es256_sign(const hc_p256_key *key, const uint8_t *msg,
                                                 size_t msg_len,
                                                 uint8_t sig[HC_ES256_SIGNATURE_BYTES]);
/* HC_OK when the signature verifies, HC_E_SIGNATURE_INVALID when it does not. */
HC_NODISCARD HC_NONNULL(1, 5) int hc_es256_verify(const uint8_t *pub, size_t pub_len,
                                                   const uint8_t *msg, size_t msg_len,
                                                   const uint8_t *sig, size_t sig_len);

/* ---- JWTs (jws.c) ---- */

/* VAPID token (RFC 8292): header {"typ":"JWT","alg":"ES256"}, claims
 * {"aud","exp","sub"}. aud must be an https origin without path and exp must
 * lie in (now, now + 24 h]. sub is written as given (JSON-escaped): checking
 * that it is a mailto: or https: URL is the caller's job. */
HC_NODISCARD HC_NONNULL(1, 2, 3, 7) int hc_vapid_jwt(const hc_p256_key *key, const char *aud,
                                                      const char *sub, int64_t exp, int64_t now,
                                                      char *out, size_t *len);
/* "vapid t=<jwt>, k=<public key>" for an Authorization header. */
HC_NODISCARD HC_NONNULL(1, 2, 3, 7) int hc_vapid_authorization(const hc_p256_key *key,
                                                                const char *aud, const char *sub,
                                                                int64_t exp, int64_t now,
                                                                char *out, size_t *len);
/* APNs provider token: header {"alg":"ES256","kid"}, claims {"iss","iat"}.
 * key_id and team_id are 10 characters of A-Z and 0-9. */
HC_NODISCARD HC_NONNULL(1, 2, 3, 6) int hc_apns_jwt(const hc_p256_key *key, const char *key_id,
                                                     const char *team_id, int64_t iat, char *out,
                                                     size_t *len);

/* ---- RS256: RSASSA-PKCS1-v1_5 with SHA-256 (rs256.c) ---- */

typedef struct hc_rsa_key hc_rsa_key;

HC_NODISCARD HC_NONNULL(1, 3) int hc_rsa_key_from_pem(const char *pem, size_t pem_len,
                                                       hc_rsa_key **out);
void hc_rsa_key_free(hc_rsa_key *key);
/* *len in/out. */
HC_NODISCARD HC_NONNULL(1, 5) int hc_rs256_sign(const hc_rsa_key *key, const uint8_t *msg,
                                                 size_t msg_len, uint8_t *sig, size_t *len);
HC_NODISCARD HC_NONNULL(1, 5) int hc_rs256_verify_pem(const char *public_pem, size_t pem_len,
                                                       const uint8_t *msg, size_t msg_len,
                                                       const uint8_t *sig, size_t sig_len);

/* ---- The FCM service account (fcm_account.c) ---- */

typedef struct hc_fcm_account hc_fcm_account;

/* Parses a Google service-account JSON file: project_id, client_email,
 * private_key (RSA PEM) and token_uri are required. */
HC_NODISCARD HC_NONNULL(1, 3) int hc_fcm_account_from_json(const char *json, size_t json_len,
                                                            hc_fcm_account **out);
void hc_fcm_account_free(hc_fcm_account *account);
HC_NODISCARD HC_NONNULL(1) const char *hc_fcm_account_project_id(const hc_fcm_account *account);
HC_NODISCARD HC_NONNULL(1) const char *hc_fcm_account_client_email(const hc_fcm_account *account);
HC_NODISCARD HC_NONNULL(1) const char *hc_fcm_account_token_uri(const hc_fcm_account *account);
/* The OAuth2 JWT-bearer assertion: RS256, the scope the caller asks for (one
 * or more space-separated scope URIs, no control characters), aud token_uri,
 * exp = iat + lifetime (1..3600 seconds). */
HC_NODISCARD HC_NONNULL(1, 2, 6) int hc_fcm_assertion(const hc_fcm_account *account,
                                                       const char *scope, int64_t iat,
                                                       int64_t lifetime, char *out, size_t *len);

/* ---- Web Push record sealing: RFC 8291 over RFC 8188 aes128gcm (webpush.c) ---- */

typedef struct hc_webpush_sub hc_webpush_sub;
typedef struct hc_sealer hc_sealer;

/* Prepares a subscriber: p256dh is parsed and checked on the curve once. */
HC_NODISCARD HC_NONNULL(1, 3, 5) int hc_webpush_sub_new(const uint8_t *p256dh, size_t p256dh_len,
                                                         const uint8_t *auth, size_t auth_len,
                                                         hc_webpush_sub **out);
void hc_webpush_sub_free(hc_webpush_sub *sub);
HC_NONNULL(1, 2) void hc_webpush_sub_public(const hc_webpush_sub *sub,
                                            uint8_t out[HC_P256_PUBLIC_BYTES]);

/* Scratch contexts reused across seals (key generation, cipher, bignums).
 * record_size is the rs written into every header: at least
 * HC_AES128GCM_MIN_RECORD_SIZE, and every record sealed must be shorter than
 * it (RFC 8291 section 4), else the seal fails with HC_E_RECORD_SIZE. */
HC_NODISCARD HC_NONNULL(2) int hc_sealer_new(uint32_t record_size, hc_sealer **out);
void hc_sealer_free(hc_sealer *sealer);

/* Size of the sealed body for plaintext_len bytes padded to body_size
 * (0 = no padding beyond the delimiter), or 0 when it does not fit. */
HC_NODISCARD size_t hc_webpush_sealed_length(size_t plaintext_len, size_t body_size);
/* The largest plaintext that fits a body of body_size bytes. */
HC_NODISCARD size_t hc_webpush_max_plaintext(size_t body_size);

/* Seals one record with a fresh ephemeral key and random salt. With
 * body_size > 0 the output is exactly body_size bytes (zero padding after the
 * 0x02 delimiter); with 0 it is as short as possible. */
HC_NODISCARD HC_NONNULL(1, 2, 7) int hc_webpush_seal(hc_sealer *sealer, const hc_webpush_sub *sub,
                                                      const uint8_t *plaintext,
                                                      size_t plaintext_len, size_t body_size,
                                                      uint8_t *out, size_t *len);
/* Deterministic variant for tests only: the caller supplies the ephemeral
 * private key and the salt. */
HC_NODISCARD HC_NONNULL(1, 2, 3, 4, 9) int hc_webpush_seal_with_keys(
    hc_sealer *sealer, const hc_webpush_sub *sub, const uint8_t as_private[HC_P256_PRIVATE_BYTES],
    const uint8_t salt[HC_WEBPUSH_SALT_BYTES], const uint8_t *plaintext, size_t plaintext_len,
    size_t body_size, uint8_t *out, size_t *len);

/* ---- AES-128-GCM, single shot; used by the tests (aes128gcm.c) ---- */

/* Nonces of 1..HC_AES128GCM_MAX_IV bytes (OpenSSL 3.0's GCM limit); tags of
 * 4..16 bytes. Other lengths are HC_E_INVALID_ARGUMENT. */
#define HC_AES128GCM_MAX_IV 128

HC_NODISCARD HC_NONNULL(1, 2, 9) int hc_aes128gcm_encrypt(const uint8_t key[16], const uint8_t *iv,
                                                           size_t iv_len, const uint8_t *aad,
                                                           size_t aad_len, const uint8_t *in,
                                                           size_t in_len, uint8_t *out,
                                                           uint8_t *tag, size_t tag_len);
HC_NODISCARD HC_NONNULL(1, 2, 8) int hc_aes128gcm_decrypt(const uint8_t key[16], const uint8_t *iv,
                                                           size_t iv_len, const uint8_t *aad,
                                                           size_t aad_len, const uint8_t *in,
                                                           size_t in_len, const uint8_t *tag,
                                                           size_t tag_len, uint8_t *out);

/* ---- At-rest sealing of small secrets, XChaCha20-Poly1305 (secretbox.c) ---- */

/* out = 0x01 || nonce || ciphertext || tag; ad binds the secret to its row. */
HC_NODISCARD HC_NONNULL(1, 7) int hc_secretbox_seal(const uint8_t key[HC_SECRETBOX_KEY_BYTES],
                                                     const uint8_t *ad, size_t ad_len,
                                                     const uint8_t *in, size_t in_len,
                                                     uint8_t *out, size_t *len);
HC_NODISCARD HC_NONNULL(1, 4, 7) int hc_secretbox_open(const uint8_t key[HC_SECRETBOX_KEY_BYTES],
                                                        const uint8_t *ad, size_t ad_len,
                                                        const uint8_t *in, size_t in_len,
                                                        uint8_t *out, size_t *len);

#ifdef __cplusplus
}
#endif

#endif /* HERALD_CRYPTO_H */
