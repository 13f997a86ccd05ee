/*
 * test_tasks.c - the joiner's per-task labels (joiner.task_actions): with "click, conversion"
 * an impression stays open until both actions came (closed early) or its window ends (the
 * labels seen so far), early actions per task, negative sampling of all-0 examples only,
 * the labels across a restart (and a state refused under another task list), actions of
 * no task ignored, and the config key's parsing (names agreeing with the joiner's).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "monolith/v1/example.pb-c.h"
#include "mt/config.h"
#include "mt/joiner.h"

#define CLICK      MONOLITH__V1__ACTION_TYPE__ACTION_CLICK
#define CONVERSION MONOLITH__V1__ACTION_TYPE__ACTION_CONVERSION
#define FID(s, v)  (((uint64_t)(s) << 48) | (uint64_t)(v))

/* ---------------- helpers ---------------- */

static int64_t fake_clock(void *opaque) {
    (void)opaque;
    return 0;
}

static char *temp_dir(void) {
    char *d = strdup("/tmp/test_joiner_tasks_XXXXXX");
    cr_assert_not_null(mkdtemp(d));
    return d;
}

static void rm_rf(char *d) {
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d);
    cr_assert_eq(system(cmd), 0);
    free(d);
}

/* window 1000 ms, lateness 100 ms, no idle advance; tasks click, conversion. */
static mt_joiner_config_t two_tasks(void) {
    mt_joiner_config_t c;
    mt_joiner_config_init(&c);
    c.window_ms = 1000;
    c.allowed_lateness_ms = 100;
    c.idle_advance_ms = 0;
    c.sync = 0;
    c.ntasks = 2;
    c.task_actions[0] = CLICK;
    c.task_actions[1] = CONVERSION;
    return c;
}

static mt_joiner_t *open_j(const char *dir, const mt_joiner_config_t *c) {
    mt_joiner_t *j = NULL;
    char err[256] = "";
    cr_assert_eq(mt_joiner_open(dir, c, fake_clock, NULL, &j, err, sizeof(err)), MT_OK, "%s", err);
    return j;
}

/* Applies an impression (item slot 2 = item) at @p offset of topic "f" (< 0: no position). */
static mt_joiner_outcome_t imp(mt_joiner_t *j, const char *rid, uint64_t item, int64_t ts,
                               int64_t offset) {
    Monolith__V1__Impression im = MONOLITH__V1__IMPRESSION__INIT;
    Monolith__V1__SlotFids u = MONOLITH__V1__SLOT_FIDS__INIT, i = MONOLITH__V1__SLOT_FIDS__INIT;
    uint64_t fu = FID(1, 7), fi = FID(2, item);
    u.slot = 1, u.n_fids = 1, u.fids = &fu;
    i.slot = 2, i.n_fids = 1, i.fids = &fi;
    Monolith__V1__SlotFids *us[] = {&u}, *is[] = {&i};
    im.request_id = (char *)rid;
    im.timestamp_ms = ts;
    im.item_id = item;
    im.n_user = 1, im.user = us;
    im.n_item = 1, im.item = is;
    uint8_t b[256];
    size_t len = monolith__v1__impression__pack(&im, b);
    mt_joiner_outcome_t oc;
    cr_assert_eq(mt_joiner_add(j, MT_JOINER_IMPRESSIONS, offset >= 0 ? "f" : NULL, 0, offset, b,
                               len, &oc, NULL, 0),
                 MT_OK);
    return oc;
}

/* Applies an action of @p type at @p offset of topic "a" (< 0: no position). */
static mt_joiner_outcome_t act(mt_joiner_t *j, const char *rid, uint64_t item, int64_t ts, int type,
                               int64_t offset) {
    Monolith__V1__Action a = MONOLITH__V1__ACTION__INIT;
    a.request_id = (char *)rid;
    a.timestamp_ms = ts;
    a.type = (Monolith__V1__ActionType)type;
    a.item_id = item;
    uint8_t b[128];
    size_t len = monolith__v1__action__pack(&a, b);
    mt_joiner_outcome_t oc;
    cr_assert_eq(mt_joiner_add(j, MT_JOINER_ACTIONS, offset >= 0 ? "a" : NULL, 0, offset, b, len,
                               &oc, NULL, 0),
                 MT_OK);
    return oc;
}

static mt_joiner_stats_t stats(mt_joiner_t *j) {
    mt_joiner_stats_t s;
    mt_joiner_stats(j, &s);
    return s;
}

/* One example of the outbox as read back from its protobuf. */
typedef struct got {
    char rid[32];
    uint64_t item;
    size_t nlabels;
    float labels[4];
    float rate;
} got_t;

/* Takes the outbox (checking each example's label fields against its labels), emptying it. */
static size_t take(mt_joiner_t *j, got_t *out, size_t cap) {
    size_t n = mt_joiner_outbox_size(j);
    cr_assert(n <= cap, "%zu examples", n);
    for (size_t i = 0; i < n; i++) {
        const mt_joiner_example_t *x = mt_joiner_outbox_get(j, i);
        Monolith__V1__Example *ex = monolith__v1__example__unpack(NULL, x->len, x->value);
        cr_assert_not_null(ex);
        cr_assert_leq(ex->n_labels, 4);
        snprintf(out[i].rid, sizeof(out[i].rid), "%s", ex->request_id);
        out[i].item = 0;
        for (size_t s = 0; s < ex->n_slots; s++)
            if (ex->slots[s]->slot == 2) out[i].item = ex->slots[s]->fids[0] & 0xffffffffffffull;
        out[i].nlabels = ex->n_labels;
        uint32_t bits = 0;
        for (size_t t = 0; t < ex->n_labels; t++) {
            out[i].labels[t] = ex->labels[t];
            bits |= (ex->labels[t] == 1.0f ? 1u : 0u) << t;
        }
        cr_assert_eq(x->labels, bits, "labels 0x%x, example's 0x%x", x->labels, bits);
        cr_assert_eq(x->label, bits != 0);
        out[i].rate = ex->sample_rate;
        monolith__v1__example__free_unpacked(ex, NULL);
    }
    cr_assert_eq(mt_joiner_outbox_done(j, n), MT_OK);
    return n;
}

static void expect_labels(const got_t *g, float l0, float l1) {
    cr_assert_eq(g->nlabels, 2, "%s: %zu labels", g->rid, g->nlabels);
    cr_assert(g->labels[0] == l0 && g->labels[1] == l1, "%s: labels [%g, %g], expected [%g, %g]",
              g->rid, g->labels[0], g->labels[1], l0, l1);
}

/* Moves event time (and so the watermark, 100 ms behind) to @p ts with an unrelated
 * impression, and closes what it passed. */
static void advance_to(mt_joiner_t *j, int64_t ts) {
    char rid[32];
    snprintf(rid, sizeof(rid), "clock-%lld", (long long)ts);
    imp(j, rid, 999, ts, -1);
    cr_assert_eq(mt_joiner_tick(j, NULL), MT_OK);
}

/* ---------------- the join ---------------- */

/* Click then conversion within the window: one example [1, 1], emitted at the conversion
 * (closed early), not at the click; with or without the memory cache. */
Test(tasks, click_then_conversion_closes_early_with_both_labels) {
    for (int mem = 0; mem < 2; mem++) {
        char *dir = temp_dir();
        mt_joiner_config_t c = two_tasks();
        c.max_pending_memory = mem ? 1000 : 0;
        mt_joiner_t *j = open_j(dir, &c);
        cr_assert_eq(imp(j, "r1", 11, 10000, -1), MT_JOINER_PENDING);
        cr_assert_eq(act(j, "r1", 11, 10100, CLICK, -1), MT_JOINER_LABELLED);
        cr_assert_eq(mt_joiner_outbox_size(j), 0, "closed at the click");
        cr_assert_eq(act(j, "r1", 11, 10150, CLICK, -1), MT_JOINER_DUPLICATE);
        cr_assert_eq(act(j, "r1", 11, 10500, CONVERSION, -1), MT_JOINER_JOINED);
        got_t g[4];
        cr_assert_eq(take(j, g, 4), 1);
        cr_assert_str_eq(g[0].rid, "r1");
        expect_labels(&g[0], 1, 1);
        cr_assert_eq(g[0].rate, 1.0f);
        /* closed: repeats of either action are duplicates; the window's end adds nothing */
        cr_assert_eq(act(j, "r1", 11, 10600, CONVERSION, -1), MT_JOINER_DUPLICATE);
        cr_assert_eq(act(j, "r1", 11, 10600, CLICK, -1), MT_JOINER_DUPLICATE);
        advance_to(j, 20000);
        cr_assert_eq(mt_joiner_outbox_size(j), 0);
        mt_joiner_stats_t s = stats(j);
        cr_assert_eq(s.closed_early, 1);
        cr_assert_eq(s.positives, 1);
        cr_assert_eq(s.task_positives[0], 1);
        cr_assert_eq(s.task_positives[1], 1);
        cr_assert_eq(s.duplicate_actions, 3);
        cr_assert_eq(s.pending, 1); /* the clock impression */
        mt_joiner_close(j);
        rm_rf(dir);
    }
}

/* A conversion alone: [0, 1] when the window ends, kept whatever the negative rate. */
Test(tasks, conversion_only_is_labelled_at_window_end) {
    char *dir = temp_dir();
    mt_joiner_config_t c = two_tasks();
    c.negative_rate = 1e-6; /* every all-0 example sampled out */
    mt_joiner_t *j = open_j(dir, &c);
    cr_assert_eq(imp(j, "r2", 12, 10000, -1), MT_JOINER_PENDING);
    cr_assert_eq(act(j, "r2", 12, 10900, CONVERSION, -1), MT_JOINER_LABELLED);
    advance_to(j, 11100); /* watermark 11000: not past 10000 + 1000 */
    cr_assert_eq(mt_joiner_outbox_size(j), 0);
    advance_to(j, 11101);
    got_t g[4];
    cr_assert_eq(take(j, g, 4), 1);
    expect_labels(&g[0], 0, 1);
    cr_assert_eq(g[0].rate, 1.0f, "a positive carries sample_rate 1");
    /* a click after the window closed is late; the conversion again a duplicate */
    cr_assert_eq(act(j, "r2", 12, 10950, CLICK, -1), MT_JOINER_LATE_ACTION);
    cr_assert_eq(act(j, "r2", 12, 10950, CONVERSION, -1), MT_JOINER_DUPLICATE);
    mt_joiner_stats_t s = stats(j);
    cr_assert_eq(s.positives, 1);
    cr_assert_eq(s.closed_early, 0);
    cr_assert_eq(s.task_positives[0], 0);
    cr_assert_eq(s.task_positives[1], 1);
    cr_assert_eq(mt_joiner_drain(j, NULL), MT_OK);
    cr_assert_eq(mt_joiner_outbox_size(j), 0);
    cr_assert_eq(stats(j).sampled_out, 2); /* the clock impressions */
    mt_joiner_close(j);
    rm_rf(dir);
}

/* A click alone: [1, 0] at the window's end, not at the click. */
Test(tasks, click_only_is_labelled_at_window_end_not_at_the_click) {
    char *dir = temp_dir();
    mt_joiner_config_t c = two_tasks();
    mt_joiner_t *j = open_j(dir, &c);
    cr_assert_eq(imp(j, "r3", 13, 10000, -1), MT_JOINER_PENDING);
    cr_assert_eq(act(j, "r3", 0, 10200, CLICK, -1), MT_JOINER_LABELLED); /* item 0: its only one */
    cr_assert_eq(mt_joiner_outbox_size(j), 0);
    advance_to(j, 11000);
    cr_assert_eq(mt_joiner_outbox_size(j), 0);
    cr_assert_eq(stats(j).pending, 2);
    advance_to(j, 11101);
    got_t g[4];
    cr_assert_eq(take(j, g, 4), 1);
    cr_assert_str_eq(g[0].rid, "r3");
    expect_labels(&g[0], 1, 0);
    cr_assert_eq(g[0].rate, 1.0f);
    mt_joiner_stats_t s = stats(j);
    cr_assert_eq(s.task_positives[0], 1);
    cr_assert_eq(s.task_positives[1], 0);
    cr_assert_eq(s.closed_early, 0);
    mt_joiner_close(j);
    rm_rf(dir);
}

/* Nothing: [0, 0], sampled as negatives are with one task (same keys kept, same rate). */
Test(tasks, nothing_is_a_negative_sampled_as_with_one_task) {
    char *d1 = temp_dir(), *d2 = temp_dir();
    mt_joiner_config_t c2 = two_tasks(), c1;
    c2.negative_rate = 0.3;
    mt_joiner_config_init(&c1);
    c1.window_ms = c2.window_ms;
    c1.allowed_lateness_ms = c2.allowed_lateness_ms;
    c1.idle_advance_ms = 0;
    c1.sync = 0;
    c1.negative_rate = 0.3;
    mt_joiner_t *a = open_j(d1, &c2), *b = open_j(d2, &c1);
    enum { N = 3000 };
    for (int i = 0; i < N; i++) {
        char rid[16];
        snprintf(rid, sizeof(rid), "n%d", i);
        imp(a, rid, 1, 1000, -1);
        imp(b, rid, 1, 1000, -1);
    }
    cr_assert_eq(mt_joiner_drain(a, NULL), MT_OK);
    cr_assert_eq(mt_joiner_drain(b, NULL), MT_OK);
    static got_t ga[N], gb[N];
    size_t na = take(a, ga, N), nb = take(b, gb, N);
    cr_assert_eq(na, nb);
    cr_assert(na > 750 && na < 1050, "%zu kept", na);
    for (size_t i = 0; i < na; i++) {
        cr_assert_str_eq(ga[i].rid, gb[i].rid);
        expect_labels(&ga[i], 0, 0);
        cr_assert_eq(gb[i].nlabels, 1);
        cr_assert_float_eq(ga[i].rate, 0.3f, 1e-6);
    }
    mt_joiner_stats_t s = stats(a);
    cr_assert_eq(s.negatives, na);
    cr_assert_eq(s.negatives + s.sampled_out, N);
    mt_joiner_close(a);
    mt_joiner_close(b);
    rm_rf(d1);
    rm_rf(d2);
}

/* Actions before their impression, per task: a conversion waits and labels its impression
 * when it comes (which then waits for the click); both waiting close it at once; an early
 * action outside the impression's window stays out of it. */
Test(tasks, early_actions_count_per_task) {
    char *dir = temp_dir();
    mt_joiner_config_t c = two_tasks();
    mt_joiner_t *j = open_j(dir, &c);
    /* a conversion before its impression */
    cr_assert_eq(act(j, "e1", 5, 10300, CONVERSION, -1), MT_JOINER_EARLY);
    cr_assert_eq(act(j, "e1", 5, 10310, CONVERSION, -1), MT_JOINER_DUPLICATE);
    cr_assert_eq(imp(j, "e1", 5, 10000, -1), MT_JOINER_PENDING);
    cr_assert_eq(mt_joiner_outbox_size(j), 0);
    cr_assert_eq(stats(j).early_pending, 0);
    cr_assert_eq(act(j, "e1", 5, 10400, CLICK, -1), MT_JOINER_JOINED);
    got_t g[8];
    cr_assert_eq(take(j, g, 8), 1);
    expect_labels(&g[0], 1, 1);
    /* both before the impression (click of the item, conversion of the request: item 0) */
    cr_assert_eq(act(j, "e2", 6, 10500, CLICK, -1), MT_JOINER_EARLY);
    cr_assert_eq(act(j, "e2", 0, 10700, CONVERSION, -1), MT_JOINER_EARLY);
    cr_assert_eq(imp(j, "e2", 6, 10000, -1), MT_JOINER_JOINED);
    cr_assert_eq(take(j, g, 8), 1);
    expect_labels(&g[0], 1, 1);
    /* one record, two tasks: the click in this impression's window, the conversion not */
    cr_assert_eq(act(j, "e3", 7, 10900, CLICK, -1), MT_JOINER_EARLY);
    cr_assert_eq(act(j, "e3", 7, 11600, CONVERSION, -1), MT_JOINER_EARLY);
    cr_assert_eq(act(j, "e3", 7, 11700, CLICK, -1), MT_JOINER_DUPLICATE);
    cr_assert_eq(imp(j, "e3", 7, 10500, -1), MT_JOINER_PENDING); /* window ends at 11500 */
    mt_joiner_stats_t s = stats(j);
    cr_assert_eq(s.early_actions, 5);
    cr_assert_eq(s.early_joined, 4);
    cr_assert_eq(s.early_pending, 1, "the conversion still waits");
    advance_to(j, 11700); /* closes e3: 11500 < watermark 11600 */
    cr_assert_eq(take(j, g, 8), 1);
    cr_assert_str_eq(g[0].rid, "e3");
    expect_labels(&g[0], 1, 0);
    advance_to(j, 12800); /* the conversion expires at 11600 + 1000 */
    s = stats(j);
    cr_assert_eq(s.early_expired, 1);
    cr_assert_eq(s.early_pending, 0);
    cr_assert_eq(s.task_positives[0], 3);
    cr_assert_eq(s.task_positives[1], 2);
    mt_joiner_close(j);
    rm_rf(dir);
}

/* A restart between the click and the conversion keeps the click: [1, 1], one example. The
 * state is refused under another task list. */
Test(tasks, restart_between_click_and_conversion_keeps_the_click) {
    char *dir = temp_dir();
    mt_joiner_config_t c = two_tasks();
    mt_joiner_t *j = open_j(dir, &c);
    cr_assert_eq(imp(j, "s1", 21, 10000, 0), MT_JOINER_PENDING);
    cr_assert_eq(imp(j, "s2", 22, 10000, 1), MT_JOINER_PENDING);
    cr_assert_eq(act(j, "s1", 21, 10100, CLICK, 0), MT_JOINER_LABELLED);
    cr_assert_eq(act(j, "s2", 22, 10100, CONVERSION, 1), MT_JOINER_LABELLED);
    cr_assert_eq(act(j, "e9", 29, 10100, CONVERSION, 2), MT_JOINER_EARLY);
    mt_joiner_close(j);

    /* another list: refused, naming the key, the state untouched */
    mt_joiner_config_t one = c, swapped = c;
    one.ntasks = 1;
    swapped.task_actions[0] = CONVERSION;
    swapped.task_actions[1] = CLICK;
    const mt_joiner_config_t *other[] = {&one, &swapped};
    for (int i = 0; i < 2; i++) {
        char err[512] = "";
        mt_joiner_t *x = NULL;
        cr_assert_eq(mt_joiner_open(dir, other[i], fake_clock, NULL, &x, err, sizeof(err)),
                     MT_MISMATCH);
        cr_assert_null(x);
        cr_assert(strstr(err, "task_actions") && strstr(err, "click, conversion"), "%s", err);
    }

    j = open_j(dir, &c);
    cr_assert_eq(stats(j).pending, 2);
    /* Kafka redelivers from before the close: known by offset */
    cr_assert_eq(act(j, "s1", 21, 10100, CLICK, 0), MT_JOINER_REPLAYED);
    cr_assert_eq(act(j, "s1", 21, 10150, CLICK, 3), MT_JOINER_DUPLICATE);
    cr_assert_eq(act(j, "s1", 21, 10600, CONVERSION, 4), MT_JOINER_JOINED);
    cr_assert_eq(act(j, "s2", 22, 10600, CLICK, 5), MT_JOINER_JOINED);
    cr_assert_eq(imp(j, "e9", 29, 10000, 2), MT_JOINER_PENDING);
    cr_assert_eq(act(j, "e9", 29, 10200, CLICK, 6), MT_JOINER_JOINED);
    got_t g[8];
    cr_assert_eq(take(j, g, 8), 3);
    for (int i = 0; i < 3; i++)
        expect_labels(&g[i], 1, 1);
    cr_assert_eq(mt_joiner_drain(j, NULL), MT_OK);
    cr_assert_eq(mt_joiner_outbox_size(j), 0);
    mt_joiner_close(j);
    rm_rf(dir);
}

/* The undelivered examples keep their labels across a restart. */
Test(tasks, outbox_keeps_the_labels_across_a_restart) {
    char *dir = temp_dir();
    mt_joiner_config_t c = two_tasks();
    mt_joiner_t *j = open_j(dir, &c);
    imp(j, "o1", 1, 10000, -1);
    imp(j, "o2", 2, 10000, -1);
    act(j, "o2", 2, 10100, CONVERSION, -1);
    cr_assert_eq(mt_joiner_drain(j, NULL), MT_OK);
    mt_joiner_close(j);
    j = open_j(dir, &c);
    got_t g[4];
    cr_assert_eq(take(j, g, 4), 2);
    for (int i = 0; i < 2; i++)
        expect_labels(&g[i], 0, strcmp(g[i].rid, "o2") == 0 ? 1 : 0);
    mt_joiner_close(j);
    rm_rf(dir);
}

/* The default (one task, the click): an unspecified type is the click, a conversion is in
 * no task (ignored, counted); the state is refused by a joiner of two tasks. */
Test(tasks, default_is_the_click_alone) {
    char *dir = temp_dir();
    mt_joiner_config_t c;
    mt_joiner_config_init(&c);
    cr_assert_eq(c.ntasks, 1);
    cr_assert_eq(c.task_actions[0], CLICK);
    c.window_ms = 1000;
    c.idle_advance_ms = 0;
    c.sync = 0;
    mt_joiner_t *j = open_j(dir, &c);
    imp(j, "d1", 1, 10000, -1);
    imp(j, "d2", 2, 10000, -1);
    cr_assert_eq(act(j, "d1", 1, 10100, CONVERSION, -1), MT_JOINER_IGNORED);
    cr_assert_eq(act(j, "d2", 2, 10100, 0, -1), MT_JOINER_JOINED);
    cr_assert_eq(act(j, "d1", 1, 10200, 7, -1), MT_JOINER_IGNORED); /* an unknown type */
    cr_assert_eq(mt_joiner_drain(j, NULL), MT_OK);
    got_t g[4];
    cr_assert_eq(take(j, g, 4), 2);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(g[i].nlabels, 1);
        cr_assert_eq(g[i].labels[0], strcmp(g[i].rid, "d2") == 0 ? 1.0f : 0.0f);
    }
    mt_joiner_stats_t s = stats(j);
    cr_assert_eq(s.no_task_actions, 2);
    cr_assert_eq(s.actions, 3);
    cr_assert_eq(s.positives, 1);
    mt_joiner_close(j);
    mt_joiner_config_t c2 = two_tasks();
    mt_joiner_t *x = NULL;
    char err[512] = "";
    cr_assert_eq(mt_joiner_open(dir, &c2, fake_clock, NULL, &x, err, sizeof(err)), MT_MISMATCH);
    cr_assert(strstr(err, "\"click\""), "%s", err);
    rm_rf(dir);
}

/* ---------------- configuration ---------------- */

Test(tasks, bad_task_lists_are_refused) {
    mt_joiner_config_t c = two_tasks();
    char err[256];
    cr_assert_eq(mt_joiner_config_validate(&c, err, sizeof(err)), MT_OK);
    c.task_actions[1] = CLICK;
    cr_assert_eq(mt_joiner_config_validate(&c, err, sizeof(err)), MT_CONFIG);
    cr_assert(strstr(err, "task_actions"), "%s", err);
    c = two_tasks();
    c.task_actions[1] = 0;
    cr_assert_eq(mt_joiner_config_validate(&c, err, sizeof(err)), MT_CONFIG);
    c = two_tasks();
    c.ntasks = 0;
    cr_assert_eq(mt_joiner_config_validate(&c, err, sizeof(err)), MT_CONFIG);
    c.ntasks = MT_JOINER_MAX_TASKS + 1;
    cr_assert_eq(mt_joiner_config_validate(&c, err, sizeof(err)), MT_CONFIG);
}

/* joiner.task_actions: names (any case) to types that the joiner names alike; bad lists
 * refused by mt_config_validate() naming the key. */
Test(tasks, config_key_parses_and_refuses) {
    mt_config_t cfg;
    cr_assert_eq(mt_config_init(&cfg), MT_OK);
    uint32_t types[MT_CONFIG_MAX_TASK_ACTIONS];
    size_t n = 0;
    char err[512] = "";
    cr_assert_str_eq(cfg.joiner.task_actions, "click");
    cr_assert_eq(mt_config_joiner_task_actions(&cfg, types, &n, err, sizeof(err)), MT_OK, "%s",
                 err);
    cr_assert(n == 1 && types[0] == CLICK);
    cr_assert_eq(
        mt_config_set(&cfg, "joiner.task_actions", " Click ,CONVERSION ", err, sizeof(err)), MT_OK,
        "%s", err);
    cr_assert_eq(mt_config_joiner_task_actions(&cfg, types, &n, err, sizeof(err)), MT_OK, "%s",
                 err);
    cr_assert(n == 2 && types[0] == CLICK && types[1] == CONVERSION);
    cr_assert_str_eq(mt_joiner_action_name(types[0]), "click");
    cr_assert_str_eq(mt_joiner_action_name(types[1]), "conversion");
    cr_assert_null(mt_joiner_action_name(0));
    const char *bad[] = {"click, buy",
                         "click, click",
                         "click,,conversion",
                         "click,",
                         "conversion, click, conversion",
                         "click, conversion, click, conversion, click"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_assert_eq(mt_config_set(&cfg, "joiner.task_actions", bad[i], err, sizeof(err)), MT_OK);
        err[0] = 0;
        cr_assert_eq(mt_config_joiner_task_actions(&cfg, types, &n, err, sizeof(err)), MT_CONFIG,
                     "%s accepted", bad[i]);
        cr_assert(strstr(err, "joiner.task_actions"), "%s", err);
        err[0] = 0;
        cr_assert_eq(mt_config_validate(&cfg, err, sizeof(err)), MT_CONFIG, "%s", bad[i]);
        cr_assert(strstr(err, "joiner.task_actions"), "%s: %s", bad[i], err);
    }
    cr_assert_neq(mt_config_set(&cfg, "joiner.task_actions", "", err, sizeof(err)), MT_OK);
    cr_assert(strstr(err, "task_actions"), "%s", err);
    mt_config_free(&cfg);
}
