/*
 * clock.h - seconds as doubles: monotonic (timing, deadlines, rates) and wall clock (Unix
 * time, for event times and ages). Thread safety: pure (clock_gettime).
 */
#ifndef MT_CLOCK_H
#define MT_CLOCK_H

#include <time.h>

/** Seconds on CLOCK_MONOTONIC (an arbitrary origin; never jumps). */
static inline double mt_mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/** Unix time in seconds (CLOCK_REALTIME; may jump with the system clock). */
static inline double mt_wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif /* MT_CLOCK_H */
