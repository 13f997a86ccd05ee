/*
 * ckpt_int.h - the checkpoints of a shard (ckpt.c), as the layer above uses them: the rpc
 * handlers (handlers.c) list checkpoints and render their metrics through these; Snapshot
 * and Restore go through the public mt_ps_snapshot() / mt_ps_restore_claim() (mt/ps.h).
 *
 * Layer: above the shard state and the dense store (shard_int.h), below the handlers.
 * Every entry point takes the checkpoints' snap_lock for its whole run (held across a
 * restore's mt__ps_install()). Lock order: snap_lock -> (mt_store's locks) ;
 * snap_lock -> the marks' gate (exclusive, for a snapshot's capture) -> dense_lock ;
 * durable_lock (the marks of the last checkpoint) is a leaf.
 */
#ifndef MT_PS_CKPT_INT_H
#define MT_PS_CKPT_INT_H

#include <stddef.h>
#include <stdint.h>

#include "monolith/v1/ps.pb-c.h"
#include "mt/strbuf.h"
#include "shard_int.h"

/** @param[out] out  caller frees with mt__ps_ckpt_destroy(). @returns MT_OK or MT_NOMEM. */
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

/** Copies the marks of the last checkpoint written or restored (what survives a crash).
 *  @returns MT_OK or MT_NOMEM (then both lists are empty). */
mt_err_t mt__ps_ckpt_durable_marks(mt_ps_t *ps, mt__ps_mark_list_t *sparse,
                                   mt__ps_mark_list_t *dense);

/** Appends the checkpoint metrics (Prometheus text) of the shard. */
void mt__ps_ckpt_render(mt_ps_t *ps, mt_strbuf_t *b);

#endif /* MT_PS_CKPT_INT_H */
