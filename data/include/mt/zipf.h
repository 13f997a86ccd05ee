/*
 * zipf.h - Zipf-distributed ranks in O(1) per draw: rejection-inversion (Hörmann and
 * Derflinger 1996, as in Apache Commons' RejectionInversionZipfSampler). Rank r in [0, n)
 * has probability proportional to 1 / (r + 1)^exponent. No table: any n up to 2^53.
 *
 * Thread safety: a sampler is read-only after mt_zipf_init(); draws take their randomness
 * from the caller, so one sampler may serve many threads.
 */
#ifndef MT_ZIPF_H
#define MT_ZIPF_H

#include <stdint.h>

typedef struct mt_zipf {
    double e, n, hx1, hn, s;
} mt_zipf_t;

/** @param n  ranks (>= 1); @param exponent  > 0 (1.0 included). */
void mt_zipf_init(mt_zipf_t *z, uint64_t n, double exponent);

/** One rank in [0, n), drawing uniforms in [0, 1) from @p u01 (called one or more times). */
uint64_t mt_zipf_next(const mt_zipf_t *z, double (*u01)(void *ud), void *ud);

#endif /* MT_ZIPF_H */
