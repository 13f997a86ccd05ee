/*
 * test_store.c - the RocksDB checkpoint store (store/src/store.c).
 *
 * The store is what a PS shard restarts from, so a load must give back exactly what the
 * newest complete save wrote, and no failure (crash, failed write, damaged data) may leave
 * a half-written checkpoint visible or destroy the previous one. This file covers:
 *  - round trips of two tables through small chunks (every row compared bit for bit with
 *    mt_table_get_row()), the documented key layout (chunk keys, chunk sizes, `current`,
 *    commit record, metadata) read back with the RocksDB C API, and mt_store_list() figures;
 *  - metadata round trips (a blob, an empty blob, a checkpoint with no table, older ids);
 *  - keep-K pruning: after 5 saves with keep 2 only 2 checkpoints are listed and no key of
 *    the others is left;
 *  - incremental checkpoints: a chain of change streams loads to exactly the whole table
 *    saved beside it at every id, pruning keeps what a kept checkpoint needs, changes with
 *    nothing to apply onto or since a version the table cannot serve are refused, and a
 *    chain whose start lost its commit record fails to load, naming it;
 *  - a save failing in the middle (test hook): error returned, previous checkpoint current
 *    and loadable, partial data deleted;
 *  - a real crash: a child process SIGKILLed in the middle of a save (after its partial data
 *    was flushed to disk): current unchanged, previous checkpoint loadable after reopening,
 *    and the next save deletes the leftovers;
 *  - planted leftovers (a stray chunk under the next id, an incomplete higher id): the next
 *    save deletes them and its table loads;
 *  - rollback to an older checkpoint (and to none): current moves, newer checkpoints and
 *    leftovers are deleted for good, their ids can be saved again, refused read-only;
 *  - durability across close/reopen, and read-only opens;
 *  - damage written with the RocksDB C API (garbage chunk, flipped byte, missing chunk,
 *    truncated or extra chunk, bad commit record, bad metadata, bad `current`, no commit
 *    record): an error, *out untouched, and a clean load again once repaired;
 *  - a truncated table file (which RocksDB refuses the whole database for): the store opens,
 *    the damaged checkpoint's loads fail naming it with the file's size and the size
 *    expected, the others load, and mt_store_drop() takes the store past it;
 *  - argument checks (ids not increasing, bad or duplicate names), config checks and open
 *    errors (missing database, a file, a locked database, another layout version);
 *  - loads running in a thread while saves commit and prune (keep 1): every load succeeds
 *    and gives one whole checkpoint;
 *  - a 200k-row table with the default settings (save/load seconds printed, information).
 * Each test works in its own mkdtemp() directory under /tmp, removed at the end.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <dirent.h>
#include <ftw.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <rocksdb/c.h>

#include "mt/store.h"
#include "mt/table.h"
#include "store_int.h"

/* ============================== fixture ============================== */

static char g_tmp[64];
static char g_db[96];

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void setup(void) {
    snprintf(g_tmp, sizeof(g_tmp), "/tmp/mt_store_test_XXXXXX");
    cr_assert_not_null(mkdtemp(g_tmp));
    snprintf(g_db, sizeof(g_db), "%s/db", g_tmp);
}

static void teardown(void) {
    if (g_tmp[0]) nftw(g_tmp, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

TestSuite(store, .init = setup, .fini = teardown, .timeout = 600);

/* ============================== tables ============================== */

#define SLOT_A 1 /* dim 8, Adagrad, fp32 */
#define SLOT_B 2 /* dim 4, SGD, fp16 */

static mt_table_slot_config_t g_slots[2];

static void table_cfg(mt_table_config_t *c, uint32_t shards_log2, uint64_t filter_bytes) {
    mt_table_slot_config_init(&g_slots[0], SLOT_A, 8);
    g_slots[0].opt = MT_OPT_ADAGRAD;
    mt_table_slot_config_init(&g_slots[1], SLOT_B, 4);
    g_slots[1].opt = MT_OPT_SGD;
    g_slots[1].precision = MT_PREC_FP16;
    mt_table_config_init(c);
    c->slots = g_slots;
    c->nslots = 2;
    c->shards_log2 = shards_log2;
    c->filter_bytes = filter_bytes;
}

/* Row i of the table built with seed: distinct for every i (odd multiplier mod 2^48). */
static uint64_t fid_of(size_t i, uint64_t seed) {
    uint64_t v = ((uint64_t)i * 0x9E3779B97F4A7C15ull + seed * 0x1000193ull) & 0xFFFFFFFFFFFFull;
    return MT_FID_MAKE(i % 2 ? SLOT_B : SLOT_A, v);
}

static uint32_t dim_of(uint64_t fid) {
    return MT_FID_SLOT(fid) == SLOT_A ? 8 : 4;
}

/* n rows assigned, then one gradient step each (non-trivial optimizer state), all
 * deterministic in (n, seed). */
static mt_table_t *build_table(const mt_table_config_t *cfg, size_t n, uint64_t seed) {
    mt_table_t *t = NULL;
    cr_assert_eq(mt_table_create(cfg, &t), MT_OK);
    enum { BATCH = 512 };
    uint64_t fids[BATCH];
    float vals[BATCH * 8], grads[BATCH * 8];
    for (size_t off = 0; off < n; off += BATCH) {
        size_t m = n - off < BATCH ? n - off : BATCH, nv = 0;
        for (size_t j = 0; j < m; j++) {
            fids[j] = fid_of(off + j, seed);
            for (uint32_t k = 0; k < dim_of(fids[j]); k++, nv++) {
                vals[nv] = (float)((fids[j] >> 3) % 997 + k) * 0.001f - 0.5f + (float)seed;
                grads[nv] = 0.01f * (float)(k + 1) - 0.02f;
            }
        }
        cr_assert_eq(mt_table_assign(t, fids, m, vals, nv, 1000 + (uint32_t)seed, NULL), MT_OK);
        cr_assert_eq(mt_table_apply(t, fids, m, grads, nv, 2000 + (uint32_t)seed, NULL), MT_OK);
    }
    return t;
}

static uint64_t table_rows(mt_table_t *t) {
    mt_table_stats_t st;
    mt_table_stats(t, &st);
    return st.rows;
}

/* Every row of the (n, seed) table is in both with the same bits, and nothing else. */
static void assert_same(mt_table_t *a, mt_table_t *b, size_t n, uint64_t seed) {
    cr_assert_eq(table_rows(a), n);
    cr_assert_eq(table_rows(b), n, "loaded table has %" PRIu64 " rows, want %zu", table_rows(b), n);
    for (size_t i = 0; i < n; i++) {
        uint64_t fid = fid_of(i, seed);
        float ea[8], eb[8], sa[32], sb[32];
        uint32_t ta, tb, ca, cb, ns = 0;
        uint64_t va, vb;
        cr_assert_eq(mt_table_state_floats(a, fid, &ns), MT_OK);
        cr_assert_leq(ns, 32);
        cr_assert_eq(mt_table_get_row(a, fid, ea, sa, ns, &ta, &ca, &va), MT_OK);
        cr_assert_eq(mt_table_get_row(b, fid, eb, sb, ns, &tb, &cb, &vb), MT_OK,
                     "row %zu missing after load", i);
        cr_assert_eq(memcmp(ea, eb, dim_of(fid) * sizeof(float)), 0, "embedding of row %zu", i);
        cr_assert_eq(memcmp(sa, sb, ns * sizeof(float)), 0, "optimizer state of row %zu", i);
        cr_assert_eq(ta, tb);
        cr_assert_eq(ca, cb);
        cr_assert_eq(va, vb);
    }
}

/* A non-NULL pointer that a failed load must leave as it is. */
static _Alignas(64) unsigned char sentinel_obj[64];
#define SENTINEL ((mt_table_t *)(void *)sentinel_obj)

/* ============================== store helpers ============================== */

static void small_cfg(mt_store_config_t *c, uint32_t keep) {
    mt_store_config_init(c);
    c->keep = keep;
    c->chunk_bytes = 64u << 10;
}

static mt_store_t *open_store(const mt_store_config_t *c) {
    mt_store_t *s = NULL;
    char eb[256] = "";
    mt_err_t err = mt_store_open(g_db, c, &s, eb, sizeof(eb));
    cr_assert_eq(err, MT_OK, "open: %s: %s", mt_err_name(err), eb);
    cr_assert_not_null(s);
    return s;
}

static void save_ok(mt_store_t *s, uint64_t id, const mt_store_table_t *tabs, size_t n,
                    const void *meta, size_t meta_len, mt_store_result_t *res) {
    char eb[256] = "";
    mt_err_t err = mt_store_save(s, id, tabs, n, meta, meta_len, res, eb, sizeof(eb));
    cr_assert_eq(err, MT_OK, "save %" PRIu64 ": %s: %s", id, mt_err_name(err), eb);
}

static mt_table_t *load_ok(mt_store_t *s, const char *name, const mt_table_config_t *cfg,
                           uint64_t want_id) {
    mt_table_t *t = NULL;
    uint64_t id = 0;
    char eb[256] = "";
    mt_err_t err = mt_store_load_latest(s, name, cfg, &t, &id, eb, sizeof(eb));
    cr_assert_eq(err, MT_OK, "load '%s': %s: %s", name, mt_err_name(err), eb);
    cr_assert_eq(id, want_id);
    return t;
}

/* Loads expecting an error: *out untouched, a message given. @returns the error. */
static mt_err_t load_fails(mt_store_t *s, const char *name, const mt_table_config_t *cfg) {
    mt_table_t *t = SENTINEL;
    char eb[256] = "";
    mt_err_t err = mt_store_load_latest(s, name, cfg, &t, NULL, eb, sizeof(eb));
    cr_assert_neq(err, MT_OK, "load of damaged data succeeded");
    cr_assert_eq(t, SENTINEL, "a failed load (%s) wrote *out", mt_err_name(err));
    cr_assert_neq(eb[0], 0, "no message for %s", mt_err_name(err));
    cr_log_info("damaged load: %s: %s", mt_err_name(err), eb);
    return err;
}

static size_t list_ids(mt_store_t *s, uint64_t *ids, size_t cap) {
    mt_store_info_t info[16];
    size_t n = 0;
    char eb[256] = "";
    mt_err_t err = mt_store_list(s, info, 16, &n, eb, sizeof(eb));
    cr_assert_eq(err, MT_OK, "list: %s: %s", mt_err_name(err), eb);
    cr_assert_leq(n, cap);
    for (size_t i = 0; i < n; i++)
        ids[i] = info[i].checkpoint_id;
    return n;
}

static uint64_t current_id(mt_store_t *s) {
    uint64_t id = 0;
    cr_assert_eq(mt_store_current(s, &id, NULL, 0), MT_OK);
    return id;
}

/* ============================== raw RocksDB access ============================== */

enum { CF_DEFAULT = 0, CF_DATA = 1 }; /* the store's column families (store.c) */

typedef struct raw {
    rocksdb_t *db;
    rocksdb_column_family_handle_t *cf[2];
    rocksdb_options_t *o;
    rocksdb_writeoptions_t *wo;
    rocksdb_readoptions_t *ro;
} raw_t;

static void raw_open(raw_t *r) {
    char *e = NULL;
    const char *names[2] = {"default", "data"};
    r->o = rocksdb_options_create();
    r->wo = rocksdb_writeoptions_create();
    r->ro = rocksdb_readoptions_create();
    rocksdb_writeoptions_set_sync(r->wo, 1);
    const rocksdb_options_t *co[2] = {r->o, r->o};
    r->db = rocksdb_open_column_families(r->o, g_db, 2, names, co, r->cf, &e);
    cr_assert_null(e, "raw open: %s", e);
}

static void raw_close(raw_t *r) {
    rocksdb_column_family_handle_destroy(r->cf[0]);
    rocksdb_column_family_handle_destroy(r->cf[1]);
    rocksdb_close(r->db);
    rocksdb_options_destroy(r->o);
    rocksdb_writeoptions_destroy(r->wo);
    rocksdb_readoptions_destroy(r->ro);
}

/* @returns a malloc'd, NUL-terminated copy of the value of key, or NULL. */
static char *raw_get(raw_t *r, int cf, const char *key, size_t *len) {
    char *e = NULL;
    size_t n = 0;
    char *v = rocksdb_get_cf(r->db, r->ro, r->cf[cf], key, strlen(key), &n, &e);
    cr_assert_null(e, "raw get: %s", e);
    if (!v) return NULL;
    char *c = malloc(n + 1);
    memcpy(c, v, n);
    c[n] = 0;
    rocksdb_free(v);
    *len = n;
    return c;
}

static void raw_put(raw_t *r, int cf, const char *key, const void *val, size_t len) {
    char *e = NULL;
    rocksdb_put_cf(r->db, r->wo, r->cf[cf], key, strlen(key), val, len, &e);
    cr_assert_null(e, "raw put: %s", e);
}

static void raw_del(raw_t *r, int cf, const char *key) {
    char *e = NULL;
    rocksdb_delete_cf(r->db, r->wo, r->cf[cf], key, strlen(key), &e);
    cr_assert_null(e, "raw delete: %s", e);
}

/* Keys of family cf starting with prefix; with lens (cap entries), their value sizes. */
static size_t raw_count(raw_t *r, int cf, const char *prefix, size_t *lens, size_t cap) {
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(r->db, r->ro, r->cf[cf]);
    size_t n = 0, pl = strlen(prefix);
    for (rocksdb_iter_seek(it, prefix, pl); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl = 0, vl = 0;
        const char *k = rocksdb_iter_key(it, &kl);
        if (kl < pl || memcmp(k, prefix, pl) != 0) break;
        rocksdb_iter_value(it, &vl);
        if (lens && n < cap) lens[n] = vl;
        n++;
    }
    char *e = NULL;
    rocksdb_iter_get_error(it, &e);
    cr_assert_null(e, "raw scan: %s", e);
    rocksdb_iter_destroy(it);
    return n;
}

static void ckpt_key(char *k, size_t cap, uint64_t id, const char *suffix) {
    snprintf(k, cap, "ckpt/%020" PRIu64 "/%s", id, suffix);
}

/* Keys of checkpoint id in both families, read with the store closed. */
static size_t raw_ckpt_keys(uint64_t id) {
    raw_t r;
    char k[128];
    raw_open(&r);
    ckpt_key(k, sizeof(k), id, "");
    size_t n = raw_count(&r, CF_DEFAULT, k, NULL, 0) + raw_count(&r, CF_DATA, k, NULL, 0);
    raw_close(&r);
    return n;
}

/* Files in the store's SST staging directory. */
static size_t tmp_files(void) {
    char d[160];
    snprintf(d, sizeof(d), "%s/mt-ingest", g_db);
    DIR *dir = opendir(d);
    cr_assert_not_null(dir, "no %s", d);
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(dir)) != NULL)
        if (de->d_name[0] != '.') n++;
    closedir(dir);
    return n;
}

/* ============================== empty store ============================== */

Test(store, empty_store_has_nothing) {
    mt_store_config_t sc;
    small_cfg(&sc, 2);
    mt_store_t *s = open_store(&sc);
    mt_table_config_t tc;
    table_cfg(&tc, 2, 0);
    char eb[256] = "";
    uint64_t id = 77;
    cr_assert_eq(mt_store_current(s, &id, eb, sizeof(eb)), MT_NOT_FOUND);
    cr_assert_eq(id, 77);
    mt_table_t *t = SENTINEL;
    cr_assert_eq(mt_store_load_latest(s, "emb", &tc, &t, &id, eb, sizeof(eb)), MT_NOT_FOUND);
    cr_assert_eq(t, SENTINEL);
    cr_assert_neq(eb[0], 0);
    cr_assert_eq(mt_store_load_table(s, 1, "emb", &tc, &t, NULL, 0), MT_NOT_FOUND);
    cr_assert_eq(t, SENTINEL);
    void *buf = (void *)1;
    size_t len = 5;
    id = 0;
    cr_assert_eq(mt_store_load_meta(s, &id, &buf, &len, NULL, 0), MT_NOT_FOUND);
    cr_assert_eq(buf, (void *)1);
    cr_assert_eq(len, 5);
    size_t n = 9;
    cr_assert_eq(mt_store_list(s, NULL, 0, &n, NULL, 0), MT_OK);
    cr_assert_eq(n, 0);
    mt_store_close(s);
    mt_store_close(NULL);
}

/* ============================== round trip and layout ============================== */

static mt_err_t count_write(void *ud, const void *buf, size_t len) {
    (void)buf;
    *(size_t *)ud += len;
    return MT_OK;
}

Test(store, round_trip_two_tables_and_layout) {
    mt_table_config_t tc;
    table_cfg(&tc, 4, 64u << 10); /* a small filter: the stream has FILT blocks too */
    mt_table_t *a = build_table(&tc, 3000, 1), *b = build_table(&tc, 1000, 2);
    uint8_t meta[1000];
    for (size_t i = 0; i < sizeof(meta); i++)
        meta[i] = (uint8_t)(i * 7 + 3);
    mt_store_config_t sc;
    small_cfg(&sc, 3);
    mt_store_t *s = open_store(&sc);
    mt_store_table_t tabs[2] = {{"emb", a, 0}, {"bias", b, 0}};
    mt_store_result_t res;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t before_ms = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
    save_ok(s, 1, tabs, 2, meta, sizeof(meta), &res);
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t after_ms = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;

    size_t sa = 0, sb = 0;
    cr_assert_eq(mt_table_save(a, count_write, &sa), MT_OK);
    cr_assert_eq(mt_table_save(b, count_write, &sb), MT_OK);
    size_t ca = (sa + (64u << 10) - 1) / (64u << 10), cb = (sb + (64u << 10) - 1) / (64u << 10);
    cr_assert_eq(res.rows, 4000);
    cr_assert_eq(res.bytes, sa + sb);
    cr_assert_eq(res.chunks, ca + cb);
    cr_assert_geq(ca, 3, "want several chunks per stream (got %zu)", ca);
    cr_assert_eq(res.pruned, 0);
    cr_assert_eq(res.prune_err, MT_OK);
    cr_assert_gt(res.seconds, 0.0);

    mt_table_t *la = load_ok(s, "emb", &tc, 1), *lb = load_ok(s, "bias", &tc, 1);
    assert_same(a, la, 3000, 1);
    assert_same(b, lb, 1000, 2);
    mt_table_destroy(la);
    mt_table_destroy(lb);

    mt_table_t *t = SENTINEL;
    char eb[256] = "";
    cr_assert_eq(mt_store_load_table(s, 1, "nope", &tc, &t, eb, sizeof(eb)), MT_NOT_FOUND);
    cr_assert_eq(t, SENTINEL);
    cr_assert(strstr(eb, "nope"), "message: %s", eb);
    cr_assert_eq(mt_store_load_table(s, 2, "emb", &tc, &t, NULL, 0), MT_NOT_FOUND);
    cr_assert_eq(mt_store_load_table(s, 1, "bad/name", &tc, &t, NULL, 0), MT_INVALID);
    cr_assert_eq(t, SENTINEL);
    t = NULL;
    cr_assert_eq(mt_store_load_table(s, 1, "bias", &tc, &t, NULL, 0), MT_OK);
    assert_same(b, t, 1000, 2);
    mt_table_destroy(t);

    mt_store_info_t info[4];
    size_t n = 0;
    cr_assert_eq(mt_store_list(s, info, 4, &n, NULL, 0), MT_OK);
    cr_assert_eq(n, 1);
    cr_assert_eq(info[0].checkpoint_id, 1);
    cr_assert_eq(info[0].ntables, 2);
    cr_assert_eq(info[0].rows, 4000);
    cr_assert_eq(info[0].bytes, sa + sb);
    cr_assert_eq(info[0].meta_bytes, sizeof(meta));
    cr_assert(info[0].created_ms >= before_ms && info[0].created_ms <= after_ms);
    mt_store_close(s);

    /* The documented layout, read behind the store's back. */
    raw_t r;
    raw_open(&r);
    size_t len = 0;
    char *v = raw_get(&r, CF_DEFAULT, "current", &len);
    cr_assert_not_null(v);
    cr_assert_str_eq(v, "00000000000000000001");
    free(v);
    v = raw_get(&r, CF_DEFAULT, "format", &len);
    cr_assert_not_null(v);
    cr_assert_str_eq(v, "1");
    free(v);
    char k[128];
    ckpt_key(k, sizeof(k), 1, "complete");
    v = raw_get(&r, CF_DEFAULT, k, &len);
    cr_assert_not_null(v);
    cr_assert_eq(memcmp(v, "MTSTORE\0", 8), 0);
    free(v);
    ckpt_key(k, sizeof(k), 1, "meta");
    v = raw_get(&r, CF_DATA, k, &len);
    cr_assert_not_null(v);
    cr_assert_eq(len, sizeof(meta));
    cr_assert_eq(memcmp(v, meta, len), 0);
    free(v);
    ckpt_key(k, sizeof(k), 1, "emb/0000000000");
    v = raw_get(&r, CF_DATA, k, &len);
    cr_assert_not_null(v, "no key %s", k);
    cr_assert_eq(len, 64u << 10);
    cr_assert_eq(memcmp(v, "MTTABLE\0", 8), 0, "chunk 0 starts the table stream");
    free(v);
    size_t lens[64];
    const char *names[2] = {"emb/", "bias/"};
    size_t want[2] = {sa, sb}, wantc[2] = {ca, cb};
    for (int ti = 0; ti < 2; ti++) {
        ckpt_key(k, sizeof(k), 1, names[ti]);
        size_t nc = raw_count(&r, CF_DATA, k, lens, 64);
        cr_assert_eq(nc, wantc[ti]);
        size_t sum = 0;
        for (size_t i = 0; i < nc; i++) {
            sum += lens[i];
            if (i + 1 < nc) cr_assert_eq(lens[i], 64u << 10, "chunk %zu of %s", i, names[ti]);
        }
        cr_assert_eq(sum, want[ti]);
    }
    ckpt_key(k, sizeof(k), 1, "");
    cr_assert_eq(raw_count(&r, CF_DATA, k, NULL, 0), ca + cb + 1); /* + meta */
    cr_assert_eq(raw_count(&r, CF_DEFAULT, k, NULL, 0), 1);        /* complete */
    cr_assert_eq(tmp_files(), 0);
    raw_close(&r);
    mt_table_destroy(a);
    mt_table_destroy(b);
}

/* ============================== metadata ============================== */

Test(store, metadata_round_trip) {
    mt_table_config_t tc;
    table_cfg(&tc, 2, 0);
    mt_table_t *a = build_table(&tc, 200, 3);
    mt_store_config_t sc;
    small_cfg(&sc, 5);
    mt_store_t *s = open_store(&sc);
    uint8_t meta[777];
    for (size_t i = 0; i < sizeof(meta); i++)
        meta[i] = (uint8_t)(rand() & 0xFF);
    save_ok(s, 5, NULL, 0, meta, sizeof(meta), NULL); /* metadata only */
    mt_store_table_t tabs[1] = {{"emb", a, 0}};
    save_ok(s, 6, tabs, 1, NULL, 0, NULL); /* a table, empty metadata */

    uint64_t id = 0;
    void *buf = NULL;
    size_t len = 99;
    char eb[256] = "";
    cr_assert_eq(mt_store_load_meta(s, &id, &buf, &len, eb, sizeof(eb)), MT_OK, "%s", eb);
    cr_assert_eq(id, 6);
    cr_assert_eq(len, 0);
    cr_assert_not_null(buf);
    free(buf);
    id = 5;
    buf = NULL;
    cr_assert_eq(mt_store_load_meta(s, &id, &buf, &len, eb, sizeof(eb)), MT_OK, "%s", eb);
    cr_assert_eq(id, 5);
    cr_assert_eq(len, sizeof(meta));
    cr_assert_eq(memcmp(buf, meta, len), 0);
    free(buf);
    id = 4;
    buf = NULL;
    cr_assert_eq(mt_store_load_meta(s, &id, &buf, &len, NULL, 0), MT_NOT_FOUND);
    cr_assert_null(buf);
    cr_assert_eq(id, 4);

    /* Checkpoint 5 has no table. */
    mt_table_t *t = SENTINEL;
    cr_assert_eq(mt_store_load_table(s, 5, "emb", &tc, &t, NULL, 0), MT_NOT_FOUND);
    cr_assert_eq(t, SENTINEL);
    t = load_ok(s, "emb", &tc, 6);
    assert_same(a, t, 200, 3);
    mt_table_destroy(t);

    mt_store_info_t info[4];
    size_t n = 0;
    cr_assert_eq(mt_store_list(s, info, 1, &n, NULL, 0), MT_OK);
    cr_assert_eq(n, 2, "n counts all, beyond cap");
    cr_assert_eq(info[0].checkpoint_id, 5);
    cr_assert_eq(info[0].ntables, 0);
    cr_assert_eq(info[0].meta_bytes, sizeof(meta));
    mt_store_close(s);
    mt_table_destroy(a);
}

/* ============================== pruning ============================== */

Test(store, keep_two_of_five) {
    mt_table_config_t tc;
    table_cfg(&tc, 3, 0);
    mt_store_config_t sc;
    small_cfg(&sc, 2);
    mt_store_t *s = open_store(&sc);
    mt_table_t *tabs[6] = {0};
    for (uint64_t id = 1; id <= 5; id++) {
        tabs[id] = build_table(&tc, 500 * id, id);
        mt_store_table_t st[1] = {{"emb", tabs[id], 0}};
        char meta[32];
        int ml = snprintf(meta, sizeof(meta), "offsets-%" PRIu64, id);
        mt_store_result_t res;
        save_ok(s, id, st, 1, meta, (size_t)ml, &res);
        cr_assert_eq(res.pruned, id > 2 ? 1 : 0, "save %" PRIu64 " pruned %" PRIu64, id,
                     res.pruned);
        cr_assert_eq(res.prune_err, MT_OK);
        uint64_t ids[8];
        size_t n = list_ids(s, ids, 8);
        cr_assert_eq(n, id < 2 ? id : 2);
        cr_assert_eq(ids[n - 1], id);
        cr_assert_eq(current_id(s), id);
    }
    uint64_t ids[8];
    cr_assert_eq(list_ids(s, ids, 8), 2);
    cr_assert_eq(ids[0], 4);
    cr_assert_eq(ids[1], 5);
    mt_table_t *t = SENTINEL;
    for (uint64_t id = 1; id <= 3; id++) {
        cr_assert_eq(mt_store_load_table(s, id, "emb", &tc, &t, NULL, 0), MT_NOT_FOUND);
        uint64_t mid = id;
        void *buf = NULL;
        size_t len = 0;
        cr_assert_eq(mt_store_load_meta(s, &mid, &buf, &len, NULL, 0), MT_NOT_FOUND);
    }
    cr_assert_eq(t, SENTINEL);
    t = NULL;
    cr_assert_eq(mt_store_load_table(s, 4, "emb", &tc, &t, NULL, 0), MT_OK);
    assert_same(tabs[4], t, 2000, 4);
    mt_table_destroy(t);
    t = load_ok(s, "emb", &tc, 5);
    assert_same(tabs[5], t, 2500, 5);
    mt_table_destroy(t);
    uint64_t mid = 0;
    void *buf = NULL;
    size_t len = 0;
    cr_assert_eq(mt_store_load_meta(s, &mid, &buf, &len, NULL, 0), MT_OK);
    cr_assert_eq(mid, 5);
    cr_assert_eq(len, strlen("offsets-5"));
    cr_assert_eq(memcmp(buf, "offsets-5", len), 0);
    free(buf);
    mt_store_close(s);
    for (uint64_t id = 1; id <= 3; id++)
        cr_assert_eq(raw_ckpt_keys(id), 0, "keys of pruned checkpoint %" PRIu64 " remain", id);
    cr_assert_gt(raw_ckpt_keys(4), 2);
    cr_assert_gt(raw_ckpt_keys(5), 2);
    for (int i = 1; i <= 5; i++)
        mt_table_destroy(tabs[i]);
}

/* ============================== incremental checkpoints ============================== */

/* Gradients on rows [0, ngrad) of seed 1, rows [r0, r0 + nrem) removed, nnew rows of seed
 * snew assigned: a mix of updates, deletions and inserts for a change stream. */
static void mutate(mt_table_t *t, size_t ngrad, size_t r0, size_t nrem, uint64_t snew, size_t nnew,
                   uint32_t now) {
    enum { BATCH = 256 };
    uint64_t fids[BATCH];
    float v[BATCH * 8];
    for (size_t off = 0; off < ngrad; off += BATCH) {
        size_t m = ngrad - off < BATCH ? ngrad - off : BATCH, nv = 0;
        for (size_t j = 0; j < m; j++) {
            fids[j] = fid_of(off + j, 1);
            for (uint32_t k = 0; k < dim_of(fids[j]); k++)
                v[nv++] = 0.003f * (float)(k + 1) + 0.0001f * (float)now;
        }
        cr_assert_eq(mt_table_apply(t, fids, m, v, nv, now, NULL), MT_OK);
    }
    for (size_t i = 0; i < nrem; i++) {
        uint64_t f = fid_of(r0 + i, 1);
        cr_assert_eq(mt_table_remove(t, &f, 1, NULL), MT_OK);
    }
    for (size_t off = 0; off < nnew; off += BATCH) {
        size_t m = nnew - off < BATCH ? nnew - off : BATCH, nv = 0;
        for (size_t j = 0; j < m; j++) {
            fids[j] = fid_of(off + j, snew);
            for (uint32_t k = 0; k < dim_of(fids[j]); k++)
                v[nv++] = 0.25f - 0.01f * (float)k;
        }
        cr_assert_eq(mt_table_assign(t, fids, m, v, nv, now, NULL), MT_OK);
    }
}

/* Every id of seeds 1 (n1 of them) and 7, 8 (nnew each) has the same row, or none, in a
 * and b; and both hold as many rows. */
static void assert_same_ids(mt_table_t *a, mt_table_t *b, size_t n1, size_t nnew) {
    cr_assert_eq(table_rows(a), table_rows(b), "rows %" PRIu64 " vs %" PRIu64, table_rows(a),
                 table_rows(b));
    for (int pass = 0; pass < 3; pass++) {
        size_t n = pass ? nnew : n1;
        uint64_t seed = pass == 0 ? 1 : pass == 1 ? 7 : 8;
        for (size_t i = 0; i < n; i++) {
            uint64_t fid = fid_of(i, seed);
            float ea[8], eb[8], sa[32], sb[32];
            uint32_t ta = 0, tb = 0, ca = 0, cb = 0, ns = 0;
            uint64_t va = 0, vb = 0;
            cr_assert_eq(mt_table_state_floats(a, fid, &ns), MT_OK);
            mt_err_t xa = mt_table_get_row(a, fid, ea, sa, ns, &ta, &ca, &va);
            mt_err_t xb = mt_table_get_row(b, fid, eb, sb, ns, &tb, &cb, &vb);
            cr_assert_eq(xa, xb, "id %zu of seed %" PRIu64 ": %s vs %s", i, seed, mt_err_name(xa),
                         mt_err_name(xb));
            if (xa) continue;
            cr_assert_eq(memcmp(ea, eb, dim_of(fid) * sizeof(float)), 0, "embedding %zu", i);
            cr_assert_eq(memcmp(sa, sb, ns * sizeof(float)), 0, "state %zu", i);
            cr_assert_eq(ta, tb);
            cr_assert_eq(ca, cb);
        }
    }
}

static uint64_t table_version(mt_table_t *t) { /* the next change stream's since */
    return mt_table_changes_cursor(t);
}

/* Each checkpoint holds the live table twice: "emb" as its changes since the previous
 * checkpoint (after the first), "ref" whole. A load of "emb" (the chain) must give "ref". */
Test(store, incremental_chain_loads_prunes_and_refuses) {
    mt_table_config_t tc;
    table_cfg(&tc, 3, 0);
    mt_store_config_t sc;
    small_cfg(&sc, 2);
    mt_store_t *s = open_store(&sc);
    enum { N1 = 3000, NNEW = 400 };
    mt_table_t *a = build_table(&tc, N1, 1);
    char eb[512] = "";
    /* changes with no checkpoint to apply onto: refused */
    mt_store_table_t d0[1] = {{"emb", a, 5}};
    cr_assert_eq(mt_store_save(s, 1, d0, 1, NULL, 0, NULL, eb, sizeof(eb)), MT_INVALID);
    cr_log_info("%s", eb);
    uint64_t v = table_version(a);
    mt_store_table_t t1[2] = {{"emb", a, 0}, {"ref", a, 0}};
    mt_store_result_t whole, r2, r3;
    save_ok(s, 1, t1, 2, "m1", 2, &whole);
    mutate(a, 200, 1000, 100, 7, NNEW, 3000);
    uint64_t v2 = table_version(a);
    mt_store_table_t t2[2] = {{"emb", a, v}, {"ref", a, 0}};
    save_ok(s, 2, t2, 2, "m2", 2, &r2);
    mutate(a, 100, 1100, 50, 8, NNEW, 4000);
    uint64_t v3 = table_version(a);
    mt_store_table_t t3[2] = {{"emb", a, v2}, {"ref", a, 0}};
    save_ok(s, 3, t3, 2, "m3", 2, &r3);
    /* a change stream is small: about the rows changed (two tables: "ref" is whole) */
    cr_log_info("whole %" PRIu64 " bytes (two tables), with changes %" PRIu64 " and %" PRIu64,
                whole.bytes, r2.bytes, r3.bytes);
    cr_assert_lt(r2.bytes, whole.bytes * 3 / 4);
    /* keep 2, but 3 needs 2 and 1: all listed, with their parents */
    mt_store_info_t info[8];
    size_t n = 0;
    cr_assert_eq(mt_store_list(s, info, 8, &n, eb, sizeof(eb)), MT_OK, "%s", eb);
    cr_assert_eq(n, 3);
    cr_assert_eq(info[0].parent, 0);
    cr_assert_eq(info[1].parent, 1);
    cr_assert_eq(info[2].parent, 2);
    for (uint64_t id = 1; id <= 3; id++) {
        mt_table_t *e = NULL, *r = NULL;
        cr_assert_eq(mt_store_load_table(s, id, "emb", &tc, &e, eb, sizeof(eb)), MT_OK,
                     "checkpoint %" PRIu64 ": %s", id, eb);
        cr_assert_eq(mt_store_load_table(s, id, "ref", &tc, &r, eb, sizeof(eb)), MT_OK, "%s", eb);
        assert_same_ids(r, e, N1, NNEW);
        if (id == 3) assert_same_ids(a, e, N1, NNEW);
        mt_table_destroy(e);
        mt_table_destroy(r);
    }
    /* a loaded table cannot give its changes since a version of its previous life */
    mt_table_t *l = load_ok(s, "emb", &tc, 3);
    mt_store_table_t tl[1] = {{"emb", l, v3}};
    cr_assert_eq(mt_store_save(s, 4, tl, 1, NULL, 0, NULL, eb, sizeof(eb)), MT_FULL_SYNC);
    cr_log_info("%s", eb);
    cr_assert_eq(current_id(s), 3);
    mt_table_destroy(l);
    /* whole ones again: the chain goes once no kept checkpoint needs it */
    mt_store_table_t tw[1] = {{"emb", a, 0}};
    save_ok(s, 4, tw, 1, NULL, 0, NULL);
    uint64_t ids[8];
    cr_assert_eq(list_ids(s, ids, 8), 4, "4 and 3 kept, 3 needs 2 and 1");
    uint64_t v5 = table_version(a);
    save_ok(s, 5, tw, 1, NULL, 0, NULL);
    cr_assert_eq(list_ids(s, ids, 8), 2);
    cr_assert_eq(ids[0], 4);
    cr_assert_eq(ids[1], 5);
    /* a chain whose start is gone: the load says which */
    mutate(a, 50, 1200, 10, 9, 10, 5000);
    mt_store_table_t t6[1] = {{"emb", a, v5}};
    save_ok(s, 6, t6, 1, NULL, 0, NULL);
    mt_store_close(s);
    raw_t raw;
    raw_open(&raw);
    char k[128];
    ckpt_key(k, sizeof(k), 5, "complete");
    raw_del(&raw, CF_DEFAULT, k);
    raw_close(&raw);
    s = open_store(&sc);
    cr_assert_eq(load_fails(s, "emb", &tc), MT_CORRUPT);
    mt_store_close(s);
    mt_table_destroy(a);
}

/* ============================== argument checks ============================== */

Test(store, ids_must_increase_and_names_are_checked) {
    mt_table_config_t tc;
    table_cfg(&tc, 2, 0);
    mt_table_t *a = build_table(&tc, 100, 1);
    mt_store_config_t sc;
    small_cfg(&sc, 3);
    mt_store_t *s = open_store(&sc);
    mt_store_table_t one[1] = {{"emb", a, 0}};
    save_ok(s, 3, one, 1, "m", 1, NULL);
    char eb[256] = "";
    cr_assert_eq(mt_store_save(s, 3, one, 1, NULL, 0, NULL, eb, sizeof(eb)), MT_INVALID);
    cr_assert(strstr(eb, "not above"), "message: %s", eb);
    cr_assert_eq(mt_store_save(s, 2, one, 1, NULL, 0, NULL, NULL, 0), MT_INVALID);
    cr_assert_eq(mt_store_save(s, 0, one, 1, NULL, 0, NULL, NULL, 0), MT_INVALID);
    char longname[MT_STORE_MAX_NAME + 2];
    memset(longname, 'x', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = 0;
    const char *bad[] = {"", "a/b", "bad name", "ümlaut", longname};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        mt_store_table_t bt[1] = {{bad[i], a, 0}};
        eb[0] = 0;
        cr_assert_eq(mt_store_save(s, 4, bt, 1, NULL, 0, NULL, eb, sizeof(eb)), MT_INVALID,
                     "name '%s'", bad[i]);
        cr_assert_neq(eb[0], 0);
    }
    mt_store_table_t nul[1] = {{NULL, a, 0}};
    cr_assert_eq(mt_store_save(s, 4, nul, 1, NULL, 0, NULL, NULL, 0), MT_INVALID);
    mt_store_table_t notab[1] = {{"emb", NULL, 0}};
    cr_assert_eq(mt_store_save(s, 4, notab, 1, NULL, 0, NULL, NULL, 0), MT_INVALID);
    mt_store_table_t dup[2] = {{"emb", a, 0}, {"emb", a, 0}};
    cr_assert_eq(mt_store_save(s, 4, dup, 2, NULL, 0, NULL, eb, sizeof(eb)), MT_INVALID);
    cr_assert(strstr(eb, "twice"), "message: %s", eb);
    cr_assert_eq(mt_store_save(s, 4, one, 1, NULL, 5, NULL, NULL, 0), MT_INVALID);
    cr_assert_eq(mt_store_save(s, 4, NULL, 1, NULL, 0, NULL, NULL, 0), MT_INVALID);
    uint64_t ids[4];
    cr_assert_eq(list_ids(s, ids, 4), 1);
    cr_assert_eq(ids[0], 3);
    cr_assert_eq(current_id(s), 3);

    /* The longest name and every allowed character. */
    longname[MT_STORE_MAX_NAME] = 0;
    memcpy(longname, "AZaz09_.-", 9);
    mt_store_table_t ok[2] = {{longname, a, 0}, {"x", a, 0}};
    save_ok(s, 4, ok, 2, NULL, 0, NULL);
    mt_table_t *t = load_ok(s, longname, &tc, 4);
    assert_same(a, t, 100, 1);
    mt_table_destroy(t);
    mt_store_close(s);
    mt_table_destroy(a);
}

/* ============================== failures and crashes ============================== */

typedef struct hook_arg {
    mt__store_hook_phase_t phase; /* where to act */
    uint64_t at;                  /* with MT__STORE_HOOK_CHUNK: at which chunk */
    int kill;                     /* 1: SIGKILL this process; 0: fail with MT_IO */
    int called;                   /* times the hook acted */
} hook_arg_t;

static mt_err_t hook(void *ud, mt__store_hook_phase_t phase, uint64_t chunks) {
    hook_arg_t *h = ud;
    if (phase != h->phase || (phase == MT__STORE_HOOK_CHUNK && chunks != h->at)) return MT_OK;
    h->called++;
    if (h->kill) kill(getpid(), SIGKILL);
    return MT_IO;
}

/* A save of b as checkpoint 2 fails at phase (after checkpoint 1 = a): checkpoint 1 stays
 * current and loadable, and nothing of checkpoint 2 is left. */
static void fail_second_save(mt__store_hook_phase_t phase) {
    mt_table_config_t tc;
    table_cfg(&tc, 3, 0);
    mt_table_t *a = build_table(&tc, 2000, 1), *b = build_table(&tc, 5000, 2);
    mt_store_config_t sc;
    small_cfg(&sc, 3);
    mt_store_t *s = open_store(&sc);
    mt_store_table_t ta[1] = {{"emb", a, 0}}, tb[1] = {{"emb", b, 0}};
    save_ok(s, 1, ta, 1, "one", 3, NULL);

    hook_arg_t h = {.phase = phase, .at = 3};
    mt__store_set_hook(s, hook, &h);
    char eb[256] = "";
    mt_store_result_t res;
    cr_assert_eq(mt_store_save(s, 2, tb, 1, "two", 3, &res, eb, sizeof(eb)), MT_IO);
    cr_assert_eq(h.called, 1);
    cr_assert(strstr(eb, "hook"), "message: %s", eb);
    if (phase == MT__STORE_HOOK_CHUNK) cr_assert_eq(res.chunks, 3);
    mt__store_set_hook(s, NULL, NULL);
    cr_assert_eq(tmp_files(), 0, "the unfinished SST file was not deleted");
    cr_assert_eq(current_id(s), 1);
    uint64_t ids[4];
    cr_assert_eq(list_ids(s, ids, 4), 1);
    cr_assert_eq(ids[0], 1);
    mt_table_t *t = load_ok(s, "emb", &tc, 1);
    assert_same(a, t, 2000, 1);
    mt_table_destroy(t);
    t = SENTINEL;
    cr_assert_eq(mt_store_load_table(s, 2, "emb", &tc, &t, NULL, 0), MT_NOT_FOUND);
    cr_assert_eq(t, SENTINEL);
    uint64_t mid = 0;
    void *buf = NULL;
    size_t len = 0;
    cr_assert_eq(mt_store_load_meta(s, &mid, &buf, &len, NULL, 0), MT_OK);
    cr_assert_eq(len, 3);
    cr_assert_eq(memcmp(buf, "one", 3), 0);
    free(buf);
    mt_store_close(s);
    cr_assert_eq(raw_ckpt_keys(2), 0, "the failed save's data was not deleted");

    /* After a reopen: the same, and the retried save works. */
    s = open_store(&sc);
    t = load_ok(s, "emb", &tc, 1);
    assert_same(a, t, 2000, 1);
    mt_table_destroy(t);
    save_ok(s, 2, tb, 1, "two", 3, NULL);
    t = load_ok(s, "emb", &tc, 2);
    assert_same(b, t, 5000, 2);
    mt_table_destroy(t);
    mt_store_close(s);
    mt_table_destroy(a);
    mt_table_destroy(b);
}

Test(store, save_failing_mid_stream_keeps_the_previous_checkpoint) {
    fail_second_save(MT__STORE_HOOK_CHUNK);
}

Test(store, save_failing_before_commit_keeps_the_previous_checkpoint) {
    fail_second_save(MT__STORE_HOOK_INGESTED);
}

/* The child of the crash tests: saves checkpoint 1, then dies by SIGKILL in checkpoint 2 at
 * h. Exit codes (rather than death by SIGKILL) tell the parent what went wrong. */
static int crash_child(hook_arg_t h) {
    mt_table_config_t tc;
    table_cfg(&tc, 3, 0);
    mt_store_config_t sc;
    small_cfg(&sc, 2);
    mt_store_t *s = NULL;
    if (mt_store_open(g_db, &sc, &s, NULL, 0) != MT_OK) return 10;
    mt_table_t *a = build_table(&tc, 3000, 1), *b = build_table(&tc, 8000, 2);
    mt_store_table_t ta[1] = {{"emb", a, 0}}, tb[1] = {{"emb", b, 0}};
    if (mt_store_save(s, 1, ta, 1, "one", 3, NULL, NULL, 0) != MT_OK) return 11;
    mt__store_set_hook(s, hook, &h);
    mt_store_save(s, 2, tb, 1, "two", 3, NULL, NULL, 0);
    return 12; /* not reached */
}

/* Runs crash_child() in a child process; checks what is on disk after the crash (current
 * is 1, no commit record of 2; data of 2 left as expected) and recovery: checkpoint 1 loads
 * after reopening, and the next save deletes every leftover. */
static void crash_and_recover(mt__store_hook_phase_t phase) {
    /* No RocksDB in this process before the fork: its thread pool would not survive it. */
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) _exit(crash_child((hook_arg_t){.phase = phase, .at = 5, .kill = 1}));
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "child did not crash: status %#x", st);

    /* What the crash left on disk. */
    if (phase == MT__STORE_HOOK_CHUNK) cr_assert_eq(tmp_files(), 1, "the unfinished SST file");
    raw_t r;
    raw_open(&r);
    size_t len = 0;
    char *v = raw_get(&r, CF_DEFAULT, "current", &len);
    cr_assert_not_null(v);
    cr_assert_str_eq(v, "00000000000000000001");
    free(v);
    char k[128];
    ckpt_key(k, sizeof(k), 2, "complete");
    cr_assert_null(raw_get(&r, CF_DEFAULT, k, &len));
    ckpt_key(k, sizeof(k), 2, "emb/");
    size_t left = raw_count(&r, CF_DATA, k, NULL, 0);
    if (phase == MT__STORE_HOOK_INGESTED)
        cr_assert_gt(left, 5, "the crash left %zu chunks of checkpoint 2", left);
    else
        cr_assert_eq(left, 0);
    raw_close(&r);

    mt_table_config_t tc;
    table_cfg(&tc, 3, 0);
    mt_store_config_t sc;
    small_cfg(&sc, 2);
    mt_store_t *s = open_store(&sc);
    cr_assert_eq(tmp_files(), 0, "open did not delete the unfinished SST file");
    cr_assert_eq(current_id(s), 1);
    uint64_t ids[4];
    cr_assert_eq(list_ids(s, ids, 4), 1);
    cr_assert_eq(ids[0], 1);
    mt_table_t *a = build_table(&tc, 3000, 1);
    mt_table_t *t = load_ok(s, "emb", &tc, 1);
    assert_same(a, t, 3000, 1);
    mt_table_destroy(t);
    t = SENTINEL;
    cr_assert_eq(mt_store_load_table(s, 2, "emb", &tc, &t, NULL, 0), MT_NOT_FOUND);
    cr_assert_eq(t, SENTINEL);

    /* The next save deletes the leftovers and keeps 1 (keep 2). */
    mt_table_t *c = build_table(&tc, 1000, 3);
    mt_store_table_t tcs[1] = {{"emb", c, 0}};
    mt_store_result_t res;
    save_ok(s, 3, tcs, 1, "three", 5, &res);
    cr_assert_eq(res.pruned, phase == MT__STORE_HOOK_INGESTED ? 1 : 0);
    cr_assert_eq(list_ids(s, ids, 4), 2);
    cr_assert_eq(ids[0], 1);
    cr_assert_eq(ids[1], 3);
    t = load_ok(s, "emb", &tc, 3);
    assert_same(c, t, 1000, 3);
    mt_table_destroy(t);
    mt_store_close(s);
    cr_assert_eq(raw_ckpt_keys(2), 0);
    mt_table_destroy(a);
    mt_table_destroy(c);
}

Test(store, crash_mid_stream_leaves_previous_current) {
    crash_and_recover(MT__STORE_HOOK_CHUNK);
}

Test(store, crash_after_ingest_before_commit_leaves_previous_current) {
    crash_and_recover(MT__STORE_HOOK_INGESTED);
}

Test(store, leftovers_are_deleted_by_the_next_save) {
    mt_table_config_t tc;
    table_cfg(&tc, 2, 0);
    mt_table_t *a = build_table(&tc, 1500, 1), *b = build_table(&tc, 1500, 2);
    mt_store_config_t sc;
    small_cfg(&sc, 3);
    mt_store_t *s = open_store(&sc);
    mt_store_table_t ta[1] = {{"emb", a, 0}}, tb[1] = {{"emb", b, 0}};
    save_ok(s, 1, ta, 1, NULL, 0, NULL);
    mt_store_close(s);

    /* What crashed saves could have left: a stray chunk under the id of the next save (it
     * would be read as part of its table) and an incomplete higher id. */
    raw_t r;
    raw_open(&r);
    char k[128];
    ckpt_key(k, sizeof(k), 2, "emb/0000000099");
    raw_put(&r, CF_DATA, k, "junk", 4);
    ckpt_key(k, sizeof(k), 2, "meta");
    raw_put(&r, CF_DATA, k, "x", 1);
    ckpt_key(k, sizeof(k), 7, "emb/0000000000");
    raw_put(&r, CF_DATA, k, "junk", 4);
    raw_close(&r);

    s = open_store(&sc);
    uint64_t ids[4];
    cr_assert_eq(list_ids(s, ids, 4), 1, "incomplete checkpoints are not listed");
    mt_store_result_t res;
    save_ok(s, 2, tb, 1, NULL, 0, &res);
    cr_assert_eq(res.pruned, 1, "checkpoint 7's leftovers");
    cr_assert_eq(list_ids(s, ids, 4), 2);
    cr_assert_eq(ids[0], 1);
    cr_assert_eq(ids[1], 2);
    mt_table_t *t = load_ok(s, "emb", &tc, 2);
    assert_same(b, t, 1500, 2);
    mt_table_destroy(t);
    mt_store_close(s);
    cr_assert_eq(raw_ckpt_keys(7), 0);
    raw_open(&r);
    size_t len = 0;
    ckpt_key(k, sizeof(k), 2, "emb/0000000099");
    cr_assert_null(raw_get(&r, CF_DATA, k, &len));
    raw_close(&r);
    mt_table_destroy(a);
    mt_table_destroy(b);
}

/* ============================== rollback ============================== */

/* mt_store_rollback(): a coordinator takes a shard back to an older complete checkpoint. */
Test(store, rollback_makes_an_older_checkpoint_current_and_drops_the_newer) {
    mt_table_config_t tc;
    table_cfg(&tc, 2, 0);
    mt_store_config_t sc;
    small_cfg(&sc, 5);
    mt_store_t *s = open_store(&sc);
    mt_table_t *tabs[5] = {0};
    for (uint64_t id = 1; id <= 4; id++) {
        tabs[id] = build_table(&tc, 300 * id, id);
        mt_store_table_t st[1] = {{"emb", tabs[id], 0}};
        char meta[16];
        int ml = snprintf(meta, sizeof(meta), "m%" PRIu64, id);
        save_ok(s, id, st, 1, meta, (size_t)ml, NULL);
    }
    s = (mt_store_close(s), NULL);
    /* a leftover of a failed save above them: deleted by the rollback too */
    raw_t r;
    char k[128];
    raw_open(&r);
    ckpt_key(k, sizeof(k), 9, "emb/0000000000");
    raw_put(&r, CF_DATA, k, "junk", 4);
    raw_close(&r);
    s = open_store(&sc);

    char eb[256] = "";
    uint64_t dropped = 99;
    cr_assert_eq(mt_store_rollback(s, 7, &dropped, eb, sizeof(eb)), MT_NOT_FOUND, "no such id");
    cr_assert_eq(dropped, 0);
    cr_assert_eq(current_id(s), 4, "a failed rollback changes nothing");
    cr_assert_eq(mt_store_rollback(s, 2, &dropped, eb, sizeof(eb)), MT_OK, "%s", eb);
    cr_assert_eq(dropped, 3, "3 and 4 and the leftover 9");
    cr_assert_eq(current_id(s), 2);
    uint64_t ids[8];
    cr_assert_eq(list_ids(s, ids, 8), 2);
    cr_assert_eq(ids[0], 1);
    cr_assert_eq(ids[1], 2);
    mt_table_t *t = load_ok(s, "emb", &tc, 2);
    assert_same(tabs[2], t, 600, 2);
    mt_table_destroy(t);
    uint64_t mid = 0;
    void *buf = NULL;
    size_t len = 0;
    cr_assert_eq(mt_store_load_meta(s, &mid, &buf, &len, NULL, 0), MT_OK);
    cr_assert_eq(mid, 2);
    cr_assert_eq(len, 2);
    cr_assert_eq(memcmp(buf, "m2", 2), 0);
    free(buf);
    uint64_t old = 3;
    cr_assert_eq(mt_store_load_meta(s, &old, &buf, &len, NULL, 0), MT_NOT_FOUND);
    /* the ids above are free again, and a save there is current */
    mt_store_table_t st3[1] = {{"emb", tabs[3], 0}};
    save_ok(s, 3, st3, 1, "m3", 2, NULL);
    cr_assert_eq(current_id(s), 3);
    t = load_ok(s, "emb", &tc, 3);
    assert_same(tabs[3], t, 900, 3);
    mt_table_destroy(t);
    /* durable across a reopen; then 0 deletes everything */
    mt_store_close(s);
    cr_assert_eq(raw_ckpt_keys(4), 0, "keys of a dropped checkpoint remain");
    cr_assert_eq(raw_ckpt_keys(9), 0, "keys of the leftover remain");
    s = open_store(&sc);
    cr_assert_eq(current_id(s), 3);
    cr_assert_eq(mt_store_rollback(s, 0, &dropped, eb, sizeof(eb)), MT_OK, "%s", eb);
    cr_assert_eq(dropped, 3);
    uint64_t cur = 0;
    cr_assert_eq(mt_store_current(s, &cur, NULL, 0), MT_NOT_FOUND);
    cr_assert_eq(list_ids(s, ids, 8), 0);
    mt_table_t *none = SENTINEL;
    cr_assert_eq(mt_store_load_latest(s, "emb", &tc, &none, NULL, NULL, 0), MT_NOT_FOUND);
    cr_assert_eq(none, SENTINEL);
    save_ok(s, 1, st3, 1, NULL, 0, NULL); /* a store with no checkpoint takes any id */
    cr_assert_eq(current_id(s), 1);
    mt_store_close(s);
    /* read-only stores refuse */
    sc.read_only = 1;
    s = open_store(&sc);
    cr_assert_eq(mt_store_rollback(s, 1, NULL, NULL, 0), MT_INVALID);
    mt_store_close(s);
    for (int i = 1; i <= 4; i++)
        mt_table_destroy(tabs[i]);
}

/* ============================== reopen ============================== */

Test(store, durable_across_reopen_and_read_only) {
    mt_table_config_t tc;
    table_cfg(&tc, 10, 0); /* the default part count */
    mt_table_t *a = build_table(&tc, 4000, 1), *b = build_table(&tc, 3000, 2);
    mt_store_config_t sc;
    small_cfg(&sc, 3);
    mt_store_t *s = open_store(&sc);
    mt_store_table_t ta[1] = {{"emb", a, 0}}, tb[1] = {{"emb", b, 0}};
    save_ok(s, 10, ta, 1, "ten", 3, NULL);
    mt_store_close(s);

    s = open_store(&sc);
    cr_assert_eq(current_id(s), 10);
    mt_table_t *t = load_ok(s, "emb", &tc, 10);
    assert_same(a, t, 4000, 1);
    mt_table_destroy(t);
    save_ok(s, 11, tb, 1, "eleven", 6, NULL);
    mt_store_close(s);

    mt_store_config_t ro = sc;
    ro.read_only = 1;
    ro.create_if_missing = 0;
    s = open_store(&ro);
    uint64_t ids[4];
    cr_assert_eq(list_ids(s, ids, 4), 2);
    cr_assert_eq(ids[0], 10);
    cr_assert_eq(ids[1], 11);
    t = load_ok(s, "emb", &tc, 11);
    assert_same(b, t, 3000, 2);
    mt_table_destroy(t);
    char eb[256] = "";
    cr_assert_eq(mt_store_save(s, 12, ta, 1, NULL, 0, NULL, eb, sizeof(eb)), MT_INVALID);
    cr_assert(strstr(eb, "read-only"), "message: %s", eb);
    mt_store_close(s);
    mt_table_destroy(a);
    mt_table_destroy(b);
}

/* ============================== damage ============================== */

typedef enum damage {
    DMG_GARBAGE_CHUNK,  /* chunk 1 replaced by random bytes of the same size */
    DMG_FLIP_LAST,      /* one byte of the last chunk flipped */
    DMG_MISSING_CHUNK,  /* chunk 2 deleted */
    DMG_TRUNCATED_LAST, /* the last chunk loses its last 10 bytes */
    DMG_EXTRA_CHUNK,    /* a chunk after the last */
    DMG_SHORT_CHUNK,    /* chunk 0 loses its last byte (the stream shifts) */
    DMG_RECORD,         /* the commit record garbled */
    DMG_NO_RECORD,      /* the commit record deleted (current still points at it) */
    DMG_CURRENT,        /* current garbled */
    DMG_META,           /* the metadata changed */
    DMG_COUNT
} damage_t;

static const char *dmg_name[DMG_COUNT] = {
    "garbage chunk", "flipped byte",  "missing chunk",    "truncated last", "extra chunk",
    "short chunk",   "commit record", "no commit record", "current",        "metadata"};

/* Applies damage d to checkpoint 1 (nchunks chunks of "emb"); saves what it changes in
 * (keys, vals, lens) so that repair() can undo it. @returns the number of keys saved. */
static int damage(damage_t d, uint64_t nchunks, char keys[2][128], int cfs[2], char *vals[2],
                  size_t lens[2]) {
    raw_t r;
    raw_open(&r);
    char extra[32];
    int nk = 0;
    switch (d) {
    case DMG_GARBAGE_CHUNK: snprintf(extra, sizeof(extra), "emb/%010d", 1); break;
    case DMG_FLIP_LAST:
    case DMG_TRUNCATED_LAST: snprintf(extra, sizeof(extra), "emb/%010" PRIu64, nchunks - 1); break;
    case DMG_MISSING_CHUNK: snprintf(extra, sizeof(extra), "emb/%010d", 2); break;
    case DMG_EXTRA_CHUNK: snprintf(extra, sizeof(extra), "emb/%010" PRIu64, nchunks); break;
    case DMG_SHORT_CHUNK: snprintf(extra, sizeof(extra), "emb/%010d", 0); break;
    case DMG_RECORD:
    case DMG_NO_RECORD: snprintf(extra, sizeof(extra), "complete"); break;
    case DMG_META: snprintf(extra, sizeof(extra), "meta"); break;
    default: extra[0] = 0;
    }
    if (d == DMG_CURRENT)
        snprintf(keys[0], 128, "current");
    else
        ckpt_key(keys[0], 128, 1, extra);
    int cf = d == DMG_CURRENT || d == DMG_RECORD || d == DMG_NO_RECORD ? CF_DEFAULT : CF_DATA;
    cfs[0] = cf;
    vals[0] = raw_get(&r, cf, keys[0], &lens[0]);
    nk = 1;
    char *v = vals[0];
    size_t len = lens[0];
    char *nv = NULL;
    switch (d) {
    case DMG_GARBAGE_CHUNK:
        cr_assert_not_null(v);
        nv = malloc(len);
        for (size_t i = 0; i < len; i++)
            nv[i] = (char)(rand() & 0xFF);
        raw_put(&r, cf, keys[0], nv, len);
        break;
    case DMG_FLIP_LAST:
        cr_assert_not_null(v);
        nv = malloc(len);
        memcpy(nv, v, len);
        nv[len / 2] ^= 0x10;
        raw_put(&r, cf, keys[0], nv, len);
        break;
    case DMG_MISSING_CHUNK:
    case DMG_NO_RECORD:
        cr_assert_not_null(v);
        raw_del(&r, cf, keys[0]);
        break;
    case DMG_TRUNCATED_LAST:
        cr_assert_not_null(v);
        cr_assert_gt(len, 10);
        raw_put(&r, cf, keys[0], v, len - 10);
        break;
    case DMG_SHORT_CHUNK:
        cr_assert_not_null(v);
        raw_put(&r, cf, keys[0], v, len - 1);
        break;
    case DMG_EXTRA_CHUNK:
        cr_assert_null(v);
        raw_put(&r, cf, keys[0], "more", 4);
        break;
    case DMG_RECORD:
        cr_assert_not_null(v);
        nv = malloc(len);
        memcpy(nv, v, len);
        nv[20] ^= 1; /* inside the id: the record checksum catches it */
        raw_put(&r, cf, keys[0], nv, len);
        break;
    case DMG_CURRENT:
        cr_assert_not_null(v);
        raw_put(&r, cf, keys[0], "banana", 6);
        break;
    case DMG_META:
        cr_assert_not_null(v);
        raw_put(&r, cf, keys[0], "other", 5);
        break;
    default: break;
    }
    free(nv);
    raw_close(&r);
    return nk;
}

static void repair(int nk, char keys[2][128], const int cfs[2], char *vals[2], size_t lens[2]) {
    raw_t r;
    raw_open(&r);
    for (int i = 0; i < nk; i++) {
        if (vals[i])
            raw_put(&r, cfs[i], keys[i], vals[i], lens[i]);
        else
            raw_del(&r, cfs[i], keys[i]);
        free(vals[i]);
        vals[i] = NULL;
    }
    raw_close(&r);
}

Test(store, damage_is_an_error_never_a_half_loaded_table) {
    mt_table_config_t tc;
    table_cfg(&tc, 4, 32u << 10);
    mt_table_t *a = build_table(&tc, 4000, 1);
    mt_store_config_t sc;
    small_cfg(&sc, 3);
    mt_store_t *s = open_store(&sc);
    mt_store_table_t ta[1] = {{"emb", a, 0}};
    mt_store_result_t res;
    save_ok(s, 1, ta, 1, "meta-one", 8, &res);
    cr_assert_geq(res.chunks, 4, "want at least 4 chunks, got %" PRIu64, res.chunks);
    mt_store_close(s);

    for (int d = 0; d < DMG_COUNT; d++) {
        char keys[2][128];
        int cfs[2] = {0, 0};
        char *vals[2] = {NULL, NULL};
        size_t lens[2] = {0, 0};
        int nk = damage((damage_t)d, res.chunks, keys, cfs, vals, lens);
        s = open_store(&sc);
        cr_log_info("damage: %s", dmg_name[d]);
        if (d == DMG_META) {
            /* The tables are fine; the blob is not the one committed. */
            mt_table_t *t = load_ok(s, "emb", &tc, 1);
            mt_table_destroy(t);
            uint64_t id = 0;
            void *buf = (void *)1;
            size_t len = 0;
            char eb[256] = "";
            cr_assert_eq(mt_store_load_meta(s, &id, &buf, &len, eb, sizeof(eb)), MT_CORRUPT);
            cr_assert_eq(buf, (void *)1);
            cr_log_info("damaged meta: %s", eb);
        } else {
            mt_err_t err = load_fails(s, "emb", &tc);
            mt_err_t want = d == DMG_TRUNCATED_LAST ? MT_TRUNCATED : MT_CORRUPT;
            cr_assert_eq(err, want, "%s: got %s, want %s", dmg_name[d], mt_err_name(err),
                         mt_err_name(want));
            if (d == DMG_RECORD) {
                size_t n = 0;
                cr_assert_eq(mt_store_list(s, NULL, 0, &n, NULL, 0), MT_CORRUPT);
            }
            if (d == DMG_CURRENT) {
                uint64_t id = 0;
                cr_assert_eq(mt_store_current(s, &id, NULL, 0), MT_CORRUPT);
            }
        }
        mt_store_close(s);
        repair(nk, keys, cfs, vals, lens);
        s = open_store(&sc);
        mt_table_t *t = load_ok(s, "emb", &tc, 1);
        assert_same(a, t, 4000, 1);
        mt_table_destroy(t);
        mt_store_close(s);
    }

    /* A configuration that does not match the saved slots. */
    s = open_store(&sc);
    mt_table_config_t other;
    table_cfg(&other, 4, 0);
    g_slots[0].dim = 16;
    mt_table_t *t = SENTINEL;
    cr_assert_eq(mt_store_load_latest(s, "emb", &other, &t, NULL, NULL, 0), MT_MISMATCH);
    cr_assert_eq(t, SENTINEL);
    mt_store_close(s);
    mt_table_destroy(a);
}

/* The table file (.sst) of the database that holds checkpoint @p id's chunks of "emb" (each
 * checkpoint is one file, uncompressed: its keys are in it as they are). @returns 1 with its
 * path in @p path. */
static int sst_of(uint64_t id, char *path, size_t cap) {
    char needle[64];
    snprintf(needle, sizeof(needle), "ckpt/%020" PRIu64 "/emb/", id);
    DIR *d = opendir(g_db);
    cr_assert_not_null(d);
    struct dirent *de;
    int hit = 0;
    while (!hit && (de = readdir(d)) != NULL) {
        size_t nl = strlen(de->d_name);
        if (nl < 4 || strcmp(de->d_name + nl - 4, ".sst") != 0) continue;
        snprintf(path, cap, "%s/%s", g_db, de->d_name);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        static char buf[16 << 20];
        size_t n = fread(buf, 1, sizeof(buf), f);
        fclose(f);
        hit = memmem(buf, n, needle, strlen(needle)) != NULL;
    }
    closedir(d);
    return hit;
}

/* Regression (an outside probe): a truncated table file made RocksDB refuse the whole store
 * with "file is too short (N bytes) to be an sstable", N the size the database expects, not
 * the file's, and no checkpoint named. Now the store opens, the damaged checkpoint's loads
 * fail naming it and both sizes, the others load, and mt_store_drop() takes the store past
 * it (the next open is a normal one again). */
Test(store, a_truncated_table_file_names_its_checkpoint_and_both_sizes) {
    mt_table_config_t tc;
    table_cfg(&tc, 4, 32u << 10);
    mt_table_t *a = build_table(&tc, 3000, 1), *b = build_table(&tc, 3000, 2);
    mt_store_config_t sc;
    small_cfg(&sc, 3);
    mt_store_t *s = open_store(&sc);
    mt_store_table_t ta[1] = {{"emb", a, 0}}, tb[1] = {{"emb", b, 0}};
    save_ok(s, 1, ta, 1, "one", 3, NULL);
    save_ok(s, 2, tb, 1, "two", 3, NULL);
    mt_store_close(s);
    char sst[256];
    cr_assert(sst_of(2, sst, sizeof(sst)), "no table file holds checkpoint 2");
    struct stat sb;
    cr_assert_eq(stat(sst, &sb), 0);
    cr_assert_eq(truncate(sst, 1000), 0);

    char eb[1024] = "", want[64];
    s = NULL;
    mt_err_t err = mt_store_open(g_db, &sc, &s, eb, sizeof(eb));
    cr_assert_eq(err, MT_OK, "open: %s: %s", mt_err_name(err), eb);
    snprintf(want, sizeof(want), "%lld", (long long)sb.st_size);
    mt_table_t *t = SENTINEL;
    err = mt_store_load_latest(s, "emb", &tc, &t, NULL, eb, sizeof(eb));
    cr_assert_eq(err, MT_CORRUPT, "%s: %s", mt_err_name(err), eb);
    cr_assert_eq(t, SENTINEL);
    cr_log_info("damaged load: %s", eb);
    cr_assert(strstr(eb, "checkpoint 2"), "%s", eb);
    cr_assert(strstr(eb, "1000 bytes") && strstr(eb, want), "not both sizes (1000, %s): %s", want,
              eb);
    uint64_t id = 0;
    void *meta = NULL;
    size_t mlen = 0;
    err = mt_store_load_meta(s, &id, &meta, &mlen, eb, sizeof(eb));
    cr_assert_eq(err, MT_CORRUPT, "%s: %s", mt_err_name(err), eb);
    cr_assert(strstr(eb, "checkpoint 2") && strstr(eb, "1000 bytes"), "%s", eb);
    /* checkpoint 1 is whole */
    t = NULL;
    err = mt_store_load_table(s, 1, "emb", &tc, &t, eb, sizeof(eb));
    cr_assert_eq(err, MT_OK, "%s: %s", mt_err_name(err), eb);
    assert_same(a, t, 3000, 1);
    mt_table_destroy(t);
    /* the way past it */
    uint64_t cur = 99, dropped = 0;
    cr_assert_eq(mt_store_drop(s, 5, &cur, &dropped, eb, sizeof(eb)), MT_NOT_FOUND, "%s", eb);
    cr_assert_eq(mt_store_drop(s, 2, &cur, &dropped, eb, sizeof(eb)), MT_OK, "%s", eb);
    cr_assert_eq(cur, 1);
    cr_assert_eq(dropped, 1);
    mt_store_close(s);
    s = open_store(&sc);
    t = load_ok(s, "emb", &tc, 1);
    assert_same(a, t, 3000, 1);
    mt_table_destroy(t);
    /* a drop of a whole checkpoint takes every one above it too */
    save_ok(s, 2, tb, 1, "two", 3, NULL);
    save_ok(s, 3, tb, 1, "three", 5, NULL);
    cr_assert_eq(mt_store_drop(s, 2, &cur, &dropped, eb, sizeof(eb)), MT_OK, "%s", eb);
    cr_assert_eq(cur, 1);
    cr_assert_eq(dropped, 2);
    cr_assert_eq(current_id(s), 1);
    cr_assert_eq(mt_store_drop(s, 1, &cur, &dropped, eb, sizeof(eb)), MT_OK, "%s", eb);
    cr_assert_eq(cur, 0, "no checkpoint left");
    cr_assert_eq(mt_store_current(s, &cur, NULL, 0), MT_NOT_FOUND);
    mt_store_close(s);
    mt_table_destroy(a);
    mt_table_destroy(b);
}

/* ============================== config and open ============================== */

Test(store, config_and_open_errors) {
    mt_store_config_t c;
    char eb[256];
    mt_store_config_init(&c);
    cr_assert_eq(mt_store_config_validate(&c, eb, sizeof(eb)), MT_OK);
    mt_store_config_init(&c);
    c.keep = 0;
    cr_assert_eq(mt_store_config_validate(&c, eb, sizeof(eb)), MT_CONFIG);
    cr_assert(strstr(eb, "keep"), "%s", eb);
    mt_store_config_init(&c);
    c.chunk_bytes = 100;
    cr_assert_eq(mt_store_config_validate(&c, eb, sizeof(eb)), MT_CONFIG);
    cr_assert(strstr(eb, "chunk_bytes"), "%s", eb);
    mt_store_config_init(&c);
    c.chunk_bytes = (64u << 20) + 1;
    cr_assert_eq(mt_store_config_validate(&c, eb, sizeof(eb)), MT_CONFIG);
    mt_store_config_init(&c);
    c.background_jobs = 0;
    cr_assert_eq(mt_store_config_validate(&c, eb, sizeof(eb)), MT_CONFIG);
    mt_store_config_init(&c);
    c.compress = 2;
    cr_assert_eq(mt_store_config_validate(&c, eb, sizeof(eb)), MT_CONFIG);

    mt_store_t *s = (mt_store_t *)(void *)sentinel_obj;
    cr_assert_eq(mt_store_open(g_db, &c, &s, eb, sizeof(eb)), MT_CONFIG);
    cr_assert_eq(s, (mt_store_t *)(void *)sentinel_obj);
    cr_assert_eq(mt_store_open(NULL, NULL, &s, NULL, 0), MT_INVALID);
    cr_assert_eq(mt_store_open("", NULL, &s, NULL, 0), MT_INVALID);

    /* No database and create_if_missing 0. */
    mt_store_config_init(&c);
    c.create_if_missing = 0;
    eb[0] = 0;
    cr_assert_eq(mt_store_open(g_db, &c, &s, eb, sizeof(eb)), MT_IO);
    cr_assert_neq(eb[0], 0);
    cr_log_info("missing database: %s", eb);

    /* A regular file where the directory should be. */
    char file[128];
    snprintf(file, sizeof(file), "%s/file", g_tmp);
    FILE *f = fopen(file, "w");
    cr_assert_not_null(f);
    fputs("x", f);
    fclose(f);
    eb[0] = 0;
    cr_assert_eq(mt_store_open(file, NULL, &s, eb, sizeof(eb)), MT_IO);
    cr_assert_neq(eb[0], 0);
    cr_log_info("a file: %s", eb);

    /* Locked by another open. */
    s = NULL;
    cr_assert_eq(mt_store_open(g_db, NULL, &s, NULL, 0), MT_OK);
    mt_store_t *s2 = (mt_store_t *)(void *)sentinel_obj;
    eb[0] = 0;
    mt_err_t err = mt_store_open(g_db, NULL, &s2, eb, sizeof(eb));
    cr_assert(err == MT_IO || err == MT_UNAVAILABLE, "second open: %s", mt_err_name(err));
    cr_assert_eq(s2, (mt_store_t *)(void *)sentinel_obj);
    cr_log_info("locked: %s", eb);
    mt_store_close(s);

    /* Another layout version. */
    raw_t r;
    raw_open(&r);
    raw_put(&r, CF_DEFAULT, "format", "9", 1);
    raw_close(&r);
    cr_assert_eq(mt_store_open(g_db, NULL, &s2, eb, sizeof(eb)), MT_VERSION);
    cr_assert(strstr(eb, "9"), "%s", eb);
}

/* ============================== loads during saves ============================== */

typedef struct loader {
    mt_store_t *s;
    const mt_table_config_t *tc;
    atomic_int stop;
    int loads, errors;
    uint64_t last_id;
    char msg[256];
} loader_t;

static void *loader_main(void *p) {
    loader_t *l = p;
    while (!atomic_load(&l->stop) || l->loads == 0) {
        mt_table_t *t = NULL;
        uint64_t id = 0;
        mt_err_t err = mt_store_load_latest(l->s, "emb", l->tc, &t, &id, l->msg, sizeof(l->msg));
        if (err || id < l->last_id || table_rows(t) != 300 * id) {
            l->errors++;
            mt_table_destroy(t);
            break;
        }
        l->last_id = id;
        l->loads++;
        mt_table_destroy(t);
    }
    return NULL;
}

Test(store, loads_run_during_saves_and_prunes) {
    mt_table_config_t tc;
    table_cfg(&tc, 2, 0);
    mt_store_config_t sc;
    small_cfg(&sc, 1);
    mt_store_t *s = open_store(&sc);
    mt_table_t *t1 = build_table(&tc, 300, 1);
    mt_store_table_t st[1] = {{"emb", t1, 0}};
    save_ok(s, 1, st, 1, NULL, 0, NULL);
    mt_table_destroy(t1);
    loader_t l = {.s = s, .tc = &tc};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, loader_main, &l), 0);
    for (uint64_t id = 2; id <= 12; id++) {
        mt_table_t *t = build_table(&tc, 300 * id, id);
        st[0].table = t;
        save_ok(s, id, st, 1, NULL, 0, NULL);
        mt_table_destroy(t);
    }
    atomic_store(&l.stop, 1);
    pthread_join(th, NULL);
    cr_assert_eq(l.errors, 0, "a load during saves failed after %d loads: %s", l.loads, l.msg);
    cr_assert_gt(l.loads, 0);
    uint64_t ids[4];
    cr_assert_eq(list_ids(s, ids, 4), 1);
    cr_assert_eq(ids[0], 12);
    cr_log_info("loads during 11 saves: %d, last from checkpoint %" PRIu64, l.loads, l.last_id);
    mt_store_close(s);
}

/* ============================== a bigger table ============================== */

static double mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t dir_bytes_total;
static int dir_bytes_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)path;
    (void)ftw;
    if (flag == FTW_F) dir_bytes_total += (uint64_t)sb->st_size;
    return 0;
}

static uint64_t dir_bytes(const char *dir) {
    dir_bytes_total = 0;
    nftw(dir, dir_bytes_cb, 16, FTW_PHYS);
    return dir_bytes_total;
}

Test(store, table_of_200k_rows_default_settings) {
    const size_t n = 200000;
    mt_table_config_t tc;
    table_cfg(&tc, 10, 8u << 20); /* table defaults: 1024 parts, 8 MiB filter */
    mt_table_t *a = build_table(&tc, n, 1);
    mt_store_t *s = open_store(NULL); /* store defaults: keep 3, 4 MiB chunks */
    mt_store_table_t ta[1] = {{"emb", a, 0}};
    mt_store_result_t res;
    save_ok(s, 1, ta, 1, "m", 1, &res);
    cr_assert_eq(res.rows, n);
    double t0 = mono();
    mt_table_t *t = load_ok(s, "emb", &tc, 1);
    double load_s = mono() - t0;
    assert_same(a, t, n, 1);
    mt_table_destroy(t);
    double mb = (double)res.bytes / 1e6;
    cr_log_info("200k rows: stream %.1f MB in %" PRIu64 " chunks; save %.3f s (stream %.3f, "
                "durable %.3f, prune %.3f) = %.0f rows/s, %.0f MB/s; load %.3f s = %.0f rows/s, "
                "%.0f MB/s",
                mb, res.chunks, res.seconds, res.stream_s, res.durable_s, res.prune_s,
                (double)n / res.seconds, mb / res.seconds, load_s, (double)n / load_s, mb / load_s);

    /* Three more saves with keep 3: the first is pruned and its space comes back. */
    for (uint64_t id = 2; id <= 4; id++) {
        save_ok(s, id, ta, 1, "m", 1, &res);
        cr_log_info("save %" PRIu64 ": %.3f s (prune %.3f s, pruned %" PRIu64 "), store %.1f MB",
                    id, res.seconds, res.prune_s, res.pruned, (double)dir_bytes(g_db) / 1e6);
    }
    cr_assert_eq(res.pruned, 1);
    uint64_t ids[4];
    cr_assert_eq(list_ids(s, ids, 4), 3);
    cr_assert_eq(ids[0], 2);
    mt_store_close(s);
    mt_table_destroy(a);
}
