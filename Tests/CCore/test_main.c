/*
 * test_main.c - harness and entry point of the C core tests.
 *
 * Usage: hc_tests FIXTURES_DIR
 * Prints one line per failing check, a few informational count lines, and
 * finally "N passed, N failed"; exits 1 when any check failed.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"

const char *t_fixtures;

static unsigned long t_passed;
static unsigned long t_failed;

int t_check(int ok, const char *file, int line, const char *expr, const char *fmt, ...) {
    if (ok) {
        t_passed++;
        return 1;
    }
    t_failed++;
    printf("FAIL %s:%d: %s: ", file, line, expr);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    return 0;
}

int t_check_mem(const void *got, const void *want, size_t len, const char *file, int line,
                const char *what) {
    if (memcmp(got, want, len) == 0) {
        t_passed++;
        return 1;
    }
    t_failed++;
    const uint8_t *g = got, *w = want;
    size_t first = 0;
    while (first < len && g[first] == w[first]) {
        first++;
    }
    size_t show = len < 48 ? len : 48;
    char *gh = malloc(2 * show + 1), *wh = malloc(2 * show + 1);
    if (gh != NULL && wh != NULL) {
        t_hex(g, show, gh);
        t_hex(w, show, wh);
        printf("FAIL %s:%d: %s: %zu bytes differ from offset %zu; got %s%s want %s%s\n", file,
               line, what, len, first, gh, show < len ? "..." : "", wh, show < len ? "..." : "");
    } else {
        printf("FAIL %s:%d: %s: bytes differ\n", file, line, what);
    }
    free(gh);
    free(wh);
    fflush(stdout);
    return 0;
}

void t_note(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

typedef void (*t_group_fn)(void);

static const t_group_fn t_groups[] = {
    test_errors_strerror,
    test_api_basics,
    test_vectors_rfc5869,
    test_vectors_rfc8188,
    test_vectors_rfc8291,
    test_vectors_rfc8292,
    test_wycheproof_ecdh,
    test_wycheproof_ecdsa,
    test_wycheproof_aes_gcm,
    test_errors_encoding,
    test_errors_keys,
    test_errors_webpush,
    test_errors_jwt,
    test_errors_secretbox,
    test_errors_null,
    test_api_pem,
    test_api_jwt,
    test_api_fcm,
    test_api_secretbox,
    test_roundtrip_webpush,
    test_roundtrip_es256,
    test_roundtrip_threads,
};

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s FIXTURES_DIR\n", argv[0]);
        return 2;
    }
    t_fixtures = argv[1];

    /* Sizes and plaintexts come from a seeded PRNG so a failure can be
     * replayed with HC_TEST_SEED; keys, salts and nonces inside the library
     * are random regardless. */
    uint64_t seed = 0x48657261u; /* "Hera" */
    const char *env = getenv("HC_TEST_SEED");
    if (env != NULL && *env != '\0') {
        seed = strtoull(env, NULL, 0);
    }
    t_prng_seed(seed);

    CHECK_RC(hc_init(), HC_OK);
    CHECK_RC(hc_init(), HC_OK); /* idempotent */

    for (size_t i = 0; i < sizeof t_groups / sizeof t_groups[0]; i++) {
        t_groups[i]();
    }

    printf("%lu passed, %lu failed\n", t_passed, t_failed);
    return t_failed == 0 ? 0 : 1;
}
