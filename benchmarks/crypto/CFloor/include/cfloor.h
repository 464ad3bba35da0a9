/* The floor a Web Push seal is compared with: the cheapest loop of one P-256
 * key generation plus one ECDH derive that OpenSSL offers on this machine.
 * Benchmark-only code, kept out of the product's C core. */
#ifndef CFLOOR_H
#define CFLOOR_H

#include <stdint.h>

/* EVP route: EVP_PKEY_keygen with a reused context, then EVP_PKEY_derive
 * against a prepared peer key. Returns microseconds per iteration, or a
 * negative value on failure. */
double cfloor_evp_us(const uint8_t peer[65], int iterations);

/* EC_POINT route: random scalar, d*G encoded as an uncompressed public key,
 * d*peer and its X coordinate, with a reused BN_CTX. Microseconds per
 * iteration, or negative on failure. */
double cfloor_ec_point_us(const uint8_t peer[65], int iterations);

/* Keeps the compiler from discarding results. */
extern volatile uint8_t cfloor_sink;

#endif
