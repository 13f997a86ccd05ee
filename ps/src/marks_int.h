/*
 * marks_int.h - a shard's marks (marks.c): for every Kafka partition whose examples it was
 * sent with a cover (ApplyGradientsRequest.cover, PushDenseRequest.cover), the offset after
 * the last range it applied, and the rule that applies a covered step exactly once
 * (docs/checkpoint.md, "Many trainers: idempotent applies"):
 *
 *   for each range [lo, hi) of partition p, against the mark H[p]:
 *     applied   hi <= H[p]
 *     next      lo == H[p]; or p has no mark and lo == 0 or the range says first (lo is
 *               the log's start offset: nothing before it can be missed)
 *     otherwise out of order (a gap lo > H[p], or an overlap lo < H[p] < hi)
 *   every range next: the step is applied and each H[p] := hi;
 *   every range applied: skipped; anything else: refused, nothing changes.
 *
 * Two tables of marks: sparse (the table's applies) and dense (the dense pushes, a call of
 * their own that may sum several steps). A step in flight reserves its partitions from
 * begin to end: a second call on one of them (a client's retry while the first still runs)
 * waits for the first to end, then is judged against the mark it left.
 *
 * The gate: covered calls hold it shared from before begin to after end; a snapshot holds
 * it exclusive while it captures the marks with the rows and dense tensors (ckpt.c), so
 * that the marks saved are exactly those of the rows saved. Writers are preferred: a
 * snapshot is not starved by a stream of applies.
 *
 * Thread safety: every function is thread-safe (one mutex over both tables, a condition
 * variable for reserved partitions, the gate a rwlock). Lock order: gate -> marks lock ->
 * (nothing); the gate is taken after mt__ps_enter() and before dense_lock.
 */
#ifndef MT_PS_MARKS_INT_H
#define MT_PS_MARKS_INT_H

#include <stddef.h>
#include <stdint.h>

#include "mt/err.h"

#define MT__PS_MAX_RANGES 4096  /* ranges in one cover (partitions of one step) */
#define MT__PS_MAX_TOPIC  249   /* Kafka's longest topic name */
#define MT__PS_MAX_MARKS  65536 /* partitions per table of marks */

typedef enum mt__ps_marks_kind { MT__PS_SPARSE = 0, MT__PS_DENSE = 1 } mt__ps_marks_kind_t;

/** One range of a cover (topic borrowed from the request). */
typedef struct mt__ps_range {
    const char *topic;
    int32_t partition;
    int64_t lo, hi;
    int first; /* Range.first */
} mt__ps_range_t;

/** One mark: the next offset the shard expects of a partition (topic owned by the list). */
typedef struct mt__ps_mark {
    char *topic;
    int32_t partition;
    int64_t next; /* -1: none yet (only inside the marks: lists hold known marks) */
    int busy;     /* private to marks.c: reserved by a call between begin and end */
} mt__ps_mark_t;

/** A list of marks, sorted by (topic, partition). */
typedef struct mt__ps_mark_list {
    mt__ps_mark_t *v;
    size_t n, cap;
} mt__ps_mark_list_t;

typedef struct mt__ps_marks mt__ps_marks_t;

/** @returns MT_OK or MT_NOMEM. Empty tables. */
mt_err_t mt__ps_marks_create(mt__ps_marks_t **out);
void mt__ps_marks_destroy(mt__ps_marks_t *m);

/** Checks a cover's shape: 1..MT__PS_MAX_RANGES ranges, each with a Kafka topic name (1 to
 *  MT__PS_MAX_TOPIC of a-z A-Z 0-9 . _ -), a partition >= 0, 0 <= lo < hi, no partition twice.
 *  @returns MT_OK or MT_INVALID (the reason in @p why). */
mt_err_t mt__ps_marks_check(const mt__ps_range_t *r, size_t n, char *why, size_t len);

/**
 * Judges a checked cover against the @p kind marks (waiting while another call holds one of
 * its partitions). @p *skip is set to 1 when every range is applied (nothing reserved: do
 * nothing, do not call end), to 0 when every range is next: the partitions are reserved, the
 * caller applies the step and calls mt__ps_marks_end() whatever happened.
 * @returns MT_OK, MT_NOMEM, MT_LIMIT (more than MT__PS_MAX_MARKS partitions), or MT_OUT_OF_ORDER
 *          (nothing reserved; @p why names the first range and its mark).
 */
mt_err_t mt__ps_marks_begin(mt__ps_marks_t *m, mt__ps_marks_kind_t kind, const mt__ps_range_t *r,
                            size_t n, int *skip, char *why, size_t len);

/** Ends a reserved cover: with @p done each mark moves to its range's hi (the step was
 *  applied); without, the marks stay (it failed before changing anything). */
void mt__ps_marks_end(mt__ps_marks_t *m, mt__ps_marks_kind_t kind, const mt__ps_range_t *r,
                      size_t n, int done);

/** The @p kind marks of the cover's partitions (in cover order; a partition without a mark
 *  has next = -1). @p out has room for @p n. */
void mt__ps_marks_of(mt__ps_marks_t *m, mt__ps_marks_kind_t kind, const mt__ps_range_t *r, size_t n,
                     int64_t *out);

/** Copies every @p kind mark into @p out (free with mt__ps_mark_list_free). @returns MT_OK or
 *  MT_NOMEM. */
mt_err_t mt__ps_marks_copy(mt__ps_marks_t *m, mt__ps_marks_kind_t kind, mt__ps_mark_list_t *out);

/** Replaces the @p kind marks by @p list (taken over: emptied; nothing is allocated). The
 *  caller holds the gate exclusive, or the shard is quiesced (a restore). */
void mt__ps_marks_replace(mt__ps_marks_t *m, mt__ps_marks_kind_t kind, mt__ps_mark_list_t *list);

/** Builds a sorted list from @p n (topic, partition, next) triples (copied), refusing a
 *  topic that is not a Kafka name, a negative partition or offset, or a partition twice.
 *  @returns MT_OK, MT_NOMEM or MT_CORRUPT. */
mt_err_t mt__ps_mark_list_build(const char *const *topics, const int32_t *partitions,
                                const int64_t *next, size_t n, mt__ps_mark_list_t *out);
void mt__ps_mark_list_free(mt__ps_mark_list_t *l);

/** The gate (see above). */
void mt__ps_marks_gate_shared(mt__ps_marks_t *m);
void mt__ps_marks_gate_exclusive(mt__ps_marks_t *m);
void mt__ps_marks_gate_release(mt__ps_marks_t *m);

#endif /* MT_PS_MARKS_INT_H */
