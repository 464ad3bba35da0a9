/*
 * test_roundtrip.c - randomised checks against independent OpenSSL code:
 * hc_webpush_seal output opened by the test's own RFC 8291 receiver, and
 * 10,000 ES256 signatures verified by hc_es256_verify and EVP_DigestVerify.
 * Each property is one check over all iterations; the first failing
 * iteration is described in the failure line.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <threads.h>

#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include "test.h"

#define WEBPUSH_ROUNDS 320u
#define ES256_ROUNDS 10000u

/* Records the first failure of a property across many iterations. */
typedef struct {
    const char *name;
    unsigned bad;
    char first[200];
} prop;

static void prop_fail(prop *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void prop_fail(prop *p, const char *fmt, ...) {
    if (p->bad++ == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->first, sizeof p->first, fmt, ap);
        va_end(ap);
    }
}

#define PROP_CHECK(p, rounds) \
    CHECK((p).bad == 0, "%s: %u of %u attempts failed; first: %s", (p).name, (p).bad, (rounds), (p).first)

static size_t pick_body_size(unsigned i) {
    switch (i % 8) {
    case 0:
    case 1:
        return 0;
    case 2:
        return i % 3 == 0 ? 104 : HC_WEBPUSH_MAX_BODY;
    case 3:
        return T_BODY_SIZE;
    default:
        return t_prng_range(104, HC_WEBPUSH_MAX_BODY);
    }
}

static size_t pick_plaintext_len(unsigned i, size_t max) {
    switch (i % 7) {
    case 0:
        return max;
    case 1:
        return i % 2 == 0 ? 0 : 1;
    case 2:
        return t_prng_range(0, max < 64 ? max : 64);
    default:
        return t_prng_range(0, max);
    }
}

void test_roundtrip_webpush(void) {
    prop lengths = {"sealed length = body_size or hc_webpush_sealed_length", 0, ""};
    prop header = {"header rs = 4096, idlen = 65, keyid = the ephemeral point", 0, ""};
    prop opens = {"independent OpenSSL receiver opens the body to the plaintext", 0, ""};
    prop fresh = {"two seals of one plaintext differ in salt and ephemeral key", 0, ""};
    prop seal_ok = {"hc_webpush_seal succeeds", 0, ""};
    prop maxpt = {"hc_webpush_max_plaintext(body) = body - 103", 0, ""};

    hc_sealer *sealer = NULL;
    CHECK_RC(hc_sealer_new(T_RECORD_SIZE, &sealer), HC_OK);
    uint8_t *plaintext = malloc(HC_WEBPUSH_MAX_BODY);
    uint8_t *body = malloc(HC_WEBPUSH_MAX_BODY + 64), *body2 = malloc(HC_WEBPUSH_MAX_BODY + 64);
    uint8_t *opened = malloc(HC_WEBPUSH_MAX_BODY + 64);
    if (sealer == NULL || plaintext == NULL || body == NULL || body2 == NULL || opened == NULL) {
        CHECK(0, "setup for the web push round trip failed");
        goto done;
    }
    unsigned zero_body = 0, padded_body = 0, max_fill = 0;
    for (unsigned i = 0; i < WEBPUSH_ROUNDS; i++) {
        EVP_PKEY *ua = EVP_EC_gen("P-256");
        uint8_t ua_public[65], auth[16];
        hc_webpush_sub *sub = NULL;
        if (ua == NULL || !t_pkey_public(ua, ua_public) || RAND_bytes(auth, 16) != 1 ||
            hc_webpush_sub_new(ua_public, 65, auth, 16, &sub) != HC_OK) {
            prop_fail(&seal_ok, "round %u: user agent setup failed", i);
            EVP_PKEY_free(ua);
            continue;
        }
        size_t body_size = pick_body_size(i);
        size_t max = body_size == 0 ? HC_WEBPUSH_MAX_BODY - HC_WEBPUSH_OVERHEAD
                                    : body_size - HC_WEBPUSH_OVERHEAD;
        if (body_size != 0 && hc_webpush_max_plaintext(body_size) != max) {
            prop_fail(&maxpt, "body %zu: got %zu", body_size,
                      hc_webpush_max_plaintext(body_size));
        }
        size_t pt_len = pick_plaintext_len(i, max);
        zero_body += body_size == 0;
        padded_body += body_size != 0;
        max_fill += pt_len == max;
        t_prng_fill(plaintext, pt_len);

        size_t len = HC_WEBPUSH_MAX_BODY + 64;
        int rc = hc_webpush_seal(sealer, sub, plaintext, pt_len, body_size, body, &len);
        if (rc != HC_OK) {
            prop_fail(&seal_ok, "round %u: plaintext %zu, body %zu: %d (%s)", i, pt_len,
                      body_size, rc, hc_strerror(rc));
            goto next;
        }
        size_t want_len = body_size != 0 ? body_size : pt_len + HC_WEBPUSH_OVERHEAD;
        if (len != want_len || hc_webpush_sealed_length(pt_len, body_size) != want_len) {
            prop_fail(&lengths, "round %u: plaintext %zu, body %zu: wrote %zu, sealed_length %zu, want %zu",
                      i, pt_len, body_size, len, hc_webpush_sealed_length(pt_len, body_size),
                      want_len);
        }
        uint32_t rs = 0;
        unsigned idlen = 0;
        size_t opened_len = 0;
        int stage = t_webpush_open(ua, auth, body, len, opened, &opened_len, &rs, &idlen);
        if (len < 86 || body[16] != 0 || body[17] != 0 || body[18] != 0x10 || body[19] != 0 ||
            body[20] != 65 || body[21] != 0x04 || hc_p256_public_check(body + 21, 65) != HC_OK) {
            prop_fail(&header, "round %u: header bytes 16..21 = %02x %02x %02x %02x %02x %02x", i,
                      body[16], body[17], body[18], body[19], body[20], body[21]);
        }
        if (stage != 0 || opened_len != pt_len || memcmp(opened, plaintext, pt_len) != 0) {
            prop_fail(&opens, "round %u: plaintext %zu, body %zu: stage %d, opened %zu bytes%s", i,
                      pt_len, body_size, stage, opened_len,
                      stage == 0 && opened_len == pt_len ? " with different content" : "");
        }

        /* A second seal of the same plaintext to the same subscriber. */
        size_t len2 = HC_WEBPUSH_MAX_BODY + 64;
        rc = hc_webpush_seal(sealer, sub, plaintext, pt_len, body_size, body2, &len2);
        if (rc != HC_OK || len2 != len) {
            prop_fail(&seal_ok, "round %u: second seal: %d, %zu bytes", i, rc, len2);
        } else if (memcmp(body, body2, 16) == 0 || memcmp(body + 21, body2 + 21, 65) == 0) {
            prop_fail(&fresh, "round %u: salt %s, key %s", i,
                      memcmp(body, body2, 16) == 0 ? "repeated" : "fresh",
                      memcmp(body + 21, body2 + 21, 65) == 0 ? "repeated" : "fresh");
        } else {
            stage = t_webpush_open(ua, auth, body2, len2, opened, &opened_len, &rs, &idlen);
            if (stage != 0 || opened_len != pt_len || memcmp(opened, plaintext, pt_len) != 0) {
                prop_fail(&opens, "round %u (second seal): stage %d", i, stage);
            }
        }
    next:
        hc_webpush_sub_free(sub);
        EVP_PKEY_free(ua);
    }
    /* Two seals per round for seal_ok and opens. */
    PROP_CHECK(seal_ok, 2 * WEBPUSH_ROUNDS);
    PROP_CHECK(lengths, WEBPUSH_ROUNDS);
    PROP_CHECK(header, WEBPUSH_ROUNDS);
    PROP_CHECK(opens, 2 * WEBPUSH_ROUNDS);
    PROP_CHECK(fresh, WEBPUSH_ROUNDS);
    PROP_CHECK(maxpt, WEBPUSH_ROUNDS);
    CHECK(zero_body >= 50 && padded_body >= 200 && max_fill >= 20,
          "coverage: %u unpadded, %u padded, %u full bodies", zero_body, padded_body, max_fill);
done:
    free(plaintext);
    free(body);
    free(body2);
    free(opened);
    hc_sealer_free(sealer);
}

void test_roundtrip_es256(void) {
    prop sign = {"hc_es256_sign succeeds", 0, ""};
    prop own = {"hc_es256_verify accepts hc_es256_sign output", 0, ""};
    prop ossl = {"EVP_DigestVerify accepts the DER form of hc_es256_sign output", 0, ""};
    prop tamper = {"hc_es256_verify refuses the signature over a changed message", 0, ""};

    hc_p256_key *key = NULL;
    EVP_PKEY *pkey = NULL;
    uint8_t pub[65];
    uint8_t msg[257];
    unsigned leading_zero = 0;
    for (unsigned i = 0; i < ES256_ROUNDS; i++) {
        if (i % 1000 == 0) { /* a new key every 1000 signatures */
            hc_p256_key_free(key);
            EVP_PKEY_free(pkey);
            key = NULL;
            pkey = NULL;
            if (hc_p256_key_generate(&key) != HC_OK) {
                prop_fail(&sign, "round %u: key generation failed", i);
                break;
            }
            hc_p256_key_public(key, pub);
            pkey = t_p256_pkey(NULL, pub);
            if (pkey == NULL) {
                prop_fail(&ossl, "round %u: OpenSSL refuses the generated public key", i);
                break;
            }
        }
        size_t msg_len = t_prng_range(0, sizeof msg - 1);
        t_prng_fill(msg, msg_len);
        uint8_t sig[64];
        int rc = hc_es256_sign(key, msg, msg_len, sig);
        if (rc != HC_OK) {
            prop_fail(&sign, "round %u: %d (%s)", i, rc, hc_strerror(rc));
            continue;
        }
        leading_zero += sig[0] == 0 || sig[32] == 0;
        rc = hc_es256_verify(pub, 65, msg, msg_len, sig, 64);
        if (rc != HC_OK) {
            char hex[129];
            t_hex(sig, 64, hex);
            prop_fail(&own, "round %u: %d (%s), sig %s", i, rc, hc_strerror(rc), hex);
        }
        if (!t_ossl_es256_verify(pkey, msg, msg_len, sig)) {
            char hex[129];
            t_hex(sig, 64, hex);
            prop_fail(&ossl, "round %u: msg %zu bytes, sig %s", i, msg_len, hex);
        }
        if (i % 10 == 0) {
            msg[msg_len] = 0x5A;
            if (hc_es256_verify(pub, 65, msg, msg_len + 1, sig, 64) != HC_E_SIGNATURE_INVALID) {
                prop_fail(&tamper, "round %u", i);
            }
        }
    }
    hc_p256_key_free(key);
    EVP_PKEY_free(pkey);
    PROP_CHECK(sign, ES256_ROUNDS);
    PROP_CHECK(own, ES256_ROUNDS);
    PROP_CHECK(ossl, ES256_ROUNDS);
    PROP_CHECK(tamper, ES256_ROUNDS / 10);
    /* About 2/256 of signatures have r or s below 2^248; the fixed-width
     * encoding must have been exercised at least once. */
    CHECK(leading_zero >= 1, "no signature with a leading zero byte in r or s among %u",
          ES256_ROUNDS);
    t_note("es256: %u of %u signatures had r or s with a leading zero byte", leading_zero,
           ES256_ROUNDS);
}

/* ---- sharing across threads ---- */

/* hc_p256_key and hc_webpush_sub are documented as shareable between threads;
 * each thread uses its own hc_sealer. */
typedef struct {
    const hc_webpush_sub *sub;
    const hc_p256_key *key;
    EVP_PKEY *ua;
    const uint8_t *auth;
    const uint8_t *key_pub;
    uint64_t seed;
    unsigned bad;
    char first[160];
} thread_job;

#define THREADS 4
#define THREAD_ROUNDS 40u

static int thread_main(void *arg) {
    thread_job *job = arg;
    hc_sealer *sealer = NULL;
    if (hc_sealer_new(T_RECORD_SIZE, &sealer) != HC_OK) {
        job->bad++;
        snprintf(job->first, sizeof job->first, "hc_sealer_new failed");
        return 0;
    }
    uint8_t pt[512], body[1024], opened[1024], sig[64];
    uint64_t x = job->seed;
    for (unsigned i = 0; i < THREAD_ROUNDS; i++) {
        x = x * 6364136223846793005u + 1442695040888963407u;
        size_t pt_len = (size_t)(x >> 40) % sizeof pt;
        memset(pt, (int)(x >> 56), pt_len);
        size_t len = sizeof body, opened_len = 0;
        uint32_t rs;
        unsigned idlen;
        int rc = hc_webpush_seal(sealer, job->sub, pt, pt_len, 1024, body, &len);
        int stage = rc == HC_OK ? t_webpush_open(job->ua, job->auth, body, len, opened,
                                                 &opened_len, &rs, &idlen)
                                : -100;
        int rc_sign = hc_es256_sign(job->key, pt, pt_len, sig);
        int rc_verify = rc_sign == HC_OK ? hc_es256_verify(job->key_pub, 65, pt, pt_len, sig, 64)
                                         : -100;
        if (rc != HC_OK || stage != 0 || opened_len != pt_len || memcmp(opened, pt, pt_len) != 0 ||
            rc_verify != HC_OK) {
            if (job->bad++ == 0) {
                snprintf(job->first, sizeof job->first,
                         "round %u: seal %d, open stage %d, sign %d, verify %d", i, rc, stage,
                         rc_sign, rc_verify);
            }
        }
    }
    hc_sealer_free(sealer);
    return 0;
}

void test_roundtrip_threads(void) {
    EVP_PKEY *ua = EVP_EC_gen("P-256");
    uint8_t ua_public[65], auth[16], key_pub[65];
    hc_webpush_sub *sub = NULL;
    hc_p256_key *key = NULL;
    if (!CHECK(ua != NULL && t_pkey_public(ua, ua_public) && RAND_bytes(auth, 16) == 1 &&
                   hc_webpush_sub_new(ua_public, 65, auth, 16, &sub) == HC_OK &&
                   hc_p256_key_generate(&key) == HC_OK,
               "thread test setup")) {
        goto done;
    }
    hc_p256_key_public(key, key_pub);
    thread_job jobs[THREADS];
    thrd_t threads[THREADS];
    int started[THREADS] = {0};
    for (int i = 0; i < THREADS; i++) {
        jobs[i] = (thread_job){sub, key, ua, auth, key_pub, t_prng(), 0, ""};
        started[i] = thrd_create(&threads[i], thread_main, &jobs[i]) == thrd_success;
        CHECK(started[i], "thrd_create %d", i);
    }
    for (int i = 0; i < THREADS; i++) {
        if (started[i]) {
            thrd_join(threads[i], NULL);
            CHECK(jobs[i].bad == 0,
                  "thread %d sharing one hc_webpush_sub and hc_p256_key: %u of %u rounds failed; "
                  "first: %s",
                  i, jobs[i].bad, THREAD_ROUNDS, jobs[i].first);
        }
    }
done:
    hc_webpush_sub_free(sub);
    hc_p256_key_free(key);
    EVP_PKEY_free(ua);
}
