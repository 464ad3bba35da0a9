/*
 * test_api.c - the rest of the public API against independent code:
 * encoding/hashing helpers, P-256 key import/export (PKCS#8, SEC1, raw,
 * text), VAPID and APNs JWTs, the FCM service account and RS256 assertion,
 * and secretbox round trips.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <openssl/rsa.h>
#include <openssl/sha.h>

#include "test.h"

/* A string output: NUL-terminated inside the buffer, *len the text length
 * (or the length with its NUL, which the header leaves open for JWTs). */
static int text_ok(const char *out, size_t len, size_t cap, const char *what) {
    const char *nul = memchr(out, '\0', cap);
    size_t n = nul != NULL ? (size_t)(nul - out) : cap;
    return CHECK(nul != NULL && (len == n || len == n + 1),
                 "%s: *len %zu for a %zu-character text%s", what, len, n,
                 nul == NULL ? " without a NUL" : "");
}

/* ---- helpers: hashing, comparison, randomness, base64url ---- */

void test_api_basics(void) {
    uint8_t d[32], want[32];
    static const char abc_sha[] = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    size_t n = 0;
    uint8_t *p = t_unhex(abc_sha, &n);
    hc_sha256((const uint8_t *)"abc", 3, d);
    CHECK_MEM(d, p, 32, "SHA-256(\"abc\")");
    free(p);
    uint8_t buf[1000];
    t_prng_fill(buf, sizeof buf);
    unsigned sha_bad = 0;
    for (size_t len = 0; len <= sizeof buf; len += 37) {
        hc_sha256(buf, len, d);
        SHA256(buf, len, want);
        sha_bad += memcmp(d, want, 32) != 0;
    }
    CHECK(sha_bad == 0, "hc_sha256 differs from OpenSSL on %u lengths", sha_bad);

    uint8_t a[40], b[40];
    t_prng_fill(a, sizeof a);
    memcpy(b, a, sizeof b);
    CHECK(hc_equal(a, b, 40) == 1, "hc_equal on equal buffers");
    CHECK(hc_equal(a, b, 0) == 1, "hc_equal on empty buffers");
    b[39] ^= 0x80;
    CHECK(hc_equal(a, b, 40) == 0, "hc_equal on buffers differing in the last byte");
    b[39] ^= 0x80;
    b[0] ^= 1;
    CHECK(hc_equal(a, b, 40) == 0, "hc_equal on buffers differing in the first byte");

    uint8_t r1[32] = {0}, r2[32] = {0}, zero[32] = {0};
    CHECK_RC(hc_random(r1, 32), HC_OK);
    CHECK_RC(hc_random(r2, 32), HC_OK);
    CHECK(memcmp(r1, r2, 32) != 0 && memcmp(r1, zero, 32) != 0, "hc_random gives fresh bytes");
    CHECK_RC(hc_random(r1, 0), HC_OK);

    memset(a, 0x5A, sizeof a);
    hc_wipe(a, sizeof a);
    CHECK(memcmp(a, (uint8_t[40]){0}, 40) == 0, "hc_wipe zeroes");

    /* base64url against the test's own encoder. */
    unsigned len_bad = 0, enc_bad = 0, dec_bad = 0;
    for (size_t len = 0; len <= 200; len++) {
        uint8_t in[200], back[200];
        char mine[300], theirs[300];
        t_prng_fill(in, len);
        size_t want_len = t_b64url_encode(in, len, mine);
        len_bad += hc_base64url_encoded_length(len) != want_len;
        size_t out_len = want_len + 1;
        memset(theirs, 'x', sizeof theirs);
        if (hc_base64url_encode(in, len, theirs, &out_len) != HC_OK || out_len != want_len ||
            strcmp(theirs, mine) != 0) {
            enc_bad++;
        }
        size_t back_len = sizeof back;
        if (hc_base64url_decode(mine, want_len, back, &back_len) != HC_OK || back_len != len ||
            memcmp(back, in, len) != 0) {
            dec_bad++;
        }
    }
    CHECK(len_bad == 0, "hc_base64url_encoded_length wrong for %u lengths", len_bad);
    CHECK(enc_bad == 0, "hc_base64url_encode wrong for %u lengths", enc_bad);
    CHECK(dec_bad == 0, "hc_base64url_decode wrong for %u lengths", dec_bad);

    /* Generated keys: valid public points, ECDH agrees both ways and with OpenSSL. */
    hc_p256_key *k1 = NULL, *k2 = NULL;
    CHECK_RC(hc_p256_key_generate(&k1), HC_OK);
    CHECK_RC(hc_p256_key_generate(&k2), HC_OK);
    if (k1 != NULL && k2 != NULL) {
        uint8_t pub1[65], pub2[65], s1[32], s2[32], s3[32], priv[32];
        hc_p256_key_public(k1, pub1);
        hc_p256_key_public(k2, pub2);
        CHECK_RC(hc_p256_public_check(pub1, 65), HC_OK);
        CHECK(memcmp(pub1, pub2, 65) != 0, "two generated keys differ");
        CHECK_RC(hc_p256_ecdh(k1, pub2, s1), HC_OK);
        CHECK_RC(hc_p256_ecdh(k2, pub1, s2), HC_OK);
        CHECK_MEM(s1, s2, 32, "ECDH is symmetric");
        EVP_PKEY *o = EVP_EC_gen("P-256");
        hc_p256_key *k3 = NULL;
        if (CHECK(o != NULL && t_pkey_private(o, priv), "OpenSSL key") &&
            hc_p256_key_from_raw(priv, 32, &k3) == HC_OK) {
            uint8_t opub[65], pub3[65];
            t_pkey_public(o, opub);
            hc_p256_key_public(k3, pub3);
            CHECK_MEM(pub3, opub, 65, "hc_p256_key_from_raw derives OpenSSL's public key");
            CHECK_RC(hc_p256_ecdh(k3, pub1, s3), HC_OK);
            CHECK(t_ossl_ecdh(o, pub1, s2), "OpenSSL ECDH");
            CHECK_MEM(s3, s2, 32, "hc_p256_ecdh matches EVP_PKEY_derive");
        } else {
            CHECK(0, "hc_p256_key_from_raw refused an OpenSSL scalar");
        }
        hc_p256_key_free(k3);
        EVP_PKEY_free(o);
    }
    hc_p256_key_free(k1);
    hc_p256_key_free(k2);
}

/* ---- PEM and text keys ---- */

static void public_of_pem(const char *pem, size_t len, const uint8_t want[65], const char *what) {
    hc_p256_key *key = NULL;
    int rc = hc_p256_key_from_pem(pem, len, &key);
    CHECK(rc == HC_OK, "hc_p256_key_from_pem(%s): %d (%s)", what, rc, hc_strerror(rc));
    if (key != NULL) {
        uint8_t pub[65];
        hc_p256_key_public(key, pub);
        char label[96];
        snprintf(label, sizeof label, "public key from %s", what);
        CHECK_MEM(pub, want, 65, label);
    }
    hc_p256_key_free(key);
}

void test_api_pem(void) {
    EVP_PKEY *o = EVP_EC_gen("P-256");
    uint8_t opub[65], opriv[32];
    if (!CHECK(o != NULL && t_pkey_public(o, opub) && t_pkey_private(o, opriv),
               "OpenSSL P-256 key")) {
        EVP_PKEY_free(o);
        return;
    }
    char *pkcs8 = t_pem_pkcs8(o), *sec1 = t_pem_type_specific(o);
    CHECK(pkcs8 != NULL && strstr(pkcs8, "-----BEGIN PRIVATE KEY-----") == pkcs8,
          "OpenSSL wrote a PKCS#8 PEM");
    CHECK(sec1 != NULL && strstr(sec1, "-----BEGIN EC PRIVATE KEY-----") == sec1,
          "OpenSSL wrote a SEC1 PEM");
    if (pkcs8 != NULL && sec1 != NULL) {
        public_of_pem(pkcs8, strlen(pkcs8), opub, "PKCS#8 PEM");
        public_of_pem(sec1, strlen(sec1), opub, "SEC1 PEM");
        /* pem_len is honoured: an exact-size copy without a NUL. */
        size_t n = strlen(pkcs8);
        char *exact = malloc(n);
        memcpy(exact, pkcs8, n);
        public_of_pem(exact, n, opub, "PKCS#8 PEM without a trailing NUL");
        free(exact);
        n = strlen(sec1);
        exact = malloc(n);
        memcpy(exact, sec1, n);
        public_of_pem(exact, n, opub, "SEC1 PEM without a trailing NUL");
        free(exact);
    }

    /* hc_p256_key_to_pem round trip, read back by OpenSSL too. */
    hc_p256_key *key = NULL;
    CHECK_RC(hc_p256_key_from_raw(opriv, 32, &key), HC_OK);
    if (key != NULL) {
        char pem[1024];
        size_t len = 10;
        CHECK_RC(hc_p256_key_to_pem(key, pem, &len), HC_E_BUFFER_TOO_SMALL);
        size_t need = len;
        CHECK(need > 100 && need < sizeof pem, "hc_p256_key_to_pem needs %zu bytes", need);
        len = need < sizeof pem ? need : sizeof pem;
        CHECK_RC(hc_p256_key_to_pem(key, pem, &len), HC_OK);
        len = sizeof pem;
        CHECK_RC(hc_p256_key_to_pem(key, pem, &len), HC_OK);
        if (text_ok(pem, len, sizeof pem, "hc_p256_key_to_pem")) {
            CHECK(strncmp(pem, "-----BEGIN PRIVATE KEY-----", 27) == 0,
                  "hc_p256_key_to_pem writes PKCS#8: %.40s", pem);
            public_of_pem(pem, strlen(pem), opub, "hc_p256_key_to_pem output");
            EVP_PKEY *back = t_pem_read_private(pem);
            uint8_t bpriv[32];
            CHECK(back != NULL && t_pkey_private(back, bpriv) && memcmp(bpriv, opriv, 32) == 0,
                  "OpenSSL reads hc_p256_key_to_pem output back to the same scalar");
            EVP_PKEY_free(back);
        }

        /* hc_p256_key_from_text: PEM or base64url raw, whitespace around. */
        char raw[64], text[2048];
        t_b64url_encode(opriv, 32, raw);
        static const char *wraps[][2] = {{"", ""}, {"  ", "\n"}, {"\n\t", " \r\n"}};
        for (size_t i = 0; i < sizeof wraps / sizeof wraps[0]; i++) {
            const char *bodies[] = {raw, pkcs8 != NULL ? pkcs8 : raw, sec1 != NULL ? sec1 : raw};
            static const char *names[] = {"base64url raw", "PKCS#8 PEM", "SEC1 PEM"};
            for (size_t j = 0; j < 3; j++) {
                snprintf(text, sizeof text, "%s%s%s", wraps[i][0], bodies[j], wraps[i][1]);
                hc_p256_key *k2 = NULL;
                int rc = hc_p256_key_from_text(text, strlen(text), &k2);
                uint8_t pub[65] = {0};
                if (k2 != NULL) {
                    hc_p256_key_public(k2, pub);
                }
                CHECK(rc == HC_OK && memcmp(pub, opub, 65) == 0,
                      "hc_p256_key_from_text(%s, wrapping %zu): %d (%s)", names[j], i, rc,
                      hc_strerror(rc));
                hc_p256_key_free(k2);
            }
        }
    }
    hc_p256_key_free(key);
    free(pkcs8);
    free(sec1);
    EVP_PKEY_free(o);
}

/* ---- JWTs ---- */

static void check_es256_jwt(const char *jwt, size_t len, const uint8_t pub[65], const char *header,
                            const char *claims, const char *what) {
    t_jwt j;
    if (!CHECK(t_jwt_parse(jwt, len, &j), "%s: not a compact JWS: %s", what, jwt)) {
        return;
    }
    CHECK(strcmp(j.header, header) == 0, "%s header: got %s, want %s", what, j.header, header);
    CHECK(strcmp(j.claims, claims) == 0, "%s claims: got %s, want %s", what, j.claims, claims);
    CHECK(j.sig_len == 64, "%s: %zu-byte signature", what, j.sig_len);
    if (j.sig_len == 64) {
        int rc = hc_es256_verify(pub, 65, (const uint8_t *)j.signing_input, j.signing_input_len,
                                 j.sig, 64);
        CHECK(rc == HC_OK, "%s: hc_es256_verify gives %d (%s)", what, rc, hc_strerror(rc));
        EVP_PKEY *pk = t_p256_pkey(NULL, pub);
        CHECK(pk != NULL && t_ossl_es256_verify(pk, (const uint8_t *)j.signing_input,
                                                j.signing_input_len, j.sig),
              "%s: OpenSSL verifies the signature", what);
        EVP_PKEY_free(pk);
    }
    t_jwt_free(&j);
}

void test_api_jwt(void) {
    hc_p256_key *key = NULL;
    CHECK_RC(hc_p256_key_generate(&key), HC_OK);
    if (key == NULL) {
        return;
    }
    uint8_t pub[65];
    char pub_b64[128];
    hc_p256_key_public(key, pub);
    t_b64url_encode(pub, 65, pub_b64);
    const int64_t now = 1700000000, exp = now + 43200;

    /* VAPID token. */
    char out[2048];
    size_t len = sizeof out;
    CHECK_RC(hc_vapid_jwt(key, "https://push.example.net", "mailto:push@example.com", exp, now,
                          out, &len),
             HC_OK);
    if (text_ok(out, len, sizeof out, "hc_vapid_jwt")) {
        check_es256_jwt(out, strlen(out), pub, "{\"typ\":\"JWT\",\"alg\":\"ES256\"}",
                        "{\"aud\":\"https://push.example.net\",\"exp\":1700043200,\"sub\":"
                        "\"mailto:push@example.com\"}",
                        "VAPID JWT");
        size_t jwt_len = strlen(out);
        len = jwt_len - 1;
        CHECK_RC(hc_vapid_jwt(key, "https://push.example.net", "mailto:push@example.com", exp, now,
                              out, &len),
                 HC_E_BUFFER_TOO_SMALL);
        size_t need = len;
        CHECK(need == jwt_len || need == jwt_len + 1, "hc_vapid_jwt needed %zu for %zu characters",
              need, jwt_len);
        len = need;
        CHECK_RC(hc_vapid_jwt(key, "https://push.example.net", "mailto:push@example.com", exp, now,
                              out, &len),
                 HC_OK);
    }
    /* An https subject and an origin with a port. */
    len = sizeof out;
    CHECK_RC(hc_vapid_jwt(key, "https://updates.push.services.mozilla.com:443",
                          "https://herald.example/contact", exp, now, out, &len),
             HC_OK);
    if (text_ok(out, len, sizeof out, "hc_vapid_jwt")) {
        check_es256_jwt(out, strlen(out), pub, "{\"typ\":\"JWT\",\"alg\":\"ES256\"}",
                        "{\"aud\":\"https://updates.push.services.mozilla.com:443\",\"exp\":"
                        "1700043200,\"sub\":\"https://herald.example/contact\"}",
                        "VAPID JWT with port");
    }

    /* Authorization header. */
    len = sizeof out;
    CHECK_RC(hc_vapid_authorization(key, "https://fcm.googleapis.com", "mailto:ops@herald.example",
                                    exp, now, out, &len),
             HC_OK);
    if (text_ok(out, len, sizeof out, "hc_vapid_authorization")) {
        char tail[160];
        snprintf(tail, sizeof tail, ", k=%s", pub_b64);
        size_t n = strlen(out), tl = strlen(tail);
        CHECK(strncmp(out, "vapid t=", 8) == 0, "authorization starts %.12s", out);
        CHECK(n > 8 + tl && strcmp(out + n - tl, tail) == 0,
              "authorization ends with \", k=<public key>\": %s", out);
        if (n > 8 + tl) {
            check_es256_jwt(out + 8, n - 8 - tl, pub, "{\"typ\":\"JWT\",\"alg\":\"ES256\"}",
                            "{\"aud\":\"https://fcm.googleapis.com\",\"exp\":1700043200,\"sub\":"
                            "\"mailto:ops@herald.example\"}",
                            "authorization t=");
        }
    }

    /* APNs provider token. */
    len = sizeof out;
    CHECK_RC(hc_apns_jwt(key, "ABC123DEFG", "DEF123GHIJ", now, out, &len), HC_OK);
    if (text_ok(out, len, sizeof out, "hc_apns_jwt")) {
        check_es256_jwt(out, strlen(out), pub, "{\"alg\":\"ES256\",\"kid\":\"ABC123DEFG\"}",
                        "{\"iss\":\"DEF123GHIJ\",\"iat\":1700000000}", "APNs JWT");
        size_t jwt_len = strlen(out);
        len = 20;
        CHECK_RC(hc_apns_jwt(key, "ABC123DEFG", "DEF123GHIJ", now, out, &len),
                 HC_E_BUFFER_TOO_SMALL);
        CHECK(len == jwt_len || len == jwt_len + 1, "hc_apns_jwt needed %zu for %zu characters",
              len, jwt_len);
    }
    /* Signatures are randomised: two tokens differ but both verify. */
    char out2[2048];
    size_t len2 = sizeof out2;
    len = sizeof out;
    if (hc_apns_jwt(key, "ABC123DEFG", "DEF123GHIJ", now, out, &len) == HC_OK &&
        hc_apns_jwt(key, "ABC123DEFG", "DEF123GHIJ", now, out2, &len2) == HC_OK) {
        CHECK(strcmp(out, out2) != 0, "two APNs tokens have different signatures");
    }
    hc_p256_key_free(key);
}

/* ---- FCM ---- */

void test_api_fcm(void) {
    EVP_PKEY *rsa = EVP_RSA_gen(2048);
    char *pem = rsa != NULL ? t_pem_pkcs8(rsa) : NULL;
    char *pkcs1 = rsa != NULL ? t_pem_type_specific(rsa) : NULL;
    char *pub_pem = rsa != NULL ? t_pem_public(rsa) : NULL;
    EVP_PKEY *other = EVP_RSA_gen(2048);
    char *other_pub = other != NULL ? t_pem_public(other) : NULL;
    if (!CHECK(pem != NULL && pkcs1 != NULL && pub_pem != NULL && other_pub != NULL,
               "OpenSSL RSA-2048 test keys")) {
        goto done;
    }
    CHECK(strstr(pkcs1, "-----BEGIN RSA PRIVATE KEY-----") == pkcs1, "OpenSSL wrote PKCS#1");

    /* Raw RS256 with an hc_rsa_key. */
    const uint8_t *msg = (const uint8_t *)"header.claims";
    hc_rsa_key *key = NULL;
    CHECK_RC(hc_rsa_key_from_pem(pem, strlen(pem), &key), HC_OK);
    if (key != NULL) {
        uint8_t sig[512], sig2[512];
        size_t len = 100;
        CHECK_RC(hc_rs256_sign(key, msg, 13, sig, &len), HC_E_BUFFER_TOO_SMALL);
        CHECK(len == 256, "hc_rs256_sign needs %zu bytes, want 256", len);
        len = sizeof sig;
        CHECK_RC(hc_rs256_sign(key, msg, 13, sig, &len), HC_OK);
        CHECK(len == 256, "RS256 signature is %zu bytes", len);
        size_t len2 = sizeof sig2;
        CHECK_RC(hc_rs256_sign(key, msg, 13, sig2, &len2), HC_OK);
        CHECK(len2 == len && memcmp(sig, sig2, len) == 0, "PKCS#1 v1.5 signatures are deterministic");
        CHECK(t_ossl_rs256_verify(rsa, msg, 13, sig, len), "OpenSSL verifies hc_rs256_sign");
        CHECK_RC(hc_rs256_verify_pem(pub_pem, strlen(pub_pem), msg, 13, sig, len), HC_OK);
        CHECK_RC(hc_rs256_verify_pem(other_pub, strlen(other_pub), msg, 13, sig, len),
                 HC_E_SIGNATURE_INVALID);
        sig[100] ^= 4;
        CHECK_RC(hc_rs256_verify_pem(pub_pem, strlen(pub_pem), msg, 13, sig, len),
                 HC_E_SIGNATURE_INVALID);
        CHECK(hc_rs256_verify_pem("garbage", 7, msg, 13, sig, len) != HC_OK,
              "hc_rs256_verify_pem with a broken public PEM");
    }
    hc_rsa_key_free(key);
    key = NULL;
    CHECK_RC(hc_rsa_key_from_pem(pkcs1, strlen(pkcs1), &key), HC_OK);
    hc_rsa_key_free(key);

    /* The service account. */
    char *json = t_service_account_json(pem, NULL);
    hc_fcm_account *acct = NULL;
    CHECK_RC(hc_fcm_account_from_json(json, strlen(json), &acct), HC_OK);
    t_json_text_free(json);
    if (acct == NULL) {
        goto done;
    }
    const char *s = hc_fcm_account_project_id(acct);
    CHECK(s != NULL && strcmp(s, "herald-test") == 0, "project_id %s", s ? s : "(null)");
    s = hc_fcm_account_client_email(acct);
    CHECK(s != NULL && strcmp(s, "herald-push@herald-test.iam.gserviceaccount.com") == 0,
          "client_email %s", s ? s : "(null)");
    s = hc_fcm_account_token_uri(acct);
    CHECK(s != NULL && strcmp(s, "https://oauth2.googleapis.com/token") == 0, "token_uri %s",
          s ? s : "(null)");

    static const int64_t lifetimes[] = {3600, 1, 1800};
    /* The scope is the caller's: it is written as given. */
    static const char *const scopes[] = {
        T_FCM_SCOPE, "https://www.googleapis.com/auth/cloud-platform",
        T_FCM_SCOPE " https://www.googleapis.com/auth/cloud-platform"};
    for (size_t i = 0; i < sizeof lifetimes / sizeof lifetimes[0]; i++) {
        const int64_t iat = 1700000000 + (int64_t)i;
        char out[4096];
        size_t len = sizeof out;
        int rc = hc_fcm_assertion(acct, scopes[i], iat, lifetimes[i], out, &len);
        CHECK(rc == HC_OK, "hc_fcm_assertion(lifetime %lld): %d (%s)", (long long)lifetimes[i], rc,
              hc_strerror(rc));
        if (rc != HC_OK || !text_ok(out, len, sizeof out, "hc_fcm_assertion")) {
            continue;
        }
        t_jwt j;
        if (!CHECK(t_jwt_parse(out, strlen(out), &j), "FCM assertion is a compact JWS")) {
            continue;
        }
        CHECK(strcmp(j.header, "{\"alg\":\"RS256\",\"typ\":\"JWT\"}") == 0, "FCM header %s",
              j.header);
        json_error_t err;
        json_t *c = json_loads(j.claims, 0, &err);
        if (CHECK(json_is_object(c), "FCM claims are a JSON object: %s", j.claims)) {
            const char *iss = json_string_value(json_object_get(c, "iss"));
            const char *scope = json_string_value(json_object_get(c, "scope"));
            const char *aud = json_string_value(json_object_get(c, "aud"));
            json_t *ji = json_object_get(c, "iat"), *je = json_object_get(c, "exp");
            CHECK(iss != NULL && strcmp(iss, "herald-push@herald-test.iam.gserviceaccount.com") == 0,
                  "FCM iss: %s", j.claims);
            CHECK(scope != NULL && strcmp(scope, scopes[i]) == 0, "FCM scope: %s", j.claims);
            CHECK(aud != NULL && strcmp(aud, "https://oauth2.googleapis.com/token") == 0,
                  "FCM aud: %s", j.claims);
            CHECK(json_is_integer(ji) && json_integer_value(ji) == iat, "FCM iat: %s", j.claims);
            CHECK(json_is_integer(je) && json_integer_value(je) == iat + lifetimes[i],
                  "FCM exp = iat + %lld: %s", (long long)lifetimes[i], j.claims);
        }
        json_decref(c);
        CHECK(j.sig_len == 256, "FCM signature is %zu bytes", j.sig_len);
        const uint8_t *si = (const uint8_t *)j.signing_input;
        CHECK_RC(hc_rs256_verify_pem(pub_pem, strlen(pub_pem), si, j.signing_input_len, j.sig,
                                     j.sig_len),
                 HC_OK);
        CHECK(t_ossl_rs256_verify(rsa, si, j.signing_input_len, j.sig, j.sig_len),
              "OpenSSL verifies the FCM assertion");
        j.sig[0] ^= 1;
        CHECK_RC(hc_rs256_verify_pem(pub_pem, strlen(pub_pem), si, j.signing_input_len, j.sig,
                                     j.sig_len),
                 HC_E_SIGNATURE_INVALID);
        t_jwt_free(&j);
    }
    hc_fcm_account_free(acct);
done:
    free(pem);
    free(pkcs1);
    free(pub_pem);
    free(other_pub);
    EVP_PKEY_free(rsa);
    EVP_PKEY_free(other);
}

/* ---- secretbox ---- */

void test_api_secretbox(void) {
    uint8_t key[HC_SECRETBOX_KEY_BYTES];
    RAND_bytes(key, sizeof key);
    static const size_t sizes[] = {0, 1, 16, 65, 1000};
    uint8_t msg[1000], sealed[1100], sealed2[1100], out[1100];
    t_prng_fill(msg, sizeof msg);
    const uint8_t *ad = (const uint8_t *)"apns_keys:7:private_key";
    size_t ad_len = strlen((const char *)ad);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i], len = sizeof sealed, len2 = sizeof sealed2, out_len = sizeof out;
        CHECK_RC(hc_secretbox_seal(key, ad, ad_len, msg, n, sealed, &len), HC_OK);
        CHECK(len == n + HC_SECRETBOX_OVERHEAD, "sealed %zu bytes to %zu", n, len);
        CHECK(sealed[0] == 0x01, "sealed version byte %02x", sealed[0]);
        CHECK_RC(hc_secretbox_seal(key, ad, ad_len, msg, n, sealed2, &len2), HC_OK);
        CHECK(len2 == len && memcmp(sealed + 1, sealed2 + 1, 24) != 0,
              "two seals use different nonces");
        CHECK_RC(hc_secretbox_open(key, ad, ad_len, sealed, len, out, &out_len), HC_OK);
        CHECK(out_len == n && memcmp(out, msg, n) == 0, "secretbox round trip of %zu bytes", n);
        out_len = n; /* exact capacity */
        CHECK_RC(hc_secretbox_open(key, ad, ad_len, sealed2, len2, out, &out_len), HC_OK);
    }
    /* Empty associated data. */
    size_t len = sizeof sealed, out_len = sizeof out;
    CHECK_RC(hc_secretbox_seal(key, (const uint8_t *)"", 0, msg, 10, sealed, &len), HC_OK);
    CHECK_RC(hc_secretbox_open(key, (const uint8_t *)"", 0, sealed, len, out, &out_len), HC_OK);
    CHECK(out_len == 10 && memcmp(out, msg, 10) == 0, "secretbox round trip with empty ad");
}
