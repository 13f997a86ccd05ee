/*
 * psclient.h - the client library of the sharded parameter server.
 *
 * Routes each fid to its shard (mt_route_shard_of, mt/route.h: xxh3 of the fid modulo the shard count),
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
    /* Every shard's channel, TLS included (paths borrowed during create). */
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
 * summed. With @p examples > 0 every shard gets a request, with an empty id list if it has
 * none of the ids, carrying @p examples (added to each shard's examples_applied: a trainer
 * passes its batch size with the one apply of a step).
 * @param[out] applied, missing  optional totals over shards.
 */
mt_err_t mt_psc_apply(mt_psc_t *c, const uint64_t *fids, size_t n, const float *grads,
                      size_t grads_len, int64_t now_s, uint64_t step, uint64_t examples,
                      uint64_t *applied, uint64_t *missing, mt_rpc_status_t *st);

/** The Kafka messages [lo, hi) of one partition that a step holds (docs/checkpoint.md,
 *  "Many trainers"); @p first: lo is the partition's log start (a shard with no mark of it
 *  takes the range; otherwise such a shard takes lo = 0 only). */
typedef struct mt_psc_range {
    const char *topic;
    int32_t partition;
    int64_t lo, hi;
    int first;
} mt_psc_range_t;

/**
 * mt_psc_apply() of one step with its cover (@p ncover ranges, at most one per partition):
 * every shard gets a request, and applies it exactly once: a shard that applied the cover
 * before skips it (counted in @p skipped, optional), one whose marks are elsewhere refuses
 * it (MT_OUT_OF_ORDER, the shard's message in @p st; the other shards may have applied
 * or skipped it: read the marks again, mt_psc_marks()). A retry after a transport error is
 * safe. @returns as mt_psc_apply(), or MT_OUT_OF_ORDER.
 */
mt_err_t mt_psc_apply_cover(mt_psc_t *c, const uint64_t *fids, size_t n, const float *grads,
                            size_t grads_len, int64_t now_s, uint64_t step, uint64_t examples,
                            const mt_psc_range_t *cover, size_t ncover, uint32_t *skipped,
                            uint64_t *applied, uint64_t *missing, mt_rpc_status_t *st);

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

/** mt_psc_push_dense() with a cover, judged against shard 0's dense marks as
 *  mt_psc_apply_cover() is against the sparse ones; *skipped (optional) is 1 when it was
 *  pushed before. @returns as mt_psc_push_dense(), or MT_OUT_OF_ORDER. */
mt_err_t mt_psc_push_dense_cover(mt_psc_t *c, const mt_psc_tensor_t *grads,
                                 const mt_psc_tensor_t *init, size_t n, uint64_t step,
                                 const mt_psc_range_t *cover, size_t ncover, int *skipped,
                                 uint64_t *version, mt_rpc_status_t *st);

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

/** Number of shards. */
uint32_t mt_psc_num_shards(const mt_psc_t *c);

/**
 * The coordinator epoch this client's writes carry from now on (training lookups,
 * ApplyGradients, PushDense, consistent Snapshots, Restores): a shard that has seen a higher
 * one refuses them with ABORTED (MT_FENCED): another trainer took over (docs/checkpoint.md).
 * 0 (the default): not a coordinated trainer, never fenced. Thread-safe.
 */
void mt_psc_set_epoch(mt_psc_t *c, uint64_t epoch);

/* ---------------- checkpoints (admin calls on every shard at once) ----------------
 * Each function calls every shard in parallel and reports each shard's outcome in its own
 * entry of an array of num_shards; it returns MT_OK when every shard succeeded, else the
 * error of the first shard that failed. @p token: the PS's admin token (NULL or "" if none).
 * @p deadline_ms: of each call (snapshots and restores of large tables take a while). */

/** A Kafka position of a checkpoint (strings owned by the list it is in). */
typedef struct mt_psc_offset {
    char *topic;
    int32_t partition;
    int64_t offset; /* next offset to consume */
} mt_psc_offset_t;

/** One complete checkpoint of a shard, from its CheckpointMeta. */
typedef struct mt_psc_checkpoint {
    uint64_t checkpoint_id;
    int consistent;
    uint64_t examples_applied;
    int64_t created_ms;
    size_t noffsets;
    mt_psc_offset_t *offsets;
} mt_psc_checkpoint_t;

/** What one shard answered to Checkpoints, Snapshot or Restore. */
typedef struct mt_psc_shard_ckpt {
    mt_err_t err; /* MT_OK or this shard's error (st says more) */
    mt_rpc_status_t st;
    uint64_t incarnation;      /* Checkpoints, Restore: the shard's incarnation now */
    uint64_t examples_applied; /* the shard's counter (Checkpoints: now; others: saved/restored) */
    uint64_t epoch;            /* Checkpoints: the highest coordinator epoch the shard saw */
    size_t n;                  /* Checkpoints: its complete checkpoints, oldest first */
    mt_psc_checkpoint_t *list;
    /* mt_psc_marks: the shard's marks (offset: the next one it expects of the partition),
     * indexed by MT_PSC_MARKS_* */
    size_t nmarks[4];
    mt_psc_offset_t *marks[4];
} mt_psc_shard_ckpt_t;

/** The four lists of marks a shard reports (docs/checkpoint.md, "Many trainers"): live and
 *  of its last checkpoint (durable: what survives its crash), of its table's applies and of
 *  its dense pushes. */
enum {
    MT_PSC_MARKS = 0,
    MT_PSC_DENSE_MARKS = 1,
    MT_PSC_DURABLE_MARKS = 2,
    MT_PSC_DURABLE_DENSE_MARKS = 3
};

/** Frees what the functions below put in @p out[0..n) (NULL is a no-op). */
void mt_psc_shard_ckpt_free(mt_psc_shard_ckpt_t *out, uint32_t n);

/** Checkpoints of every shard. @param[out] out  num_shards entries (free with
 *  mt_psc_shard_ckpt_free()). */
mt_err_t mt_psc_checkpoints(mt_psc_t *c, int64_t deadline_ms, mt_psc_shard_ckpt_t *out);

/** A consistent Snapshot(@p checkpoint_id) on every shard, with @p offsets; shard i is
 *  expected to be in incarnation @p expect_incarnation[i] (NULL or 0: any). */
mt_err_t mt_psc_snapshot_all(mt_psc_t *c, const char *token, uint64_t checkpoint_id,
                             const uint64_t *expect_incarnation, const mt_psc_offset_t *offsets,
                             size_t noffsets, int64_t deadline_ms, mt_psc_shard_ckpt_t *out);

/** The marks of every shard (Stats), with its incarnation and examples_applied. */
mt_err_t mt_psc_marks(mt_psc_t *c, int64_t deadline_ms, mt_psc_shard_ckpt_t *out);

/** Restore(@p checkpoint_id) on every shard (0: the empty state). */
mt_err_t mt_psc_restore_all(mt_psc_t *c, const char *token, uint64_t checkpoint_id,
                            int64_t deadline_ms, mt_psc_shard_ckpt_t *out);

#endif /* MT_PSCLIENT_H */
