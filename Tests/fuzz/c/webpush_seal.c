/*
 * webpush_seal: RFC 8291 record sealing with fuzzed sizes, keys and salts,
 * opened by the independent EVP-only receiver of the C tests
 * (t_webpush_open in Tests/CCore/test_ossl.c). The core has no Web Push
 * decrypt of its own.
 *
 * Input: a 16-bit body size selector, the user agent's scalar (32), auth
 * (16), salt (16), the ephemeral scalar (32), then the plaintext.
 *
 * Properties:
 * - hc_webpush_seal_with_keys refuses a body size outside 0 or 104..4096
 *   (HC_E_BODY_SIZE), then a plaintext over hc_webpush_max_plaintext
 *   (HC_E_PLAINTEXT_TOO_LARGE), then an ephemeral scalar of 0 or >= n; one
 *   byte short of room is HC_E_BUFFER_TOO_SMALL with the needed size;
 * - a body is hc_webpush_sealed_length bytes (body_size when padded), starts
 *   with the salt, rs = 4096, idlen = 65 and the ephemeral public key, is the
 *   same for the same keys, and the receiver opens it to the plaintext;
 * - hc_webpush_seal (fresh key and salt) gives a body of the same length that
 *   also opens to the plaintext, under a different salt.
 */
#include "fuzz.h"
#include "test.h"

enum { HEAD = 2 + 32 + 16 + 16 + 32 };

static hc_sealer *sealer;

static int expected_rc(size_t pt_len, size_t body_size)
{
    if (body_size != 0 && (body_size < 104 || body_size > HC_WEBPUSH_MAX_BODY))
        return HC_E_BODY_SIZE;
    size_t max = (body_size != 0 ? body_size : HC_WEBPUSH_MAX_BODY) - HC_WEBPUSH_OVERHEAD;
    return pt_len > max ? HC_E_PLAINTEXT_TOO_LARGE : HC_OK;
}

static void check_body(EVP_PKEY *ua, const uint8_t auth[16], const uint8_t *body, size_t len,
                       const uint8_t *pt, size_t pt_len)
{
    uint8_t *opened = malloc(len);
    size_t opened_len = 0;
    uint32_t rs = 0;
    unsigned idlen = 0;
    FUZZ_CHECK(opened != NULL, "out of memory");
    int stage = t_webpush_open(ua, auth, body, len, opened, &opened_len, &rs, &idlen);
    FUZZ_CHECK(stage == 0, "the receiver cannot open the body (stage %d)", stage);
    FUZZ_CHECK(rs == T_RECORD_SIZE && idlen == HC_P256_PUBLIC_BYTES,
               "header rs %u idlen %u", rs, idlen);
    FUZZ_CHECK(opened_len == pt_len && (pt_len == 0 || memcmp(opened, pt, pt_len) == 0),
               "opened %zu bytes, sealed %zu", opened_len, pt_len);
    FUZZ_CHECK(hc_p256_public_check(body + 21, HC_P256_PUBLIC_BYTES) == HC_OK,
               "the keyid is not a valid point");
    free(opened);
}

static void seal(const uint8_t *data, size_t size)
{
    size_t body_size = (size_t)(data[0] << 8 | data[1]);
    body_size = body_size & 0x8000 ? 0 : body_size % 4200;
    const uint8_t *ua_scalar = data + 2, *auth = data + 34, *salt = data + 50, *eph = data + 66;
    const uint8_t *pt = data + HEAD;
    size_t pt_len = size - HEAD;

    hc_p256_key *ua_key = NULL, *eph_key = NULL;
    if (hc_p256_key_from_raw(ua_scalar, 32, &ua_key) != HC_OK) return;
    uint8_t ua_pub[HC_P256_PUBLIC_BYTES], eph_pub[HC_P256_PUBLIC_BYTES];
    hc_p256_key_public(ua_key, ua_pub);
    hc_webpush_sub *sub = NULL;
    FUZZ_CHECK(hc_webpush_sub_new(ua_pub, sizeof ua_pub, auth, 16, &sub) == HC_OK,
               "a generated public key is refused");
    EVP_PKEY *ua = t_p256_pkey(ua_scalar, ua_pub);
    FUZZ_CHECK(ua != NULL, "OpenSSL refused the user agent key");

    int want = expected_rc(pt_len, body_size);
    int eph_rc = hc_p256_key_from_raw(eph, 32, &eph_key);
    if (want == HC_OK && eph_rc != HC_OK) want = HC_E_PRIVATE_KEY_RANGE;
    size_t total = hc_webpush_sealed_length(pt_len, body_size);
    FUZZ_CHECK((total != 0) == (expected_rc(pt_len, body_size) == HC_OK),
               "sealed_length(%zu, %zu) = %zu", pt_len, body_size, total);

    size_t cap = total + 1;
    uint8_t *body = malloc(cap), *again = malloc(cap);
    FUZZ_CHECK(body != NULL && again != NULL, "out of memory");
    size_t len = cap;
    int rc = hc_webpush_seal_with_keys(sealer, sub, eph, salt, pt, pt_len, body_size, body, &len);
    FUZZ_CHECK(rc == want, "seal(%zu bytes, body %zu) gave %d (%s), want %d (%s)", pt_len,
               body_size, rc, hc_strerror(rc), want, hc_strerror(want));
    if (rc == HC_OK) {
        FUZZ_CHECK(len == total && (body_size == 0 || len == body_size),
                   "sealed %zu bytes, want %zu", len, total);
        FUZZ_CHECK(memcmp(body, salt, 16) == 0, "the header does not start with the salt");
        hc_p256_key_public(eph_key, eph_pub);
        FUZZ_CHECK(memcmp(body + 21, eph_pub, sizeof eph_pub) == 0,
                   "the keyid is not the ephemeral public key");
        check_body(ua, auth, body, len, pt, pt_len);

        size_t small = total - 1;
        rc = hc_webpush_seal_with_keys(sealer, sub, eph, salt, pt, pt_len, body_size, again, &small);
        FUZZ_CHECK(rc == HC_E_BUFFER_TOO_SMALL && small == total,
                   "seal one byte short gave %d, size %zu", rc, small);
        size_t again_len = total;
        FUZZ_CHECK(hc_webpush_seal_with_keys(sealer, sub, eph, salt, pt, pt_len, body_size, again,
                                             &again_len) == HC_OK &&
                       again_len == total && memcmp(again, body, total) == 0,
                   "the same keys sealed different bodies");

        size_t fresh_len = total;
        rc = hc_webpush_seal(sealer, sub, pt, pt_len, body_size, again, &fresh_len);
        FUZZ_CHECK(rc == HC_OK && fresh_len == total, "a fresh seal gave %d, %zu bytes", rc,
                   fresh_len);
        FUZZ_CHECK(memcmp(again, body, 16) != 0, "a fresh seal reused the salt");
        check_body(ua, auth, again, fresh_len, pt, pt_len);
    }
    free(body);
    free(again);
    EVP_PKEY_free(ua);
    hc_webpush_sub_free(sub);
    hc_p256_key_free(eph_key);
    hc_p256_key_free(ua_key);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_init();
    FUZZ_CHECK(hc_sealer_new(T_RECORD_SIZE, &sealer) == HC_OK, "no sealer");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < HEAD) return 0;
    uint8_t *copy = fuzz_copy(data, size);
    seal(copy, size);
    free(copy);
    return 0;
}
