/*
 * coord.h - the trainer's coordination of cluster checkpoints (docs/checkpoint.md).
 *
 * A cluster checkpoint is one checkpoint id written by every PS shard while the trainer
 * applies nothing, each with the same Kafka positions: the next offset of every partition
 * whose examples the state reflects (a partition that is not listed: none of its examples).
 * The last complete checkpoint is the largest id that every shard holds marked consistent.
 *
 *   recover:    list every shard's checkpoints; C = the last complete one (0 = none: the
 *               empty state, every partition from its beginning); Restore(C) on every shard
 *               (which also deletes the checkpoints above C: attempts that did not complete
 *               everywhere); remember each shard's new incarnation; hand C's positions to
 *               the caller, who moves its consumer there and resets its dense copy.
 *   checkpoint: with nothing in flight, a consistent Snapshot(next id, positions) on every
 *               shard, each expected to be in the incarnation the coordinator knows (a shard
 *               that restarted since lost what it applied: its Snapshot fails); complete once
 *               every shard wrote it; then the caller commits the positions to Kafka.
 *   check:      the incarnations only (an idle trainer notices a restarted shard).
 * Any failure of a step, a checkpoint or a check means: recover. Ids only grow: the next id
 * is above every id any shard listed at the last recovery and every id tried since.
 *
 * Fencing: one coordinator per cluster. The first recovery takes a coordinator epoch above
 * every epoch the shards have seen (32 random low bits: two simultaneous starts differ but
 * for a chance of 2^-32) and claims it with its Restores; from then on every write
 * of the trainer's psclient carries it (mt_psc_set_epoch), and a shard refuses the writes of
 * any lower epoch (ABORTED). A second exactly-once trainer therefore takes the cluster over
 * and the first one's next step, checkpoint, check or recovery fails with MT_FENCED: it must
 * stop (never recover), since its Kafka positions are no longer the cluster's. Several
 * trainers sharing one cluster's checkpoints would need one of them (or a separate process)
 * to pause the others and gather their positions; that is not done here.
 *
 * Thread safety: a coordinator is used by one thread at a time.
 */
#ifndef MT_COORD_H
#define MT_COORD_H

#include <stddef.h>
#include <stdint.h>

#include "mt/err.h"
#include "mt/psclient.h"

typedef struct mt_coord mt_coord_t;

typedef struct mt_coord_config {
    const char *token;         /* PS admin token; NULL or "" if none (borrowed) */
    double recovery_timeout_s; /* recover: give up when the shards did not all answer and
                                   restore within this long (default 300) */
    int64_t call_deadline_ms;  /* of each Snapshot / Restore call (default 600000) */
    int (*stop)(void *ud);     /* optional: recover polls it while it waits; 1 = give up */
    void *stop_ud;
} mt_coord_config_t;

/** A checkpoint restored by mt_coord_recover(). */
typedef struct mt_coord_point {
    uint64_t checkpoint_id;    /* 0: the empty state */
    uint64_t examples_applied; /* the shards' counter there */
    size_t noffsets;           /* its Kafka positions (owned; mt_coord_point_free) */
    mt_psc_offset_t *offsets;
} mt_coord_point_t;

void mt_coord_config_init(mt_coord_config_t *cfg);

/** @param[in] psc  borrowed: must outlive the coordinator. @p cfg copied (token borrowed).
 *  @param[out] out  caller frees with mt_coord_destroy(). */
mt_err_t mt_coord_create(mt_psc_t *psc, const mt_coord_config_t *cfg, mt_coord_t **out);
void mt_coord_destroy(mt_coord_t *co);

/** This coordinator's fencing epoch (0 before its first recovery). */
uint64_t mt_coord_epoch(const mt_coord_t *co);

/**
 * Rolls every shard back to the last complete checkpoint (see above), retrying while shards
 * are down or restarting, until recovery_timeout_s.
 * @param[out] pt  caller frees with mt_coord_point_free()
 * @returns MT_OK; MT_TIMEOUT (gave up: errbuf says the last error); MT_CANCELLED (stop());
 *          MT_CORRUPT (the shards disagree about the checkpoint's offsets or counter);
 *          MT_FENCED (another trainer took over: stop).
 */
mt_err_t mt_coord_recover(mt_coord_t *co, mt_coord_point_t *pt, char *errbuf, size_t errlen);
void mt_coord_point_free(mt_coord_point_t *pt);

/**
 * Writes the next cluster checkpoint with @p offsets (the positions of everything applied).
 * The caller has applied nothing since its last step and pushed its pending dense gradients.
 * @param[out] id, examples  optional: the checkpoint's id and the shards' counter in it
 * @returns MT_OK when every shard wrote it; else the first shard's error (then recover;
 *          MT_FENCED: stop).
 */
mt_err_t mt_coord_checkpoint(mt_coord_t *co, const mt_psc_offset_t *offsets, size_t noffsets,
                             uint64_t *id, uint64_t *examples, char *errbuf, size_t errlen);

/** @returns MT_OK if every shard is still in the incarnation of the last recovery, MT_MISMATCH
 *  if one is not, MT_FENCED if a shard has seen a higher coordinator epoch (stop), or the
 *  error of listing (then recover). */
mt_err_t mt_coord_check(mt_coord_t *co, char *errbuf, size_t errlen);

/** The last complete checkpoint written or restored (0: none). */
uint64_t mt_coord_last(const mt_coord_t *co);

#endif /* MT_COORD_H */
