/*
 * test_join.c - the joiner's core (mt/joiner.h) without Kafka: join rules, shuffled,
 * duplicated, early and late events, negative sampling, the memory bound, bad messages, and
 * restarts (clean and crashed mid-stream) with exact counts of what came out.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "monolith/v1/example.pb-c.h"
#include "mt/joiner.h"

#define SLOT_USER 1u
#define SLOT_ITEM 2u
#define SLOT_CAT  3u
#define FID(s, v) (((uint64_t)(s) << 48) | (uint64_t)(v))

/* ---------------- helpers ---------------- */

static int64_t fake_now;
static int64_t fake_clock(void *opaque) {
    (void)opaque;
    return fake_now;
}

static char *temp_dir(void) {
    char *d = strdup("/tmp/test_joiner_XXXXXX");
    cr_assert_not_null(mkdtemp(d));
    return d;
}

static void rm_rf(const char *d) {
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d);
    cr_assert_eq(system(cmd), 0);
}

static mt_joiner_config_t base_config(void) {
    mt_joiner_config_t c;
    mt_joiner_config_init(&c);
    c.window_ms = 1000;
    c.allowed_lateness_ms = 100;
    c.idle_advance_ms = 0;
    c.sync = 0;
    return c;
}

static mt_joiner_t *open_j(const char *dir, const mt_joiner_config_t *c) {
    mt_joiner_t *j = NULL;
    char err[256] = "";
    cr_assert_eq(mt_joiner_open(dir, c, fake_clock, NULL, &j, err, sizeof(err)), MT_OK, "%s", err);
    return j;
}

/* An Impression: user slot 1 (fid user), item slots 2 (item) and 3 (item % 5); user side
 * also has slot 3 (fid 100 + user % 3) to check the merge. */
static uint8_t *impression(const char *rid, uint64_t item, int64_t ts, uint64_t user, size_t *len) {
    Monolith__V1__Impression im = MONOLITH__V1__IMPRESSION__INIT;
    Monolith__V1__SlotFids u1 = MONOLITH__V1__SLOT_FIDS__INIT, u3 = MONOLITH__V1__SLOT_FIDS__INIT;
    Monolith__V1__SlotFids i2 = MONOLITH__V1__SLOT_FIDS__INIT, i3 = MONOLITH__V1__SLOT_FIDS__INIT;
    uint64_t fu1 = FID(SLOT_USER, user), fu3 = FID(SLOT_CAT, 100 + user % 3);
    uint64_t fi2 = FID(SLOT_ITEM, item), fi3 = FID(SLOT_CAT, item % 5);
    u1.slot = SLOT_USER, u1.n_fids = 1, u1.fids = &fu1;
    u3.slot = SLOT_CAT, u3.n_fids = 1, u3.fids = &fu3;
    i2.slot = SLOT_ITEM, i2.n_fids = 1, i2.fids = &fi2;
    i3.slot = SLOT_CAT, i3.n_fids = 1, i3.fids = &fi3;
    Monolith__V1__SlotFids *user_s[] = {&u3, &u1}, *item_s[] = {&i2, &i3};
    im.request_id = (char *)rid;
    im.timestamp_ms = ts;
    im.item_id = item;
    im.n_user = 2, im.user = user_s;
    im.n_item = 2, im.item = item_s;
    *len = monolith__v1__impression__get_packed_size(&im);
    uint8_t *b = malloc(*len + 1);
    monolith__v1__impression__pack(&im, b);
    return b;
}

static uint8_t *action(const char *rid, uint64_t item, int64_t ts, size_t *len) {
    Monolith__V1__Action a = MONOLITH__V1__ACTION__INIT;
    a.request_id = (char *)rid;
    a.timestamp_ms = ts;
    a.type = MONOLITH__V1__ACTION_TYPE__ACTION_CLICK;
    a.item_id = item;
    *len = monolith__v1__action__get_packed_size(&a);
    uint8_t *b = malloc(*len + 1);
    monolith__v1__action__pack(&a, b);
    return b;
}

static mt_joiner_outcome_t add_imp(mt_joiner_t *j, const char *rid, uint64_t item, int64_t ts) {
    size_t len;
    uint8_t *b = impression(rid, item, ts, 7, &len);
    mt_joiner_outcome_t oc;
    cr_assert_eq(mt_joiner_add(j, MT_JOINER_IMPRESSIONS, NULL, 0, -1, b, len, &oc, NULL, 0), MT_OK);
    free(b);
    return oc;
}

static mt_joiner_outcome_t add_act(mt_joiner_t *j, const char *rid, uint64_t item, int64_t ts) {
    size_t len;
    uint8_t *b = action(rid, item, ts, &len);
    mt_joiner_outcome_t oc;
    cr_assert_eq(mt_joiner_add(j, MT_JOINER_ACTIONS, NULL, 0, -1, b, len, &oc, NULL, 0), MT_OK);
    free(b);
    return oc;
}

static void tick(mt_joiner_t *j) {
    cr_assert_eq(mt_joiner_tick(j, NULL), MT_OK);
}

static mt_joiner_stats_t stats(mt_joiner_t *j) {
    mt_joiner_stats_t s;
    mt_joiner_stats(j, &s);
    return s;
}

/* Outbox examples with their labels: "rid/label" strings, the outbox emptied. */
typedef struct got {
    char key[64];
    int label;
    float rate;
} got_t;

static size_t take(mt_joiner_t *j, got_t *out, size_t cap) {
    size_t n = mt_joiner_outbox_size(j);
    cr_assert(n <= cap, "%zu examples", n);
    for (size_t i = 0; i < n; i++) {
        const mt_joiner_example_t *x = mt_joiner_outbox_get(j, i);
        Monolith__V1__Example *ex = monolith__v1__example__unpack(NULL, x->len, x->value);
        cr_assert_not_null(ex);
        cr_assert_str_eq(ex->request_id, x->request_id);
        cr_assert_eq(ex->n_labels, 1);
        cr_assert_eq((int)ex->labels[0], x->label);
        uint64_t item = 0;
        for (size_t s = 0; s < ex->n_slots; s++)
            if (ex->slots[s]->slot == SLOT_ITEM) item = ex->slots[s]->fids[0] & 0xffffffffffffull;
        snprintf(out[i].key, sizeof(out[i].key), "%s/%llu", x->request_id,
                 (unsigned long long)item);
        out[i].label = x->label;
        out[i].rate = ex->sample_rate;
        monolith__v1__example__free_unpacked(ex, NULL);
    }
    cr_assert_eq(mt_joiner_outbox_done(j, n), MT_OK);
    return n;
}

/* ---------------- the join rules ---------------- */

Test(joiner, positive_negative_and_example_content) {
    char *dir = temp_dir();
    mt_joiner_config_t c = base_config();
    mt_joiner_t *j = open_j(dir, &c);
    cr_assert_eq(add_imp(j, "r1", 11, 10000), MT_JOINER_PENDING);
    cr_assert_eq(add_imp(j, "r2", 12, 10000), MT_JOINER_PENDING);
    cr_assert_eq(add_act(j, "r1", 11, 10500), MT_JOINER_JOINED);
    cr_assert_eq(mt_joiner_outbox_size(j), 1);
    const mt_joiner_example_t *x = mt_joiner_outbox_get(j, 0);
    cr_assert_str_eq(x->request_id, "r1");
    Monolith__V1__Example *ex = monolith__v1__example__unpack(NULL, x->len, x->value);
    cr_assert_not_null(ex);
    cr_assert_eq(ex->timestamp_ms, 10000);
    cr_assert_eq(ex->labels[0], 1.0f);
    cr_assert_eq(ex->sample_rate, 1.0f);
    cr_assert_eq(ex->n_slots, 3); /* 1, 2, and 3 merged from both sides, sorted */
    cr_assert_eq(ex->slots[0]->slot, 1);
    cr_assert_eq(ex->slots[1]->slot, 2);
    cr_assert_eq(ex->slots[2]->slot, 3);
    cr_assert_eq(ex->slots[2]->n_fids, 2);
    cr_assert_eq(ex->slots[2]->fids[0], FID(SLOT_CAT, 101));
    cr_assert_eq(ex->slots[2]->fids[1], FID(SLOT_CAT, 1));
    monolith__v1__example__free_unpacked(ex, NULL);
    cr_assert_eq(mt_joiner_outbox_done(j, 1), MT_OK);
    /* r2 closes when the watermark (max event - 100) passes 11000 */
    tick(j);
    cr_assert_eq(mt_joiner_outbox_size(j), 0);
    add_imp(j, "r3", 13, 11100); /* watermark 11000: not yet past */
    tick(j);
    cr_assert_eq(mt_joiner_outbox_size(j), 0);
    add_imp(j, "r4", 14, 11101);
    tick(j);
    got_t g[8];
    cr_assert_eq(take(j, g, 8), 1);
    cr_assert_str_eq(g[0].key, "r2/12");
    cr_assert_eq(g[0].label, 0);
    mt_joiner_stats_t s = stats(j);
    cr_assert_eq(s.positives, 1);
    cr_assert_eq(s.negatives, 1);
    cr_assert_eq(s.pending, 2);
    cr_assert_eq(s.watermark_ms, 11001);
    mt_joiner_close(j);
    rm_rf(dir);
    free(dir);
}

Test(joiner, early_late_duplicate_and_ambiguous) {
    char *dir = temp_dir();
    mt_joiner_config_t c = base_config();
    mt_joiner_t *j = open_j(dir, &c);
    /* an action before its impression waits, then joins */
    cr_assert_eq(add_act(j, "e1", 5, 1000), MT_JOINER_EARLY);
    cr_assert_eq(add_act(j, "e1", 5, 1000), MT_JOINER_DUPLICATE);
    cr_assert_eq(add_imp(j, "e1", 5, 900), MT_JOINER_JOINED);
    cr_assert_eq(add_imp(j, "e1", 5, 900), MT_JOINER_DUPLICATE);
    cr_assert_eq(add_act(j, "e1", 5, 1001), MT_JOINER_DUPLICATE);
    /* item 0: one impression of the request -> joins; two -> ambiguous */
    cr_assert_eq(add_imp(j, "z1", 8, 1000), MT_JOINER_PENDING);
    cr_assert_eq(add_act(j, "z1", 0, 1200), MT_JOINER_JOINED);
    cr_assert_eq(add_imp(j, "z2", 8, 1000), MT_JOINER_PENDING);
    cr_assert_eq(add_imp(j, "z2", 9, 1000), MT_JOINER_PENDING);
    cr_assert_eq(add_act(j, "z2", 0, 1200), MT_JOINER_AMBIGUOUS);
    /* an action after its impression's window (but before it closed) labels nothing */
    cr_assert_eq(add_imp(j, "w1", 3, 1000), MT_JOINER_PENDING);
    cr_assert_eq(add_act(j, "w1", 3, 2001), MT_JOINER_LATE_ACTION);
    got_t g[16];
    cr_assert_eq(take(j, g, 16), 2);
    /* close everything up to event time 5000 */
    add_imp(j, "far", 1, 5200);
    tick(j);
    size_t n = take(j, g, 16);
    cr_assert_eq(n, 3, "%zu", n); /* z2/8, z2/9, w1/3 negatives */
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(g[i].label, 0);
    /* after the close: the action is late, the impression a duplicate (tombstone) */
    cr_assert_eq(add_act(j, "w1", 3, 1500), MT_JOINER_LATE_ACTION);
    cr_assert_eq(add_imp(j, "w1", 3, 1000), MT_JOINER_DUPLICATE);
    /* a new impression far behind the watermark is closed at once */
    cr_assert_eq(add_imp(j, "old", 4, 100), MT_JOINER_LATE_IMPRESSION);
    /* an action too old to wait for anything */
    cr_assert_eq(add_act(j, "nobody", 4, 100), MT_JOINER_LATE_ACTION);
    /* an early action whose impression never comes expires */
    cr_assert_eq(add_act(j, "orphan", 4, 5100), MT_JOINER_EARLY);
    add_imp(j, "far2", 1, 7000);
    tick(j);
    mt_joiner_stats_t s = stats(j);
    cr_assert_eq(s.early_actions, 2);
    cr_assert_eq(s.early_joined, 1);
    cr_assert_eq(s.early_expired, 1);
    cr_assert_eq(s.early_pending, 0);
    cr_assert_eq(s.ambiguous_actions, 1);
    cr_assert_eq(s.duplicate_actions, 2);
    cr_assert_eq(s.duplicate_impressions, 2);
    cr_assert_eq(s.late_actions, 3);
    cr_assert_eq(s.late_impressions, 1);
    cr_assert_eq(s.positives, 2);
    mt_joiner_close(j);
    rm_rf(dir);
    free(dir);
}

/* A stream of requests (1-3 items each, about a third clicked within the window, a few
 * clicked too late), shuffled within the allowed lateness, every event duplicated with
 * probability 0.2: every impression comes out exactly once with the right label. */
typedef struct ev {
    int64_t ts;
    int kind; /* 0 impression, 1 action */
    char rid[24];
    uint64_t item;
    uint64_t order;
} ev_t;

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static int cmp_order(const void *a, const void *b) {
    const ev_t *x = a, *y = b;
    return x->order < y->order ? -1 : x->order > y->order;
}

static size_t make_stream(ev_t *evs, size_t cap, int nreq, char *expect_label, uint64_t seed) {
    uint64_t rs = seed;
    size_t n = 0;
    for (int r = 0; r < nreq; r++) {
        int64_t t = 100000 + (int64_t)r * 20;
        int items = 1 + (int)(rng_next(&rs) % 3);
        for (int i = 0; i < items; i++) {
            ev_t *e = &evs[n++];
            e->ts = t;
            e->kind = 0;
            snprintf(e->rid, sizeof(e->rid), "q%d", r);
            e->item = (uint64_t)(r * 4 + i + 1);
            uint64_t u = rng_next(&rs) % 100;
            expect_label[r * 4 + i + 1] = 0;
            if (u < 35 || u >= 95) {
                ev_t *a = &evs[n++];
                *a = *e;
                a->kind = 1;
                a->ts = u < 35 ? t + 1 + (int64_t)(rng_next(&rs) % 999) : t + 1001 + 50;
                expect_label[r * 4 + i + 1] = u < 35 ? 1 : 0;
            }
        }
        cr_assert(n + 8 < cap);
    }
    /* shuffle within the lateness: order by ts + jitter in [0, 80) */
    for (size_t i = 0; i < n; i++)
        evs[i].order = (uint64_t)(evs[i].ts * 100) + rng_next(&rs) % 8000;
    qsort(evs, n, sizeof(*evs), cmp_order);
    /* duplicates: a copy a few places later */
    size_t m = n;
    for (size_t i = 0; i < n && m + 1 < cap; i++) {
        if (rng_next(&rs) % 5 == 0) evs[m++] = evs[i];
    }
    for (size_t i = n; i < m; i++)
        evs[i].order = (uint64_t)(evs[i].ts * 100) + 100 + rng_next(&rs) % 7000;
    qsort(evs, m, sizeof(*evs), cmp_order);
    return m;
}

static void feed(mt_joiner_t *j, const ev_t *e, const char *topic, int64_t offset) {
    size_t len;
    uint8_t *b = e->kind ? action(e->rid, e->item, e->ts, &len)
                         : impression(e->rid, e->item, e->ts, 7, &len);
    char why[128];
    cr_assert_eq(mt_joiner_add(j, e->kind ? MT_JOINER_ACTIONS : MT_JOINER_IMPRESSIONS, topic,
                               e->kind, offset, b, len, NULL, why, sizeof(why)),
                 MT_OK);
    free(b);
}

static void check_outputs(const got_t *g, size_t n, const char *expect_label, int nreq,
                          int nitems_total) {
    int *seen = calloc((size_t)nreq * 4 + 8, sizeof(int));
    for (size_t i = 0; i < n; i++) {
        int r;
        unsigned long long item;
        cr_assert_eq(sscanf(g[i].key, "q%d/%llu", &r, &item), 2, "%s", g[i].key);
        cr_assert(item < (unsigned long long)nreq * 4 + 8);
        cr_assert_eq(seen[item]++, 0, "%s emitted twice", g[i].key);
        cr_assert_eq(g[i].label, expect_label[item], "%s label %d", g[i].key, g[i].label);
    }
    cr_assert_eq((int)n, nitems_total);
    free(seen);
}

Test(joiner, shuffled_duplicated_stream_joins_exactly) {
    char *dir = temp_dir();
    mt_joiner_config_t c = base_config();
    mt_joiner_t *j = open_j(dir, &c);
    enum { NREQ = 2000 };
    static ev_t evs[NREQ * 10];
    static char expect[NREQ * 4 + 8];
    static got_t g[NREQ * 4];
    size_t n = make_stream(evs, NREQ * 10, NREQ, expect, 42), ng = 0;
    for (size_t i = 0; i < n; i++) {
        feed(j, &evs[i], NULL, -1);
        if (i % 50 == 0) {
            tick(j);
            ng += take(j, g + ng, NREQ * 4 - ng);
        }
    }
    cr_assert_eq(mt_joiner_drain(j, NULL), MT_OK);
    ng += take(j, g + ng, NREQ * 4 - ng);
    mt_joiner_stats_t s = stats(j);
    check_outputs(g, ng, expect, NREQ, (int)(s.impressions - s.duplicate_impressions));
    cr_assert_eq(s.positives + s.negatives, ng);
    cr_assert_eq(s.pending, 0);
    cr_assert_gt(s.duplicate_impressions + s.duplicate_actions, 100);
    cr_assert_gt(s.late_actions, 10);
    cr_assert_eq(s.bad_messages, 0);
    mt_joiner_close(j);
    rm_rf(dir);
    free(dir);
}

/* ---------------- sampling, memory, bad input ---------------- */

Test(joiner, negative_sampling_is_deterministic_and_carries_the_rate) {
    char *d1 = temp_dir(), *d2 = temp_dir();
    mt_joiner_config_t c = base_config();
    c.negative_rate = 0.3;
    mt_joiner_t *a = open_j(d1, &c), *b = open_j(d2, &c);
    static got_t ga[4000], gb[4000];
    for (int i = 0; i < 4000; i++) {
        char rid[16];
        snprintf(rid, sizeof(rid), "n%d", i);
        add_imp(a, rid, 1, 1000);
        add_imp(b, rid, 1, 1000);
    }
    add_act(a, "n0", 1, 1001);
    add_act(b, "n0", 1, 1001);
    cr_assert_eq(mt_joiner_drain(a, NULL), MT_OK);
    cr_assert_eq(mt_joiner_drain(b, NULL), MT_OK);
    size_t na = take(a, ga, 4000), nb = take(b, gb, 4000);
    cr_assert_eq(na, nb);
    for (size_t i = 0; i < na; i++) {
        cr_assert_str_eq(ga[i].key, gb[i].key);
        cr_assert_float_eq(ga[i].rate, ga[i].label ? 1.0f : 0.3f, 1e-6);
    }
    mt_joiner_stats_t s = stats(a);
    cr_assert_eq(s.positives, 1);
    cr_assert_eq(s.negatives + s.sampled_out, 3999);
    cr_assert(s.negatives > 1050 && s.negatives < 1350, "%llu kept",
              (unsigned long long)s.negatives);
    mt_joiner_close(a);
    mt_joiner_close(b);
    rm_rf(d1);
    rm_rf(d2);
    free(d1);
    free(d2);
}

Test(joiner, memory_holds_at_most_max_pending_memory) {
    char *dir = temp_dir();
    mt_joiner_config_t c = base_config();
    c.max_pending_memory = 10;
    mt_joiner_t *j = open_j(dir, &c);
    for (int i = 0; i < 1000; i++) {
        char rid[16];
        snprintf(rid, sizeof(rid), "m%d", i);
        cr_assert_eq(add_imp(j, rid, 1, 1000), MT_JOINER_PENDING);
    }
    mt_joiner_stats_t s = stats(j);
    cr_assert_eq(s.pending, 1000);
    cr_assert_leq(s.pending_memory, 10);
    cr_assert_eq(add_act(j, "m3", 1, 1500), MT_JOINER_JOINED); /* from RocksDB */
    cr_assert_eq(add_act(j, "m999", 1, 1500), MT_JOINER_JOINED);
    s = stats(j);
    cr_assert_geq(s.memory_misses, 1);
    cr_assert_eq(mt_joiner_drain(j, NULL), MT_OK);
    s = stats(j);
    cr_assert_eq(s.positives, 2);
    cr_assert_eq(s.negatives, 998);
    cr_assert_eq(s.pending, 0);
    mt_joiner_close(j);
    rm_rf(dir);
    free(dir);
}

Test(joiner, bad_messages_are_counted_and_skipped) {
    char *dir = temp_dir();
    mt_joiner_config_t c = base_config();
    mt_joiner_t *j = open_j(dir, &c);
    mt_joiner_outcome_t oc;
    char why[128];
    cr_assert_eq(mt_joiner_add(j, MT_JOINER_IMPRESSIONS, "features", 0, 0, "garbage\xff", 8, &oc,
                               why, sizeof(why)),
                 MT_OK);
    cr_assert_eq(oc, MT_JOINER_BAD);
    cr_assert(strstr(why, "Impression"), "%s", why);
    cr_assert_eq(
        mt_joiner_add(j, MT_JOINER_ACTIONS, "actions", 0, 0, NULL, 0, &oc, why, sizeof(why)),
        MT_OK);
    cr_assert_eq(oc, MT_JOINER_BAD);
    size_t len;
    uint8_t *b = impression("", 1, 1000, 1, &len); /* no request id */
    cr_assert_eq(
        mt_joiner_add(j, MT_JOINER_IMPRESSIONS, "features", 0, 1, b, len, &oc, why, sizeof(why)),
        MT_OK);
    free(b);
    cr_assert_eq(oc, MT_JOINER_BAD);
    /* a fid outside its slot */
    Monolith__V1__Impression im = MONOLITH__V1__IMPRESSION__INIT;
    Monolith__V1__SlotFids sf = MONOLITH__V1__SLOT_FIDS__INIT;
    uint64_t fid = FID(4, 1);
    sf.slot = 5, sf.n_fids = 1, sf.fids = &fid;
    Monolith__V1__SlotFids *sfs[] = {&sf};
    im.request_id = "x", im.n_user = 1, im.user = sfs;
    uint8_t buf[128];
    len = monolith__v1__impression__pack(&im, buf);
    cr_assert_eq(
        mt_joiner_add(j, MT_JOINER_IMPRESSIONS, "features", 0, 2, buf, len, &oc, why, sizeof(why)),
        MT_OK);
    cr_assert_eq(oc, MT_JOINER_BAD);
    cr_assert(strstr(why, "slot"), "%s", why);
    cr_assert_eq(stats(j).bad_messages, 4);
    mt_joiner_close(j);
    rm_rf(dir);
    free(dir);
}

/* ---------------- restarts ---------------- */

/* Feeds events [from, to) of the stream with their offsets (topic per kind, partition 0 for
 * impressions and 1 for actions), ticking and delivering every 37 events. */
static size_t run_part(mt_joiner_t *j, const ev_t *evs, size_t from, size_t to, got_t *g,
                       size_t cap, int deliver) {
    size_t ng = 0;
    for (size_t i = from; i < to; i++) {
        feed(j, &evs[i], "in", (int64_t)i);
        if (i % 37 == 0) {
            tick(j);
            if (deliver) ng += take(j, g + ng, cap - ng);
        }
    }
    return ng;
}

Test(joiner, restart_resumes_without_loss_or_duplicates) {
    char *dir = temp_dir();
    mt_joiner_config_t c = base_config();
    c.max_pending_memory = 100;
    enum { NREQ = 1500 };
    static ev_t evs[NREQ * 10];
    static char expect[NREQ * 4 + 8];
    static got_t g[NREQ * 4];
    size_t n = make_stream(evs, NREQ * 10, NREQ, expect, 7), ng = 0;
    size_t half = n / 2;
    mt_joiner_t *j = open_j(dir, &c);
    ng += run_part(j, evs, 0, half, g, NREQ * 4, 1);
    /* examples made but not delivered survive the restart (the outbox) */
    tick(j);
    size_t undelivered = mt_joiner_outbox_size(j);
    mt_joiner_stats_t s1 = stats(j);
    mt_joiner_close(j);
    j = open_j(dir, &c);
    mt_joiner_stats_t s2 = stats(j);
    cr_assert_eq(s2.outbox_recovered, undelivered);
    cr_assert_eq(s2.pending, s1.pending);
    cr_assert_eq(s2.watermark_ms, s1.watermark_ms);
    ng += take(j, g + ng, NREQ * 4 - ng);
    /* Kafka redelivers from an older committed offset: the first 300 of the second run are
     * known and skipped */
    size_t replay_from = half - 300;
    for (size_t i = replay_from; i < half; i++)
        feed(j, &evs[i], "in", (int64_t)i);
    cr_assert_eq(stats(j).replayed, 300);
    ng += run_part(j, evs, half, n, g + ng, NREQ * 4 - ng, 1);
    cr_assert_eq(mt_joiner_drain(j, NULL), MT_OK);
    ng += take(j, g + ng, NREQ * 4 - ng);
    mt_joiner_stats_t s3 = stats(j);
    uint64_t imps =
        s1.impressions - s1.duplicate_impressions + s3.impressions - s3.duplicate_impressions;
    check_outputs(g, ng, expect, NREQ, (int)imps);
    mt_joiner_close(j);
    rm_rf(dir);
    free(dir);
}

/* kill -9 in the middle: a child applies part of the stream and dies without closing
 * (RocksDB's WAL written, never synced or closed); the parent reopens, re-feeds from an
 * earlier "committed" offset and gets every example exactly once (delivered ones are
 * recorded in a file as a consumer of the examples topic would see them). */
Test(joiner, crash_mid_stream_loses_and_repeats_nothing) {
    char *dir = temp_dir();
    mt_joiner_config_t c = base_config();
    c.max_pending_memory = 50;
    enum { NREQ = 1500 };
    static ev_t evs[NREQ * 10];
    static char expect[NREQ * 4 + 8];
    static got_t g[NREQ * 4];
    size_t n = make_stream(evs, NREQ * 10, NREQ, expect, 99);
    size_t cut = n * 2 / 3;
    char path[512];
    snprintf(path, sizeof(path), "%s.delivered", dir);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        mt_joiner_t *j = NULL;
        if (mt_joiner_open(dir, &c, fake_clock, NULL, &j, NULL, 0)) _exit(3);
        FILE *f = fopen(path, "wb");
        static got_t cg[NREQ * 4];
        size_t total = 0;
        for (size_t i = 0; i < cut; i++) {
            feed(j, &evs[i], "in", (int64_t)i);
            if (i % 41 == 0) {
                mt_joiner_tick(j, NULL);
                size_t k = take(j, cg, NREQ * 4);
                fwrite(cg, sizeof(got_t), k, f);
                total += k;
            }
        }
        mt_joiner_tick(j, NULL); /* made, not delivered: in the outbox at the crash */
        fclose(f);
        _exit(mt_joiner_outbox_size(j) > 0 ? 0 : 4);
    }
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d", st);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    size_t ng = fread(g, sizeof(got_t), NREQ * 4, f);
    fclose(f);
    unlink(path);
    mt_joiner_t *j = open_j(dir, &c);
    mt_joiner_stats_t s0 = stats(j);
    cr_assert_gt(s0.outbox_recovered, 0);
    ng += take(j, g + ng, NREQ * 4 - ng);
    /* the last commit was long before the crash: everything from 1000 on comes again */
    ng += run_part(j, evs, 1000, n, g + ng, NREQ * 4 - ng, 1);
    cr_assert_eq(stats(j).replayed, cut - 1000);
    cr_assert_eq(mt_joiner_drain(j, NULL), MT_OK);
    ng += take(j, g + ng, NREQ * 4 - ng);
    int distinct = 0;
    {
        static char seen[NREQ * 4 + 8];
        for (size_t i = 0; i < n; i++)
            if (!evs[i].kind && !seen[evs[i].item]) seen[evs[i].item] = 1, distinct++;
    }
    check_outputs(g, ng, expect, NREQ, distinct);
    mt_joiner_close(j);
    rm_rf(dir);
    free(dir);
}

Test(joiner, idle_advance_moves_the_watermark_with_the_clock) {
    char *dir = temp_dir();
    mt_joiner_config_t c = base_config();
    c.idle_advance_ms = 500;
    fake_now = 1000000;
    mt_joiner_t *j = open_j(dir, &c);
    add_imp(j, "i1", 1, 50000);
    tick(j);
    cr_assert_eq(stats(j).watermark_ms, 49900);
    fake_now += 400; /* not idle long enough */
    tick(j);
    cr_assert_eq(stats(j).watermark_ms, 49900);
    fake_now += 600; /* idle for 1000 ms: 500 of them count */
    tick(j);
    cr_assert_eq(stats(j).watermark_ms, 50400);
    fake_now += 700;
    tick(j);
    cr_assert_eq(stats(j).watermark_ms, 51100); /* past 50000 + 1000: closed */
    cr_assert_eq(mt_joiner_outbox_size(j), 1);
    mt_joiner_close(j);
    rm_rf(dir);
    free(dir);
}

/* One partition read far ahead of another closes no window early: the watermark follows
 * the slowest partition, and a partition assigned but silent holds it for idle_advance_ms. */
Test(joiner, watermark_follows_the_slowest_partition) {
    char *dir = temp_dir();
    mt_joiner_config_t c = base_config();
    c.idle_advance_ms = 1000;
    fake_now = 5000000;
    mt_joiner_t *j = open_j(dir, &c);
    mt_joiner_set_partitions(j, 2);
    size_t len;
    uint8_t *b = impression("s1", 1, 10000, 1, &len);
    cr_assert_eq(mt_joiner_add(j, MT_JOINER_IMPRESSIONS, "f", 0, 0, b, len, NULL, NULL, 0), MT_OK);
    free(b);
    b = impression("s2", 1, 90000, 1, &len); /* partition 0 runs ahead */
    cr_assert_eq(mt_joiner_add(j, MT_JOINER_IMPRESSIONS, "f", 0, 1, b, len, NULL, NULL, 0), MT_OK);
    free(b);
    tick(j);
    cr_assert_eq(stats(j).watermark_ms, INT64_MIN, "partition 1 has not spoken yet");
    b = action("s1", 1, 10500, &len); /* partition 1 is behind */
    cr_assert_eq(mt_joiner_add(j, MT_JOINER_ACTIONS, "a", 0, 0, b, len, NULL, NULL, 0), MT_OK);
    free(b);
    tick(j);
    cr_assert_eq(stats(j).watermark_ms, 10400);
    cr_assert_eq(stats(j).positives, 1);
    fake_now += 1500; /* partition 1 idle: partition 0 alone counts */
    b = impression("s3", 1, 90001, 1, &len);
    cr_assert_eq(mt_joiner_add(j, MT_JOINER_IMPRESSIONS, "f", 0, 2, b, len, NULL, NULL, 0), MT_OK);
    free(b);
    tick(j);
    cr_assert_eq(stats(j).watermark_ms, 89901);
    mt_joiner_close(j);
    /* positions and partition event times survive a restart */
    j = open_j(dir, &c);
    b = impression("s3", 1, 90001, 1, &len);
    mt_joiner_outcome_t oc;
    cr_assert_eq(mt_joiner_add(j, MT_JOINER_IMPRESSIONS, "f", 0, 2, b, len, &oc, NULL, 0), MT_OK);
    free(b);
    cr_assert_eq(oc, MT_JOINER_REPLAYED);
    cr_assert_eq(stats(j).watermark_ms, 89901);
    mt_joiner_close(j);
    rm_rf(dir);
    free(dir);
}
