/*
 * store.h - durable checkpoints of embedding tables on RocksDB.
 *
 * A store is one RocksDB database in one directory. A checkpoint (id > 0, chosen by the
 * caller, strictly increasing) holds any number of named tables, each streamed with
 * mt_table_save() into values of at most chunk_bytes, and one opaque metadata blob (the PS
 * puts its CheckpointMeta there: the Kafka offsets that produced the parameters).
 *
 * Durability: a checkpoint becomes visible at once and whole, or not at all. Its data is
 * written first, as one SST file that is fsynced and ingested into the database, then one
 * synced WriteBatch (WAL fsync) writes its commit record, moves the `current` pointer to it
 * and deletes (DeleteRange) the checkpoints beyond the newest `keep`. A crash at any
 * earlier point leaves `current` and every complete checkpoint as they were; the partial
 * data has no commit record, is never read, and the next open or save deletes it. Disk
 * space: about keep + 1 checkpoints during a save. Key layout and protocol, and why SST
 * ingestion rather than WriteBatches of chunks: store/src/store.c.
 *
 * Incremental checkpoints: a table may be saved as its changes since the current checkpoint
 * (mt_store_table_t.since); the checkpoint then depends on its parent, which depends on its
 * own, down to a checkpoint holding the whole table. Loading such a table loads that chain
 * in order; pruning keeps every checkpoint a kept one depends on, so `keep` counts the
 * newest checkpoints and the chain behind them stays as long as they need it.
 *
 * Damage: RocksDB refuses to open a database with a damaged table file (e.g. truncated);
 * since each checkpoint's data is one such file, mt_store_open() then opens it without
 * RocksDB's paranoid checks (logged as a warning): the other checkpoints load, the damaged
 * one's loads fail with MT_CORRUPT naming it (and, for a truncated file, its size on disk
 * and the size expected), and mt_store_drop() deletes it.
 *
 * Errors: every fallible function returns an mt_err_t and, on error, writes a message into
 * @p errbuf (size @p errlen; NULL or 0 for none), naming the key, table or RocksDB status.
 * RocksDB errors are translated here: "Corruption" -> MT_CORRUPT, busy / try again ->
 * MT_UNAVAILABLE, anything else -> MT_IO. No RocksDB type appears in this header.
 *
 * Thread safety: a store may be used from several threads. mt_store_save() calls are
 * serialized by the store (a second one waits). mt_store_current(), mt_store_list() and the
 * load functions may run concurrently with each other and with a save: each sees the
 * checkpoints as of one moment, and a save's commit and prune wait until loads that are in
 * progress finish (a load never has data pulled from under it). mt_store_open() and
 * mt_store_close() need exclusive access. Lock order (store.c): save_lock -> ckpt_lock.
 */
#ifndef MT_STORE_H
#define MT_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "mt/err.h"
#include "mt/table.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_STORE_MAX_NAME   64u   /* longest table name, in bytes */
#define MT_STORE_MAX_TABLES 1024u /* tables per checkpoint */

typedef struct mt_store mt_store_t;

/** Store settings. Initialize with mt_store_config_init(), then set fields. */
typedef struct mt_store_config {
    uint32_t keep;            /* complete checkpoints kept after a save, 1..10000 (default 3) */
    uint64_t chunk_bytes;     /* largest value a table stream is cut into, 4 KiB..64 MiB
                                 (default 4 MiB); a save holds one chunk in memory */
    uint32_t background_jobs; /* RocksDB flush and compaction threads, 1..64 (default 2) */
    int compress;             /* 1: LZ4 on SST blocks; 0: none (default 0: trained floats
                                 barely compress and the CPU is the trainers') */
    int compact_on_prune;     /* 1: compact the key ranges of pruned checkpoints at the end
                                 of a save, so their space comes back at once (default 1) */
    int create_if_missing;    /* 1: create the database if dir has none (default 1) */
    int read_only;            /* 1: open read-only, e.g. for a tool while the PS runs: no
                                 lock taken, sees the state at open, saves fail (default 0) */
} mt_store_config_t;

/** One table of a checkpoint being saved. */
typedef struct mt_store_table {
    const char *name;  /* 1..MT_STORE_MAX_NAME bytes of [A-Za-z0-9_.-]; borrowed for the call */
    mt_table_t *table; /* borrowed for the call */
    uint64_t since;    /* 0: the whole table; else only its changes after this version
                          (mt_table_save_changes()), on top of the table of the same name in
                          the current checkpoint, which must hold it as of that version */
} mt_store_table_t;

/** What a save did (all figures of this call). */
typedef struct mt_store_result {
    uint64_t rows;      /* rows of the tables (mt_table_stats() just before each stream;
                           exact when no writer runs during the save) */
    uint64_t bytes;     /* table stream bytes written (metadata excluded) */
    uint64_t chunks;    /* table chunks (RocksDB values) written */
    uint64_t pruned;    /* checkpoints deleted: older complete ones and incomplete leftovers */
    double seconds;     /* the whole call */
    double stream_s;    /* streaming the tables into the SST file, fsync included */
    double durable_s;   /* ingesting the file and the synced commit */
    double prune_s;     /* deleting and compacting pruned checkpoints */
    mt_err_t prune_err; /* MT_OK, or why pruning failed after a successful commit (the save
                           still succeeded and errbuf says why; the next save retries) */
} mt_store_result_t;

/** A complete checkpoint, as listed by mt_store_list(). */
typedef struct mt_store_info {
    uint64_t checkpoint_id;
    uint64_t created_ms; /* wall clock at commit, Unix milliseconds */
    uint32_t ntables;
    uint64_t rows;       /* sum over its tables (as in mt_store_result_t) */
    uint64_t bytes;      /* table stream bytes */
    uint64_t meta_bytes; /* metadata blob size */
    uint64_t parent;     /* the checkpoint its change streams apply onto; 0: whole tables */
} mt_store_info_t;

void mt_store_config_init(mt_store_config_t *cfg);

/**
 * Checks every field of @p cfg.
 * @param[out] errbuf  receives a message naming the bad field (may be NULL)
 * @returns MT_OK or MT_CONFIG.
 */
mt_err_t mt_store_config_validate(const mt_store_config_t *cfg, char *errbuf, size_t errlen);

/**
 * Opens (and with create_if_missing creates) the store in directory @p dir.
 * @param[in]  cfg  NULL for defaults; copied
 * @param[out] out  on success, a store the caller closes with mt_store_close()
 * @returns MT_OK, MT_INVALID, MT_CONFIG, MT_NOMEM, MT_VERSION (a store of another layout
 *          version), or the translated RocksDB error (MT_IO when dir is not a database and
 *          create_if_missing is 0, cannot be created, or is locked by another process).
 */
mt_err_t mt_store_open(const char *dir, const mt_store_config_t *cfg, mt_store_t **out,
                       char *errbuf, size_t errlen);

/** Closes the database and frees the store. NULL is a no-op. No other call may be running. */
void mt_store_close(mt_store_t *s);

/**
 * Writes checkpoint @p checkpoint_id and makes it current, then prunes: only the newest
 * cfg.keep complete checkpoints remain, and leftovers of failed saves are deleted. On any
 * error before the commit, `current` and every complete checkpoint are unchanged and the
 * partial data is deleted (best effort; else by the next open or save).
 * The tables are streamed one after the other (in name order) into one SST file under
 * dir/mt-ingest/; writers may keep running (each part of a table is consistent, see
 * mt_table_save()). Memory: one chunk. Time: about the streaming (mt_table_save() and a
 * sequential file write), two fsyncs, and the prune (whole SST files dropped).
 * @param[in]  checkpoint_id  above the current one (MT_INVALID otherwise)
 * @param[in]  tables   @p ntables (0..MT_STORE_MAX_TABLES) tables with distinct names
 * @param[in]  meta     @p meta_len bytes stored as they are (NULL if meta_len is 0)
 * @param[out] res      optional (NULL); filled on success and on error (partial figures)
 * @returns MT_OK, MT_INVALID (bad argument, id not above current, read-only store, changes
 *          with no current checkpoint holding the table), MT_FULL_SYNC (a table's changes
 *          since its `since` are not all known: save it whole; nothing was committed),
 *          MT_NOMEM, an error of mt_table_save(), or a translated RocksDB error.
 */
mt_err_t mt_store_save(mt_store_t *s, uint64_t checkpoint_id, const mt_store_table_t *tables,
                       size_t ntables, const void *meta, size_t meta_len, mt_store_result_t *res,
                       char *errbuf, size_t errlen);

/**
 * @param[out] checkpoint_id  the id of the current (newest complete) checkpoint
 * @returns MT_OK, MT_NOT_FOUND (no checkpoint yet), MT_CORRUPT, or a RocksDB error.
 */
mt_err_t mt_store_current(mt_store_t *s, uint64_t *checkpoint_id, char *errbuf, size_t errlen);

/**
 * Loads table @p table_name of the current checkpoint (see mt_store_load_table()).
 * @param[out] out            on success, a table the caller frees with mt_table_destroy()
 * @param[out] checkpoint_id  optional (NULL): the id loaded from
 * @returns as mt_store_load_table(); MT_NOT_FOUND also when there is no checkpoint.
 */
mt_err_t mt_store_load_latest(mt_store_t *s, const char *table_name, const mt_table_config_t *cfg,
                              mt_table_t **out, uint64_t *checkpoint_id, char *errbuf,
                              size_t errlen);

/**
 * Loads table @p table_name of complete checkpoint @p checkpoint_id through mt_table_load(),
 * reading its chunks in order; a table saved as changes is loaded as its chain (the whole
 * table it starts from, then each change stream after it, mt_table_load_changes()). A load is whole or nothing: a missing, extra or damaged chunk
 * gives an error and *out is not touched. To restore a consistent state, read the metadata
 * first (mt_store_load_meta() gives the id) and load each table of that id.
 * @param[in]  cfg  the table configuration (slots must match the saved ones)
 * @param[out] out  on success, a table the caller frees with mt_table_destroy()
 * @returns MT_OK; MT_NOT_FOUND (no such complete checkpoint, or no such table in it);
 *          MT_CORRUPT (missing or extra chunk, bad commit record, or mt_table_load()'s
 *          checks); MT_TRUNCATED; MT_MISMATCH / MT_CONFIG / MT_VERSION / MT_NOMEM from
 *          mt_table_load(); or a translated RocksDB error.
 */
mt_err_t mt_store_load_table(mt_store_t *s, uint64_t checkpoint_id, const char *table_name,
                             const mt_table_config_t *cfg, mt_table_t **out, char *errbuf,
                             size_t errlen);

/**
 * Reads the metadata blob of a checkpoint and checks it against its commit record.
 * @param[in,out] checkpoint_id  in: the checkpoint, 0 for the current one; out: the id read
 * @param[out]    buf  on success, a malloc'd copy the caller frees with free() (never NULL,
 *                     even for an empty blob)
 * @param[out]    len  its size
 * @returns MT_OK, MT_NOT_FOUND, MT_CORRUPT (blob missing or not the one committed), MT_NOMEM
 *          or a RocksDB error. *buf and *len are untouched on error.
 */
mt_err_t mt_store_load_meta(mt_store_t *s, uint64_t *checkpoint_id, void **buf, size_t *len,
                            char *errbuf, size_t errlen);

/**
 * Lists the complete checkpoints, oldest first.
 * @param[out] out  receives the first min(cap, *n) entries (may be NULL if cap is 0)
 * @param[out] n    the number of complete checkpoints (may exceed cap)
 * @returns MT_OK, MT_CORRUPT (a commit record is damaged), MT_NOMEM or a RocksDB error.
 */
mt_err_t mt_store_list(mt_store_t *s, mt_store_info_t *out, size_t cap, size_t *n, char *errbuf,
                       size_t errlen);

/**
 * Makes complete checkpoint @p checkpoint_id the current one again and deletes every
 * checkpoint above it, complete or not (a cluster coordinator rolls a shard back to the last
 * checkpoint that every shard has; see docs/checkpoint.md). With @p checkpoint_id 0 every
 * checkpoint is deleted and the store has none. One synced write batch moves `current` and
 * deletes the range, so after a crash the store is as before or as after, never between;
 * then the dropped checkpoints' files are deleted (and compacted with compact_on_prune).
 * Serialized with saves; loads in progress finish first.
 * @param[out] dropped  optional: checkpoints deleted (leftovers of failed saves included)
 * @returns MT_OK, MT_INVALID (read-only store, id UINT64_MAX), MT_NOT_FOUND (no complete
 *          checkpoint @p checkpoint_id: nothing is changed), MT_NOMEM, MT_CORRUPT or a
 *          RocksDB error.
 */
mt_err_t mt_store_rollback(mt_store_t *s, uint64_t checkpoint_id, uint64_t *dropped, char *errbuf,
                           size_t errlen);

/**
 * An operator's way past a damaged checkpoint (monolith-ps --drop-checkpoint): deletes
 * checkpoint @p checkpoint_id (complete or a leftover) and every checkpoint above it; the
 * newest complete checkpoint below it becomes current (none: the store has no checkpoint).
 * Commit records are not decoded, so a damaged one does not stop it. As mt_store_rollback().
 * @param[out] current  optional: the current checkpoint afterwards (0: none)
 * @param[out] dropped  optional: checkpoints deleted
 * @returns MT_OK, MT_INVALID (id 0 or UINT64_MAX, read-only store), MT_NOT_FOUND (no
 *          checkpoint @p checkpoint_id: nothing changed), or as mt_store_rollback().
 */
mt_err_t mt_store_drop(mt_store_t *s, uint64_t checkpoint_id, uint64_t *current, uint64_t *dropped,
                       char *errbuf, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* MT_STORE_H */
