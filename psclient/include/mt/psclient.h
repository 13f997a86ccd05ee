/*
 * psclient.h - the client library of the sharded parameter server.
 *
 * Routes each fid to its shard (mt_ps_shard_of: xxh3 of the fid modulo the shard count),
 * deduplicates ids within a batch, sends one request per shard in parallel, and merges the
 * answers back in request order. Embedding widths come from the shards' Stats (slot dims),
 * fetched on first use.
 *
 * Duplicates: a lookup returns the same embedding for every occurrence of an id; an apply
 * sums the gradients of an id's occurrences and sends one update (what TensorFlow's
 * unsorted_segment_sum does before a sparse update).
 *
 * Thread safety: a client may be used from many threads at once.
 */
#ifndef MT_PSCLIENT_H
#define MT_PSCLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "mt/err.h"
#include "mt/rpc.h"

typedef struct mt_psc mt_psc_t;

typedef struct mt_psc_config {
    const char *const *addrs; /* shard i's address ("host:port"), borrowed during create */
    uint32_t num_shards;
    int64_t deadline_ms; /* per call (default 10000) */
    mt_rpc_client_config_t rpc;
} mt_psc_config_t;

void mt_psc_config_init(mt_psc_config_t *cfg);

/** @param[out] out  caller frees with mt_psc_destroy(). Connects lazily. */
mt_err_t mt_psc_create(const mt_psc_config_t *cfg, mt_psc_t **out);
void mt_psc_destroy(mt_psc_t *c);

/** The embedding width of @p fid's slot (from the shards' Stats). @returns MT_OK,
 *  MT_UNKNOWN_SLOT, or the error of fetching the slot table (see @p st). */
mt_err_t mt_psc_dim(mt_psc_t *c, uint64_t fid, uint32_t *dim, mt_rpc_status_t *st);

/**
 * Looks ids up on their shards. @p out receives the packed embeddings in request order
 * (out_len floats: the sum of the ids' dims). @p found (optional) one byte per id.
 * @returns MT_OK, or an error with the failing shard's status in @p st (then out is
 *          undefined): MT_UNKNOWN_SLOT, MT_TOO_SMALL, MT_UNAVAILABLE, MT_TIMEOUT, MT_INVALID
 *          (the shard refused the request), MT_CORRUPT (a malformed answer).
 */
mt_err_t mt_psc_lookup(mt_psc_t *c, const uint64_t *fids, size_t n, int train, int64_t now_s,
                       float *out, size_t out_len, uint8_t *found, mt_rpc_status_t *st);

/**
 * Pushes gradients (packed like lookup output) to the shards. Duplicated ids' gradients are
 * summed. @param[out] applied, missing  optional totals over shards.
 */
mt_err_t mt_psc_apply(mt_psc_t *c, const uint64_t *fids, size_t n, const float *grads,
                      size_t grads_len, int64_t now_s, uint64_t step, uint64_t *applied,
                      uint64_t *missing, mt_rpc_status_t *st);

/** A dense tensor as sent to / received from the PS (row-major; ndim 1 or 2). */
typedef struct mt_psc_tensor {
    const char *name;
    uint32_t ndim;
    uint32_t shape[2];
    size_t size;   /* floats: the product of the shape */
    float *values; /* push: read; pull: written (size floats) */
} mt_psc_tensor_t;

/**
 * Dense parameters live on shard 0. Pushes one gradient per tensor (applied with the PS's
 * dense optimizer); @p init (optional, parallel to @p grads) creates tensors the PS does not
 * hold yet (an existing tensor keeps its values: the first trainer's init wins).
 * @param[out] version  optional: the PS's dense version after the push
 * @returns MT_OK, MT_INVALID (the PS refused: shape mismatch, not finite, unknown without
 *          init; see @p st), MT_UNAVAILABLE, MT_TIMEOUT, MT_CORRUPT, MT_NOMEM.
 */
mt_err_t mt_psc_push_dense(mt_psc_t *c, const mt_psc_tensor_t *grads, const mt_psc_tensor_t *init,
                           size_t n, uint64_t step, uint64_t *version, mt_rpc_status_t *st);

/**
 * Pulls the dense tensors named in @p ts (each's values receive size floats) from shard 0
 * when its version is newer than @p if_newer_than; *version receives the PS's version.
 * @param[out] updated  1 when the values were written, 0 when the PS was not newer
 * @returns MT_OK, MT_NOT_FOUND (a tensor the PS does not hold), MT_MISMATCH (another
 *          shape), and the transport errors of mt_psc_push_dense().
 */
mt_err_t mt_psc_pull_dense(mt_psc_t *c, mt_psc_tensor_t *ts, size_t n, uint64_t if_newer_than,
                           uint64_t *version, int *updated, mt_rpc_status_t *st);

/** The channel of shard @p i (for other methods: Stats, Sync, Snapshot, dense calls). */
mt_rpc_channel_t *mt_psc_channel(mt_psc_t *c, uint32_t i);

#endif /* MT_PSCLIENT_H */
