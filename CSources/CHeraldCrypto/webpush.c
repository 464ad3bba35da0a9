/* Web Push record sealing: RFC 8291 key schedule over RFC 8188 aes128gcm. */
#include "internal.h"

#include <openssl/err.h>
#include <sodium.h>
#include <string.h>

struct hc_webpush_sub {
    EC_POINT *point;                          /* p256dh, checked on the curve */
    uint8_t pub[HC_P256_PUBLIC_BYTES];
    uint8_t auth[HC_WEBPUSH_AUTH_BYTES];      /* the auth secret (wiped when freed) */
};

struct hc_sealer {
    BN_CTX *bn;
    BIGNUM *d;             /* ephemeral scalar, wiped after each seal */
    EC_POINT *eph;         /* ephemeral public point */
    EVP_CIPHER_CTX *aes;
    EVP_MD_CTX *md;        /* SHA-256 for the key schedule's HMACs */
    uint32_t rs;           /* the record size written into every header */
};

static const char key_info_label[] = "WebPush: info";          /* + NUL */
static const char cek_info[] = "Content-Encoding: aes128gcm";  /* + NUL */
static const char nonce_info[] = "Content-Encoding: nonce";    /* + NUL */

int hc_webpush_sub_new(const uint8_t *p256dh, size_t p256dh_len, const uint8_t *auth,
                       size_t auth_len, hc_webpush_sub **out)
{
    if (p256dh == NULL || auth == NULL || out == NULL) return HC_E_INVALID_ARGUMENT;
    if (hc_init() != HC_OK) return HC_E_CRYPTO;
    EC_POINT *point = NULL;
    int rc = hc_p256_point_parse(p256dh, p256dh_len, &point, NULL);
    if (rc != HC_OK) return rc;
    if (auth_len != HC_WEBPUSH_AUTH_BYTES) {
        EC_POINT_free(point);
        return HC_E_AUTH_LENGTH;
    }
    hc_webpush_sub *sub = OPENSSL_zalloc(sizeof *sub);
    if (sub == NULL) {
        EC_POINT_free(point);
        return HC_E_NO_MEMORY;
    }
    sub->point = point;
    memcpy(sub->pub, p256dh, HC_P256_PUBLIC_BYTES);
    memcpy(sub->auth, auth, HC_WEBPUSH_AUTH_BYTES);
    *out = sub;
    return HC_OK;
}

void hc_webpush_sub_free(hc_webpush_sub *sub)
{
    if (sub == NULL) return;
    EC_POINT_free(sub->point);
    OPENSSL_clear_free(sub, sizeof *sub);
}

void hc_webpush_sub_public(const hc_webpush_sub *sub, uint8_t out[HC_P256_PUBLIC_BYTES])
{
    memcpy(out, sub->pub, HC_P256_PUBLIC_BYTES);
}

int hc_sealer_new(uint32_t record_size, hc_sealer **out)
{
    if (out == NULL) return HC_E_INVALID_ARGUMENT;
    if (record_size < HC_AES128GCM_MIN_RECORD_SIZE) return HC_E_RECORD_SIZE;
    if (hc_init() != HC_OK) return HC_E_CRYPTO;
    hc_sealer *s = OPENSSL_zalloc(sizeof *s);
    if (s == NULL) return HC_E_NO_MEMORY;
    s->bn = BN_CTX_secure_new();
    s->d = BN_secure_new();
    s->eph = EC_POINT_new(hc_p256_group());
    s->aes = EVP_CIPHER_CTX_new();
    s->md = EVP_MD_CTX_new();
    if (s->bn == NULL || s->d == NULL || s->eph == NULL || s->aes == NULL || s->md == NULL ||
        !EVP_EncryptInit_ex2(s->aes, hc_aes128gcm_cipher(), NULL, NULL, NULL)) {
        hc_sealer_free(s);
        return HC_E_NO_MEMORY;
    }
    BN_set_flags(s->d, BN_FLG_CONSTTIME);
    s->rs = record_size;
    *out = s;
    return HC_OK;
}

void hc_sealer_free(hc_sealer *s)
{
    if (s == NULL) return;
    BN_CTX_free(s->bn);
    BN_clear_free(s->d);
    EC_POINT_clear_free(s->eph);
    EVP_CIPHER_CTX_free(s->aes);
    EVP_MD_CTX_free(s->md);
    OPENSSL_free(s);
}

size_t hc_webpush_max_plaintext(size_t body_size)
{
    if (body_size == 0) body_size = HC_WEBPUSH_MAX_BODY;
    if (body_size < HC_WEBPUSH_OVERHEAD + 1 || body_size > HC_WEBPUSH_MAX_BODY) return 0;
    return body_size - HC_WEBPUSH_OVERHEAD;
}

static int body_length(size_t plaintext_len, size_t body_size, size_t *total)
{
    if (body_size != 0 && (body_size < HC_WEBPUSH_OVERHEAD + 1 || body_size > HC_WEBPUSH_MAX_BODY))
        return HC_E_BODY_SIZE;
    if (plaintext_len > hc_webpush_max_plaintext(body_size)) return HC_E_PLAINTEXT_TOO_LARGE;
    *total = body_size != 0 ? body_size : plaintext_len + HC_WEBPUSH_OVERHEAD;
    return HC_OK;
}

size_t hc_webpush_sealed_length(size_t plaintext_len, size_t body_size)
{
    size_t total = 0;
    return body_length(plaintext_len, body_size, &total) == HC_OK ? total : 0;
}

/* One input of an HMAC: the message is the inputs in order. */
typedef struct {
    const void *data;
    size_t len;
} hmac_part;

/* HMAC-SHA256 (RFC 2104) of parts[0] || ... || parts[count-1] under a key
 * of at most 64 bytes, on the sealer's digest context. OpenSSL's SHA-256
 * (SHA extensions where the CPU has them) instead of libsodium's portable
 * one: the key schedule's five HMACs were a tenth of a seal. */
static int hmac(EVP_MD_CTX *md, const uint8_t *key, size_t key_len, const hmac_part *parts,
                size_t count, uint8_t out[HC_SHA256_BYTES])
{
    uint8_t pad[64];
    unsigned int n = 0;
    for (size_t i = 0; i < sizeof pad; i++) pad[i] = (uint8_t)((i < key_len ? key[i] : 0) ^ 0x36);
    int ok = EVP_DigestInit_ex2(md, hc_sha256_md(), NULL) && EVP_DigestUpdate(md, pad, sizeof pad);
    for (size_t i = 0; ok && i < count; i++)
        ok = parts[i].len == 0 || EVP_DigestUpdate(md, parts[i].data, parts[i].len);
    ok = ok && EVP_DigestFinal_ex(md, out, &n);
    for (size_t i = 0; i < sizeof pad; i++) pad[i] ^= 0x36 ^ 0x5c;
    ok = ok && EVP_DigestInit_ex2(md, hc_sha256_md(), NULL) && EVP_DigestUpdate(md, pad, sizeof pad) &&
         EVP_DigestUpdate(md, out, HC_SHA256_BYTES) && EVP_DigestFinal_ex(md, out, &n);
    sodium_memzero(pad, sizeof pad);
    return ok;
}

/* Seals with the scalar already in s->d and the salt given. */
static int seal_record(hc_sealer *s, const hc_webpush_sub *sub, const uint8_t salt[16],
                       const uint8_t *pt, size_t pt_len, size_t total, uint8_t *out)
{
    const EC_GROUP *group = hc_p256_group();
    int rc = HC_E_CRYPTO, n = 0;
    uint8_t ecdh[32], prk_key[32], ikm[32], prk[32], cek[32], nonce[32];
    static const uint8_t one = 0x01;
    uint8_t *as_pub = out + 21;
    uint8_t *record = out + HC_AES128GCM_HEADER_BYTES;
    size_t record_len = total - HC_AES128GCM_HEADER_BYTES - HC_AES128GCM_TAG_BYTES;

    /* Ephemeral public key straight into the header's keyid. */
    if (!EC_POINT_mul(group, s->eph, s->d, NULL, NULL, s->bn) ||
        EC_POINT_point2oct(group, s->eph, POINT_CONVERSION_UNCOMPRESSED, as_pub,
                           HC_P256_PUBLIC_BYTES, s->bn) != HC_P256_PUBLIC_BYTES)
        goto out;
    rc = hc_p256_mul_x(s->d, sub->point, s->bn, ecdh);
    if (rc != HC_OK) goto out;
    rc = HC_E_CRYPTO;

    /* PRK_key = HMAC(auth, ecdh); IKM = HKDF-Expand(PRK_key, key_info, 32),
     * one block: HMAC(PRK_key, key_info || 0x01). */
    const hmac_part shared[] = {{ecdh, sizeof ecdh}};
    const hmac_part key_info[] = {{key_info_label, sizeof key_info_label},
                                  {sub->pub, HC_P256_PUBLIC_BYTES},
                                  {as_pub, HC_P256_PUBLIC_BYTES},
                                  {&one, 1}};
    /* PRK = HKDF-Extract(salt, IKM) = HMAC(salt, IKM); CEK and NONCE from
     * RFC 8188's labels, one block each. */
    const hmac_part extract[] = {{ikm, sizeof ikm}};
    const hmac_part cek_label[] = {{cek_info, sizeof cek_info}, {&one, 1}};
    const hmac_part nonce_label[] = {{nonce_info, sizeof nonce_info}, {&one, 1}};
    if (!hmac(s->md, sub->auth, sizeof sub->auth, shared, 1, prk_key) ||
        !hmac(s->md, prk_key, sizeof prk_key, key_info, 4, ikm) ||
        !hmac(s->md, salt, HC_WEBPUSH_SALT_BYTES, extract, 1, prk) ||
        !hmac(s->md, prk, sizeof prk, cek_label, 2, cek) ||
        !hmac(s->md, prk, sizeof prk, nonce_label, 2, nonce))
        goto out;

    /* Header: salt || rs || idlen || keyid. */
    memcpy(out, salt, HC_WEBPUSH_SALT_BYTES);
    out[16] = (s->rs >> 24) & 0xff;
    out[17] = (s->rs >> 16) & 0xff;
    out[18] = (s->rs >> 8) & 0xff;
    out[19] = s->rs & 0xff;
    out[20] = HC_P256_PUBLIC_BYTES;

    /* Padded plaintext: data || 0x02 || zeros, sealed in place. */
    memmove(record, pt, pt_len);
    record[pt_len] = 0x02;
    memset(record + pt_len + 1, 0, record_len - pt_len - 1);
    if (!EVP_EncryptInit_ex2(s->aes, NULL, cek, nonce, NULL) ||
        !EVP_EncryptUpdate(s->aes, record, &n, record, (int)record_len) ||
        (size_t)n != record_len || !EVP_EncryptFinal_ex(s->aes, record + n, &n) ||
        !EVP_CIPHER_CTX_ctrl(s->aes, EVP_CTRL_GCM_GET_TAG, HC_AES128GCM_TAG_BYTES,
                             record + record_len))
        goto out;
    rc = HC_OK;
out:
    sodium_memzero(ecdh, sizeof ecdh);
    sodium_memzero(prk_key, sizeof prk_key);
    sodium_memzero(ikm, sizeof ikm);
    sodium_memzero(prk, sizeof prk);
    sodium_memzero(cek, sizeof cek);
    sodium_memzero(nonce, sizeof nonce);
    BN_clear(s->d);
    if (rc != HC_OK) {
        sodium_memzero(out, total);
        ERR_clear_error();
    }
    return rc;
}

static int check_args(const hc_sealer *s, const hc_webpush_sub *sub, const uint8_t *pt,
                      size_t pt_len, size_t body_size, const uint8_t *out, size_t *len,
                      size_t *total)
{
    if (s == NULL || sub == NULL || len == NULL || (pt == NULL && pt_len > 0))
        return HC_E_INVALID_ARGUMENT;
    int rc = body_length(pt_len, body_size, total);
    if (rc != HC_OK) return rc;
    /* RFC 8291 section 4: rs must be larger than the one record. */
    if (*total - HC_AES128GCM_HEADER_BYTES >= s->rs) return HC_E_RECORD_SIZE;
    if (out == NULL || *len < *total) {
        *len = *total;
        return HC_E_BUFFER_TOO_SMALL;
    }
    return HC_OK;
}

int hc_webpush_seal(hc_sealer *s, const hc_webpush_sub *sub, const uint8_t *pt,
                    size_t pt_len, size_t body_size, uint8_t *out, size_t *len)
{
    size_t total = 0;
    int rc = check_args(s, sub, pt, pt_len, body_size, out, len, &total);
    if (rc != HC_OK) return rc;
    uint8_t salt[HC_WEBPUSH_SALT_BYTES];
    randombytes_buf(salt, sizeof salt);
    do {
        if (!BN_priv_rand_range_ex(s->d, EC_GROUP_get0_order(hc_p256_group()), 0, s->bn)) {
            ERR_clear_error();
            return HC_E_RANDOM;
        }
    } while (BN_is_zero(s->d));
    rc = seal_record(s, sub, salt, pt, pt_len, total, out);
    if (rc == HC_OK) *len = total;
    return rc;
}

int hc_webpush_seal_with_keys(hc_sealer *s, const hc_webpush_sub *sub,
                              const uint8_t as_private[HC_P256_PRIVATE_BYTES],
                              const uint8_t salt[HC_WEBPUSH_SALT_BYTES], const uint8_t *pt,
                              size_t pt_len, size_t body_size, uint8_t *out, size_t *len)
{
    if (as_private == NULL || salt == NULL) return HC_E_INVALID_ARGUMENT;
    size_t total = 0;
    int rc = check_args(s, sub, pt, pt_len, body_size, out, len, &total);
    if (rc != HC_OK) return rc;
    if (BN_bin2bn(as_private, HC_P256_PRIVATE_BYTES, s->d) == NULL) return HC_E_NO_MEMORY;
    if (BN_is_zero(s->d) || BN_cmp(s->d, EC_GROUP_get0_order(hc_p256_group())) >= 0) {
        BN_clear(s->d);
        return HC_E_PRIVATE_KEY_RANGE;
    }
    rc = seal_record(s, sub, salt, pt, pt_len, total, out);
    if (rc == HC_OK) *len = total;
    return rc;
}
