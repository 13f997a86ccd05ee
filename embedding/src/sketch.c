/*
 * sketch.c - the frequency filter: a count-min sketch with conservative update.
 *
 * Each part owns depth rows of width 8-bit counters (filter_bytes / nparts bytes), guarded
 * by the part's lock. Counting one sighting of an id raises only those of its counters that
 * equal the current minimum (conservative update, Estan & Varghese 2002), which cuts the
 * overestimate of plain count-min by a large factor for skewed streams.
 *
 * Between two halvings the estimate never undercounts, so an id whose min_count sightings
 * fall within one aging period is always admitted; an id below it is admitted early only
 * when all its depth counters were raised by other ids (over-admission). With n distinct ids counted in a part of width w and depth d, the
 * chance is at most about (n * c / w)^d for c the mean sightings per id; docs/table.md gives
 * the figures measured by the filter test.
 *
 * Aging: when more than half of a part's counters are non-zero, the part halves all of them
 * (TinyLFU's reset, triggered by occupancy rather than by a sample count), so the sketch
 * never saturates on an endless stream of new ids, and ids that are counted but stop coming
 * fade out. Counts of ids that keep coming survive a halving at half their value. The price:
 * an id whose sightings are spread wider than about 0.7 x width one-off ids of its part
 * (1.4M ids over the table with the defaults) may never reach min_count.
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "table_int.h"

static inline void cm_index(const mt_table_t *t, uint64_t fid, uint32_t *idx) {
    uint64_t h = XXH3_64bits_withSeed(&fid, sizeof(fid), t->seed_cm);
    uint32_t h1 = (uint32_t)h, h2 = (uint32_t)(h >> 32) | 1u;
    for (uint32_t d = 0; d < t->cm_depth; d++)
        idx[d] = d * t->cm_width + (uint32_t)(((uint64_t)(h1 + d * h2) * t->cm_width) >> 32);
}

static void cm_halve(const mt_table_t *t, mt__part_t *p) {
    size_t n = (size_t)t->cm_depth * t->cm_width, nz = 0;
    for (size_t i = 0; i < n; i++) {
        p->cm[i] >>= 1;
        nz += p->cm[i] != 0;
    }
    p->cm_nonzero = nz;
}

uint32_t mt__cm_add(const mt_table_t *t, mt__part_t *p, uint64_t fid) {
    assert(MT__PART_LOCKED(p));
    uint32_t idx[8], m = 255;
    cm_index(t, fid, idx);
    for (uint32_t d = 0; d < t->cm_depth; d++)
        if (p->cm[idx[d]] < m) m = p->cm[idx[d]];
    if (m < 255) {
        m++;
        for (uint32_t d = 0; d < t->cm_depth; d++) {
            if (p->cm[idx[d]] < m) {
                p->cm_nonzero += p->cm[idx[d]] == 0;
                p->cm[idx[d]] = (uint8_t)m;
            }
        }
    }
    if (2 * p->cm_nonzero > (uint64_t)t->cm_depth * t->cm_width) cm_halve(t, p);
    return m;
}

uint32_t mt__cm_estimate(const mt_table_t *t, const mt__part_t *p, uint64_t fid) {
    assert(MT__PART_LOCKED(p));
    uint32_t idx[8], m = 255;
    cm_index(t, fid, idx);
    for (uint32_t d = 0; d < t->cm_depth; d++)
        if (p->cm[idx[d]] < m) m = p->cm[idx[d]];
    return m;
}
