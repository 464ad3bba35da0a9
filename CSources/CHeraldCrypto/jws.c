/* Compact JWS tokens: VAPID and APNs (ES256), the FCM OAuth assertion (RS256). */
#include "internal.h"

#include <jansson.h>
#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

struct hc_rsa_key {
    EVP_PKEY *pkey;
};

struct hc_fcm_account {
    hc_rsa_key *key;
    char *project_id;
    char *client_email;
    char *token_uri;
};

static int no_password(char *buf, int size, int rwflag, void *u)
{
    (void)buf; (void)size; (void)rwflag; (void)u;
    return 0;
}

/* Appends base64url(data) at out + *pos (capacity cap, NUL excluded). */
static void put_b64(char *out, size_t *pos, const void *data, size_t n)
{
    size_t enc = hc_base64url_encoded_length(n);
    sodium_bin2base64(out + *pos, enc + 1, data, n, sodium_base64_VARIANT_URLSAFE_NO_PADDING);
    *pos += enc;
}

static size_t rsa_signature_size(const hc_rsa_key *k)
{
    return (size_t)EVP_PKEY_get_size(k->pkey);
}

int hc_jws_compact(const char *header_json, const char *claims_json, const hc_p256_key *es_key,
                   const hc_rsa_key *rsa_key, char *out, size_t *len)
{
    if (header_json == NULL || claims_json == NULL || len == NULL ||
        (es_key == NULL) == (rsa_key == NULL))
        return HC_E_INVALID_ARGUMENT;
    size_t h = strlen(header_json), c = strlen(claims_json);
    size_t sig_len = es_key != NULL ? HC_ES256_SIGNATURE_BYTES : rsa_signature_size(rsa_key);
    size_t need = hc_base64url_encoded_length(h) + 1 + hc_base64url_encoded_length(c) + 1 +
                  hc_base64url_encoded_length(sig_len);
    if (out == NULL || *len < need + 1) {
        *len = need + 1;
        return HC_E_BUFFER_TOO_SMALL;
    }
    size_t pos = 0;
    put_b64(out, &pos, header_json, h);
    out[pos++] = '.';
    put_b64(out, &pos, claims_json, c);
    size_t signed_len = pos;
    uint8_t sig[1024];
    int rc;
    if (sig_len > sizeof sig) return HC_E_RSA_KEY;
    if (es_key != NULL) {
        rc = hc_es256_sign(es_key, (const uint8_t *)out, signed_len, sig);
    } else {
        size_t n = sizeof sig;
        rc = hc_rs256_sign(rsa_key, (const uint8_t *)out, signed_len, sig, &n);
        sig_len = n;
    }
    if (rc != HC_OK) {
        sodium_memzero(out, *len);
        return rc;
    }
    out[pos++] = '.';
    put_b64(out, &pos, sig, sig_len);
    out[pos] = '\0';
    *len = pos;
    return HC_OK;
}

/* Serialises a jansson object compactly (insertion order kept) and signs it. */
static int sign_json(json_t *header, json_t *claims, const hc_p256_key *es_key,
                     const hc_rsa_key *rsa_key, char *out, size_t *len)
{
    int rc = HC_E_JSON;
    char *h = NULL, *c = NULL;
    if (header == NULL || claims == NULL) goto out;
    h = json_dumps(header, JSON_COMPACT);
    c = json_dumps(claims, JSON_COMPACT);
    if (h == NULL || c == NULL) goto out;
    rc = hc_jws_compact(h, c, es_key, rsa_key, out, len);
out:
    hc_json_free(h);
    hc_json_free(c);
    json_decref(header);
    json_decref(claims);
    return rc;
}

static int has_space_or_control(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s <= 0x20 || *s == 0x7f) return 1;
    return 0;
}

/* "https://host[:port]" with a non-empty host and nothing after the authority. */
static int is_https_origin(const char *s)
{
    if (strncmp(s, "https://", 8) != 0 || has_space_or_control(s)) return 0;
    const char *host = s + 8;
    if (*host == '\0' || *host == ':') return 0;
    if (strpbrk(host, "/?#@\\") != NULL) return 0;
    const char *colon = strrchr(host, ':');
    if (colon != NULL && strchr(host, ']') == NULL) {
        if (colon[1] == '\0') return 0;
        for (const char *p = colon + 1; *p; p++)
            if (*p < '0' || *p > '9') return 0;
    }
    return 1;
}

static int is_vapid_subject(const char *s)
{
    if (has_space_or_control(s)) return 0;
    if (strncmp(s, "mailto:", 7) == 0) {
        const char *at = strchr(s + 7, '@');
        return at != NULL && at > s + 7 && at[1] != '\0' && strncmp(s + 7, "mailto:", 7) != 0;
    }
    if (strncmp(s, "https://", 8) == 0) {
        const char *host = s + 8;
        return *host != '\0' && *host != '/' && *host != ':' && *host != '@';
    }
    return 0;
}

int hc_vapid_jwt(const hc_p256_key *key, const char *aud, const char *sub, int64_t exp,
                 int64_t now, char *out, size_t *len)
{
    if (key == NULL || aud == NULL || sub == NULL || len == NULL) return HC_E_INVALID_ARGUMENT;
    if (!is_https_origin(aud)) return HC_E_AUDIENCE;
    if (!is_vapid_subject(sub)) return HC_E_SUBJECT;
    if (exp <= now || exp - now > HC_VAPID_MAX_TTL) return HC_E_EXPIRY;
    json_t *header = json_pack("{s:s, s:s}", "typ", "JWT", "alg", "ES256");
    json_t *claims = json_pack("{s:s, s:I, s:s}", "aud", aud, "exp", (json_int_t)exp, "sub", sub);
    return sign_json(header, claims, key, NULL, out, len);
}

int hc_vapid_authorization(const hc_p256_key *key, const char *aud, const char *sub, int64_t exp,
                           int64_t now, char *out, size_t *len)
{
    if (key == NULL || aud == NULL || sub == NULL || len == NULL) return HC_E_INVALID_ARGUMENT;
    char jwt[1024];
    size_t jwt_len = sizeof jwt;
    int rc = hc_vapid_jwt(key, aud, sub, exp, now, jwt, &jwt_len);
    if (rc == HC_E_BUFFER_TOO_SMALL) return HC_E_CLAIM; /* claims far longer than any URL */
    if (rc != HC_OK) return rc;
    size_t need = 8 + jwt_len + 4 + hc_base64url_encoded_length(HC_P256_PUBLIC_BYTES);
    if (out == NULL || *len < need + 1) {
        *len = need + 1;
        return HC_E_BUFFER_TOO_SMALL;
    }
    size_t pos = 0;
    memcpy(out, "vapid t=", 8);
    pos = 8;
    memcpy(out + pos, jwt, jwt_len);
    pos += jwt_len;
    memcpy(out + pos, ", k=", 4);
    pos += 4;
    put_b64(out, &pos, key->pub, HC_P256_PUBLIC_BYTES);
    out[pos] = '\0';
    *len = pos;
    return HC_OK;
}

static int is_apns_id(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++)
        if (!((s[n] >= 'A' && s[n] <= 'Z') || (s[n] >= '0' && s[n] <= '9'))) return 0;
    return n == 10;
}

int hc_apns_jwt(const hc_p256_key *key, const char *key_id, const char *team_id, int64_t iat,
                char *out, size_t *len)
{
    if (key == NULL || key_id == NULL || team_id == NULL || len == NULL)
        return HC_E_INVALID_ARGUMENT;
    if (!is_apns_id(key_id) || !is_apns_id(team_id) || iat <= 0) return HC_E_CLAIM;
    json_t *header = json_pack("{s:s, s:s}", "alg", "ES256", "kid", key_id);
    json_t *claims = json_pack("{s:s, s:I}", "iss", team_id, "iat", (json_int_t)iat);
    return sign_json(header, claims, key, NULL, out, len);
}

int hc_rsa_key_from_pem(const char *pem, size_t pem_len, hc_rsa_key **out)
{
    if (pem == NULL || out == NULL || pem_len > INT32_MAX) return HC_E_INVALID_ARGUMENT;
    if (hc_init() != HC_OK) return HC_E_CRYPTO;
    int rc = HC_E_PEM;
    BIO *bio = BIO_new_mem_buf(pem, (int)pem_len);
    if (bio == NULL) return HC_E_NO_MEMORY;
    EVP_PKEY *pkey = PEM_read_bio_PrivateKey_ex(bio, NULL, no_password, NULL, NULL, NULL);
    if (pkey == NULL) goto out;
    rc = HC_E_RSA_KEY;
    if (!EVP_PKEY_is_a(pkey, "RSA") || EVP_PKEY_get_bits(pkey) < 2048) goto out;
    hc_rsa_key *key = OPENSSL_zalloc(sizeof *key);
    if (key == NULL) {
        rc = HC_E_NO_MEMORY;
        goto out;
    }
    key->pkey = pkey;
    pkey = NULL;
    *out = key;
    rc = HC_OK;
out:
    EVP_PKEY_free(pkey);
    BIO_free(bio);
    ERR_clear_error();
    return rc;
}

void hc_rsa_key_free(hc_rsa_key *key)
{
    if (key == NULL) return;
    EVP_PKEY_free(key->pkey);
    OPENSSL_free(key);
}

int hc_rs256_sign(const hc_rsa_key *key, const uint8_t *msg, size_t msg_len, uint8_t *sig,
                  size_t *len)
{
    if (key == NULL || len == NULL || (msg == NULL && msg_len > 0)) return HC_E_INVALID_ARGUMENT;
    size_t need = rsa_signature_size(key);
    if (sig == NULL || *len < need) {
        *len = need;
        return HC_E_BUFFER_TOO_SMALL;
    }
    int rc = HC_E_CRYPTO;
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    if (md == NULL) return HC_E_NO_MEMORY;
    size_t n = *len;
    if (EVP_DigestSignInit_ex(md, NULL, "SHA256", NULL, NULL, key->pkey, NULL) > 0 &&
        EVP_DigestSign(md, sig, &n, msg, msg_len) > 0) {
        *len = n;
        rc = HC_OK;
    }
    EVP_MD_CTX_free(md);
    ERR_clear_error();
    return rc;
}

int hc_rs256_verify_pem(const char *public_pem, size_t pem_len, const uint8_t *msg,
                        size_t msg_len, const uint8_t *sig, size_t sig_len)
{
    if (public_pem == NULL || sig == NULL || (msg == NULL && msg_len > 0) || pem_len > INT32_MAX)
        return HC_E_INVALID_ARGUMENT;
    if (hc_init() != HC_OK) return HC_E_CRYPTO;
    int rc = HC_E_PEM;
    EVP_MD_CTX *md = NULL;
    BIO *bio = BIO_new_mem_buf(public_pem, (int)pem_len);
    if (bio == NULL) return HC_E_NO_MEMORY;
    EVP_PKEY *pkey = PEM_read_bio_PUBKEY_ex(bio, NULL, NULL, NULL, NULL, NULL);
    if (pkey == NULL) goto out;
    rc = HC_E_RSA_KEY;
    if (!EVP_PKEY_is_a(pkey, "RSA")) goto out;
    rc = HC_E_CRYPTO;
    md = EVP_MD_CTX_new();
    if (md == NULL || EVP_DigestVerifyInit_ex(md, NULL, "SHA256", NULL, NULL, pkey, NULL) <= 0)
        goto out;
    rc = EVP_DigestVerify(md, sig, sig_len, msg, msg_len) == 1 ? HC_OK : HC_E_SIGNATURE_INVALID;
out:
    EVP_MD_CTX_free(md);
    EVP_PKEY_free(pkey);
    BIO_free(bio);
    ERR_clear_error();
    return rc;
}

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
    if (strncmp(a->token_uri, "https://", 8) != 0 || has_space_or_control(a->token_uri) ||
        has_space_or_control(a->client_email) || strchr(a->client_email, '@') == NULL)
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

int hc_fcm_assertion(const hc_fcm_account *a, int64_t iat, int64_t lifetime, char *out,
                     size_t *len)
{
    if (a == NULL || len == NULL) return HC_E_INVALID_ARGUMENT;
    if (lifetime < 1 || lifetime > 3600 || iat <= 0) return HC_E_EXPIRY;
    json_t *header = json_pack("{s:s, s:s}", "alg", "RS256", "typ", "JWT");
    json_t *claims = json_pack("{s:s, s:s, s:s, s:I, s:I}", "iss", a->client_email, "scope",
                               HC_FCM_SCOPE, "aud", a->token_uri, "iat", (json_int_t)iat, "exp",
                               (json_int_t)(iat + lifetime));
    return sign_json(header, claims, NULL, a->key, out, len);
}
