/*
 * test_delta.c - incremental save and load: mt_table_save_changes() /
 * mt_table_load_changes() (embedding/src/serialize.c, docs/table.md "Change streams").
 *
 * A delta is how a checkpoint or a backup follows a big table without writing all of it
 * every time: full save, then the rows changed since. So a full load followed by the deltas
 * must give back exactly the live table, or fail cleanly. This file covers:
 *  - full save at `since`, then updates (applies), new ids (training lookups past the
 *    frequency filter, assigns), removals, expiry and re-admissions; the delta loaded onto the
 *    full copy: every id the test ever touched has the same presence, embedding bits (an odd
 *    fp16 dim included), optimizer state (Adagrad, Adam, FTRL), touch, count and version as
 *    live, the row counts agree, and the delta holds exactly the rows changed after `since`;
 *  - a chain of two deltas, the state after the first one checked against a full save taken
 *    when it was written;
 *  - after a delta load, no `since` from before it is served incrementally, the version clock
 *    is above the stream's, and new changes are served incrementally again;
 *  - MT_FULL_SYNC with nothing written for since = 0 and for a since from before a load;
 *  - damage: every byte flipped (an error each time; a flip inside a payload is
 *    MT_CORRUPT), every truncation (MT_TRUNCATED), trailing bytes, a table stream given to
 *    load_changes and a delta given to mt_table_load (MT_CORRUPT), another format version
 *    (MT_VERSION), and hand-made streams with valid checksums that break one rule each;
 *  - slots that differ (dim, optimizer, precision, missing -> MT_MISMATCH; an extra slot
 *    in the target is fine);
 *  - a write callback failing at every call: its error is returned;
 *  - deltas saved while another thread applies, inserts and removes: each ends and loads,
 *    and once the writer stopped, one more delta makes the copy equal the live table.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "mt/table.h"

#ifdef MT_SANITIZED
#define SCALE_DIV 4
#else
#define SCALE_DIV 1
#endif

#define STATE_MAX (2 * MT_TABLE_MAX_DIM + 2)

#include "testutil_stream.h"

static mt_table_t *load_full(const mt_table_config_t *cfg, const wbuf_t *w) {
    rbuf_t r;
    rbuf_init(&r, w->p, w->len);
    mt_table_t *t = NULL;
    cr_assert_eq(mt_table_load(cfg, rbuf_read, &r, &t), MT_OK);
    return t;
}

static mt_err_t apply_bytes(mt_table_t *t, const uint8_t *p, size_t len, uint64_t *rows,
                            uint64_t *dels) {
    rbuf_t r;
    rbuf_init(&r, p, len);
    mt_err_t err = mt_table_load_changes(t, rbuf_read, &r, rows, dels);
    if (err == MT_OK) cr_assert_eq(r.pos, len, "a delta load left bytes unread");
    return err;
}

static void save_full(mt_table_t *t, wbuf_t *w) {
    wbuf_init(w);
    cr_assert_eq(mt_table_save(t, wbuf_write, w), MT_OK);
}

static void save_delta(mt_table_t *t, uint64_t since, wbuf_t *w, uint64_t *upto) {
    wbuf_init(w);
    mt_err_t err = mt_table_save_changes(t, since, wbuf_write, w, upto);
    cr_assert_eq(err, MT_OK, "save_changes: %s", mt_err_name(err));
    cr_assert_gt(*upto, since);
}

/* The since of a full save taken now (no writer running): every later change is above it. */
static uint64_t version_now(mt_table_t *t) {
    mt_table_changes_t *it;
    uint64_t upto;
    int full;
    cr_assert_eq(mt_table_changes_begin(t, 0, &it, &upto, &full), MT_OK);
    mt_table_changes_end(it);
    return upto;
}

/* ============================== stream parsing ============================== */

#define TAG(a, b, c, d) \
    ((uint32_t)(a) | (uint32_t)(b) << 8 | (uint32_t)(c) << 16 | (uint32_t)(d) << 24)
#define TAG_HEAD TAG('H', 'E', 'A', 'D')
#define TAG_ROWS TAG('R', 'O', 'W', 'S')
#define TAG_FILT TAG('F', 'I', 'L', 'T')
#define TAG_DELS TAG('D', 'E', 'L', 'S')
#define TAG_END  TAG('E', 'N', 'D', '.')

static uint64_t get_le(const uint8_t *s, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)s[i] << (8 * i);
    return v;
}

typedef struct blk {
    uint32_t tag, len;
    size_t off;        /* of the block's 8-byte header */
    const uint8_t *pl; /* payload */
} blk_t;

/* Splits a delta into its blocks, checking the documented framing and every checksum. */
static size_t split_blocks(const uint8_t *s, size_t len, blk_t *out, size_t cap) {
    cr_assert_geq(len, 16);
    cr_assert_eq(memcmp(s, "MTDELTA\0", 8), 0, "magic");
    cr_assert_eq(get_le(s + 8, 4), 1, "format version");
    cr_assert_eq(get_le(s + 12, 4), 0, "reserved");
    size_t off = 16, n = 0;
    while (off < len) {
        cr_assert_leq(off + 16, len);
        uint32_t tag = (uint32_t)get_le(s + off, 4), bl = (uint32_t)get_le(s + off + 4, 4);
        cr_assert(tag == TAG_HEAD || tag == TAG_ROWS || tag == TAG_DELS || tag == TAG_END,
                  "tag %#x at %zu", tag, off);
        cr_assert_leq(off + 16 + bl, len);
        cr_assert_eq(get_le(s + off + 8 + bl, 8), XXH64(s + off + 8, bl, tag), "checksum");
        cr_assert_lt(n, cap);
        out[n++] = (blk_t){tag, bl, off, s + off + 8};
        off += 16 + bl;
    }
    cr_assert_eq(off, len);
    return n;
}

static void emit_block(wbuf_t *w, uint32_t tag, const void *pl, size_t len) {
    wbuf_put_le(w, tag, 4);
    wbuf_put_le(w, len, 4);
    wbuf_append(w, pl, len);
    wbuf_put_le(w, XXH64(pl, len, tag), 8);
}

static void emit_magic(wbuf_t *w, const char *magic, uint32_t version) {
    wbuf_append(w, magic, 8);
    wbuf_put_le(w, version, 4);
    wbuf_put_le(w, 0, 4);
}

static void emit_end(wbuf_t *w, uint64_t rows, uint64_t dels, uint64_t blocks) {
    wbuf_t e;
    wbuf_init(&e);
    wbuf_put_le(&e, rows, 8);
    wbuf_put_le(&e, dels, 8);
    wbuf_put_le(&e, blocks, 8);
    emit_block(w, TAG_END, e.p, e.len);
    wbuf_free(&e);
}

/* ============================== tables and workloads ============================== */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float urand(uint64_t *s) { /* uniform in [-1, 1) */
    return (float)((double)(splitmix(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* Slot 1: fp32 Adagrad with a TTL; slot 2: fp16 Adam with an odd dim (a padded half);
 * slot 3: fp32 FTRL behind the frequency filter. */
#define NSLOTS 3
#define TTL_S  100
static const uint16_t slot_ids[NSLOTS] = {1, 2, 3};

static void make_slots(mt_table_slot_config_t *s) {
    mt_table_slot_config_init(&s[0], 1, 8);
    s[0].opt = MT_OPT_ADAGRAD;
    s[0].ttl_s = TTL_S;
    mt_table_slot_config_init(&s[1], 2, 7);
    s[1].opt = MT_OPT_ADAM;
    s[1].precision = MT_PREC_FP16;
    s[1].init = MT_INIT_NORMAL;
    mt_table_slot_config_init(&s[2], 3, 4);
    s[2].opt = MT_OPT_FTRL;
    s[2].l1 = 0.001f;
    s[2].l2 = 0.01f;
    s[2].min_count = 2;
    for (int i = 0; i < NSLOTS; i++) {
        s[i].init_scale = 0.05f;
        s[i].lr = 0.05f;
    }
}

static void make_cfg(mt_table_config_t *c, const mt_table_slot_config_t *slots, size_t n) {
    mt_table_config_init(c);
    c->slots = slots;
    c->nslots = n;
    c->shards_log2 = 3;
    c->filter_bytes = 64u << 10;
    c->changelog_entries = 1u << 18; /* never compacted past since here */
}

/* Every id a test touched, for the comparisons (a set grown as ids are used). */
typedef struct ids {
    uint64_t *v;
    size_t n, cap;
} ids_t;

static void ids_add(ids_t *s, uint64_t fid) {
    for (size_t i = 0; i < s->n; i++)
        if (s->v[i] == fid) return;
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 1024;
        s->v = realloc(s->v, s->cap * sizeof(uint64_t));
        cr_assert_not_null(s->v);
    }
    s->v[s->n++] = fid;
}

static uint64_t fid_of(int slot_index, uint64_t i) {
    return MT_FID_MAKE(slot_ids[slot_index], 1 + i * 7919u);
}

/* Training lookups of fids (twice: slot 3 admits at the second sighting), then random
 * gradients for all of them, at now_s. */
static void train(mt_table_t *t, const uint64_t *fids, size_t n, uint32_t now_s, uint64_t *rng) {
    size_t nf;
    cr_assert_eq(mt_table_batch_floats(t, fids, n, &nf), MT_OK);
    float *out = malloc(nf * sizeof(float)), *g = malloc(nf * sizeof(float));
    cr_assert(out && g);
    for (int r = 0; r < 2; r++)
        cr_assert_eq(mt_table_lookup(t, fids, n, out, nf, NULL, MT_TABLE_TRAIN, now_s, NULL),
                     MT_OK);
    for (size_t i = 0; i < nf; i++)
        g[i] = urand(rng);
    cr_assert_eq(mt_table_apply(t, fids, n, g, nf, now_s, NULL), MT_OK);
    free(out);
    free(g);
}

/* Ids [lo, hi) of every slot, trained at now_s, recorded in seen. */
static void train_range(mt_table_t *t, uint64_t lo, uint64_t hi, uint32_t now_s, uint64_t *rng,
                        ids_t *seen) {
    size_t n = (size_t)(hi - lo) * NSLOTS, k = 0;
    uint64_t *f = malloc(n * sizeof(uint64_t));
    cr_assert_not_null(f);
    for (uint64_t i = lo; i < hi; i++)
        for (int s = 0; s < NSLOTS; s++) {
            f[k] = fid_of(s, i);
            ids_add(seen, f[k++]);
        }
    train(t, f, n, now_s, rng);
    free(f);
}

/* Applies gradients to every step-th id of [lo, hi) that has a row (others are dropped). */
static void update_some(mt_table_t *t, uint64_t lo, uint64_t hi, uint64_t step, uint32_t now_s,
                        uint64_t *rng) {
    for (uint64_t i = lo; i < hi; i += step)
        for (int s = 0; s < NSLOTS; s++) {
            uint64_t fid = fid_of(s, i);
            float g[MT_TABLE_MAX_DIM];
            uint32_t dim;
            cr_assert_eq(mt_table_dim(t, fid, &dim), MT_OK);
            for (uint32_t j = 0; j < dim; j++)
                g[j] = urand(rng);
            cr_assert_eq(mt_table_apply(t, &fid, 1, g, dim, now_s, NULL), MT_OK);
        }
}

static void remove_some(mt_table_t *t, uint64_t lo, uint64_t hi, uint64_t step) {
    for (uint64_t i = lo; i < hi; i += step)
        for (int s = 0; s < NSLOTS; s++) {
            uint64_t fid = fid_of(s, i);
            cr_assert_eq(mt_table_remove(t, &fid, 1, NULL), MT_OK);
        }
}

static void assign_new(mt_table_t *t, uint64_t base, int n, uint32_t now_s, uint64_t *rng,
                       ids_t *seen) {
    for (int i = 0; i < n; i++) {
        uint64_t fid = fid_of(i % NSLOTS, base + (uint64_t)i);
        float v[MT_TABLE_MAX_DIM];
        uint32_t dim;
        cr_assert_eq(mt_table_dim(t, fid, &dim), MT_OK);
        for (uint32_t j = 0; j < dim; j++)
            v[j] = urand(rng);
        cr_assert_eq(mt_table_assign(t, &fid, 1, v, dim, now_s, NULL), MT_OK);
        ids_add(seen, fid);
    }
}

static uint64_t table_rows(mt_table_t *t) {
    mt_table_stats_t st;
    mt_table_stats(t, &st);
    return st.rows;
}

/* Asserts that a and b hold the same rows for every id of seen: same presence and, if
 * present, the same embedding and state bits, touch, count and version. @returns rows. */
static size_t assert_same_rows(mt_table_t *a, mt_table_t *b, const ids_t *seen) {
    static float ea[MT_TABLE_MAX_DIM], eb[MT_TABLE_MAX_DIM], sa[STATE_MAX], sb[STATE_MAX];
    size_t rows = 0;
    for (size_t i = 0; i < seen->n; i++) {
        uint64_t fid = seen->v[i];
        uint32_t dim, sf, ta = 0, tb = 0, ca = 0, cb = 0;
        uint64_t va = 0, vb = 0;
        cr_assert_eq(mt_table_dim(a, fid, &dim), MT_OK);
        cr_assert_eq(mt_table_state_floats(a, fid, &sf), MT_OK);
        memset(ea, 0xA5, sizeof(ea));
        memset(eb, 0x5A, sizeof(eb));
        memset(sa, 0xA5, sizeof(sa));
        memset(sb, 0x5A, sizeof(sb));
        mt_err_t ra = mt_table_get_row(a, fid, ea, sa, STATE_MAX, &ta, &ca, &va);
        mt_err_t rb = mt_table_get_row(b, fid, eb, sb, STATE_MAX, &tb, &cb, &vb);
        cr_assert_eq(ra, rb, "fid %#" PRIx64 ": %s live, %s in the copy", fid, mt_err_name(ra),
                     mt_err_name(rb));
        if (ra != MT_OK) {
            cr_assert_eq(ra, MT_NOT_FOUND);
            continue;
        }
        rows++;
        cr_assert_eq(memcmp(ea, eb, dim * sizeof(float)), 0, "embedding of fid %#" PRIx64, fid);
        cr_assert_eq(memcmp(sa, sb, sf * sizeof(float)), 0, "state of fid %#" PRIx64, fid);
        cr_assert_eq(ta, tb, "touch of fid %#" PRIx64 ": %u vs %u", fid, ta, tb);
        cr_assert_eq(ca, cb, "count of fid %#" PRIx64 ": %u vs %u", fid, ca, cb);
        cr_assert_eq(va, vb, "version of fid %#" PRIx64, fid);
    }
    cr_assert_eq(table_rows(a), table_rows(b), "row counts: %" PRIu64 " live, %" PRIu64 " copy",
                 table_rows(a), table_rows(b));
    cr_assert_eq(table_rows(a), rows, "the live table has rows the test never touched");
    return rows;
}

/* Ids of seen with a row changed after since, and ids of seen without a row. */
static void count_changed(mt_table_t *t, const ids_t *seen, uint64_t since, uint64_t *changed,
                          uint64_t *absent) {
    *changed = *absent = 0;
    for (size_t i = 0; i < seen->n; i++) {
        uint64_t v;
        if (mt_table_get_row(t, seen->v[i], NULL, NULL, 0, NULL, NULL, &v) == MT_OK)
            *changed += v > since;
        else
            (*absent)++;
    }
}

#define BASE_IDS (1200 / SCALE_DIV)

/* The base table: BASE_IDS ids of every slot trained at 1000, the newer half again at 1100. */
static mt_table_t *build_base(const mt_table_config_t *cfg, uint64_t *rng, ids_t *seen) {
    mt_table_t *t;
    cr_assert_eq(mt_table_create(cfg, &t), MT_OK);
    train_range(t, 0, BASE_IDS, 1000, rng, seen);
    train_range(t, BASE_IDS / 2, BASE_IDS, 1100, rng, seen);
    cr_assert_eq(table_rows(t), (uint64_t)BASE_IDS * NSLOTS);
    return t;
}

/* Round 1 of changes: updates, expiry (slot 1 rows last touched at 1000), new ids from
 * training and assign, removals, re-admission of removed ids. */
static void changes_round1(mt_table_t *t, uint64_t *rng, ids_t *seen) {
    update_some(t, 0, BASE_IDS, 5, 1200, rng);
    uint64_t evicted = 0;
    cr_assert_eq(mt_table_expire(t, 1150, (size_t)mt_table_buckets(t), &evicted), MT_OK);
    cr_assert_gt(evicted, 0);
    train_range(t, BASE_IDS, BASE_IDS + BASE_IDS / 4, 1300, rng, seen);
    assign_new(t, 10 * BASE_IDS, 9, 1310, rng, seen);
    remove_some(t, 3, BASE_IDS, 7);
    train_range(t, 3, 4, 1320, rng, seen); /* removed, then admitted again */
}

/* Round 2: more updates, removal of new ids, re-admission of removed and expired ones. */
static void changes_round2(mt_table_t *t, uint64_t *rng, ids_t *seen) {
    update_some(t, 1, BASE_IDS + BASE_IDS / 4, 3, 1400, rng);
    remove_some(t, BASE_IDS, BASE_IDS + BASE_IDS / 4, 4);
    train_range(t, 10, 12, 1410, rng, seen); /* 10: removed in round 1 (7 | 10 - 3) */
    train_range(t, BASE_IDS + BASE_IDS / 4, BASE_IDS + BASE_IDS / 3, 1420, rng, seen);
    uint64_t evicted = 0; /* the slot 1 rows last touched at 1100 */
    cr_assert_eq(mt_table_expire(t, 1250, (size_t)mt_table_buckets(t), &evicted), MT_OK);
    cr_assert_gt(evicted, 0);
}

/* ============================== round trips ============================== */

Test(delta, full_then_delta_equals_live_table) {
    mt_table_slot_config_t slots[NSLOTS];
    mt_table_config_t cfg;
    make_slots(slots);
    make_cfg(&cfg, slots, NSLOTS);
    ids_t seen = {0};
    uint64_t rng = 42;
    mt_table_t *t = build_base(&cfg, &rng, &seen);
    uint64_t since = version_now(t);
    wbuf_t full;
    save_full(t, &full);

    changes_round1(t, &rng, &seen);
    uint64_t changed, absent;
    count_changed(t, &seen, since, &changed, &absent);
    cr_assert_gt(absent, 0);

    wbuf_t d;
    uint64_t upto;
    save_delta(t, since, &d, &upto);
    mt_table_t *t2 = load_full(&cfg, &full);
    uint64_t rows = 0, dels = 0;
    cr_assert_eq(apply_bytes(t2, d.p, d.len, &rows, &dels), MT_OK);
    /* Exactly the rows changed after since; at least one deletion per id that went. */
    cr_assert_eq(rows, changed, "%" PRIu64 " rows in the delta, %" PRIu64 " changed", rows,
                 changed);
    cr_assert_geq(dels, absent);
    size_t live = assert_same_rows(t, t2, &seen);
    cr_log_info("delta: %zu live rows, %" PRIu64 " rows and %" PRIu64
                " deletions in %zu bytes (full: %zu bytes)",
                live, rows, dels, d.len, full.len);

    /* The rows of the delta came in without the filter: slot 3 ids admitted after since. */
    uint64_t f3 = fid_of(2, BASE_IDS);
    cr_assert_eq(mt_table_get_row(t2, f3, NULL, NULL, 0, NULL, NULL, NULL), MT_OK);

    /* The clock: above upto + 2^40; nothing from before is servable incrementally. */
    mt_table_stats_t st;
    mt_table_stats(t2, &st);
    cr_assert_geq(st.version, upto + (1ull << 40));
    cr_assert_geq(st.full_sync_below, upto + (1ull << 40));
    uint64_t probes[] = {since, upto, st.version - 1};
    for (size_t i = 0; i < sizeof(probes) / sizeof(probes[0]); i++) {
        mt_table_changes_t *it;
        uint64_t up2;
        int fullflag = 0;
        cr_assert_eq(mt_table_changes_begin(t2, probes[i], &it, &up2, &fullflag), MT_OK);
        cr_assert_eq(fullflag, 1, "since %" PRIu64 " after a delta load", probes[i]);
        mt_table_changes_end(it);
    }
    /* ... and new changes are. */
    uint64_t s2 = version_now(t2);
    update_some(t2, 0, 1, 1, 2000, &rng);
    wbuf_t d2;
    uint64_t up3;
    save_delta(t2, s2, &d2, &up3);
    mt_table_t *t3 = load_full(&cfg, &full);
    cr_assert_eq(apply_bytes(t3, d.p, d.len, NULL, NULL), MT_OK);
    cr_assert_eq(apply_bytes(t3, d2.p, d2.len, &rows, &dels), MT_OK);
    cr_assert_eq(rows, NSLOTS, "id 0 of every slot");
    cr_assert_eq(dels, 0);
    assert_same_rows(t2, t3, &seen);

    wbuf_free(&d2);
    wbuf_free(&d);
    wbuf_free(&full);
    mt_table_destroy(t3);
    mt_table_destroy(t2);
    mt_table_destroy(t);
    free(seen.v);
}

Test(delta, chain_of_two_deltas) {
    mt_table_slot_config_t slots[NSLOTS];
    mt_table_config_t cfg;
    make_slots(slots);
    make_cfg(&cfg, slots, NSLOTS);
    ids_t seen = {0};
    uint64_t rng = 7;
    mt_table_t *t = build_base(&cfg, &rng, &seen);
    uint64_t s0 = version_now(t);
    wbuf_t full, d1, d2, mid;
    save_full(t, &full);
    changes_round1(t, &rng, &seen);
    uint64_t u1, u2;
    save_delta(t, s0, &d1, &u1);
    save_full(t, &mid); /* the state d1 leads to (no writer runs) */
    changes_round2(t, &rng, &seen);
    save_delta(t, u1, &d2, &u2);
    cr_assert_gt(u2, u1);

    mt_table_t *copy = load_full(&cfg, &full), *ref = load_full(&cfg, &mid);
    cr_assert_eq(apply_bytes(copy, d1.p, d1.len, NULL, NULL), MT_OK);
    assert_same_rows(ref, copy, &seen);
    uint64_t rows = 0, dels = 0;
    cr_assert_eq(apply_bytes(copy, d2.p, d2.len, &rows, &dels), MT_OK);
    cr_assert_gt(rows, 0);
    cr_assert_gt(dels, 0);
    size_t live = assert_same_rows(t, copy, &seen);
    cr_log_info("chain: %zu live rows; d1 %zu bytes, d2 %zu bytes", live, d1.len, d2.len);

    /* A delta of nothing: HEAD and END only, and it changes no row. */
    wbuf_t d3;
    uint64_t u3;
    save_delta(t, u2, &d3, &u3);
    blk_t b[4];
    cr_assert_eq(split_blocks(d3.p, d3.len, b, 4), 2);
    cr_assert_eq(apply_bytes(copy, d3.p, d3.len, &rows, &dels), MT_OK);
    cr_assert_eq(rows + dels, 0);
    assert_same_rows(t, copy, &seen);

    wbuf_free(&full);
    wbuf_free(&mid);
    wbuf_free(&d1);
    wbuf_free(&d2);
    wbuf_free(&d3);
    mt_table_destroy(copy);
    mt_table_destroy(ref);
    mt_table_destroy(t);
    free(seen.v);
}

/* ============================== layout ============================== */

Test(delta, stream_layout_matches_documentation) {
    mt_table_slot_config_t slots[NSLOTS];
    mt_table_config_t cfg;
    make_slots(slots);
    make_cfg(&cfg, slots, NSLOTS);
    ids_t seen = {0};
    uint64_t rng = 3;
    mt_table_t *t = build_base(&cfg, &rng, &seen);
    uint64_t since = version_now(t);
    update_some(t, 0, 4, 1, 1500, &rng); /* 4 ids x 3 slots (slot 3's admitted) */
    remove_some(t, 10, 12, 1);           /* 2 x 3 deletions */
    wbuf_t d;
    uint64_t upto;
    save_delta(t, since, &d, &upto);
    blk_t b[8];
    size_t nb = split_blocks(d.p, d.len, b, 8);
    cr_assert_eq(nb, 4, "HEAD, ROWS, DELS, END.");
    cr_assert_eq(b[0].tag, TAG_HEAD);
    cr_assert_eq(b[0].len, 4 + 16 * NSLOTS + 16);
    cr_assert_eq(get_le(b[0].pl, 4), NSLOTS);
    for (int i = 0; i < NSLOTS; i++) {
        const uint8_t *q = b[0].pl + 4 + 16 * i;
        cr_assert_eq(get_le(q, 2), slots[i].slot);
        cr_assert_eq(get_le(q + 4, 4), slots[i].dim);
        cr_assert_eq(q[8], (uint8_t)slots[i].opt);
        cr_assert_eq(q[9], (uint8_t)slots[i].precision);
    }
    cr_assert_eq(get_le(b[0].pl + 4 + 16 * NSLOTS, 8), since);
    cr_assert_eq(get_le(b[0].pl + 4 + 16 * NSLOTS + 8, 8), upto);
    cr_assert_eq(b[1].tag, TAG_ROWS);
    cr_assert_eq(get_le(b[1].pl, 4), 12);
    /* Rows: 24-byte header, embedding (fp16 dim 7 -> 16 bytes), state. */
    size_t want = 4 + 4 * (24 + 32 + 32) + 4 * (24 + 16 + 4 * 16) + 4 * (24 + 16 + 32);
    cr_assert_eq(b[1].len, want);
    cr_assert_eq(b[2].tag, TAG_DELS);
    cr_assert_eq(get_le(b[2].pl, 4), 6);
    cr_assert_eq(b[2].len, 4 + 6 * 8);
    for (int i = 0; i < 6; i++) {
        uint64_t fid = get_le(b[2].pl + 4 + 8 * i, 8);
        cr_assert_eq(mt_table_get_row(t, fid, NULL, NULL, 0, NULL, NULL, NULL), MT_NOT_FOUND);
    }
    cr_assert_eq(b[3].tag, TAG_END);
    cr_assert_eq(b[3].len, 24);
    cr_assert_eq(get_le(b[3].pl, 8), 12);
    cr_assert_eq(get_le(b[3].pl + 8, 8), 6);
    cr_assert_eq(get_le(b[3].pl + 16, 8), 2);
    wbuf_free(&d);
    mt_table_destroy(t);
    free(seen.v);
}

/* ============================== full sync ============================== */

Test(delta, since_zero_is_full_sync_with_nothing_written) {
    mt_table_slot_config_t slots[NSLOTS];
    mt_table_config_t cfg;
    make_slots(slots);
    make_cfg(&cfg, slots, NSLOTS);
    ids_t seen = {0};
    uint64_t rng = 5;
    mt_table_t *t = build_base(&cfg, &rng, &seen);
    wbuf_t w;
    wbuf_init(&w);
    uint64_t upto = 0;
    cr_assert_eq(mt_table_save_changes(t, 0, wbuf_write, &w, &upto), MT_FULL_SYNC);
    cr_assert_eq(w.calls, 0, "nothing written");
    /* upto still comes back: a full save now, then deltas from upto, is the protocol. */
    cr_assert_gt(upto, 0);
    wbuf_t full;
    save_full(t, &full);
    update_some(t, 0, 3, 1, 1600, &rng);
    wbuf_t d;
    uint64_t u2;
    save_delta(t, upto, &d, &u2);
    mt_table_t *t2 = load_full(&cfg, &full);
    cr_assert_eq(apply_bytes(t2, d.p, d.len, NULL, NULL), MT_OK);
    assert_same_rows(t, t2, &seen);

    /* Change tracking off: every since is a full sync. */
    mt_table_config_t off = cfg;
    off.changelog_entries = 0;
    mt_table_t *t3;
    cr_assert_eq(mt_table_create(&off, &t3), MT_OK);
    wbuf_free(&w);
    wbuf_init(&w);
    cr_assert_eq(mt_table_save_changes(t3, 5, wbuf_write, &w, &upto), MT_FULL_SYNC);
    cr_assert_eq(w.calls, 0);

    wbuf_free(&w);
    wbuf_free(&d);
    wbuf_free(&full);
    mt_table_destroy(t3);
    mt_table_destroy(t2);
    mt_table_destroy(t);
    free(seen.v);
}

Test(delta, since_from_before_a_load_is_full_sync) {
    mt_table_slot_config_t slots[NSLOTS];
    mt_table_config_t cfg;
    make_slots(slots);
    make_cfg(&cfg, slots, NSLOTS);
    ids_t seen = {0};
    uint64_t rng = 6;
    mt_table_t *t = build_base(&cfg, &rng, &seen);
    uint64_t since = version_now(t);
    wbuf_t full;
    save_full(t, &full);
    update_some(t, 0, 3, 1, 1600, &rng);
    /* The original serves since; a table loaded from its snapshot does not. */
    wbuf_t d;
    uint64_t upto;
    save_delta(t, since, &d, &upto);
    mt_table_t *t2 = load_full(&cfg, &full);
    uint64_t old[] = {since, upto, since - 1};
    for (size_t i = 0; i < 3; i++) {
        wbuf_t w;
        wbuf_init(&w);
        uint64_t u = 0;
        cr_assert_eq(mt_table_save_changes(t2, old[i], wbuf_write, &w, &u), MT_FULL_SYNC);
        cr_assert_eq(w.calls, 0);
        wbuf_free(&w);
    }
    /* Likewise after a delta load. */
    cr_assert_eq(apply_bytes(t2, d.p, d.len, NULL, NULL), MT_OK);
    for (size_t i = 0; i < 3; i++) {
        wbuf_t w;
        wbuf_init(&w);
        uint64_t u = 0;
        cr_assert_eq(mt_table_save_changes(t2, old[i], wbuf_write, &w, &u), MT_FULL_SYNC);
        cr_assert_eq(w.calls, 0);
        wbuf_free(&w);
    }
    wbuf_free(&d);
    wbuf_free(&full);
    mt_table_destroy(t2);
    mt_table_destroy(t);
    free(seen.v);
}

/* ============================== damage ============================== */

/* A small delta with rows of every slot and deletions, and the table it came from. */
static void small_delta(mt_table_config_t *cfg, mt_table_slot_config_t *slots, wbuf_t *d) {
    make_slots(slots);
    make_cfg(cfg, slots, NSLOTS);
    ids_t seen = {0};
    uint64_t rng = 11;
    mt_table_t *t;
    cr_assert_eq(mt_table_create(cfg, &t), MT_OK);
    train_range(t, 0, 12, 1000, &rng, &seen);
    uint64_t since = version_now(t);
    update_some(t, 0, 3, 1, 1100, &rng);
    remove_some(t, 5, 7, 1);
    uint64_t upto;
    save_delta(t, since, d, &upto);
    mt_table_destroy(t);
    free(seen.v);
}

Test(delta, byte_flips_are_errors) {
    mt_table_slot_config_t slots[NSLOTS];
    mt_table_config_t cfg;
    wbuf_t d;
    small_delta(&cfg, slots, &d);
    blk_t b[8];
    size_t nb = split_blocks(d.p, d.len, b, 8);
    cr_assert_eq(nb, 4);
    mt_table_t *scratch;
    cr_assert_eq(mt_table_create(&cfg, &scratch), MT_OK);
    uint8_t *c = malloc(d.len);
    cr_assert_not_null(c);
    for (size_t off = 0; off < d.len; off++) {
        memcpy(c, d.p, d.len);
        c[off] ^= 0x10;
        mt_err_t err = apply_bytes(scratch, c, d.len, NULL, NULL);
        cr_assert(err == MT_CORRUPT || err == MT_TRUNCATED || err == MT_VERSION, "flip at %zu: %s",
                  off, mt_err_name(err));
        /* Inside a payload or its checksum, the checksum catches it. */
        for (size_t k = 0; k < nb; k++)
            if (off >= b[k].off + 8 && off < b[k].off + 16 + b[k].len)
                cr_assert_eq(err, MT_CORRUPT, "flip at %zu (block %zu): %s", off, k,
                             mt_err_name(err));
    }
    /* The undamaged stream still applies to what the flips left. */
    cr_assert_eq(apply_bytes(scratch, d.p, d.len, NULL, NULL), MT_OK);
    free(c);
    mt_table_destroy(scratch);
    wbuf_free(&d);
}

Test(delta, truncation_at_every_offset) {
    mt_table_slot_config_t slots[NSLOTS];
    mt_table_config_t cfg;
    wbuf_t d;
    small_delta(&cfg, slots, &d);
    mt_table_t *scratch;
    cr_assert_eq(mt_table_create(&cfg, &scratch), MT_OK);
    for (size_t len = 0; len < d.len; len++) {
        mt_err_t err = apply_bytes(scratch, d.p, len, NULL, NULL);
        cr_assert_eq(err, MT_TRUNCATED, "%zu of %zu bytes: %s", len, d.len, mt_err_name(err));
    }
    cr_assert_eq(apply_bytes(scratch, d.p, d.len, NULL, NULL), MT_OK);
    mt_table_destroy(scratch);
    wbuf_free(&d);
}

Test(delta, wrong_kind_of_stream_version_and_trailing_bytes) {
    mt_table_slot_config_t slots[NSLOTS];
    mt_table_config_t cfg;
    wbuf_t d;
    small_delta(&cfg, slots, &d);
    mt_table_t *t;
    cr_assert_eq(mt_table_create(&cfg, &t), MT_OK);
    /* A table stream given to load_changes, and a delta given to mt_table_load. */
    wbuf_t full;
    save_full(t, &full);
    cr_assert_eq(apply_bytes(t, full.p, full.len, NULL, NULL), MT_CORRUPT);
    rbuf_t r;
    rbuf_init(&r, d.p, d.len);
    mt_table_t *t2 = NULL;
    cr_assert_eq(mt_table_load(&cfg, rbuf_read, &r, &t2), MT_CORRUPT);
    cr_assert_null(t2);
    /* Another format version; a non-zero reserved word. */
    uint8_t *c = malloc(d.len + 1);
    cr_assert_not_null(c);
    memcpy(c, d.p, d.len);
    c[8] = 2;
    cr_assert_eq(apply_bytes(t, c, d.len, NULL, NULL), MT_VERSION);
    c[8] = 1;
    c[12] = 1;
    cr_assert_eq(apply_bytes(t, c, d.len, NULL, NULL), MT_CORRUPT);
    c[12] = 0;
    /* A byte after END. */
    c[d.len] = 0;
    cr_assert_eq(apply_bytes(t, c, d.len + 1, NULL, NULL), MT_CORRUPT);
    cr_assert_eq(apply_bytes(t, c, d.len, NULL, NULL), MT_OK);
    free(c);
    wbuf_free(&full);
    mt_table_destroy(t);
    wbuf_free(&d);
}

/* Rebuilds d with block i replaced by (tag, payload) (i == nb: appended before END). */
static void rebuild(const wbuf_t *d, const blk_t *b, size_t nb, size_t i, uint32_t tag,
                    const void *pl, size_t len, wbuf_t *out, int keep_end) {
    wbuf_init(out);
    emit_magic(out, "MTDELTA\0", 1);
    for (size_t k = 0; k < nb; k++) {
        if (k == i) {
            emit_block(out, tag, pl, len);
            continue;
        }
        if (b[k].tag == TAG_END && !keep_end) continue;
        if (b[k].tag == TAG_END && i == nb) emit_block(out, tag, pl, len);
        wbuf_append(out, d->p + b[k].off, 16 + b[k].len);
    }
}

Test(delta, crafted_streams_with_valid_checksums) {
    mt_table_slot_config_t slots[NSLOTS];
    mt_table_config_t cfg;
    wbuf_t d, x;
    small_delta(&cfg, slots, &d);
    blk_t b[8];
    size_t nb = split_blocks(d.p, d.len, b, 8);
    cr_assert_eq(nb, 4);
    cr_assert_eq(b[1].tag, TAG_ROWS);
    cr_assert_eq(b[2].tag, TAG_DELS);
    uint64_t rows = get_le(b[3].pl, 8), dels = get_le(b[3].pl + 8, 8);
    mt_table_t *t;
    cr_assert_eq(mt_table_create(&cfg, &t), MT_OK);
    uint8_t pl[1024];

    /* END totals off by one, each. */
    for (int f = 0; f < 3; f++) {
        wbuf_t e;
        wbuf_init(&e);
        emit_magic(&e, "MTDELTA\0", 1);
        for (size_t k = 0; k < 3; k++)
            wbuf_append(&e, d.p + b[k].off, 16 + b[k].len);
        emit_end(&e, rows + (f == 0), dels + (f == 1), 2 + (f == 2));
        cr_assert_eq(apply_bytes(t, e.p, e.len, NULL, NULL), MT_CORRUPT, "END field %d", f);
        wbuf_free(&e);
    }
    /* No END at all: the input ends. */
    rebuild(&d, b, nb, SIZE_MAX, 0, NULL, 0, &x, 0);
    cr_assert_eq(apply_bytes(t, x.p, x.len, NULL, NULL), MT_TRUNCATED);
    wbuf_free(&x);
    /* A second HEAD; a FILT block; an unknown tag. */
    rebuild(&d, b, nb, nb, TAG_HEAD, b[0].pl, b[0].len, &x, 1);
    cr_assert_eq(apply_bytes(t, x.p, x.len, NULL, NULL), MT_CORRUPT);
    wbuf_free(&x);
    memset(pl, 0, sizeof(pl));
    rebuild(&d, b, nb, nb, TAG_FILT, pl, 8, &x, 1);
    cr_assert_eq(apply_bytes(t, x.p, x.len, NULL, NULL), MT_CORRUPT);
    wbuf_free(&x);
    rebuild(&d, b, nb, nb, TAG('D', 'E', 'L', 'T'), pl, 8, &x, 1);
    cr_assert_eq(apply_bytes(t, x.p, x.len, NULL, NULL), MT_CORRUPT);
    wbuf_free(&x);
    /* DELS whose count disagrees with its length; a deletion of an unconfigured slot. */
    memcpy(pl, b[2].pl, b[2].len);
    pl[0]++;
    rebuild(&d, b, nb, 2, TAG_DELS, pl, b[2].len, &x, 1);
    cr_assert_eq(apply_bytes(t, x.p, x.len, NULL, NULL), MT_CORRUPT);
    wbuf_free(&x);
    memcpy(pl, b[2].pl, b[2].len);
    pl[4 + 7] = 0x77; /* the first fid's slot: 0x77xx */
    rebuild(&d, b, nb, 2, TAG_DELS, pl, b[2].len, &x, 1);
    cr_assert_eq(apply_bytes(t, x.p, x.len, NULL, NULL), MT_CORRUPT);
    wbuf_free(&x);
    /* ROWS: one byte short, one byte long, a row count one too high. */
    cr_assert_leq(b[1].len + 1, sizeof(pl));
    memcpy(pl, b[1].pl, b[1].len);
    pl[b[1].len] = 0;
    rebuild(&d, b, nb, 1, TAG_ROWS, pl, b[1].len - 1, &x, 1);
    cr_assert_eq(apply_bytes(t, x.p, x.len, NULL, NULL), MT_CORRUPT);
    wbuf_free(&x);
    rebuild(&d, b, nb, 1, TAG_ROWS, pl, b[1].len + 1, &x, 1);
    cr_assert_eq(apply_bytes(t, x.p, x.len, NULL, NULL), MT_CORRUPT);
    wbuf_free(&x);
    pl[0]++;
    rebuild(&d, b, nb, 1, TAG_ROWS, pl, b[1].len, &x, 1);
    cr_assert_eq(apply_bytes(t, x.p, x.len, NULL, NULL), MT_CORRUPT);
    wbuf_free(&x);
    /* A row of a slot the table has but the HEAD does not list. */
    {
        mt_table_slot_config_t s4[NSLOTS + 1];
        make_slots(s4);
        mt_table_slot_config_init(&s4[NSLOTS], 9, 4);
        s4[NSLOTS].opt = MT_OPT_SGD; /* rows of 24 + 16 bytes, no state */
        mt_table_config_t c4;
        make_cfg(&c4, s4, NSLOTS + 1);
        mt_table_t *t4;
        cr_assert_eq(mt_table_create(&c4, &t4), MT_OK);
        cr_assert_eq(apply_bytes(t4, d.p, d.len, NULL, NULL), MT_OK); /* extra slot: fine */
        uint8_t row[4 + 24 + 16]; /* one well-formed row of slot 9 */
        memset(row, 0, sizeof(row));
        row[0] = 1;
        row[4 + 6] = 9; /* fid = 9 << 48 */
        wbuf_t y;
        wbuf_init(&y);
        emit_magic(&y, "MTDELTA\0", 1);
        wbuf_append(&y, d.p + b[0].off, 16 + b[0].len);
        emit_block(&y, TAG_ROWS, row, sizeof(row));
        emit_end(&y, 1, 0, 1);
        cr_assert_eq(apply_bytes(t4, y.p, y.len, NULL, NULL), MT_CORRUPT);
        wbuf_free(&y);
        mt_table_destroy(t4);
    }
    /* A HEAD one byte short; a row version past 2^62. */
    rebuild(&d, b, nb, 0, TAG_HEAD, b[0].pl, b[0].len - 1, &x, 1);
    cr_assert_eq(apply_bytes(t, x.p, x.len, NULL, NULL), MT_CORRUPT);
    wbuf_free(&x);
    memcpy(pl, b[1].pl, b[1].len);
    pl[4 + 15] = 0x80;
    rebuild(&d, b, nb, 1, TAG_ROWS, pl, b[1].len, &x, 1);
    cr_assert_eq(apply_bytes(t, x.p, x.len, NULL, NULL), MT_CORRUPT);
    wbuf_free(&x);
    /* After all that, the real one applies. */
    cr_assert_eq(apply_bytes(t, d.p, d.len, NULL, NULL), MT_OK);
    mt_table_destroy(t);
    wbuf_free(&d);
}

Test(delta, slot_mismatch) {
    mt_table_slot_config_t slots[NSLOTS];
    mt_table_config_t cfg;
    wbuf_t d;
    small_delta(&cfg, slots, &d);
    for (int k = 0; k < 4; k++) {
        mt_table_slot_config_t s2[NSLOTS];
        make_slots(s2);
        size_t n = NSLOTS;
        if (k == 0) s2[0].dim = 9;
        if (k == 1) s2[0].opt = MT_OPT_SGD;
        if (k == 2) s2[1].precision = MT_PREC_FP32;
        if (k == 3) n = NSLOTS - 1; /* slot 3 missing */
        mt_table_config_t c2;
        make_cfg(&c2, s2, n);
        mt_table_t *t;
        cr_assert_eq(mt_table_create(&c2, &t), MT_OK);
        uint64_t rows = 9, dels = 9;
        cr_assert_eq(apply_bytes(t, d.p, d.len, &rows, &dels), MT_MISMATCH, "case %d", k);
        cr_assert_eq(rows + dels, 0);
        cr_assert_eq(table_rows(t), 0);
        mt_table_destroy(t);
    }
    /* Other settings may differ (learning rate, TTL, filter). */
    mt_table_slot_config_t s2[NSLOTS];
    make_slots(s2);
    s2[0].lr = 0.5f;
    s2[0].ttl_s = 0;
    s2[2].min_count = 0;
    mt_table_config_t c2;
    make_cfg(&c2, s2, NSLOTS);
    c2.shards_log2 = 0;
    mt_table_t *t;
    cr_assert_eq(mt_table_create(&c2, &t), MT_OK);
    cr_assert_eq(apply_bytes(t, d.p, d.len, NULL, NULL), MT_OK);
    mt_table_destroy(t);
    wbuf_free(&d);
}

Test(delta, write_callback_failing_at_every_call) {
    mt_table_slot_config_t slots[NSLOTS];
    mt_table_config_t cfg;
    make_slots(slots);
    make_cfg(&cfg, slots, NSLOTS);
    ids_t seen = {0};
    uint64_t rng = 13;
    mt_table_t *t;
    cr_assert_eq(mt_table_create(&cfg, &t), MT_OK);
    train_range(t, 0, 20, 1000, &rng, &seen);
    uint64_t since = version_now(t);
    update_some(t, 0, 5, 1, 1100, &rng);
    remove_some(t, 10, 12, 1);
    wbuf_t ok;
    uint64_t upto;
    save_delta(t, since, &ok, &upto);
    size_t calls = ok.calls;
    cr_assert_geq(calls, 1 + 3 * 4);
    for (size_t k = 0; k < calls; k++) {
        wbuf_t w;
        wbuf_init(&w);
        w.fail_at = k;
        w.fail_err = MT_IO;
        cr_assert_eq(mt_table_save_changes(t, since, wbuf_write, &w, &upto), MT_IO, "call %zu", k);
        cr_assert_eq(w.calls, k + 1, "no call after the failing one");
        wbuf_free(&w);
    }
    wbuf_free(&ok);
    mt_table_destroy(t);
    free(seen.v);
}

/* ============================== concurrent writers ============================== */

#define CW_IDS 4000u

typedef struct cw_arg {
    mt_table_t *t;
    _Atomic int stop;
    _Atomic uint64_t batches;
    uint64_t rng;
} cw_arg_t;

/* Applies, trains (admitting new ids) and removes, over CW_IDS ids per slot, until stopped. */
static void *cw_main(void *p) {
    cw_arg_t *a = p;
    uint64_t fids[16];
    float buf[16 * MT_TABLE_MAX_DIM];
    while (!atomic_load(&a->stop)) {
        for (int k = 0; k < 16; k++)
            fids[k] = fid_of((int)(splitmix(&a->rng) % NSLOTS), splitmix(&a->rng) % CW_IDS);
        size_t nf;
        if (mt_table_batch_floats(a->t, fids, 16, &nf) != MT_OK) return (void *)1;
        uint32_t now = 5000 + (uint32_t)(atomic_load(&a->batches) / 64);
        switch (splitmix(&a->rng) % 4) {
        case 0:
        case 1:
            if (mt_table_lookup(a->t, fids, 16, buf, nf, NULL, MT_TABLE_TRAIN, now, NULL))
                return (void *)1;
            for (size_t i = 0; i < nf; i++)
                buf[i] = urand(&a->rng);
            if (mt_table_apply(a->t, fids, 16, buf, nf, now, NULL)) return (void *)1;
            break;
        case 2:
            for (size_t i = 0; i < nf; i++)
                buf[i] = urand(&a->rng);
            if (mt_table_assign(a->t, fids, 16, buf, nf, now, NULL)) return (void *)1;
            break;
        default:
            if (mt_table_remove(a->t, fids, 4, NULL)) return (void *)1;
        }
        atomic_fetch_add(&a->batches, 1);
    }
    return NULL;
}

Test(delta, deltas_during_concurrent_writes_end_and_load, .timeout = 600) {
    mt_table_slot_config_t slots[NSLOTS];
    mt_table_config_t cfg;
    make_slots(slots);
    make_cfg(&cfg, slots, NSLOTS);
    mt_table_t *t;
    cr_assert_eq(mt_table_create(&cfg, &t), MT_OK);
    ids_t seen = {0};
    for (int s = 0; s < NSLOTS; s++)
        for (uint64_t i = 0; i < CW_IDS; i++)
            ids_add(&seen, fid_of(s, i));
    uint64_t rng = 17;
    train_range(t, 0, CW_IDS / 2, 1000, &rng, &seen);
    uint64_t since = version_now(t);
    wbuf_t full;
    save_full(t, &full);
    mt_table_t *copy = load_full(&cfg, &full);
    cw_arg_t a = {.t = t, .rng = 99};
#ifdef MT_SANITIZED
    const int rounds = 4;
#else
    const int rounds = 10;
#endif
    for (int k = 0; k < rounds; k++) {
        atomic_store(&a.stop, 0);
        uint64_t b0 = atomic_load(&a.batches);
        pthread_t th;
        cr_assert_eq(pthread_create(&th, NULL, cw_main, &a), 0);
        while (atomic_load(&a.batches) == b0)
            sched_yield(); /* the writer is under way before the save starts */
        wbuf_t d;
        uint64_t upto;
        save_delta(t, since, &d, &upto);
        atomic_store(&a.stop, 1);
        void *rc;
        cr_assert_eq(pthread_join(th, &rc), 0);
        cr_assert_null(rc, "the writer failed");
        uint64_t rows = 0, dels = 0;
        cr_assert_eq(apply_bytes(copy, d.p, d.len, &rows, &dels), MT_OK, "delta %d", k);
        cr_log_info("delta %d: %" PRIu64 " rows, %" PRIu64 " deletions, writer at %" PRIu64
                    " batches",
                    k, rows, dels, atomic_load(&a.batches));
        since = upto;
        wbuf_free(&d);
    }
    /* The writer has stopped: one more delta brings the copy to the live state exactly. */
    wbuf_t d;
    uint64_t upto;
    save_delta(t, since, &d, &upto);
    cr_assert_eq(apply_bytes(copy, d.p, d.len, NULL, NULL), MT_OK);
    size_t live = assert_same_rows(t, copy, &seen);
    cr_log_info("after the writer: %zu rows equal", live);
    wbuf_free(&d);
    wbuf_free(&full);
    mt_table_destroy(copy);
    mt_table_destroy(t);
    free(seen.v);
}
