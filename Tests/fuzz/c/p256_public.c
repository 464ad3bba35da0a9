/*
 * p256_public: public points as clients send them (a Web Push p256dh, a
 * VAPID or APNs public key): hc_p256_public_check, hc_webpush_sub_new,
 * hc_p256_ecdh and hc_es256_verify.
 *
 * The input x is read whole as a point, and as p = x[0..65) followed by the
 * rest r: an auth secret for the subscriber, and a signature r[0..64) over the
 * message r[64..].
 *
 * Properties:
 * - hc_p256_public_check(x) agrees with a reference written here with plain
 *   BIGNUM arithmetic (length 65, prefix 0x04, both coordinates below p, and
 *   y^2 = x^3 - 3x + b mod p), and the code is the first failing rule's;
 * - hc_webpush_sub_new(p, r) refuses the point first with the same code, then
 *   an auth secret that is not 16 bytes; a subscriber keeps p byte for byte;
 * - hc_p256_ecdh(k, p) with a fixed key succeeds exactly when p is a valid
 *   point, and then equals OpenSSL's EVP_PKEY_derive (Tests/CCore/test_ossl.c);
 *   OpenSSL accepts exactly the same uncompressed (0x04) points. It also reads
 *   X9.62's hybrid form (0x06/0x07), which the core refuses on purpose: RFC 8291
 *   keys are uncompressed;
 * - hc_es256_verify never fails for a reason other than the point, the
 *   signature length or HC_E_SIGNATURE_INVALID.
 */
#include "fuzz.h"
#include "test.h"

#include <openssl/bn.h>

static hc_p256_key *fixed_key;
static EVP_PKEY *fixed_pkey;
static BIGNUM *field_p, *curve_b;
static BN_CTX *bn;

static int reference_check(const uint8_t *pub, size_t len)
{
    if (len != HC_P256_PUBLIC_BYTES) return HC_E_PUBLIC_KEY_LENGTH;
    if (pub[0] != 0x04) return HC_E_PUBLIC_KEY_FORMAT;
    BN_CTX_start(bn);
    BIGNUM *x = BN_CTX_get(bn), *y = BN_CTX_get(bn), *lhs = BN_CTX_get(bn),
           *rhs = BN_CTX_get(bn), *t = BN_CTX_get(bn);
    FUZZ_CHECK(t != NULL, "BN_CTX_get failed");
    FUZZ_CHECK(BN_bin2bn(pub + 1, 32, x) && BN_bin2bn(pub + 33, 32, y), "BN_bin2bn failed");
    int on_curve = 0;
    if (BN_cmp(x, field_p) < 0 && BN_cmp(y, field_p) < 0) {
        /* rhs = x^3 - 3x + b */
        FUZZ_CHECK(BN_mod_sqr(lhs, y, field_p, bn) && BN_mod_sqr(t, x, field_p, bn) &&
                       BN_mod_mul(rhs, t, x, field_p, bn) && BN_set_word(t, 3) &&
                       BN_mod_mul(t, t, x, field_p, bn) && BN_mod_sub(rhs, rhs, t, field_p, bn) &&
                       BN_mod_add(rhs, rhs, curve_b, field_p, bn),
                   "BIGNUM arithmetic failed");
        on_curve = BN_cmp(lhs, rhs) == 0;
    }
    BN_CTX_end(bn);
    return on_curve ? HC_OK : HC_E_PUBLIC_KEY_NOT_ON_CURVE;
}

static void check_point(const uint8_t *data, size_t size)
{
    uint8_t *pub = fuzz_copy(data, size);
    int rc = hc_p256_public_check(pub, size);
    int want = reference_check(pub, size);
    FUZZ_CHECK(rc == want, "public_check of %zu bytes gave %d (%s), the reference %d (%s)", size,
               rc, hc_strerror(rc), want, hc_strerror(want));
    free(pub);
}

static void check_subscriber(const uint8_t *p, size_t p_len, const uint8_t *auth, size_t auth_len)
{
    uint8_t *pub = fuzz_copy(p, p_len), *secret = fuzz_copy(auth, auth_len);
    hc_webpush_sub *sub = NULL;
    int point = reference_check(pub, p_len);
    int want = point != HC_OK ? point : auth_len != HC_WEBPUSH_AUTH_BYTES ? HC_E_AUTH_LENGTH : HC_OK;
    int rc = hc_webpush_sub_new(pub, p_len, secret, auth_len, &sub);
    FUZZ_CHECK(rc == want, "sub_new(%zu, %zu) gave %d (%s), want %d (%s)", p_len, auth_len, rc,
               hc_strerror(rc), want, hc_strerror(want));
    FUZZ_CHECK((rc == HC_OK) == (sub != NULL), "sub_new: result %d with subscriber %p", rc,
               (void *)sub);
    if (sub != NULL) {
        uint8_t kept[HC_P256_PUBLIC_BYTES];
        hc_webpush_sub_public(sub, kept);
        FUZZ_CHECK(memcmp(kept, pub, sizeof kept) == 0, "the subscriber changed its p256dh");
    }
    hc_webpush_sub_free(sub);
    free(pub);
    free(secret);
}

static void check_ecdh(const uint8_t p[HC_P256_PUBLIC_BYTES])
{
    uint8_t *peer = fuzz_copy(p, HC_P256_PUBLIC_BYTES);
    uint8_t mine[32], theirs[32];
    int rc = hc_p256_ecdh(fixed_key, peer, mine);
    int valid = reference_check(peer, HC_P256_PUBLIC_BYTES) == HC_OK;
    FUZZ_CHECK((rc == HC_OK) == valid, "ecdh gave %d (%s) for a %s point", rc, hc_strerror(rc),
               valid ? "valid" : "invalid");
    int ossl = t_ossl_ecdh(fixed_pkey, peer, theirs);
    if (peer[0] == 0x04)
        FUZZ_CHECK(ossl == valid, "OpenSSL's ECDH %s an uncompressed point the core %s",
                   ossl ? "accepts" : "refuses", valid ? "accepts" : "refuses");
    if (valid)
        FUZZ_CHECK(memcmp(mine, theirs, sizeof mine) == 0, "ECDH secrets differ from OpenSSL's");
    free(peer);
}

static void check_verify(const uint8_t p[HC_P256_PUBLIC_BYTES], const uint8_t *rest,
                         size_t rest_len)
{
    size_t sig_len = rest_len < HC_ES256_SIGNATURE_BYTES ? rest_len : HC_ES256_SIGNATURE_BYTES;
    uint8_t *pub = fuzz_copy(p, HC_P256_PUBLIC_BYTES), *sig = fuzz_copy(rest, sig_len);
    uint8_t *msg = fuzz_copy(rest + sig_len, rest_len - sig_len);
    int rc = hc_es256_verify(pub, HC_P256_PUBLIC_BYTES, msg, rest_len - sig_len, sig, sig_len);
    int point = reference_check(pub, HC_P256_PUBLIC_BYTES);
    if (point != HC_OK) {
        FUZZ_CHECK(rc == point, "verify with a bad point gave %d (%s), want %d", rc,
                   hc_strerror(rc), point);
    } else if (sig_len != HC_ES256_SIGNATURE_BYTES) {
        FUZZ_CHECK(rc == HC_E_SIGNATURE_LENGTH, "verify of a %zu-byte signature gave %d (%s)",
                   sig_len, rc, hc_strerror(rc));
    } else {
        FUZZ_CHECK(rc == HC_E_SIGNATURE_INVALID || rc == HC_OK, "verify gave %d (%s)", rc,
                   hc_strerror(rc));
    }
    free(pub);
    free(sig);
    free(msg);
}

static BIGNUM *bn_from_hex(const char *hex)
{
    BIGNUM *n = NULL;
    FUZZ_CHECK(BN_hex2bn(&n, hex) > 0, "BN_hex2bn failed");
    return n;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_init();
    field_p = bn_from_hex("FFFFFFFF00000001000000000000000000000000FFFFFFFFFFFFFFFFFFFFFFFF");
    curve_b = bn_from_hex("5AC635D8AA3A93E7B3EBBD55769886BC651D06B0CC53B0F63BCE3C3E27D2604B");
    bn = BN_CTX_new();
    uint8_t scalar[HC_P256_PRIVATE_BYTES], pub[HC_P256_PUBLIC_BYTES];
    for (size_t i = 0; i < sizeof scalar; i++) scalar[i] = (uint8_t)(0x11 * (i % 15 + 1));
    FUZZ_CHECK(bn != NULL && hc_p256_key_from_raw(scalar, sizeof scalar, &fixed_key) == HC_OK,
               "set-up failed");
    hc_p256_key_public(fixed_key, pub);
    fixed_pkey = t_p256_pkey(scalar, pub);
    FUZZ_CHECK(fixed_pkey != NULL, "OpenSSL refused the fixed key");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_point(data, size);
    size_t p_len = size < HC_P256_PUBLIC_BYTES ? size : HC_P256_PUBLIC_BYTES;
    check_subscriber(data, p_len, data + p_len, size - p_len);
    if (size >= HC_P256_PUBLIC_BYTES) {
        check_ecdh(data);
        check_verify(data, data + HC_P256_PUBLIC_BYTES, size - HC_P256_PUBLIC_BYTES);
    }
    return 0;
}
