/*
 * dense_int.h - the dense store of a shard (dense.c): the dense tensors with their
 * optimizer state, updated by PushDense, read by PullDense, saved in checkpoints.
 *
 * Layer: the bottom of the ps module, beside the shard state (shard_int.h, which embeds
 * one store). It uses nothing of the module's other files.
 *
 * Thread safety: every function takes the store's lock (dense_lock) unless its name ends
 * in _locked; mt__ps_dense_pull() calls its reply function with the lock held (an answer
 * packed under it is consistent).
 */
#ifndef MT_PS_DENSE_INT_H
#define MT_PS_DENSE_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "monolith/v1/ps.pb-c.h"
#include "mt/err.h"
#include "mt/ps.h"

typedef struct mt__ps_tensor mt__ps_tensor_t; /* dense.c: one tensor and its state */

/** The dense parameters of a shard. */
typedef struct mt__ps_dense_store {
    mt_ps_dense_config_t cfg; /* the optimizer (immutable after mt__ps_dense_init) */
    /* Guarded by lock (dense_lock). */
    pthread_mutex_t lock;
    mt__ps_tensor_t *t;
    size_t n;
    uint64_t version; /* +1 by each PushDense with gradients; restored with checkpoints */
} mt__ps_dense_store_t;

/** Dense parameters parsed from a DenseState, not installed (mt__ps_dense_parse). */
typedef struct mt__ps_dense mt__ps_dense_t;

/** An empty store with the optimizer @p cfg (copied). */
void mt__ps_dense_init(mt__ps_dense_store_t *ds, const mt_ps_dense_config_t *cfg);
/** Frees the tensors and the lock (the store itself is the caller's). */
void mt__ps_dense_fini(mt__ps_dense_store_t *ds);

/** The version now. */
uint64_t mt__ps_dense_version(mt__ps_dense_store_t *ds);

/**
 * PushDense: checks every gradient first (a bad request changes nothing), creates the
 * tensors named by @p r's init that do not exist yet, applies the gradients of the others.
 * @param[out] version  the version after the call
 * @returns MT_OK; MT_INVALID (unknown tensor without init, wrong length, non-finite value,
 *          bad init: @p why says which) or MT_NOMEM ("out of memory" in @p why).
 */
mt_err_t mt__ps_dense_push(mt__ps_dense_store_t *ds, const Monolith__V1__PushDenseRequest *r,
                           uint64_t *version, char *why, size_t wlen);

/** Called by mt__ps_dense_pull() with the lock held; @p resp points into the store. */
typedef void (*mt__ps_dense_reply_fn)(void *ud, const ProtobufCMessage *resp);

/**
 * PullDense: builds the answer to @p r (the named tensors, all without names, none unless
 * newer than r->if_newer_than) and hands it to @p reply under the lock.
 * @param[out] missing  on MT_NOT_FOUND, the first name asked for that is unknown (points
 *                      into @p r)
 * @returns MT_OK (reply was called), MT_NOMEM or MT_NOT_FOUND (reply was not called).
 */
mt_err_t mt__ps_dense_pull(mt__ps_dense_store_t *ds, const Monolith__V1__PullDenseRequest *r,
                           mt__ps_dense_reply_fn reply, void *ud, const char **missing);

/** The store as one DenseState blob. @param[out] buf  malloc'd, caller frees. */
mt_err_t mt__ps_dense_save(mt__ps_dense_store_t *ds, uint8_t **buf, size_t *len);

/** Parses a DenseState blob (NULL or empty: no tensors, version 0).
 *  @param[out] out  caller frees with mt__ps_dense_free(). @returns MT_OK, MT_CORRUPT, MT_NOMEM. */
mt_err_t mt__ps_dense_parse(const uint8_t *buf, size_t len, mt__ps_dense_t **out);
void mt__ps_dense_free(mt__ps_dense_t *dd);

/** Exchanges the store's tensors and version with @p dd's (the caller frees @p dd, now
 *  holding the previous ones). */
void mt__ps_dense_swap(mt__ps_dense_store_t *ds, mt__ps_dense_t *dd);

#endif /* MT_PS_DENSE_INT_H */
