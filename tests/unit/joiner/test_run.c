/*
 * test_run.c - the run of monolith-joiner as a library (mt/joiner_run.h), in process, over
 * librdkafka's mock cluster: the configuration checks; a run that joins impressions and
 * clicks (and skips garbage) into exactly one example per impression on the examples topic,
 * with its report and /metrics; and the commit round's failure row "Kafka down at the end":
 * the run fails with its outbox kept and no offset committed, and the next run delivers that
 * outbox first and skips the re-consumed inputs, so that the examples topic holds each
 * example once. tests/e2e/joiner_e2e.sh runs the daemon (kill -9 mid-stream).
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "monolith/v1/example.pb-c.h"
#include "mt/config.h"
#include "mt/joiner_run.h"
#include "mt/kafka.h"

#define SLOT_USER    1
#define SLOT_ITEM    2
#define FID(slot, v) (((uint64_t)(slot) << 48) | (uint64_t)(v))

typedef struct fixture {
    char dir[64], state[128], report[128];
    mt_kafka_mock_t *mock;
    mt_kafka_producer_t *prod;
    mt_config_t cfg;
} fixture_t;

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void load(mt_config_t *cfg, const char *text) {
    char err[512];
    cr_assert_eq(mt_config_init(cfg), MT_OK);
    cr_assert_eq(mt_config_load_string(cfg, text, "test", err, sizeof(err)), MT_OK, "%s", err);
}

/* A mock cluster with the three topics, a producer on it, and a configuration of the joiner
 * on it: every negative kept, no commit round before the end, the state in a temp dir. */
static void fixture_init(fixture_t *f) {
    memset(f, 0, sizeof(*f));
    snprintf(f->dir, sizeof(f->dir), "/tmp/mt_test_joiner_run_XXXXXX");
    cr_assert_not_null(mkdtemp(f->dir));
    snprintf(f->state, sizeof(f->state), "%s/state", f->dir);
    snprintf(f->report, sizeof(f->report), "%s/report.json", f->dir);
    const mt_kafka_topic_spec_t topics[] = {{"features", 2}, {"actions", 2}, {"examples", 2}};
    char err[512] = "", text[8192];
    cr_assert_eq(mt_kafka_mock_create(1, topics, 3, &f->mock, err, sizeof(err)), MT_OK, "%s", err);
    const char *bootstrap = mt_kafka_mock_bootstrap(f->mock);
    cr_assert_eq(mt_kafka_producer_create(bootstrap, NULL, &f->prod, err, sizeof(err)), MT_OK, "%s",
                 err);
    snprintf(text, sizeof(text),
             "[kafka]\nbootstrap = %s\nsession_timeout_ms = 6000\n"
             "[joiner]\nstate_dir = %s\ngroup = joiner-test\nwindow_s = 60\n"
             "negative_rate = 1\ncommit_interval_ms = 600000\nprogress_interval_ms = 0\n",
             bootstrap, f->state);
    load(&f->cfg, text);
}

static void rm_rf(const char *d) {
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d);
    cr_assert_eq(system(cmd), 0);
}

static void fixture_fini(fixture_t *f) {
    mt_kafka_producer_destroy(f->prod);
    mt_kafka_mock_destroy(f->mock);
    mt_config_free(&f->cfg);
    rm_rf(f->dir);
}

static void produce(fixture_t *f, const char *topic, const char *key, const void *v, size_t len) {
    cr_assert_eq(mt_kafka_produce(f->prod, topic, -1, key, strlen(key), v, len, 1000), MT_OK);
}

/* Impression of request r (one item, r + 1000), and its click when @p click. */
static void request(fixture_t *f, int r, int click, int64_t ts) {
    char rid[32];
    snprintf(rid, sizeof(rid), "req-%d", r);
    uint64_t item = 1000 + (uint64_t)r, fu = FID(SLOT_USER, r % 7), fi = FID(SLOT_ITEM, item);
    Monolith__V1__SlotFids u = MONOLITH__V1__SLOT_FIDS__INIT, i = MONOLITH__V1__SLOT_FIDS__INIT;
    u.slot = SLOT_USER, u.n_fids = 1, u.fids = &fu;
    i.slot = SLOT_ITEM, i.n_fids = 1, i.fids = &fi;
    Monolith__V1__SlotFids *us[] = {&u}, *is[] = {&i};
    Monolith__V1__Impression im = MONOLITH__V1__IMPRESSION__INIT;
    im.request_id = rid;
    im.timestamp_ms = ts;
    im.item_id = item;
    im.n_user = 1, im.user = us;
    im.n_item = 1, im.item = is;
    uint8_t buf[512];
    size_t n = monolith__v1__impression__get_packed_size(&im);
    cr_assert_lt(n, sizeof(buf));
    monolith__v1__impression__pack(&im, buf);
    produce(f, "features", rid, buf, n);
    if (!click) return;
    Monolith__V1__Action a = MONOLITH__V1__ACTION__INIT;
    a.request_id = rid;
    a.timestamp_ms = ts + 5;
    a.type = MONOLITH__V1__ACTION_TYPE__ACTION_CLICK;
    a.item_id = item;
    n = monolith__v1__action__get_packed_size(&a);
    monolith__v1__action__pack(&a, buf);
    produce(f, "actions", rid, buf, n);
}

/* The value of metric @p name (a plain sample line) on the run's /metrics, or -1. */
static double metric(mt_joiner_run_t *r, const char *name) {
    char *body = NULL;
    size_t len = 0;
    cr_assert_eq(mt_joiner_run_render(r, "/metrics", &body, &len), 200);
    char key[128];
    snprintf(key, sizeof(key), "\n%s ", name);
    const char *p = strstr(body, key);
    double v = p ? strtod(p + strlen(key), NULL) : -1;
    free(body);
    return v;
}

/* The stop callback: once the run has consumed `want` messages (or after `limit` seconds:
 * the test then fails on the counts), optionally taking the broker down first. */
typedef struct stopper {
    mt_joiner_run_t *run;
    fixture_t *f;
    double want;
    int broker_down;
    int64_t deadline_ms;
} stopper_t;

static int stop_when_consumed(void *ud) {
    stopper_t *s = ud;
    if (now_ms() < s->deadline_ms && metric(s->run, "monolith_joiner_messages_total") < s->want)
        return 0;
    if (s->broker_down) cr_assert_eq(mt_kafka_mock_broker_set_up(s->f->mock, 1, 0), MT_OK);
    return 1;
}

/* Runs the joiner until it has consumed @p want messages; @returns its exit status. */
static int run_joiner(fixture_t *f, double want, int broker_down, double *replayed) {
    mt_joiner_run_t *r = NULL;
    stopper_t s = {.f = f, .want = want, .broker_down = broker_down};
    s.deadline_ms = now_ms() + 60000;
    mt_joiner_run_config_t rc = {.cfg = &f->cfg,
                                 .report_path = f->report,
                                 .drain = 1,
                                 .stop = stop_when_consumed,
                                 .stop_ud = &s};
    cr_assert_eq(mt_joiner_run_create(&rc, &r), MT_JOINER_EXIT_OK);
    s.run = r;
    char *body = NULL;
    size_t len = 0;
    cr_assert_eq(mt_joiner_run_render(r, "/other", &body, &len), 404);
    int rc_run = mt_joiner_run(r);
    cr_assert_eq(metric(r, "monolith_joiner_messages_total"), want, "consumed %g of %g",
                 metric(r, "monolith_joiner_messages_total"), want);
    if (replayed) *replayed = metric(r, "monolith_joiner_replayed_total");
    mt_joiner_run_destroy(r);
    return rc_run;
}

typedef struct got {
    int n, positives, dup;
    char seen[64];
} got_t;

/* Reads the examples topic to its end (a fresh group: from the start). */
static got_t read_examples(fixture_t *f, int expect) {
    got_t g;
    memset(&g, 0, sizeof(g));
    const char *topics[] = {"examples"};
    const char *conf[] = {"session.timeout.ms=6000", NULL};
    char group[64], err[512] = "";
    snprintf(group, sizeof(group), "reader-%" PRId64, now_ms());
    mt_kafka_consumer_t *c = NULL;
    cr_assert_eq(mt_kafka_consumer_create(mt_kafka_mock_bootstrap(f->mock), group, topics, 1, conf,
                                          &c, err, sizeof(err)),
                 MT_OK, "%s", err);
    mt_kafka_msg_t m[64];
    int64_t deadline = now_ms() + 30000, quiet_until = 0;
    /* until `expect` examples, then 2 s more for any extra (a duplicate) */
    while (now_ms() < deadline && (g.n < expect || now_ms() < quiet_until)) {
        size_t n = mt_kafka_consumer_poll(c, m, 64, 100);
        for (size_t i = 0; i < n; i++) {
            Monolith__V1__Example *x = monolith__v1__example__unpack(NULL, m[i].len, m[i].value);
            cr_assert_not_null(x, "an example that does not parse");
            int r = -1;
            cr_assert_eq(sscanf(x->request_id, "req-%d", &r), 1);
            cr_assert(r >= 0 && r < (int)sizeof(g.seen));
            cr_assert_eq(x->n_labels, 1);
            cr_assert_eq((int)x->labels[0], r % 2 == 0, "request %d labelled %g", r, x->labels[0]);
            g.dup += g.seen[r]++ > 0;
            g.positives += x->labels[0] > 0.5f;
            g.n++;
            monolith__v1__example__free_unpacked(x, NULL);
        }
        if (g.n >= expect && !quiet_until) quiet_until = now_ms() + 2000;
    }
    mt_kafka_consumer_destroy(c);
    return g;
}

static char *slurp(const char *path) {
    FILE *in = fopen(path, "r");
    cr_assert_not_null(in, "%s", path);
    static char buf[8192];
    size_t n = fread(buf, 1, sizeof(buf) - 1, in);
    buf[n] = '\0';
    fclose(in);
    return buf;
}

Test(joiner_run, check) {
    mt_config_t cfg;
    char err[512] = "", tasks[64];
    mt_joiner_config_t jc;
    load(&cfg, "[joiner]\ntask_actions = click, conversion\n");
    cr_assert_eq(mt_joiner_run_check(&cfg, &jc, err, sizeof(err)), MT_OK, "%s", err);
    cr_assert_eq(jc.ntasks, 2);
    mt_joiner_run_tasks(&jc, tasks, sizeof(tasks));
    cr_assert_str_eq(tasks, "click, conversion");
    mt_config_free(&cfg);

    load(&cfg, "[kafka]\nfeatures_topic = same\nactions_topic = same\n");
    cr_assert_eq(mt_joiner_run_check(&cfg, NULL, err, sizeof(err)), MT_CONFIG);
    cr_assert(strstr(err, "kafka.features_topic and actions_topic are equal"), "%s", err);
    mt_joiner_run_t *r = (mt_joiner_run_t *)&cfg; /* set to NULL by a refusal */
    mt_joiner_run_config_t rc = {.cfg = &cfg};
    cr_assert_eq(mt_joiner_run_create(&rc, &r), MT_JOINER_EXIT_CONFIG);
    cr_assert_null(r);
    mt_config_free(&cfg);

    load(&cfg, "[joiner]\ntask_actions = click, click\n");
    cr_assert_eq(mt_joiner_run_check(&cfg, NULL, err, sizeof(err)), MT_CONFIG);
    cr_assert(strstr(err, "task_actions"), "%s", err);
    mt_config_free(&cfg);
}

/* 40 requests, every even one clicked, and 3 garbage actions: 40 examples, 20 positive. */
Test(joiner_run, joins_and_delivers, .timeout = 120) {
    fixture_t f;
    fixture_init(&f);
    int64_t t = now_ms();
    for (int r = 0; r < 40; r++)
        request(&f, r, r % 2 == 0, t + r);
    for (int k = 0; k < 3; k++)
        produce(&f, "actions", "garbage", "\xff\xff\xff", 3);
    cr_assert_eq(mt_kafka_producer_flush(f.prod, 10000), MT_OK);

    cr_assert_eq(run_joiner(&f, 63, 0, NULL), MT_JOINER_EXIT_OK);
    got_t g = read_examples(&f, 40);
    cr_assert_eq(g.n, 40);
    cr_assert_eq(g.positives, 20);
    cr_assert_eq(g.dup, 0);
    const char *rep = slurp(f.report);
    cr_assert(strstr(rep, "\"delivered\": 40,"), "%s", rep);
    cr_assert(strstr(rep, "\"positives\": 20,"), "%s", rep);
    cr_assert(strstr(rep, "\"bad_messages\": 3,"), "%s", rep);
    cr_assert(strstr(rep, "\"outbox_recovered\": 0,"), "%s", rep);
    fixture_fini(&f);
}

/* The broker goes down before the last commit round: the run fails, its outbox (10
 * examples) kept and no offset committed. The next run delivers the outbox first, then
 * re-consumes the 15 inputs and skips each (applied before): the topic holds 10 examples. */
Test(joiner_run, kafka_down_keeps_outbox, .timeout = 180) {
    fixture_t f;
    fixture_init(&f);
    int64_t t = now_ms();
    for (int r = 0; r < 10; r++)
        request(&f, r, r % 2 == 0, t + r);
    cr_assert_eq(mt_kafka_producer_flush(f.prod, 10000), MT_OK);

    cr_assert_eq(run_joiner(&f, 15, 1, NULL), MT_JOINER_EXIT_FAILED);
    cr_assert_eq(mt_kafka_mock_broker_set_up(f.mock, 1, 1), MT_OK);
    double replayed = -1;
    cr_assert_eq(run_joiner(&f, 15, 0, &replayed), MT_JOINER_EXIT_OK);
    cr_assert_eq(replayed, 15);
    got_t g = read_examples(&f, 10);
    cr_assert_eq(g.n, 10);
    cr_assert_eq(g.positives, 5);
    cr_assert_eq(g.dup, 0);
    const char *rep = slurp(f.report);
    cr_assert(strstr(rep, "\"delivered\": 10,"), "%s", rep);
    cr_assert(strstr(rep, "\"outbox_recovered\": 10,"), "%s", rep);
    fixture_fini(&f);
}

/* A hang guard for runs that must end by themselves: fires after 60 s and says so. */
static int guard(void *ud) {
    int64_t *deadline_ms = ud;
    if (now_ms() < *deadline_ms) return 0;
    *deadline_ms = 0;
    return 1;
}

/* until_caught_up ends a run by itself once its partitions are read to their ends: 30
 * requests, then (the second run, from the committed offsets) 10 more, ten minutes of event
 * time later (the first run's drain closed every window: older events would be late); each
 * run consumes exactly what is new and the topic holds every example once. */
Test(joiner_run, until_caught_up, .timeout = 180) {
    fixture_t f;
    fixture_init(&f);
    int64_t t = now_ms();
    int first = 0;
    for (int round = 0; round < 2; round++) {
        int n = round == 0 ? 30 : 10;
        for (int r = first; r < first + n; r++)
            request(&f, r, r % 2 == 0, t + round * 600000 + r);
        cr_assert_eq(mt_kafka_producer_flush(f.prod, 10000), MT_OK);
        first += n;
        int64_t deadline_ms = now_ms() + 60000;
        mt_joiner_run_config_t rc = {.cfg = &f.cfg,
                                     .report_path = f.report,
                                     .drain = 1,
                                     .until_caught_up = 1,
                                     .stop = guard,
                                     .stop_ud = &deadline_ms};
        mt_joiner_run_t *r = NULL;
        cr_assert_eq(mt_joiner_run_create(&rc, &r), MT_JOINER_EXIT_OK);
        cr_assert_eq(mt_joiner_run(r), MT_JOINER_EXIT_OK);
        cr_assert_neq(deadline_ms, 0, "round %d: the run did not end by itself in 60 s", round);
        /* every new request: an impression, and an action for the even ones */
        double want = n + (n + 1) / 2;
        cr_assert_eq(metric(r, "monolith_joiner_messages_total"), want, "round %d: %g of %g", round,
                     metric(r, "monolith_joiner_messages_total"), want);
        const char *rep = slurp(f.report);
        cr_assert(strstr(rep, "\"late_impressions\": 0,"), "round %d: %s", round, rep);
        cr_assert(strstr(rep, "\"late_actions\": 0,"), "round %d: %s", round, rep);
        cr_assert(strstr(rep, "\"pending\": 0,"), "round %d: %s", round, rep);
        mt_joiner_run_destroy(r);
    }
    got_t g = read_examples(&f, 40);
    cr_assert_eq(g.n, 40);
    cr_assert_eq(g.positives, 20);
    cr_assert_eq(g.dup, 0);
    fixture_fini(&f);
}
