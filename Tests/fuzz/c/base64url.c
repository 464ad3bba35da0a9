/*
 * base64url: hc_base64url_decode and hc_base64url_encode.
 *
 * Properties, for any bytes x:
 * - decode(x) agrees with a small reference decoder written here: the same
 *   verdict (HC_OK or HC_E_BASE64, nothing else) and the same bytes. The
 *   reference accepts only the URL-safe alphabet, correct '=' padding, lengths
 *   that are not 1 mod 4 and zero trailing bits, so decoding is one-to-one;
 * - when decode(x) succeeds, encode(decode(x)) is x without its padding: every
 *   accepted text is canonical;
 * - decode(encode(x)) == x, and the encoded text has
 *   hc_base64url_encoded_length(|x|) characters of the alphabet and a NUL;
 * - capacities: decoding valid text into one byte less than it needs is
 *   HC_E_BUFFER_TOO_SMALL with the needed size; malformed text is reported as
 *   HC_E_BASE64 whatever the capacity, except that text whose only fault is its
 *   trailing bits may be reported as too small first; encoding into the exact
 *   length without room for the NUL is HC_E_BUFFER_TOO_SMALL.
 */
#include "fuzz.h"

static int alphabet_value(uint8_t c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '-') return 62;
    if (c == '_') return 63;
    return -1;
}

enum { REF_OK, REF_FORM, REF_TRAILING_BITS };

/* Reference decoder; out needs 3 * size / 4 + 3 bytes. REF_FORM: padding,
 * length or a character is wrong; REF_TRAILING_BITS: only the unused low bits
 * of the last character are not zero. */
static int reference_decode(const uint8_t *in, size_t size, uint8_t *out, size_t *out_len)
{
    size_t n = size, pad = 0;
    while (n > 0 && in[n - 1] == '=') {
        n--;
        pad++;
    }
    if (pad > 0 && (pad > 2 || size % 4 != 0)) return REF_FORM;
    if (n % 4 == 1) return REF_FORM;
    for (size_t i = 0; i < n; i++)
        if (alphabet_value(in[i]) < 0) return REF_FORM;
    uint32_t acc = 0;
    unsigned bits = 0;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        acc = (acc << 6) | (uint32_t)alphabet_value(in[i]);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (uint8_t)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    *out_len = o;
    return acc != 0 ? REF_TRAILING_BITS : REF_OK;
}

static void check_decode(const uint8_t *data, size_t size)
{
    const char *text = (const char *)fuzz_copy(data, size);
    uint8_t *want = malloc(3 * size / 4 + 3);
    uint8_t *got = malloc(size + 1);
    FUZZ_CHECK(want != NULL && got != NULL, "out of memory");
    size_t want_len = 0;
    int ref = reference_decode(data, size, want, &want_len);

    size_t got_len = size + 1;
    int rc = hc_base64url_decode(text, size, got, &got_len);
    FUZZ_CHECK(rc == (ref == REF_OK ? HC_OK : HC_E_BASE64),
               "decode of %zu bytes gave %d (%s), the reference %s", size, rc, hc_strerror(rc),
               ref == REF_OK ? "accepts it" : "refuses it");
    if (rc == HC_OK) {
        FUZZ_CHECK(got_len == want_len && (want_len == 0 || memcmp(got, want, want_len) == 0),
                   "decode gave %zu bytes, the reference %zu or other bytes", got_len, want_len);

        /* Canonical: encoding the result gives the input back, padding removed. */
        size_t unpadded = size;
        while (unpadded > 0 && data[unpadded - 1] == '=') unpadded--;
        char *again = malloc(unpadded + 1);
        size_t again_len = unpadded + 1;
        FUZZ_CHECK(again != NULL, "out of memory");
        FUZZ_CHECK(hc_base64url_encode(got, got_len, again, &again_len) == HC_OK &&
                       again_len == unpadded && memcmp(again, data, unpadded) == 0,
                   "encode(decode(x)) is not x without padding (%zu vs %zu characters)",
                   again_len, unpadded);
        free(again);
    }

    /* Capacity: exact size works, one byte less reports the size. */
    if (rc == HC_OK && got_len > 0) {
        size_t exact = got_len;
        FUZZ_CHECK(hc_base64url_decode(text, size, got, &exact) == HC_OK && exact == got_len,
                   "decode into exactly %zu bytes failed", got_len);
    }
    size_t small = ref == REF_OK ? want_len : 0;
    if (ref != REF_OK || small > 0) {
        small = small > 0 ? small - 1 : 0;
        size_t cap = small;
        int rc_small = hc_base64url_decode(text, size, small > 0 ? got : NULL, &cap);
        if (ref == REF_OK) {
            FUZZ_CHECK(rc_small == HC_E_BUFFER_TOO_SMALL && cap == want_len,
                       "decode into %zu of %zu bytes gave %d, size %zu", small, want_len,
                       rc_small, cap);
        } else if (ref == REF_FORM) {
            FUZZ_CHECK(rc_small == HC_E_BASE64, "malformed text into no room gave %d (%s)",
                       rc_small, hc_strerror(rc_small));
        } else {
            FUZZ_CHECK(rc_small == HC_E_BASE64 || rc_small == HC_E_BUFFER_TOO_SMALL,
                       "text with trailing bits into no room gave %d (%s)", rc_small,
                       hc_strerror(rc_small));
        }
    }
    free(want);
    free(got);
    free((void *)text);
}

static void check_encode(const uint8_t *data, size_t size)
{
    size_t need = hc_base64url_encoded_length(size);
    FUZZ_CHECK(need == (size + 2) / 3 * 4 - (size % 3 == 0 ? 0 : 3 - size % 3),
               "encoded length %zu for %zu bytes", need, size);
    char *text = malloc(need + 1);
    FUZZ_CHECK(text != NULL, "out of memory");
    size_t len = need;
    FUZZ_CHECK(hc_base64url_encode(data, size, text, &len) == HC_E_BUFFER_TOO_SMALL &&
                   len == need + 1,
               "encode without room for the NUL: size %zu, want %zu", len, need + 1);
    len = need + 1;
    FUZZ_CHECK(hc_base64url_encode(data, size, text, &len) == HC_OK && len == need &&
                   text[need] == '\0',
               "encode of %zu bytes wrote %zu characters, want %zu", size, len, need);
    for (size_t i = 0; i < need; i++)
        FUZZ_CHECK(alphabet_value((uint8_t)text[i]) >= 0, "encode wrote 0x%02x at %zu",
                   (unsigned)(uint8_t)text[i], i);

    uint8_t *back = malloc(size + 1);
    size_t back_len = size;
    FUZZ_CHECK(back != NULL, "out of memory");
    FUZZ_CHECK(hc_base64url_decode(text, need, back, &back_len) == HC_OK && back_len == size &&
                   (size == 0 || memcmp(back, data, size) == 0),
               "decode(encode(b)) != b for %zu bytes", size);
    free(back);
    free(text);
}

FUZZ_INITIALIZE_CORE

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_decode(data, size);
    check_encode(data, size);
    return 0;
}
