/*
 * table_int.h - internals of the embedding table shared by table.c, changes.c, serialize.c,
 * optim.c and sketch.c. Nothing here is part of the public API.
 *
 * Memory layout
 * -------------
 *   mt_table_t
 *     slot_index[65536]   slot id -> 1 + index into slots[] (0: slot not configured)
 *     slots[]             slot_t: the user's config plus derived sizes and slab class
 *     parts[2^k]          part_t, cache-line aligned, see below
 *     lanes[MT__LANES]    reader counters of the sleepable-RCU scheme (one line each)
 *
 *   part_t (one cuckoo hash, guarded by its mutex except for the reader fields)
 *     seq        even: stable; odd: a writer is changing what readers see
 *     arr        barray_t*: {mask, b}: b points to nbuckets 64-byte buckets, from the
 *                table's bucket pool (bpool.c: 2 MiB huge-page blocks shared by the parts)
 *     slabs[c]   rows of slab class c (one class per distinct row size)
 *     cm         this part's count-min sketch region (depth rows of width u8 counters)
 *     log        ring of change entries {fid, version, row (NULL: deletion)}
 *
 *   bucket (64 bytes): key[4] (uint64 fids) | row[4] (pointers, NULL = empty slot)
 *
 *   rows live in slab chunks, in one of two layouts chosen per slot (mt__slot_t.split):
 *
 *   together (the default): each row's bytes in one run, in the order a training step
 *   touches them (a training lookup: header and embedding; an apply: all of it):
 *
 *     chunk (chunk_bytes, a power of two, aligned to chunk_bytes)
 *     offset 0          chunk header (64 bytes: link to the next chunk)
 *     offset 64         row[chunk_rows]   row_bytes each (a multiple of 8):
 *                         mt__row_t        header (16 bytes, below)
 *                         emb              emb_bytes: dim floats or dim halves (padded to 4)
 *                         float  state[state_floats]  optimizer state
 *
 *   split, when the embedding tiles cache lines exactly (emb_bytes a multiple or a divisor
 *   of 64: dim 16 or 32 fp32, say): the embeddings in one array, so that a read-only lookup
 *   reads exactly the embedding's lines, and the headers with the state in another:
 *
 *     offset 64         emb[chunk_rows]   emb_bytes each
 *     offset tail_off   tail[chunk_rows]  tail_bytes each: mt__row_t, then the state
 *
 *   Other embeddings (the model's rows: dim + 1 floats) span a line boundary in either
 *   layout, and split, a training step misses the cache on 4-5 lines a row where together
 *   it misses on 2-3 (and finds the header by a division).
 *
 *   The header: uint64 version (of the last change, of the removal), uint32 touch_s (last
 *   touch time), uint32 count (occurrences seen, saturating).
 *
 *   A row handle (what buckets and the change log point to) is the address of its embedding;
 *   together, its header is the 16 bytes before it and its state right after the embedding;
 *   split, its tail is found from the chunk base (handle rounded down to chunk_bytes) and
 *   the index of the embedding in its array. Rows never move and slab memory is only returned
 *   at mt_table_destroy(), so a reader may always dereference a handle it read; the
 *   seqlock tells it whether what it read is valid. A free row keeps its version; the first
 *   8 bytes of its embedding hold the free-list link.
 */
#ifndef MT_TABLE_INT_H
#define MT_TABLE_INT_H

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "mt/table.h"

#define MT__BUCKET_SLOTS 4
#define MT__LANES        64
#define MT__CHUNK_HDR    64u
#define MT__CHUNK_MIN    (16u << 10)
#define MT__ARENA_BLOCK  (2u << 20) /* slab chunks are carved from blocks this big */
#define MT__CACHELINE    64

typedef struct mt__bucket {
    uint64_t key[MT__BUCKET_SLOTS];
    void *row[MT__BUCKET_SLOTS];
} mt__bucket_t;

/* A part's bucket array: the header is a small allocation of its own, the buckets are in
 * the table's pool; both are replaced together by a grow and freed after a grace period. */
typedef struct mt__barray {
    uint64_t mask;   /* nbuckets - 1; nbuckets is a power of two >= 2 */
    mt__bucket_t *b; /* nbuckets buckets, 64-byte aligned */
} mt__barray_t;

/* ---- bucket pool (bpool.c) ----
 * Bucket storage of power-of-two sizes: below 2 MiB, slots of 2 MiB blocks that each hold
 * one size (on transparent huge pages, given back when their last slot is freed); from
 * 2 MiB up, an aligned allocation of its own. Every function takes lock (thread-safe). */
#define MT__BPOOL_MIN     128u /* smallest storage: 2 buckets */
#define MT__BPOOL_KLASSES 14   /* 128 B .. 1 MiB */

typedef struct mt__bblock {
    char *base;         /* MT__ARENA_BLOCK bytes, aligned to it */
    unsigned klass;     /* slot bytes = MT__BPOOL_MIN << klass */
    uint32_t used;      /* slots handed out */
    uint32_t used_ever; /* slots below base + used_ever * size were handed out once */
    uint32_t fresh;     /* slots never handed out */
    void *free;         /* freed slots, linked through their first bytes */
} mt__bblock_t;

typedef struct mt__bpool {
    pthread_mutex_t lock;
    mt__bblock_t *blocks; /* sorted by base */
    size_t n, cap;
    size_t hint[MT__BPOOL_KLASSES];  /* block of each size that last had space */
    size_t avail[MT__BPOOL_KLASSES]; /* blocks of each size with a free slot */
    uint64_t bytes;                  /* blocks and own allocations */
} mt__bpool_t;

void mt__bpool_init(mt__bpool_t *bp);
/* bytes: a power of two >= MT__BPOOL_MIN. @returns 64-byte aligned storage or NULL. */
void *mt__bpool_alloc(mt__bpool_t *bp, size_t bytes);
/* p from mt__bpool_alloc(bp, bytes) with the same bytes, or NULL. */
void mt__bpool_free(mt__bpool_t *bp, void *p, size_t bytes);
uint64_t mt__bpool_bytes(mt__bpool_t *bp);
/* Frees every block: only when no array is in use any more (mt_table_destroy). */
void mt__bpool_destroy(mt__bpool_t *bp);

typedef struct mt__row {
    uint64_t version;
    uint32_t touch_s;
    uint32_t count;
} mt__row_t;

typedef struct mt__slot {
    mt_table_slot_config_t cfg;
    uint32_t state_floats; /* optimizer state per row */
    uint32_t emb_bytes;    /* embedding bytes (fp16 padded to 4), at least 8 */
    uint32_t split;        /* layout (see the top): 1 split, 0 together */
    uint32_t tail_bytes;   /* split: header + optimizer state, a multiple of 8 */
    uint32_t row_bytes;    /* what a row costs in a chunk (together: a multiple of 8) */
    uint32_t klass;        /* slab class (index into part slabs): same geometry, same class */
    uint32_t chunk_bytes;  /* power of two; chunks are aligned to it */
    uint32_t chunk_rows;   /* rows per chunk */
    uint32_t tail_off;     /* split: offset of the tail array in a chunk */
} mt__slot_t;

typedef struct mt__slab {
    void *free;     /* free rows, linked through their embedding bytes */
    char *cur;      /* next never-used embedding in the newest chunk */
    uint32_t left;  /* never-used rows left in the newest chunk */
    uint64_t bytes; /* bytes of all chunks */
} mt__slab_t;

typedef struct mt__logent {
    uint64_t fid;
    uint64_t version;
    void *row; /* NULL: deletion; live iff no newer entry has the same fid */
} mt__logent_t;

typedef struct mt__part {
    /* Read by lock-free readers; written by writers holding lock. */
    _Alignas(MT__CACHELINE) _Atomic uint64_t seq;
    mt__barray_t *_Atomic arr;
    _Atomic uint64_t mask_hint;    /* arr's mask, for prefetching without touching arr */
    mt__bucket_t *_Atomic bk_hint; /* arr's buckets, likewise */
    /* Everything below is guarded by lock. */
    _Alignas(MT__CACHELINE) pthread_mutex_t lock;
    uint64_t rows;
    uint64_t clock;              /* last version handed out in this part */
    mt__slab_t *slabs;           /* [t->nclasses] */
    uint8_t *cm;                 /* [cm_depth * cm_width] */
    uint64_t cm_nonzero;         /* non-zero counters in cm (aging trigger) */
    mt__logent_t *log;           /* ring of log_cap entries */
    uint64_t log_start, log_end; /* entries [log_start, log_end) live at index & (log_cap-1) */
    uint64_t log_floor;          /* since < log_floor cannot be served incrementally */
    uint64_t log_maybe_dead;     /* changes since the last scan that may supersede an entry */
    int log_has_del;             /* the log may hold a deletion entry */
    /* Moves on whenever a row of the part is freed (part_remove_at): a hint
     * (mt_table_hint_t) taken at another value no longer counts. Starts at a value drawn per
     * table and part, so that another table's hint does not count either. */
    uint64_t gen;
    /* Counters (guarded by lock). */
    uint64_t n_inserts, n_removals, n_evictions, n_grows, n_filtered, n_log_drops;
#ifndef NDEBUG
    pthread_t owner; /* the thread holding lock, when owned (debug builds: MT__PART_LOCKED) */
    int owned;
#endif
} mt__part_t;

/* A hash set of fids, cleared by bumping stamp (table.c, log_make_room). */
typedef struct mt__logset {
    uint64_t *keys;
    uint32_t *stamps;
    uint64_t sz; /* slots, a power of two */
    uint32_t stamp;
} mt__logset_t;

typedef struct mt__lane {
    _Alignas(MT__CACHELINE) _Atomic uint64_t cnt[2];
} mt__lane_t;

struct mt_table {
    mt_table_config_t cfg; /* cfg.slots points to slots_cfg */
    mt_table_slot_config_t *slots_cfg;
    mt__slot_t *slots;
    uint32_t nslots;
    uint32_t nclasses;
    uint32_t *class_slot; /* a slot of each slab class (they share its geometry) */
    uint32_t *slot_index; /* [65536]: 1 + index into slots, 0 = not configured */
    uint32_t nparts;
    uint32_t part_shift; /* part = h1 >> part_shift (nparts > 1) */
    uint64_t seed1, seed2, seed_cm;
    uint32_t cm_depth, cm_width;
    uint64_t log_cap;                    /* entries per part: a power of two (0: off) */
    uint64_t max_rows_num, max_rows_den; /* grow when rows * den > cap * num */
    mt__part_t *parts;
    mt__lane_t *lanes;
    _Atomic unsigned rcu_idx;
    pthread_mutex_t rcu_lock; /* one grace period at a time */
    _Atomic uint64_t clock;   /* global version clock (see mt__part_version) */
    pthread_mutex_t expire_lock;
    pthread_mutex_t arena_lock;  /* guards the arena_* fields */
    char *arena_cur, *arena_end; /* free space of the newest block */
    void **arena_blocks;         /* every block, freed by mt_table_destroy() */
    size_t arena_n, arena_cap;
    size_t arena_reserved; /* blocks [arena_used, arena_reserved) are reserved, unused */
    size_t arena_used;
    uint64_t arena_bytes;
    mt__bpool_t bpool;                /* bucket storage of every part */
    pthread_mutex_t log_scratch_lock; /* guards log_scratch (taken under a part's lock) */
    mt__logset_t log_scratch;         /* the fid set of log_make_room */
    uint32_t expire_part;             /* clock hand of mt_table_expire(), under expire_lock */
    uint64_t expire_bucket;
};

/* ---- part locks ----
 * Every part lock is taken and released through these two, so that debug builds know the
 * owner and the functions documented "caller holds p->lock" assert it (MT__PART_LOCKED). */
static inline void mt__part_lock(mt__part_t *p) {
    pthread_mutex_lock(&p->lock);
#ifndef NDEBUG
    assert(!p->owned);
    p->owner = pthread_self();
    p->owned = 1;
#endif
}
static inline void mt__part_unlock(mt__part_t *p) {
#ifndef NDEBUG
    assert(p->owned && pthread_equal(p->owner, pthread_self()));
    p->owned = 0;
#endif
    pthread_mutex_unlock(&p->lock);
}
#ifndef NDEBUG
/* Read only by the holder (it wrote them last), so the check itself does not race. */
#define MT__PART_LOCKED(p) ((p)->owned && pthread_equal((p)->owner, pthread_self()))
#else
#define MT__PART_LOCKED(p) 1
#endif

/* ---- shared helpers (table.c) ---- */
static inline const mt__slot_t *mt__slot_of(const mt_table_t *t, uint64_t fid) {
    uint32_t i = t->slot_index[MT_FID_SLOT(fid)];
    return i ? &t->slots[i - 1] : NULL;
}
/** The header of a row (together: the bytes before its embedding; split: in its chunk's
 *  tail array). */
static inline mt__row_t *mt__row_hdr(const mt__slot_t *s, const void *row) {
    if (!s->split) return (mt__row_t *)(void *)((char *)(uintptr_t)row - sizeof(mt__row_t));
    uintptr_t r = (uintptr_t)row, base = r & ~(uintptr_t)(s->chunk_bytes - 1);
    uintptr_t i = (r - base - MT__CHUNK_HDR) / s->emb_bytes;
    return (mt__row_t *)(base + s->tail_off + i * s->tail_bytes);
}
/** A row's optimizer state (together: after its embedding; split: after its header). */
static inline float *mt__row_state(const mt__slot_t *s, void *row) {
    if (!s->split) return (float *)(void *)((char *)row + s->emb_bytes);
    return (float *)(void *)(mt__row_hdr(s, row) + 1);
}
static inline void *mt__row_emb(void *row) {
    return row;
}

/** Copies a row's embedding out as fp32. */
void mt__row_read_emb(const mt__slot_t *s, const void *row, float *out);
/** Stores fp32 values into a row's embedding (converting to fp16 if configured). */
void mt__row_write_emb(const mt__slot_t *s, void *row, const float *in);
/** Next version for a change in part p (caller holds p->lock). */
uint64_t mt__part_version(mt_table_t *t, mt__part_t *p);
/** Appends a change-log entry (caller holds p->lock). */
void mt__log_append(mt_table_t *t, mt__part_t *p, uint64_t fid, uint64_t version, void *row);
/** Allocates and places a row for fid in part p with the given content (caller holds lock);
 *  emb/state NULL mean "initialize as a new row". */
mt_err_t mt__part_insert(mt_table_t *t, mt__part_t *p, uint64_t fid, const mt__slot_t *s,
                         const float *emb, const float *state, uint32_t touch_s, uint32_t count,
                         uint64_t version, void **row_out, mt__barray_t **retired);
/** Gives fid exactly this row (caller holds p->lock), for loads: the embedding bytes as
 *  stored (emb_raw_bytes <= s->emb_bytes: fp32, or fp16 padded to 4, copied as they are so
 *  that fp16 stays bit-exact), state_floats of state, touch, count and version. Replaces
 *  fid's row in place (the embedding under the seqlock) if it has one, else inserts it.
 *  Bypasses the frequency filter and the change log: the caller raises the clock and the
 *  log floors afterwards (serialize.c). @param[out] replaced  1 if fid had a row.
 *  @returns MT_OK or MT_NOMEM (then fid has no row, or its old one if it had one). */
mt_err_t mt__part_put_raw(mt_table_t *t, mt__part_t *p, uint64_t fid, const mt__slot_t *s,
                          const void *emb_raw, size_t emb_raw_bytes, const float *state,
                          uint32_t touch_s, uint32_t count, uint64_t version, int *replaced,
                          mt__barray_t **retired);
/** Removes fid's row from part p as mt_table_remove() does: a new version and a deletion
 *  in the change log (caller holds p->lock). @returns 1 if fid had a row, else 0. */
int mt__part_remove(mt_table_t *t, mt__part_t *p, uint64_t fid);
/** Frees a bucket array retired by a grow once no reader can hold it (no lock held). */
void mt__retire(mt_table_t *t, mt__barray_t *old);
uint32_t mt__part_of(const mt_table_t *t, uint64_t fid);
/** The row of fid in part p or NULL (caller holds p->lock). */
void *mt__part_find(mt_table_t *t, mt__part_t *p, uint64_t fid);

/* ---- optimizers (optim.c) ---- */
uint32_t mt__opt_state_floats(const mt_table_slot_config_t *s);
void mt__opt_init_state(const mt_table_slot_config_t *s, float *state);
/** One step on w[0..dim) with its state and gradient g. */
void mt__opt_apply(const mt_table_slot_config_t *s, float *w, float *state, const float *g);
/** Deterministic initial embedding of fid. */
void mt__init_emb(const mt_table_slot_config_t *s, uint64_t fid, float *w);

/* ---- count-min sketch (sketch.c), on one part's region, caller holds its lock ---- */
/** Counts one sighting with conservative update; @returns the new estimate (<= 255). */
uint32_t mt__cm_add(const mt_table_t *t, mt__part_t *p, uint64_t fid);
/** Current estimate without counting. */
uint32_t mt__cm_estimate(const mt_table_t *t, const mt__part_t *p, uint64_t fid);

#endif /* MT_TABLE_INT_H */
