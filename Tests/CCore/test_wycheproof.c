/*
 * test_wycheproof.c - Project Wycheproof vectors (Tests/Fixtures/wycheproof):
 * ECDH secp256r1 (ecpoint encoding), ECDSA P-256/SHA-256 in IEEE P1363 form,
 * and AES-GCM with 128-bit keys. One check per test case; a count line per file.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "test.h"

static json_t *load(const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/wycheproof/%s", t_fixtures, name);
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    CHECK(root != NULL && json_is_array(json_object_get(root, "testGroups")),
          "cannot load %s: %s (line %d)", path, root == NULL ? err.text : "no testGroups",
          err.line);
    return root;
}

static const char *str(const json_t *obj, const char *key) {
    const char *s = json_string_value(json_object_get(obj, key));
    return s != NULL ? s : "";
}

static uint8_t *hex_field(const json_t *obj, const char *key, size_t *len) {
    uint8_t *p = t_unhex(str(obj, key), len);
    if (p == NULL) {
        fprintf(stderr, "bad hex in field %s\n", key);
        abort();
    }
    return p;
}

typedef struct {
    unsigned total, valid, acceptable, invalid, failed;
} counts;

static void count(counts *c, const char *result, int ok) {
    c->total++;
    if (strcmp(result, "valid") == 0) {
        c->valid++;
    } else if (strcmp(result, "acceptable") == 0) {
        c->acceptable++;
    } else {
        c->invalid++;
    }
    if (!ok) {
        c->failed++;
    }
}

static void report(const char *file, const counts *c, const char *extra) {
    t_note("wycheproof %s: %u cases (%u valid, %u acceptable, %u invalid)%s, %u failed", file,
           c->total, c->valid, c->acceptable, c->invalid, extra, c->failed);
}

void test_wycheproof_ecdh(void) {
    static const char file[] = "ecdh_secp256r1_ecpoint_test.json";
    json_t *root = load(file);
    if (root == NULL) {
        return;
    }
    counts c = {0};
    unsigned other_len = 0;
    size_t gi;
    json_t *group;
    json_array_foreach(json_object_get(root, "testGroups"), gi, group) {
        CHECK(strcmp(str(group, "curve"), "secp256r1") == 0 &&
                  strcmp(str(group, "encoding"), "ecpoint") == 0,
              "%s group %zu: unexpected curve/encoding", file, gi);
        size_t ti;
        json_t *t;
        json_array_foreach(json_object_get(group, "tests"), ti, t) {
            long id = (long)json_integer_value(json_object_get(t, "tcId"));
            const char *result = str(t, "result");
            int expect_ok = strcmp(result, "invalid") != 0;
            size_t pub_len, priv_len, shared_len;
            uint8_t *pub = hex_field(t, "public", &pub_len);
            uint8_t *priv = hex_field(t, "private", &priv_len);
            uint8_t *shared = hex_field(t, "shared", &shared_len);
            int ok;

            if (pub_len != HC_P256_PUBLIC_BYTES) {
                /* Compressed or empty encodings: the library only takes
                 * uncompressed points, so every one must be refused. */
                other_len++;
                int rc = hc_p256_public_check(pub, pub_len);
                ok = CHECK(rc != HC_OK, "%s tcId %ld (%s, %zu-byte public): public_check returned %d",
                           file, id, result, pub_len, rc);
            } else {
                /* Normalise the scalar to 32 bytes: drop a leading 00, pad short ones. */
                uint8_t scalar[32] = {0};
                size_t skip = 0;
                while (priv_len - skip > 32 && priv[skip] == 0) {
                    skip++;
                }
                if (priv_len - skip > 32) {
                    fprintf(stderr, "%s tcId %ld: private key too long\n", file, id);
                    abort();
                }
                memcpy(scalar + 32 - (priv_len - skip), priv + skip, priv_len - skip);
                hc_p256_key *key = NULL;
                int rc_key = hc_p256_key_from_raw(scalar, 32, &key);
                int rc_check = hc_p256_public_check(pub, pub_len);
                int rc_ecdh = -1000;
                uint8_t secret[32] = {0};
                if (rc_key == HC_OK) {
                    rc_ecdh = hc_p256_ecdh(key, pub, secret);
                }
                if (expect_ok) {
                    ok = CHECK(rc_key == HC_OK && rc_check == HC_OK && rc_ecdh == HC_OK &&
                                   shared_len == 32 && memcmp(secret, shared, 32) == 0,
                               "%s tcId %ld (%s, %s): key %d, public_check %d, ecdh %d, secret %s",
                               file, id, result, str(t, "comment"), rc_key, rc_check, rc_ecdh,
                               memcmp(secret, shared, 32) == 0 ? "matches" : "differs");
                } else {
                    ok = CHECK(rc_key != HC_OK || rc_check != HC_OK || rc_ecdh != HC_OK,
                               "%s tcId %ld (invalid, %s): accepted (public_check %d, ecdh %d)",
                               file, id, str(t, "comment"), rc_check, rc_ecdh);
                    /* A point the check refuses must be refused by ECDH too. */
                    if (rc_key == HC_OK && rc_check != HC_OK) {
                        CHECK(rc_ecdh != HC_OK,
                              "%s tcId %ld: hc_p256_ecdh accepted a point public_check refuses",
                              file, id);
                    }
                }
                hc_p256_key_free(key);
            }
            count(&c, result, ok);
            free(pub);
            free(priv);
            free(shared);
        }
    }
    char extra[64];
    snprintf(extra, sizeof extra, " of which %u not 65 bytes", other_len);
    report(file, &c, extra);
    json_decref(root);
}

void test_wycheproof_ecdsa(void) {
    static const char file[] = "ecdsa_secp256r1_sha256_p1363_test.json";
    json_t *root = load(file);
    if (root == NULL) {
        return;
    }
    counts c = {0};
    size_t gi;
    json_t *group;
    json_array_foreach(json_object_get(root, "testGroups"), gi, group) {
        json_t *pk = json_object_get(group, "publicKey");
        CHECK(strcmp(str(pk, "curve"), "secp256r1") == 0 && strcmp(str(group, "sha"), "SHA-256") == 0,
              "%s group %zu: unexpected curve/hash", file, gi);
        size_t pub_len;
        uint8_t *pub = hex_field(pk, "uncompressed", &pub_len);
        size_t ti;
        json_t *t;
        json_array_foreach(json_object_get(group, "tests"), ti, t) {
            long id = (long)json_integer_value(json_object_get(t, "tcId"));
            const char *result = str(t, "result");
            size_t msg_len, sig_len;
            uint8_t *msg = hex_field(t, "msg", &msg_len);
            uint8_t *sig = hex_field(t, "sig", &sig_len);
            int rc = hc_es256_verify(pub, pub_len, msg, msg_len, sig, sig_len);
            int ok;
            if (strcmp(result, "valid") == 0) {
                ok = CHECK(rc == HC_OK, "%s tcId %ld (valid, %s): got %d (%s)", file, id,
                           str(t, "comment"), rc, hc_strerror(rc));
            } else if (strcmp(result, "invalid") == 0) {
                ok = CHECK(rc != HC_OK, "%s tcId %ld (invalid, %s): signature accepted", file, id,
                           str(t, "comment"));
                if (rc != HC_OK) {
                    /* The refusal is one of the two signature codes. */
                    CHECK(rc == (sig_len == 64 ? HC_E_SIGNATURE_INVALID : HC_E_SIGNATURE_LENGTH),
                          "%s tcId %ld: %zu-byte signature refused with %d (%s)", file, id,
                          sig_len, rc, hc_strerror(rc));
                }
            } else {
                ok = 1; /* acceptable: either answer */
                CHECK(1, "acceptable");
            }
            count(&c, result, ok);
            free(msg);
            free(sig);
        }
        free(pub);
    }
    report(file, &c, "");
    json_decref(root);
}

void test_wycheproof_aes_gcm(void) {
    static const char file[] = "aes_gcm_test.json";
    json_t *root = load(file);
    if (root == NULL) {
        return;
    }
    counts c = {0};
    unsigned skipped = 0, refused_iv = 0, refused_long_iv = 0;
    size_t gi;
    json_t *group;
    json_array_foreach(json_object_get(root, "testGroups"), gi, group) {
        long key_size = (long)json_integer_value(json_object_get(group, "keySize"));
        long iv_size = (long)json_integer_value(json_object_get(group, "ivSize"));
        long tag_size = (long)json_integer_value(json_object_get(group, "tagSize"));
        if (key_size != 128) {
            skipped += (unsigned)json_array_size(json_object_get(group, "tests"));
            continue;
        }
        size_t ti;
        json_t *t;
        json_array_foreach(json_object_get(group, "tests"), ti, t) {
            long id = (long)json_integer_value(json_object_get(t, "tcId"));
            const char *result = str(t, "result");
            size_t key_len, iv_len, aad_len, msg_len, ct_len, tag_len;
            uint8_t *key = hex_field(t, "key", &key_len);
            uint8_t *iv = hex_field(t, "iv", &iv_len);
            uint8_t *aad = hex_field(t, "aad", &aad_len);
            uint8_t *msg = hex_field(t, "msg", &msg_len);
            uint8_t *ct = hex_field(t, "ct", &ct_len);
            uint8_t *tag = hex_field(t, "tag", &tag_len);
            uint8_t *out = malloc(msg_len + ct_len + 1);
            uint8_t got_tag[16];
            int ok;
            if (key_len != 16 || iv_len * 8 != (size_t)iv_size || tag_len * 8 != (size_t)tag_size) {
                fprintf(stderr, "%s tcId %ld: sizes disagree with the group\n", file, id);
                abort();
            }
            if (strcmp(result, "valid") == 0) {
                int rc_enc = hc_aes128gcm_encrypt(key, iv, iv_len, aad, aad_len, msg, msg_len, out,
                                                  got_tag, tag_len);
                int enc_ok = rc_enc == HC_OK && memcmp(out, ct, ct_len) == 0 &&
                             memcmp(got_tag, tag, tag_len) == 0;
                memset(out, 0, msg_len + 1);
                int rc_dec = hc_aes128gcm_decrypt(key, iv, iv_len, aad, aad_len, ct, ct_len, tag,
                                                  tag_len, out);
                int dec_ok = rc_dec == HC_OK && memcmp(out, msg, msg_len) == 0;
                if (iv_len > 128 && rc_enc == HC_E_INVALID_ARGUMENT &&
                    rc_dec == HC_E_INVALID_ARGUMENT) {
                    /* OpenSSL 3.0's GCM takes IVs of at most 128 bytes (as do
                     * most libraries); refusing a longer one as an argument
                     * error is acceptable, failing inside OpenSSL is not. */
                    enc_ok = dec_ok = 1;
                    refused_long_iv++;
                }
                ok = CHECK(enc_ok && dec_ok,
                           "%s tcId %ld (valid, iv %ld bits, %s): encrypt %d (%s), decrypt %d (%s)",
                           file, id, iv_size, str(t, "comment"), rc_enc,
                           enc_ok ? "matches" : "wrong", rc_dec, dec_ok ? "matches" : "wrong");
            } else {
                int rc = hc_aes128gcm_decrypt(key, iv, iv_len, aad, aad_len, ct, ct_len, tag,
                                              tag_len, out);
                ok = CHECK(rc != HC_OK, "%s tcId %ld (%s, iv %ld bits, %s): decryption succeeded",
                           file, id, result, iv_size, str(t, "comment"));
                if (rc != HC_OK) {
                    /* A zero-length IV may be refused as an argument; anything
                     * else is an authentication failure. */
                    CHECK(rc == HC_E_DECRYPT || (iv_len == 0 && rc == HC_E_INVALID_ARGUMENT),
                          "%s tcId %ld: refused with %d (%s)", file, id, rc, hc_strerror(rc));
                    refused_iv += iv_len == 0 && rc == HC_E_INVALID_ARGUMENT;
                }
                if (iv_len == 0) {
                    int rc_enc = hc_aes128gcm_encrypt(key, iv, 0, aad, aad_len, msg, msg_len, out,
                                                      got_tag, tag_len);
                    CHECK(rc_enc != HC_OK, "%s tcId %ld: encrypt with an empty IV succeeded", file,
                          id);
                }
            }
            count(&c, result, ok);
            free(key);
            free(iv);
            free(aad);
            free(msg);
            free(ct);
            free(tag);
            free(out);
        }
    }
    char extra[160];
    snprintf(extra, sizeof extra,
             " with 128-bit keys (%u other key sizes skipped; %u empty-IV and %u over-128-byte-IV "
             "refusals)",
             skipped, refused_iv, refused_long_iv);
    report(file, &c, extra);
    json_decref(root);
}
