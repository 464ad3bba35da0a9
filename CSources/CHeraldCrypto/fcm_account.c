/* The Google service account and its OAuth2 JWT-bearer assertion (RS256). */
#include "internal.h"

#include <jansson.h>
#include <openssl/crypto.h>
#include <string.h>

struct hc_fcm_account {
    hc_rsa_key *key;
    char *project_id;
    char *client_email;
    char *token_uri;
};

static char *dup_field(json_t *root, const char *name)
{
    const char *v = json_string_value(json_object_get(root, name));
    if (v == NULL || *v == '\0') return NULL;
    return OPENSSL_strdup(v);
}

int hc_fcm_account_from_json(const char *json, size_t json_len, hc_fcm_account **out)
{
    if (json == NULL || out == NULL) return HC_E_INVALID_ARGUMENT;
    if (hc_init() != HC_OK) return HC_E_CRYPTO;
    json_error_t err;
    json_t *root = json_loadb(json, json_len, JSON_REJECT_DUPLICATES, &err);
    if (root == NULL || !json_is_object(root)) {
        json_decref(root);
        return HC_E_JSON;
    }
    int rc = HC_E_NO_MEMORY;
    hc_fcm_account *a = OPENSSL_zalloc(sizeof *a);
    if (a == NULL) goto out;
    rc = HC_E_SERVICE_ACCOUNT;
    const char *pem = json_string_value(json_object_get(root, "private_key"));
    a->project_id = dup_field(root, "project_id");
    a->client_email = dup_field(root, "client_email");
    a->token_uri = dup_field(root, "token_uri");
    if (pem == NULL || a->project_id == NULL || a->client_email == NULL || a->token_uri == NULL)
        goto out;
    rc = HC_E_CLAIM;
    if (strncmp(a->token_uri, "https://", 8) != 0 || hc_has_space_or_control(a->token_uri) ||
        hc_has_space_or_control(a->client_email) || strchr(a->client_email, '@') == NULL)
        goto out;
    rc = hc_rsa_key_from_pem(pem, strlen(pem), &a->key);
    if (rc != HC_OK) goto out;
    *out = a;
    a = NULL;
out:
    hc_fcm_account_free(a);
    json_decref(root); /* strings are wiped on free by the core's jansson allocator */
    return rc;
}

void hc_fcm_account_free(hc_fcm_account *a)
{
    if (a == NULL) return;
    hc_rsa_key_free(a->key);
    OPENSSL_free(a->project_id);
    OPENSSL_free(a->client_email);
    OPENSSL_free(a->token_uri);
    OPENSSL_free(a);
}

const char *hc_fcm_account_project_id(const hc_fcm_account *a) { return a->project_id; }
const char *hc_fcm_account_client_email(const hc_fcm_account *a) { return a->client_email; }
const char *hc_fcm_account_token_uri(const hc_fcm_account *a) { return a->token_uri; }

/* RFC 6749 section 3.3: scope-tokens of %x21 / %x23-5B / %x5D-7E separated
 * by single spaces. */
static int is_oauth_scope(const char *s)
{
    int in_token = 0;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == ' ') {
            if (!in_token) return 0;
            in_token = 0;
        } else if (c >= 0x21 && c <= 0x7e && c != '"' && c != '\\') {
            in_token = 1;
        } else {
            return 0;
        }
    }
    return in_token;
}

int hc_fcm_assertion(const hc_fcm_account *a, const char *scope, int64_t iat, int64_t lifetime,
                     char *out, size_t *len)
{
    if (a == NULL || scope == NULL || len == NULL) return HC_E_INVALID_ARGUMENT;
    if (!is_oauth_scope(scope)) return HC_E_CLAIM;
    if (lifetime < 1 || lifetime > 3600 || iat <= 0) return HC_E_EXPIRY;
    json_t *header = json_pack("{s:s, s:s}", "alg", "RS256", "typ", "JWT");
    json_t *claims = json_pack("{s:s, s:s, s:s, s:I, s:I}", "iss", a->client_email, "scope",
                               scope, "aud", a->token_uri, "iat", (json_int_t)iat, "exp",
                               (json_int_t)(iat + lifetime));
    return hc_jws_sign_json(header, claims, NULL, a->key, out, len);
}
