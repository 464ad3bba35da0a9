/*
 * fuzz.h - what the C core's libFuzzer targets share.
 *
 * Each target is one file with LLVMFuzzerTestOneInput, built with
 * -fsanitize=fuzzer,address,undefined against the core's sources (mk/fuzz.mk).
 * A broken property prints one "PROPERTY ..." line and aborts, so libFuzzer
 * reports it like any crash and saves the input as a reproducer. LeakSanitizer
 * is on: every target frees what it makes on every path.
 */
#ifndef HC_FUZZ_H
#define HC_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "herald_crypto.h"

#define FUZZ_CHECK(cond, ...)                                                    \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "PROPERTY %s:%d: %s: ", __FILE__, __LINE__, #cond);  \
            fprintf(stderr, __VA_ARGS__);                                        \
            fprintf(stderr, "\n");                                               \
            abort();                                                             \
        }                                                                        \
    } while (0)

/* A NUL-terminated copy of data (never NULL). */
static inline char *fuzz_strndup(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (s == NULL) abort();
    if (size > 0) memcpy(s, data, size);
    s[size] = '\0';
    return s;
}

/* An exact-size heap copy, so ASan sees any read past the end (never NULL). */
static inline uint8_t *fuzz_copy(const uint8_t *data, size_t size)
{
    uint8_t *p = malloc(size > 0 ? size : 1);
    if (p == NULL) abort();
    if (size > 0) memcpy(p, data, size);
    return p;
}

/* Splits off the first piece of *data up to a separator byte (which is
 * consumed); the rest stays in *data / *size. */
static inline size_t fuzz_take_until(const uint8_t **data, size_t *size, uint8_t sep,
                                     const uint8_t **piece)
{
    const uint8_t *p = memchr(*data, sep, *size);
    size_t n = p != NULL ? (size_t)(p - *data) : *size;
    *piece = *data;
    *data += p != NULL ? n + 1 : n;
    *size -= p != NULL ? n + 1 : n;
    return n;
}

/* What every imported P-256 key must satisfy: its public point (returned in
 * pub) is valid, it exports to a PEM with the capacity contract of the header
 * that imports again to the same key, and its signatures verify. */
static inline void fuzz_check_p256_key(const hc_p256_key *key, uint8_t pub[HC_P256_PUBLIC_BYTES])
{
    hc_p256_key_public(key, pub);
    FUZZ_CHECK(hc_p256_public_check(pub, HC_P256_PUBLIC_BYTES) == HC_OK,
               "an imported key's public point is refused");

    size_t need = 0;
    FUZZ_CHECK(hc_p256_key_to_pem(key, NULL, &need) == HC_E_BUFFER_TOO_SMALL && need > 1,
               "to_pem without a buffer did not report its size (%zu)", need);
    char *pem = malloc(need);
    size_t len = need - 1;
    FUZZ_CHECK(pem != NULL, "out of memory");
    FUZZ_CHECK(hc_p256_key_to_pem(key, pem, &len) == HC_E_BUFFER_TOO_SMALL && len == need,
               "to_pem one byte short gave size %zu, want %zu", len, need);
    len = need;
    FUZZ_CHECK(hc_p256_key_to_pem(key, pem, &len) == HC_OK && len == need - 1 && pem[len] == '\0',
               "to_pem into %zu bytes wrote %zu", need, len);
    hc_p256_key *again = NULL;
    int rc = hc_p256_key_from_pem(pem, len, &again);
    FUZZ_CHECK(rc == HC_OK, "the exported PEM does not import: %s", hc_strerror(rc));
    uint8_t pub2[HC_P256_PUBLIC_BYTES];
    hc_p256_key_public(again, pub2);
    FUZZ_CHECK(memcmp(pub, pub2, sizeof pub2) == 0, "export and import changed the key");
    hc_p256_key_free(again);
    hc_wipe(pem, need);
    free(pem);

    static const uint8_t msg[] = "herald fuzz";
    uint8_t sig[HC_ES256_SIGNATURE_BYTES];
    FUZZ_CHECK(hc_es256_sign(key, msg, sizeof msg, sig) == HC_OK, "an imported key cannot sign");
    FUZZ_CHECK(hc_es256_verify(pub, HC_P256_PUBLIC_BYTES, msg, sizeof msg, sig, sizeof sig) ==
                   HC_OK,
               "a signature by an imported key does not verify");
}

static inline void fuzz_init(void)
{
    FUZZ_CHECK(hc_init() == HC_OK, "hc_init failed");
}

/* LLVMFuzzerInitialize for a target that needs nothing beyond the core's
 * start-up (targets with their own set-up write theirs and call fuzz_init). */
#define FUZZ_INITIALIZE_CORE                                                                   \
    int LLVMFuzzerInitialize(int *argc, char ***argv)                                          \
    {                                                                                          \
        (void)argc;                                                                            \
        (void)argv;                                                                            \
        fuzz_init();                                                                           \
        return 0;                                                                              \
    }

#endif /* HC_FUZZ_H */
