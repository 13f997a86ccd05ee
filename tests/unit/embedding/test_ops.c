/*
 * test_ops.c - the embedding table against a reference model, under long random sequences
 * of operations.
 *
 * Why: the table's correctness rests on paths that interact (cuckoo displacement, parts
 * doubling on their own, slab rows reused after removal, lazy expiry with a clock hand, fp16
 * storage). Tests of one path at a time miss the interleavings, so here millions of random
 * operations run against a plain array model written from the contract in mt/table.h:
 * training lookups (which admit ids), read-only lookups, SGD applies, assigns, removes, and
 * expiry with a moving clock, with small budgets (incremental) and whole-table budgets. Every
 * result is compared: lookup outputs, found[] flags, per-call op stats, evicted counts, then
 * presence, embeddings, touch times and occurrence counts of every id, row counts and the
 * table-wide stats (counters, capacity, load factor, bytes).
 *
 * The model stays exact because every slot uses SGD with lr 1 (w -= g is one float
 * subtraction, done the same way here), gradients and assigned values are multiples of 1/8,
 * the fp16 slot is rounded through mt_fp16_from_float/to_float, and the one randomly
 * initialized slot records an id's initial embedding the first time it is admitted and checks
 * every later admission of that id against it (the initializer is deterministic per id).
 *
 * Layouts: shards_log2 0, 2 and 4 growing from empty (parts double many times), a pre-sized
 * table (initial_rows) and the default 1024 parts. Counts shrink under MT_SANITIZED.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mt/table.h"

#ifdef MT_SANITIZED
#define OPS_SCALE_DIV 2
#else
#define OPS_SCALE_DIV 1
#endif

/* Cheap on the passing path: Criterion's assert macros do more work per call. */
#define CHECK(cond, ...)                          \
    do {                                          \
        if (!(cond)) cr_assert_fail(__VA_ARGS__); \
    } while (0)

#define NSLOTS   4
#define MAXDIM   16
#define MAXBATCH 16
#define M48      0xFFFFFFFFFFFFull

typedef struct slotdef {
    uint16_t slot;
    uint32_t dim;
    uint32_t ttl_s;
    mt_table_init_t init;
    mt_table_precision_t prec;
    uint32_t nids; /* ids of this slot the random sequence draws from */
} slotdef_t;

/* Slot ids 0 and 0xFFFF test the ends of the slot range. */
static const slotdef_t SLOTS[NSLOTS] = {
    {0, 1, 0, MT_INIT_ZEROS, MT_PREC_FP32, 8000},
    {7, 4, 60, MT_INIT_ZEROS, MT_PREC_FP32, 6000},
    {0xFFFF, 16, 200, MT_INIT_UNIFORM, MT_PREC_FP32, 3000},
    {300, 4, 120, MT_INIT_ZEROS, MT_PREC_FP16, 3000},
};
#define UNIFORM_SCALE 0.01f

/* ============================== model ============================== */

typedef struct rrow {
    uint8_t present, init_known;
    /* the hint of its last mt_table_lookup_rows(), kept through removals, expiry and
     * re-admission: applies with hints use it, however stale (has_hint: one was taken) */
    uint8_t has_hint;
    mt_table_hint_t hint;
    uint32_t touch_s, count;
    float emb[MAXDIM];
    float init[MAXDIM]; /* first admitted value (random-init slot only) */
} rrow_t;

typedef struct model {
    rrow_t *rows[NSLOTS];
    uint64_t nrows, inserts, removals, evictions;
    uint64_t present_by_slot[NSLOTS];
} model_t;

typedef struct run {
    mt_table_t *t;
    mt_table_config_t cfg;
    mt_table_slot_config_t sc[NSLOTS];
    model_t m;
    uint64_t rng;
    uint32_t now;
    uint64_t last_version;
    int check_rows_each_batch;
    /* figures */
    uint64_t ops, batches, expire_calls, full_sweeps, max_rows;
} run_t;

static uint64_t rnd64(run_t *r) {
    uint64_t z = (r->rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint32_t rnd(run_t *r, uint32_t n) {
    return (uint32_t)(rnd64(r) % n);
}

/* A multiple of 1/8 in [-2, 2]: sums and differences of a few stay exact in fp32 and fp16. */
static float rnd_q8(run_t *r) {
    return (float)((int)rnd(r, 33) - 16) / 8.0f;
}

/* Index i of slot si -> fid; multiplying by an odd constant is a bijection mod 2^48. */
static uint64_t fid_of(int si, uint32_t i) {
    return MT_FID_MAKE(SLOTS[si].slot, ((uint64_t)i * 0x9E3779B97F4A7C15ull) & M48);
}

static float round_slot(int si, float x) {
    return SLOTS[si].prec == MT_PREC_FP16 ? mt_fp16_to_float(mt_fp16_from_float(x)) : x;
}

static void model_insert(model_t *m, int si, rrow_t *w, uint32_t now_s) {
    w->present = 1;
    w->touch_s = now_s;
    w->count = 1;
    m->nrows++;
    m->inserts++;
    m->present_by_slot[si]++;
}

static void model_drop(model_t *m, int si, rrow_t *w) {
    w->present = 0;
    m->nrows--;
    m->present_by_slot[si]--;
}

static void touch(rrow_t *w, uint32_t now_s) {
    if (now_s > w->touch_s) w->touch_s = now_s;
}

static int same_floats(const float *a, const float *b, uint32_t n) {
    return memcmp(a, b, n * sizeof(float)) == 0;
}

static int all_zero(const float *a, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        if (a[i] != 0.0f) return 0;
    return 1;
}

/* ============================== setup ============================== */

static void run_init(run_t *r, uint32_t shards_log2, uint64_t initial_rows, uint64_t seed) {
    memset(r, 0, sizeof(*r));
    r->rng = seed;
    r->now = 1000;
    for (int si = 0; si < NSLOTS; si++) {
        mt_table_slot_config_t *s = &r->sc[si];
        mt_table_slot_config_init(s, SLOTS[si].slot, SLOTS[si].dim);
        s->opt = MT_OPT_SGD;
        s->lr = 1.0f;
        s->init = SLOTS[si].init;
        s->init_scale = UNIFORM_SCALE;
        s->ttl_s = SLOTS[si].ttl_s;
        s->precision = SLOTS[si].prec;
        r->m.rows[si] = calloc(SLOTS[si].nids, sizeof(rrow_t));
        cr_assert_not_null(r->m.rows[si]);
    }
    mt_table_config_init(&r->cfg);
    r->cfg.slots = r->sc;
    r->cfg.nslots = NSLOTS;
    r->cfg.shards_log2 = shards_log2;
    r->cfg.initial_rows = initial_rows;
    r->cfg.filter_bytes = 1u << 20;
    cr_assert_eq(mt_table_create(&r->cfg, &r->t), MT_OK);
    r->check_rows_each_batch = shards_log2 <= 6;
}

static void run_fini(run_t *r) {
    mt_table_destroy(r->t);
    for (int si = 0; si < NSLOTS; si++)
        free(r->m.rows[si]);
}

/* ============================== checks ============================== */

static void check_stats(run_t *r) {
    mt_table_stats_t st;
    mt_table_stats(r->t, &st);
    const model_t *m = &r->m;
    CHECK(st.rows == m->nrows, "stats.rows %llu, model %llu", (unsigned long long)st.rows,
          (unsigned long long)m->nrows);
    CHECK(st.inserts == m->inserts, "stats.inserts %llu, model %llu",
          (unsigned long long)st.inserts, (unsigned long long)m->inserts);
    CHECK(st.removals == m->removals, "stats.removals %llu, model %llu",
          (unsigned long long)st.removals, (unsigned long long)m->removals);
    CHECK(st.evictions == m->evictions, "stats.evictions %llu, model %llu",
          (unsigned long long)st.evictions, (unsigned long long)m->evictions);
    CHECK(st.filtered == 0, "nothing is filtered with min_count 0");
    uint64_t buckets = mt_table_buckets(r->t);
    CHECK(st.capacity == 4 * buckets, "capacity %llu != 4 * %llu buckets",
          (unsigned long long)st.capacity, (unsigned long long)buckets);
    CHECK(st.capacity >= 2ull * 4 << r->cfg.shards_log2, "at least 2 buckets per part");
    CHECK(st.load_factor <= r->cfg.max_load + 1e-9, "load factor %g above max_load %g",
          st.load_factor, r->cfg.max_load);
    double lf = (double)st.rows / (double)st.capacity;
    CHECK(st.load_factor > lf - 1e-12 && st.load_factor < lf + 1e-12, "load factor %g != %g",
          st.load_factor, lf);
    CHECK(st.bytes_buckets >= st.capacity / 4 * 64, "bucket bytes %llu below 64 per bucket",
          (unsigned long long)st.bytes_buckets);
    CHECK(st.bytes_filter > 0 && st.bytes_filter <= r->cfg.filter_bytes, "filter bytes %llu",
          (unsigned long long)st.bytes_filter);
    CHECK(st.bytes_changelog >= 64ull * 24 << r->cfg.shards_log2, "changelog bytes %llu",
          (unsigned long long)st.bytes_changelog);
    uint64_t live_row_bytes = 0;
    for (int si = 0; si < NSLOTS; si++) {
        uint32_t rb = 0;
        CHECK(mt_table_row_bytes(r->t, fid_of(si, 0), &rb) == MT_OK, "row_bytes");
        CHECK(rb >= 16 + 4 * SLOTS[si].dim / (SLOTS[si].prec == MT_PREC_FP16 ? 2 : 1),
              "row bytes %u too small for slot %d", rb, si);
        live_row_bytes += m->present_by_slot[si] * rb;
    }
    CHECK(st.bytes_rows >= live_row_bytes, "bytes_rows %llu below live rows' %llu",
          (unsigned long long)st.bytes_rows, (unsigned long long)live_row_bytes);
    if (m->inserts) CHECK(st.bytes_rows > 0, "bytes_rows 0 after inserts");
    CHECK(st.bytes_total >= st.bytes_rows + st.bytes_buckets + st.bytes_filter + st.bytes_changelog,
          "bytes_total %llu below the sum of its parts", (unsigned long long)st.bytes_total);
    CHECK(st.version >= r->last_version, "version went back from %llu to %llu",
          (unsigned long long)r->last_version, (unsigned long long)st.version);
    if (m->inserts) CHECK(st.version > 0, "version 0 after changes");
    r->last_version = st.version;
    if (st.rows > r->max_rows) r->max_rows = st.rows;
}

static void check_rows_count(run_t *r) {
    mt_table_stats_t st;
    mt_table_stats(r->t, &st);
    CHECK(st.rows == r->m.nrows, "stats.rows %llu, model %llu", (unsigned long long)st.rows,
          (unsigned long long)r->m.nrows);
    if (st.rows > r->max_rows) r->max_rows = st.rows;
}

/* Read-only lookup of the given ids, compared with the model (presence and values). */
static void verify_ids(run_t *r, size_t n, const int *sis, const uint32_t *ixs) {
    uint64_t fids[512];
    float out[512 * MAXDIM];
    uint8_t found[512];
    for (size_t base = 0; base < n; base += 512) {
        size_t k = n - base < 512 ? n - base : 512;
        size_t len = 0;
        for (size_t j = 0; j < k; j++) {
            fids[j] = fid_of(sis[base + j], ixs[base + j]);
            len += SLOTS[sis[base + j]].dim;
        }
        memset(found, 0xAA, sizeof(found));
        mt_table_op_stats_t st = {0};
        CHECK(mt_table_lookup(r->t, fids, k, out, len, found, 0, r->now, &st) == MT_OK,
              "read-only lookup failed");
        size_t off = 0;
        uint64_t nf = 0;
        for (size_t j = 0; j < k; j++) {
            int si = sis[base + j];
            const rrow_t *w = &r->m.rows[si][ixs[base + j]];
            uint32_t d = SLOTS[si].dim;
            CHECK(found[j] == w->present, "slot %d id %u: found %u, model present %u", si,
                  ixs[base + j], found[j], w->present);
            if (w->present)
                CHECK(same_floats(out + off, w->emb, d),
                      "slot %d id %u: embedding differs "
                      "(%g vs %g)",
                      si, ixs[base + j], out[off], w->emb[0]);
            else
                CHECK(all_zero(out + off, d), "slot %d id %u: absent id reads non-zero", si,
                      ixs[base + j]);
            nf += w->present;
            off += d;
        }
        CHECK(st.found == nf && st.missing == k - nf, "read-only op stats %llu/%llu, want %llu",
              (unsigned long long)st.found, (unsigned long long)st.missing, (unsigned long long)nf);
    }
}

/* Every id of every slot: presence and values; touch, count and version through get_row. */
static void verify_all(run_t *r) {
    check_stats(r); /* also brings r->last_version up to date */
    static int sis[8000];
    static uint32_t ixs[8000];
    for (int si = 0; si < NSLOTS; si++) {
        for (uint32_t i = 0; i < SLOTS[si].nids; i++) {
            sis[i] = si;
            ixs[i] = i;
        }
        verify_ids(r, SLOTS[si].nids, sis, ixs);
        for (uint32_t i = 0; i < SLOTS[si].nids; i++) {
            const rrow_t *w = &r->m.rows[si][i];
            float emb[MAXDIM];
            uint32_t touch_s = 0, count = 0;
            uint64_t version = 0;
            mt_err_t err =
                mt_table_get_row(r->t, fid_of(si, i), emb, NULL, 0, &touch_s, &count, &version);
            if (!w->present) {
                CHECK(err == MT_NOT_FOUND, "get_row of an absent id: %d", err);
                continue;
            }
            CHECK(err == MT_OK, "get_row of a present id: %d", err);
            CHECK(same_floats(emb, w->emb, SLOTS[si].dim), "get_row embedding differs");
            CHECK(touch_s == w->touch_s, "slot %d id %u: touch %u, model %u", si, i, touch_s,
                  w->touch_s);
            CHECK(count == w->count, "slot %d id %u: count %u, model %u", si, i, count, w->count);
            CHECK(version > 0 && version <= r->last_version,
                  "row version %llu out of range (table version %llu)", (unsigned long long)version,
                  (unsigned long long)r->last_version);
        }
    }
}

/* ============================== operations ============================== */

static size_t batch_fids(size_t n, const int *sis, const uint32_t *ixs, uint64_t *fids) {
    size_t len = 0;
    for (size_t k = 0; k < n; k++) {
        fids[k] = fid_of(sis[k], ixs[k]);
        len += SLOTS[sis[k]].dim;
    }
    return len;
}

static void op_train(run_t *r, size_t n, const int *sis, const uint32_t *ixs, uint32_t now_s) {
    uint64_t fids[MAXBATCH] = {0};
    float out[MAXBATCH * MAXDIM];
    uint8_t found[MAXBATCH];
    size_t len = batch_fids(n, sis, ixs, fids);
    mt_table_op_stats_t st = {0};
    memset(found, 0xAA, sizeof(found));
    if (rnd(r, 2)) { /* with hints, each id's kept for later applies (found: every id) */
        mt_table_hint_t hints[MAXBATCH];
        CHECK(mt_table_lookup_rows(r->t, fids, n, out, len, now_s, hints, &st) == MT_OK,
              "training lookup with hints failed");
        for (size_t k = 0; k < n; k++) {
            rrow_t *w = &r->m.rows[sis[k]][ixs[k]];
            w->hint = hints[k];
            w->has_hint = 1;
            found[k] = 1;
        }
    } else {
        CHECK(mt_table_lookup(r->t, fids, n, out, len, found, MT_TABLE_TRAIN, now_s, &st) == MT_OK,
              "training lookup failed");
    }
    uint64_t admitted = 0;
    size_t off = 0;
    for (size_t k = 0; k < n; k++) {
        int si = sis[k];
        uint32_t d = SLOTS[si].dim;
        rrow_t *w = &r->m.rows[si][ixs[k]];
        CHECK(found[k] == 1, "training lookup with min_count 0: found[%zu] = %u", k, found[k]);
        if (w->present) {
            CHECK(same_floats(out + off, w->emb, d),
                  "slot %d id %u: training lookup value "
                  "%g, model %g",
                  si, ixs[k], out[off], w->emb[0]);
            if (w->count < UINT32_MAX) w->count++;
            touch(w, now_s);
        } else {
            if (SLOTS[si].init == MT_INIT_ZEROS) {
                CHECK(all_zero(out + off, d), "slot %d id %u: zeros-init row is not zero", si,
                      ixs[k]);
            } else if (w->init_known) {
                CHECK(same_floats(out + off, w->init, d),
                      "slot %d id %u: re-admitted row has another initial value", si, ixs[k]);
            } else {
                int nonzero = 0;
                for (uint32_t j = 0; j < d; j++) {
                    CHECK(out[off + j] >= -UNIFORM_SCALE && out[off + j] <= UNIFORM_SCALE,
                          "uniform init %g outside +-%g", out[off + j], UNIFORM_SCALE);
                    nonzero += out[off + j] != 0.0f;
                }
                CHECK(nonzero > 0, "uniform init gave all zeros");
                memcpy(w->init, out + off, d * sizeof(float));
                w->init_known = 1;
            }
            memcpy(w->emb, out + off, d * sizeof(float));
            model_insert(&r->m, si, w, now_s);
            admitted++;
        }
        off += d;
    }
    CHECK(st.found == n && st.missing == 0 && st.admitted == admitted && st.filtered == 0,
          "training op stats found %llu missing %llu admitted %llu (want %zu/0/%llu)",
          (unsigned long long)st.found, (unsigned long long)st.missing,
          (unsigned long long)st.admitted, n, (unsigned long long)admitted);
}

static void op_read(run_t *r, size_t n, const int *sis, const uint32_t *ixs) {
    verify_ids(r, n, sis, ixs); /* a read-only lookup compared with the model */
}

static void op_apply(run_t *r, size_t n, const int *sis, const uint32_t *ixs, uint32_t now_s) {
    uint64_t fids[MAXBATCH] = {0};
    float g[MAXBATCH * MAXDIM];
    size_t len = batch_fids(n, sis, ixs, fids);
    for (size_t j = 0; j < len; j++)
        g[j] = rnd_q8(r);
    mt_table_op_stats_t st = {0};
    if (rnd(r, 2)) {
        /* with each id's last hint, stale or not (its row may have gone, come back or been
         * handed to another id since); an id never hinted gets another id's hint, or none:
         * the results must be mt_table_apply()'s all the same */
        mt_table_hint_t hints[MAXBATCH];
        for (size_t k = 0; k < n; k++) {
            const rrow_t *w = &r->m.rows[sis[k]][ixs[k]];
            const rrow_t *o = &r->m.rows[sis[(k + 1) % n]][ixs[(k + 1) % n]];
            if (w->has_hint)
                hints[k] = w->hint;
            else if (o->has_hint)
                hints[k] = o->hint;
            else
                memset(&hints[k], 0, sizeof(hints[k]));
        }
        CHECK(mt_table_apply_rows(r->t, fids, hints, n, g, len, now_s, &st) == MT_OK,
              "apply with hints failed");
    } else {
        CHECK(mt_table_apply(r->t, fids, n, g, len, now_s, &st) == MT_OK, "apply failed");
    }
    uint64_t nf = 0;
    size_t off = 0;
    for (size_t k = 0; k < n; k++) {
        int si = sis[k];
        uint32_t d = SLOTS[si].dim;
        rrow_t *w = &r->m.rows[si][ixs[k]];
        if (w->present) {
            for (uint32_t j = 0; j < d; j++)
                w->emb[j] = round_slot(si, w->emb[j] - g[off + j]);
            touch(w, now_s);
            nf++;
        }
        off += d;
    }
    CHECK(st.found == nf && st.missing == n - nf && st.admitted == 0,
          "apply op stats found %llu missing %llu (want %llu)", (unsigned long long)st.found,
          (unsigned long long)st.missing, (unsigned long long)nf);
    verify_ids(r, n, sis, ixs);
}

static void op_assign(run_t *r, size_t n, const int *sis, const uint32_t *ixs, uint32_t now_s) {
    uint64_t fids[MAXBATCH] = {0};
    float v[MAXBATCH * MAXDIM];
    size_t len = batch_fids(n, sis, ixs, fids);
    for (size_t j = 0; j < len; j++)
        v[j] = 2.0f * rnd_q8(r);
    mt_table_op_stats_t st = {0};
    CHECK(mt_table_assign(r->t, fids, n, v, len, now_s, &st) == MT_OK, "assign failed");
    uint64_t nf = 0, adm = 0;
    size_t off = 0;
    for (size_t k = 0; k < n; k++) {
        int si = sis[k];
        uint32_t d = SLOTS[si].dim;
        rrow_t *w = &r->m.rows[si][ixs[k]];
        if (w->present) {
            touch(w, now_s);
            nf++;
        } else {
            model_insert(&r->m, si, w, now_s);
            adm++;
        }
        for (uint32_t j = 0; j < d; j++)
            w->emb[j] = round_slot(si, v[off + j]);
        off += d;
    }
    CHECK(st.found == nf && st.admitted == adm && st.missing == 0,
          "assign op stats found %llu admitted %llu (want %llu/%llu)", (unsigned long long)st.found,
          (unsigned long long)st.admitted, (unsigned long long)nf, (unsigned long long)adm);
    verify_ids(r, n, sis, ixs);
}

static void op_remove(run_t *r, size_t n, const int *sis, const uint32_t *ixs) {
    uint64_t fids[MAXBATCH] = {0};
    batch_fids(n, sis, ixs, fids);
    uint64_t removed = 12345, want = 0;
    CHECK(mt_table_remove(r->t, fids, n, &removed) == MT_OK, "remove failed");
    for (size_t k = 0; k < n; k++) {
        rrow_t *w = &r->m.rows[sis[k]][ixs[k]];
        if (w->present) {
            model_drop(&r->m, sis[k], w);
            r->m.removals++;
            want++;
        }
    }
    CHECK(removed == want, "removed %llu, want %llu", (unsigned long long)removed,
          (unsigned long long)want);
    verify_ids(r, n, sis, ixs);
}

/* Expired in the model at now_s: last touch + ttl < now. */
static int model_expired(int si, const rrow_t *w, uint32_t now_s) {
    return w->present && SLOTS[si].ttl_s &&
           (uint64_t)w->touch_s + SLOTS[si].ttl_s < (uint64_t)now_s;
}

/* One mt_table_expire() call. Evicted ids are found by looking up every id the model says is
 * expired; they must number exactly what the call reports (so nothing unexpired went), never
 * more than 4 per bucket of budget, and all of them when the budget covers the table. */
static uint64_t op_expire(run_t *r, uint32_t now_s, size_t budget, int full) {
    static int sis[20000];
    static uint32_t ixs[20000];
    size_t nc = 0;
    for (int si = 0; si < NSLOTS; si++)
        for (uint32_t i = 0; i < SLOTS[si].nids; i++)
            if (model_expired(si, &r->m.rows[si][i], now_s)) {
                sis[nc] = si;
                ixs[nc++] = i;
            }
    uint64_t evicted = 777777;
    CHECK(mt_table_expire(r->t, now_s, budget, &evicted) == MT_OK, "expire failed");
    CHECK(evicted <= 4 * (uint64_t)budget, "budget %zu buckets evicted %llu rows", budget,
          (unsigned long long)evicted);
    uint64_t gone = 0;
    uint64_t fids[512];
    float out[512 * MAXDIM];
    uint8_t found[512];
    for (size_t base = 0; base < nc; base += 512) {
        size_t k = nc - base < 512 ? nc - base : 512;
        size_t len = batch_fids(k, sis + base, ixs + base, fids);
        CHECK(mt_table_lookup(r->t, fids, k, out, len, found, 0, now_s, NULL) == MT_OK,
              "lookup failed");
        for (size_t j = 0; j < k; j++) {
            if (found[j]) continue;
            rrow_t *w = &r->m.rows[sis[base + j]][ixs[base + j]];
            model_drop(&r->m, sis[base + j], w);
            r->m.evictions++;
            gone++;
        }
    }
    CHECK(gone == evicted, "expire reported %llu evictions, %llu expired ids are gone",
          (unsigned long long)evicted, (unsigned long long)gone);
    if (full)
        CHECK(gone == nc, "a whole-table sweep left %llu of %zu expired rows",
              (unsigned long long)(nc - gone), nc);
    r->expire_calls++;
    r->full_sweeps += full != 0;
    return evicted;
}

/* ============================== the random sequence ============================== */

static size_t pick_batch(run_t *r, int *sis, uint32_t *ixs) {
    size_t n = 1 + rnd(r, MAXBATCH);
    for (size_t k = 0; k < n; k++) {
        if (k > 0 && rnd(r, 10) == 0) { /* repeated id within a batch */
            size_t j = rnd(r, (uint32_t)k);
            sis[k] = sis[j];
            ixs[k] = ixs[j];
            continue;
        }
        int si = (int)rnd(r, NSLOTS);
        uint32_t nids = SLOTS[si].nids;
        sis[k] = si;
        ixs[k] = rnd(r, 4) == 0 ? rnd(r, nids / 16) : rnd(r, nids); /* some hot ids */
    }
    return n;
}

static void random_run(run_t *r, uint64_t target_ops) {
    int sis[MAXBATCH];
    uint32_t ixs[MAXBATCH];
    while (r->ops < target_ops) {
        if (rnd(r, 32) == 0) r->now += 1 + rnd(r, 3);
        /* Now and then an older time: it must never lower a row's touch time. */
        uint32_t now_s = rnd(r, 10) == 0 ? r->now - rnd(r, 30) : r->now;
        size_t n = pick_batch(r, sis, ixs);
        uint32_t op = rnd(r, 1000);
        if (op < 350)
            op_train(r, n, sis, ixs, now_s);
        else if (op < 480)
            op_read(r, n, sis, ixs);
        else if (op < 730)
            op_apply(r, n, sis, ixs, now_s);
        else if (op < 840)
            op_assign(r, n, sis, ixs, now_s);
        else if (op < 960)
            op_remove(r, n, sis, ixs);
        else if (op < 995)
            op_expire(r, now_s, rnd(r, 65), 0);
        else
            op_expire(r, now_s, (size_t)mt_table_buckets(r->t) + rnd(r, 3), 1);
        r->ops += n;
        r->batches++;
        if (r->check_rows_each_batch || r->batches % 256 == 0) check_rows_count(r);
        if (r->batches % 4096 == 0) verify_all(r);
    }
    verify_all(r);
}

/* Ends a run: expire everything with a TTL, remove the rest, check the table is empty. */
static void drain(run_t *r) {
    r->now += 100000;
    op_expire(r, r->now, (size_t)mt_table_buckets(r->t), 1);
    for (int si = 0; si < NSLOTS; si++)
        if (SLOTS[si].ttl_s) CHECK(r->m.present_by_slot[si] == 0, "slot %d kept rows", si);
    for (int si = 0; si < NSLOTS; si++) {
        for (uint32_t i = 0; i < SLOTS[si].nids; i += MAXBATCH) {
            int sis[MAXBATCH];
            uint32_t ixs[MAXBATCH];
            size_t n = 0;
            for (uint32_t k = i; k < SLOTS[si].nids && n < MAXBATCH; k++, n++) {
                sis[n] = si;
                ixs[n] = k;
            }
            op_remove(r, n, sis, ixs);
        }
    }
    verify_all(r);
    CHECK(r->m.nrows == 0, "model not empty");
}

static void log_figures(const run_t *r, const char *name) {
    mt_table_stats_t st;
    mt_table_stats(r->t, &st);
    cr_log_info("%s: shards_log2 %u, %llu ops in %llu batches, %llu expire calls (%llu full), "
                "max rows %llu, inserts %llu, removals %llu, evictions %llu, grows %llu, "
                "version %llu",
                name, r->cfg.shards_log2, (unsigned long long)r->ops,
                (unsigned long long)r->batches, (unsigned long long)r->expire_calls,
                (unsigned long long)r->full_sweeps, (unsigned long long)r->max_rows,
                (unsigned long long)st.inserts, (unsigned long long)st.removals,
                (unsigned long long)st.evictions, (unsigned long long)st.grows,
                (unsigned long long)st.version);
}

static void random_case(uint32_t shards_log2, uint64_t initial_rows, uint64_t ops, uint64_t seed,
                        const char *name) {
    run_t r;
    run_init(&r, shards_log2, initial_rows, seed);
    random_run(&r, ops / OPS_SCALE_DIV);
    mt_table_stats_t st;
    mt_table_stats(r.t, &st);
    if (initial_rows == 0)
        cr_assert_gt(st.grows, (uint64_t)(2u << shards_log2) / 2,
                     "parts grown from empty: %llu grows", (unsigned long long)st.grows);
    cr_assert_gt(r.m.evictions, 1000, "expiry evicted %llu rows",
                 (unsigned long long)r.m.evictions);
    cr_assert_gt(r.m.removals, 1000);
    cr_assert_gt(r.full_sweeps, 10);
    log_figures(&r, name);
    drain(&r);
    run_fini(&r);
}

Test(ops, random_one_part, .timeout = 600) {
    random_case(0, 0, 3000000, 1, "one part");
}

Test(ops, random_four_parts, .timeout = 600) {
    random_case(2, 0, 3000000, 2, "four parts");
}

Test(ops, random_sixteen_parts, .timeout = 600) {
    random_case(4, 0, 3000000, 3, "sixteen parts");
}

Test(ops, random_presized, .timeout = 600) {
    random_case(3, 20000, 1000000, 4, "pre-sized");
}

Test(ops, random_default_shards, .timeout = 600) {
    random_case(10, 0, 1000000, 5, "default shards");
}

/* ============================== pre-sizing ============================== */

/* Fills a table pre-sized for n rows with exactly n distinct rows: it must not grow. */
static void presized_fill(uint32_t shards_log2, uint64_t n) {
    mt_table_slot_config_t sc;
    mt_table_slot_config_init(&sc, 5, 4);
    sc.opt = MT_OPT_SGD;
    mt_table_config_t cfg;
    mt_table_config_init(&cfg);
    cfg.slots = &sc;
    cfg.nslots = 1;
    cfg.shards_log2 = shards_log2;
    cfg.initial_rows = n;
    mt_table_t *t = NULL;
    cr_assert_eq(mt_table_create(&cfg, &t), MT_OK);
    mt_table_stats_t st;
    mt_table_stats(t, &st);
    cr_assert_eq(st.rows, 0);
    cr_assert_geq((double)st.capacity * cfg.max_load, (double)n,
                  "capacity %llu too small for %llu rows", (unsigned long long)st.capacity,
                  (unsigned long long)n);
    uint64_t cap0 = st.capacity;
    float v[4 * 256];
    uint64_t fids[256];
    for (uint64_t i = 0; i < n; i += 256) {
        size_t k = n - i < 256 ? (size_t)(n - i) : 256;
        for (size_t j = 0; j < k; j++) {
            fids[j] = MT_FID_MAKE(5, (i + j) * 0x9E3779B97F4A7C15ull);
            for (int d = 0; d < 4; d++)
                v[4 * j + d] = (float)(i + j) + (float)d / 4.0f;
        }
        cr_assert_eq(mt_table_assign(t, fids, k, v, 4 * k, 1, NULL), MT_OK);
    }
    mt_table_stats(t, &st);
    cr_assert_eq(st.rows, n);
    cr_assert_eq(st.inserts, n);
    cr_log_info("pre-sized for %llu rows over %u parts: capacity %llu, load %.3f, grows %llu",
                (unsigned long long)n, 1u << shards_log2, (unsigned long long)st.capacity,
                st.load_factor, (unsigned long long)st.grows);
    cr_expect_eq(st.grows, 0, "a table pre-sized for %llu rows grew %llu times filling them",
                 (unsigned long long)n, (unsigned long long)st.grows);
    cr_expect_eq(st.capacity, cap0);
    /* Every value survived (read back a sample of the rows). */
    for (uint64_t i = 0; i < n; i += 97) {
        uint64_t fid = MT_FID_MAKE(5, i * 0x9E3779B97F4A7C15ull);
        float out[4];
        cr_assert_eq(mt_table_lookup(t, &fid, 1, out, 4, NULL, 0, 1, NULL), MT_OK);
        for (int d = 0; d < 4; d++)
            cr_assert_eq(out[d], (float)i + (float)d / 4.0f);
    }
    mt_table_destroy(t);
}

Test(ops, presized_fill_does_not_grow) {
    presized_fill(3, 20000);
}

/* The default 1024 parts pre-sized for 200000 rows: ~195 rows per part against 256 slots
 * at load 0.9 (230 rows); parts hashing gives ~2.5 sd more rows than the average grow. */
Test(ops, presized_default_shards_fill_does_not_grow) {
    presized_fill(10, 200000);
}

/* initial_rows whose per-part share sits just under a power-of-two capacity times max_load
 * (2048 buckets * 4 * 0.9 = 7372.8 rows per part). Creation pre-sizes each part for
 * initial_rows / nparts + 1 rows at the full max_load, so any part that hashing gives a few
 * more rows than the average grows although the table was sized for exactly these rows. */
Test(ops, presized_fill_at_size_boundary_does_not_grow) {
    presized_fill(4, 16ull * 7371);
}

/* ============================== expiry ============================== */

static mt_table_t *expiry_table(uint32_t shards_log2, uint32_t ttl_s) {
    mt_table_slot_config_t sc[2];
    mt_table_slot_config_init(&sc[0], 1, 4);
    sc[0].opt = MT_OPT_SGD;
    sc[0].ttl_s = ttl_s;
    mt_table_slot_config_init(&sc[1], 2, 1);
    sc[1].opt = MT_OPT_SGD;
    sc[1].ttl_s = 0; /* never expires */
    mt_table_config_t cfg;
    mt_table_config_init(&cfg);
    cfg.slots = sc;
    cfg.nslots = 2;
    cfg.shards_log2 = shards_log2;
    mt_table_t *t = NULL;
    cr_assert_eq(mt_table_create(&cfg, &t), MT_OK);
    return t;
}

static int present(mt_table_t *t, uint64_t fid) {
    uint32_t dim = 0;
    cr_assert_eq(mt_table_dim(t, fid, &dim), MT_OK);
    float out[MAXDIM];
    uint8_t found = 9;
    cr_assert_eq(mt_table_lookup(t, &fid, 1, out, dim, &found, 0, 0, NULL), MT_OK);
    return found;
}

/* Last touch + ttl < now evicts; == does not. A lookup never refreshes, a training lookup,
 * an apply and an assign do, and an older now_s never lowers the touch time. */
Test(ops, expire_ttl_boundary_and_touch) {
    mt_table_t *t = expiry_table(2, 10);
    uint64_t a = MT_FID_MAKE(1, 1), b = MT_FID_MAKE(1, 2), c = MT_FID_MAKE(1, 3),
             d = MT_FID_MAKE(1, 4), z = MT_FID_MAKE(2, 1);
    float v[4] = {1, 2, 3, 4}, out[4];
    uint64_t ids[5] = {a, b, c, d, z};
    float vals[17] = {0};
    cr_assert_eq(mt_table_assign(t, ids, 5, vals, 17, 100, NULL), MT_OK);
    uint64_t all = mt_table_buckets(t), ev = 99;
    /* Touches at 105 (training lookup), 106 (apply), 107 (assign); an old time changes none. */
    cr_assert_eq(mt_table_lookup(t, &b, 1, out, 4, NULL, MT_TABLE_TRAIN, 105, NULL), MT_OK);
    cr_assert_eq(mt_table_apply(t, &c, 1, v, 4, 106, NULL), MT_OK);
    cr_assert_eq(mt_table_assign(t, &d, 1, v, 4, 107, NULL), MT_OK);
    cr_assert_eq(mt_table_lookup(t, &a, 1, out, 4, NULL, 0, 109, NULL), MT_OK); /* no touch */
    cr_assert_eq(mt_table_lookup(t, &b, 1, out, 4, NULL, MT_TABLE_TRAIN, 50, NULL), MT_OK);
    cr_assert_eq(mt_table_apply(t, &c, 1, v, 4, 50, NULL), MT_OK);
    cr_assert_eq(mt_table_assign(t, &d, 1, v, 4, 50, NULL), MT_OK);
    uint32_t touch_s = 0;
    cr_assert_eq(mt_table_get_row(t, b, NULL, NULL, 0, &touch_s, NULL, NULL), MT_OK);
    cr_assert_eq(touch_s, 105);
    cr_assert_eq(mt_table_get_row(t, c, NULL, NULL, 0, &touch_s, NULL, NULL), MT_OK);
    cr_assert_eq(touch_s, 106);
    cr_assert_eq(mt_table_get_row(t, d, NULL, NULL, 0, &touch_s, NULL, NULL), MT_OK);
    cr_assert_eq(touch_s, 107);
    /* a: touch 100 + 10 == 110: kept at 110, evicted at 111. */
    cr_assert_eq(mt_table_expire(t, 110, all, &ev), MT_OK);
    cr_assert_eq(ev, 0);
    cr_assert_eq(mt_table_expire(t, 111, all, &ev), MT_OK);
    cr_assert_eq(ev, 1);
    cr_assert(!present(t, a) && present(t, b) && present(t, c) && present(t, d));
    cr_assert_eq(mt_table_expire(t, 116, all, &ev), MT_OK);
    cr_assert_eq(ev, 1);
    cr_assert(!present(t, b) && present(t, c));
    cr_assert_eq(mt_table_expire(t, 118, all, &ev), MT_OK);
    cr_assert_eq(ev, 2);
    cr_assert(!present(t, c) && !present(t, d));
    /* ttl 0 never expires; a zero budget examines nothing. */
    cr_assert_eq(mt_table_expire(t, UINT32_MAX, all, &ev), MT_OK);
    cr_assert_eq(ev, 0);
    cr_assert(present(t, z));
    cr_assert_eq(mt_table_assign(t, &a, 1, v, 4, 1, NULL), MT_OK);
    cr_assert_eq(mt_table_expire(t, 1000, 0, &ev), MT_OK);
    cr_assert_eq(ev, 0);
    cr_assert(present(t, a));
    mt_table_stats_t st;
    mt_table_stats(t, &st);
    cr_assert_eq(st.evictions, 4);
    cr_assert_eq(st.rows, 2);
    mt_table_destroy(t);
}

/* Small budgets: each call evicts at most 4 rows per bucket of budget and only expired rows;
 * calls whose budgets add up to the table's buckets evict every expired row (the clock hand
 * resumes where the previous call stopped and wraps around the parts). */
static void expire_incremental(uint32_t shards_log2, size_t budget) {
    mt_table_t *t = expiry_table(shards_log2, 10);
    enum { N = 3000, NZ = 1000 };
    static uint64_t fids[N];
    float v[4] = {0.5f, 0, 0, 0};
    for (uint32_t i = 0; i < N; i++) {
        fids[i] = MT_FID_MAKE(1, i * 0x9E3779B97F4A7C15ull);
        cr_assert_eq(mt_table_assign(t, &fids[i], 1, v, 4, 1000 + i % 20, NULL), MT_OK);
    }
    for (uint32_t i = 0; i < NZ; i++) {
        uint64_t z = MT_FID_MAKE(2, i);
        cr_assert_eq(mt_table_assign(t, &z, 1, v, 1, 0, NULL), MT_OK);
    }
    /* Move the hand somewhere in the middle of the table first (nothing is expired yet). */
    uint64_t ev = 0;
    cr_assert_eq(mt_table_expire(t, 1000, 1 + budget * 7, &ev), MT_OK);
    cr_assert_eq(ev, 0);
    uint32_t now_s = 1020; /* expired: touch < 1010, i.e. i % 20 < 10 */
    const uint64_t want = N / 2;
    uint64_t buckets = mt_table_buckets(t);
    uint64_t calls = (buckets + budget - 1) / budget, total = 0;
    static float out[4 * N];
    static uint8_t found[N];
    for (uint64_t c = 0; c < calls; c++) {
        cr_assert_eq(mt_table_expire(t, now_s, budget, &ev), MT_OK);
        cr_assert_leq(ev, 4 * budget, "budget %zu evicted %llu", budget, (unsigned long long)ev);
        total += ev;
        if (c % 16 == 0 || c + 1 == calls) {
            cr_assert_eq(mt_table_lookup(t, fids, N, out, 4 * N, found, 0, now_s, NULL), MT_OK);
            uint64_t gone = 0;
            for (uint32_t i = 0; i < N; i++) {
                if (i % 20 >= 10) cr_assert(found[i], "unexpired id %u evicted", i);
                gone += !found[i];
            }
            cr_assert_eq(gone, total, "after %llu calls: %llu gone, %llu reported",
                         (unsigned long long)c + 1, (unsigned long long)gone,
                         (unsigned long long)total);
        }
        if (c + 1 < calls / 2) cr_assert_lt(total, want, "half the sweep evicted everything");
    }
    cr_assert_eq(total, want, "sweep of %llu buckets in %llu calls of %zu evicted %llu of %llu",
                 (unsigned long long)buckets, (unsigned long long)calls, budget,
                 (unsigned long long)total, (unsigned long long)want);
    mt_table_stats_t st;
    mt_table_stats(t, &st);
    cr_assert_eq(st.evictions, want);
    cr_assert_eq(st.rows, N - want + NZ);
    mt_table_destroy(t);
}

Test(ops, expire_incremental_small_budgets) {
    expire_incremental(0, 1);
    expire_incremental(2, 3);
    expire_incremental(4, 7);
    expire_incremental(10, 64);
}

/* ============================== hints ============================== */

/* Two tables of the same configuration and ids, no removals in either: the hints of one
 * point at its rows, and they must not count in the other (an apply there updates its own
 * rows, the first table's stay as they were). */
Test(ops, hints_of_another_table_do_not_count) {
    mt_table_t *t[2];
    for (int k = 0; k < 2; k++)
        t[k] = expiry_table(2, 0);
    enum { N = 64 };
    uint64_t fids[N];
    float init0[4 * N], init1[4 * N], g[4 * N], a[4 * N], b[4 * N];
    for (uint32_t i = 0; i < N; i++)
        fids[i] = MT_FID_MAKE(1, i + 1);
    for (size_t j = 0; j < 4 * N; j++)
        g[j] = 0.5f;
    mt_table_hint_t hints[N], other[N];
    cr_assert_eq(mt_table_lookup_rows(t[0], fids, N, init0, 4 * N, 1, hints, NULL), MT_OK);
    cr_assert_eq(mt_table_lookup_rows(t[1], fids, N, init1, 4 * N, 1, other, NULL), MT_OK);
    mt_table_op_stats_t st = {0};
    cr_assert_eq(mt_table_apply_rows(t[1], fids, hints, N, g, 4 * N, 2, &st), MT_OK);
    cr_assert_eq(st.found, N);
    cr_assert_eq(mt_table_lookup(t[0], fids, N, a, 4 * N, NULL, 0, 2, NULL), MT_OK);
    cr_assert_eq(mt_table_lookup(t[1], fids, N, b, 4 * N, NULL, 0, 2, NULL), MT_OK);
    for (size_t j = 0; j < 4 * N; j++) { /* (SGD: w - lr g, lr > 0) */
        cr_assert_eq(a[j], init0[j], "the hints' table changed: float %zu %g, was %g", j, a[j],
                     init0[j]);
        cr_assert_lt(b[j], init1[j], "the applied table: float %zu %g, was %g", j, b[j], init1[j]);
    }
    /* its own hints go to its own rows */
    cr_assert_eq(mt_table_apply_rows(t[0], fids, hints, N, g, 4 * N, 3, NULL), MT_OK);
    cr_assert_eq(mt_table_lookup(t[0], fids, N, a, 4 * N, NULL, 0, 3, NULL), MT_OK);
    for (size_t j = 0; j < 4 * N; j++)
        cr_assert_eq(a[j], b[j], "float %zu: %g, the other table's %g", j, a[j], b[j]);
    for (int k = 0; k < 2; k++)
        mt_table_destroy(t[k]);
}

/* ============================== batches in part order ============================== */

/* fids[0..n) grouped by part into out by mt_table_part_order() (what a trainer does to its
 * ids; @p count as it passes it, or NULL), checked against mt_table_parts_of(): a permutation,
 * the parts in ascending order, each part's ids in their order in fids. */
static void order_by_part(const mt_table_t *t, const uint64_t *fids, size_t n, uint64_t *out,
                          uint32_t *count) {
    const size_t m = n ? n : 1; /* (an empty batch still gets buffers) */
    uint32_t *to = malloc(m * sizeof(uint32_t)), *part = malloc(m * sizeof(uint32_t));
    size_t *from = malloc(m * sizeof(size_t));
    cr_assert(to && part && from);
    for (size_t j = 0; j < n; j++)
        from[j] = SIZE_MAX;
    cr_assert_eq(mt_table_part_order(t, fids, n, to, count), MT_OK);
    uint32_t np = mt_table_parts_of(t, fids, n, part);
    for (size_t i = 0; i < n; i++) {
        cr_assert_lt(part[i], np);
        cr_assert_lt(to[i], n, "id %zu placed at %u of %zu", i, to[i], n);
        cr_assert_eq(from[to[i]], SIZE_MAX, "place %u given twice", to[i]);
        from[to[i]] = i;
        out[to[i]] = fids[i];
    }
    for (size_t j = 1; j < n; j++) {
        size_t a = from[j - 1], b = from[j];
        cr_assert(part[a] < part[b] || (part[a] == part[b] && a < b),
                  "places %zu, %zu: ids %zu (part %u), %zu (part %u)", j - 1, j, a, part[a], b,
                  part[b]);
    }
    free(to);
    free(part);
    free(from);
}

/* The order by part is a stable sort by part, with 1 part (the batch's own order), 8, and
 * 2,048 (over the 1,024 whose counts it keeps on its stack), with and without a caller's
 * count; an id given twice keeps its two places' order. */
Test(ops, part_order_is_a_stable_sort_by_part) {
    mt_table_slot_config_t sc;
    mt_table_slot_config_init(&sc, 1, 4);
    enum { N = 5000 };
    uint64_t *fids = malloc(N * sizeof(uint64_t)), *sorted = malloc(N * sizeof(uint64_t));
    uint32_t *count = malloc((2048 + 1) * sizeof(uint32_t));
    cr_assert(fids && sorted && count);
    uint64_t x = 11;
    for (size_t i = 0; i < N; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        fids[i] = MT_FID_MAKE(1, (x >> 33) % (N / 2)); /* repeats */
    }
    const uint32_t logs[] = {0, 3, 11};
    for (size_t l = 0; l < sizeof(logs) / sizeof(logs[0]); l++) {
        mt_table_config_t cfg;
        mt_table_config_init(&cfg);
        cfg.slots = &sc;
        cfg.nslots = 1;
        cfg.shards_log2 = logs[l];
        cfg.filter_bytes = 0;
        mt_table_t *t;
        cr_assert_eq(mt_table_create(&cfg, &t), MT_OK);
        cr_assert_eq(mt_table_parts_of(t, NULL, 0, NULL), 1u << logs[l]);
        order_by_part(t, fids, N, sorted, NULL);
        if (logs[l] == 0) cr_assert_arr_eq(sorted, fids, N * sizeof(uint64_t));
        order_by_part(t, fids, N, sorted, count);
        order_by_part(t, fids, 0, sorted, NULL); /* an empty batch */
        mt_table_destroy(t);
    }
    free(fids);
    free(sorted);
    free(count);
}

/* The same batches in arrival order in one table and grouped by part in another (a writer
 * then keeps a part's lock across a run of ids, and lets it go when a grow retires a bucket
 * array mid-run): training lookups with hints, applies with and without them and assigns,
 * on tables that grow from empty, leave every row, its state and its metadata the same. */
Test(ops, batches_in_part_order_change_nothing) {
    mt_table_slot_config_t sc[2];
    mt_table_slot_config_init(&sc[0], 1, 4);
    mt_table_slot_config_init(&sc[1], 2, 3);
    sc[0].opt = sc[1].opt = MT_OPT_ADAGRAD;
    mt_table_config_t cfg;
    mt_table_config_init(&cfg);
    cfg.slots = sc;
    cfg.nslots = 2;
    cfg.shards_log2 = 3;
    cfg.filter_bytes = 0;
    mt_table_t *t[2];
    for (int k = 0; k < 2; k++)
        cr_assert_eq(mt_table_create(&cfg, &t[k]), MT_OK);
    cr_assert_eq(mt_table_parts_of(t[0], NULL, 0, NULL), 8u);
    enum { N = 3000, ROUNDS = 6, W = 4 };
    uint64_t *fids = malloc(N * sizeof(uint64_t)), *sorted = malloc(N * sizeof(uint64_t));
    float *out = malloc(N * W * sizeof(float)), *g = malloc(N * W * sizeof(float));
    mt_table_hint_t *hints = malloc(N * sizeof(mt_table_hint_t));
    cr_assert(fids && sorted && out && g && hints);
    uint64_t x = 7;
    size_t nf = 0;
    for (int r = 0; r < ROUNDS; r++) {
        /* new ids each round (the parts grow during the runs), and repeats of old ones */
        for (size_t i = 0; i < N; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            uint64_t v = (x >> 33) % (uint64_t)(N * (r + 1));
            fids[i] = MT_FID_MAKE(1 + (v & 1), v);
        }
        for (int k = 0; k < 2; k++) {
            const uint64_t *b = fids;
            if (k) {
                order_by_part(t[1], fids, N, sorted, NULL);
                b = sorted;
            }
            cr_assert_eq(mt_table_batch_floats(t[k], b, N, &nf), MT_OK);
            /* an id's gradient is its own (the sort moves it with the id) */
            for (size_t i = 0, j = 0; i < N; i++)
                for (uint32_t c = 0; c < (MT_FID_SLOT(b[i]) == 1 ? 4u : 3u); c++, j++)
                    g[j] = 0.125f * (float)((b[i] + c + (uint64_t)r) % 5) - 0.25f;
            uint32_t now = 10 + (uint32_t)r;
            cr_assert_eq(mt_table_lookup_rows(t[k], b, N, out, nf, now, hints, NULL), MT_OK);
            cr_assert_eq(mt_table_apply_rows(t[k], b, hints, N, g, nf, now, NULL), MT_OK);
            cr_assert_eq(mt_table_apply(t[k], b, N, g, nf, now, NULL), MT_OK);
            if (r == ROUNDS - 1) /* assigns of new ids too: they insert */
                cr_assert_eq(mt_table_assign(t[k], b, N, g, nf, now, NULL), MT_OK);
        }
    }
    mt_table_stats_t st[2];
    for (int k = 0; k < 2; k++)
        mt_table_stats(t[k], &st[k]);
    cr_assert_eq(st[0].rows, st[1].rows);
    cr_assert_gt(st[1].grows, 8u, "the parts grew %llu times", (unsigned long long)st[1].grows);
    uint64_t compared = 0;
    for (uint64_t v = 0; v < (uint64_t)N * ROUNDS; v++) {
        uint64_t fid = MT_FID_MAKE(1 + (v & 1), v);
        float e[2][W], s[2][W];
        uint32_t touch[2], count[2];
        mt_err_t err[2];
        for (int k = 0; k < 2; k++)
            err[k] = mt_table_get_row(t[k], fid, e[k], s[k], W, &touch[k], &count[k], NULL);
        cr_assert_eq(err[0], err[1], "id %llu", (unsigned long long)v);
        if (err[0] != MT_OK) continue;
        uint32_t d = (v & 1) ? 3 : 4;
        cr_assert_eq(memcmp(e[0], e[1], d * sizeof(float)), 0, "id %llu", (unsigned long long)v);
        cr_assert_eq(memcmp(s[0], s[1], d * sizeof(float)), 0, "id %llu", (unsigned long long)v);
        cr_assert_eq(touch[0], touch[1]);
        cr_assert_eq(count[0], count[1]);
        compared++;
    }
    cr_assert_eq(compared, st[0].rows);
    free(fids);
    free(sorted);
    free(out);
    free(g);
    free(hints);
    for (int k = 0; k < 2; k++)
        mt_table_destroy(t[k]);
}
