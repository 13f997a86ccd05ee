/*
 * ps_int.h - internals shared by the files of the ps module: ps.c (the service, its
 * handlers and the table swap of a restore) and ckpt.c (checkpoints on the store).
 *
 * The table pointer of a shard changes only in mt__ps_install(), while the shard is
 * quiesced. Code outside the rpc handlers that uses the table brackets it with
 * mt__ps_enter() / mt__ps_leave() (the handlers are bracketed by ps.c's dispatcher), or
 * holds snap_lock, which a restore holds across the install.
 *
 * Lock order: snap_lock -> (mt_store's locks) ; snap_lock -> dense_lock.
 */
#ifndef MT_PS_INT_H
#define MT_PS_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "monolith/v1/ps.pb-c.h"
#include "mt/ps.h"
#include "mt/strbuf.h"

typedef struct mt__ps_ckpt mt__ps_ckpt_t;   /* ckpt.c: the store and its counters */
typedef struct mt__ps_dense mt__ps_dense_t; /* ps.c: dense parameters parsed, not installed */

/* ---------------- ps.c ---------------- */

/** Enters a section that uses the table. @returns 0, or -1 while a restore runs (nothing to
 *  leave then). */
int mt__ps_enter(mt_ps_t *ps);
void mt__ps_leave(mt_ps_t *ps);

/** The configuration (its table config with the slots, owned by the service). */
const mt_ps_config_t *mt__ps_config(const mt_ps_t *ps);
pthread_mutex_t *mt__ps_snap_lock(mt_ps_t *ps);
/** The highest coordinator epoch the shard has seen (fencing: docs/checkpoint.md). */
uint64_t mt__ps_epoch(mt_ps_t *ps);
/** Raises it to @p epoch (a claim, or a restored checkpoint's); never lowers it. */
void mt__ps_epoch_raise(mt_ps_t *ps, uint64_t epoch);
/** 1 (with the message in @p why) if @p epoch is fenced: not 0 and below the shard's. */
int mt__ps_fenced(mt_ps_t *ps, uint64_t epoch, char *why, size_t len);

/** *a = max(*a, v), lock-free. */
static inline void mt__atomic_max(_Atomic uint64_t *a, uint64_t v) {
    uint64_t cur = atomic_load(a);
    while (v > cur && !atomic_compare_exchange_weak(a, &cur, v))
        ;
}
mt__ps_ckpt_t *mt__ps_ckpt(mt_ps_t *ps);
uint64_t mt__ps_step(mt_ps_t *ps);
/** The dense parameters' version now (takes dense_lock). */
uint64_t mt__ps_dense_version(mt_ps_t *ps);

/** Parses a DenseState blob (NULL or empty: no tensors, version 0).
 *  @param[out] out  caller frees with mt__ps_dense_free(). @returns MT_OK, MT_CORRUPT, MT_NOMEM. */
mt_err_t mt__ps_dense_parse(const uint8_t *buf, size_t len, mt__ps_dense_t **out);
void mt__ps_dense_free(mt__ps_dense_t *dd);

/**
 * Quiesces the shard (new calls: UNAVAILABLE; follow Sync streams asked to end), waits at
 * most @p wait_s for the calls in flight, then installs @p table, @p dense, the counters and
 * a new incarnation, and resumes. On success the service owns @p table and @p dense holds the
 * previous dense parameters (the caller still frees it). Caller holds snap_lock.
 * @returns MT_OK or MT_UNAVAILABLE (calls still in flight: nothing changed, the caller keeps
 *          @p table).
 */
mt_err_t mt__ps_install(mt_ps_t *ps, mt_table_t *table, mt__ps_dense_t *dense, uint64_t examples,
                        uint64_t step, double wait_s);

/* ---------------- ckpt.c ---------------- */

mt_err_t mt__ps_ckpt_create(mt__ps_ckpt_t **out);
void mt__ps_ckpt_destroy(mt__ps_ckpt_t *ck);
int mt__ps_ckpt_has_store(mt_ps_t *ps);
/** The id of the last checkpoint written or restored (0: none). */
uint64_t mt__ps_ckpt_last_id(mt_ps_t *ps);

/**
 * The complete checkpoints of the store, oldest first, as their CheckpointMeta.
 * @param[out] metas  caller frees with mt__ps_ckpt_list_free()
 * @param[out] incarnation, examples  the shard's, read under the same lock
 */
mt_err_t mt__ps_ckpt_list(mt_ps_t *ps, Monolith__V1__CheckpointMeta ***metas, size_t *n,
                          uint64_t *incarnation, uint64_t *examples, char *errbuf, size_t errlen);
void mt__ps_ckpt_list_free(Monolith__V1__CheckpointMeta **metas, size_t n);

/** Appends the checkpoint metrics (Prometheus text) of the shard. */
void mt__ps_ckpt_render(mt_ps_t *ps, mt_strbuf_t *b);

#endif /* MT_PS_INT_H */
