/*
 * fcm_account: the Google service-account parser, hc_fcm_account_from_json,
 * and the assertion built from what it kept (hc_fcm_assertion).
 *
 * Properties, for any text x (read here a second time with jansson as the
 * reference):
 * - not a JSON object (duplicate names refused) -> HC_E_JSON;
 * - project_id, client_email or token_uri not a non-empty string, or
 *   private_key not a string -> HC_E_SERVICE_ACCOUNT;
 * - token_uri not "https://..." or either it or client_email holding a space
 *   or control character, or client_email without '@' -> HC_E_CLAIM;
 * - otherwise exactly what hc_rsa_key_from_pem says of private_key;
 * - on success the accessors return the JSON strings unchanged, and the
 *   assertion has the capacity contract of the header, refuses lifetimes 0
 *   and 3601, and carries {"alg":"RS256","typ":"JWT"} and the claims
 *   iss = client_email, scope, aud = token_uri, iat and exp = iat + lifetime.
 *   When the key is internally consistent (EVP_PKEY_pairwise_check), the
 *   signature verifies under its public key.
 */
#include "fuzz.h"
#include "test.h"

#include <jansson.h>
#include <openssl/bio.h>
#include <openssl/pem.h>

static const char *string_member(json_t *root, const char *name)
{
    return json_string_value(json_object_get(root, name));
}

static int has_space_or_control(json_t *string)
{
    const char *s = json_string_value(string);
    size_t n = json_string_length(string);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] <= 0x20 || s[i] == 0x7f) return 1;
    return 0;
}

/* The expected result code; HC_OK means "whatever the RSA reader says". */
static int reference_rc(json_t *root)
{
    if (root == NULL || !json_is_object(root)) return HC_E_JSON;
    static const char *required[] = {"project_id", "client_email", "token_uri"};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        const char *v = string_member(root, required[i]);
        if (v == NULL || *v == '\0') return HC_E_SERVICE_ACCOUNT;
    }
    if (string_member(root, "private_key") == NULL) return HC_E_SERVICE_ACCOUNT;
    json_t *uri = json_object_get(root, "token_uri"), *email = json_object_get(root, "client_email");
    if (strncmp(json_string_value(uri), "https://", 8) != 0 || has_space_or_control(uri) ||
        has_space_or_control(email) || strchr(json_string_value(email), '@') == NULL)
        return HC_E_CLAIM;
    return HC_OK;
}

static void check_same(const char *got, json_t *want, const char *what)
{
    FUZZ_CHECK(got != NULL && strlen(got) == json_string_length(want) &&
                   memcmp(got, json_string_value(want), strlen(got)) == 0,
               "%s differs from the JSON", what);
}

static void check_claim(json_t *claims, const char *name, const char *want)
{
    const char *got = string_member(claims, name);
    FUZZ_CHECK(got != NULL && strcmp(got, want) == 0, "assertion claim %s is wrong", name);
}

/* The RSA public key of the PEM in the account, as a PEM, when the key is
 * consistent enough to sign verifiably; NULL otherwise. */
static char *consistent_public_pem(const char *private_pem)
{
    char *out = NULL;
    BIO *bio = BIO_new_mem_buf(private_pem, -1);
    EVP_PKEY *pkey = bio != NULL ? PEM_read_bio_PrivateKey(bio, NULL, NULL, (void *)"") : NULL;
    EVP_PKEY_CTX *ctx = pkey != NULL ? EVP_PKEY_CTX_new_from_pkey(NULL, pkey, NULL) : NULL;
    if (ctx != NULL && EVP_PKEY_pairwise_check(ctx) == 1) out = t_pem_public(pkey);
    EVP_PKEY_CTX_free(ctx);
    EVP_PKEY_free(pkey);
    BIO_free(bio);
    return out;
}

static void check_assertion(const hc_fcm_account *account, json_t *root)
{
    const int64_t iat = 1700000000, lifetime = 1800;
    size_t need = 0;
    FUZZ_CHECK(hc_fcm_assertion(account, T_FCM_SCOPE, iat, 0, NULL, &need) == HC_E_EXPIRY &&
                   hc_fcm_assertion(account, T_FCM_SCOPE, iat, 3601, NULL, &need) == HC_E_EXPIRY,
               "a lifetime outside 1..3600 was accepted");
    int rc = hc_fcm_assertion(account, T_FCM_SCOPE, iat, lifetime, NULL, &need);
    FUZZ_CHECK(rc == HC_E_BUFFER_TOO_SMALL && need > 1, "assertion size query gave %d (%s)", rc,
               hc_strerror(rc));
    char *jwt = malloc(need);
    size_t len = need;
    FUZZ_CHECK(jwt != NULL, "out of memory");
    rc = hc_fcm_assertion(account, T_FCM_SCOPE, iat, lifetime, jwt, &len);
    /* A key that OpenSSL reads but cannot sign with is the only other outcome. */
    FUZZ_CHECK(rc == HC_OK || rc == HC_E_CRYPTO, "assertion gave %d (%s)", rc, hc_strerror(rc));
    if (rc != HC_OK) {
        free(jwt);
        return;
    }
    FUZZ_CHECK(len < need && jwt[len] == '\0', "assertion of %zu characters in %zu bytes", len,
               need);

    t_jwt parts;
    FUZZ_CHECK(t_jwt_parse(jwt, len, &parts), "the assertion is not a compact JWS");
    FUZZ_CHECK(strcmp(parts.header, "{\"alg\":\"RS256\",\"typ\":\"JWT\"}") == 0,
               "assertion header %s", parts.header);
    json_t *claims = json_loadb(parts.claims, parts.claims_len, JSON_REJECT_DUPLICATES, NULL);
    FUZZ_CHECK(claims != NULL && json_object_size(claims) == 5, "assertion claims are not 5 members");
    check_claim(claims, "iss", hc_fcm_account_client_email(account));
    check_claim(claims, "aud", hc_fcm_account_token_uri(account));
    check_claim(claims, "scope", T_FCM_SCOPE);
    FUZZ_CHECK(json_integer_value(json_object_get(claims, "iat")) == iat &&
                   json_integer_value(json_object_get(claims, "exp")) == iat + lifetime,
               "assertion iat/exp are wrong");
    json_decref(claims);

    char *public_pem = consistent_public_pem(string_member(root, "private_key"));
    if (public_pem != NULL) {
        rc = hc_rs256_verify_pem(public_pem, strlen(public_pem),
                                 (const uint8_t *)parts.signing_input, parts.signing_input_len,
                                 parts.sig, parts.sig_len);
        FUZZ_CHECK(rc == HC_OK, "the assertion does not verify: %s", hc_strerror(rc));
        free(public_pem);
    }
    t_jwt_free(&parts);
    free(jwt);
}

FUZZ_INITIALIZE_CORE

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *json = (char *)fuzz_copy(data, size);
    hc_fcm_account *account = NULL;
    int rc = hc_fcm_account_from_json(json, size, &account);
    FUZZ_CHECK((rc == HC_OK) == (account != NULL), "result %d with account %p", rc,
               (void *)account);

    json_t *root = json_loadb(json, size, JSON_REJECT_DUPLICATES, NULL);
    int want = reference_rc(root);
    if (want == HC_OK) {
        const char *pem = string_member(root, "private_key");
        hc_rsa_key *key = NULL;
        want = hc_rsa_key_from_pem(pem, strlen(pem), &key);
        hc_rsa_key_free(key);
    }
    FUZZ_CHECK(rc == want, "from_json gave %d (%s), want %d (%s)", rc, hc_strerror(rc), want,
               hc_strerror(want));
    if (account != NULL) {
        check_same(hc_fcm_account_project_id(account), json_object_get(root, "project_id"),
                   "project_id");
        check_same(hc_fcm_account_client_email(account), json_object_get(root, "client_email"),
                   "client_email");
        check_same(hc_fcm_account_token_uri(account), json_object_get(root, "token_uri"),
                   "token_uri");
        check_assertion(account, root);
    }
    hc_fcm_account_free(account);
    json_decref(root);
    free(json);
    return 0;
}
