/*
 * secretbox: the at-rest format of stored secrets, hc_secretbox_open on
 * bytes read back from the store, and hc_secretbox_seal.
 *
 * The input is a length byte L, then ad = the next L % 33 bytes, then b.
 *
 * Properties:
 * - open(b) is HC_E_SEALED_FORMAT when b is shorter than the overhead or its
 *   version is not 1; otherwise HC_E_DECRYPT or, for a genuine box (the seeds
 *   hold some, sealed with the key below), HC_OK with |b| - 41 bytes;
 *   one byte short of room is HC_E_BUFFER_TOO_SMALL with the needed size;
 * - open(seal(b)) == b with the same ad; a box is version 1 and |b| + 41
 *   bytes long; changing any one byte of it, dropping its last byte or
 *   changing the ad makes it fail (HC_E_DECRYPT, or HC_E_SEALED_FORMAT for the
 *   version byte and too short a box).
 */
#include "fuzz.h"

static const uint8_t key[HC_SECRETBOX_KEY_BYTES] = "herald fuzz secretbox key 32 by";

static void check_open(const uint8_t *ad, size_t ad_len, const uint8_t *box, size_t box_len)
{
    size_t cap = box_len + 1;
    uint8_t *out = malloc(cap);
    FUZZ_CHECK(out != NULL, "out of memory");
    size_t len = cap;
    int rc = hc_secretbox_open(key, ad, ad_len, box, box_len, out, &len);
    if (box_len < HC_SECRETBOX_OVERHEAD || box[0] != 0x01) {
        FUZZ_CHECK(rc == HC_E_SEALED_FORMAT, "open of %zu bytes, version %d, gave %d (%s)",
                   box_len, box_len > 0 ? box[0] : -1, rc, hc_strerror(rc));
    } else {
        FUZZ_CHECK(rc == HC_OK || rc == HC_E_DECRYPT, "open gave %d (%s)", rc, hc_strerror(rc));
        size_t need = box_len - HC_SECRETBOX_OVERHEAD;
        if (rc == HC_OK) FUZZ_CHECK(len == need, "open gave %zu bytes, want %zu", len, need);
        if (need > 0) {
            size_t small = need - 1;
            rc = hc_secretbox_open(key, ad, ad_len, box, box_len, out, &small);
            FUZZ_CHECK(rc == HC_E_BUFFER_TOO_SMALL && small == need,
                       "open into %zu of %zu bytes gave %d, size %zu", need - 1, need, rc, small);
        }
    }
    free(out);
}

static int opens(const uint8_t *ad, size_t ad_len, const uint8_t *box, size_t box_len)
{
    uint8_t *out = malloc(box_len + 1);
    size_t len = box_len + 1;
    FUZZ_CHECK(out != NULL, "out of memory");
    int rc = hc_secretbox_open(key, ad, ad_len, box, box_len, out, &len);
    free(out);
    return rc;
}

static void check_round_trip(const uint8_t *ad, size_t ad_len, const uint8_t *pt, size_t pt_len,
                             size_t flip)
{
    size_t box_len = pt_len + HC_SECRETBOX_OVERHEAD;
    uint8_t *box = malloc(box_len), *back = malloc(pt_len + 1);
    FUZZ_CHECK(box != NULL && back != NULL, "out of memory");
    size_t len = box_len;
    FUZZ_CHECK(hc_secretbox_seal(key, ad, ad_len, pt, pt_len, box, &len) == HC_OK &&
                   len == box_len && box[0] == 0x01,
               "seal of %zu bytes wrote %zu", pt_len, len);
    len = pt_len;
    int rc = hc_secretbox_open(key, ad, ad_len, box, box_len, pt_len > 0 ? back : NULL, &len);
    FUZZ_CHECK(rc == HC_OK && len == pt_len && (pt_len == 0 || memcmp(back, pt, pt_len) == 0),
               "open(seal(b)) != b: %d (%s), %zu bytes", rc, hc_strerror(rc), len);

    size_t at = flip % box_len;
    box[at] ^= (uint8_t)(1u << (flip / box_len % 8));
    rc = opens(ad, ad_len, box, box_len);
    FUZZ_CHECK(rc == (at == 0 ? HC_E_SEALED_FORMAT : HC_E_DECRYPT),
               "a box with byte %zu changed gave %d (%s)", at, rc, hc_strerror(rc));
    box[at] ^= (uint8_t)(1u << (flip / box_len % 8));

    rc = opens(ad, ad_len, box, box_len - 1);
    FUZZ_CHECK(rc == (box_len - 1 < HC_SECRETBOX_OVERHEAD ? HC_E_SEALED_FORMAT : HC_E_DECRYPT),
               "a box without its last byte gave %d (%s)", rc, hc_strerror(rc));

    uint8_t *other = malloc(ad_len + 1);
    FUZZ_CHECK(other != NULL, "out of memory");
    if (ad_len > 0) memcpy(other, ad, ad_len);
    other[ad_len] = 0x00;
    rc = opens(other, ad_len + 1, box, box_len);
    FUZZ_CHECK(rc == HC_E_DECRYPT, "a box opened with longer ad gave %d (%s)", rc, hc_strerror(rc));
    free(other);
    free(box);
    free(back);
}

FUZZ_INITIALIZE_CORE

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) return 0;
    size_t ad_len = data[0] % 33;
    if (ad_len > size - 1) ad_len = size - 1;
    uint8_t *ad = fuzz_copy(data + 1, ad_len);
    uint8_t *rest = fuzz_copy(data + 1 + ad_len, size - 1 - ad_len);
    size_t rest_len = size - 1 - ad_len;
    check_open(ad, ad_len, rest, rest_len);
    check_round_trip(ad, ad_len, rest, rest_len, size * 131 + data[0]);
    free(ad);
    free(rest);
    return 0;
}
