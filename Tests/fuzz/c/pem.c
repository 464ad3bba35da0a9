/*
 * pem: the PEM readers, hc_p256_key_from_pem, hc_rsa_key_from_pem and
 * hc_rs256_verify_pem (a public key).
 *
 * Properties, for any text x:
 * - each reader gives only its documented codes: from_pem HC_E_PEM,
 *   HC_E_KEY_TYPE or HC_E_PRIVATE_KEY_RANGE; rsa_key_from_pem HC_E_PEM or
 *   HC_E_RSA_KEY; verify_pem HC_E_PEM, HC_E_RSA_KEY or HC_E_SIGNATURE_INVALID
 *   (no encrypted key is ever decrypted: there is no password);
 * - both private readers see the same first key: never both succeed, text
 *   unreadable as RSA is unreadable as P-256 too, and a key of another type is
 *   refused as such;
 * - a P-256 key satisfies fuzz_check_p256_key (valid point, PEM round trip,
 *   signatures verify); an RSA key asks for at least 256 signature bytes.
 */
#include "fuzz.h"

static void check_private(const char *pem, size_t len)
{
    hc_p256_key *ec = NULL;
    hc_rsa_key *rsa = NULL;
    int ec_rc = hc_p256_key_from_pem(pem, len, &ec);
    int rsa_rc = hc_rsa_key_from_pem(pem, len, &rsa);
    FUZZ_CHECK(ec_rc == HC_OK || ec_rc == HC_E_PEM || ec_rc == HC_E_KEY_TYPE ||
                   ec_rc == HC_E_PRIVATE_KEY_RANGE,
               "from_pem gave %d (%s)", ec_rc, hc_strerror(ec_rc));
    FUZZ_CHECK(rsa_rc == HC_OK || rsa_rc == HC_E_PEM || rsa_rc == HC_E_RSA_KEY,
               "rsa_key_from_pem gave %d (%s)", rsa_rc, hc_strerror(rsa_rc));
    FUZZ_CHECK((ec_rc == HC_OK) == (ec != NULL) && (rsa_rc == HC_OK) == (rsa != NULL),
               "a key without success or success without a key");
    FUZZ_CHECK(!(ec_rc == HC_OK && rsa_rc == HC_OK), "one text is both a P-256 and an RSA key");
    FUZZ_CHECK(rsa_rc != HC_E_PEM || ec_rc == HC_E_PEM,
               "unreadable as RSA, but from_pem gave %d (%s)", ec_rc, hc_strerror(ec_rc));
    FUZZ_CHECK(ec_rc != HC_OK || rsa_rc == HC_E_RSA_KEY,
               "a P-256 key given to rsa_key_from_pem gave %d (%s)", rsa_rc, hc_strerror(rsa_rc));
    FUZZ_CHECK(rsa_rc != HC_OK || ec_rc == HC_E_KEY_TYPE,
               "an RSA key given to from_pem gave %d (%s)", ec_rc, hc_strerror(ec_rc));
    if (ec != NULL) {
        uint8_t pub[HC_P256_PUBLIC_BYTES];
        fuzz_check_p256_key(ec, pub);
    }
    if (rsa != NULL) {
        size_t need = 0;
        int rc = hc_rs256_sign(rsa, (const uint8_t *)"x", 1, NULL, &need);
        FUZZ_CHECK(rc == HC_E_BUFFER_TOO_SMALL && need >= 256,
                   "an RSA key of at least 2048 bits needs %zu signature bytes (%d)", need, rc);
    }
    hc_p256_key_free(ec);
    hc_rsa_key_free(rsa);
}

static void check_public(const char *pem, size_t len)
{
    static const uint8_t sig[256] = {1};
    int rc = hc_rs256_verify_pem(pem, len, (const uint8_t *)"herald", 6, sig, sizeof sig);
    FUZZ_CHECK(rc == HC_E_PEM || rc == HC_E_RSA_KEY || rc == HC_E_SIGNATURE_INVALID,
               "verify_pem gave %d (%s)", rc, hc_strerror(rc));
}

FUZZ_INITIALIZE_CORE

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *pem = (char *)fuzz_copy(data, size);
    check_private(pem, size);
    check_public(pem, size);
    free(pem);
    return 0;
}
