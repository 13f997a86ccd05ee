/*
 * sv_util.h - what serving.c and peers.c share inside the serving module (internal).
 */
#ifndef MT_SERVING_SV_UTIL_H
#define MT_SERVING_SV_UTIL_H

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "mt/clock.h"

/* Grows *p to @p want elements of @p elem bytes (at least one). @returns 0 or -1 (out of
 * memory: *p unchanged). */
static inline int sv_grow(void **p, size_t want, size_t elem) {
    void *np = realloc(*p, (want ? want : 1) * elem);
    if (!np) return -1;
    *p = np;
    return 0;
}

/* Sleeps on @p cond (a CLOCK_MONOTONIC condition variable guarded by @p lock) until the
 * monotonic time @p deadline_s or until *stopping is set (read under @p lock).
 * @returns *stopping. */
static inline int sv_sleep_until(pthread_mutex_t *lock, pthread_cond_t *cond, const int *stopping,
                                 double deadline_s) {
    struct timespec ts;
    ts.tv_sec = (time_t)deadline_s;
    ts.tv_nsec = (long)((deadline_s - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_nsec = 999999999L;
    pthread_mutex_lock(lock);
    while (!*stopping && mt_mono_s() < deadline_s)
        if (pthread_cond_timedwait(cond, lock, &ts) != 0) break;
    int stop = *stopping;
    pthread_mutex_unlock(lock);
    return stop;
}

#endif /* MT_SERVING_SV_UTIL_H */
