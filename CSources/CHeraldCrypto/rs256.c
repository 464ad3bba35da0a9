/* RSA private keys and RS256 (RSASSA-PKCS1-v1_5 with SHA-256). */
#include "internal.h"

#include <openssl/err.h>
#include <openssl/pem.h>

struct hc_rsa_key {
    EVP_PKEY *pkey;
};

size_t hc_rsa_signature_size(const hc_rsa_key *k)
{
    return (size_t)EVP_PKEY_get_size(k->pkey);
}

int hc_rsa_key_from_pem(const char *pem, size_t pem_len, hc_rsa_key **out)
{
    if (pem == NULL || out == NULL || pem_len > INT32_MAX) return HC_E_INVALID_ARGUMENT;
    if (hc_init() != HC_OK) return HC_E_CRYPTO;
    int rc = HC_E_PEM;
    BIO *bio = BIO_new_mem_buf(pem, (int)pem_len);
    if (bio == NULL) return HC_E_NO_MEMORY;
    EVP_PKEY *pkey = PEM_read_bio_PrivateKey_ex(bio, NULL, hc_no_password, NULL, NULL, NULL);
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
    size_t need = hc_rsa_signature_size(key);
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

