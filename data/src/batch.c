/* batch.c - see mt/batch.h. */
#include "mt/batch.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "mt/grow.h"

mt_err_t mt_batch_init(mt_batch_t *b, const uint16_t *slot_ids, uint32_t nslots) {
    memset(b, 0, sizeof(*b));
    if (nslots == 0 || !slot_ids) return MT_INVALID;
    b->slot_ids = malloc(nslots * sizeof(uint16_t));
    b->offsets = malloc(sizeof(size_t));
    if (!b->slot_ids || !b->offsets) {
        mt_batch_free(b);
        return MT_NOMEM;
    }
    memcpy(b->slot_ids, slot_ids, nslots * sizeof(uint16_t));
    b->nslots = nslots;
    b->ntasks = 1;
    b->offsets[0] = 0;
    return MT_OK;
}

mt_err_t mt_batch_set_tasks(mt_batch_t *b, uint32_t ntasks) {
    if (b->n || ntasks < 1 || ntasks > MT_BATCH_MAX_TASKS) return MT_INVALID;
    if (b->cap_n) { /* the labels' room follows the examples' */
        float *l = realloc(b->labels, b->cap_n * ntasks * sizeof(float));
        if (!l) return MT_NOMEM;
        b->labels = l;
    }
    b->ntasks = ntasks;
    return MT_OK;
}

void mt_batch_clear(mt_batch_t *b) {
    b->n = 0;
    b->nfids = 0;
    if (b->offsets) b->offsets[0] = 0;
}

void mt_batch_free(mt_batch_t *b) {
    if (!b) return;
    free(b->slot_ids);
    free(b->labels);
    free(b->timestamps_ms);
    free(b->sample_rates);
    free(b->offsets);
    free(b->fids);
    memset(b, 0, sizeof(*b));
}

mt_err_t mt_batch_add(mt_batch_t *b, float label, int64_t timestamp_ms, float sample_rate,
                      const uint64_t *const *fids_per_slot, const uint32_t *counts) {
    if (b->ntasks != 1) return MT_INVALID;
    return mt_batch_add_labels(b, &label, timestamp_ms, sample_rate, fids_per_slot, counts);
}

mt_err_t mt_batch_add_labels(mt_batch_t *b, const float *labels, int64_t timestamp_ms,
                             float sample_rate, const uint64_t *const *fids_per_slot,
                             const uint32_t *counts) {
    size_t add = 0;
    for (uint32_t s = 0; s < b->nslots; s++) {
        for (uint32_t k = 0; k < counts[s]; k++)
            if ((uint16_t)(fids_per_slot[s][k] >> 48) != b->slot_ids[s]) return MT_INVALID;
        add += counts[s];
    }
    size_t cap_n = b->cap_n;
    if (b->n + 1 > cap_n) {
        size_t c = cap_n ? 2 * cap_n : 64, off_cap = c * b->nslots + 1;
        float *l = realloc(b->labels, c * b->ntasks * sizeof(float));
        if (l) b->labels = l;
        int64_t *t = realloc(b->timestamps_ms, c * sizeof(int64_t));
        if (t) b->timestamps_ms = t;
        float *r = realloc(b->sample_rates, c * sizeof(float));
        if (r) b->sample_rates = r;
        size_t *o = realloc(b->offsets, off_cap * sizeof(size_t));
        if (o) b->offsets = o;
        if (!l || !t || !r || !o) return MT_NOMEM;
        b->cap_n = c;
    }
    void *f = b->fids;
    if (mt_grow(&f, &b->cap_fids, b->nfids + add, sizeof(uint64_t), 64)) return MT_NOMEM;
    b->fids = f;
    size_t base = b->n * b->nslots;
    for (uint32_t s = 0; s < b->nslots; s++) {
        if (counts[s]) memcpy(b->fids + b->nfids, fids_per_slot[s], counts[s] * sizeof(uint64_t));
        b->nfids += counts[s];
        b->offsets[base + s + 1] = b->nfids;
    }
    memcpy(b->labels + b->n * b->ntasks, labels, b->ntasks * sizeof(float));
    b->timestamps_ms[b->n] = timestamp_ms;
    b->sample_rates[b->n] = sample_rate;
    b->n++;
    return MT_OK;
}

mt_err_t mt_batch_gather(const mt_batch_t *src, const size_t *idx, size_t n, mt_batch_t *dst) {
    if (dst->nslots != src->nslots || dst->ntasks != src->ntasks ||
        memcmp(dst->slot_ids, src->slot_ids, src->nslots * sizeof(uint16_t)) != 0)
        return MT_INVALID;
    mt_batch_clear(dst);
    const uint64_t **fp = malloc(src->nslots * sizeof(*fp));
    uint32_t *counts = malloc(src->nslots * sizeof(*counts));
    mt_err_t err = fp && counts ? MT_OK : MT_NOMEM;
    for (size_t i = 0; i < n && err == MT_OK; i++) {
        size_t e = idx[i];
        assert(e < src->n);
        for (uint32_t s = 0; s < src->nslots; s++) {
            size_t c;
            fp[s] = mt_batch_fids(src, e, s, &c);
            counts[s] = (uint32_t)c;
        }
        err = mt_batch_add_labels(dst, src->labels + e * src->ntasks, src->timestamps_ms[e],
                                  src->sample_rates[e], fp, counts);
    }
    free(fp);
    free(counts);
    return err;
}

uint64_t mt_fid_of_bytes(uint16_t slot, const void *data, size_t len) {
    return ((uint64_t)slot << 48) | (XXH3_64bits(data, len) & 0xFFFFFFFFFFFFull);
}
