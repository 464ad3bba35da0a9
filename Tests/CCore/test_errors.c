/*
 * test_errors.c - every bad input is refused with its own result code, and
 * hc_strerror covers every code.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <openssl/rsa.h>

#include "test.h"

/* RFC 8291's user agent key and auth secret: a valid subscription. */
static const char ua_public_b64[] =
    "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4";
static const char auth_b64[] = "BTBZMqHH6r4Tts7J_aSIgg";

/* P-256 prime p and order n, big-endian. */
static const char p_hex[] = "ffffffff00000001000000000000000000000000ffffffffffffffffffffffff";
static const char n_hex[] = "ffffffff00000000ffffffffffffffffbce6faada7179e84f3b9cac2fc632551";
/* (0, y0) is on P-256; (p, y0) encodes the same point with x not reduced. */
static const char y0_hex[] = "66485c780e2f83d72433bd5d84a06bb6541c2af31dae871728bf856a174f93f4";

static void load_hex(const char *hex, uint8_t *out, size_t len) {
    size_t n = 0;
    uint8_t *p = t_unhex(hex, &n);
    if (p == NULL || n != len) {
        abort();
    }
    memcpy(out, p, len);
    free(p);
}

static void valid_subscription(uint8_t pub[65], uint8_t auth[16]) {
    if (t_b64url_decode(ua_public_b64, pub, 65) != 65 || t_b64url_decode(auth_b64, auth, 16) != 16) {
        abort();
    }
}

/* ---- base64url ---- */

typedef struct {
    const char *in;
    size_t len; /* 0 = strlen */
    int rc;
    const char *out; /* expected bytes when rc == HC_OK */
    size_t out_len;
} b64_case;

static const b64_case b64_cases[] = {
    {"", 0, HC_OK, "", 0},
    {"YQ", 0, HC_OK, "a", 1},
    {"YQ==", 0, HC_OK, "a", 1},
    {"YWI", 0, HC_OK, "ab", 2},
    {"YWI=", 0, HC_OK, "ab", 2},
    {"YWJj", 0, HC_OK, "abc", 3},
    {"-_8", 0, HC_OK, "\xfb\xff", 2},
    {"YWJjZA", 0, HC_OK, "abcd", 4},
    {"YWJjZA==", 0, HC_OK, "abcd", 4},
    /* bad characters */
    {"YW$j", 0, HC_E_BASE64, NULL, 0},
    {"YW+j", 0, HC_E_BASE64, NULL, 0},
    {"YW/j", 0, HC_E_BASE64, NULL, 0},
    {"YW.j", 0, HC_E_BASE64, NULL, 0},
    {"YW\xc3\xa9j", 0, HC_E_BASE64, NULL, 0},
    {"YW\0j", 4, HC_E_BASE64, NULL, 0},
    /* bytes >= 0x80 in a valid length: libsodium 1.0.18 alone reads them as '_' */
    {"YW\xc3\xa9", 0, HC_E_BASE64, NULL, 0},
    {"\xff\xff\xff\xff", 0, HC_E_BASE64, NULL, 0},
    {"YWJj\x80\x80\x80\x80", 0, HC_E_BASE64, NULL, 0},
    {"\xbfWJj", 0, HC_E_BASE64, NULL, 0},
    /* impossible lengths (1 mod 4) */
    {"Y", 0, HC_E_BASE64, NULL, 0},
    {"YWJjZ", 0, HC_E_BASE64, NULL, 0},
    {"YWJjZGVmZ", 0, HC_E_BASE64, NULL, 0},
    /* wrong padding */
    {"YQ=", 0, HC_E_BASE64, NULL, 0},
    {"YQ===", 0, HC_E_BASE64, NULL, 0},
    {"YWI==", 0, HC_E_BASE64, NULL, 0},
    {"YWJj=", 0, HC_E_BASE64, NULL, 0},
    {"YWJj====", 0, HC_E_BASE64, NULL, 0},
    {"=", 0, HC_E_BASE64, NULL, 0},
    {"====", 0, HC_E_BASE64, NULL, 0},
    {"=YWJ", 0, HC_E_BASE64, NULL, 0},
    {"Y=Q=", 0, HC_E_BASE64, NULL, 0},
    {"YQ==YQ==", 0, HC_E_BASE64, NULL, 0},
    /* whitespace anywhere */
    {"YW Jj", 0, HC_E_BASE64, NULL, 0},
    {" YWJj", 0, HC_E_BASE64, NULL, 0},
    {"YWJj ", 0, HC_E_BASE64, NULL, 0},
    {"YWJj\n", 0, HC_E_BASE64, NULL, 0},
    {"YW\r\nJj", 0, HC_E_BASE64, NULL, 0},
    {"YWJj\t", 0, HC_E_BASE64, NULL, 0},
};

void test_errors_encoding(void) {
    for (size_t i = 0; i < sizeof b64_cases / sizeof b64_cases[0]; i++) {
        const b64_case *c = &b64_cases[i];
        size_t in_len = c->len != 0 ? c->len : strlen(c->in);
        uint8_t out[16];
        size_t len = sizeof out;
        int rc = hc_base64url_decode(c->in, in_len, out, &len);
        CHECK(rc == c->rc, "hc_base64url_decode case %zu (\"%s\"): got %d (%s), want %d (%s)", i,
              c->in, rc, hc_strerror(rc), c->rc, hc_strerror(c->rc));
        if (c->rc == HC_OK && rc == HC_OK) {
            CHECK(len == c->out_len && memcmp(out, c->out, len) == 0,
                  "hc_base64url_decode(\"%s\") gave %zu bytes, want %zu", c->in, len, c->out_len);
        }
    }
    /* The length bounds the input: a valid prefix decodes even when more follows. */
    uint8_t out[16];
    size_t len = sizeof out;
    CHECK_RC(hc_base64url_decode("YWJj$$$$", 4, out, &len), HC_OK);
    CHECK(len == 3 && memcmp(out, "abc", 3) == 0, "decode honours in_len");

    /* Output capacity. */
    len = 2;
    CHECK_RC(hc_base64url_decode("YWJj", 4, out, &len), HC_E_BUFFER_TOO_SMALL);
    CHECK(len == 3, "decode: needed size %zu, want 3", len);
    char text[16];
    len = 4; /* "YWJj" needs 4 characters + NUL */
    CHECK_RC(hc_base64url_encode((const uint8_t *)"abc", 3, text, &len), HC_E_BUFFER_TOO_SMALL);
    CHECK(len == 5, "hc_base64url_encode: needed capacity reported as %zu, want 5 (4 + NUL)", len);
    len = 5;
    CHECK_RC(hc_base64url_encode((const uint8_t *)"abc", 3, text, &len), HC_OK);
    CHECK(len == 4 && strcmp(text, "YWJj") == 0, "hc_base64url_encode(\"abc\") wrote %zu", len);
}

/* ---- keys ---- */

static void check_public(const uint8_t *pub, size_t len, int want, const char *what) {
    int rc = hc_p256_public_check(pub, len);
    CHECK(rc == want, "hc_p256_public_check(%s): got %d (%s), want %d (%s)", what, rc,
          hc_strerror(rc), want, hc_strerror(want));
    uint8_t auth[16] = {1};
    hc_webpush_sub *sub = NULL;
    rc = hc_webpush_sub_new(pub, len, auth, 16, &sub);
    CHECK(rc == want, "hc_webpush_sub_new(%s): got %d (%s), want %d (%s)", what, rc,
          hc_strerror(rc), want, hc_strerror(want));
    hc_webpush_sub_free(sub);
}

static char *pem_of(EVP_PKEY *pkey) {
    char *pem = pkey != NULL ? t_pem_pkcs8(pkey) : NULL;
    CHECK(pem != NULL, "OpenSSL could not write a test PEM");
    return pem;
}

static void check_from_pem(const char *pem, int want, const char *what) {
    if (pem == NULL) {
        return;
    }
    hc_p256_key *key = NULL;
    int rc = hc_p256_key_from_pem(pem, strlen(pem), &key);
    CHECK(rc == want, "hc_p256_key_from_pem(%s): got %d (%s), want %d (%s)", what, rc,
          hc_strerror(rc), want, hc_strerror(want));
    CHECK(rc != HC_OK ? key == NULL : key != NULL, "hc_p256_key_from_pem(%s): *out on failure",
          what);
    hc_p256_key_free(rc == HC_OK ? key : NULL);
}

static void check_rsa_from_pem(const char *pem, int want, const char *what) {
    if (pem == NULL) {
        return;
    }
    hc_rsa_key *key = NULL;
    int rc = hc_rsa_key_from_pem(pem, strlen(pem), &key);
    CHECK(rc == want, "hc_rsa_key_from_pem(%s): got %d (%s), want %d (%s)", what, rc,
          hc_strerror(rc), want, hc_strerror(want));
    hc_rsa_key_free(rc == HC_OK ? key : NULL);
}

void test_errors_keys(void) {
    uint8_t pub[66] = {0}, auth[16];
    valid_subscription(pub, auth);
    pub[65] = 0x01;
    check_public(pub, 65, HC_OK, "RFC 8291 ua_public");
    check_public(pub, 64, HC_E_PUBLIC_KEY_LENGTH, "64 bytes");
    check_public(pub, 66, HC_E_PUBLIC_KEY_LENGTH, "66 bytes");
    check_public(pub, 33, HC_E_PUBLIC_KEY_LENGTH, "33 bytes");
    check_public(pub, 0, HC_E_PUBLIC_KEY_LENGTH, "0 bytes");

    uint8_t bad[65];
    memcpy(bad, pub, 65);
    bad[0] = 0x03;
    check_public(bad, 65, HC_E_PUBLIC_KEY_FORMAT, "65 bytes starting 0x03");
    bad[0] = 0x02;
    check_public(bad, 65, HC_E_PUBLIC_KEY_FORMAT, "65 bytes starting 0x02");
    bad[0] = 0x06; /* hybrid form */
    check_public(bad, 65, HC_E_PUBLIC_KEY_FORMAT, "65 bytes starting 0x06");
    bad[0] = 0x00;
    check_public(bad, 65, HC_E_PUBLIC_KEY_FORMAT, "65 bytes starting 0x00");

    /* Valid x, y + 1. */
    memcpy(bad, pub, 65);
    for (int i = 64; i >= 33; i--) {
        if (++bad[i] != 0) {
            break;
        }
    }
    check_public(bad, 65, HC_E_PUBLIC_KEY_NOT_ON_CURVE, "valid x, y + 1");
    /* Coordinates outside the field. */
    uint8_t p[32], y0[32];
    load_hex(p_hex, p, 32);
    load_hex(y0_hex, y0, 32);
    bad[0] = 0x04;
    memset(bad + 1, 0, 32);
    memcpy(bad + 33, y0, 32);
    check_public(bad, 65, HC_OK, "(0, y0), a point with x = 0");
    memcpy(bad + 1, p, 32);
    check_public(bad, 65, HC_E_PUBLIC_KEY_NOT_ON_CURVE, "(p, y0): x = p, congruent to a point");
    memcpy(bad + 1, pub + 1, 32);
    memcpy(bad + 33, p, 32);
    check_public(bad, 65, HC_E_PUBLIC_KEY_NOT_ON_CURVE, "valid x, y = p");
    memset(bad + 1, 0xFF, 64);
    check_public(bad, 65, HC_E_PUBLIC_KEY_NOT_ON_CURVE, "x = y = 2^256 - 1");
    memset(bad + 1, 0, 64);
    check_public(bad, 65, HC_E_PUBLIC_KEY_NOT_ON_CURVE, "(0, 0), the point at infinity's usual stand-in");

    /* Raw private keys. */
    hc_p256_key *key = NULL;
    uint8_t scalar[33] = {0};
    scalar[31] = 1;
    CHECK_RC(hc_p256_key_from_raw(scalar, 31, &key), HC_E_PRIVATE_KEY_LENGTH);
    CHECK_RC(hc_p256_key_from_raw(scalar, 33, &key), HC_E_PRIVATE_KEY_LENGTH);
    CHECK_RC(hc_p256_key_from_raw(scalar, 0, &key), HC_E_PRIVATE_KEY_LENGTH);
    memset(scalar, 0, sizeof scalar);
    CHECK_RC(hc_p256_key_from_raw(scalar, 32, &key), HC_E_PRIVATE_KEY_RANGE);
    load_hex(n_hex, scalar, 32);
    CHECK_RC(hc_p256_key_from_raw(scalar, 32, &key), HC_E_PRIVATE_KEY_RANGE);
    scalar[31]++; /* n + 1 */
    CHECK_RC(hc_p256_key_from_raw(scalar, 32, &key), HC_E_PRIVATE_KEY_RANGE);
    memset(scalar, 0xFF, 32);
    CHECK_RC(hc_p256_key_from_raw(scalar, 32, &key), HC_E_PRIVATE_KEY_RANGE);
    load_hex(n_hex, scalar, 32);
    scalar[31]--; /* n - 1 is the largest valid scalar */
    key = NULL;
    CHECK_RC(hc_p256_key_from_raw(scalar, 32, &key), HC_OK);
    hc_p256_key_free(key);
    key = NULL;
    memset(scalar, 0, 32);
    scalar[31] = 1; /* 1 is the smallest; its public key is the generator */
    CHECK_RC(hc_p256_key_from_raw(scalar, 32, &key), HC_OK);
    if (key != NULL) {
        uint8_t g[65];
        static const char gx_gy[] =
            "046b17d1f2e12c4247f8bce6e563a440f277037d812deb33a0f4a13945d898c296"
            "4fe342e2fe1a7f9b8ee7eb4a7c0f9e162bce33576b315ececbb6406837bf51f5";
        uint8_t want[65];
        load_hex(gx_gy, want, 65);
        hc_p256_key_public(key, g);
        CHECK_MEM(g, want, 65, "public key of scalar 1 is the generator");
    }
    hc_p256_key_free(key);

    /* PEM texts. */
    check_from_pem("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", HC_E_PEM,
                   "PEM with a broken body");
    check_from_pem("not a PEM at all", HC_E_PEM, "plain text");
    check_from_pem("-----BEGIN PRIVATE KEY-----\n", HC_E_PEM, "header only");
    EVP_PKEY *p256 = EVP_EC_gen("P-256");
    char *pem = pem_of(p256);
    if (pem != NULL) {
        char *cut = t_strndup(pem, strlen(pem) / 2);
        check_from_pem(cut, HC_E_PEM, "truncated PKCS#8 PEM");
        free(cut);
        char *flipped = t_strdup(pem);
        flipped[40] = flipped[40] == 'A' ? 'B' : 'A'; /* inside the base64 body */
        hc_p256_key *k2 = NULL;
        int rc = hc_p256_key_from_pem(flipped, strlen(flipped), &k2);
        CHECK(rc == HC_E_PEM || rc == HC_E_KEY_TYPE || rc == HC_E_PRIVATE_KEY_RANGE || rc == HC_OK,
              "hc_p256_key_from_pem(corrupted PEM): unexpected %d (%s)", rc, hc_strerror(rc));
        hc_p256_key_free(rc == HC_OK ? k2 : NULL);
        free(flipped);
    }
    char *pub_pem = p256 != NULL ? t_pem_public(p256) : NULL;
    check_from_pem(pub_pem, HC_E_PEM, "a PUBLIC KEY PEM");
    free(pub_pem);

    EVP_PKEY *rsa2048 = EVP_RSA_gen(2048);
    EVP_PKEY *rsa1024 = EVP_RSA_gen(1024);
    EVP_PKEY *p384 = EVP_EC_gen("P-384");
    EVP_PKEY *ed25519 = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
    char *rsa2048_pem = pem_of(rsa2048), *rsa1024_pem = pem_of(rsa1024);
    char *p384_pem = pem_of(p384), *ed_pem = pem_of(ed25519);
    check_from_pem(rsa2048_pem, HC_E_KEY_TYPE, "RSA-2048 PEM");
    check_from_pem(p384_pem, HC_E_KEY_TYPE, "P-384 PEM");
    check_from_pem(ed_pem, HC_E_KEY_TYPE, "Ed25519 PEM");
    check_from_pem(pem, HC_OK, "P-256 PEM");

    /* The same through hc_p256_key_from_text. */
    if (p384_pem != NULL) {
        hc_p256_key *k2 = NULL;
        CHECK_RC(hc_p256_key_from_text(p384_pem, strlen(p384_pem), &k2), HC_E_KEY_TYPE);
    }
    {
        hc_p256_key *k2 = NULL;
        char raw31[64];
        uint8_t zeros[32] = {0};
        t_b64url_encode(zeros, 31, raw31);
        int rc = hc_p256_key_from_text(raw31, strlen(raw31), &k2);
        CHECK(rc != HC_OK, "hc_p256_key_from_text accepted a 31-byte raw key");
        t_b64url_encode(zeros, 32, raw31);
        CHECK_RC(hc_p256_key_from_text(raw31, strlen(raw31), &k2), HC_E_PRIVATE_KEY_RANGE);
        rc = hc_p256_key_from_text("hello world", 11, &k2);
        CHECK(rc != HC_OK, "hc_p256_key_from_text accepted \"hello world\"");
    }

    /* RSA keys. */
    check_rsa_from_pem(pem, HC_E_RSA_KEY, "P-256 PEM");
    check_rsa_from_pem(rsa1024_pem, HC_E_RSA_KEY, "RSA-1024 PEM");
    check_rsa_from_pem("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", HC_E_PEM,
                       "broken PEM");
    check_rsa_from_pem(rsa2048_pem, HC_OK, "RSA-2048 PEM");

    free(pem);
    free(rsa2048_pem);
    free(rsa1024_pem);
    free(p384_pem);
    free(ed_pem);
    EVP_PKEY_free(p256);
    EVP_PKEY_free(rsa2048);
    EVP_PKEY_free(rsa1024);
    EVP_PKEY_free(p384);
    EVP_PKEY_free(ed25519);

    /* ES256 signature lengths. */
    uint8_t sig[65] = {0};
    const uint8_t *msg = (const uint8_t *)"msg";
    CHECK_RC(hc_es256_verify(pub, 65, msg, 3, sig, 63), HC_E_SIGNATURE_LENGTH);
    CHECK_RC(hc_es256_verify(pub, 65, msg, 3, sig, 65), HC_E_SIGNATURE_LENGTH);
    CHECK_RC(hc_es256_verify(pub, 65, msg, 3, sig, 0), HC_E_SIGNATURE_LENGTH);
    CHECK_RC(hc_es256_verify(pub, 65, msg, 3, sig, 64), HC_E_SIGNATURE_INVALID); /* r = s = 0 */
    CHECK(hc_es256_verify(pub, 64, msg, 3, sig, 64) != HC_OK, "verify with a 64-byte key");
}

/* ---- web push ---- */

void test_errors_webpush(void) {
    uint8_t pub[65], auth[17] = {0};
    valid_subscription(pub, auth);
    hc_webpush_sub *sub = NULL;
    CHECK_RC(hc_webpush_sub_new(pub, 65, auth, 15, &sub), HC_E_AUTH_LENGTH);
    CHECK_RC(hc_webpush_sub_new(pub, 65, auth, 17, &sub), HC_E_AUTH_LENGTH);
    CHECK_RC(hc_webpush_sub_new(pub, 65, auth, 0, &sub), HC_E_AUTH_LENGTH);
    CHECK_RC(hc_webpush_sub_new(pub, 65, auth, 16, &sub), HC_OK);
    hc_sealer *sealer = NULL;
    CHECK_RC(hc_sealer_new(T_RECORD_SIZE, &sealer), HC_OK);
    if (sub == NULL || sealer == NULL) {
        hc_webpush_sub_free(sub);
        hc_sealer_free(sealer);
        return;
    }
    static uint8_t pt[100001], out[8192];
    size_t len;

    /* Plaintext too large for the body. */
    size_t max2816 = hc_webpush_max_plaintext(T_BODY_SIZE);
    CHECK(max2816 == T_BODY_SIZE - HC_WEBPUSH_OVERHEAD,
          "hc_webpush_max_plaintext(2816) = %zu, want 2713", max2816);
    CHECK(hc_webpush_max_plaintext(HC_WEBPUSH_MAX_BODY) == 3993,
          "hc_webpush_max_plaintext(4096) = %zu, want 3993 (RFC 8291 §4)",
          hc_webpush_max_plaintext(HC_WEBPUSH_MAX_BODY));
    CHECK(hc_webpush_max_plaintext(104) == 1, "hc_webpush_max_plaintext(104) = %zu, want 1",
          hc_webpush_max_plaintext(104));
    len = sizeof out;
    CHECK_RC(hc_webpush_seal(sealer, sub, pt, max2816 + 1, T_BODY_SIZE, out, &len),
             HC_E_PLAINTEXT_TOO_LARGE);
    len = sizeof out;
    CHECK_RC(hc_webpush_seal(sealer, sub, pt, max2816, T_BODY_SIZE, out, &len), HC_OK);
    CHECK(len == T_BODY_SIZE, "full 2816 body is %zu bytes", len);
    len = sizeof out;
    CHECK_RC(hc_webpush_seal(sealer, sub, pt, 3994, HC_WEBPUSH_MAX_BODY, out, &len),
             HC_E_PLAINTEXT_TOO_LARGE);
    len = sizeof out;
    CHECK_RC(hc_webpush_seal(sealer, sub, pt, 2, 104, out, &len), HC_E_PLAINTEXT_TOO_LARGE);
    len = sizeof out;
    CHECK_RC(hc_webpush_seal(sealer, sub, pt, 1, 104, out, &len), HC_OK);
    CHECK(len == 104, "smallest body is %zu bytes", len);
    /* Unpadded: the single 4096-byte record must hold plaintext, delimiter and tag. */
    len = sizeof out;
    CHECK_RC(hc_webpush_seal(sealer, sub, pt, 4080, 0, out, &len), HC_E_PLAINTEXT_TOO_LARGE);
    len = sizeof out;
    CHECK_RC(hc_webpush_seal(sealer, sub, pt, 100000, 0, out, &len), HC_E_PLAINTEXT_TOO_LARGE);
    CHECK(hc_webpush_sealed_length(max2816 + 1, T_BODY_SIZE) == 0,
          "hc_webpush_sealed_length of an oversized plaintext is %zu, want 0",
          hc_webpush_sealed_length(max2816 + 1, T_BODY_SIZE));
    CHECK(hc_webpush_sealed_length(4080, 0) == 0, "hc_webpush_sealed_length(4080, 0) = %zu, want 0",
          hc_webpush_sealed_length(4080, 0));

    /* Body sizes outside 104..4096. */
    static const size_t bad_bodies[] = {5000, 50, 103, 4097, 1};
    for (size_t i = 0; i < sizeof bad_bodies / sizeof bad_bodies[0]; i++) {
        len = sizeof out;
        int rc = hc_webpush_seal(sealer, sub, pt, 1, bad_bodies[i], out, &len);
        CHECK(rc == HC_E_BODY_SIZE, "hc_webpush_seal with body_size %zu: got %d (%s), want %d",
              bad_bodies[i], rc, hc_strerror(rc), HC_E_BODY_SIZE);
    }

    /* Output buffer one byte short. */
    len = T_BODY_SIZE - 1;
    CHECK_RC(hc_webpush_seal(sealer, sub, pt, 10, T_BODY_SIZE, out, &len),
             HC_E_BUFFER_TOO_SMALL);
    CHECK(len == T_BODY_SIZE, "needed size %zu, want 2816", len);
    len = 10 + HC_WEBPUSH_OVERHEAD - 1;
    CHECK_RC(hc_webpush_seal(sealer, sub, pt, 10, 0, out, &len), HC_E_BUFFER_TOO_SMALL);
    CHECK(len == 10 + HC_WEBPUSH_OVERHEAD, "needed size %zu, want 113", len);
    len = 0;
    CHECK_RC(hc_webpush_seal(sealer, sub, pt, 10, 0, out, &len), HC_E_BUFFER_TOO_SMALL);

    /* The deterministic variant refuses a bad ephemeral scalar. */
    uint8_t zero[32] = {0}, salt[16] = {0};
    len = sizeof out;
    CHECK_RC(hc_webpush_seal_with_keys(sealer, sub, zero, salt, pt, 10, 0, out, &len),
             HC_E_PRIVATE_KEY_RANGE);

    /* The record size is the caller's: below 18 is refused, what is given is
     * written into the header, and a record not shorter than it is refused. */
    hc_sealer *small = NULL;
    CHECK_RC(hc_sealer_new(17, &small), HC_E_RECORD_SIZE);
    CHECK_RC(hc_sealer_new(0, &small), HC_E_RECORD_SIZE);
    CHECK_RC(hc_sealer_new(HC_AES128GCM_MIN_RECORD_SIZE, &small), HC_OK);
    hc_sealer_free(small);
    small = NULL;
    CHECK_RC(hc_sealer_new(128, &small), HC_OK);
    if (small != NULL) {
        /* 10 bytes + delimiter + tag = a 27-byte record: fits rs 128. */
        len = sizeof out;
        CHECK_RC(hc_webpush_seal(small, sub, pt, 10, 0, out, &len), HC_OK);
        CHECK(len >= 20 && out[16] == 0 && out[17] == 0 && out[18] == 0 && out[19] == 128,
              "rs in the header is %02x%02x%02x%02x, want 00000080", out[16], out[17], out[18],
              out[19]);
        /* 111 + 1 + 16 = 128: not shorter than rs. */
        len = sizeof out;
        CHECK_RC(hc_webpush_seal(small, sub, pt, 111, 0, out, &len), HC_E_RECORD_SIZE);
        len = sizeof out;
        CHECK_RC(hc_webpush_seal(small, sub, pt, 110, 0, out, &len), HC_OK);
        /* A padded body counts its padding: 2816 - 86 = 2730 bytes of record. */
        len = sizeof out;
        CHECK_RC(hc_webpush_seal(small, sub, pt, 10, T_BODY_SIZE, out, &len), HC_E_RECORD_SIZE);
        len = 0;
        CHECK_RC(hc_webpush_seal(small, sub, pt, 10, T_BODY_SIZE, NULL, &len), HC_E_RECORD_SIZE);
        hc_sealer_free(small);
    }
    small = NULL;
    CHECK_RC(hc_sealer_new(UINT32_MAX, &small), HC_OK);
    if (small != NULL) {
        len = sizeof out;
        CHECK_RC(hc_webpush_seal(small, sub, pt, 10, 0, out, &len), HC_OK);
        CHECK(out[16] == 0xff && out[17] == 0xff && out[18] == 0xff && out[19] == 0xff,
              "rs UINT32_MAX in the header is %02x%02x%02x%02x", out[16], out[17], out[18],
              out[19]);
        hc_sealer_free(small);
    }

    hc_webpush_sub_free(sub);
    hc_sealer_free(sealer);
}

/* ---- JWTs ---- */

static void vapid_case(const hc_p256_key *key, const char *aud, const char *sub, int64_t exp,
                       int64_t now, int want) {
    char out[1024];
    size_t len = sizeof out;
    int rc = hc_vapid_jwt(key, aud, sub, exp, now, out, &len);
    CHECK(rc == want, "hc_vapid_jwt(aud \"%s\", sub \"%s\", exp now%+lld): got %d (%s), want %d (%s)",
          aud, sub, (long long)(exp - now), rc, hc_strerror(rc), want, hc_strerror(want));
    len = sizeof out;
    rc = hc_vapid_authorization(key, aud, sub, exp, now, out, &len);
    CHECK(rc == want, "hc_vapid_authorization(aud \"%s\", sub \"%s\", exp now%+lld): got %d (%s), want %d",
          aud, sub, (long long)(exp - now), rc, hc_strerror(rc), want);
}

static void apns_case(const hc_p256_key *key, const char *kid, const char *team, int want) {
    char out[512];
    size_t len = sizeof out;
    int rc = hc_apns_jwt(key, kid, team, 1700000000, out, &len);
    CHECK(rc == want, "hc_apns_jwt(kid \"%s\", team \"%s\"): got %d (%s), want %d (%s)", kid, team,
          rc, hc_strerror(rc), want, hc_strerror(want));
}

static void fcm_case(const char *json, int want, const char *what) {
    hc_fcm_account *acct = NULL;
    int rc = hc_fcm_account_from_json(json, strlen(json), &acct);
    CHECK(rc == want, "hc_fcm_account_from_json(%s): got %d (%s), want %d (%s)", what, rc,
          hc_strerror(rc), want, hc_strerror(want));
    hc_fcm_account_free(rc == HC_OK ? acct : NULL);
}

void test_errors_jwt(void) {
    hc_p256_key *key = NULL;
    CHECK_RC(hc_p256_key_generate(&key), HC_OK);
    if (key == NULL) {
        return;
    }
    const int64_t now = 1700000000;
    const char *aud = "https://push.example.net", *sub = "mailto:push@example.com";
    vapid_case(key, aud, sub, now + 43200, now, HC_OK);
    vapid_case(key, aud, "https://example.com/contact", now + 43200, now, HC_OK);
    vapid_case(key, "https://push.example.net:8443", sub, now + 43200, now, HC_OK);
    /* The subject is the caller's to check (Herald's config layer does): the
     * core writes what it is given, JSON-escaped. */
    vapid_case(key, aud, "ops@example.com", now + 43200, now, HC_OK);
    vapid_case(key, aud, "\"quoted\"\n", now + 43200, now, HC_OK);
    vapid_case(key, "http://push.example.net", sub, now + 43200, now, HC_E_AUDIENCE);
    vapid_case(key, "https://push.example.net/path", sub, now + 43200, now, HC_E_AUDIENCE);
    vapid_case(key, "https://push.example.net/p/JzLQ3raZJfFBR0aqvOMsLrt54w4rJUsV", sub, now + 43200,
               now, HC_E_AUDIENCE);
    vapid_case(key, "push.example.net", sub, now + 43200, now, HC_E_AUDIENCE);
    vapid_case(key, "https://", sub, now + 43200, now, HC_E_AUDIENCE);
    vapid_case(key, "", sub, now + 43200, now, HC_E_AUDIENCE);
    vapid_case(key, "https://push.example.net?x=1", sub, now + 43200, now, HC_E_AUDIENCE);
    vapid_case(key, aud, sub, now + HC_VAPID_MAX_TTL, now, HC_OK);
    vapid_case(key, aud, sub, now + 1, now, HC_OK);
    vapid_case(key, aud, sub, now + HC_VAPID_MAX_TTL + 1, now, HC_E_EXPIRY);
    vapid_case(key, aud, sub, now + 30 * 86400, now, HC_E_EXPIRY);
    vapid_case(key, aud, sub, now, now, HC_E_EXPIRY);
    vapid_case(key, aud, sub, now - 60, now, HC_E_EXPIRY);

    apns_case(key, "ABC123DEFG", "DEF123GHIJ", HC_OK);
    apns_case(key, "ABC123DEF", "DEF123GHIJ", HC_E_CLAIM);
    apns_case(key, "ABC123DEFGH", "DEF123GHIJ", HC_E_CLAIM);
    apns_case(key, "abc123defg", "DEF123GHIJ", HC_E_CLAIM);
    apns_case(key, "ABC123DEF-", "DEF123GHIJ", HC_E_CLAIM);
    apns_case(key, "", "DEF123GHIJ", HC_E_CLAIM);
    apns_case(key, "ABC123DEFG", "DEF123GHI", HC_E_CLAIM);
    apns_case(key, "ABC123DEFG", "DEF123GHI\"", HC_E_CLAIM);
    hc_p256_key_free(key);

    /* Service accounts. */
    EVP_PKEY *rsa = EVP_RSA_gen(2048);
    char *pem = rsa != NULL ? t_pem_pkcs8(rsa) : NULL;
    if (!CHECK(pem != NULL, "RSA-2048 test key")) {
        EVP_PKEY_free(rsa);
        return;
    }
    static const char *required[] = {"client_email", "project_id", "private_key", "token_uri"};
    char *json = t_service_account_json(pem, NULL);
    fcm_case(json, HC_OK, "complete");
    t_json_text_free(json);
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        json = t_service_account_json(pem, required[i]);
        char what[64];
        snprintf(what, sizeof what, "without %s", required[i]);
        fcm_case(json, HC_E_SERVICE_ACCOUNT, what);
        t_json_text_free(json);
    }
    fcm_case("{not json", HC_E_JSON, "\"{not json\"");
    fcm_case("", HC_E_JSON, "empty text");
    fcm_case("-----BEGIN PRIVATE KEY-----", HC_E_JSON, "a PEM header");
    {
        json_t *o = json_object();
        json_object_set_new(o, "project_id", json_string("p"));
        json_object_set_new(o, "client_email", json_integer(42));
        json_object_set_new(o, "private_key", json_string(pem));
        json_object_set_new(o, "token_uri", json_string("https://oauth2.googleapis.com/token"));
        char *s = json_dumps(o, 0);
        hc_fcm_account *acct = NULL;
        int rc = hc_fcm_account_from_json(s, strlen(s), &acct);
        CHECK(rc == HC_E_SERVICE_ACCOUNT || rc == HC_E_JSON,
              "client_email as a number: got %d (%s)", rc, hc_strerror(rc));
        hc_fcm_account_free(rc == HC_OK ? acct : NULL);
        t_json_text_free(s);
        json_decref(o);
    }
    {
        EVP_PKEY *ec = EVP_EC_gen("P-256");
        char *ec_pem = ec != NULL ? t_pem_pkcs8(ec) : NULL;
        if (ec_pem != NULL) {
            json = t_service_account_json(ec_pem, NULL);
            fcm_case(json, HC_E_RSA_KEY, "with a P-256 private_key");
            t_json_text_free(json);
        }
        free(ec_pem);
        EVP_PKEY_free(ec);
    }
    json = t_service_account_json(pem, NULL);
    hc_fcm_account *acct = NULL;
    if (hc_fcm_account_from_json(json, strlen(json), &acct) == HC_OK) {
        char out[4096];
        size_t len = sizeof out;
        CHECK(hc_fcm_assertion(acct, T_FCM_SCOPE, 1700000000, 0, out, &len) != HC_OK,
              "hc_fcm_assertion accepted a lifetime of 0");
        len = sizeof out;
        CHECK(hc_fcm_assertion(acct, T_FCM_SCOPE, 1700000000, 3601, out, &len) != HC_OK,
              "hc_fcm_assertion accepted a lifetime of 3601");
        len = sizeof out;
        CHECK(hc_fcm_assertion(acct, T_FCM_SCOPE, 1700000000, -5, out, &len) != HC_OK,
              "hc_fcm_assertion accepted a negative lifetime");
        len = 10;
        CHECK_RC(hc_fcm_assertion(acct, T_FCM_SCOPE, 1700000000, 3600, out, &len), HC_E_BUFFER_TOO_SMALL);
        size_t need = len;
        CHECK(need > 10 && need < sizeof out, "hc_fcm_assertion needed size %zu", need);
        if (need > 10 && need < sizeof out) {
            len = need;
            CHECK_RC(hc_fcm_assertion(acct, T_FCM_SCOPE, 1700000000, 3600, out, &len), HC_OK);
        }
        /* Scopes outside RFC 6749's grammar. */
        static const char *const bad_scopes[] = {
            "", " ", " " T_FCM_SCOPE, T_FCM_SCOPE " ", "a  b", "a\tb", "a\nb", "a\"b", "a\\b",
            "a\x7f", "caf\xc3\xa9"};
        for (size_t i = 0; i < sizeof bad_scopes / sizeof bad_scopes[0]; i++) {
            len = sizeof out;
            int rc = hc_fcm_assertion(acct, bad_scopes[i], 1700000000, 3600, out, &len);
            CHECK(rc == HC_E_CLAIM, "hc_fcm_assertion(scope #%zu): got %d (%s), want HC_E_CLAIM",
                  i, rc, hc_strerror(rc));
        }
    }
    hc_fcm_account_free(acct);
    t_json_text_free(json);
    free(pem);
    EVP_PKEY_free(rsa);
}

/* ---- secretbox ---- */

void test_errors_secretbox(void) {
    uint8_t key[32], key2[32];
    RAND_bytes(key, 32);
    memcpy(key2, key, 32);
    key2[0] ^= 1;
    const uint8_t *ad = (const uint8_t *)"webpush_subscriptions:42:auth";
    size_t ad_len = strlen((const char *)ad);
    const uint8_t *msg = (const uint8_t *)"a secret worth keeping";
    size_t msg_len = strlen((const char *)msg);
    uint8_t sealed[128], out[128];
    size_t sealed_len = sizeof sealed, len;
    CHECK_RC(hc_secretbox_seal(key, ad, ad_len, msg, msg_len, sealed, &sealed_len), HC_OK);
    CHECK(sealed_len == msg_len + HC_SECRETBOX_OVERHEAD, "sealed length %zu", sealed_len);
    if (sealed_len != msg_len + HC_SECRETBOX_OVERHEAD) {
        return;
    }
    len = sizeof out;
    CHECK_RC(hc_secretbox_open(key, ad, ad_len, sealed, sealed_len, out, &len), HC_OK);

    /* One flipped byte in nonce, ciphertext or tag. */
    static const size_t flip_at[] = {1, 12, 24, 25, 30, 25 + 21, 25 + 22 + 15};
    for (size_t i = 0; i < sizeof flip_at / sizeof flip_at[0]; i++) {
        sealed[flip_at[i]] ^= 0x20;
        len = sizeof out;
        int rc = hc_secretbox_open(key, ad, ad_len, sealed, sealed_len, out, &len);
        CHECK(rc == HC_E_DECRYPT, "secretbox open with byte %zu flipped: got %d (%s)", flip_at[i],
              rc, hc_strerror(rc));
        sealed[flip_at[i]] ^= 0x20;
    }
    len = sizeof out;
    CHECK_RC(hc_secretbox_open(key, (const uint8_t *)"webpush_subscriptions:43:auth", ad_len,
                               sealed, sealed_len, out, &len),
             HC_E_DECRYPT);
    len = sizeof out;
    CHECK_RC(hc_secretbox_open(key, ad, ad_len - 1, sealed, sealed_len, out, &len), HC_E_DECRYPT);
    len = sizeof out;
    CHECK_RC(hc_secretbox_open(key, ad, 0, sealed, sealed_len, out, &len), HC_E_DECRYPT);
    len = sizeof out;
    CHECK_RC(hc_secretbox_open(key2, ad, ad_len, sealed, sealed_len, out, &len), HC_E_DECRYPT);
    len = sizeof out;
    CHECK_RC(hc_secretbox_open(key, ad, ad_len, sealed, sealed_len - 1, out, &len), HC_E_DECRYPT);

    /* Too short or of an unknown version. */
    len = sizeof out;
    CHECK_RC(hc_secretbox_open(key, ad, ad_len, sealed, HC_SECRETBOX_OVERHEAD - 1, out, &len),
             HC_E_SEALED_FORMAT);
    len = sizeof out;
    CHECK_RC(hc_secretbox_open(key, ad, ad_len, sealed, 1, out, &len), HC_E_SEALED_FORMAT);
    len = sizeof out;
    CHECK_RC(hc_secretbox_open(key, ad, ad_len, sealed, 0, out, &len), HC_E_SEALED_FORMAT);
    sealed[0] = 0x02;
    len = sizeof out;
    CHECK_RC(hc_secretbox_open(key, ad, ad_len, sealed, sealed_len, out, &len), HC_E_SEALED_FORMAT);
    sealed[0] = 0x00;
    len = sizeof out;
    CHECK_RC(hc_secretbox_open(key, ad, ad_len, sealed, sealed_len, out, &len), HC_E_SEALED_FORMAT);
    sealed[0] = 0x01;

    /* Buffers one byte short. */
    len = msg_len - 1;
    CHECK_RC(hc_secretbox_open(key, ad, ad_len, sealed, sealed_len, out, &len),
             HC_E_BUFFER_TOO_SMALL);
    CHECK(len == msg_len, "secretbox open: needed size %zu, want %zu", len, msg_len);
    len = msg_len + HC_SECRETBOX_OVERHEAD - 1;
    CHECK_RC(hc_secretbox_seal(key, ad, ad_len, msg, msg_len, sealed, &len), HC_E_BUFFER_TOO_SMALL);
    CHECK(len == msg_len + HC_SECRETBOX_OVERHEAD, "secretbox seal: needed size %zu, want %zu", len,
          msg_len + HC_SECRETBOX_OVERHEAD);
}

/* ---- hc_strerror ---- */

void test_errors_strerror(void) {
    const char *msgs[30] = {0};
    for (int code = 0; code >= -29; code--) {
        if (code == -18) continue; /* retired */
        const char *s = hc_strerror(code);
        msgs[-code] = s;
        CHECK(s != NULL && s[0] != '\0', "hc_strerror(%d) is empty", code);
    }
    for (int a = 0; a < 30; a++) {
        for (int b = a + 1; b < 30; b++) {
            if (msgs[a] != NULL && msgs[b] != NULL && strcmp(msgs[a], msgs[b]) == 0) {
                CHECK(0, "hc_strerror(%d) and hc_strerror(%d) are both \"%s\"", -a, -b, msgs[a]);
            }
        }
    }
    static const int unknown[] = {1, 7, -18, -30, -31, -1000, 1 << 30, -(1 << 30) - 1};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        const char *s = hc_strerror(unknown[i]);
        CHECK(s != NULL && s[0] != '\0', "hc_strerror(%d) for an unknown code", unknown[i]);
        /* An unknown code is not described as success. */
        CHECK(s == NULL || msgs[0] == NULL || strcmp(s, msgs[0]) != 0,
              "hc_strerror(%d) reads like HC_OK", unknown[i]);
    }
}
