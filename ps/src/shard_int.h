/*
 * shard_int.h - the shard state (shard.c): the table, the configuration and its limits,
 * the counters, the incarnation, the coordinator epoch, the dense store (dense_int.h), and
 * the quiescing that lets a restore swap the table while the shard runs.
 *
 * Layers of the ps module (each file uses only the ones below it):
 *
 *   ps.c        the service's lifecycle: creates and destroys the parts below
 *   handlers.c  the rpc methods: decode, checks, encode, metrics (handlers_int.h)
 *   ckpt.c      checkpoints on the store: snapshot, restore, list (ckpt_int.h)
 *   shard.c     this file's state            dense.c  the dense store (dense_int.h)
 *                                            marks.c  the marks (marks_int.h)
 *
 * struct mt_ps is defined here because the handlers read the table, the limits and the
 * counters on the hot path without a call; the parts of the upper layers (ck, rpc) are
 * opaque pointers this layer only stores.
 *
 * The table pointer changes only in mt__ps_install(), while the shard is quiesced. Code
 * outside the rpc handlers that uses the table brackets it with mt__ps_enter() /
 * mt__ps_leave() (the handlers are bracketed by handlers.c's dispatcher), or holds the
 * checkpoints' snap_lock (ckpt.c), which a restore holds across the install.
 */
#ifndef MT_PS_SHARD_INT_H
#define MT_PS_SHARD_INT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "dense_int.h"
#include "marks_int.h"
#include "mt/ps.h"

typedef struct mt__ps_ckpt mt__ps_ckpt_t; /* ckpt.c: the store, snap_lock and its counters */
typedef struct mt__ps_rpc mt__ps_rpc_t;   /* handlers.c: the methods and their histograms */

struct mt_ps {
    /* Immutable after mt__ps_shard_init(). */
    mt_ps_config_t cfg;            /* limits; cfg.table.slots = slots, cfg.admin_token = ours */
    char *admin_token;             /* NULL: admin calls need no token */
    mt_table_slot_config_t *slots; /* owned copy of cfg.table.slots (a restore builds tables) */
    uint32_t max_dim;              /* widest slot: sizes Sync's value buffers */
    /* Replaced only while quiesced (mt__ps_install). */
    mt_table_t *table;
    _Atomic uint64_t incarnation;
    _Atomic int restoring; /* 1: every method answers UNAVAILABLE; the table may be replaced */
    /* Calls using the table now (see mt__ps_enter): a restore waits for 0 to swap it. The
     * admin methods (Snapshot, Restore, Checkpoints) are not counted: snap_lock orders them. */
    _Atomic int64_t inflight;
    _Atomic uint64_t examples_applied, step; /* ApplyGradients' examples and highest step */
    _Atomic uint64_t epoch; /* highest coordinator epoch seen (fencing); 0 after a start */
    /* Counters (atomics). */
    _Atomic uint64_t calls[MT_PS_NMETHODS], errors[MT_PS_NMETHODS];
    _Atomic uint64_t lookup_fids, apply_fids, sync_entries;
    _Atomic uint64_t skipped[2], out_of_order[2]; /* covered calls, per mt__ps_marks_kind_t */
    _Atomic int stop_streams;   /* not 0: follow Sync streams end at their next round */
    _Atomic uint32_t followers; /* follow Sync streams open now */
    /* The dense parameters, guarded by dense.lock (dense_lock). */
    mt__ps_dense_store_t dense;
    /* The marks of covered applies and pushes, and their gate (marks_int.h). */
    mt__ps_marks_t *marks;
    /* The upper layers' parts (owned by ps.c; never used by this layer). */
    mt__ps_ckpt_t *ck;
    mt__ps_rpc_t *rpc;
};

/** Fills the state of a calloc'd @p ps from @p cfg (validated by the caller): copies the
 *  configuration, takes a first incarnation, adopts @p table or creates an empty one.
 *  @returns MT_OK or MT_NOMEM / the table's error (then @p table stays the caller's). */
mt_err_t mt__ps_shard_init(mt_ps_t *ps, const mt_ps_config_t *cfg, mt_table_t *table);
/** Frees what mt__ps_shard_init() set (the table included). */
void mt__ps_shard_fini(mt_ps_t *ps);

/** Enters a section that uses the table. @returns 0, or -1 while a restore runs (nothing to
 *  leave then). */
int mt__ps_enter(mt_ps_t *ps);
void mt__ps_leave(mt_ps_t *ps);

/** The configuration (its table config with the slots, owned by the service). */
const mt_ps_config_t *mt__ps_config(const mt_ps_t *ps);
/** The highest coordinator epoch the shard has seen (fencing: docs/checkpoint.md). */
uint64_t mt__ps_epoch(mt_ps_t *ps);
/** Raises it to @p epoch (a claim, or a restored checkpoint's); never lowers it. */
void mt__ps_epoch_raise(mt_ps_t *ps, uint64_t epoch);
/** 1 (with the message in @p why) if @p epoch is fenced: not 0 and below the shard's. */
int mt__ps_fenced(mt_ps_t *ps, uint64_t epoch, char *why, size_t len);
uint64_t mt__ps_step(mt_ps_t *ps);

/* The fixed fields of a SyncChunk (full, incarnation, since_version, upto_version, last,
 * caught_up, the three length prefixes) take under this many bytes. */
#define MT__PS_CHUNK_FIXED_BYTES 64

/** The most change entries a SyncChunk can carry within @p limit bytes: each at most an id
 *  (8), its deleted byte and max_dim floats. 0: not even one row fits. (Sync streams and the
 *  publisher cut their chunks with it.) */
static inline size_t mt__ps_chunk_fit(const mt_ps_t *ps, size_t limit) {
    size_t per = 8 + 1 + 4 * (size_t)ps->max_dim;
    return limit > MT__PS_CHUNK_FIXED_BYTES ? (limit - MT__PS_CHUNK_FIXED_BYTES) / per : 0;
}

/** Splits @p n change entries into a SyncChunk's ids and deletion flags.
 *  @returns how many values they carry (the sum of their dims). */
static inline size_t mt__ps_chunk_split(const mt_table_change_t *ents, size_t n, uint64_t *fids,
                                        uint8_t *del) {
    size_t nv = 0;
    for (size_t i = 0; i < n; i++) {
        fids[i] = ents[i].fid;
        del[i] = ents[i].deleted;
        nv += ents[i].dim;
    }
    return nv;
}

/** *a = max(*a, v), lock-free. */
static inline void mt__atomic_max(_Atomic uint64_t *a, uint64_t v) {
    uint64_t cur = atomic_load(a);
    while (v > cur && !atomic_compare_exchange_weak(a, &cur, v))
        ;
}

/**
 * Quiesces the shard (new calls: UNAVAILABLE; follow Sync streams asked to end), waits at
 * most @p wait_s for the calls in flight, then installs @p table, @p dense, the counters,
 * the marks (@p marks: sparse and dense, taken over and emptied) and a new incarnation, and
 * resumes. On success the service owns @p table and @p dense holds the previous dense
 * parameters (the caller still frees it). Caller holds snap_lock.
 * @returns MT_OK or MT_UNAVAILABLE (calls still in flight: nothing changed, the caller keeps
 *          @p table).
 */
mt_err_t mt__ps_install(mt_ps_t *ps, mt_table_t *table, mt__ps_dense_t *dense, uint64_t examples,
                        uint64_t step, mt__ps_mark_list_t marks[2], double wait_s);

#endif /* MT_PS_SHARD_INT_H */
