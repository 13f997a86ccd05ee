/*
 * test_concurrency.c - the embedding table under concurrent use (pthreads).
 *
 * The table promises (mt/table.h, "Thread safety"): every function may run concurrently with
 * every other one except destroy; lookups without MT_TABLE_TRAIN take no lock and see each
 * row consistent (never torn) even while its part grows (rehash into a new bucket array,
 * old one freed after a grace period) or rows are moved, freed and reused. This file runs
 * 4-6 threads at once (more than the 2 cores of the test machine, so the scheduler
 * interleaves them at arbitrary points) and checks concrete values:
 *
 *  - torn rows: every row holds an invariant, emb[i] = x + i * d, where d is slope_of(id)
 *    (1..7, a function of the id) after an assign and 0 for a zero-initialized row; SGD
 *    (lr 1) with a gradient that is the same for every coordinate keeps it. Readers,
 *    trainers and the change stream check it on every row they see (a copy torn between
 *    two writes, or another id's row read through a moved or reused slot, breaks it); rows
 *    not found must read all zeros. Tables start empty with 1-4 parts so growth happens all
 *    along; removals, TTL expiry and slab reuse run meanwhile. One slot is fp16 (values
 *    stay small integers, exact in binary16), one has 1 KiB rows (hot-row test: few ids,
 *    every thread on them).
 *  - lost updates: N threads apply K steps of -1 (each adds exactly +1) to the same ids,
 *    repeated ids included, while other threads force grows: the result is exact.
 *  - growth under read load: pre-inserted ids are always found, with their exact values,
 *    while writers insert hundreds of thousands of other ids (one part and 1024 parts).
 *  - the change stream and save run concurrently with writers: entries are well-formed,
 *    a replica fed by the streams ends equal to the source, and saved snapshots load back.
 *
 * Worker threads never call cr_assert (it must run on the test's main thread): they record
 * the first failure and the main thread asserts after joining. Counts are fixed (never
 * time-based) and halved under MT_SANITIZED. Threads yield every few batches so that the
 * roles interleave finely on 2 cores. Checked against broken builds of the library: an
 * unvalidated seqlock read, an assign outside the seqlock, an apply outside the part lock,
 * an immediate free of a retired bucket array (ASan) and a change stream whose upto misses
 * concurrent changes each make a test here fail.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mt/table.h"
#include "table_int.h"

#ifdef MT_SANITIZED
#define SCALE(n) ((n) / 2)
#else
#define SCALE(n) (n)
#endif
/* The mixed test runs six threads on the table; under ThreadSanitizer (every access
 * checked, the threads serialized through its state) it took 560 s at SCALE: 8x fewer. */
#ifdef MT_TSAN
#define MIXED_SCALE(n) (SCALE(n) / 8)
#else
#define MIXED_SCALE(n) SCALE(n)
#endif

#define DIM1   16  /* slot 1: fp32, TTL in some tests */
#define DIM2   12  /* slot 2: fp16 */
#define DIM3   256 /* slot 3: fp32, wide rows (a 1 KiB copy is easy to tear), hot-row test */
#define MAXDIM 256

/* ============================== helpers ============================== */

typedef struct failures {
    atomic_uint n;
    pthread_mutex_t mu;
    char first[512];
} failures_t;

static failures_t g_fail = {0, PTHREAD_MUTEX_INITIALIZER, ""};

__attribute__((format(printf, 1, 2))) static void fail(const char *fmt, ...) {
    if (atomic_fetch_add(&g_fail.n, 1) == 0) {
        pthread_mutex_lock(&g_fail.mu);
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(g_fail.first, sizeof(g_fail.first), fmt, ap);
        va_end(ap);
        pthread_mutex_unlock(&g_fail.mu);
    }
}

static void assert_no_failures(void) {
    pthread_mutex_lock(&g_fail.mu);
    unsigned n = atomic_load(&g_fail.n);
    char msg[512];
    memcpy(msg, g_fail.first, sizeof(msg));
    pthread_mutex_unlock(&g_fail.mu);
    cr_assert_eq(n, 0u, "%u failures in worker threads, first: %s", n, msg);
}

static inline uint64_t rnd(uint64_t *s) {
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static uint32_t dim_of(uint64_t fid) {
    uint16_t s = MT_FID_SLOT(fid);
    return s == 1 ? DIM1 : s == 2 ? DIM2 : DIM3;
}

/* The slope of an id's assigned rows, 1..7: a reader that got another id's row (a slot
 * moved or reused under it) sees the wrong slope 6 times out of 7. */
static float slope_of(uint64_t fid) {
    return (float)(1 + ((fid * 0x9E3779B97F4A7C15ull) >> 32) % 7);
}

/* The row invariant: emb[i] = emb[0] + i * d, where d is 0 (a zero-initialized row, then
 * SGD steps) or slope_of(fid) (an assigned row, then SGD steps); small integers. */
static int row_ok(const float *e, uint32_t dim, uint64_t fid) {
    float d = e[1] - e[0];
    if (d != 0.0f && d != slope_of(fid)) return 0;
    if (e[0] != (float)(int32_t)e[0] || e[0] < -4096.0f || e[0] > 4096.0f) return 0;
    for (uint32_t i = 0; i < dim; i++)
        if (e[i] != e[0] + (float)i * d) return 0;
    return 1;
}

static int zeros(const float *e, uint32_t dim) {
    for (uint32_t i = 0; i < dim; i++)
        if (e[i] != 0.0f) return 0;
    return 1;
}

static void fmt_row(char *buf, size_t len, const float *e, uint32_t dim) {
    size_t off = 0;
    for (uint32_t i = 0; i < dim && off + 16 < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "%g ", (double)e[i]);
}

/* Checks a packed batch (lookup output): found rows hold the invariant, others are zeros. */
static void check_batch(const char *who, const uint64_t *fids, size_t n, const float *out,
                        const uint8_t *found) {
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t dim = dim_of(fids[i]);
        const float *e = out + off;
        off += dim;
        int ok = found[i] ? row_ok(e, dim, fids[i]) : zeros(e, dim);
        if (!ok) {
            char row[512];
            fmt_row(row, sizeof(row), e, dim);
            fail("%s: id %llx (found %d) reads a torn/garbage row: %s", who,
                 (unsigned long long)fids[i], found[i], row);
            return;
        }
    }
}

static void slot_cfgs(mt_table_slot_config_t sc[3], uint32_t ttl1_s) {
    mt_table_slot_config_init(&sc[0], 1, DIM1);
    mt_table_slot_config_init(&sc[1], 2, DIM2);
    mt_table_slot_config_init(&sc[2], 3, DIM3);
    for (int i = 0; i < 3; i++) {
        sc[i].opt = MT_OPT_SGD;
        sc[i].lr = 1.0f;
        sc[i].init = MT_INIT_ZEROS;
    }
    sc[0].ttl_s = ttl1_s;
    sc[1].precision = MT_PREC_FP16;
}

static void table_cfg(mt_table_config_t *cfg, const mt_table_slot_config_t *sc,
                      uint32_t shards_log2, uint64_t changelog_entries) {
    mt_table_config_init(cfg);
    cfg->slots = sc;
    cfg->nslots = 3;
    cfg->shards_log2 = shards_log2;
    cfg->filter_bytes = 0;
    cfg->changelog_entries = changelog_entries;
}

static mt_table_t *mk(const mt_table_config_t *cfg) {
    mt_table_t *t = NULL;
    cr_assert_eq(mt_table_create(cfg, &t), MT_OK);
    return t;
}

/* Fills a packed values buffer for assign: each id gets x + i * slope_of(id), x < 256. */
static size_t fill_assign(uint64_t *rs, const uint64_t *fids, size_t n, float *vals) {
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t dim = dim_of(fids[i]);
        float x = (float)(rnd(rs) % 256);
        for (uint32_t k = 0; k < dim; k++)
            vals[off + k] = x + (float)k * slope_of(fids[i]);
        off += dim;
    }
    return off;
}

/* Fills gradients: each id gets one value (+1 or -1) on every coordinate. */
static size_t fill_grads(uint64_t *rs, const uint64_t *fids, size_t n, float *g) {
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t dim = dim_of(fids[i]);
        float v = (rnd(rs) & 1) ? 1.0f : -1.0f;
        for (uint32_t k = 0; k < dim; k++)
            g[off + k] = v;
        off += dim;
    }
    return off;
}

/* ============================== workers ============================== */

typedef enum role {
    R_READ,   /* read-only lookups of random ids */
    R_TRAIN,  /* training lookups of random ids (admits them) */
    R_ASSIGN, /* assigns x + i * slope_of(id) */
    R_APPLY,  /* SGD steps of +-1 */
    R_REMOVE, /* removes, advances time, expires; runs until the other writers are done,
                 then advances time past the TTL and expires the whole table */
    R_FIXED   /* read-only lookups of a fixed, never-changed set (growth test) */
} role_t;

typedef struct shared {
    mt_table_t *t;
    uint64_t universe;       /* random ids are MT_FID_MAKE(slot, id_base + v), v < universe */
    uint64_t id_base;        /* added to v */
    int hot;                 /* a quarter of the random ids come from v < 64 */
    uint32_t nslots;         /* random ids use slots 1..nslots (0: 2) */
    atomic_int writers_left; /* readers run until this reaches 0 */
    atomic_int fg_left;      /* writers other than R_REMOVE still running */
    atomic_int go;           /* start gate: workers wait for it so that they overlap */
    _Atomic uint32_t now_s;
    const uint64_t *fixed; /* R_FIXED: ids and their x (value of coordinate 0) */
    const float *fixed_x;
    size_t nfixed;
} shared_t;

typedef struct worker {
    pthread_t th;
    shared_t *sh;
    role_t role;
    uint64_t seed;
    uint64_t ops; /* batches (writers) */
    size_t batch;
    uint64_t done; /* batches done (readers: at least one) */
    uint64_t found;
} worker_t;

/* A random id of slots 1..nslots; with sh->hot a quarter of the picks come from 64 hot ids per
 * slot, so that readers and writers meet on the same rows often. */
static uint64_t rand_fid(uint64_t *rs, const shared_t *sh) {
    uint64_t r = rnd(rs);
    uint64_t range = sh->hot && (r & 3) == 0 ? 64 : sh->universe;
    uint64_t slot = 1 + (r >> 2) % (sh->nslots ? sh->nslots : 2);
    return MT_FID_MAKE(slot, sh->id_base + (r >> 8) % range);
}

static void *worker_main(void *arg) {
    worker_t *w = arg;
    shared_t *sh = w->sh;
    mt_table_t *t = sh->t;
    uint64_t rs = w->seed * 0x9E3779B97F4A7C15ull + 1;
    size_t bmax = w->batch > sh->nfixed ? w->batch : sh->nfixed;
    uint64_t *fids = malloc(bmax * sizeof(uint64_t));
    float *buf = malloc(bmax * MAXDIM * sizeof(float));
    uint8_t *found = malloc(bmax);
    mt_table_hint_t *hints = malloc(bmax * sizeof(*hints));
    int is_reader = w->role == R_READ || w->role == R_FIXED;
    if (!fids || !buf || !found || !hints) {
        fail("worker: out of memory");
        goto out;
    }
    while (!atomic_load(&sh->go))
        sched_yield();
    for (uint64_t it = 0;; it++) {
        if (is_reader) {
            if (it > 0 && atomic_load(&sh->writers_left) == 0) break;
        } else if (w->role == R_REMOVE) {
            if (it >= w->ops && atomic_load(&sh->fg_left) == 0) break;
        } else if (it >= w->ops) {
            break;
        }
        size_t n = w->batch, nf = 0;
        if (w->role == R_FIXED) {
            n = sh->nfixed;
            memcpy(fids, sh->fixed, n * sizeof(uint64_t));
        } else {
            for (size_t i = 0; i < n; i++)
                fids[i] = rand_fid(&rs, sh);
        }
        for (size_t i = 0; i < n; i++)
            nf += dim_of(fids[i]);
        uint32_t now = atomic_load(&sh->now_s);
        mt_err_t err = MT_OK;
        mt_table_op_stats_t st = {0};
        switch (w->role) {
        case R_READ:
        case R_TRAIN:
            memset(found, 0xEE, n);
            err = mt_table_lookup(t, fids, n, buf, nf, found,
                                  w->role == R_TRAIN ? MT_TABLE_TRAIN : 0, now, &st);
            if (!err) {
                check_batch(w->role == R_TRAIN ? "train" : "read", fids, n, buf, found);
                uint64_t c = 0;
                for (size_t i = 0; i < n; i++)
                    c += found[i];
                if (c != st.found || n - c != st.missing)
                    fail("lookup stats: found %llu/%llu, missing %llu",
                         (unsigned long long)st.found, (unsigned long long)c,
                         (unsigned long long)st.missing);
                if (w->role == R_TRAIN && c != n) fail("train: min_count 0 must admit all");
                w->found += c;
            }
            break;
        case R_FIXED: {
            err = mt_table_lookup(t, fids, n, buf, nf, found, 0, now, &st);
            size_t off = 0;
            for (size_t i = 0; i < n && !err; i++) {
                uint32_t dim = dim_of(fids[i]);
                if (found[i] != 1) {
                    fail("growth: pre-inserted id %llx not found (iteration %llu)",
                         (unsigned long long)fids[i], (unsigned long long)it);
                    break;
                }
                for (uint32_t k = 0; k < dim; k++) {
                    float want = sh->fixed_x[i] + (float)k * slope_of(fids[i]);
                    if (buf[off + k] != want) {
                        fail("growth: id %llx coordinate %u reads %g, want %g",
                             (unsigned long long)fids[i], k, (double)buf[off + k], (double)want);
                        break;
                    }
                }
                off += dim;
            }
            w->found += st.found;
            break;
        }
        case R_ASSIGN:
            fill_assign(&rs, fids, n, buf);
            err = mt_table_assign(t, fids, n, buf, nf, now, NULL);
            break;
        case R_APPLY:
            if (it & 1) { /* a training step's pair: the apply goes to the rows the lookup
                             found, while removals and expiry free rows under it */
                err = mt_table_lookup_rows(t, fids, n, buf, nf, now, hints, NULL);
                memset(found, 1, n); /* (min_count 0: a training lookup admits every id) */
                if (!err) check_batch("train with hints", fids, n, buf, found);
                fill_grads(&rs, fids, n, buf);
                if (!err) err = mt_table_apply_rows(t, fids, hints, n, buf, nf, now, NULL);
                break;
            }
            fill_grads(&rs, fids, n, buf);
            err = mt_table_apply(t, fids, n, buf, nf, now, NULL);
            break;
        case R_REMOVE: {
            uint64_t removed = 0, evicted = 0;
            err = mt_table_remove(t, fids, n, &removed);
            if (!err && removed > n) fail("remove: %llu of %zu", (unsigned long long)removed, n);
            if (!err && it % 8 == 7) {
                uint32_t nw = atomic_fetch_add(&sh->now_s, 1) + 1;
                err = mt_table_expire(t, nw, 256, &evicted);
            }
            if (!err && it % 64 == 0) {
                mt_table_stats_t ts;
                mt_table_stats(t, &ts);
                if (ts.rows > ts.capacity) fail("stats: rows above capacity");
            }
            break;
        }
        }
        if (err) {
            fail("role %d: error %d", (int)w->role, (int)err);
            break;
        }
        w->done++;
        if (atomic_load(&g_fail.n)) break;
        /* 6 threads on 2 cores: yield often so that the roles interleave finely instead of
         * running in whole time slices one after the other. */
        if ((it & 3) == 3) sched_yield();
    }
    if (w->role == R_REMOVE && !atomic_load(&g_fail.n)) {
        /* Readers still run: evict every idle row of the TTL slot at once. */
        uint32_t nw = atomic_fetch_add(&sh->now_s, 10) + 10;
        uint64_t evicted = 0;
        mt_err_t err = mt_table_expire(t, nw, mt_table_buckets(t), &evicted);
        if (err) fail("final expire: error %d", (int)err);
    }
out:
    if (!is_reader && w->role != R_REMOVE) atomic_fetch_sub(&sh->fg_left, 1);
    if (!is_reader) atomic_fetch_sub(&sh->writers_left, 1);
    free(fids);
    free(buf);
    free(found);
    free(hints);
    return NULL;
}

static void start(worker_t *w, shared_t *sh, role_t role, uint64_t seed, uint64_t ops,
                  size_t batch) {
    w->sh = sh;
    w->role = role;
    w->seed = seed;
    w->ops = ops;
    w->batch = batch;
    w->done = w->found = 0;
    cr_assert_eq(pthread_create(&w->th, NULL, worker_main, w), 0);
}

/* Sets the writer counts of @p sh for these roles. */
static void count_writers(shared_t *sh, const role_t *roles, int n) {
    int c = 0, fg = 0;
    for (int i = 0; i < n; i++) {
        c += roles[i] != R_READ && roles[i] != R_FIXED;
        fg += roles[i] != R_READ && roles[i] != R_FIXED && roles[i] != R_REMOVE;
    }
    atomic_init(&sh->writers_left, c);
    atomic_init(&sh->fg_left, fg);
    atomic_init(&sh->go, 0);
}

/* Checks every row of the table through a full change stream: invariant, one entry per id,
 * as many entries as rows. @returns the number of rows. */
static uint64_t check_all_rows(mt_table_t *t) {
    mt_table_changes_t *it = NULL;
    uint64_t upto = 0, n = 0;
    int full = 0;
    cr_assert_eq(mt_table_changes_begin(t, 0, &it, &upto, &full), MT_OK);
    cr_assert_eq(full, 1);
    mt_table_change_t ents[256];
    float *vals = malloc(256 * MAXDIM * sizeof(float));
    cr_assert_not_null(vals);
    for (;;) {
        size_t k = 0;
        cr_assert_eq(mt_table_changes_next(it, ents, 256, vals, 256 * MAXDIM, &k), MT_OK);
        if (k == 0) break;
        size_t off = 0;
        for (size_t i = 0; i < k; i++) {
            cr_assert_eq(ents[i].deleted, 0);
            cr_assert_eq(ents[i].dim, dim_of(ents[i].fid));
            cr_assert(row_ok(vals + off, ents[i].dim, ents[i].fid), "row %llx broken",
                      (unsigned long long)ents[i].fid);
            off += ents[i].dim;
        }
        n += k;
    }
    mt_table_changes_end(it);
    free(vals);
    mt_table_stats_t ts;
    mt_table_stats(t, &ts);
    cr_assert_eq(ts.rows, n);
    return n;
}

/* ============================== torn rows under mixed load ============================== */

static void mixed_run(uint32_t shards_log2, uint64_t universe, uint64_t ops) {
    mt_table_slot_config_t sc[3];
    slot_cfgs(sc, 3);
    mt_table_config_t cfg;
    table_cfg(&cfg, sc, shards_log2, 4096);
    shared_t sh = {0};
    sh.t = mk(&cfg);
    sh.universe = universe;
    sh.hot = 1;
    atomic_init(&sh.now_s, 1);
    const role_t roles[] = {R_READ, R_READ, R_TRAIN, R_ASSIGN, R_APPLY, R_REMOVE};
    enum { NW = sizeof(roles) / sizeof(roles[0]) };
    /* Batches: lookups 256 (more than one reader grace-period chunk), writes 64. */
    const size_t batch[NW] = {300, 300, 256, 64, 64, 16};
    const uint64_t nops[NW] = {0, 0, ops, ops, ops, ops};
    count_writers(&sh, roles, NW);
    worker_t w[NW];
    for (int i = 0; i < NW; i++)
        start(&w[i], &sh, roles[i], (uint64_t)i + 11, nops[i], batch[i]);
    atomic_store(&sh.go, 1);
    for (int i = 0; i < NW; i++)
        pthread_join(w[i].th, NULL);
    assert_no_failures();
    mt_table_stats_t ts;
    mt_table_stats(sh.t, &ts);
    cr_log_info("mixed (shards_log2 %u): reader batches %llu + %llu, rows %llu, grows %llu, "
                "removals %llu, evictions %llu, changelog drops %llu",
                shards_log2, (unsigned long long)w[0].done, (unsigned long long)w[1].done,
                (unsigned long long)ts.rows, (unsigned long long)ts.grows,
                (unsigned long long)ts.removals, (unsigned long long)ts.evictions,
                (unsigned long long)ts.changelog_drops);
    cr_assert_geq(w[0].done, 1u);
    cr_assert_gt(ts.grows, 4u, "the test is meant to grow parts while readers read");
    cr_assert_gt(ts.removals, 0u);
    cr_assert_gt(ts.evictions, 0u);
    check_all_rows(sh.t);
    mt_table_destroy(sh.t);
}

Test(concurrency, mixed_ops_never_show_torn_rows, .timeout = 600) {
    mixed_run(0, MIXED_SCALE(60000), MIXED_SCALE(8000));
    mixed_run(2, MIXED_SCALE(60000), MIXED_SCALE(8000));
}

/* Few hot ids (8 per slot, one slot with 1 KiB rows) read by two threads while others
 * assign, apply and remove (rows freed and reused from the slab) exactly those ids and a
 * fifth thread grows the same part with other ids: the densest chance to tear a row. */
Test(concurrency, hot_rows_are_never_torn, .timeout = 600) {
    mt_table_slot_config_t sc[3];
    slot_cfgs(sc, 0);
    mt_table_config_t cfg;
    table_cfg(&cfg, sc, 0, 4096);
    mt_table_t *t = mk(&cfg);
    shared_t hot = {0}, grow = {0};
    hot.t = grow.t = t;
    hot.universe = 8;
    hot.nslots = 3;
    grow.universe = 1ull << 40;
    grow.id_base = 1ull << 41;
    atomic_init(&hot.now_s, 1);
    atomic_init(&grow.now_s, 1);
    const role_t roles[] = {R_READ, R_READ, R_ASSIGN, R_APPLY, R_REMOVE};
    enum { NW = sizeof(roles) / sizeof(roles[0]) };
    const size_t batch[NW] = {24, 24, 4, 4, 1};
    const role_t groles[] = {R_TRAIN};
    count_writers(&hot, roles, NW);
    count_writers(&grow, groles, 1);
    worker_t w[NW], gw;
    for (int i = 0; i < NW; i++)
        start(&w[i], &hot, roles[i], (uint64_t)i + 51, SCALE(80000), batch[i]);
    start(&gw, &grow, R_TRAIN, 59, SCALE(400), 256);
    atomic_store(&grow.go, 1);
    atomic_store(&hot.go, 1);
    for (int i = 0; i < NW; i++)
        pthread_join(w[i].th, NULL);
    pthread_join(gw.th, NULL);
    assert_no_failures();
    mt_table_stats_t ts;
    mt_table_stats(t, &ts);
    cr_log_info("hot rows: reader batches %llu + %llu (%llu + %llu rows found), remove batches "
                "%llu, %llu removals, %llu grows",
                (unsigned long long)w[0].done, (unsigned long long)w[1].done,
                (unsigned long long)w[0].found, (unsigned long long)w[1].found,
                (unsigned long long)w[4].done, (unsigned long long)ts.removals,
                (unsigned long long)ts.grows);
    cr_assert_geq(w[0].done, 1u);
    cr_assert_gt(ts.removals, 0u);
    check_all_rows(t);
    mt_table_destroy(t);
}

/* ============================== no lost updates ============================== */

typedef struct applier {
    pthread_t th;
    mt_table_t *t;
    const uint64_t *fa, *fb; /* batch A every step, batch B in the first kb steps */
    size_t na, nb;
    uint64_t k, kb;
    mt_err_t err;
    atomic_int *go;
} applier_t;

static size_t batch_floats(const uint64_t *fids, size_t n) {
    size_t nf = 0;
    for (size_t i = 0; i < n; i++)
        nf += dim_of(fids[i]);
    return nf;
}

static void *applier_main(void *arg) {
    applier_t *a = arg;
    size_t nfa = batch_floats(a->fa, a->na), nfb = batch_floats(a->fb, a->nb);
    float *g = malloc((nfa > nfb ? nfa : nfb) * sizeof(float));
    if (!g) {
        fail("applier: out of memory");
        return NULL;
    }
    for (size_t i = 0; i < (nfa > nfb ? nfa : nfb); i++)
        g[i] = -1.0f;
    while (!atomic_load(a->go))
        sched_yield();
    for (uint64_t it = 0; it < a->k && !a->err; it++) {
        mt_table_op_stats_t st = {0};
        a->err = mt_table_apply(a->t, a->fa, a->na, g, nfa, 1, &st);
        if (!a->err && it < a->kb) a->err = mt_table_apply(a->t, a->fb, a->nb, g, nfb, 1, &st);
        uint64_t want = a->na + (it < a->kb ? a->nb : 0);
        if (!a->err && st.found != want)
            fail("apply: found %llu of %llu", (unsigned long long)st.found,
                 (unsigned long long)want);
        if ((it & 15) == 0) sched_yield();
    }
    free(g);
    return NULL;
}

Test(concurrency, concurrent_applies_lose_no_update, .timeout = 600) {
    mt_table_slot_config_t sc[3];
    slot_cfgs(sc, 0);
    mt_table_config_t cfg;
    table_cfg(&cfg, sc, 0, 1u << 16);
    mt_table_t *t = mk(&cfg);
    /* NS ids of each slot, starting at (0, 1, 2, ...). Batch A: the slot 1 ids twice (a
     * repeated id is updated once per occurrence) and the wide slot 3 ids once, K steps;
     * batch B: the fp16 slot 2 ids, KB steps only, so they stay exact in binary16. */
    enum { NS = 24, NT = 4 };
    const uint64_t K = SCALE(3000), KB = 400; /* slot 2 ends at 4 * 400 + 11 <= 2048 */
    uint64_t all[3 * NS], fa[3 * NS], fb[NS];
    for (int i = 0; i < NS; i++) {
        for (int s = 0; s < 3; s++)
            all[s * NS + i] = MT_FID_MAKE(s + 1, 1000 + i);
        fa[i] = fa[2 * NS + i] = all[i];
        fa[NS + i] = all[2 * NS + i];
        fb[i] = all[NS + i];
    }
    float *start_vals = malloc(batch_floats(all, 3 * NS) * sizeof(float));
    cr_assert_not_null(start_vals);
    size_t off = 0;
    for (int i = 0; i < 3 * NS; i++)
        for (uint32_t k = 0; k < dim_of(all[i]); k++)
            start_vals[off++] = (float)k;
    cr_assert_eq(mt_table_assign(t, all, 3 * NS, start_vals, off, 1, NULL), MT_OK);
    free(start_vals);

    /* Growth of the same (single) part: two threads insert other ids (train, assign). */
    shared_t sh = {0};
    sh.t = t;
    sh.universe = SCALE(200000);
    sh.id_base = 1u << 20;
    atomic_init(&sh.now_s, 1);
    const role_t groles[2] = {R_TRAIN, R_ASSIGN};
    count_writers(&sh, groles, 2);
    worker_t gw[2];
    start(&gw[0], &sh, R_TRAIN, 1, SCALE(400), 256);
    start(&gw[1], &sh, R_ASSIGN, 2, SCALE(1200), 64);

    applier_t ap[NT];
    for (int i = 0; i < NT; i++) {
        ap[i] = (applier_t){.t = t,
                            .fa = fa,
                            .na = 3 * NS,
                            .fb = fb,
                            .nb = NS,
                            .k = K,
                            .kb = KB < K ? KB : K,
                            .err = MT_OK,
                            .go = &sh.go};
        cr_assert_eq(pthread_create(&ap[i].th, NULL, applier_main, &ap[i]), 0);
    }
    atomic_store(&sh.go, 1);
    for (int i = 0; i < NT; i++)
        pthread_join(ap[i].th, NULL);
    for (int i = 0; i < 2; i++)
        pthread_join(gw[i].th, NULL);
    assert_no_failures();
    for (int i = 0; i < NT; i++)
        cr_assert_eq(ap[i].err, MT_OK);

    /* Every step adds exactly 1 (floats hold these small integers exactly). */
    for (int i = 0; i < 3 * NS; i++) {
        float emb[MAXDIM];
        cr_assert_eq(mt_table_get_row(t, all[i], emb, NULL, 0, NULL, NULL, NULL), MT_OK);
        uint16_t slot = MT_FID_SLOT(all[i]);
        uint64_t steps = slot == 1 ? 2 * NT * K : slot == 3 ? NT * K : NT * (KB < K ? KB : K);
        for (uint32_t k = 0; k < dim_of(all[i]); k++)
            cr_assert_eq(emb[k], (float)k + (float)steps,
                         "slot %u id %d coordinate %u: %g, "
                         "want %g",
                         slot, i, k, (double)emb[k], (double)((float)k + steps));
    }
    mt_table_stats_t ts;
    mt_table_stats(t, &ts);
    cr_log_info("lost updates: %d threads x %llu batches, table grew %llu times to %llu rows", NT,
                (unsigned long long)K, (unsigned long long)ts.grows, (unsigned long long)ts.rows);
    cr_assert_gt(ts.grows, 5u);
    mt_table_destroy(t);
}

/* ============================== growth under read load ============================== */

static void growth_run(uint32_t shards_log2, uint64_t inserts_per_writer) {
    mt_table_slot_config_t sc[3];
    slot_cfgs(sc, 0);
    mt_table_config_t cfg;
    table_cfg(&cfg, sc, shards_log2, 64ull << shards_log2 > 4096 ? 64ull << shards_log2 : 4096);
    mt_table_t *t = mk(&cfg);
    enum { NF = 1000 };
    uint64_t *fixed = malloc(NF * sizeof(uint64_t));
    float *fx = malloc(NF * sizeof(float));
    float *vals = malloc(NF * MAXDIM * sizeof(float));
    cr_assert(fixed && fx && vals);
    size_t off = 0;
    for (int i = 0; i < NF; i++) {
        fixed[i] = MT_FID_MAKE(1 + (i & 1), 7 + (uint64_t)i * 13);
        fx[i] = (float)(i % 300);
        for (uint32_t k = 0; k < dim_of(fixed[i]); k++)
            vals[off++] = fx[i] + (float)k * slope_of(fixed[i]);
    }
    cr_assert_eq(mt_table_assign(t, fixed, NF, vals, off, 1, NULL), MT_OK);
    mt_table_stats_t before;
    mt_table_stats(t, &before);

    shared_t sh = {0};
    sh.t = t;
    sh.universe = 1ull << 40; /* practically every id is new */
    sh.id_base = 1ull << 41;  /* disjoint from the fixed ids */
    sh.fixed = fixed;
    sh.fixed_x = fx;
    sh.nfixed = NF;
    atomic_init(&sh.now_s, 1);
    const role_t roles[] = {R_FIXED, R_FIXED, R_TRAIN, R_TRAIN, R_ASSIGN};
    enum { NW = sizeof(roles) / sizeof(roles[0]) };
    const size_t batch[NW] = {0, 0, 256, 256, 256};
    count_writers(&sh, roles, NW);
    worker_t w[NW];
    for (int i = 0; i < NW; i++)
        start(&w[i], &sh, roles[i], (uint64_t)i + 101, batch[i] ? inserts_per_writer / batch[i] : 0,
              batch[i]);
    atomic_store(&sh.go, 1);
    for (int i = 0; i < NW; i++)
        pthread_join(w[i].th, NULL);
    assert_no_failures();
    mt_table_stats_t ts;
    mt_table_stats(t, &ts);
    cr_log_info("growth (shards_log2 %u): %llu rows, %llu grows, reader passes %llu + %llu "
                "over %d ids",
                shards_log2, (unsigned long long)ts.rows,
                (unsigned long long)(ts.grows - before.grows), (unsigned long long)w[0].done,
                (unsigned long long)w[1].done, NF);
    cr_assert_geq(w[0].done, 1u);
    cr_assert_eq(w[0].found, w[0].done * NF);
    cr_assert_eq(w[1].found, w[1].done * NF);
    uint64_t inserted = 3 * (inserts_per_writer / 256 * 256);
    cr_assert_geq(ts.rows, NF + inserted - inserted / 1000, "random ids barely collide");
    cr_assert_geq(ts.grows - before.grows, shards_log2 == 0 ? 5u : 1024u);
    free(fixed);
    free(fx);
    free(vals);
    mt_table_destroy(t);
}

Test(concurrency, readers_always_find_rows_while_parts_grow, .timeout = 600) {
    growth_run(0, SCALE(100000));
    growth_run(10, SCALE(100000)); /* the default part count */
}

/* ============================== change stream and replica ============================== */

typedef struct sync_state {
    mt_table_config_t cfg;
    mt_table_t *replica;
    uint64_t since;
    uint64_t streams, full_streams, full_sync_errors, entries;
} sync_state_t;

/* One sync round: enumerates the changes after since and applies them to the replica.
 * Checks every entry as it goes (well-formed, versions, row invariant). */
static void sync_once(mt_table_t *src, sync_state_t *ss) {
    for (;;) {
        mt_table_changes_t *it = NULL;
        uint64_t upto = 0;
        int full = 0;
        cr_assert_eq(mt_table_changes_begin(src, ss->since, &it, &upto, &full), MT_OK);
        cr_assert(full == 0 || full == 1);
        cr_assert(ss->since != 0 || full == 1, "since 0 is a full stream");
        cr_assert_geq(upto, ss->since, "upto never goes back");
        ss->streams++;
        if (full) {
            ss->full_streams++;
            mt_table_destroy(ss->replica);
            ss->replica = mk(&ss->cfg);
        }
        uint64_t last[4] = {0};
        mt_table_change_t ents[64];
        float vals[64 * MAXDIM];
        mt_err_t err = MT_OK;
        for (;;) {
            size_t k = 0;
            err = mt_table_changes_next(it, ents, 64, vals, sizeof(vals) / 4, &k);
            if (err || k == 0) break;
            size_t off = 0;
            for (size_t i = 0; i < k; i++) {
                const mt_table_change_t *c = &ents[i];
                uint16_t slot = MT_FID_SLOT(c->fid);
                cr_assert(slot >= 1 && slot <= 3, "entry of unknown slot %u", slot);
                cr_assert(c->deleted == 0 || c->deleted == 1);
                cr_assert_eq(c->dim, c->deleted ? 0u : dim_of(c->fid));
                cr_assert(full || c->version > ss->since, "version %llu <= since %llu",
                          (unsigned long long)c->version, (unsigned long long)ss->since);
                cr_assert(!(full && c->deleted), "a full stream lists rows only");
                uint32_t p = mt__part_of(src, c->fid);
                cr_assert_lt(p, 4u);
                if (!full) {
                    cr_assert_gt(c->version, last[p], "part %u out of version order", p);
                    last[p] = c->version;
                }
                if (c->deleted) {
                    cr_assert_eq(mt_table_remove(ss->replica, &c->fid, 1, NULL), MT_OK);
                } else {
                    cr_assert(row_ok(vals + off, c->dim, c->fid), "stream row %llx broken",
                              (unsigned long long)c->fid);
                    mt_table_op_stats_t st = {0};
                    cr_assert_eq(
                        mt_table_assign(ss->replica, &c->fid, 1, vals + off, c->dim, 1, &st),
                        MT_OK);
                    if (full) cr_assert_eq(st.found, 0u, "id twice in one full stream");
                    off += c->dim;
                }
            }
            ss->entries += k;
        }
        mt_table_changes_end(it);
        if (err == MT_FULL_SYNC) {
            cr_assert_eq(full, 0);
            ss->full_sync_errors++;
            ss->since = 0; /* start over with a full stream */
            continue;
        }
        cr_assert_eq(err, MT_OK);
        ss->since = upto;
        return;
    }
}

static void replica_run(uint64_t changelog_entries, uint64_t ops) {
    mt_table_slot_config_t sc[3];
    slot_cfgs(sc, 3);
    mt_table_config_t cfg;
    table_cfg(&cfg, sc, 2, changelog_entries);
    shared_t sh = {0};
    sh.t = mk(&cfg);
    sh.universe = 20000;
    sh.hot = 1;
    atomic_init(&sh.now_s, 1);
    sync_state_t ss = {0};
    ss.cfg = cfg;
    ss.cfg.changelog_entries = 1u << 12;
    ss.replica = mk(&ss.cfg);

    const role_t roles[] = {R_TRAIN, R_ASSIGN, R_APPLY, R_REMOVE};
    enum { NW = sizeof(roles) / sizeof(roles[0]) };
    const size_t batch[NW] = {64, 64, 64, 8};
    count_writers(&sh, roles, NW);
    worker_t w[NW];
    for (int i = 0; i < NW; i++)
        start(&w[i], &sh, roles[i], (uint64_t)i + 31, ops, batch[i]);
    atomic_store(&sh.go, 1);
    uint64_t rounds = 0;
    while (atomic_load(&sh.writers_left) > 0 && !atomic_load(&g_fail.n)) {
        sync_once(sh.t, &ss);
        rounds++;
    }
    for (int i = 0; i < NW; i++)
        pthread_join(w[i].th, NULL);
    assert_no_failures();
    sync_once(sh.t, &ss); /* writers done: this one brings the replica up to date */

    /* The replica equals the source, id by id. */
    uint64_t rows = 0;
    for (uint16_t slot = 1; slot <= 2; slot++) {
        for (uint64_t v = 0; v < sh.universe; v++) {
            uint64_t fid = MT_FID_MAKE(slot, v);
            float a[MAXDIM], b[MAXDIM];
            mt_err_t ea = mt_table_get_row(sh.t, fid, a, NULL, 0, NULL, NULL, NULL);
            mt_err_t eb = mt_table_get_row(ss.replica, fid, b, NULL, 0, NULL, NULL, NULL);
            cr_assert_eq(eb, ea, "id %llx: source %d, replica %d", (unsigned long long)fid, (int)ea,
                         (int)eb);
            if (ea == MT_OK) {
                cr_assert_arr_eq(a, b, dim_of(fid) * sizeof(float), "id %llx differs",
                                 (unsigned long long)fid);
                rows++;
            }
        }
    }
    mt_table_stats_t ts, tr;
    mt_table_stats(sh.t, &ts);
    mt_table_stats(ss.replica, &tr);
    cr_assert_eq(ts.rows, rows);
    cr_assert_eq(tr.rows, rows);
    cr_log_info("replica (changelog %llu): %llu sync rounds during writes, %llu streams "
                "(%llu full, %llu FULL_SYNC restarts), %llu entries, %llu rows, %llu log drops",
                (unsigned long long)changelog_entries, (unsigned long long)rounds,
                (unsigned long long)ss.streams, (unsigned long long)ss.full_streams,
                (unsigned long long)ss.full_sync_errors, (unsigned long long)ss.entries,
                (unsigned long long)rows, (unsigned long long)ts.changelog_drops);
    cr_assert_gt(ts.removals + ts.evictions, 0u);
    mt_table_destroy(ss.replica);
    mt_table_destroy(sh.t);
}

Test(concurrency, change_stream_during_writes_keeps_a_replica_exact, .timeout = 600) {
    replica_run(1u << 20, SCALE(6000)); /* roomy log: incremental streams */
    replica_run(256, SCALE(6000));      /* 64 entries per part: compaction and FULL_SYNC */
}

/* ============================== save during writes ============================== */

typedef struct membuf {
    uint8_t *p;
    size_t len, cap, pos;
} membuf_t;

static mt_err_t mem_write(void *ud, const void *buf, size_t len) {
    membuf_t *m = ud;
    if (m->len + len > m->cap) {
        size_t c = m->cap ? m->cap : 1 << 16;
        while (c < m->len + len)
            c *= 2;
        uint8_t *n = realloc(m->p, c);
        if (!n) return MT_NOMEM;
        m->p = n;
        m->cap = c;
    }
    memcpy(m->p + m->len, buf, len);
    m->len += len;
    return MT_OK;
}

static mt_err_t mem_read(void *ud, void *buf, size_t len, size_t *got) {
    membuf_t *m = ud;
    size_t n = m->len - m->pos < len ? m->len - m->pos : len;
    memcpy(buf, m->p + m->pos, n);
    m->pos += n;
    *got = n;
    return MT_OK;
}

static mt_table_t *save_load(mt_table_t *t, const mt_table_config_t *cfg) {
    membuf_t m = {0};
    cr_assert_eq(mt_table_save(t, mem_write, &m), MT_OK);
    mt_table_t *l = NULL;
    mt_err_t err = mt_table_load(cfg, mem_read, &m, &l);
    free(m.p);
    cr_assert_eq(err, MT_OK, "load of a snapshot taken during writes: %d", (int)err);
    return l;
}

Test(concurrency, save_during_writes_loads_back, .timeout = 600) {
    mt_table_slot_config_t sc[3];
    slot_cfgs(sc, 3);
    mt_table_config_t cfg;
    table_cfg(&cfg, sc, 1, 4096);
    shared_t sh = {0};
    sh.t = mk(&cfg);
    sh.universe = SCALE(40000);
    sh.hot = 1;
    atomic_init(&sh.now_s, 1);
    const role_t roles[] = {R_TRAIN, R_ASSIGN, R_APPLY, R_REMOVE};
    enum { NW = sizeof(roles) / sizeof(roles[0]) };
    const size_t batch[NW] = {128, 64, 64, 16};
    count_writers(&sh, roles, NW);
    worker_t w[NW];
    for (int i = 0; i < NW; i++)
        start(&w[i], &sh, roles[i], (uint64_t)i + 71, SCALE(6000), batch[i]);
    atomic_store(&sh.go, 1);
    uint64_t snapshots = 0, max_rows = 0;
    while (atomic_load(&sh.writers_left) > 0 && !atomic_load(&g_fail.n)) {
        mt_table_t *l = save_load(sh.t, &cfg);
        uint64_t n = check_all_rows(l); /* loaded rows keep the invariant */
        if (n > max_rows) max_rows = n;
        mt_table_destroy(l);
        snapshots++;
    }
    for (int i = 0; i < NW; i++)
        pthread_join(w[i].th, NULL);
    assert_no_failures();
    cr_log_info("save during writes: %llu snapshots loaded back, up to %llu rows",
                (unsigned long long)snapshots, (unsigned long long)max_rows);
    cr_assert_geq(snapshots, 1u);

    /* Quiet now: a snapshot equals the table row by row (embedding, count, touch). */
    mt_table_t *l = save_load(sh.t, &cfg);
    uint64_t rows = 0;
    for (uint16_t slot = 1; slot <= 2; slot++) {
        for (uint64_t v = 0; v < sh.universe; v++) {
            uint64_t fid = MT_FID_MAKE(slot, v);
            float a[MAXDIM], b[MAXDIM];
            uint32_t ta = 0, tb = 0, ca = 0, cb = 0;
            mt_err_t ea = mt_table_get_row(sh.t, fid, a, NULL, 0, &ta, &ca, NULL);
            mt_err_t eb = mt_table_get_row(l, fid, b, NULL, 0, &tb, &cb, NULL);
            cr_assert_eq(eb, ea);
            if (ea != MT_OK) continue;
            cr_assert_arr_eq(a, b, dim_of(fid) * sizeof(float));
            cr_assert_eq(ta, tb);
            cr_assert_eq(ca, cb);
            rows++;
        }
    }
    cr_assert_eq(check_all_rows(l), rows);
    mt_table_destroy(l);
    mt_table_destroy(sh.t);
}
