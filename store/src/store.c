/*
 * store.c - durable checkpoints of embedding tables on RocksDB (the joiner keeps its pending
 * impressions in a RocksDB of its own, joiner/src/join.c: the two share no code).
 *
 * Two column families; RocksDB orders keys as bytes:
 *
 *   family   key                             value
 *   default  format                          "1": the layout version of this store
 *   default  current                         20 ASCII digits: the newest complete checkpoint
 *   default  ckpt/<id>/complete              the commit record (below)
 *   data     ckpt/<id>/meta                  the caller's metadata blob
 *   data     ckpt/<id>/<table name>/<chunk>  bytes [chunk * chunk_bytes, ...) of the table's
 *                                            mt_table_save() stream
 *
 * <id> is 20 zero-padded decimal digits and <chunk> 10, so byte order is numeric order; a
 * table name has no '/', so "ckpt/<id>/" holds exactly one checkpoint and "ckpt/<id>/<name>/"
 * exactly one stream, whose chunks are numbered 0, 1, ... without gaps. The range of one
 * checkpoint is ["ckpt/<id>/", "ckpt/<id>0") ('0' follows '/') in both families.
 *
 * Why two families and SST ingestion rather than WriteBatches of chunks: a checkpoint is
 * written once and never changed, then deleted whole. Written through memtables, its data
 * went through the WAL-less flush and then compactions that merged it with its neighbours
 * (every flushed file also held the small keys, whose range spans all checkpoints), and
 * pruning had to compact the rest away: measured on 2M rows (312 MB a checkpoint), a save
 * took 0.9 s to write and 2 s to prune, and without the prune compaction the store grew to
 * 9 checkpoints' size. Now each checkpoint is one SST file built with SstFileWriter and
 * ingested into the data family, where its key range overlaps nothing, so RocksDB places it
 * in the bottom level and never compacts it; DeleteFilesInRange later drops the file whole.
 * The small keys live in the default family, written through the WAL.
 *
 * Commit record (integers little-endian):
 *
 *   offset  size  field
 *   0       8     magic "MTSTORE\0"
 *   8       4     record version (2; 1 is read too)
 *   12      4     ntables
 *   16      8     checkpoint id (the one in the key)
 *   24      8     created, Unix ms
 *   32      8     metadata bytes
 *   40      8     XXH64(metadata, seed 0)
 *   48      ...   per table: u16 name length n, n name bytes, u64 chunks, u64 stream bytes,
 *                 u64 rows, u64 base (version 2 only: 0 for a whole table, else the older
 *                 checkpoint whose table this change stream applies onto)
 *   end-8   8     XXH64(every byte before, seed 0)
 *
 * Version 1 records (no base) are read as whole tables; new records are version 2.
 *
 * Save protocol (why a crash never costs the previous checkpoint):
 *  1. list the checkpoints; if data is left under this id by a failed attempt, delete it
 *     (DeleteRange, DeleteFilesInRange, CompactRange: the range must be empty for step 3);
 *  2. write <dir>/mt-ingest/ckpt-<id>.sst: the tables in key order (by name), each streamed
 *     into chunks, and the metadata; finish and fsync it;
 *  3. ingest it into the data family (hard link, MANIFEST synced) and fsync <dir>: all of
 *     ckpt/<id>/ is durable, but without a commit record nothing reads it;
 *  4. one WriteBatch written with sync = true (WAL fsync): the commit record, current = id,
 *     and, in both families, a DeleteRange over each run of checkpoints to prune (all but
 *     the newest `keep` complete ones, and every incomplete one). The batch is atomic: after
 *     a crash all of it or none of it is there. Before it, a crash leaves current and every
 *     complete checkpoint unchanged; an SST not yet ingested is deleted by the next open or
 *     save, and ingested leftovers by the next save's prune;
 *  5. DeleteFilesInRange over the pruned ranges (drops their SSTs without reading them),
 *     then, with compact_on_prune, CompactRange over them (whatever the files did not cover:
 *     the tombstones themselves, leftovers written by other means).
 * A failure before step 4 deletes what this save wrote (best effort). After a failed step 4
 * the outcome is unknown (the record may be on disk), so nothing is deleted.
 *
 * Locks: save_lock serializes saves. ckpt_lock is taken shared by readers (current, list,
 * loads) and exclusively by a save for steps 4 and 5's DeleteFilesInRange, which, unlike
 * DeleteRange, would pull files from under a running iterator's view of a pruned checkpoint.
 * Under the shared lock nothing a reader can see changes: a running save only writes under
 * its own id, which has no commit record yet. Order: save_lock -> ckpt_lock.
 */
#include "mt/bytes.h"
#include "mt/clock.h"
#include "mt/log.h"
#include "mt/store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <rocksdb/c.h>
#include <xxhash.h>

#include "store_int.h"

#define STORE_FORMAT    "1"
#define REC_MAGIC       "MTSTORE"
#define REC_VERSION     2u
#define REC_HEAD        48u
#define REC_TABLE_V1    26u /* u16 name length + 3 u64 */
#define REC_TABLE_FIXED 34u /* u16 name length + 4 u64 (version 2: the base) */
#define KEY_MAX         128u
#define KEY_CURRENT     "current"
#define KEY_FORMAT      "format"
#define INGEST_DIR      "mt-ingest"
#define LOAD_READAHEAD  (2u << 20)

enum { CF_DEFAULT = 0, CF_DATA = 1, CF_COUNT = 2 };
static const char *const cf_names[CF_COUNT] = {"default", "data"};

/* ============================== types ============================== */

struct mt_store {
    rocksdb_t *db;
    rocksdb_column_family_handle_t *cf[CF_COUNT];
    rocksdb_options_t *opts;                 /* the database and both families */
    rocksdb_writeoptions_t *wo_sync;         /* WAL + fsync: the commit, the format key */
    rocksdb_writeoptions_t *wo_async;        /* WAL, no fsync: deleting leftovers */
    rocksdb_readoptions_t *ro;               /* point reads */
    rocksdb_compactoptions_t *co;            /* not exclusive: background compactions go on */
    rocksdb_envoptions_t *eo;                /* SstFileWriter */
    rocksdb_ingestexternalfileoptions_t *io; /* move (hard link) the file in */
    char *dir;                               /* the database directory */
    char *tmp_dir;                           /* dir/mt-ingest: SST files being written */
    mt_store_config_t cfg;
    int damaged_open; /* 1: opened without RocksDB's paranoid checks (a damaged table file) */

    pthread_mutex_t save_lock;  /* held for a whole save */
    pthread_rwlock_t ckpt_lock; /* shared: readers; exclusive: commit and file deletion */
    int locks_ready;

    /* Test hook (store_int.h); written only between saves. */
    mt__store_hook_fn hook;
    void *hook_ud;
};

/* One table of a commit record. */
typedef struct rec_table {
    char name[MT_STORE_MAX_NAME + 1];
    uint64_t chunks, bytes, rows;
    uint64_t base; /* 0: a whole table; else a change stream on this checkpoint's table */
} rec_table_t;

/* A decoded commit record; tables is malloc'd (rec_free()). */
typedef struct rec {
    uint64_t id, created_ms, meta_bytes, meta_hash;
    uint32_t ntables;
    rec_table_t *tables;
} rec_t;

/* A checkpoint found by scan(). */
typedef struct ckpt_entry {
    uint64_t id;
    int complete;         /* has a commit record */
    int has_data;         /* has keys in the data family (scan(SCAN_DATA) only) */
    int keep;             /* save: survives the prune */
    uint64_t parent;      /* the checkpoint a change stream of it applies onto, 0: none */
    mt_store_info_t info; /* scan(SCAN_INFO) of a complete one */
} ckpt_entry_t;

#define SCAN_INFO 1 /* decode the commit records (a damaged one is an error) */
#define SCAN_DATA 2 /* also find ids that have data, with or without a record */

/* State of the write callback while one table is streamed into the SST file. */
typedef struct wctx {
    mt_store_t *s;
    rocksdb_sstfilewriter_t *w;
    char key[KEY_MAX];
    size_t prefix_len;    /* "ckpt/<id>/<name>/" in key */
    uint8_t *chunk;       /* cfg.chunk_bytes */
    size_t len;           /* bytes in chunk */
    uint64_t nchunks;     /* of this table */
    uint64_t bytes;       /* of this table */
    uint64_t *chunks_all; /* of this save, for the hook */
    char msg[256];        /* why the callback failed, if it did */
} wctx_t;

/* State of the read callback while one table is loaded. */
typedef struct rctx {
    rocksdb_iterator_t *it;
    const char *prefix; /* "ckpt/<id>/<name>/" */
    size_t prefix_len;
    uint64_t next_chunk; /* number of the chunk to read next */
    const char *v;       /* current chunk, valid until the iterator moves */
    size_t vlen, pos;
    uint64_t bytes; /* handed to mt_table_load() */
    int started, eof;
    char msg[640]; /* why the read failed, if it did (RocksDB messages carry paths) */
} rctx_t;

/* ============================== private prototypes ============================== */

static mt_err_t fail(char *errbuf, size_t errlen, mt_err_t err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static mt_err_t rdb_code(const char *msg);
static mt_err_t rdb_fail(char *rerr, char *errbuf, size_t errlen, const char *what);
static void rdb_describe(const char *rerr, char *out, size_t len);
static mt_err_t rollback_locked(mt_store_t *s, uint64_t checkpoint_id, char *errbuf, size_t errlen);
static uint64_t wall_ms(void);
static int name_ok(const char *name);
static int suffix_cmp(const char *a, size_t al, const char *b, size_t bl);
static size_t key_ckpt(char *k, uint64_t id, const char *suffix);
static size_t key_ckpt_end(char *k, uint64_t id);
static int parse_id(const char *p, size_t n, uint64_t *id);
static mt_err_t rec_encode(const rec_t *r, uint8_t **out, size_t *len);
static mt_err_t rec_decode(const char *p, size_t len, rec_t *r);
static void rec_free(rec_t *r);
static mt_err_t read_current(mt_store_t *s, uint64_t *id, int *found, char *errbuf, size_t errlen);
static mt_err_t read_rec(mt_store_t *s, uint64_t id, rec_t *r, int *found, char *errbuf,
                         size_t errlen);
static mt_err_t scan(mt_store_t *s, int flags, ckpt_entry_t **out, size_t *n, char *errbuf,
                     size_t errlen);
static mt_err_t purge(mt_store_t *s, uint64_t first, uint64_t last, int compact, char *errbuf,
                      size_t errlen);
static void clean_tmp_dir(mt_store_t *s);
static mt_err_t fsync_path(const char *path, int is_dir, char *errbuf, size_t errlen);
static mt_err_t emit_chunk(wctx_t *w);
static mt_err_t store_write(void *ud, const void *buf, size_t len);
static mt_err_t next_chunk(rctx_t *r);
static mt_err_t store_read(void *ud, void *buf, size_t len, size_t *got);
static mt_err_t load_locked(mt_store_t *s, uint64_t id, int use_current, const char *table_name,
                            const mt_table_config_t *cfg, mt_table_t **out, uint64_t *loaded_id,
                            char *errbuf, size_t errlen);

/* ============================== config ============================== */

void mt_store_config_init(mt_store_config_t *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->keep = 3;
    cfg->chunk_bytes = 4u << 20;
    cfg->background_jobs = 2;
    cfg->compress = 0;
    cfg->compact_on_prune = 1;
    cfg->create_if_missing = 1;
    cfg->read_only = 0;
}

mt_err_t mt_store_config_validate(const mt_store_config_t *cfg, char *errbuf, size_t errlen) {
    if (!cfg) return fail(errbuf, errlen, MT_CONFIG, "no configuration");
    if (cfg->keep < 1 || cfg->keep > 10000)
        return fail(errbuf, errlen, MT_CONFIG, "keep = %" PRIu32 ": must be 1..10000", cfg->keep);
    if (cfg->chunk_bytes < (4u << 10) || cfg->chunk_bytes > (64u << 20))
        return fail(errbuf, errlen, MT_CONFIG, "chunk_bytes = %" PRIu64 ": must be 4 KiB..64 MiB",
                    cfg->chunk_bytes);
    if (cfg->background_jobs < 1 || cfg->background_jobs > 64)
        return fail(errbuf, errlen, MT_CONFIG, "background_jobs = %" PRIu32 ": must be 1..64",
                    cfg->background_jobs);
    if ((cfg->compress | cfg->compact_on_prune | cfg->create_if_missing | cfg->read_only) & ~1)
        return fail(errbuf, errlen, MT_CONFIG,
                    "compress, compact_on_prune, create_if_missing, read_only must be 0 or 1");
    return MT_OK;
}

/* ============================== open / close ============================== */

mt_err_t mt_store_open(const char *dir, const mt_store_config_t *cfg, mt_store_t **out,
                       char *errbuf, size_t errlen) {
    mt_store_t *s = NULL;
    char *rerr = NULL, *val = NULL;
    size_t vlen = 0;
    mt_err_t err = MT_OK;
    if (!dir || !*dir || !out) return fail(errbuf, errlen, MT_INVALID, "no directory or out");
    mt_store_config_t c;
    if (cfg)
        c = *cfg;
    else
        mt_store_config_init(&c);
    err = mt_store_config_validate(&c, errbuf, errlen);
    if (err) return err;

    s = calloc(1, sizeof(*s));
    if (!s) return fail(errbuf, errlen, MT_NOMEM, "store: out of memory");
    s->cfg = c;
    if (pthread_mutex_init(&s->save_lock, NULL) != 0) {
        free(s);
        return fail(errbuf, errlen, MT_NOMEM, "store: mutex");
    }
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
    /* A stream of loads must not starve a save's commit. */
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    int rc = pthread_rwlock_init(&s->ckpt_lock, &ra);
    pthread_rwlockattr_destroy(&ra);
    if (rc != 0) {
        pthread_mutex_destroy(&s->save_lock);
        free(s);
        return fail(errbuf, errlen, MT_NOMEM, "store: rwlock");
    }
    s->locks_ready = 1;

    size_t dl = strlen(dir);
    s->dir = strdup(dir);
    s->tmp_dir = malloc(dl + sizeof(INGEST_DIR) + 1);
    s->opts = rocksdb_options_create();
    s->wo_sync = rocksdb_writeoptions_create();
    s->wo_async = rocksdb_writeoptions_create();
    s->ro = rocksdb_readoptions_create();
    s->co = rocksdb_compactoptions_create();
    s->eo = rocksdb_envoptions_create();
    s->io = rocksdb_ingestexternalfileoptions_create();
    if (!s->dir || !s->tmp_dir || !s->opts || !s->wo_sync || !s->wo_async || !s->ro || !s->co ||
        !s->eo || !s->io) {
        err = fail(errbuf, errlen, MT_NOMEM, "store: out of memory");
        goto out;
    }
    snprintf(s->tmp_dir, dl + sizeof(INGEST_DIR) + 1, "%s/%s", dir, INGEST_DIR);
    rocksdb_options_set_create_if_missing(s->opts, (unsigned char)c.create_if_missing);
    rocksdb_options_set_create_missing_column_families(s->opts, 1);
    rocksdb_options_set_compression(s->opts,
                                    c.compress ? rocksdb_lz4_compression : rocksdb_no_compression);
    rocksdb_options_set_max_background_jobs(s->opts, (int)c.background_jobs);
    rocksdb_options_set_level_compaction_dynamic_level_bytes(s->opts, 1);
    rocksdb_options_set_keep_log_file_num(s->opts, 4); /* RocksDB's own LOG files */
    rocksdb_options_set_max_log_file_size(s->opts, 16u << 20);
    rocksdb_writeoptions_set_sync(s->wo_sync, 1);
    rocksdb_compactoptions_set_exclusive_manual_compaction(s->co, 0);
    rocksdb_ingestexternalfileoptions_set_move_files(s->io, 1);

    const rocksdb_options_t *cf_opts[CF_COUNT] = {s->opts, s->opts};
    for (int attempt = 0; attempt < 2; attempt++) {
        if (c.read_only)
            s->db = rocksdb_open_for_read_only_column_families(s->opts, dir, CF_COUNT, cf_names,
                                                               cf_opts, s->cf, 0, &rerr);
        else
            s->db = rocksdb_open_column_families(s->opts, dir, CF_COUNT, cf_names, cf_opts, s->cf,
                                                 &rerr);
        /* RocksDB refuses the whole database when one table file is damaged (truncated by a
         * full disk or a bad copy: "file is too short"); each checkpoint's data is one such
         * file, so the others are whole. Without paranoid checks it opens: the damaged
         * checkpoint's loads fail naming it, and mt_store_drop() or a rollback deletes it
         * (DeleteFilesInRange drops the file unread); the next open is a normal one. */
        if (!rerr || attempt || rdb_code(rerr) != MT_CORRUPT || !strstr(rerr, ".sst")) break;
        char what[512];
        rdb_describe(rerr, what, sizeof(what));
        mt_log(MT_LOG_WARN, "store",
               "%s: %s: opening it without RocksDB's paranoid checks, so that the checkpoints "
               "in other files stay readable (the damaged one fails to load, naming itself)",
               dir, what);
        rocksdb_free(rerr);
        rerr = NULL;
        rocksdb_options_set_paranoid_checks(s->opts, 0);
        s->damaged_open = 1;
    }
    if (rerr) {
        s->db = NULL;
        s->cf[0] = s->cf[1] = NULL;
        err = rdb_fail(rerr, errbuf, errlen, dir);
        goto out;
    }

    /* The layout version: written once by the first read-write open. */
    val = rocksdb_get_cf(s->db, s->ro, s->cf[CF_DEFAULT], KEY_FORMAT, strlen(KEY_FORMAT), &vlen,
                         &rerr);
    if (rerr) {
        err = rdb_fail(rerr, errbuf, errlen, "reading key 'format'");
        goto out;
    }
    if (val) {
        if (vlen != strlen(STORE_FORMAT) || memcmp(val, STORE_FORMAT, vlen) != 0) {
            err = fail(errbuf, errlen, MT_VERSION, "%s: store layout '%.*s', this build reads '%s'",
                       dir, (int)(vlen > 16 ? 16 : vlen), val, STORE_FORMAT);
            goto out;
        }
    } else if (!c.read_only) {
        rocksdb_put_cf(s->db, s->wo_sync, s->cf[CF_DEFAULT], KEY_FORMAT, strlen(KEY_FORMAT),
                       STORE_FORMAT, strlen(STORE_FORMAT), &rerr);
        if (rerr) {
            err = rdb_fail(rerr, errbuf, errlen, "writing key 'format'");
            goto out;
        }
    }
    if (!c.read_only) {
        if (mkdir(s->tmp_dir, 0755) != 0 && errno != EEXIST) {
            err = fail(errbuf, errlen, MT_IO, "%s: %s", s->tmp_dir, strerror(errno));
            goto out;
        }
        clean_tmp_dir(s); /* files of a save that crashed before ingesting them */
    }
    *out = s;
    s = NULL;
out:
    rocksdb_free(val);
    mt_store_close(s);
    return err;
}

void mt_store_close(mt_store_t *s) {
    if (!s) return;
    for (int i = 0; i < CF_COUNT; i++)
        if (s->cf[i]) rocksdb_column_family_handle_destroy(s->cf[i]);
    if (s->db) rocksdb_close(s->db);
    if (s->opts) rocksdb_options_destroy(s->opts);
    if (s->wo_sync) rocksdb_writeoptions_destroy(s->wo_sync);
    if (s->wo_async) rocksdb_writeoptions_destroy(s->wo_async);
    if (s->ro) rocksdb_readoptions_destroy(s->ro);
    if (s->co) rocksdb_compactoptions_destroy(s->co);
    if (s->eo) rocksdb_envoptions_destroy(s->eo);
    if (s->io) rocksdb_ingestexternalfileoptions_destroy(s->io);
    if (s->locks_ready) {
        pthread_mutex_destroy(&s->save_lock);
        pthread_rwlock_destroy(&s->ckpt_lock);
    }
    free(s->dir);
    free(s->tmp_dir);
    free(s);
}

/* ============================== save ============================== */

/* Order of two tables' keys in the SST: of "<a>/" and "<b>/", as RocksDB orders them. */
static int table_order(const char *a, const char *b) {
    char ka[MT_STORE_MAX_NAME + 2], kb[MT_STORE_MAX_NAME + 2];
    int la = snprintf(ka, sizeof(ka), "%s/", a), lb = snprintf(kb, sizeof(kb), "%s/", b);
    return suffix_cmp(ka, (size_t)la, kb, (size_t)lb);
}

/* Streams one table into the SST file (chunk keys under "ckpt/<id>/<name>/"). */
static mt_err_t save_table(mt_store_t *s, rocksdb_sstfilewriter_t *sw, uint64_t id, uint64_t parent,
                           const mt_store_table_t *tab, uint8_t *chunk, uint64_t *chunks_all,
                           rec_table_t *rt, char *errbuf, size_t errlen) {
    mt_table_stats_t st;
    mt_table_stats(tab->table, &st);
    wctx_t w;
    memset(&w, 0, sizeof(w));
    w.s = s;
    w.w = sw;
    w.chunk = chunk;
    w.chunks_all = chunks_all;
    w.prefix_len = (size_t)snprintf(w.key, sizeof(w.key), "ckpt/%020" PRIu64 "/%s/", id, tab->name);
    uint64_t upto = 0;
    mt_err_t err = tab->since
                       ? mt_table_save_changes(tab->table, tab->since, store_write, &w, &upto)
                       : mt_table_save(tab->table, store_write, &w);
    if (!err && w.len) err = emit_chunk(&w);
    memcpy(rt->name, tab->name, strlen(tab->name) + 1);
    rt->chunks = w.nchunks;
    rt->bytes = w.bytes;
    rt->rows = st.rows;
    rt->base = tab->since ? parent : 0;
    if (err == MT_FULL_SYNC)
        fail(errbuf, errlen, err,
             "table '%s': its changes since version %" PRIu64 " are not all known any more: "
             "save it whole",
             tab->name, tab->since);
    else if (err)
        fail(errbuf, errlen, err, "table '%s': %s", tab->name, w.msg[0] ? w.msg : mt_strerror(err));
    return err;
}

mt_err_t mt_store_save(mt_store_t *s, uint64_t checkpoint_id, const mt_store_table_t *tables,
                       size_t ntables, const void *meta, size_t meta_len, mt_store_result_t *res,
                       char *errbuf, size_t errlen) {
    mt_store_result_t r0;
    mt_store_result_t *r = res ? res : &r0;
    memset(r, 0, sizeof(*r));
    if (!s || checkpoint_id == 0) return fail(errbuf, errlen, MT_INVALID, "no store or id 0");
    if (s->cfg.read_only) return fail(errbuf, errlen, MT_INVALID, "store is read-only");
    if (ntables > MT_STORE_MAX_TABLES || (ntables && !tables))
        return fail(errbuf, errlen, MT_INVALID, "%zu tables (at most %u)", ntables,
                    MT_STORE_MAX_TABLES);
    if (!meta && meta_len) return fail(errbuf, errlen, MT_INVALID, "meta is NULL");
    for (size_t i = 0; i < ntables; i++) {
        if (!name_ok(tables[i].name))
            return fail(errbuf, errlen, MT_INVALID,
                        "table %zu: bad name (1..%u bytes of A-Z a-z 0-9 _ . -)", i,
                        MT_STORE_MAX_NAME);
        if (!tables[i].table)
            return fail(errbuf, errlen, MT_INVALID, "table '%s' is NULL", tables[i].name);
        for (size_t j = 0; j < i; j++)
            if (strcmp(tables[i].name, tables[j].name) == 0)
                return fail(errbuf, errlen, MT_INVALID, "table name '%s' given twice",
                            tables[i].name);
    }

    double t0 = mt_mono_s(), t1 = t0, t2 = t0;
    mt_err_t err = MT_OK;
    char *rerr = NULL;
    char key[KEY_MAX], end[KEY_MAX], perr[256] = "";
    char *path = NULL;
    size_t kl = 0, el = 0;
    uint64_t chunks_all = 0, cur = 0, parent = 0;
    int have_cur = 0, file_open = 0, ingested = 0, committing = 0, locked = 0;
    rocksdb_sstfilewriter_t *sw = NULL;
    rocksdb_writebatch_t *wb = NULL;
    uint8_t *chunk = NULL, *recbuf = NULL;
    size_t *order = NULL, reclen = 0, nents = 0;
    ckpt_entry_t *ents = NULL;
    rec_t rec = {0};

    pthread_mutex_lock(&s->save_lock);
    err = read_current(s, &cur, &have_cur, errbuf, errlen);
    if (err) goto out;
    if (have_cur && checkpoint_id <= cur) {
        err = fail(errbuf, errlen, MT_INVALID,
                   "checkpoint id %" PRIu64 " is not above the current one (%" PRIu64 ")",
                   checkpoint_id, cur);
        goto out;
    }
    /* A change stream applies onto the same table of the current checkpoint. */
    for (size_t i = 0; i < ntables; i++) {
        if (!tables[i].since) continue;
        rec_t pr = {0};
        int found = 0;
        if (have_cur) err = read_rec(s, cur, &pr, &found, errbuf, errlen);
        if (err) goto out;
        int has = 0;
        for (uint32_t k = 0; k < pr.ntables; k++)
            has |= strcmp(pr.tables[k].name, tables[i].name) == 0;
        rec_free(&pr);
        if (!has) {
            err = fail(errbuf, errlen, MT_INVALID,
                       "table '%s': changes need the table in the current checkpoint, and %s",
                       tables[i].name,
                       have_cur ? "the current one has no such table" : "there is none");
            goto out;
        }
        parent = cur;
    }
    size_t pl = strlen(s->tmp_dir) + 40;
    path = malloc(pl);
    chunk = malloc((size_t)s->cfg.chunk_bytes);
    order = malloc((ntables ? ntables : 1) * sizeof(*order));
    rec.tables = calloc(ntables ? ntables : 1, sizeof(*rec.tables));
    wb = rocksdb_writebatch_create();
    sw = rocksdb_sstfilewriter_create(s->eo, s->opts);
    if (!path || !chunk || !order || !rec.tables || !wb || !sw) {
        err = fail(errbuf, errlen, MT_NOMEM, "save: out of memory");
        goto out;
    }

    /* 1. The checkpoints there are; data left under this id must go first. */
    err = scan(s, SCAN_DATA, &ents, &nents, errbuf, errlen);
    if (err) goto out;
    for (size_t i = 0; i < nents; i++) {
        if (ents[i].id != checkpoint_id) continue;
        err = purge(s, checkpoint_id, checkpoint_id, 1, errbuf, errlen);
        if (err) goto out;
        memmove(&ents[i], &ents[i + 1], (nents - i - 1) * sizeof(*ents));
        nents--;
        break;
    }

    /* 2. The SST file: tables and metadata in key order. */
    clean_tmp_dir(s);
    snprintf(path, pl, "%s/ckpt-%020" PRIu64 ".sst", s->tmp_dir, checkpoint_id);
    rocksdb_sstfilewriter_open(sw, path, &rerr);
    if (rerr) {
        err = rdb_fail(rerr, errbuf, errlen, path);
        goto out;
    }
    file_open = 1;
    for (size_t i = 0; i < ntables; i++) { /* insertion sort: a few tables */
        size_t j = i;
        while (j > 0 && table_order(tables[order[j - 1]].name, tables[i].name) > 0) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
    int meta_done = 0;
    for (size_t k = 0; k <= ntables; k++) {
        if (!meta_done) {
            char nk[MT_STORE_MAX_NAME + 2];
            int nl = k < ntables ? snprintf(nk, sizeof(nk), "%s/", tables[order[k]].name) : 0;
            if (k == ntables || suffix_cmp("meta", 4, nk, (size_t)nl) < 0) {
                kl = key_ckpt(key, checkpoint_id, "meta");
                rocksdb_sstfilewriter_put(sw, key, kl, meta_len ? (const char *)meta : "", meta_len,
                                          &rerr);
                if (rerr) {
                    err = rdb_fail(rerr, errbuf, errlen, "writing the metadata");
                    goto out;
                }
                meta_done = 1;
            }
        }
        if (k == ntables) break;
        size_t ti = order[k];
        err = save_table(s, sw, checkpoint_id, parent, &tables[ti], chunk, &chunks_all,
                         &rec.tables[ti], errbuf, errlen);
        r->rows += rec.tables[ti].rows;
        r->bytes += rec.tables[ti].bytes;
        r->chunks += rec.tables[ti].chunks;
        if (err) goto out;
    }
    rocksdb_sstfilewriter_finish(sw, &rerr);
    if (rerr) {
        err = rdb_fail(rerr, errbuf, errlen, path);
        goto out;
    }
    err = fsync_path(path, 0, errbuf, errlen);
    if (err) goto out;
    t1 = mt_mono_s();

    /* 3. Into the database, durably, but not yet visible (no commit record). */
    const char *files[1] = {path};
    ingested = 1; /* from here a failure deletes the range (ingestion may have happened) */
    rocksdb_ingest_external_file_cf(s->db, s->cf[CF_DATA], files, 1, s->io, &rerr);
    if (rerr) {
        err = rdb_fail(rerr, errbuf, errlen, "ingesting the checkpoint");
        goto out;
    }
    unlink(path); /* RocksDB has its own link to it now */
    err = fsync_path(s->dir, 1, errbuf, errlen);
    if (err) goto out;
    if (s->hook) {
        err = s->hook(s->hook_ud, MT__STORE_HOOK_INGESTED, chunks_all);
        if (err) {
            fail(errbuf, errlen, err, "stopped by the test hook after ingestion");
            goto out;
        }
    }

    /* 4. The commit, with the prune of what it supersedes. */
    rec.id = checkpoint_id;
    rec.created_ms = wall_ms();
    rec.meta_bytes = meta_len;
    rec.meta_hash = XXH64(meta_len ? meta : "", meta_len, 0);
    rec.ntables = (uint32_t)ntables;
    err = rec_encode(&rec, &recbuf, &reclen);
    if (err) {
        fail(errbuf, errlen, err, "save: out of memory");
        goto out;
    }
    /* The new id joins the list, kept, so that no range deleted below spans it. */
    ckpt_entry_t *grown = realloc(ents, (nents + 1) * sizeof(*ents));
    if (!grown) {
        err = fail(errbuf, errlen, MT_NOMEM, "save: out of memory");
        goto out;
    }
    ents = grown;
    size_t at = nents;
    while (at > 0 && ents[at - 1].id > checkpoint_id)
        at--;
    memmove(&ents[at + 1], &ents[at], (nents - at) * sizeof(*ents));
    memset(&ents[at], 0, sizeof(*ents));
    ents[at].id = checkpoint_id;
    ents[at].keep = 1;
    ents[at].parent = parent;
    nents++;
    /* The newest keep - 1 older complete ones stay too, and every checkpoint a kept one's
     * change streams apply onto (down to a whole table); everything else goes. */
    uint32_t kept = 1;
    for (size_t i = at; i-- > 0 && kept < s->cfg.keep;) {
        if (ents[i].complete) {
            ents[i].keep = 1;
            kept++;
        }
    }
    for (size_t i = nents; i-- > 0;) { /* parents are older: one pass from the newest */
        if (!ents[i].keep || !ents[i].parent) continue;
        for (size_t j = i; j-- > 0;)
            if (ents[j].id == ents[i].parent) {
                if (ents[j].complete) ents[j].keep = 1;
                break;
            }
    }
    kl = key_ckpt(key, checkpoint_id, "complete");
    rocksdb_writebatch_put_cf(wb, s->cf[CF_DEFAULT], key, kl, (const char *)recbuf, reclen);
    char idtxt[24];
    int idlen = snprintf(idtxt, sizeof(idtxt), "%020" PRIu64, checkpoint_id);
    rocksdb_writebatch_put_cf(wb, s->cf[CF_DEFAULT], KEY_CURRENT, strlen(KEY_CURRENT), idtxt,
                              (size_t)idlen);
    for (size_t i = 0; i < nents;) {
        if (ents[i].keep) {
            i++;
            continue;
        }
        size_t j = i;
        while (j + 1 < nents && !ents[j + 1].keep)
            j++;
        kl = key_ckpt(key, ents[i].id, "");
        el = key_ckpt_end(end, ents[j].id);
        for (int c = 0; c < CF_COUNT; c++)
            rocksdb_writebatch_delete_range_cf(wb, s->cf[c], key, kl, end, el);
        r->pruned += j - i + 1;
        i = j + 1;
    }
    pthread_rwlock_wrlock(&s->ckpt_lock);
    locked = 1;
    committing = 1;
    rocksdb_write(s->db, s->wo_sync, wb, &rerr);
    if (rerr) {
        r->pruned = 0;
        err = rdb_fail(rerr, errbuf, errlen, "committing the checkpoint");
        goto out;
    }
    t2 = mt_mono_s();

    /* 5. Reclaim the space of pruned checkpoints. */
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            pthread_rwlock_unlock(&s->ckpt_lock);
            locked = 0;
            if (!s->cfg.compact_on_prune) break;
        }
        for (size_t i = 0; i < nents;) {
            if (ents[i].keep) {
                i++;
                continue;
            }
            size_t j = i;
            while (j + 1 < nents && !ents[j + 1].keep)
                j++;
            kl = key_ckpt(key, ents[i].id, "");
            el = key_ckpt_end(end, ents[j].id);
            if (pass == 0) {
                rocksdb_delete_file_in_range_cf(s->db, s->cf[CF_DATA], key, kl, end, el, &rerr);
                if (rerr) {
                    if (!r->prune_err) {
                        r->prune_err = rdb_code(rerr);
                        snprintf(perr, sizeof(perr), "%s", rerr);
                    }
                    rocksdb_free(rerr);
                    rerr = NULL;
                }
            } else {
                rocksdb_compact_range_cf_opt(s->db, s->cf[CF_DATA], s->co, key, kl, end, el);
            }
            i = j + 1;
        }
    }
    if (r->prune_err && errbuf && errlen) snprintf(errbuf, errlen, "prune: %s", perr);
out:
    if (locked) pthread_rwlock_unlock(&s->ckpt_lock);
    if (err && !committing) {
        /* Best effort: what this leaves, the next open or save deletes. */
        if (ingested) purge(s, checkpoint_id, checkpoint_id, 0, NULL, 0);
        if (file_open) unlink(path);
    }
    pthread_mutex_unlock(&s->save_lock);
    if (sw) rocksdb_sstfilewriter_destroy(sw);
    if (wb) rocksdb_writebatch_destroy(wb);
    free(path);
    free(chunk);
    free(order);
    free(recbuf);
    free(ents);
    rec_free(&rec);
    double t3 = mt_mono_s();
    r->seconds = t3 - t0;
    r->stream_s = t1 - t0;
    r->durable_s = t2 > t1 ? t2 - t1 : 0;
    r->prune_s = t2 > t0 && !err ? t3 - t2 : 0;
    return err;
}

/* Adds the chunk buffer to the SST file as chunk number w->nchunks. */
static mt_err_t emit_chunk(wctx_t *w) {
    mt_store_t *s = w->s;
    char *rerr = NULL;
    int n = snprintf(w->key + w->prefix_len, KEY_MAX - w->prefix_len, "%010" PRIu64, w->nchunks);
    rocksdb_sstfilewriter_put(w->w, w->key, w->prefix_len + (size_t)n, (const char *)w->chunk,
                              w->len, &rerr);
    if (rerr) {
        mt_err_t err = rdb_code(rerr);
        snprintf(w->msg, sizeof(w->msg), "writing chunk %" PRIu64 ": %s", w->nchunks, rerr);
        rocksdb_free(rerr);
        return err;
    }
    w->nchunks++;
    w->len = 0;
    (*w->chunks_all)++;
    if (s->hook) {
        mt_err_t err = s->hook(s->hook_ud, MT__STORE_HOOK_CHUNK, *w->chunks_all);
        if (err) {
            snprintf(w->msg, sizeof(w->msg), "stopped by the test hook at chunk %" PRIu64,
                     *w->chunks_all);
            return err;
        }
    }
    return MT_OK;
}

/* mt_table_write_fn: cuts the stream into chunks of exactly chunk_bytes (the last shorter). */
static mt_err_t store_write(void *ud, const void *buf, size_t len) {
    wctx_t *w = ud;
    const uint8_t *p = buf;
    size_t cap = (size_t)w->s->cfg.chunk_bytes;
    while (len) {
        size_t k = cap - w->len < len ? cap - w->len : len;
        memcpy(w->chunk + w->len, p, k);
        w->len += k;
        w->bytes += k;
        p += k;
        len -= k;
        if (w->len == cap) {
            mt_err_t err = emit_chunk(w);
            if (err) return err;
        }
    }
    return MT_OK;
}

/* ============================== load ============================== */

mt_err_t mt_store_current(mt_store_t *s, uint64_t *checkpoint_id, char *errbuf, size_t errlen) {
    if (!s || !checkpoint_id) return fail(errbuf, errlen, MT_INVALID, "no store or out");
    int found = 0;
    uint64_t id = 0;
    pthread_rwlock_rdlock(&s->ckpt_lock);
    mt_err_t err = read_current(s, &id, &found, errbuf, errlen);
    pthread_rwlock_unlock(&s->ckpt_lock);
    if (err) return err;
    if (!found) return fail(errbuf, errlen, MT_NOT_FOUND, "no checkpoint");
    *checkpoint_id = id;
    return MT_OK;
}

mt_err_t mt_store_load_latest(mt_store_t *s, const char *table_name, const mt_table_config_t *cfg,
                              mt_table_t **out, uint64_t *checkpoint_id, char *errbuf,
                              size_t errlen) {
    if (!s) return fail(errbuf, errlen, MT_INVALID, "no store");
    pthread_rwlock_rdlock(&s->ckpt_lock);
    mt_err_t err = load_locked(s, 0, 1, table_name, cfg, out, checkpoint_id, errbuf, errlen);
    pthread_rwlock_unlock(&s->ckpt_lock);
    return err;
}

mt_err_t mt_store_load_table(mt_store_t *s, uint64_t checkpoint_id, const char *table_name,
                             const mt_table_config_t *cfg, mt_table_t **out, char *errbuf,
                             size_t errlen) {
    if (!s) return fail(errbuf, errlen, MT_INVALID, "no store");
    if (checkpoint_id == 0) return fail(errbuf, errlen, MT_INVALID, "checkpoint id 0");
    pthread_rwlock_rdlock(&s->ckpt_lock);
    mt_err_t err = load_locked(s, checkpoint_id, 0, table_name, cfg, out, NULL, errbuf, errlen);
    pthread_rwlock_unlock(&s->ckpt_lock);
    return err;
}

/* Reads the stream of table @p rt of checkpoint @p id: a whole table into a new *t (when
 * *t is NULL), else a change stream applied onto *t. The caller holds ckpt_lock shared. */
static mt_err_t load_stream(mt_store_t *s, uint64_t id, const rec_table_t *rt,
                            const mt_table_config_t *cfg, mt_table_t **t, char *errbuf,
                            size_t errlen) {
    char prefix[KEY_MAX], upper[KEY_MAX];
    mt_err_t err = MT_OK;
    size_t pl = (size_t)snprintf(prefix, sizeof(prefix), "ckpt/%020" PRIu64 "/%s/", id, rt->name);
    memcpy(upper, prefix, pl);
    upper[pl - 1] = '0'; /* just past every key under prefix */
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    rocksdb_iterator_t *it = NULL;
    if (!ro) return fail(errbuf, errlen, MT_NOMEM, "load: out of memory");
    rocksdb_readoptions_set_iterate_upper_bound(ro, upper, pl);
    rocksdb_readoptions_set_fill_cache(ro, 0); /* one pass: do not evict the hot blocks */
    rocksdb_readoptions_set_readahead_size(ro, LOAD_READAHEAD);
    it = rocksdb_create_iterator_cf(s->db, ro, s->cf[CF_DATA]);
    if (!it) {
        rocksdb_readoptions_destroy(ro);
        return fail(errbuf, errlen, MT_NOMEM, "load: out of memory");
    }
    rctx_t rc;
    memset(&rc, 0, sizeof(rc));
    rc.it = it;
    rc.prefix = prefix;
    rc.prefix_len = pl;
    const char *kind = *t ? "changes of table" : "table";
    err = *t ? mt_table_load_changes(*t, store_read, &rc, NULL, NULL)
             : mt_table_load(cfg, store_read, &rc, t);
    if (err) {
        if (rc.msg[0])
            fail(errbuf, errlen, err, "checkpoint %" PRIu64 " %s '%s': %s", id, kind, rt->name,
                 rc.msg);
        else
            fail(errbuf, errlen, err,
                 "checkpoint %" PRIu64 " %s '%s': %s (at byte %" PRIu64 ", chunk %" PRIu64 ")", id,
                 kind, rt->name, mt_strerror(err), rc.bytes, rc.next_chunk ? rc.next_chunk - 1 : 0);
    } else if (!rc.eof || rc.next_chunk != rt->chunks || rc.bytes != rt->bytes) {
        /* Both loaders read one byte past their END block, so the iterator is at the end. */
        err = fail(errbuf, errlen, MT_CORRUPT,
                   "checkpoint %" PRIu64 " %s '%s': read %" PRIu64 " chunks / %" PRIu64
                   " bytes, the commit record says %" PRIu64 " / %" PRIu64,
                   id, kind, rt->name, rc.next_chunk, rc.bytes, rt->chunks, rt->bytes);
    }
    rocksdb_iter_destroy(it);
    rocksdb_readoptions_destroy(ro);
    return err;
}

/* Loads one table; the caller holds ckpt_lock shared. A change stream is loaded as the
 * chain it ends: the whole table it starts from, then every stream after it, in order. */
static mt_err_t load_locked(mt_store_t *s, uint64_t id, int use_current, const char *table_name,
                            const mt_table_config_t *cfg, mt_table_t **out, uint64_t *loaded_id,
                            char *errbuf, size_t errlen) {
    mt_err_t err = MT_OK;
    int found = 0;
    if (!table_name || !cfg || !out)
        return fail(errbuf, errlen, MT_INVALID, "no table name, config or out");
    if (!name_ok(table_name))
        return fail(errbuf, errlen, MT_INVALID, "bad table name (1..%u bytes of A-Z a-z 0-9 _ . -)",
                    MT_STORE_MAX_NAME);
    if (use_current) {
        err = read_current(s, &id, &found, errbuf, errlen);
        if (err) return err;
        if (!found) return fail(errbuf, errlen, MT_NOT_FOUND, "no checkpoint");
    }
    /* The chain, newest first: ids[k] with its table's entry tabs[k]. */
    uint64_t *ids = NULL;
    rec_table_t *tabs = NULL;
    size_t n = 0, cap = 0;
    uint64_t at = id;
    for (;;) {
        rec_t rec = {0};
        err = read_rec(s, at, &rec, &found, errbuf, errlen);
        if (err) goto out;
        if (!found) {
            if (n) /* the checkpoint a newer one's changes apply onto is gone */
                err = fail(errbuf, errlen, MT_CORRUPT,
                           "checkpoint %" PRIu64
                           ": table '%s' is a change stream on checkpoint %" PRIu64
                           ", which has no commit record",
                           ids[n - 1], table_name, at);
            else if (use_current) /* current is written with its record, in one batch */
                err = fail(errbuf, errlen, MT_CORRUPT,
                           "current is %" PRIu64 ", which has no commit record", at);
            else
                err = fail(errbuf, errlen, MT_NOT_FOUND, "no complete checkpoint %" PRIu64, at);
            goto out;
        }
        const rec_table_t *rt = NULL;
        for (uint32_t i = 0; i < rec.ntables; i++)
            if (strcmp(rec.tables[i].name, table_name) == 0) rt = &rec.tables[i];
        if (!rt) {
            err = n ? fail(errbuf, errlen, MT_CORRUPT,
                           "checkpoint %" PRIu64
                           ": table '%s' is a change stream on checkpoint %" PRIu64
                           ", which has no such table",
                           ids[n - 1], table_name, at)
                    : fail(errbuf, errlen, MT_NOT_FOUND, "checkpoint %" PRIu64 " has no table '%s'",
                           at, table_name);
            rec_free(&rec);
            goto out;
        }
        if (n == cap) {
            size_t nc = cap ? 2 * cap : 8;
            uint64_t *ni = realloc(ids, nc * sizeof(*ids));
            if (ni) ids = ni;
            rec_table_t *nt = ni ? realloc(tabs, nc * sizeof(*tabs)) : NULL;
            if (nt) tabs = nt;
            if (!ni || !nt) {
                rec_free(&rec);
                err = fail(errbuf, errlen, MT_NOMEM, "load: out of memory");
                goto out;
            }
            cap = nc;
        }
        ids[n] = at;
        tabs[n++] = *rt;
        uint64_t base = rt->base;
        rec_free(&rec);
        if (!base) break;
        at = base; /* below at: rec_decode checks it, so the walk ends */
    }
    mt_table_t *t = NULL;
    for (size_t k = n; k-- > 0 && !err;)
        err = load_stream(s, ids[k], &tabs[k], cfg, &t, errbuf, errlen);
    if (err) {
        mt_table_destroy(t);
        goto out;
    }
    *out = t;
    if (loaded_id) *loaded_id = id;
out:
    free(ids);
    free(tabs);
    return err;
}

/* Moves to the next chunk of the stream; sets r->eof after the last. A gap in the numbering
 * is damage (a chunk was lost), reported here rather than as a garbled stream. */
static mt_err_t next_chunk(rctx_t *r) {
    if (!r->started) {
        rocksdb_iter_seek(r->it, r->prefix, r->prefix_len);
        r->started = 1;
    } else {
        rocksdb_iter_next(r->it);
    }
    r->v = NULL;
    r->vlen = r->pos = 0;
    if (!rocksdb_iter_valid(r->it)) {
        char *rerr = NULL;
        rocksdb_iter_get_error(r->it, &rerr);
        if (rerr) {
            mt_err_t err = rdb_code(rerr);
            char what[512];
            rdb_describe(rerr, what, sizeof(what));
            snprintf(r->msg, sizeof(r->msg), "reading chunk %" PRIu64 ": %s", r->next_chunk, what);
            rocksdb_free(rerr);
            return err;
        }
        r->eof = 1;
        return MT_OK;
    }
    size_t klen = 0;
    const char *k = rocksdb_iter_key(r->it, &klen);
    uint64_t num = 0;
    /* The upper bound keeps k under prefix. */
    if (klen != r->prefix_len + 10 || !parse_id(k + r->prefix_len, 10, &num) ||
        num != r->next_chunk) {
        snprintf(r->msg, sizeof(r->msg), "chunk %" PRIu64 " is missing (next key: '%.*s')",
                 r->next_chunk, (int)(klen > KEY_MAX ? KEY_MAX : klen), k);
        return MT_CORRUPT;
    }
    r->v = rocksdb_iter_value(r->it, &r->vlen);
    if (r->vlen == 0) {
        snprintf(r->msg, sizeof(r->msg), "chunk %" PRIu64 " is empty", r->next_chunk);
        return MT_CORRUPT;
    }
    r->next_chunk++;
    return MT_OK;
}

/* mt_table_read_fn: serves the chunks as one stream, straight from the iterator's values. */
static mt_err_t store_read(void *ud, void *buf, size_t len, size_t *got) {
    rctx_t *r = ud;
    uint8_t *d = buf;
    size_t n = 0;
    *got = 0;
    while (n < len) {
        if (r->pos == r->vlen) {
            if (r->eof) break;
            mt_err_t err = next_chunk(r);
            if (err) return err;
            if (r->eof) break;
        }
        size_t k = r->vlen - r->pos < len - n ? r->vlen - r->pos : len - n;
        memcpy(d + n, r->v + r->pos, k);
        n += k;
        r->pos += k;
        r->bytes += k;
    }
    *got = n;
    return MT_OK;
}

mt_err_t mt_store_load_meta(mt_store_t *s, uint64_t *checkpoint_id, void **buf, size_t *len,
                            char *errbuf, size_t errlen) {
    if (!s || !checkpoint_id || !buf || !len)
        return fail(errbuf, errlen, MT_INVALID, "no store or out");
    mt_err_t err = MT_OK;
    rec_t rec = {0};
    char key[KEY_MAX], *rerr = NULL, *val = NULL;
    size_t vlen = 0;
    int found = 0;
    uint64_t id = *checkpoint_id;
    pthread_rwlock_rdlock(&s->ckpt_lock);
    if (id == 0) {
        err = read_current(s, &id, &found, errbuf, errlen);
        if (err) goto out;
        if (!found) {
            err = fail(errbuf, errlen, MT_NOT_FOUND, "no checkpoint");
            goto out;
        }
    }
    err = read_rec(s, id, &rec, &found, errbuf, errlen);
    if (err) goto out;
    if (!found) {
        err = fail(errbuf, errlen, *checkpoint_id ? MT_NOT_FOUND : MT_CORRUPT,
                   "no complete checkpoint %" PRIu64, id);
        goto out;
    }
    size_t kl = key_ckpt(key, id, "meta");
    val = rocksdb_get_cf(s->db, s->ro, s->cf[CF_DATA], key, kl, &vlen, &rerr);
    if (rerr) {
        char what[64];
        snprintf(what, sizeof(what), "checkpoint %" PRIu64 ": reading the metadata", id);
        err = rdb_fail(rerr, errbuf, errlen, what);
        goto out;
    }
    if (!val || vlen != rec.meta_bytes || XXH64(vlen ? val : "", vlen, 0) != rec.meta_hash) {
        err = fail(errbuf, errlen, MT_CORRUPT,
                   "checkpoint %" PRIu64 ": the metadata (%s, %zu bytes) is not the one committed "
                   "(%" PRIu64 " bytes)",
                   id, val ? "present" : "missing", vlen, rec.meta_bytes);
        goto out;
    }
    void *copy = malloc(vlen ? vlen : 1);
    if (!copy) {
        err = fail(errbuf, errlen, MT_NOMEM, "load_meta: out of memory");
        goto out;
    }
    if (vlen) memcpy(copy, val, vlen);
    *buf = copy;
    *len = vlen;
    *checkpoint_id = id;
out:
    pthread_rwlock_unlock(&s->ckpt_lock);
    rocksdb_free(val);
    rec_free(&rec);
    return err;
}

mt_err_t mt_store_list(mt_store_t *s, mt_store_info_t *out, size_t cap, size_t *n, char *errbuf,
                       size_t errlen) {
    if (!s || !n || (cap && !out)) return fail(errbuf, errlen, MT_INVALID, "no store or out");
    ckpt_entry_t *ents = NULL;
    size_t nents = 0;
    pthread_rwlock_rdlock(&s->ckpt_lock);
    mt_err_t err = scan(s, SCAN_INFO, &ents, &nents, errbuf, errlen);
    pthread_rwlock_unlock(&s->ckpt_lock);
    if (err) return err;
    for (size_t i = 0; i < nents && i < cap; i++)
        out[i] = ents[i].info;
    *n = nents;
    free(ents);
    return MT_OK;
}

/* ============================== rollback ============================== */

mt_err_t mt_store_rollback(mt_store_t *s, uint64_t checkpoint_id, uint64_t *dropped, char *errbuf,
                           size_t errlen) {
    if (dropped) *dropped = 0;
    if (!s) return fail(errbuf, errlen, MT_INVALID, "no store");
    if (s->cfg.read_only) return fail(errbuf, errlen, MT_INVALID, "store is read-only");
    if (checkpoint_id == UINT64_MAX)
        return fail(errbuf, errlen, MT_INVALID, "checkpoint id %" PRIu64, checkpoint_id);
    mt_err_t err = MT_OK;
    ckpt_entry_t *ents = NULL;
    size_t nents = 0;
    uint64_t n = 0;
    pthread_mutex_lock(&s->save_lock);
    /* Leftovers of failed saves above the id go too: SCAN_DATA finds them. */
    err = scan(s, SCAN_DATA, &ents, &nents, errbuf, errlen);
    if (err) goto out;
    int found = checkpoint_id == 0;
    for (size_t i = 0; i < nents; i++) {
        if (ents[i].id == checkpoint_id && ents[i].complete) found = 1;
        if (ents[i].id > checkpoint_id) n++;
    }
    if (!found) {
        err = fail(errbuf, errlen, MT_NOT_FOUND, "no complete checkpoint %" PRIu64, checkpoint_id);
        goto out;
    }
    err = rollback_locked(s, checkpoint_id, errbuf, errlen);
    if (!err && dropped) *dropped = n;
out:
    pthread_mutex_unlock(&s->save_lock);
    free(ents);
    return err;
}

/* Makes complete checkpoint @p checkpoint_id (0: none) current and deletes every key above
 * it, in one synced batch, then the dropped files. Reads nothing of the dropped range, so a
 * damaged file there does not stop it. Caller holds save_lock. */
static mt_err_t rollback_locked(mt_store_t *s, uint64_t checkpoint_id, char *errbuf,
                                size_t errlen) {
    mt_err_t err = MT_OK;
    char *rerr = NULL;
    char key[KEY_MAX];
    static const char upper[] = "ckpt0"; /* after every "ckpt/..." key */
    rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
    if (!wb) {
        err = fail(errbuf, errlen, MT_NOMEM, "rollback: out of memory");
        goto out;
    }
    /* One synced batch: `current` moves (or goes) and everything above the id is deleted;
     * after a crash all of it or none of it is there. */
    size_t kl = key_ckpt(key, checkpoint_id + 1, "");
    for (int c = 0; c < CF_COUNT; c++)
        rocksdb_writebatch_delete_range_cf(wb, s->cf[c], key, kl, upper, sizeof(upper) - 1);
    if (checkpoint_id) {
        char idtxt[24];
        int idlen = snprintf(idtxt, sizeof(idtxt), "%020" PRIu64, checkpoint_id);
        rocksdb_writebatch_put_cf(wb, s->cf[CF_DEFAULT], KEY_CURRENT, strlen(KEY_CURRENT), idtxt,
                                  (size_t)idlen);
    } else {
        rocksdb_writebatch_delete_cf(wb, s->cf[CF_DEFAULT], KEY_CURRENT, strlen(KEY_CURRENT));
    }
    pthread_rwlock_wrlock(&s->ckpt_lock);
    rocksdb_write(s->db, s->wo_sync, wb, &rerr);
    if (!rerr) /* the dropped SSTs, whole (as the prune of a save) */
        rocksdb_delete_file_in_range_cf(s->db, s->cf[CF_DATA], key, kl, upper, sizeof(upper) - 1,
                                        &rerr);
    pthread_rwlock_unlock(&s->ckpt_lock);
    if (rerr) {
        err = rdb_fail(rerr, errbuf, errlen, "rolling back");
        goto out;
    }
    if (s->cfg.compact_on_prune)
        rocksdb_compact_range_cf_opt(s->db, s->cf[CF_DATA], s->co, key, kl, upper,
                                     sizeof(upper) - 1);
out:
    if (wb) rocksdb_writebatch_destroy(wb);
    return err;
}

mt_err_t mt_store_drop(mt_store_t *s, uint64_t checkpoint_id, uint64_t *current, uint64_t *dropped,
                       char *errbuf, size_t errlen) {
    if (current) *current = 0;
    if (dropped) *dropped = 0;
    if (!s) return fail(errbuf, errlen, MT_INVALID, "no store");
    if (checkpoint_id == 0 || checkpoint_id == UINT64_MAX)
        return fail(errbuf, errlen, MT_INVALID, "checkpoint id %" PRIu64, checkpoint_id);
    if (s->cfg.read_only) return fail(errbuf, errlen, MT_INVALID, "store is read-only");
    ckpt_entry_t *ents = NULL;
    size_t nents = 0;
    uint64_t below = 0, n = 0;
    int found = 0;
    pthread_mutex_lock(&s->save_lock);
    /* The commit records only, not decoded: neither a garbled record nor a damaged data
     * file (which the data scan would read) may stop the drop of their checkpoint. */
    mt_err_t err = scan(s, 0, &ents, &nents, errbuf, errlen);
    if (err) goto out;
    for (size_t i = 0; i < nents; i++) {
        if (ents[i].id == checkpoint_id) found = 1;
        if (ents[i].id < checkpoint_id) below = ents[i].id;
        if (ents[i].id >= checkpoint_id) n++;
    }
    if (!found) { /* a leftover of a failed save (data only)? */
        free(ents);
        ents = NULL;
        if (scan(s, SCAN_DATA, &ents, &nents, NULL, 0) == MT_OK)
            for (size_t i = 0; i < nents; i++)
                found |= ents[i].id == checkpoint_id;
    }
    if (!found) {
        err = fail(errbuf, errlen, MT_NOT_FOUND, "no checkpoint %" PRIu64 " in the store",
                   checkpoint_id);
        goto out;
    }
    err = rollback_locked(s, below, errbuf, errlen);
    if (!err && current) *current = below;
    if (!err && dropped) *dropped = n;
out:
    pthread_mutex_unlock(&s->save_lock);
    free(ents);
    return err;
}

/* ============================== test hooks ============================== */

void mt__store_set_hook(mt_store_t *s, mt__store_hook_fn fn, void *ud) {
    s->hook = fn;
    s->hook_ud = ud;
}

/* ============================== private functions ============================== */

static mt_err_t fail(char *errbuf, size_t errlen, mt_err_t err, const char *fmt, ...) {
    if (errbuf && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(errbuf, errlen, fmt, ap);
        va_end(ap);
    }
    return err;
}

/* RocksDB's Status::ToString() starts with the status code's name. */
static mt_err_t rdb_code(const char *msg) {
    if (strncmp(msg, "Corruption", 10) == 0) return MT_CORRUPT;
    if (strncmp(msg, "Resource busy", 13) == 0 || strncmp(msg, "Operation failed. Try", 21) == 0 ||
        strncmp(msg, "Shutdown in progress", 20) == 0)
        return MT_UNAVAILABLE;
    return MT_IO;
}

/* Translates and frees a RocksDB error string. */
static mt_err_t rdb_fail(char *rerr, char *errbuf, size_t errlen, const char *what) {
    mt_err_t err = rdb_code(rerr);
    char msg[768];
    rdb_describe(rerr, msg, sizeof(msg));
    fail(errbuf, errlen, err, "%s: %s", what, msg);
    rocksdb_free(rerr);
    return err;
}

/*
 * RocksDB's message with what it leaves out. "file is too short (N bytes) to be an
 * sstable<path>" gives N from the MANIFEST, the size the file should have, not the size it
 * has (a probe read "14783621 bytes" off a truncated file): both are given here, the
 * actual one from stat(2).
 */
static void rdb_describe(const char *rerr, char *out, size_t len) {
    static const char pre[] = "file is too short (", mid[] = " bytes) to be an sstable";
    const char *p = strstr(rerr, pre), *q = p ? strstr(p, mid) : NULL;
    if (!q) {
        snprintf(out, len, "%s", rerr);
        return;
    }
    unsigned long long want = strtoull(p + sizeof(pre) - 1, NULL, 10);
    const char *path = q + sizeof(mid) - 1, *end = strstr(path, " in file ");
    size_t pl = end ? (size_t)(end - path) : strlen(path);
    char file[512];
    snprintf(file, sizeof(file), "%.*s", (int)(pl < sizeof(file) ? pl : sizeof(file) - 1), path);
    struct stat sb;
    char have[64];
    if (stat(file, &sb) == 0)
        snprintf(have, sizeof(have), "%lld bytes on disk", (long long)sb.st_size);
    else
        snprintf(have, sizeof(have), "not readable on disk (%s)", strerror(errno));
    snprintf(out, len,
             "%.*stable file %s is truncated: %s, %llu bytes expected (RocksDB: file is too short "
             "to be an sstable)",
             (int)(p - rerr), rerr, file, have, want);
}

static uint64_t wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int name_ok(const char *name) {
    if (!name) return 0;
    size_t n = 0;
    for (; name[n]; n++) {
        char c = name[n];
        if (n >= MT_STORE_MAX_NAME) return 0;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == '-'))
            return 0;
    }
    return n > 0;
}

/* Bytewise order, a prefix first: RocksDB's default comparator. */
static int suffix_cmp(const char *a, size_t al, const char *b, size_t bl) {
    int c = memcmp(a, b, al < bl ? al : bl);
    if (c) return c;
    return al < bl ? -1 : al > bl;
}

/* "ckpt/<id>/<suffix>". @returns its length. */
static size_t key_ckpt(char *k, uint64_t id, const char *suffix) {
    return (size_t)snprintf(k, KEY_MAX, "ckpt/%020" PRIu64 "/%s", id, suffix);
}

/* "ckpt/<id>0": the first key after every key of checkpoint id. */
static size_t key_ckpt_end(char *k, uint64_t id) {
    return (size_t)snprintf(k, KEY_MAX, "ckpt/%020" PRIu64 "0", id);
}

/* Parses exactly n decimal digits (no overflow). @returns 1 on success. */
static int parse_id(const char *p, size_t n, uint64_t *id) {
    uint64_t v = 0;
    if (n == 0) return 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') return 0;
        uint64_t d = (uint64_t)(p[i] - '0');
        if (v > (UINT64_MAX - d) / 10) return 0;
        v = v * 10 + d;
    }
    *id = v;
    return 1;
}

static mt_err_t rec_encode(const rec_t *r, uint8_t **out, size_t *len) {
    size_t n = REC_HEAD + 8;
    for (uint32_t i = 0; i < r->ntables; i++)
        n += REC_TABLE_FIXED + strlen(r->tables[i].name);
    uint8_t *b = malloc(n), *q = b;
    if (!b) return MT_NOMEM;
    memcpy(q, REC_MAGIC, 8); /* with its NUL */
    mt_put_le(q + 8, REC_VERSION, 4);
    mt_put_le(q + 12, r->ntables, 4);
    mt_put_le(q + 16, r->id, 8);
    mt_put_le(q + 24, r->created_ms, 8);
    mt_put_le(q + 32, r->meta_bytes, 8);
    mt_put_le(q + 40, r->meta_hash, 8);
    q += REC_HEAD;
    for (uint32_t i = 0; i < r->ntables; i++) {
        const rec_table_t *t = &r->tables[i];
        size_t nl = strlen(t->name);
        mt_put_le(q, nl, 2);
        memcpy(q + 2, t->name, nl);
        q += 2 + nl;
        mt_put_le(q, t->chunks, 8);
        mt_put_le(q + 8, t->bytes, 8);
        mt_put_le(q + 16, t->rows, 8);
        mt_put_le(q + 24, t->base, 8);
        q += 32;
    }
    mt_put_le(q, XXH64(b, (size_t)(q - b), 0), 8);
    *out = b;
    *len = n;
    return MT_OK;
}

/* Decodes and checks a commit record. @returns MT_OK, MT_CORRUPT, MT_VERSION or MT_NOMEM. */
static mt_err_t rec_decode(const char *p, size_t len, rec_t *r) {
    const uint8_t *b = (const uint8_t *)p;
    memset(r, 0, sizeof(*r));
    if (len < REC_HEAD + 8 || memcmp(b, REC_MAGIC, 8) != 0) return MT_CORRUPT;
    if (mt_get_le(b + len - 8, 8) != XXH64(b, len - 8, 0)) return MT_CORRUPT;
    uint32_t version = (uint32_t)mt_get_le(b + 8, 4);
    if (version != 1 && version != REC_VERSION) return MT_VERSION;
    size_t fixed = (version == 1 ? REC_TABLE_V1 : REC_TABLE_FIXED) - 2;
    uint32_t nt = (uint32_t)mt_get_le(b + 12, 4);
    if (nt > MT_STORE_MAX_TABLES) return MT_CORRUPT;
    r->ntables = nt;
    r->id = mt_get_le(b + 16, 8);
    r->created_ms = mt_get_le(b + 24, 8);
    r->meta_bytes = mt_get_le(b + 32, 8);
    r->meta_hash = mt_get_le(b + 40, 8);
    r->tables = calloc(nt ? nt : 1, sizeof(*r->tables));
    if (!r->tables) return MT_NOMEM;
    size_t off = REC_HEAD, stop = len - 8;
    for (uint32_t i = 0; i < nt; i++) {
        if (stop - off < 2) goto bad;
        size_t nl = (size_t)mt_get_le(b + off, 2);
        if (nl == 0 || nl > MT_STORE_MAX_NAME || stop - off - 2 < nl + fixed) goto bad;
        rec_table_t *t = &r->tables[i];
        memcpy(t->name, b + off + 2, nl);
        t->name[nl] = 0;
        if (!name_ok(t->name)) goto bad;
        off += 2 + nl;
        t->chunks = mt_get_le(b + off, 8);
        t->bytes = mt_get_le(b + off + 8, 8);
        t->rows = mt_get_le(b + off + 16, 8);
        t->base = version == 1 ? 0 : mt_get_le(b + off + 24, 8);
        if (t->base >= r->id) goto bad; /* a stream applies onto an older checkpoint */
        off += fixed;
    }
    if (off != stop) goto bad;
    return MT_OK;
bad:
    rec_free(r);
    return MT_CORRUPT;
}

static void rec_free(rec_t *r) {
    free(r->tables);
    r->tables = NULL;
    r->ntables = 0;
}

/* Reads `current`. @param[out] found  0 when the store has no checkpoint. */
static mt_err_t read_current(mt_store_t *s, uint64_t *id, int *found, char *errbuf, size_t errlen) {
    char *rerr = NULL;
    size_t vlen = 0;
    *found = 0;
    char *val = rocksdb_get_cf(s->db, s->ro, s->cf[CF_DEFAULT], KEY_CURRENT, strlen(KEY_CURRENT),
                               &vlen, &rerr);
    if (rerr) return rdb_fail(rerr, errbuf, errlen, "reading key 'current'");
    if (!val) return MT_OK;
    mt_err_t err = MT_OK;
    if (vlen != 20 || !parse_id(val, vlen, id) || *id == 0)
        err = fail(errbuf, errlen, MT_CORRUPT, "key 'current' holds no checkpoint id");
    else
        *found = 1;
    rocksdb_free(val);
    return err;
}

/* Decodes and checks the commit record held in val (for id). */
static mt_err_t check_rec(const char *val, size_t vlen, uint64_t id, rec_t *r, char *errbuf,
                          size_t errlen) {
    mt_err_t err = rec_decode(val, vlen, r);
    if (!err && r->id != id) {
        rec_free(r);
        err = MT_CORRUPT;
    }
    if (err)
        return fail(errbuf, errlen, err, "commit record of checkpoint %" PRIu64 ": %s", id,
                    mt_strerror(err));
    return MT_OK;
}

/* Reads and checks the commit record of id. @param[out] found  0 when it has none. */
static mt_err_t read_rec(mt_store_t *s, uint64_t id, rec_t *r, int *found, char *errbuf,
                         size_t errlen) {
    char key[KEY_MAX], *rerr = NULL;
    size_t vlen = 0, kl = key_ckpt(key, id, "complete");
    *found = 0;
    memset(r, 0, sizeof(*r));
    char *val = rocksdb_get_cf(s->db, s->ro, s->cf[CF_DEFAULT], key, kl, &vlen, &rerr);
    if (rerr) return rdb_fail(rerr, errbuf, errlen, "reading a commit record");
    if (!val) return MT_OK;
    mt_err_t err = check_rec(val, vlen, id, r, errbuf, errlen);
    rocksdb_free(val);
    if (!err) *found = 1;
    return err;
}

/* Appends an entry to a growing array. @returns NULL when out of memory. */
static ckpt_entry_t *ents_push(ckpt_entry_t **v, size_t *n, size_t *cap, uint64_t id) {
    if (*n == *cap) {
        size_t nc = *cap ? 2 * *cap : 16;
        ckpt_entry_t *nv = realloc(*v, nc * sizeof(**v));
        if (!nv) return NULL;
        *v = nv;
        *cap = nc;
    }
    ckpt_entry_t *e = &(*v)[(*n)++];
    memset(e, 0, sizeof(*e));
    e->id = id;
    return e;
}

/*
 * Lists the checkpoints in id order: those with a commit record, and with SCAN_DATA also
 * those that only have data (leftovers). The data family is walked by seeking from one
 * checkpoint to the next, never through their chunks.
 * @param[out] out  malloc'd array the caller frees (NULL when *n is 0)
 */
static mt_err_t scan(mt_store_t *s, int flags, ckpt_entry_t **out, size_t *n, char *errbuf,
                     size_t errlen) {
    mt_err_t err = MT_OK;
    ckpt_entry_t *v = NULL;
    uint64_t *data_ids = NULL;
    size_t nv = 0, cap = 0, nd = 0, dcap = 0;
    char key[KEY_MAX], *rerr = NULL;
    static const char upper[] = "ckpt0";
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    rocksdb_iterator_t *it = NULL;
    if (!ro) return fail(errbuf, errlen, MT_NOMEM, "scan: out of memory");
    rocksdb_readoptions_set_iterate_upper_bound(ro, upper, sizeof(upper) - 1);

    /* Commit records (the default family holds nothing else under ckpt/). */
    it = rocksdb_create_iterator_cf(s->db, ro, s->cf[CF_DEFAULT]);
    if (!it) {
        err = fail(errbuf, errlen, MT_NOMEM, "scan: out of memory");
        goto out;
    }
    for (rocksdb_iter_seek(it, "ckpt/", 5); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t klen = 0, vlen = 0;
        const char *k = rocksdb_iter_key(it, &klen);
        uint64_t id = 0;
        if (klen != 26 + 8 || memcmp(k + 25, "/complete", 9) != 0 || !parse_id(k + 5, 20, &id))
            continue; /* not ours */
        ckpt_entry_t *e = ents_push(&v, &nv, &cap, id);
        if (!e) {
            err = fail(errbuf, errlen, MT_NOMEM, "scan: out of memory");
            goto out;
        }
        e->complete = 1;
        rec_t rec = {0};
        const char *val = rocksdb_iter_value(it, &vlen);
        if (flags & SCAN_INFO) {
            err = check_rec(val, vlen, id, &rec, errbuf, errlen);
            if (err) goto out;
            e->info.checkpoint_id = id;
            e->info.created_ms = rec.created_ms;
            e->info.ntables = rec.ntables;
            e->info.meta_bytes = rec.meta_bytes;
            for (uint32_t i = 0; i < rec.ntables; i++) {
                e->info.rows += rec.tables[i].rows;
                e->info.bytes += rec.tables[i].bytes;
            }
        } else if (rec_decode(val, vlen, &rec) != MT_OK) {
            memset(&rec, 0, sizeof(rec)); /* damaged: no parent known (it cannot load anyway) */
        }
        for (uint32_t i = 0; i < rec.ntables; i++)
            if (rec.tables[i].base > e->parent) e->parent = rec.tables[i].base;
        e->info.parent = e->parent;
        rec_free(&rec);
    }
    rocksdb_iter_get_error(it, &rerr);
    if (rerr) {
        err = rdb_fail(rerr, errbuf, errlen, "scanning commit records");
        goto out;
    }
    rocksdb_iter_destroy(it);
    it = NULL;

    if (flags & SCAN_DATA) {
        rocksdb_readoptions_set_fill_cache(ro, 0);
        it = rocksdb_create_iterator_cf(s->db, ro, s->cf[CF_DATA]);
        if (!it) {
            err = fail(errbuf, errlen, MT_NOMEM, "scan: out of memory");
            goto out;
        }
        rocksdb_iter_seek(it, "ckpt/", 5);
        while (rocksdb_iter_valid(it)) {
            size_t klen = 0;
            const char *k = rocksdb_iter_key(it, &klen);
            uint64_t id = 0;
            if (klen < 26 || k[25] != '/' || !parse_id(k + 5, 20, &id)) {
                rocksdb_iter_next(it); /* not ours: step over it */
                continue;
            }
            if (nd == dcap) {
                size_t nc = dcap ? 2 * dcap : 16;
                uint64_t *nids = realloc(data_ids, nc * sizeof(*data_ids));
                if (!nids) {
                    err = fail(errbuf, errlen, MT_NOMEM, "scan: out of memory");
                    goto out;
                }
                data_ids = nids;
                dcap = nc;
            }
            data_ids[nd++] = id;
            if (id == UINT64_MAX) break;
            size_t kl = key_ckpt_end(key, id);
            rocksdb_iter_seek(it, key, kl);
        }
        rocksdb_iter_get_error(it, &rerr);
        if (rerr) {
            err = rdb_fail(rerr, errbuf, errlen, "scanning checkpoint data");
            goto out;
        }
        /* Merge the two sorted lists. */
        size_t nrec = nv, i = 0;
        for (size_t d = 0; d < nd; d++) {
            while (i < nrec && v[i].id < data_ids[d])
                i++;
            if (i < nrec && v[i].id == data_ids[d]) {
                v[i].has_data = 1;
                continue;
            }
            ckpt_entry_t *e = ents_push(&v, &nv, &cap, data_ids[d]);
            if (!e) {
                err = fail(errbuf, errlen, MT_NOMEM, "scan: out of memory");
                goto out;
            }
            e->has_data = 1;
        }
        /* Entries appended after nrec are unsorted with respect to the records. */
        for (size_t a = nrec; a < nv; a++) {
            ckpt_entry_t e = v[a];
            size_t b = a;
            while (b > 0 && v[b - 1].id > e.id) {
                v[b] = v[b - 1];
                b--;
            }
            v[b] = e;
        }
    }
    *out = v;
    *n = nv;
    v = NULL;
out:
    free(v);
    free(data_ids);
    if (it) rocksdb_iter_destroy(it);
    rocksdb_readoptions_destroy(ro);
    return err;
}

/* Deletes checkpoints first..last (every key in their range, both families). With compact,
 * the data range is compacted too, so that it is empty, tombstones included. */
static mt_err_t purge(mt_store_t *s, uint64_t first, uint64_t last, int compact, char *errbuf,
                      size_t errlen) {
    char b[KEY_MAX], e[KEY_MAX], *rerr = NULL;
    size_t bl = key_ckpt(b, first, ""), el = key_ckpt_end(e, last);
    rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
    if (!wb) return fail(errbuf, errlen, MT_NOMEM, "purge: out of memory");
    for (int c = 0; c < CF_COUNT; c++)
        rocksdb_writebatch_delete_range_cf(wb, s->cf[c], b, bl, e, el);
    rocksdb_write(s->db, s->wo_async, wb, &rerr);
    rocksdb_writebatch_destroy(wb);
    if (rerr) return rdb_fail(rerr, errbuf, errlen, "deleting leftovers");
    rocksdb_delete_file_in_range_cf(s->db, s->cf[CF_DATA], b, bl, e, el, &rerr);
    if (rerr) return rdb_fail(rerr, errbuf, errlen, "deleting leftover files");
    if (compact) rocksdb_compact_range_cf_opt(s->db, s->cf[CF_DATA], s->co, b, bl, e, el);
    return MT_OK;
}

/* Deletes our files in tmp_dir: SSTs of saves that stopped before ingesting them. */
static void clean_tmp_dir(mt_store_t *s) {
    DIR *d = opendir(s->tmp_dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        size_t nl = strlen(de->d_name);
        if (nl > 9 && strncmp(de->d_name, "ckpt-", 5) == 0 &&
            strcmp(de->d_name + nl - 4, ".sst") == 0)
            unlinkat(dirfd(d), de->d_name, 0);
    }
    closedir(d);
}

static mt_err_t fsync_path(const char *path, int is_dir, char *errbuf, size_t errlen) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | (is_dir ? O_DIRECTORY : 0));
    if (fd < 0) return fail(errbuf, errlen, MT_IO, "open %s: %s", path, strerror(errno));
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    if (rc != 0) return fail(errbuf, errlen, MT_IO, "fsync %s: %s", path, strerror(e));
    return MT_OK;
}
