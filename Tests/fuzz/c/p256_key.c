/*
 * p256_key: private key import, hc_p256_key_from_text (PEM or base64url raw,
 * whitespace around) and hc_p256_key_from_raw.
 *
 * Properties, for any bytes x:
 * - from_raw(x) succeeds exactly when |x| = 32 and 0 < x < n (the group order,
 *   compared here byte by byte); otherwise HC_E_PRIVATE_KEY_LENGTH or
 *   HC_E_PRIVATE_KEY_RANGE, the length first;
 * - from_text(x) trims " \t\r\n" and then behaves as from_pem when the text
 *   starts with "-----" (same result code, same key), and otherwise as
 *   from_raw(base64url_decode(text)): malformed base64url is HC_E_BASE64 and a
 *   decoded length other than 32 is HC_E_PRIVATE_KEY_LENGTH, never success;
 * - every key imported has a public point that hc_p256_public_check accepts,
 *   exports to a PEM (with the documented capacity contract) that imports again
 *   to the same key, and signs a message that verifies under its public point.
 */
#include "fuzz.h"

static const uint8_t order[32] = {
    0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xbc, 0xe6, 0xfa, 0xad, 0xa7, 0x17, 0x9e, 0x84, 0xf3, 0xb9, 0xca, 0xc2, 0xfc, 0x63, 0x25, 0x51,
};

static int scalar_in_range(const uint8_t d[32])
{
    int nonzero = 0;
    for (size_t i = 0; i < 32; i++) nonzero |= d[i];
    return nonzero && memcmp(d, order, 32) < 0;
}

static int is_trim_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

static void check_raw(const uint8_t *data, size_t size)
{
    uint8_t *raw = fuzz_copy(data, size);
    hc_p256_key *key = NULL;
    int rc = hc_p256_key_from_raw(raw, size, &key);
    int want = size != HC_P256_PRIVATE_BYTES ? HC_E_PRIVATE_KEY_LENGTH
               : scalar_in_range(raw)        ? HC_OK
                                             : HC_E_PRIVATE_KEY_RANGE;
    FUZZ_CHECK(rc == want, "from_raw of %zu bytes gave %d (%s), want %d (%s)", size, rc,
               hc_strerror(rc), want, hc_strerror(want));
    if (key != NULL) {
        uint8_t pub[HC_P256_PUBLIC_BYTES];
        fuzz_check_p256_key(key, pub);
    }
    hc_p256_key_free(key);
    free(raw);
}

static void check_text(const uint8_t *data, size_t size)
{
    char *text = (char *)fuzz_copy(data, size);
    hc_p256_key *key = NULL;
    int rc = hc_p256_key_from_text(text, size, &key);

    const char *t = text;
    size_t n = size;
    while (n > 0 && is_trim_space(*t)) {
        t++;
        n--;
    }
    while (n > 0 && is_trim_space(t[n - 1])) n--;

    hc_p256_key *expected = NULL;
    int want;
    if (n >= 5 && memcmp(t, "-----", 5) == 0) {
        want = hc_p256_key_from_pem(t, n, &expected);
        FUZZ_CHECK(rc == want, "from_text gave %d (%s), from_pem of the trimmed text %d (%s)",
                   rc, hc_strerror(rc), want, hc_strerror(want));
        FUZZ_CHECK(rc == HC_OK || rc == HC_E_PEM || rc == HC_E_KEY_TYPE ||
                       rc == HC_E_PRIVATE_KEY_RANGE,
                   "PEM import gave %d (%s)", rc, hc_strerror(rc));
    } else {
        uint8_t *raw = malloc(n + 1);
        size_t raw_len = n + 1;
        FUZZ_CHECK(raw != NULL, "out of memory");
        int dec = hc_base64url_decode(t, n, raw, &raw_len);
        if (dec != HC_OK) {
            /* Long text may be refused for its length before its last character is read. */
            FUZZ_CHECK(rc == HC_E_BASE64 || (rc == HC_E_PRIVATE_KEY_LENGTH && n > 64),
                       "from_text of malformed base64url (%zu characters) gave %d (%s)", n, rc,
                       hc_strerror(rc));
        } else if (raw_len != HC_P256_PRIVATE_BYTES) {
            FUZZ_CHECK(rc == HC_E_PRIVATE_KEY_LENGTH,
                       "from_text of %zu decoded bytes gave %d (%s)", raw_len, rc,
                       hc_strerror(rc));
        } else {
            want = hc_p256_key_from_raw(raw, raw_len, &expected);
            FUZZ_CHECK(rc == want, "from_text gave %d (%s), from_raw of its bytes %d (%s)", rc,
                       hc_strerror(rc), want, hc_strerror(want));
        }
        hc_wipe(raw, n + 1);
        free(raw);
    }
    FUZZ_CHECK(rc != HC_OK || key != NULL, "success without a key");
    FUZZ_CHECK(rc == HC_OK || key == NULL, "a key with an error");
    if (key != NULL) {
        uint8_t pub[HC_P256_PUBLIC_BYTES], pub_expected[HC_P256_PUBLIC_BYTES];
        fuzz_check_p256_key(key, pub);
        FUZZ_CHECK(expected != NULL, "from_text made a key its reference path did not");
        hc_p256_key_public(expected, pub_expected);
        FUZZ_CHECK(memcmp(pub, pub_expected, sizeof pub) == 0,
                   "from_text and its reference path made different keys");
    }
    hc_p256_key_free(expected);
    hc_p256_key_free(key);
    free(text);
}

FUZZ_INITIALIZE_CORE

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_raw(data, size);
    check_text(data, size);
    return 0;
}
