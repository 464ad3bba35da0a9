/*
 * clockshift: an LD_PRELOAD library that moves a process's wall clock by a
 * whole number of seconds, for the multi-host tests (test_multi_host.py).
 *
 *   HERALD_TEST_CLOCK_OFFSET_S=60   ->  CLOCK_REALTIME reads 60 s ahead
 *   HERALD_TEST_CLOCK_OFFSET_S=-60  ->  60 s behind
 *
 * Shifted: clock_gettime(CLOCK_REALTIME / CLOCK_REALTIME_COARSE /
 * CLOCK_TAI), gettimeofday, time, timespec_get(TIME_UTC). Left alone: every
 * monotonic and CPU clock (CLOCK_MONOTONIC, _RAW, _COARSE, CLOCK_BOOTTIME,
 * …), so a program's interval timers behave as before. Nothing else of the
 * process is touched (its arguments, environment and threads), which is why
 * the tests use this rather than libfaketime.
 *
 * Built by the test: cc -shared -fPIC -O2 -o build/clockshift.so clockshift.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);
typedef int (*gettimeofday_fn)(struct timeval *, void *);
typedef time_t (*time_fn)(time_t *);
typedef int (*timespec_get_fn)(struct timespec *, int);

static clock_gettime_fn real_clock_gettime;
static gettimeofday_fn real_gettimeofday;
static time_fn real_time;
static timespec_get_fn real_timespec_get;
static long offset_s;

__attribute__((constructor)) static void clockshift_init(void) {
    const char *v = getenv("HERALD_TEST_CLOCK_OFFSET_S");
    offset_s = v ? strtol(v, NULL, 10) : 0;
    real_clock_gettime = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
    real_gettimeofday = (gettimeofday_fn)dlsym(RTLD_NEXT, "gettimeofday");
    real_time = (time_fn)dlsym(RTLD_NEXT, "time");
    real_timespec_get = (timespec_get_fn)dlsym(RTLD_NEXT, "timespec_get");
}

static int is_wall(clockid_t id) {
    return id == CLOCK_REALTIME
#ifdef CLOCK_REALTIME_COARSE
        || id == CLOCK_REALTIME_COARSE
#endif
#ifdef CLOCK_TAI
        || id == CLOCK_TAI
#endif
        ;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    if (!real_clock_gettime) clockshift_init();
    int r = real_clock_gettime(id, ts);
    if (r == 0 && ts && is_wall(id)) ts->tv_sec += offset_s;
    return r;
}

int gettimeofday(struct timeval *tv, void *tz) {
    if (!real_gettimeofday) clockshift_init();
    int r = real_gettimeofday(tv, tz);
    if (r == 0 && tv) tv->tv_sec += offset_s;
    return r;
}

time_t time(time_t *out) {
    if (!real_time) clockshift_init();
    time_t t = real_time(NULL);
    if (t != (time_t)-1) t += offset_s;
    if (out) *out = t;
    return t;
}

int timespec_get(struct timespec *ts, int base) {
    if (!real_timespec_get) clockshift_init();
    int r = real_timespec_get(ts, base);
    if (r == TIME_UTC && ts) ts->tv_sec += offset_s;
    return r;
}
