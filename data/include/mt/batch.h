/*
 * batch.h - the in-memory example batch every input produces (Criteo, MovieLens, generic
 * CSV/TSV, Kafka examples, the synthetic generator) and the trainer and serving consume.
 *
 * Layout: n examples; each has ntasks labels (1 but for a multi-task model's batches: the
 * click, then a conversion...), a timestamp, a sampling rate, and for each of the batch's
 * nslots slots a (possibly empty) list of fids, stored CSR-style:
 *
 *   fids of example i, slot s  =  fids[offsets[i * nslots + s] .. offsets[i * nslots + s + 1])
 *
 * Every fid's top 16 bits equal slot_ids[s]. A slot's embeddings are sum-pooled by the model.
 *
 * Ownership: a batch owns all its arrays; mt_batch_free() releases them.
 * Thread safety: a batch is a plain value: no locking; share it read-only or not at all.
 */
#ifndef MT_BATCH_H
#define MT_BATCH_H

#include <stddef.h>
#include <stdint.h>

#include "mt/err.h"

#define MT_BATCH_MAX_TASKS 4 /* labels per example at most */

typedef struct mt_batch {
    size_t n;               /* examples */
    uint32_t nslots;        /* slots per example */
    uint16_t *slot_ids;     /* [nslots] */
    uint32_t ntasks;        /* labels per example, 1..MT_BATCH_MAX_TASKS (default 1) */
    float *labels;          /* [n * ntasks]: example i's task t at i * ntasks + t, each 0 or 1
                               (task 0: the click) */
    int64_t *timestamps_ms; /* [n]: event time, 0 when the input has none */
    float *sample_rates;    /* [n]: probability the example was kept by sampling (1 = all) */
    size_t *offsets;        /* [n * nslots + 1] into fids */
    uint64_t *fids;         /* [nfids] */
    size_t nfids;
    /* private: capacities */
    size_t cap_n, cap_fids;
} mt_batch_t;

/** Sets up @p b (any memory: an initialized batch must be freed first, its arrays are not
 *  released here) with no examples and these slots (copied). On error @p b is zeroed.
 *  @returns MT_OK, MT_INVALID (nslots 0), MT_NOMEM. */
mt_err_t mt_batch_init(mt_batch_t *b, const uint16_t *slot_ids, uint32_t nslots);

/** Sets the labels per example of an empty batch (1 after mt_batch_init()).
 *  @returns MT_OK, MT_INVALID (examples present, ntasks 0 or over MT_BATCH_MAX_TASKS),
 *  MT_NOMEM. */
mt_err_t mt_batch_set_tasks(mt_batch_t *b, uint32_t ntasks);

/** Removes every example, keeps the slots, the tasks and the memory. */
void mt_batch_clear(mt_batch_t *b);

/** Frees everything. A zeroed batch is fine. */
void mt_batch_free(mt_batch_t *b);

/**
 * Appends one example. @p fids_per_slot[s] lists @p counts[s] fids of slot s (whose top
 * 16 bits must be slot_ids[s]).
 * @returns MT_OK, MT_INVALID (a fid of another slot; nothing appended), MT_NOMEM.
 */
mt_err_t mt_batch_add(mt_batch_t *b, float label, int64_t timestamp_ms, float sample_rate,
                      const uint64_t *const *fids_per_slot, const uint32_t *counts);

/** mt_batch_add() with @p labels [ntasks] (mt_batch_add() itself takes one-task batches
 *  only: MT_INVALID otherwise). */
mt_err_t mt_batch_add_labels(mt_batch_t *b, const float *labels, int64_t timestamp_ms,
                             float sample_rate, const uint64_t *const *fids_per_slot,
                             const uint32_t *counts);

/** Replaces the examples of @p dst by examples idx[0..n) of @p src, in that order, labels,
 *  timestamps and sampling rates included (a shuffled or split view of one data set).
 *  @p dst must have been initialized with the slots and tasks of @p src. On error @p dst holds a
 *  prefix of them. @returns MT_OK, MT_INVALID (other slots), MT_NOMEM. */
mt_err_t mt_batch_gather(const mt_batch_t *src, const size_t *idx, size_t n, mt_batch_t *dst);

/** The fids of example @p i, slot @p s, and their count (NULL when there are none: a batch
 *  without any fid has no fids array, and NULL + 0 is undefined). */
static inline const uint64_t *mt_batch_fids(const mt_batch_t *b, size_t i, uint32_t s,
                                            size_t *count) {
    size_t k = i * b->nslots + s;
    *count = b->offsets[k + 1] - b->offsets[k];
    return *count ? b->fids + b->offsets[k] : NULL;
}

/** The fid of @p value in @p slot: the value itself when it fits in 48 bits (contract). */
static inline uint64_t mt_fid_of_int(uint16_t slot, uint64_t value) {
    return ((uint64_t)slot << 48) | (value & 0xFFFFFFFFFFFFull);
}

/** The fid of a string value: the low 48 bits of XXH3-64 of its bytes (contract). */
uint64_t mt_fid_of_bytes(uint16_t slot, const void *data, size_t len);

#endif /* MT_BATCH_H */
