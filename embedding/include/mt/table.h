/*
 * table.h - the collisionless embedding table of Monolith-C.
 *
 * A map from 64-bit feature id (fid) to an embedding row: the embedding, its optimizer state
 * and metadata (last-touch time, occurrence count, version of the last change). No two ids
 * ever share a row. The top 16 bits of a fid are its slot; every slot that may appear must be
 * configured (dim, initializer, optimizer, frequency threshold, TTL, storage precision).
 *
 * Design (details in docs/table.md):
 *  - The table is split into 2^shards_log2 independent sub-tables ("parts") by hash. Each part
 *    is a bucketized cuckoo hash (64-byte buckets of 4 slots, two XXH3 hash functions with
 *    different seeds, BFS displacement paths) with its own writer mutex, sequence counter,
 *    row slabs, count-min sketch region and change log. A part grows (doubles) on its own,
 *    so growth never stops the whole table, and readers go on during a part's rehash.
 *  - Readers are lock-free: they validate each row copy with the part's sequence counter
 *    (seqlock) and are protected from freed bucket arrays by a sleepable-RCU scheme whose
 *    counters are striped by CPU and touched once per chunk of a batch.
 *  - Frequency filter: an id below its slot's min_count has no row; it is counted in a
 *    count-min sketch with conservative update whose memory is fixed by configuration.
 *  - Expiry: mt_table_expire() sweeps a bounded number of buckets per call (a clock hand).
 *  - Change tracking: every insert, update and removal takes a new version; each part keeps
 *    a bounded log of (fid, version) entries, compacted when full (only the newest entry of
 *    an id is kept); entries are only dropped when more than 3/4 of a part's log holds
 *    distinct ids, and then the part records a watermark below which an incremental sync
 *    answers with a full stream (or MT_FULL_SYNC). The same log drives incremental saves:
 *    mt_table_save_changes() writes the rows changed since a version, mt_table_load_changes()
 *    applies them to a copy loaded from a full save.
 *
 * Thread safety: all functions taking an mt_table_t are thread-safe and may run concurrently
 * with one another, except mt_table_destroy(), which needs exclusive access. Lookups without
 * MT_TABLE_TRAIN take no lock. Writers lock only the part of each id, one part at a time (a
 * run of a batch's consecutive ids in one part under one lock).
 * Each row read is consistent (never torn); a batch is not a snapshot of the whole table.
 *
 * Time: every function that needs time takes it from the caller as now_s (seconds, any
 * epoch: example timestamps when replaying, wall clock when live). Time never goes backwards
 * for a row: an older now_s does not lower its last-touch time.
 */
#ifndef MT_TABLE_H
#define MT_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "mt/err.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_TABLE_MAX_DIM         1024u
#define MT_FID_SLOT(fid)         ((uint16_t)((uint64_t)(fid) >> 48))
#define MT_FID_MAKE(slot, value) (((uint64_t)(slot) << 48) | ((uint64_t)(value)&0xFFFFFFFFFFFFull))

typedef struct mt_table mt_table_t;

typedef enum mt_table_init {
    MT_INIT_ZEROS = 0,
    MT_INIT_UNIFORM = 1, /* uniform in [-init_scale, +init_scale] */
    MT_INIT_NORMAL = 2   /* normal with mean init_mean and stddev init_scale */
} mt_table_init_t;

typedef enum mt_table_opt {
    MT_OPT_SGD = 0,     /* w -= lr * g */
    MT_OPT_ADAGRAD = 1, /* a += g^2; w -= lr * g / (sqrt(a) + eps); a starts at init_accum */
    MT_OPT_FTRL = 2,    /* FTRL-Proximal (McMahan et al. 2013), per coordinate z and n */
    MT_OPT_ADAM = 3     /* Adam with per-row bias correction (each row counts its own steps) */
} mt_table_opt_t;

typedef enum mt_table_precision {
    MT_PREC_FP32 = 0,
    MT_PREC_FP16 = 1 /* embedding stored as IEEE binary16; optimizer state stays fp32 */
} mt_table_precision_t;

/** Per-slot settings. Initialize with mt_table_slot_config_init(), then set fields. */
typedef struct mt_table_slot_config {
    uint16_t slot;        /* slot id: top 16 bits of the fids it configures */
    uint32_t dim;         /* embedding width, 1..MT_TABLE_MAX_DIM */
    mt_table_init_t init; /* initializer of a new row (deterministic per fid and init_seed) */
    float init_scale;     /* uniform: half-width; normal: stddev (default 0.01) */
    float init_mean;      /* normal: mean (default 0) */
    uint64_t init_seed;   /* every replica with the same seed builds the same rows */
    mt_table_opt_t opt;   /* optimizer applied in place by mt_table_apply() */
    float lr;             /* learning rate (FTRL: alpha) (default 0.01) */
    float eps;            /* Adagrad / Adam epsilon (default 1e-8) */
    float init_accum;     /* Adagrad initial accumulator (default 0.1) */
    float beta1, beta2;   /* Adam moments (default 0.9, 0.999) */
    float ftrl_beta;      /* FTRL beta (default 1.0) */
    float l1, l2;         /* FTRL regularization (default 0, 0) */
    uint32_t min_count;   /* frequency filter: a row is created at the min_count-th training
                               sighting; 0 and 1 admit at once (default 0) */
    uint32_t ttl_s;       /* rows idle longer than this are evicted; 0 never (default 0) */
    mt_table_precision_t precision; /* storage precision of the embedding (default fp32) */
    uint32_t zero_tail; /* the last zero_tail floats of a new row start at 0 whatever the
                             initializer (a model's own weight kept in the row, as a slot's
                             first-order weight beside its embedding); 0..dim (default 0) */
} mt_table_slot_config_t;

/** Table settings. Initialize with mt_table_config_init(), then set fields. */
typedef struct mt_table_config {
    const mt_table_slot_config_t *slots; /* borrowed during mt_table_create() (copied) */
    size_t nslots;                       /* number of entries in slots, >= 1, unique slot ids */
    uint32_t shards_log2;                /* 2^shards_log2 independent parts, 0..16 (default 10) */
    uint64_t initial_rows;      /* pre-size for this many rows; 0 grows from empty (default 0) */
    int reserve_rows;           /* with initial_rows: also take the row memory of that many
                                   rows (of the largest slot's size) at create and fault its
                                   pages in, so that those inserts take no page faults; it
                                   counts in bytes_rows from the start; more than the
                                   machine's memory: MT_NOMEM at create (default 0) */
    double max_load;            /* part grows above this load factor, 0.5..0.97 (default 0.9) */
    uint64_t filter_bytes;      /* count-min sketch memory, split over parts (default 8 MiB);
                                    0 only if every slot has min_count <= 1 */
    uint32_t filter_depth;      /* count-min hash rows, 1..8 (default 4) */
    uint64_t changelog_entries; /* change-log capacity over all parts (default 1 Mi entries,
                                   24 bytes each; each part's share is rounded down to a
                                   power of two); at least 64 per part, or 0 to turn change
                                   tracking off (every change stream is then a full one) */
    uint64_t hash_seed;         /* seeds the cuckoo and sketch hashes (default fixed) */
} mt_table_config_t;

/** Per-call outcome counters (all optional: pass NULL). */
typedef struct mt_table_op_stats {
    uint64_t found;    /* ids that had a row */
    uint64_t missing;  /* ids without a row (zeros returned / gradient dropped) */
    uint64_t admitted; /* rows created by this call */
    uint64_t filtered; /* training sightings counted by the filter without admission */
} mt_table_op_stats_t;

/** Table-wide figures, read without stopping writers (each figure is exact for its part). */
typedef struct mt_table_stats {
    uint64_t rows;
    uint64_t capacity;        /* row slots in all bucket arrays */
    double load_factor;       /* rows / capacity */
    uint64_t bytes_rows;      /* slab memory holding rows (including free rows) */
    uint64_t bytes_buckets;   /* bucket arrays */
    uint64_t bytes_filter;    /* count-min sketch */
    uint64_t bytes_changelog; /* change logs */
    uint64_t bytes_total;     /* all of the above plus part headers */
    uint64_t version;         /* highest version handed out so far */
    uint64_t inserts, removals, evictions, grows, filtered, changelog_drops;
    uint64_t full_sync_below; /* incremental sync from a version below this answers FULL_SYNC */
} mt_table_stats_t;

/** One entry of a change stream (see mt_table_changes_begin()). */
typedef struct mt_table_change {
    uint64_t fid;
    uint64_t version; /* version of the change */
    uint32_t dim;     /* floats this entry has in the values array (0 if deleted) */
    uint8_t deleted;  /* 1: the id no longer has a row (removed or expired) */
} mt_table_change_t;

typedef struct mt_table_changes mt_table_changes_t;

/** Serialization callbacks: return MT_OK or an error, which aborts the operation. */
typedef mt_err_t (*mt_table_write_fn)(void *ud, const void *buf, size_t len);
/** Reads exactly @p len bytes or fewer at end of input; sets *got to the number read. */
typedef mt_err_t (*mt_table_read_fn)(void *ud, void *buf, size_t len, size_t *got);

void mt_table_config_init(mt_table_config_t *cfg);
void mt_table_slot_config_init(mt_table_slot_config_t *s, uint16_t slot, uint32_t dim);

/**
 * Checks every field of @p cfg and its slots.
 * @param[out] errbuf  receives a message naming the bad field (may be NULL)
 * @returns MT_OK or MT_CONFIG.
 */
mt_err_t mt_table_config_validate(const mt_table_config_t *cfg, char *errbuf, size_t errlen);

/**
 * Creates an empty table. @p cfg is validated and copied (slots included).
 * @param[out] out  on success, a table the caller frees with mt_table_destroy()
 * @returns MT_OK, MT_CONFIG or MT_NOMEM.
 */
mt_err_t mt_table_create(const mt_table_config_t *cfg, mt_table_t **out);

/** Frees the table and every row. NULL is a no-op. No other call may be running on it. */
void mt_table_destroy(mt_table_t *t);

/** @param[out] dim  the embedding width of @p fid's slot. @returns MT_OK or MT_UNKNOWN_SLOT. */
mt_err_t mt_table_dim(const mt_table_t *t, uint64_t fid, uint32_t *dim);

/**
 * Floats needed for the packed embeddings of @p fids (the sum of their slots' dims).
 * @returns MT_OK or MT_UNKNOWN_SLOT (nothing written to *nfloats).
 */
mt_err_t mt_table_batch_floats(const mt_table_t *t, const uint64_t *fids, size_t n,
                               size_t *nfloats);

/** mt_table_lookup() flag: training lookup. Touches found rows, counts every sighting
 *  (occurrence count, frequency filter) and creates rows for ids that reach their
 *  slot's min_count. Without it a lookup never writes anything. */
#define MT_TABLE_TRAIN 1u

/**
 * Batched lookup. Writes each id's embedding, in order, packed (id i starts after the dims
 * of ids 0..i-1) into @p out; ids without a row read zeros.
 * @param[out] out      at least mt_table_batch_floats() floats (@p out_len says how many)
 * @param[out] found    optional (NULL): found[i] = 1 if id i had (or got) a row, else 0
 * @param[out] st       optional counters, added to (not reset)
 * @returns MT_OK, MT_UNKNOWN_SLOT (nothing done), MT_TOO_SMALL (nothing done) or
 *          MT_NOMEM (rows up to the failing one were admitted).
 * Thread safety: lock-free without MT_TABLE_TRAIN; with it, locks the part of each run of
 * consecutive ids in one part (one lock held at a time).
 */
mt_err_t mt_table_lookup(mt_table_t *t, const uint64_t *fids, size_t n, float *out, size_t out_len,
                         uint8_t *found, unsigned flags, uint32_t now_s, mt_table_op_stats_t *st);

/**
 * Applies gradients with each slot's optimizer, in place. @p grads is packed like lookup
 * output. Ids without a row drop their gradient (st->missing). A repeated id is updated
 * once per occurrence, in order. Each updated row is touched and takes a new version.
 * @returns MT_OK, MT_UNKNOWN_SLOT or MT_TOO_SMALL (grads_len does not match; nothing done).
 */
mt_err_t mt_table_apply(mt_table_t *t, const uint64_t *fids, size_t n, const float *grads,
                        size_t grads_len, uint32_t now_s, mt_table_op_stats_t *st);

/** Where a training lookup left an id's row (mt_table_lookup_rows()), so that an apply of
 *  the same id (mt_table_apply_rows()) goes to the row without finding it again in its
 *  buckets. Opaque. A hint is checked, never trusted: it counts only for the id and the
 *  table that made it, and only while the id's part has freed no row since (a removal or an
 *  expiry in that part makes the apply find the id anew). */
typedef struct mt_table_hint {
    uint64_t opaque[3];
} mt_table_hint_t;

/**
 * mt_table_lookup() with MT_TABLE_TRAIN that also fills @p hints[0..n): id i's row, or none
 * (an id the filter kept out, or past an error). Same results and errors otherwise.
 * Thread safety: as mt_table_lookup() with MT_TABLE_TRAIN.
 */
mt_err_t mt_table_lookup_rows(mt_table_t *t, const uint64_t *fids, size_t n, float *out,
                              size_t out_len, uint32_t now_s, mt_table_hint_t *hints,
                              mt_table_op_stats_t *st);

/**
 * mt_table_apply() for ids whose rows a training lookup of this table gave @p hints for
 * (hints[i] for fids[i]; a repeated id may repeat its hint). Same results as
 * mt_table_apply() whatever happened to the table in between: an id whose hint no longer
 * counts (see mt_table_hint_t) is found anew, an id that lost its row drops its gradient.
 * Thread safety: as mt_table_apply().
 */
mt_err_t mt_table_apply_rows(mt_table_t *t, const uint64_t *fids, const mt_table_hint_t *hints,
                             size_t n, const float *grads, size_t grads_len, uint32_t now_s,
                             mt_table_op_stats_t *st);

/**
 * Sets embeddings (packed like lookup output), creating rows as needed without the filter;
 * a created row's optimizer state starts as for a new row. For replicas (serving sync).
 * @returns MT_OK, MT_UNKNOWN_SLOT / MT_TOO_SMALL (nothing done) or MT_NOMEM.
 */
mt_err_t mt_table_assign(mt_table_t *t, const uint64_t *fids, size_t n, const float *values,
                         size_t values_len, uint32_t now_s, mt_table_op_stats_t *st);

/** Removes rows. @param[out] removed  optional: how many ids had a row. */
mt_err_t mt_table_remove(mt_table_t *t, const uint64_t *fids, size_t n, uint64_t *removed);

/**
 * Incremental expiry: examines at most @p max_buckets buckets from where the previous call
 * stopped (a clock hand over all parts) and evicts rows idle longer than their slot's TTL
 * (last touch + ttl_s < now_s). Each eviction is a change (a deletion) for sync.
 * @param[out] evicted  optional: rows evicted by this call
 */
mt_err_t mt_table_expire(mt_table_t *t, uint32_t now_s, size_t max_buckets, uint64_t *evicted);

/** Buckets in the whole table: mt_table_expire() with this budget sweeps it once. */
uint64_t mt_table_buckets(mt_table_t *t);

/**
 * The table's number of parts (2^shards_log2) and, when @p n > 0, the part of each id:
 * parts[i] for fids[i]. A writer's batch (training lookup, apply, assign) whose ids come
 * grouped by part takes each part's lock once for a run of its ids and reads one part's
 * buckets and rows at a time (a trainer orders its unique ids so). Lock-free, thread-safe.
 */
uint32_t mt_table_parts_of(const mt_table_t *t, const uint64_t *fids, size_t n, uint32_t *parts);

/**
 * Where each id of a batch goes when the batch is grouped by part: to[i] is the place of
 * fids[i] with the parts in ascending order and the ids of one part in their order in @p fids
 * (a stable counting sort: an id given twice keeps its two places' order, so a batch in this
 * order applies the same updates as in its own). A writer's batch in that order takes each
 * part's lock once for a run of its ids (mt_table_parts_of()). @p count: scratch of parts + 1
 * entries, or NULL (the stack up to 1,024 parts, the heap beyond). @returns MT_OK, MT_INVALID
 * (@p n over UINT32_MAX) or MT_NOMEM. Lock-free, thread-safe.
 */
mt_err_t mt_table_part_order(const mt_table_t *t, const uint64_t *fids, size_t n, uint32_t *to,
                             uint32_t *count);

/**
 * Full row export for tests and tools: the embedding (as fp32), the optimizer state and the
 * metadata of one id. @p emb and @p state take the slot's dim and optimizer state floats
 * (pass NULL to skip). @returns MT_OK, MT_NOT_FOUND or MT_UNKNOWN_SLOT.
 */
mt_err_t mt_table_get_row(mt_table_t *t, uint64_t fid, float *emb, float *state, size_t state_len,
                          uint32_t *touch_s, uint32_t *count, uint64_t *version);

/** The configuration of @p fid's slot (valid until mt_table_destroy()), or NULL if the slot
 *  is not configured. */
const mt_table_slot_config_t *mt_table_slot_config(const mt_table_t *t, uint64_t fid);

/** Optimizer-state floats per row of @p fid's slot. @returns MT_OK or MT_UNKNOWN_SLOT. */
mt_err_t mt_table_state_floats(const mt_table_t *t, uint64_t fid, uint32_t *nfloats);

/** Fills @p out. Thread-safe; takes each part's lock briefly. */
void mt_table_stats(mt_table_t *t, mt_table_stats_t *out);

/** Bytes of one row of @p fid's slot in the slabs (key excluded). */
mt_err_t mt_table_row_bytes(const mt_table_t *t, uint64_t fid, uint32_t *bytes);

/**
 * Starts enumerating what changed after version @p since, for replicas.
 * If @p since is 0 or too old (below stats.full_sync_below, or from before a load),
 * the stream is a full one: every row as an upsert, and *full is set to 1, meaning the
 * receiver must drop what it holds first. Otherwise the stream lists, per part in version
 * order, rows changed (with their current embedding) and ids deleted after @p since;
 * applying them in order brings a replica up to date.
 * @param[out] it    caller frees with mt_table_changes_end()
 * @param[out] upto  pass it as @p since next time: every change made after this call
 *                   started has a higher version (changes made during the enumeration may
 *                   appear now and again next time, never nowhere)
 * @param[out] full  1 for a full stream
 */
mt_err_t mt_table_changes_begin(mt_table_t *t, uint64_t since, mt_table_changes_t **it,
                                uint64_t *upto, int *full);

/**
 * Next entries of the stream. @p values receives the embeddings of non-deleted entries,
 * packed. Returns fewer entries than @p cap when the values do not fit.
 * @param[out] n_out  entries written; 0 means the stream is over
 * @returns MT_OK, MT_NOMEM, MT_TOO_SMALL (one entry's values exceed values_cap) or
 *          MT_FULL_SYNC (the log was compacted past this stream while it ran: start a full one).
 */
mt_err_t mt_table_changes_next(mt_table_changes_t *it, mt_table_change_t *out, size_t cap,
                               float *values, size_t values_cap, size_t *n_out);

/** Frees the iterator. NULL is a no-op. */
void mt_table_changes_end(mt_table_changes_t *it);

/**
 * A version to pass later as @p since (mt_table_changes_begin(), mt_table_save_changes()):
 * every change made after this call has a higher version (the `upto` of an iterator begun
 * now). Take it before a whole save to follow that save with change streams: the changes
 * made while the save ran then come in both, never in neither. Not mt_table_stats().version:
 * parts keep clocks of their own, and a change after it may take a lower version.
 * Thread-safe; takes each part's lock briefly.
 */
uint64_t mt_table_changes_cursor(mt_table_t *t);

/**
 * Writes the whole table (config, rows with optimizer state and metadata, filter counts,
 * version clock) through @p fn in the versioned, checksummed format of docs/table.md.
 * Each part is copied under its lock (consistently) and written after it; concurrent writers
 * may land in parts not yet copied. The save makes one pass and never waits for writers, so
 * it ends under any write load, and it writes the rows present when it began (less those
 * removed meanwhile) plus those inserted, while it ran, into parts it had not reached yet;
 * it holds one part's copy at a time. @p fn is called with no table lock held (it may even
 * write to the table).
 */
mt_err_t mt_table_save(mt_table_t *t, mt_table_write_fn fn, void *ud);

/**
 * Builds a new table from a stream written by mt_table_save(). The slots of @p cfg must
 * match the stream's (dims, optimizers, precision): other settings may differ.
 * @param[out] out  on success only; on any error nothing is left allocated
 * @returns MT_OK, MT_TRUNCATED, MT_CORRUPT, MT_VERSION, MT_MISMATCH, MT_CONFIG, MT_NOMEM, or
 *          the error of @p fn.
 */
mt_err_t mt_table_load(const mt_table_config_t *cfg, mt_table_read_fn fn, void *ud,
                       mt_table_t **out);

/**
 * Writes the rows that changed after version @p since (full rows: embedding as stored,
 * optimizer state, touch, count, version) and the ids deleted after it, in the checksummed
 * block format of docs/table.md ("Change streams"). Applying it (mt_table_load_changes) to a
 * table holding the state as of @p since brings that table to this one's state as of *upto.
 * Each id is written with its state when the save reads it, under its part's lock; writers
 * may run meanwhile (as for mt_table_save()): each row is consistent, and a change made while
 * this runs is in this stream or, with a version above *upto, in the next one. @p fn is
 * called with no table lock held. Typical use: *upto of a call answering MT_FULL_SYNC, then
 * a full mt_table_save(), then deltas, each from the *upto of the one before.
 * @param[out] upto  pass it as @p since next time; set whenever the call got as far as
 *                   reading the change log, MT_FULL_SYNC included (a full save written
 *                   after this call may be followed by a delta since *upto)
 * @returns MT_OK; MT_FULL_SYNC if @p since cannot be served incrementally (0, below
 *          stats.full_sync_below, from before a load, or the log was compacted past it while
 *          this ran): the caller writes a full mt_table_save() instead (and discards what
 *          this call wrote: nothing if @p since was refused at the start); an error of
 *          @p fn; MT_NOMEM.
 */
mt_err_t mt_table_save_changes(mt_table_t *t, uint64_t since, mt_table_write_fn fn, void *ud,
                               uint64_t *upto);

/**
 * Applies a stream of mt_table_save_changes() to @p t: rows replaced or inserted (exact
 * bytes, fp16 stays bit-exact, no frequency filter), deleted ids removed. Afterwards the
 * version clock is above every version in the stream and nothing before is servable
 * incrementally (like mt_table_load()): replicas of @p t get a full sync. The count-min
 * sketch is not carried by deltas. That @p t held the state as of the stream's `since` is
 * the caller's word (not checked). On error @p t may hold part of the stream: the caller
 * discards it.
 * Thread safety: safe beside any call, and lookups see each row before or after its
 * replacement; but the rows put are not in the change log (the log floor makes every replica
 * resync in full), so a change stream of @p t running meanwhile may miss some: load deltas
 * into a table that no replica follows yet (a restore, before it serves).
 * @param[out] rows, deletions  optional counts applied (deletions: ids of the stream's
 *                              deletions, whether they had a row here or not)
 * @returns MT_OK, MT_TRUNCATED, MT_CORRUPT (also a table stream given by mistake),
 *          MT_VERSION, MT_MISMATCH (a slot of the stream not configured in @p t with the
 *          same dim, optimizer and precision), MT_NOMEM or the error of @p fn.
 */
mt_err_t mt_table_load_changes(mt_table_t *t, mt_table_read_fn fn, void *ud, uint64_t *rows,
                               uint64_t *deletions);

/** Converts between IEEE binary16 and float (round to nearest even). */
uint16_t mt_fp16_from_float(float f);
float mt_fp16_to_float(uint16_t h);

#ifdef __cplusplus
}
#endif

#endif /* MT_TABLE_H */
