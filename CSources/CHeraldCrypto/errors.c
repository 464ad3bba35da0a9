/* Result codes, library initialisation and small shared helpers. */
#include "internal.h"

#include <pthread.h>
#include <stddef.h>
#include <string.h>
#include <jansson.h>
#include <sodium.h>
#include <stdlib.h>

const char *hc_strerror(int code)
{
    switch (code) {
    case HC_OK: return "success";
    case HC_E_INVALID_ARGUMENT: return "invalid argument";
    case HC_E_NO_MEMORY: return "out of memory";
    case HC_E_RANDOM: return "the random number generator failed";
    case HC_E_CRYPTO: return "a cryptographic operation failed";
    case HC_E_BUFFER_TOO_SMALL: return "output buffer too small";
    case HC_E_BASE64: return "malformed base64url";
    case HC_E_PUBLIC_KEY_LENGTH: return "public key must be 65 bytes";
    case HC_E_PUBLIC_KEY_FORMAT: return "public key is not an uncompressed point (0x04 prefix)";
    case HC_E_PUBLIC_KEY_NOT_ON_CURVE: return "public key is not a point on P-256";
    case HC_E_AUTH_LENGTH: return "auth secret must be 16 bytes";
    case HC_E_PRIVATE_KEY_LENGTH: return "raw private key must be 32 bytes";
    case HC_E_PRIVATE_KEY_RANGE: return "private key is zero or not below the curve order";
    case HC_E_PEM: return "not a readable PEM private key";
    case HC_E_KEY_TYPE: return "key is not a P-256 EC key";
    case HC_E_PLAINTEXT_TOO_LARGE: return "plaintext does not fit the record";
    case HC_E_BODY_SIZE: return "body size must be 0 or between 104 and 4096 bytes";
    case HC_E_JSON: return "malformed JSON";
    case HC_E_AUDIENCE: return "audience must be an https origin (scheme and host, no path)";
    case HC_E_EXPIRY: return "expiry must be in the future and at most 24 hours ahead";
    case HC_E_SIGNATURE_LENGTH: return "signature must be 64 bytes (r || s)";
    case HC_E_SIGNATURE_INVALID: return "signature does not verify";
    case HC_E_DECRYPT: return "authentication of sealed data failed";
    case HC_E_SEALED_FORMAT: return "sealed data is truncated or of an unknown version";
    case HC_E_RSA_KEY: return "not an RSA private key of at least 2048 bits";
    case HC_E_SERVICE_ACCOUNT: return "service account lacks project_id, client_email, private_key or token_uri";
    case HC_E_CLAIM: return "a JWT claim has a bad form";
    case HC_E_HKDF_LENGTH: return "HKDF output longer than 255 * 32 bytes";
    case HC_E_RECORD_SIZE: return "record size below 18 or not larger than the record";
    default: return "unknown error";
    }
}

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static int init_result = HC_E_CRYPTO;
static EC_GROUP *p256;
static EVP_CIPHER *aes128gcm;
static EVP_MD *sha256;

/* jansson allocations carry their size so that every JSON text the core
 * parses (service-account files hold a private key) is wiped when freed. */
typedef union {
    size_t size;
    max_align_t align;
} json_block;

static void *json_alloc(size_t n)
{
    json_block *b = malloc(sizeof *b + n);
    if (b == NULL) return NULL;
    b->size = n;
    return b + 1;
}

void hc_json_free(void *p)
{
    if (p == NULL) return;
    json_block *b = (json_block *)p - 1;
    sodium_memzero(p, b->size);
    free(b);
}

static void init_all(void)
{
    if (sodium_init() < 0) {
        init_result = HC_E_RANDOM;
        return;
    }
    json_set_alloc_funcs(json_alloc, hc_json_free);
    p256 = EC_GROUP_new_by_curve_name(NID_X9_62_prime256v1);
    aes128gcm = EVP_CIPHER_fetch(NULL, "AES-128-GCM", NULL);
    sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
    init_result = p256 != NULL && aes128gcm != NULL && sha256 != NULL ? HC_OK : HC_E_CRYPTO;
}

int hc_init(void)
{
    pthread_once(&init_once, init_all);
    return init_result;
}

const EC_GROUP *hc_p256_group(void)
{
    return hc_init() == HC_OK ? p256 : NULL;
}

const EVP_CIPHER *hc_aes128gcm_cipher(void)
{
    return hc_init() == HC_OK ? aes128gcm : NULL;
}

const EVP_MD *hc_sha256_md(void)
{
    return hc_init() == HC_OK ? sha256 : NULL;
}

int hc_copy_out(const char *s, size_t s_len, char *out, size_t *len)
{
    if (len == NULL) return HC_E_INVALID_ARGUMENT;
    if (out == NULL || *len < s_len + 1) {
        *len = s_len + 1;
        return HC_E_BUFFER_TOO_SMALL;
    }
    memcpy(out, s, s_len);
    out[s_len] = '\0';
    *len = s_len;
    return HC_OK;
}

int hc_no_password(char *buf, int size, int rwflag, void *u)
{
    (void)buf; (void)size; (void)rwflag; (void)u;
    return 0; /* encrypted PEM files are not supported: refuse instead of prompting */
}
