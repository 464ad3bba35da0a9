/* Compact JWS tokens: the signing of header.claims, VAPID and APNs (ES256). */
#include "internal.h"

#include <jansson.h>
#include <openssl/err.h>
#include <sodium.h>
#include <string.h>

/* Appends base64url(data) at out + *pos (capacity cap, NUL excluded). */
static void put_b64(char *out, size_t *pos, const void *data, size_t n)
{
    size_t enc = hc_base64url_encoded_length(n);
    sodium_bin2base64(out + *pos, enc + 1, data, n, sodium_base64_VARIANT_URLSAFE_NO_PADDING);
    *pos += enc;
}

int hc_jws_compact(const char *header_json, const char *claims_json, const hc_p256_key *es_key,
                   const hc_rsa_key *rsa_key, char *out, size_t *len)
{
    if (header_json == NULL || claims_json == NULL || len == NULL ||
        (es_key == NULL) == (rsa_key == NULL))
        return HC_E_INVALID_ARGUMENT;
    size_t h = strlen(header_json), c = strlen(claims_json);
    size_t sig_len = es_key != NULL ? HC_ES256_SIGNATURE_BYTES : hc_rsa_signature_size(rsa_key);
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

int hc_jws_sign_json(json_t *header, json_t *claims, const hc_p256_key *es_key,
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

int hc_has_space_or_control(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s <= 0x20 || *s == 0x7f) return 1;
    return 0;
}

/* "https://host[:port]" with a non-empty host and nothing after the authority. */
static int is_https_origin(const char *s)
{
    if (strncmp(s, "https://", 8) != 0 || hc_has_space_or_control(s)) return 0;
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

int hc_vapid_jwt(const hc_p256_key *key, const char *aud, const char *sub, int64_t exp,
                 int64_t now, char *out, size_t *len)
{
    if (key == NULL || aud == NULL || sub == NULL || len == NULL) return HC_E_INVALID_ARGUMENT;
    if (!is_https_origin(aud)) return HC_E_AUDIENCE;
    if (exp <= now || exp - now > HC_VAPID_MAX_TTL) return HC_E_EXPIRY;
    json_t *header = json_pack("{s:s, s:s}", "typ", "JWT", "alg", "ES256");
    json_t *claims = json_pack("{s:s, s:I, s:s}", "aud", aud, "exp", (json_int_t)exp, "sub", sub);
    return hc_jws_sign_json(header, claims, key, NULL, out, len);
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
    return hc_jws_sign_json(header, claims, key, NULL, out, len);
}

