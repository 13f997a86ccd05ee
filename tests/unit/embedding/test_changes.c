/*
 * test_changes.c - change tracking for replicas: mt_table_changes_begin/next/end.
 *
 * Why: serving replicas are kept up to date only through this stream, so a lost change is a
 * silently stale (or resurrected) embedding in production. The contract (mt/table.h): after
 * applying a stream in order (assign for upserts, remove for deletions; drop everything first
 * when it is a full one), the replica equals the source; an incremental sync either is
 * complete or says MT_FULL_SYNC / full=1; the log keeps only live entries, so rewriting a few
 * hot ids never overflows it.
 *
 * What is covered:
 *  - random rounds of changes (training admissions, applies with four optimizers, assigns,
 *    removes, expiry) on a source, a replica synced incrementally from the previous `upto`
 *    and compared with the source for every id after every sync; from-scratch full syncs;
 *    the same with a tiny change log so that overflows and full syncs happen along the way;
 *  - the shape of streams: versions above `since`, parts in order, versions increasing inside
 *    a part, deletions with dim 0, full streams without deletions or repeated ids;
 *  - deletions, delete + re-insert and insert + delete inside one interval, expiry;
 *  - overflow: full=1 from begin or MT_FULL_SYNC from next, drops and full_sync_below
 *    counted, and incremental syncs working again after the full one;
 *  - hot ids: a million applies on 100 ids with a small log drop nothing;
 *  - small cap / values_cap (many calls, same entries) and MT_TOO_SMALL;
 *  - a loaded table answers full=1 to any since from before the load.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mt/table.h"
#include "table_int.h" /* mt__part_of(): checks that parts come in order */

#ifdef MT_SANITIZED
#define SCALE_DIV 4
#else
#define SCALE_DIV 1
#endif

#define CHECK(cond, ...)                          \
    do {                                          \
        if (!(cond)) cr_assert_fail(__VA_ARGS__); \
    } while (0)

#define M48      0xFFFFFFFFFFFFull
#define MIX      0x9E3779B97F4A7C15ull
#define MAXDIM   16
#define MAXBATCH 16

/* ============================== the universe of ids ============================== */

#define NSLOTS 4
typedef struct slotdef {
    uint16_t slot;
    uint32_t dim;
    uint32_t ttl_s;
    mt_table_opt_t opt;
    mt_table_init_t init;
    mt_table_precision_t prec;
    uint32_t nids;
} slotdef_t;

static const slotdef_t SLOTS[NSLOTS] = {
    {21, 1, 0, MT_OPT_SGD, MT_INIT_UNIFORM, MT_PREC_FP32, 4000},
    {22, 4, 40, MT_OPT_ADAGRAD, MT_INIT_UNIFORM, MT_PREC_FP32, 3000},
    {23, 16, 0, MT_OPT_ADAM, MT_INIT_NORMAL, MT_PREC_FP32, 1500},
    {24, 4, 80, MT_OPT_FTRL, MT_INIT_UNIFORM, MT_PREC_FP16, 1500},
};

static uint64_t fid_of(int si, uint32_t i) {
    return MT_FID_MAKE(SLOTS[si].slot, ((uint64_t)i * MIX) & M48);
}

/* Inverse of fid_of(): @returns 0 if fid is not one of the universe's ids. */
static int idx_of(uint64_t fid, int *si, uint32_t *i) {
    uint64_t inv = MIX; /* Newton: inverse of an odd number mod 2^64 */
    for (int k = 0; k < 6; k++)
        inv *= 2 - MIX * inv;
    for (int s = 0; s < NSLOTS; s++) {
        if (MT_FID_SLOT(fid) != SLOTS[s].slot) continue;
        uint64_t x = ((fid & M48) * inv) & M48;
        if (x >= SLOTS[s].nids) return 0;
        *si = s;
        *i = (uint32_t)x;
        return 1;
    }
    return 0;
}

static uint64_t rng_state;
static uint64_t rnd64(void) {
    uint64_t z = (rng_state += MIX);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static uint32_t rnd(uint32_t n) {
    return (uint32_t)(rnd64() % n);
}
static float rnd_val(void) {
    return (float)((int)rnd(2001) - 1000) / 256.0f;
}

static void slot_configs(mt_table_slot_config_t *sc, int replica) {
    for (int si = 0; si < NSLOTS; si++) {
        mt_table_slot_config_init(&sc[si], SLOTS[si].slot, SLOTS[si].dim);
        sc[si].opt = replica ? MT_OPT_SGD : SLOTS[si].opt;
        sc[si].init = SLOTS[si].init;
        sc[si].init_scale = 0.05f;
        sc[si].lr = 0.05f;
        sc[si].ttl_s = replica ? 0 : SLOTS[si].ttl_s; /* a replica only follows the stream */
        sc[si].precision = SLOTS[si].prec;
    }
}

static mt_table_t *new_table(uint32_t shards_log2, uint64_t changelog_entries, int replica) {
    mt_table_slot_config_t sc[NSLOTS];
    slot_configs(sc, replica);
    mt_table_config_t cfg;
    mt_table_config_init(&cfg);
    cfg.slots = sc;
    cfg.nslots = NSLOTS;
    cfg.shards_log2 = shards_log2;
    cfg.filter_bytes = 0;
    if (changelog_entries) cfg.changelog_entries = changelog_entries;
    mt_table_t *t = NULL;
    cr_assert_eq(mt_table_create(&cfg, &t), MT_OK);
    return t;
}

/* ============================== syncing a replica ============================== */

typedef struct stream_ent {
    mt_table_change_t c;
    float v[MAXDIM];
} stream_ent_t;

typedef struct sync {
    mt_table_t *src, *rep;
    uint32_t rep_shards;
    uint64_t since;
    size_t cap, vcap; /* buffer sizes handed to next() */
    int keep;         /* record the last stream in ents */
    stream_ent_t *ents;
    size_t nents, ents_cap;
    /* figures */
    uint64_t n_syncs, n_full, n_restarts, n_entries, n_deleted, n_calls;
} sync_t;

static void sync_init(sync_t *s, mt_table_t *src, uint32_t rep_shards) {
    memset(s, 0, sizeof(*s));
    s->src = src;
    s->rep_shards = rep_shards;
    s->rep = new_table(rep_shards, 256ull << rep_shards, 1);
    s->cap = 256;
    s->vcap = 4096;
}

static void sync_fini(sync_t *s) {
    mt_table_destroy(s->rep);
    free(s->ents);
}

static void record(sync_t *s, const mt_table_change_t *c, const float *v) {
    if (!s->keep) return;
    if (s->nents == s->ents_cap) {
        s->ents_cap = s->ents_cap ? 2 * s->ents_cap : 1024;
        s->ents = realloc(s->ents, s->ents_cap * sizeof(*s->ents));
        cr_assert_not_null(s->ents);
    }
    stream_ent_t *e = &s->ents[s->nents++];
    e->c = *c;
    memcpy(e->v, v, c->dim * sizeof(float));
}

/* Drains one stream into the replica, checking its shape. @returns MT_OK or MT_FULL_SYNC. */
static mt_err_t drain(sync_t *s, mt_table_changes_t *it, int full) {
    mt_table_change_t *out = malloc(s->cap * sizeof(*out));
    float *vals = malloc((s->vcap ? s->vcap : 1) * sizeof(float));
    cr_assert(out && vals);
    uint8_t *seen = full ? calloc(4000 * NSLOTS, 1) : NULL;
    int64_t last_part = -1;
    uint64_t last_version = 0;
    mt_err_t ret = MT_OK;
    for (;;) {
        size_t n = 999999;
        mt_err_t err = mt_table_changes_next(it, out, s->cap, vals, s->vcap, &n);
        s->n_calls++;
        if (err == MT_FULL_SYNC) {
            CHECK(!full, "a full stream answered MT_FULL_SYNC");
            ret = err;
            break;
        }
        CHECK(err == MT_OK, "changes_next: %d", err);
        CHECK(n <= s->cap, "changes_next wrote %zu entries, cap %zu", n, s->cap);
        if (n == 0) break;
        size_t off = 0;
        for (size_t k = 0; k < n; k++) {
            const mt_table_change_t *c = &out[k];
            uint32_t dim = 0;
            CHECK(mt_table_dim(s->src, c->fid, &dim) == MT_OK, "stream fid of unknown slot");
            CHECK(c->deleted == 0 || c->deleted == 1, "deleted = %u", c->deleted);
            CHECK(c->dim == (c->deleted ? 0 : dim), "entry dim %u (slot dim %u, deleted %u)",
                  c->dim, dim, c->deleted);
            if (!full)
                CHECK(c->version > s->since, "entry version %llu not above since %llu",
                      (unsigned long long)c->version, (unsigned long long)s->since);
            CHECK(c->version > 0, "entry version 0");
            int64_t part = mt__part_of(s->src, c->fid);
            CHECK(part >= last_part, "part %lld after part %lld", (long long)part,
                  (long long)last_part);
            if (!full && part == last_part)
                CHECK(c->version > last_version,
                      "versions out of order in a part: %llu "
                      "after %llu",
                      (unsigned long long)c->version, (unsigned long long)last_version);
            last_part = part;
            last_version = c->version;
            if (full) {
                int si;
                uint32_t i;
                CHECK(!c->deleted, "a full stream holds a deletion");
                if (idx_of(c->fid, &si, &i)) {
                    CHECK(!seen[si * 4000 + i], "a full stream repeats an id");
                    seen[si * 4000 + i] = 1;
                }
            }
            record(s, c, vals + off);
            if (c->deleted) {
                CHECK(mt_table_remove(s->rep, &c->fid, 1, NULL) == MT_OK, "replica remove");
                s->n_deleted++;
            } else {
                CHECK(mt_table_assign(s->rep, &c->fid, 1, vals + off, c->dim, 0, NULL) == MT_OK,
                      "replica assign");
            }
            off += c->dim;
            s->n_entries++;
        }
        CHECK(off <= s->vcap, "values overflowed values_cap");
    }
    free(out);
    free(vals);
    free(seen);
    return ret;
}

/* One sync from s->since; a full stream (or MT_FULL_SYNC) rebuilds the replica from empty.
 * @returns whether the sync was full. */
static int sync_once(sync_t *s) {
    int was_full = 0;
    s->nents = 0;
    for (;;) {
        mt_table_changes_t *it = NULL;
        uint64_t upto = 0;
        int full = -1;
        CHECK(mt_table_changes_begin(s->src, s->since, &it, &upto, &full) == MT_OK,
              "changes_begin");
        CHECK(full == 0 || full == 1, "full = %d", full);
        if (s->since == 0) CHECK(full == 1, "since 0 must give a full stream");
        CHECK(upto > s->since || full, "upto %llu not above since %llu", (unsigned long long)upto,
              (unsigned long long)s->since);
        if (full) {
            mt_table_destroy(s->rep);
            s->rep = new_table(s->rep_shards, 256ull << s->rep_shards, 1);
            was_full = 1;
        }
        mt_err_t err = drain(s, it, full);
        mt_table_changes_end(it);
        if (err == MT_FULL_SYNC) {
            s->n_restarts++;
            s->since = 0;
            s->nents = 0;
            continue;
        }
        s->since = upto;
        break;
    }
    s->n_syncs++;
    s->n_full += was_full;
    return was_full;
}

/* Source and replica agree on every id of the universe: presence and exact values. */
static void compare_all(mt_table_t *src, mt_table_t *rep, const uint8_t *const *model_present) {
    uint64_t fids[512];
    float a[512 * MAXDIM], b[512 * MAXDIM];
    uint8_t fa[512], fb[512];
    for (int si = 0; si < NSLOTS; si++) {
        uint32_t d = SLOTS[si].dim;
        for (uint32_t base = 0; base < SLOTS[si].nids; base += 512) {
            uint32_t k = SLOTS[si].nids - base < 512 ? SLOTS[si].nids - base : 512;
            for (uint32_t j = 0; j < k; j++)
                fids[j] = fid_of(si, base + j);
            CHECK(mt_table_lookup(src, fids, k, a, k * d, fa, 0, 0, NULL) == MT_OK, "lookup");
            CHECK(mt_table_lookup(rep, fids, k, b, k * d, fb, 0, 0, NULL) == MT_OK, "lookup");
            for (uint32_t j = 0; j < k; j++) {
                CHECK(fa[j] == fb[j], "slot %d id %u: source has it %u, replica %u", si, base + j,
                      fa[j], fb[j]);
                if (model_present)
                    CHECK(fa[j] == model_present[si][base + j],
                          "slot %d id %u: source has it %u, model %u", si, base + j, fa[j],
                          model_present[si][base + j]);
                CHECK(memcmp(a + j * d, b + j * d, d * sizeof(float)) == 0,
                      "slot %d id %u: replica value %g, source %g", si, base + j, b[j * d],
                      a[j * d]);
            }
        }
    }
    mt_table_stats_t ss, rs;
    mt_table_stats(src, &ss);
    mt_table_stats(rep, &rs);
    CHECK(ss.rows == rs.rows, "source %llu rows, replica %llu", (unsigned long long)ss.rows,
          (unsigned long long)rs.rows);
}

/* ============================== random rounds ============================== */

typedef struct model {
    uint8_t *present[NSLOTS];
    uint32_t *touch[NSLOTS];
} model_t;

static void model_init(model_t *m) {
    for (int si = 0; si < NSLOTS; si++) {
        m->present[si] = calloc(SLOTS[si].nids, 1);
        m->touch[si] = calloc(SLOTS[si].nids, sizeof(uint32_t));
        cr_assert(m->present[si] && m->touch[si]);
    }
}

static void model_fini(model_t *m) {
    for (int si = 0; si < NSLOTS; si++) {
        free(m->present[si]);
        free(m->touch[si]);
    }
}

/* One random batch on the source, mirrored in the presence model. */
static void random_batch(mt_table_t *t, model_t *m, uint32_t now_s) {
    int sis[MAXBATCH];
    uint32_t ixs[MAXBATCH];
    uint64_t fids[MAXBATCH];
    float v[MAXBATCH * MAXDIM], out[MAXBATCH * MAXDIM];
    size_t n = 1 + rnd(MAXBATCH), len = 0;
    for (size_t k = 0; k < n; k++) {
        sis[k] = (int)rnd(NSLOTS);
        uint32_t nids = SLOTS[sis[k]].nids;
        ixs[k] = rnd(3) == 0 ? rnd(nids / 20) : rnd(nids);
        fids[k] = fid_of(sis[k], ixs[k]);
        len += SLOTS[sis[k]].dim;
    }
    for (size_t j = 0; j < len; j++)
        v[j] = rnd_val();
    uint32_t op = rnd(100);
    if (op < 35) {
        CHECK(mt_table_lookup(t, fids, n, out, len, NULL, MT_TABLE_TRAIN, now_s, NULL) == MT_OK,
              "train");
        for (size_t k = 0; k < n; k++) {
            m->present[sis[k]][ixs[k]] = 1;
            if (now_s > m->touch[sis[k]][ixs[k]]) m->touch[sis[k]][ixs[k]] = now_s;
        }
    } else if (op < 70) {
        CHECK(mt_table_apply(t, fids, n, v, len, now_s, NULL) == MT_OK, "apply");
        for (size_t k = 0; k < n; k++)
            if (m->present[sis[k]][ixs[k]] && now_s > m->touch[sis[k]][ixs[k]])
                m->touch[sis[k]][ixs[k]] = now_s;
    } else if (op < 82) {
        CHECK(mt_table_assign(t, fids, n, v, len, now_s, NULL) == MT_OK, "assign");
        for (size_t k = 0; k < n; k++) {
            if (!m->present[sis[k]][ixs[k]] || now_s > m->touch[sis[k]][ixs[k]])
                m->touch[sis[k]][ixs[k]] = now_s;
            m->present[sis[k]][ixs[k]] = 1;
        }
    } else {
        CHECK(mt_table_remove(t, fids, n, NULL) == MT_OK, "remove");
        for (size_t k = 0; k < n; k++)
            m->present[sis[k]][ixs[k]] = 0;
    }
}

/* Expiry with any budget; the model learns which expired ids went by looking them up. */
static void random_expire(mt_table_t *t, model_t *m, uint32_t now_s, size_t budget) {
    uint64_t ev = 0;
    CHECK(mt_table_expire(t, now_s, budget, &ev) == MT_OK, "expire");
    uint64_t gone = 0;
    for (int si = 0; si < NSLOTS; si++) {
        if (!SLOTS[si].ttl_s) continue;
        for (uint32_t i = 0; i < SLOTS[si].nids; i++) {
            if (!m->present[si][i] || (uint64_t)m->touch[si][i] + SLOTS[si].ttl_s >= now_s)
                continue;
            uint64_t fid = fid_of(si, i);
            float out[MAXDIM];
            uint8_t found = 0;
            CHECK(mt_table_lookup(t, &fid, 1, out, SLOTS[si].dim, &found, 0, 0, NULL) == MT_OK,
                  "lookup");
            if (!found) {
                m->present[si][i] = 0;
                gone++;
            }
        }
    }
    CHECK(gone == ev, "expire reported %llu, %llu expired ids went", (unsigned long long)ev,
          (unsigned long long)gone);
}

static void random_rounds(uint32_t shards_log2, uint64_t changelog_entries, int rounds,
                          uint64_t seed, const char *name, int expect_incremental) {
    rng_state = seed;
    mt_table_t *src = new_table(shards_log2, changelog_entries, 0);
    sync_t s;
    sync_init(&s, src, 1);
    model_t m;
    model_init(&m);
    uint32_t now_s = 1000;
    uint64_t incr_syncs = 0, incr_full = 0;
    for (int round = 0; round < rounds; round++) {
        uint32_t batches = 1 + rnd(rnd(4) == 0 ? 400 : 40);
        for (uint32_t b = 0; b < batches; b++) {
            if (rnd(16) == 0) now_s++;
            if (rnd(100) == 0)
                random_expire(src, &m, now_s, rnd(2) ? (size_t)mt_table_buckets(src) : rnd(20));
            else
                random_batch(src, &m, now_s);
        }
        if (rnd(5) == 0) continue; /* let changes pile up over several rounds */
        if (round % 50 == 49) {
            s.since = 0; /* from scratch: the replica is rebuilt from a full stream */
            cr_assert_eq(sync_once(&s), 1);
        } else {
            uint64_t since = s.since;
            int full = sync_once(&s);
            if (since != 0 && expect_incremental)
                CHECK(!full, "round %d: a full sync without log drops", round);
            incr_syncs += since != 0 && !full;
            incr_full += since != 0 && full;
        }
        compare_all(src, s.rep, (const uint8_t *const *)m.present);
    }
    mt_table_stats_t st;
    mt_table_stats(src, &st);
    cr_log_info("%s: %d rounds, %llu syncs (%llu full, %llu incremental, %llu restarted by "
                "MT_FULL_SYNC, %llu full from since > 0), %llu entries (%llu deletions) in %llu "
                "next() calls, source "
                "rows %llu, evictions %llu, changelog drops %llu, full_sync_below %llu, "
                "version %llu",
                name, rounds, (unsigned long long)s.n_syncs, (unsigned long long)s.n_full,
                (unsigned long long)incr_syncs, (unsigned long long)s.n_restarts,
                (unsigned long long)incr_full, (unsigned long long)s.n_entries,
                (unsigned long long)s.n_deleted, (unsigned long long)s.n_calls,
                (unsigned long long)st.rows, (unsigned long long)st.evictions,
                (unsigned long long)st.changelog_drops, (unsigned long long)st.full_sync_below,
                (unsigned long long)st.version);
    cr_assert_gt(st.evictions, 0);
    cr_assert_gt(st.removals, 0);
    if (expect_incremental) {
        cr_assert_gt(s.n_deleted, 0);
        cr_assert_eq(st.changelog_drops, 0);
        cr_assert_gt(incr_syncs, (uint64_t)rounds / 2);
    } else {
        cr_assert_gt(st.changelog_drops, 0, "the tiny log never overflowed");
        cr_assert_gt(incr_full + s.n_restarts, 0, "overflows never forced a full sync");
    }
    sync_fini(&s);
    model_fini(&m);
    mt_table_destroy(src);
}

Test(changes, random_rounds_incremental, .timeout = 600) {
    random_rounds(3, 0, 600 / SCALE_DIV, 11, "default log", 1);
}

Test(changes, random_rounds_one_part, .timeout = 600) {
    random_rounds(0, 0, 300 / SCALE_DIV, 12, "one part", 1);
}

Test(changes, random_rounds_tiny_log_overflows, .timeout = 600) {
    random_rounds(2, 4 * 64, 600 / SCALE_DIV, 13, "tiny log", 0);
}

/* ============================== deterministic cases ============================== */

/* Source with the universe's slots; helpers on single ids. */
static void put(mt_table_t *t, uint64_t fid, float x, uint32_t now_s) {
    uint32_t d = 0;
    cr_assert_eq(mt_table_dim(t, fid, &d), MT_OK);
    float v[MAXDIM];
    for (uint32_t j = 0; j < d; j++)
        v[j] = x + (float)j;
    cr_assert_eq(mt_table_assign(t, &fid, 1, v, d, now_s, NULL), MT_OK);
}

static void del(mt_table_t *t, uint64_t fid) {
    uint64_t removed = 0;
    cr_assert_eq(mt_table_remove(t, &fid, 1, &removed), MT_OK);
    cr_assert_eq(removed, 1);
}

static int has(mt_table_t *t, uint64_t fid, float *val) {
    uint32_t d = 0;
    cr_assert_eq(mt_table_dim(t, fid, &d), MT_OK);
    float v[MAXDIM];
    uint8_t found = 0;
    cr_assert_eq(mt_table_lookup(t, &fid, 1, v, d, &found, 0, 0, NULL), MT_OK);
    if (val) *val = v[0];
    return found;
}

/* Index of the last entry of fid in the recorded stream, or -1. */
static long last_entry(const sync_t *s, uint64_t fid) {
    long r = -1;
    for (size_t i = 0; i < s->nents; i++)
        if (s->ents[i].c.fid == fid) r = (long)i;
    return r;
}

Test(changes, deletions_and_reinserts_within_one_interval) {
    mt_table_t *src = new_table(2, 0, 0);
    sync_t s;
    sync_init(&s, src, 0);
    s.keep = 1;
    uint64_t a = fid_of(1, 1), b = fid_of(1, 2), c = fid_of(2, 3), d = fid_of(0, 4),
             e = fid_of(3, 5), keep = fid_of(2, 6);
    put(src, a, 1, 100);
    put(src, c, 3, 100);
    put(src, d, 4, 100);
    put(src, keep, 6, 100);
    cr_assert_eq(sync_once(&s), 1);
    cr_assert_eq(s.nents, 4);
    compare_all(src, s.rep, NULL);

    /* a: plain deletion. */
    del(src, a);
    cr_assert_eq(sync_once(&s), 0);
    long ia = last_entry(&s, a);
    cr_assert_geq(ia, 0, "the deletion of a is not in the stream");
    cr_assert_eq(s.ents[ia].c.deleted, 1);
    cr_assert_eq(s.ents[ia].c.dim, 0);
    cr_assert(!has(s.rep, a, NULL));
    cr_assert(has(s.rep, keep, NULL));
    compare_all(src, s.rep, NULL);

    /* c: deleted then assigned again; d: deleted then re-admitted by a training lookup;
     * b and e: inserted then deleted (b never reached the replica, e is a new id). */
    float x = 0;
    del(src, c);
    put(src, c, 33, 101);
    del(src, d);
    float out[MAXDIM];
    cr_assert_eq(mt_table_lookup(src, &d, 1, out, 1, NULL, MT_TABLE_TRAIN, 101, NULL), MT_OK);
    put(src, b, 2, 101);
    del(src, b);
    put(src, e, 5, 101);
    del(src, e);
    cr_assert_eq(sync_once(&s), 0);
    long ic = last_entry(&s, c), id = last_entry(&s, d), ib = last_entry(&s, b),
         ie = last_entry(&s, e);
    cr_assert_geq(ic, 0);
    cr_assert_eq(s.ents[ic].c.deleted, 0, "c ends deleted in the stream");
    cr_assert_eq(s.ents[ic].v[0], 33.0f);
    cr_assert_geq(id, 0);
    cr_assert_eq(s.ents[id].c.deleted, 0, "d ends deleted in the stream");
    cr_assert(ib < 0 || s.ents[ib].c.deleted, "b ends present in the stream");
    cr_assert(ie < 0 || s.ents[ie].c.deleted, "e ends present in the stream");
    cr_assert(has(s.rep, c, &x) && x == 33.0f);
    cr_assert(has(s.rep, d, NULL));
    cr_assert(!has(s.rep, b, NULL) && !has(s.rep, e, NULL));
    compare_all(src, s.rep, NULL);

    /* Expiry is a deletion too (slot 22 has ttl 40). */
    uint64_t x1 = fid_of(1, 100);
    put(src, x1, 7, 200);
    cr_assert_eq(sync_once(&s), 0);
    cr_assert(has(s.rep, x1, NULL));
    uint64_t ev = 0;
    cr_assert_eq(mt_table_expire(src, 1000, (size_t)mt_table_buckets(src), &ev), MT_OK);
    cr_assert_geq(ev, 1);
    cr_assert_eq(sync_once(&s), 0);
    long ix = last_entry(&s, x1);
    cr_assert_geq(ix, 0);
    cr_assert_eq(s.ents[ix].c.deleted, 1);
    cr_assert(!has(s.rep, x1, NULL));
    compare_all(src, s.rep, NULL);
    sync_fini(&s);
    mt_table_destroy(src);
}

/* A change made after begin() but before the stream reached its part is never lost: if it
 * is not in this stream it is in the next one (from upto). */
Test(changes, change_during_stream_is_not_lost) {
    mt_table_t *src = new_table(2, 0, 0);
    sync_t s;
    sync_init(&s, src, 0);
    for (uint32_t i = 0; i < 200; i++)
        put(src, fid_of(0, i), (float)i, 1);
    cr_assert_eq(sync_once(&s), 1);
    put(src, fid_of(0, 7), 70, 2);
    mt_table_changes_t *it = NULL;
    uint64_t upto = 0;
    int full = 1;
    cr_assert_eq(mt_table_changes_begin(src, s.since, &it, &upto, &full), MT_OK);
    cr_assert_eq(full, 0);
    /* After begin: change an existing id, add one, remove one. */
    put(src, fid_of(0, 8), 80, 3);
    put(src, fid_of(0, 500), 5, 3);
    del(src, fid_of(0, 9));
    cr_assert_eq(drain(&s, it, 0), MT_OK);
    mt_table_changes_end(it);
    s.since = upto;
    cr_assert_eq(sync_once(&s), 0);
    compare_all(src, s.rep, NULL);
    float x = 0;
    cr_assert(has(s.rep, fid_of(0, 8), &x) && x == 80.0f);
    cr_assert(has(s.rep, fid_of(0, 500), NULL));
    cr_assert(!has(s.rep, fid_of(0, 9), NULL));
    sync_fini(&s);
    mt_table_destroy(src);
}

/* Changes each of n distinct new ids once (more than a tiny log holds). */
static void churn(mt_table_t *t, uint32_t first, uint32_t n, uint32_t now_s) {
    for (uint32_t i = first; i < first + n; i++)
        put(t, fid_of(0, i), (float)i, now_s);
}

Test(changes, overflow_gives_full_sync) {
    /* 2 parts of 64 entries. */
    mt_table_t *src = new_table(1, 128, 0);
    sync_t s;
    sync_init(&s, src, 2);
    churn(src, 0, 50, 1);
    cr_assert_eq(sync_once(&s), 1);
    uint64_t since = s.since;
    mt_table_stats_t st;
    mt_table_stats(src, &st);
    cr_assert_eq(st.changelog_drops, 0);
    cr_assert_eq(st.full_sync_below, 0);
    churn(src, 50, 1000, 2);
    mt_table_stats(src, &st);
    cr_assert_gt(st.changelog_drops, 0);
    cr_assert_gt(st.full_sync_below, since);
    mt_table_changes_t *it = NULL;
    uint64_t upto = 0;
    int full = 0;
    cr_assert_eq(mt_table_changes_begin(src, since, &it, &upto, &full), MT_OK);
    cr_assert_eq(full, 1, "an incremental sync after an overflow must be full");
    mt_table_changes_end(it);
    cr_assert_eq(sync_once(&s), 1);
    compare_all(src, s.rep, NULL);
    cr_log_info("overflow: %llu drops, full_sync_below %llu, since %llu",
                (unsigned long long)st.changelog_drops, (unsigned long long)st.full_sync_below,
                (unsigned long long)since);
    sync_fini(&s);
    mt_table_destroy(src);
}

/* The log overflows between begin() and the first next(): next answers MT_FULL_SYNC rather
 * than a stream with holes. */
Test(changes, overflow_during_stream_answers_full_sync) {
    mt_table_t *src = new_table(1, 128, 0);
    sync_t s;
    sync_init(&s, src, 2);
    churn(src, 0, 50, 1);
    cr_assert_eq(sync_once(&s), 1);
    mt_table_stats_t st;
    mt_table_stats(src, &st);
    /* st.version is the highest version handed out: the replica holds everything up to it. */
    uint64_t since = st.version;
    mt_table_changes_t *it = NULL;
    uint64_t upto = 0;
    int full = 1;
    cr_assert_eq(mt_table_changes_begin(src, since, &it, &upto, &full), MT_OK);
    cr_assert_eq(full, 0);
    churn(src, 50, 1000, 2);
    mt_table_change_t out[64];
    float vals[64 * MAXDIM];
    size_t n = 0;
    mt_err_t err = MT_OK;
    for (int calls = 0; calls < 100; calls++) {
        err = mt_table_changes_next(it, out, 64, vals, 64 * MAXDIM, &n);
        if (err != MT_OK || n == 0) break;
    }
    cr_assert_eq(err, MT_FULL_SYNC, "a stream overtaken by log drops did not say so");
    mt_table_changes_end(it);
    s.since = since;
    cr_assert_eq(sync_once(&s), 1);
    compare_all(src, s.rep, NULL);
    sync_fini(&s);
    mt_table_destroy(src);
}

/* After an overflow and the full sync it forces, the next few changes sync incrementally:
 * the upto of the full sync must be at or above full_sync_below. */
Test(changes, incremental_again_after_overflow_and_full_sync) {
    mt_table_t *src = new_table(1, 128, 0);
    sync_t s;
    sync_init(&s, src, 2);
    churn(src, 0, 1000, 1);
    mt_table_stats_t st;
    mt_table_stats(src, &st);
    cr_assert_gt(st.changelog_drops, 0);
    cr_assert_eq(sync_once(&s), 1);
    put(src, fid_of(0, 3), 33, 2);
    put(src, fid_of(0, 2000), 1, 2);
    del(src, fid_of(0, 4));
    uint64_t since = s.since;
    mt_table_stats(src, &st);
    cr_expect_eq(sync_once(&s), 0,
                 "3 changes after a full sync need another full one (since %llu, "
                 "full_sync_below %llu, version %llu)",
                 (unsigned long long)since, (unsigned long long)st.full_sync_below,
                 (unsigned long long)st.version);
    compare_all(src, s.rep, NULL);
    sync_fini(&s);
    mt_table_destroy(src);
}

/* With nothing changed since the last sync, the next incremental stream is empty. */
Test(changes, idle_resync_is_empty) {
    mt_table_t *src = new_table(2, 0, 0);
    sync_t s;
    sync_init(&s, src, 0);
    churn(src, 0, 300, 1);
    cr_assert_eq(sync_once(&s), 1);
    cr_assert_eq(sync_once(&s), 0);
    cr_expect_eq(s.nents, 0, "an idle incremental sync sent %zu entries", s.nents);
    uint64_t before = s.n_entries;
    put(src, fid_of(0, 5), 1, 2);
    cr_assert_eq(sync_once(&s), 0);
    cr_expect_eq(s.n_entries - before, 1, "one change, %llu entries",
                 (unsigned long long)(s.n_entries - before));
    compare_all(src, s.rep, NULL);
    sync_fini(&s);
    mt_table_destroy(src);
}

/* Rewriting few hot ids forever keeps only their live entries: no drops, incremental sync. */
static void hot_ids(uint32_t shards_log2, uint64_t changelog_entries, uint32_t nhot,
                    uint64_t napplies) {
    mt_table_t *src = new_table(shards_log2, changelog_entries, 0);
    sync_t s;
    sync_init(&s, src, 1);
    s.keep = 1;
    uint64_t fids[100];
    for (uint32_t i = 0; i < nhot; i++) {
        fids[i] = fid_of(1, i);
        put(src, fids[i], (float)i, 1);
    }
    cr_assert_eq(sync_once(&s), 1);
    float g[4 * 100];
    rng_state = 99;
    for (uint64_t done = 0; done < napplies; done += nhot) {
        for (uint32_t j = 0; j < 4 * nhot; j++)
            g[j] = rnd_val();
        cr_assert_eq(mt_table_apply(src, fids, nhot, g, 4 * nhot, 2, NULL), MT_OK);
    }
    mt_table_stats_t st;
    mt_table_stats(src, &st);
    cr_log_info("hot ids: %u ids, %llu applies, log %llu entries over %u parts: drops %llu, "
                "full_sync_below %llu, version %llu",
                nhot, (unsigned long long)napplies, (unsigned long long)changelog_entries,
                1u << shards_log2, (unsigned long long)st.changelog_drops,
                (unsigned long long)st.full_sync_below, (unsigned long long)st.version);
    cr_expect_eq(st.changelog_drops, 0, "%llu drops with %u hot ids",
                 (unsigned long long)st.changelog_drops, nhot);
    cr_expect_eq(st.full_sync_below, 0);
    cr_expect_eq(sync_once(&s), 0, "hot ids forced a full sync");
    /* Only live entries: each id once, with its current value. */
    cr_assert_leq(s.nents, nhot);
    cr_assert_eq(s.nents, nhot);
    compare_all(src, s.rep, NULL);
    sync_fini(&s);
    mt_table_destroy(src);
}

Test(changes, hot_ids_do_not_overflow_the_log, .timeout = 600) {
    hot_ids(0, 256, 100, 1000000 / SCALE_DIV);
    hot_ids(2, 4 * 256, 100, 1000000 / SCALE_DIV);
}

/* The header promises drops only "when more distinct ids changed than the log holds":
 * 40 hot ids in a 64-entry log. Compaction drops live entries as soon as more than half the
 * ring is live (log_compact keeps cap / 2), so this drops although 40 < 64. */
Test(changes, hot_ids_below_log_capacity_do_not_overflow) {
    hot_ids(0, 64, 40, 100000);
}

/* Ids deleted and re-created again and again: few distinct ids, so nothing may be dropped.
 * Deletion entries must be compacted away once a later entry of the same id exists. */
Test(changes, delete_reinsert_cycles_do_not_overflow_the_log) {
    mt_table_t *src = new_table(0, 256, 0);
    sync_t s;
    sync_init(&s, src, 0);
    enum { NIDS = 10 };
    uint64_t fids[NIDS];
    for (uint32_t i = 0; i < NIDS; i++) {
        fids[i] = fid_of(1, i); /* slot 22: ttl 40 */
        put(src, fids[i], (float)i, 1);
    }
    cr_assert_eq(sync_once(&s), 1);
    uint32_t now_s = 10;
    float out[4 * NIDS];
    for (int cycle = 0; cycle < 200; cycle++) {
        if (cycle % 2) {
            uint64_t removed = 0;
            cr_assert_eq(mt_table_remove(src, fids, NIDS, &removed), MT_OK);
            cr_assert_eq(removed, NIDS);
        } else {
            now_s += 100; /* everything idle past its ttl */
            uint64_t ev = 0;
            cr_assert_eq(mt_table_expire(src, now_s, (size_t)mt_table_buckets(src), &ev), MT_OK);
            cr_assert_eq(ev, NIDS);
        }
        cr_assert_eq(
            mt_table_lookup(src, fids, NIDS, out, 4 * NIDS, NULL, MT_TABLE_TRAIN, now_s, NULL),
            MT_OK);
    }
    mt_table_stats_t st;
    mt_table_stats(src, &st);
    cr_log_info("delete/re-insert cycles of %d ids: drops %llu, full_sync_below %llu", NIDS,
                (unsigned long long)st.changelog_drops, (unsigned long long)st.full_sync_below);
    cr_expect_eq(st.changelog_drops, 0, "%d ids deleted and re-created: %llu drops", NIDS,
                 (unsigned long long)st.changelog_drops);
    cr_expect_eq(sync_once(&s), 0, "deletion churn of %d ids forced a full sync", NIDS);
    compare_all(src, s.rep, NULL);
    sync_fini(&s);
    mt_table_destroy(src);
}

/* A part whose copied entries are all deletions: the iterator never allocates its values
 * buffer, and next() must not hand memcpy a NULL source even for 0 bytes (UBSan). */
Test(changes, stream_of_only_deletions) {
    mt_table_t *src = new_table(0, 0, 0);
    sync_t s;
    sync_init(&s, src, 0);
    put(src, fid_of(1, 1), 1, 1);
    cr_assert_eq(sync_once(&s), 1);
    del(src, fid_of(1, 1));
    cr_assert_eq(sync_once(&s), 0);
    cr_assert_eq(s.n_deleted, 1);
    cr_assert(!has(s.rep, fid_of(1, 1), NULL));
    sync_fini(&s);
    mt_table_destroy(src);
}

/* ============================== buffer sizes ============================== */

/* The same stream read with tiny cap / values_cap gives the same entries and values. */
Test(changes, small_buffers_give_the_same_stream) {
    rng_state = 5;
    mt_table_t *src = new_table(2, 0, 0);
    model_t m;
    model_init(&m);
    for (int b = 0; b < 300; b++)
        random_batch(src, &m, 100);
    sync_t ref;
    sync_init(&ref, src, 0);
    ref.keep = 1;
    cr_assert_eq(sync_once(&ref), 1);
    uint64_t since = ref.since;
    for (int b = 0; b < 300; b++)
        random_batch(src, &m, 101);
    /* Reference streams: full and incremental, read with big buffers. */
    sync_t big_full, big_incr;
    sync_init(&big_full, src, 0);
    big_full.keep = 1;
    cr_assert_eq(sync_once(&big_full), 1);
    sync_init(&big_incr, src, 0);
    big_incr.keep = 1;
    big_incr.since = since;
    cr_assert_eq(sync_once(&big_incr), 0);
    const size_t caps[][2] = {{1, 16}, {3, 20}, {7, 16}, {1000, 16}, {2, 1000}};
    for (size_t c = 0; c < sizeof(caps) / sizeof(caps[0]); c++) {
        for (int incr = 0; incr < 2; incr++) {
            const sync_t *want = incr ? &big_incr : &big_full;
            sync_t sm;
            sync_init(&sm, src, 0);
            sm.keep = 1;
            sm.cap = caps[c][0];
            sm.vcap = caps[c][1];
            sm.since = incr ? since : 0;
            cr_assert_eq(sync_once(&sm), !incr);
            cr_assert_eq(sm.nents, want->nents, "cap %zu values_cap %zu: %zu entries, want %zu",
                         sm.cap, sm.vcap, sm.nents, want->nents);
            for (size_t i = 0; i < sm.nents; i++) {
                cr_assert_eq(sm.ents[i].c.fid, want->ents[i].c.fid);
                cr_assert_eq(sm.ents[i].c.version, want->ents[i].c.version);
                cr_assert_eq(sm.ents[i].c.deleted, want->ents[i].c.deleted);
                cr_assert_eq(sm.ents[i].c.dim, want->ents[i].c.dim);
                cr_assert(memcmp(sm.ents[i].v, want->ents[i].v, sm.ents[i].c.dim * sizeof(float)) ==
                          0);
            }
            /* Each call returned at most cap entries and at most values_cap floats. */
            cr_assert_geq(sm.n_calls, (sm.nents + sm.cap - 1) / sm.cap + 1);
            if (!incr) compare_all(src, sm.rep, NULL);
            sync_fini(&sm);
        }
    }
    cr_log_info("streams: full %zu entries, incremental %zu entries", big_full.nents,
                big_incr.nents);
    cr_assert_gt(big_incr.nents, 0);
    sync_fini(&ref);
    sync_fini(&big_full);
    sync_fini(&big_incr);
    model_fini(&m);
    mt_table_destroy(src);
}

/* values_cap below the next entry's dim: MT_TOO_SMALL, nothing consumed; a deletion needs no
 * values at all. */
Test(changes, values_cap_too_small) {
    mt_table_t *src = new_table(0, 0, 0);
    uint64_t wide = fid_of(2, 1), narrow = fid_of(0, 1), gone = fid_of(0, 2);
    put(src, gone, 1, 1);
    mt_table_changes_t *it = NULL;
    uint64_t upto = 0, since;
    int full = 0;
    cr_assert_eq(mt_table_changes_begin(src, 0, &it, &upto, &full), MT_OK);
    mt_table_changes_end(it);
    since = upto;
    put(src, wide, 1, 2);   /* dim 16 */
    put(src, narrow, 2, 2); /* dim 1 */
    del(src, gone);
    cr_assert_eq(mt_table_changes_begin(src, since, &it, &upto, &full), MT_OK);
    cr_assert_eq(full, 0);
    mt_table_change_t out[4];
    float vals[32];
    size_t n = 77;
    cr_assert_eq(mt_table_changes_next(it, out, 4, vals, 15, &n), MT_TOO_SMALL);
    cr_assert_eq(n, 0);
    cr_assert_eq(mt_table_changes_next(it, out, 4, vals, 0, &n), MT_TOO_SMALL);
    cr_assert_eq(n, 0);
    /* 16 floats: the wide entry only (the narrow one does not fit behind it). */
    cr_assert_eq(mt_table_changes_next(it, out, 4, vals, 16, &n), MT_OK);
    cr_assert_eq(n, 1);
    cr_assert_eq(out[0].fid, wide);
    cr_assert_eq(out[0].dim, 16);
    for (int j = 0; j < 16; j++)
        cr_assert_eq(vals[j], 1.0f + (float)j);
    cr_assert_eq(mt_table_changes_next(it, out, 4, vals, 1, &n), MT_OK);
    cr_assert_eq(n, 2);
    cr_assert_eq(out[0].fid, narrow);
    cr_assert_eq(vals[0], 2.0f);
    cr_assert_eq(out[1].fid, gone);
    cr_assert_eq(out[1].deleted, 1);
    cr_assert_eq(mt_table_changes_next(it, out, 4, vals, 32, &n), MT_OK);
    cr_assert_eq(n, 0);
    mt_table_changes_end(it);

    /* A stream of deletions only needs no room for values. */
    del(src, wide);
    del(src, narrow);
    cr_assert_eq(mt_table_changes_begin(src, upto, &it, &upto, &full), MT_OK);
    cr_assert_eq(full, 0);
    size_t total = 0;
    do {
        cr_assert_eq(mt_table_changes_next(it, out, 1, vals, 0, &n), MT_OK);
        for (size_t k = 0; k < n; k++)
            cr_assert_eq(out[k].deleted, 1);
        total += n;
    } while (n);
    cr_assert_geq(total, 2);
    mt_table_changes_end(it);
    mt_table_changes_end(NULL);
    mt_table_destroy(src);
}

/* ============================== load ============================== */

typedef struct membuf {
    uint8_t *p;
    size_t len, cap, pos;
} membuf_t;

static mt_err_t mem_write(void *ud, const void *buf, size_t len) {
    membuf_t *m = ud;
    if (m->len + len > m->cap) {
        size_t c = m->cap ? m->cap : 4096;
        while (c < m->len + len)
            c *= 2;
        uint8_t *p = realloc(m->p, c);
        if (!p) return MT_NOMEM;
        m->p = p;
        m->cap = c;
    }
    memcpy(m->p + m->len, buf, len);
    m->len += len;
    return MT_OK;
}

static mt_err_t mem_read(void *ud, void *buf, size_t len, size_t *got) {
    membuf_t *m = ud;
    size_t k = m->len - m->pos < len ? m->len - m->pos : len;
    memcpy(buf, m->p + m->pos, k);
    m->pos += k;
    *got = k;
    return MT_OK;
}

static int begin_full(mt_table_t *t, uint64_t since) {
    mt_table_changes_t *it = NULL;
    uint64_t upto = 0;
    int full = -1;
    cr_assert_eq(mt_table_changes_begin(t, since, &it, &upto, &full), MT_OK);
    mt_table_changes_end(it);
    return full;
}

Test(changes, loaded_table_answers_full_sync) {
    rng_state = 21;
    mt_table_t *src = new_table(2, 0, 0);
    model_t m;
    model_init(&m);
    sync_t s;
    sync_init(&s, src, 1);
    for (int b = 0; b < 500; b++)
        random_batch(src, &m, 100);
    cr_assert_eq(sync_once(&s), 1);
    for (int b = 0; b < 200; b++)
        random_batch(src, &m, 101);
    cr_assert_eq(sync_once(&s), 0);
    uint64_t u1 = s.since;
    membuf_t buf = {0};
    cr_assert_eq(mt_table_save(src, mem_write, &buf), MT_OK);
    /* Changes after the snapshot, synced to the replica, then "lost in a crash". */
    uint64_t late = fid_of(0, 3999);
    put(src, late, 9, 102);
    for (int b = 0; b < 100; b++)
        random_batch(src, &m, 102);
    cr_assert_eq(sync_once(&s), 0);
    uint64_t u2 = s.since;
    mt_table_stats_t st;
    mt_table_stats(src, &st);

    mt_table_slot_config_t sc[NSLOTS];
    slot_configs(sc, 0);
    mt_table_config_t cfg;
    mt_table_config_init(&cfg);
    cfg.slots = sc;
    cfg.nslots = NSLOTS;
    cfg.shards_log2 = 3; /* a different layout is allowed */
    cfg.filter_bytes = 0;
    mt_table_t *t2 = NULL;
    cr_assert_eq(mt_table_load(&cfg, mem_read, &buf, &t2), MT_OK);
    const uint64_t sinces[] = {0, 1, u1, u2, st.version, st.version + 1000};
    for (size_t i = 0; i < sizeof(sinces) / sizeof(sinces[0]); i++)
        cr_assert_eq(begin_full(t2, sinces[i]), 1, "since %llu after a load was not full",
                     (unsigned long long)sinces[i]);
    cr_assert(!has(t2, late, NULL));

    /* The replica follows the loaded table: full once, then incrementally. */
    sync_t s2 = s;
    s2.src = t2;
    s2.keep = 0;
    s2.ents = NULL;
    s2.nents = s2.ents_cap = 0;
    cr_assert_eq(sync_once(&s2), 1);
    compare_all(t2, s2.rep, NULL);
    cr_assert(!has(s2.rep, late, NULL));
    for (int b = 0; b < 100; b++)
        random_batch(t2, &m, 103);
    cr_assert_eq(sync_once(&s2), 0);
    compare_all(t2, s2.rep, NULL);
    cr_log_info("load: snapshot %zu bytes, syncs at %llu and %llu, source version %llu", buf.len,
                (unsigned long long)u1, (unsigned long long)u2, (unsigned long long)st.version);
    sync_fini(&s2); /* owns the replica now */
    free(s.ents);
    free(buf.p);
    model_fini(&m);
    mt_table_destroy(t2);
    mt_table_destroy(src);
}

/* changelog_entries = 0 turns change tracking off: every stream is a full one, listing every
 * row, whatever `since` says. */
Test(changes, tracking_off_gives_full_streams) {
    mt_table_slot_config_t s;
    mt_table_slot_config_init(&s, 1, 4);
    mt_table_config_t c;
    mt_table_config_init(&c);
    c.slots = &s;
    c.nslots = 1;
    c.shards_log2 = 2;
    c.changelog_entries = 0;
    mt_table_t *t;
    cr_assert_eq(mt_table_create(&c, &t), MT_OK);
    uint64_t fids[50];
    float out[200];
    for (int i = 0; i < 50; i++)
        fids[i] = MT_FID_MAKE(1, (uint64_t)i);
    cr_assert_eq(mt_table_lookup(t, fids, 50, out, 200, NULL, MT_TABLE_TRAIN, 1, NULL), MT_OK);
    uint64_t upto = 0;
    for (int round = 0; round < 3; round++) {
        mt_table_changes_t *it;
        int full = 0;
        cr_assert_eq(mt_table_changes_begin(t, upto, &it, &upto, &full), MT_OK);
        cr_assert_eq(full, 1);
        mt_table_change_t ch[64];
        float vals[256];
        size_t n = 0, total = 0;
        do {
            cr_assert_eq(mt_table_changes_next(it, ch, 64, vals, 256, &n), MT_OK);
            total += n;
        } while (n);
        cr_assert_eq(total, 50);
        mt_table_changes_end(it);
    }
    mt_table_destroy(t);
}
