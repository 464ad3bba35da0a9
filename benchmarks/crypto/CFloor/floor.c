#include "cfloor.h"

#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/param_build.h>
#include <time.h>

volatile uint8_t cfloor_sink;

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static EVP_PKEY *peer_key(const uint8_t peer[65])
{
    EVP_PKEY *pkey = NULL;
    OSSL_PARAM params[3];
    params[0] = OSSL_PARAM_construct_utf8_string(OSSL_PKEY_PARAM_GROUP_NAME, "prime256v1", 0);
    params[1] = OSSL_PARAM_construct_octet_string(OSSL_PKEY_PARAM_PUB_KEY, (void *)peer, 65);
    params[2] = OSSL_PARAM_construct_end();
    EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_from_name(NULL, "EC", NULL);
    if (ctx == NULL || EVP_PKEY_fromdata_init(ctx) <= 0 ||
        EVP_PKEY_fromdata(ctx, &pkey, EVP_PKEY_PUBLIC_KEY, params) <= 0)
        pkey = NULL;
    EVP_PKEY_CTX_free(ctx);
    return pkey;
}

double cfloor_evp_us(const uint8_t peer[65], int iterations)
{
    double result = -1;
    EVP_PKEY *peer_pkey = peer_key(peer);
    EVP_PKEY_CTX *gen = EVP_PKEY_CTX_new_from_name(NULL, "EC", NULL);
    if (peer_pkey == NULL || gen == NULL || EVP_PKEY_keygen_init(gen) <= 0 ||
        EVP_PKEY_CTX_set_group_name(gen, "prime256v1") <= 0)
        goto out;
    uint8_t secret[32];
    double start = now_us();
    for (int i = 0; i < iterations; i++) {
        EVP_PKEY *eph = NULL;
        size_t n = sizeof secret;
        if (EVP_PKEY_keygen(gen, &eph) <= 0) goto out;
        EVP_PKEY_CTX *dctx = EVP_PKEY_CTX_new_from_pkey(NULL, eph, NULL);
        int ok = dctx != NULL && EVP_PKEY_derive_init(dctx) > 0 &&
                 EVP_PKEY_derive_set_peer(dctx, peer_pkey) > 0 &&
                 EVP_PKEY_derive(dctx, secret, &n) > 0;
        EVP_PKEY_CTX_free(dctx);
        EVP_PKEY_free(eph);
        if (!ok) goto out;
        cfloor_sink ^= secret[0];
    }
    result = (now_us() - start) / iterations;
out:
    EVP_PKEY_CTX_free(gen);
    EVP_PKEY_free(peer_pkey);
    return result;
}

double cfloor_ec_point_us(const uint8_t peer[65], int iterations)
{
    double result = -1;
    EC_GROUP *group = EC_GROUP_new_by_curve_name(NID_X9_62_prime256v1);
    BN_CTX *bn = BN_CTX_new();
    BIGNUM *d = BN_new(), *x = BN_new();
    EC_POINT *pub = NULL, *shared = NULL, *q = NULL;
    if (group == NULL || bn == NULL || d == NULL || x == NULL) goto out;
    pub = EC_POINT_new(group);
    shared = EC_POINT_new(group);
    q = EC_POINT_new(group);
    if (pub == NULL || shared == NULL || q == NULL ||
        !EC_POINT_oct2point(group, q, peer, 65, bn))
        goto out;
    BN_set_flags(d, BN_FLG_CONSTTIME);
    uint8_t encoded[65], secret[32];
    double start = now_us();
    for (int i = 0; i < iterations; i++) {
        if (!BN_priv_rand_range_ex(d, EC_GROUP_get0_order(group), 0, bn) ||
            !EC_POINT_mul(group, pub, d, NULL, NULL, bn) ||
            EC_POINT_point2oct(group, pub, POINT_CONVERSION_UNCOMPRESSED, encoded, 65, bn) != 65 ||
            !EC_POINT_mul(group, shared, NULL, q, d, bn) ||
            !EC_POINT_get_affine_coordinates(group, shared, x, NULL, bn) ||
            BN_bn2binpad(x, secret, 32) != 32)
            goto out;
        cfloor_sink ^= secret[0] ^ encoded[1];
    }
    result = (now_us() - start) / iterations;
out:
    EC_POINT_free(pub);
    EC_POINT_free(shared);
    EC_POINT_free(q);
    BN_clear_free(d);
    BN_free(x);
    BN_CTX_free(bn);
    EC_GROUP_free(group);
    return result;
}
