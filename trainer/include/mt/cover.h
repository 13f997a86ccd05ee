/*
 * cover.h - a trainer's side of exactly-once training with many trainers
 * (docs/checkpoint.md, "Many trainers: idempotent applies"): which Kafka ranges each step
 * holds, so that every shard applies it whole or skips it whole.
 *
 * For each partition the trainer owns it keeps
 *   next   the end of the last range it sent (where the next step's range starts),
 *   cuts   the shards' marks above next: no range spans one, so that each range is, on
 *          every shard, wholly applied or wholly next,
 *   start  the partition's log start (a range from it is marked first).
 * mt_cover_reset() sets them from the shards' marks at an assignment or after a refusal:
 * each partition starts at the lowest mark over the lists (what the furthest-behind shard
 * still needs), or at its log start when some list has no mark of it. While any cut is left
 * (a catch-up: some shard is ahead of another), a step holds one partition only.
 *
 * A step is built message by message (mt_cover_add), trained with its ranges
 * (mt_cover_ranges), then mt_cover_commit() (applied or skipped everywhere) moves next;
 * after a refusal the caller reads the marks again and resets.
 *
 * Ownership: topics are borrowed (the consumer's interned names, valid while it lives).
 * Dependencies: none on Kafka (the daemon converts its positions).
 * Thread safety: none: one per trainer thread.
 */
#ifndef MT_COVER_H
#define MT_COVER_H

#include <stddef.h>
#include <stdint.h>

#include "mt/err.h"
#include "mt/psclient.h"

typedef struct mt_cover mt_cover_t;

/** A partition and an offset (the layout of mt_kafka_position_t: the daemon passes those). */
typedef struct mt_cover_pos {
    const char *topic;
    int32_t partition;
    int64_t offset;
} mt_cover_pos_t;

/** @returns MT_OK or MT_NOMEM. Owns no partition until reset. */
mt_err_t mt_cover_create(mt_cover_t **out);
void mt_cover_destroy(mt_cover_t *c);

/** One list of marks: a shard's sparse marks, or shard 0's dense ones. */
typedef struct mt_cover_marks {
    const mt_psc_offset_t *v;
    size_t n;
} mt_cover_marks_t;

/**
 * Owns exactly the @p nowned partitions of @p owned (offset: each one's log start) from now
 * on, each starting from @p lists (see above); the step being built is dropped.
 * @param[out] starts  @p nowned positions (same order, topics borrowed): where to seek
 * @returns MT_OK, MT_NOMEM, or MT_LIMIT: a mark below its partition's log start (Kafka's
 *          retention dropped examples a shard never applied; @p errbuf names the partition,
 *          the mark and the log start).
 */
mt_err_t mt_cover_reset(mt_cover_t *c, const mt_cover_pos_t *owned, size_t nowned,
                        const mt_cover_marks_t *lists, size_t nlists, mt_cover_pos_t *starts,
                        char *errbuf, size_t errlen);

/** Outcomes of mt_cover_add(). */
enum { MT_COVER_ADDED = 0, MT_COVER_CLOSE = 1, MT_COVER_NOT_OWNED = -1, MT_COVER_GAP = -2 };

/**
 * Adds the message at @p offset of (@p topic, @p partition) to the step being built.
 * Messages of a partition must come in offset order with none missing (an examples topic
 * is neither compacted nor transactional).
 * @returns MT_COVER_ADDED; MT_COVER_NOT_OWNED (drop it: not a partition of this trainer, or
 *          below its next, or delivered twice); MT_COVER_GAP (it is past the partition's
 *          next offset: the consumer skipped messages; drop the step and seek again); or
 *          MT_COVER_CLOSE: the step must be trained first, without this message (it is at a
 *          cut point, or a catch-up step holds another partition); the message is added
 *          again after mt_cover_commit().
 */
int mt_cover_add(mt_cover_t *c, const char *topic, int32_t partition, int64_t offset);

/** The ranges of the step being built (valid until the next call on @p c). @returns n. */
size_t mt_cover_ranges(const mt_cover_t *c, const mt_psc_range_t **ranges);

/** The step was applied or skipped by every shard: each range's partition moves on to its
 *  end, cuts at or below it are dropped; an empty step begins. */
void mt_cover_commit(mt_cover_t *c);

/** Drops the step being built (its messages are delivered again after a seek). */
void mt_cover_abort(mt_cover_t *c);

/** 1 if some list is behind this trainer on one of its partitions: a mark below the
 *  partition's next, or no mark while next is past the log start (a shard that restarted
 *  from an older snapshot, or lost its disk, and that no step has told yet: an idle
 *  trainer checks with this). */
int mt_cover_behind(const mt_cover_t *c, const mt_cover_marks_t *lists, size_t nlists);

/** 1 while a catch-up lasts (some cut is left), 0 otherwise. */
int mt_cover_catching_up(const mt_cover_t *c);

#endif /* MT_COVER_H */
