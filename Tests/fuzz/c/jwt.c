/*
 * jwt: the claim checks and JSON of the ES256 tokens. The VAPID audience is
 * the origin of a subscription endpoint a client sent; the subject, key id
 * and team id come from the configuration.
 *
 * Input: aud NUL sub NUL kid NUL team NUL, then 4 bytes of expiry offset
 * (missing pieces are empty).
 *
 * Properties:
 * - hc_vapid_jwt checks aud, then exp in (now, now + 86400], and fails only
 *   with HC_E_AUDIENCE, HC_E_EXPIRY or HC_E_JSON (text jansson refuses, such
 *   as invalid UTF-8); the subject is the caller's to check and is written as
 *   given;
 * - an accepted aud is "https://" and a non-empty authority with no space,
 *   control character, '/', '?', '#', '@' or '\';
 * - the token is header.claims.signature with exactly {"typ":"JWT","alg":"ES256"}
 *   and {"aud","exp","sub"} holding the inputs, and it verifies;
 * - hc_vapid_authorization is "vapid t=" + a token with the same header and
 *   claims + ", k=" + the base64url public key;
 * - hc_apns_jwt succeeds exactly when kid and team are 10 characters of A-Z
 *   and 0-9, with {"alg":"ES256","kid"} and {"iss","iat"}, and verifies.
 */
#include "fuzz.h"
#include "test.h"

#include <jansson.h>

static hc_p256_key *key;
static uint8_t pub[HC_P256_PUBLIC_BYTES];

static int has_space_or_control(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s <= 0x20 || *s == 0x7f) return 1;
    return 0;
}

/* Decodes and verifies a compact JWS; returns its claims (free with json_decref). */
static json_t *open_token(const char *jwt, size_t len, const char *want_header)
{
    t_jwt parts;
    FUZZ_CHECK(t_jwt_parse(jwt, len, &parts), "not a compact JWS");
    FUZZ_CHECK(strcmp(parts.header, want_header) == 0, "header %s, want %s", parts.header,
               want_header);
    int rc = hc_es256_verify(pub, sizeof pub, (const uint8_t *)parts.signing_input,
                             parts.signing_input_len, parts.sig, parts.sig_len);
    FUZZ_CHECK(rc == HC_OK, "the token does not verify: %s", hc_strerror(rc));
    json_t *claims = json_loadb(parts.claims, parts.claims_len, JSON_REJECT_DUPLICATES, NULL);
    FUZZ_CHECK(claims != NULL && json_is_object(claims), "the claims are not a JSON object");
    t_jwt_free(&parts);
    return claims;
}

static void check_string_claim(json_t *claims, const char *name, const char *want)
{
    const char *got = json_string_value(json_object_get(claims, name));
    FUZZ_CHECK(got != NULL && strcmp(got, want) == 0, "claim %s is not the input", name);
}

static void check_accepted_aud(const char *aud)
{
    FUZZ_CHECK(strncmp(aud, "https://", 8) == 0 && aud[8] != '\0' && aud[8] != ':',
               "accepted audience without an https authority");
    FUZZ_CHECK(!has_space_or_control(aud) && strpbrk(aud + 8, "/?#@\\") == NULL,
               "accepted audience with a path, query, fragment, userinfo or space");
}

static void check_vapid(const char *aud, const char *sub, int64_t offset)
{
    const int64_t now = 1700000000, exp = now + offset;
    char jwt[1024];
    size_t len = sizeof jwt;
    int rc = hc_vapid_jwt(key, aud, sub, exp, now, jwt, &len);
    if (rc == HC_E_BUFFER_TOO_SMALL) return; /* long claims: the size contract is checked below */
    FUZZ_CHECK(rc == HC_OK || rc == HC_E_AUDIENCE || rc == HC_E_EXPIRY ||
                   rc == HC_E_JSON,
               "vapid_jwt gave %d (%s)", rc, hc_strerror(rc));
    if (rc == HC_E_AUDIENCE) return;
    check_accepted_aud(aud);
    FUZZ_CHECK((rc == HC_E_EXPIRY) == (offset <= 0 || offset > HC_VAPID_MAX_TTL),
               "expiry offset %lld gave %d (%s)", (long long)offset, rc, hc_strerror(rc));
    if (rc != HC_OK) return;

    json_t *claims = open_token(jwt, len, "{\"typ\":\"JWT\",\"alg\":\"ES256\"}");
    FUZZ_CHECK(json_object_size(claims) == 3, "VAPID claims are not 3 members");
    check_string_claim(claims, "aud", aud);
    check_string_claim(claims, "sub", sub);
    FUZZ_CHECK(json_integer_value(json_object_get(claims, "exp")) == exp, "exp is not the input");
    json_decref(claims);

    /* "vapid t=<header.claims.sig>, k=<public key>": the signature is randomised. */
    char auth[1200], k[100];
    size_t auth_len = sizeof auth, k_len = sizeof k;
    rc = hc_vapid_authorization(key, aud, sub, exp, now, auth, &auth_len);
    FUZZ_CHECK(rc == HC_OK || rc == HC_E_CLAIM, "vapid_authorization gave %d (%s)", rc,
               hc_strerror(rc));
    if (rc != HC_OK) return;
    FUZZ_CHECK(hc_base64url_encode(pub, sizeof pub, k, &k_len) == HC_OK, "encode failed");
    const char *last_dot = strrchr(jwt, '.');
    size_t signed_len = (size_t)(last_dot - jwt) + 1;
    FUZZ_CHECK(auth_len > 8 + 4 + k_len && memcmp(auth, "vapid t=", 8) == 0 &&
                   memcmp(auth + 8, jwt, signed_len) == 0,
               "the authorization does not carry the token's header and claims");
    FUZZ_CHECK(memcmp(auth + auth_len - k_len - 4, ", k=", 4) == 0 &&
                   memcmp(auth + auth_len - k_len, k, k_len) == 0 && auth[auth_len] == '\0',
               "the authorization does not end with the public key");
    char *token = auth + 8;
    size_t token_len = auth_len - 8 - 4 - k_len;
    json_decref(open_token(token, token_len, "{\"typ\":\"JWT\",\"alg\":\"ES256\"}"));
}

static int is_apns_id(const char *s)
{
    size_t n = strlen(s);
    if (n != 10) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9'))) return 0;
    return 1;
}

static void check_apns(const char *kid, const char *team)
{
    const int64_t iat = 1700000000;
    size_t need = 0;
    int rc = hc_apns_jwt(key, kid, team, iat, NULL, &need);
    int valid = is_apns_id(kid) && is_apns_id(team);
    FUZZ_CHECK(rc == (valid ? HC_E_BUFFER_TOO_SMALL : HC_E_CLAIM), "apns_jwt gave %d (%s) for %s ids",
               rc, hc_strerror(rc), valid ? "valid" : "invalid");
    if (!valid) return;
    char jwt[512];
    size_t len = need;
    FUZZ_CHECK(need <= sizeof jwt && hc_apns_jwt(key, kid, team, iat, jwt, &len) == HC_OK &&
                   len == need - 1,
               "apns_jwt into its needed %zu bytes wrote %zu", need, len);
    char header[64];
    snprintf(header, sizeof header, "{\"alg\":\"ES256\",\"kid\":\"%s\"}", kid);
    json_t *claims = open_token(jwt, len, header);
    FUZZ_CHECK(json_object_size(claims) == 2, "APNs claims are not 2 members");
    check_string_claim(claims, "iss", team);
    FUZZ_CHECK(json_integer_value(json_object_get(claims, "iat")) == iat, "iat is not the input");
    json_decref(claims);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_init();
    uint8_t scalar[HC_P256_PRIVATE_BYTES];
    for (size_t i = 0; i < sizeof scalar; i++) scalar[i] = (uint8_t)(i + 1);
    FUZZ_CHECK(hc_p256_key_from_raw(scalar, sizeof scalar, &key) == HC_OK, "no key");
    hc_p256_key_public(key, pub);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *piece[4];
    size_t piece_len[4];
    for (size_t i = 0; i < 4; i++) piece_len[i] = fuzz_take_until(&data, &size, 0x00, &piece[i]);
    uint32_t offset = 0;
    for (size_t i = 0; i < 4 && i < size; i++) offset = offset << 8 | data[i];
    char *aud = fuzz_strndup(piece[0], piece_len[0]), *sub = fuzz_strndup(piece[1], piece_len[1]);
    char *kid = fuzz_strndup(piece[2], piece_len[2]), *team = fuzz_strndup(piece[3], piece_len[3]);
    check_vapid(aud, sub, size >= 4 ? (int64_t)(int32_t)offset : 3600);
    check_apns(kid, team);
    free(aud);
    free(sub);
    free(kid);
    free(team);
    return 0;
}
