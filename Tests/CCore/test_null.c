/*
 * test_null.c - a NULL where a pointer is required is refused with
 * HC_E_INVALID_ARGUMENT, for callers whose compiler does not see the header's
 * nonnull attributes (this file builds without them, as the library does).
 */
#define HC_NO_NONNULL

#include <stdlib.h>
#include <string.h>

#include "test.h"

static const char ua_public_b64[] =
    "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4";
static const char auth_b64[] = "BTBZMqHH6r4Tts7J_aSIgg";

static void valid_subscription(uint8_t pub[65], uint8_t auth[16]) {
    if (t_b64url_decode(ua_public_b64, pub, 65) != 65 || t_b64url_decode(auth_b64, auth, 16) != 16) {
        abort();
    }
}

/* ---- NULL pointers ---- */

void test_errors_null(void) {
    uint8_t pub[65], auth[16], buf[256], sig[64] = {0}, key32[32] = {0};
    valid_subscription(pub, auth);
    size_t len = sizeof buf;
    hc_p256_key *key = NULL;
    hc_webpush_sub *sub = NULL;
    hc_sealer *sealer = NULL;
    CHECK_RC(hc_p256_key_generate(&key), HC_OK);
    CHECK_RC(hc_webpush_sub_new(pub, 65, auth, 16, &sub), HC_OK);
    CHECK_RC(hc_sealer_new(T_RECORD_SIZE, &sealer), HC_OK);

    CHECK_RC(hc_p256_public_check(NULL, 65), HC_E_INVALID_ARGUMENT);
    CHECK_RC(hc_p256_key_from_raw(NULL, 32, &key), HC_E_INVALID_ARGUMENT);
    CHECK_RC(hc_p256_key_from_raw(key32, 32, NULL), HC_E_INVALID_ARGUMENT);
    CHECK_RC(hc_p256_key_generate(NULL), HC_E_INVALID_ARGUMENT);
    CHECK_RC(hc_p256_key_from_pem(NULL, 10, &key), HC_E_INVALID_ARGUMENT);
    CHECK_RC(hc_webpush_sub_new(NULL, 65, auth, 16, &sub), HC_E_INVALID_ARGUMENT);
    CHECK_RC(hc_webpush_sub_new(pub, 65, NULL, 16, &sub), HC_E_INVALID_ARGUMENT);
    CHECK_RC(hc_sealer_new(T_RECORD_SIZE, NULL), HC_E_INVALID_ARGUMENT);
    CHECK_RC(hc_es256_verify(NULL, 65, buf, 1, sig, 64), HC_E_INVALID_ARGUMENT);
    CHECK_RC(hc_es256_verify(pub, 65, buf, 1, NULL, 64), HC_E_INVALID_ARGUMENT);
    CHECK_RC(hc_es256_sign(NULL, buf, 1, sig), HC_E_INVALID_ARGUMENT);
    CHECK_RC(hc_base64url_decode("YQ", 2, buf, NULL), HC_E_INVALID_ARGUMENT);
    CHECK_RC(hc_base64url_encode(buf, 1, (char *)buf, NULL), HC_E_INVALID_ARGUMENT);
    CHECK_RC(hc_hkdf_expand(NULL, buf, 1, buf, 10), HC_E_INVALID_ARGUMENT);
    if (key != NULL && sub != NULL && sealer != NULL) {
        CHECK_RC(hc_webpush_seal(NULL, sub, buf, 1, 0, buf, &len), HC_E_INVALID_ARGUMENT);
        CHECK_RC(hc_webpush_seal(sealer, NULL, buf, 1, 0, buf, &len), HC_E_INVALID_ARGUMENT);
        CHECK_RC(hc_webpush_seal(sealer, sub, NULL, 1, 0, buf, &len), HC_E_INVALID_ARGUMENT);
        CHECK_RC(hc_webpush_seal(sealer, sub, buf, 1, 0, buf, NULL), HC_E_INVALID_ARGUMENT);
        len = sizeof buf;
        CHECK_RC(hc_vapid_jwt(key, NULL, "mailto:a@b.c", 2, 1, (char *)buf, &len),
                 HC_E_INVALID_ARGUMENT);
        len = sizeof buf;
        CHECK_RC(hc_vapid_jwt(NULL, "https://a.b", "mailto:a@b.c", 2, 1, (char *)buf, &len),
                 HC_E_INVALID_ARGUMENT);
        len = sizeof buf;
        CHECK_RC(hc_apns_jwt(key, NULL, "DEF123GHIJ", 1, (char *)buf, &len), HC_E_INVALID_ARGUMENT);
        CHECK_RC(hc_p256_ecdh(NULL, pub, key32), HC_E_INVALID_ARGUMENT);
    }
    len = sizeof buf;
    CHECK_RC(hc_secretbox_seal(NULL, NULL, 0, buf, 1, buf, &len), HC_E_INVALID_ARGUMENT);
    CHECK_RC(hc_fcm_account_from_json(NULL, 5, NULL), HC_E_INVALID_ARGUMENT);
    len = sizeof buf;
    CHECK_RC(hc_fcm_assertion(NULL, T_FCM_SCOPE, 1, 60, (char *)buf, &len), HC_E_INVALID_ARGUMENT);
    CHECK_RC(hc_rsa_key_from_pem(NULL, 5, NULL), HC_E_INVALID_ARGUMENT);

    /* Every *_free accepts NULL. */
    hc_p256_key_free(NULL);
    hc_rsa_key_free(NULL);
    hc_fcm_account_free(NULL);
    hc_webpush_sub_free(NULL);
    hc_sealer_free(NULL);
    CHECK(1, "the *_free functions accept NULL");

    hc_p256_key_free(key);
    hc_webpush_sub_free(sub);
    hc_sealer_free(sealer);
}
