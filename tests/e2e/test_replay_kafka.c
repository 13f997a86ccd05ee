/*
 * test_replay_kafka.c - `monolith replay` end to end on monolith-kafka-dev (default topics:
 * features:8, actions:8):
 *   - trivago (when ../shared/data is there) as fast as possible: every impression and
 *     action arrives (offsets from 0 without holes: nothing fell out of the mock's
 *     per-partition retention), counts equal the CLI's summary and kcat's (an independent
 *     client), keys are request ids, event time never goes back within a partition, each
 *     action names a shown (request, item) and comes action_delay after it;
 *   - the generator at 20x real time: paced (wall time >= event span / 20), same checks;
 *   - bad usage exits 2, an unreadable dataset 1.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "monolith/v1/example.pb-c.h"
#include "mt/kafka.h"
#include "testutil_data.h"

#if !defined(MT_KAFKA_DEV_BIN) || !defined(MT_CLI_BIN) || !defined(MT_KCAT_BIN)
#error "MT_KAFKA_DEV_BIN, MT_CLI_BIN and MT_KCAT_BIN must be defined"
#endif
#define TRIVAGO_SAMPLE_REL "trivago-recsys2019-sample/trivago_val_100k.csv.gz"

static char root[128];
static pid_t daemon_pid = -1;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void cleanup(void) {
    if (daemon_pid > 0) {
        kill(daemon_pid, SIGTERM);
        waitpid(daemon_pid, NULL, 0);
        daemon_pid = -1;
    }
    if (*root) {
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
        int rc = system(cmd);
        (void)rc;
    }
}

static void setup(void) {
    snprintf(root, sizeof(root), "/tmp/mt-replay-e2e-XXXXXX");
    cr_assert_not_null(mkdtemp(root));
}

static int read_line(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int ok = fgets(buf, (int)cap, f) != NULL;
    fclose(f);
    if (!ok) return -1;
    buf[strcspn(buf, "\n")] = '\0';
    return 0;
}

static void start_kafka(char *bootstrap, size_t cap) {
    char bsf[256];
    snprintf(bsf, sizeof(bsf), "%s/bootstrap", root);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (!freopen("/dev/null", "w", stdout)) _exit(126);
        execl(MT_KAFKA_DEV_BIN, MT_KAFKA_DEV_BIN, "--bootstrap-file", bsf, (char *)NULL);
        _exit(127);
    }
    daemon_pid = pid;
    double deadline = now_s() + 20;
    while (read_line(bsf, bootstrap, cap) != 0) {
        cr_assert_eq(waitpid(pid, NULL, WNOHANG), 0, "monolith-kafka-dev exited early");
        cr_assert_lt(now_s(), deadline, "no bootstrap file after 20 s");
        usleep(20000);
    }
}

/* Runs argv with stdout to out_path; returns the exit status (-1 if killed). */
static int run(char *const argv[], const char *out_path) {
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (out_path && !freopen(out_path, "w", stdout)) _exit(126);
        execv(argv[0], argv);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A number field of the one-line JSON summary. */
static long long json_num(const char *path, const char *key) {
    char buf[4096], pat[64];
    cr_assert_eq(read_line(path, buf, sizeof(buf)), 0, "no summary in %s", path);
    snprintf(pat, sizeof(pat), "\"%s\":", key);
    const char *p = strstr(buf, pat);
    cr_assert_not_null(p, "no %s in %s", key, buf);
    return strtoll(p + strlen(pat), NULL, 10);
}

/* kcat's count of the messages of a topic (an independent client). */
static long long kcat_count(const char *bs, const char *topic) {
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "%s -b '%s' -C -t %s -e -o beginning -q -f '%%o\\n' | wc -l",
             MT_KCAT_BIN, bs, topic);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    long long n = -1;
    cr_assert_eq(fscanf(p, "%lld", &n), 1);
    pclose(p);
    return n;
}

/* (request id, item) -> impression time; open addressing on a 64-bit hash. */
typedef struct imp_set {
    uint64_t *keys;
    int64_t *ts;
    size_t cap;
} imp_set_t;

static uint64_t key_hash(const char *rid, uint64_t item) {
    uint64_t h = 1469598103934665603ull;
    for (const char *p = rid; *p; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ull;
    h ^= item * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    return h ? h : 1;
}

static int64_t *set_slot(imp_set_t *s, uint64_t h, bool insert) {
    for (size_t i = h & (s->cap - 1);; i = (i + 1) & (s->cap - 1)) {
        if (s->keys[i] == h) return &s->ts[i];
        if (s->keys[i] == 0) {
            if (!insert) return NULL;
            s->keys[i] = h;
            return &s->ts[i];
        }
    }
}

typedef struct part_state {
    int64_t next_offset; /* the offset expected next */
    int64_t last_event_ms;
} part_state_t;

/* Consumes both topics until @p want_imp impressions and @p want_act actions arrived,
 * checking them (see the file comment). */
static void consume_and_check(const char *bs, long long want_imp, long long want_act,
                              int64_t delay_ms) {
    const char *topics[] = {"features", "actions"};
    const char *conf[] = {"session.timeout.ms=6000", NULL};
    mt_kafka_consumer_t *c;
    char err[256];
    cr_assert_eq(
        mt_kafka_consumer_create(bs, "replay-check", topics, 2, conf, &c, err, sizeof(err)), MT_OK,
        "%s", err);
    imp_set_t set = {calloc(1 << 21, 8), calloc(1 << 21, 8), 1 << 21};
    cr_assert(set.keys && set.ts);
    part_state_t parts[2][64];
    for (int t = 0; t < 2; t++)
        for (int p = 0; p < 64; p++)
            parts[t][p] = (part_state_t){0, INT64_MIN};
    /* actions are checked after all impressions are in: keep them */
    size_t nact_cap = (size_t)want_act + 16, nact = 0;
    uint64_t *act_h = malloc(nact_cap * sizeof(uint64_t));
    int64_t *act_ts = malloc(nact_cap * sizeof(int64_t));
    cr_assert(act_h && act_ts);
    long long nimp = 0;
    mt_kafka_msg_t m[512];
    double deadline = now_s() + 90;
    while ((nimp < want_imp || (long long)nact < want_act) && now_s() < deadline) {
        size_t n = mt_kafka_consumer_poll(c, m, 512, 200);
        for (size_t i = 0; i < n; i++) {
            int t = strcmp(m[i].topic, "features") == 0 ? 0 : 1;
            cr_assert_lt(m[i].partition, 64);
            part_state_t *ps = &parts[t][m[i].partition];
            /* a message again: the group rebalanced before a commit (a consumer starved past
             * its session timeout on a busy machine) and its new owner starts over; a gap
             * is what retention would make */
            if (m[i].offset < ps->next_offset) continue;
            cr_assert_eq(m[i].offset, ps->next_offset,
                         "%s/%d: offset %lld, expected %lld (retention dropped messages?)",
                         m[i].topic, m[i].partition, (long long)m[i].offset,
                         (long long)ps->next_offset);
            ps->next_offset++;
            if (t == 0) {
                Monolith__V1__Impression *x =
                    monolith__v1__impression__unpack(NULL, m[i].len, m[i].value);
                cr_assert_not_null(x, "features/%d@%lld: not an Impression", m[i].partition,
                                   (long long)m[i].offset);
                cr_assert_eq(m[i].key_len, strlen(x->request_id));
                cr_assert_eq(memcmp(m[i].key, x->request_id, m[i].key_len), 0);
                cr_assert_geq(x->timestamp_ms, ps->last_event_ms, "features/%d: time went back",
                              m[i].partition);
                ps->last_event_ms = x->timestamp_ms;
                cr_assert_gt(x->n_user, 0);
                cr_assert_gt(x->n_item, 0);
                *set_slot(&set, key_hash(x->request_id, x->item_id), true) = x->timestamp_ms;
                monolith__v1__impression__free_unpacked(x, NULL);
                nimp++;
            } else {
                Monolith__V1__Action *a = monolith__v1__action__unpack(NULL, m[i].len, m[i].value);
                cr_assert_not_null(a, "actions/%d@%lld: not an Action", m[i].partition,
                                   (long long)m[i].offset);
                cr_assert_eq(m[i].key_len, strlen(a->request_id));
                cr_assert_eq(memcmp(m[i].key, a->request_id, m[i].key_len), 0);
                cr_assert_eq(a->type, MONOLITH__V1__ACTION_TYPE__ACTION_CLICK);
                cr_assert_geq(a->timestamp_ms, ps->last_event_ms, "actions/%d: time went back",
                              m[i].partition);
                ps->last_event_ms = a->timestamp_ms;
                cr_assert_lt(nact, nact_cap, "more actions than produced");
                act_h[nact] = key_hash(a->request_id, a->item_id);
                act_ts[nact++] = a->timestamp_ms;
                monolith__v1__action__free_unpacked(a, NULL);
            }
        }
    }
    cr_assert_eq(nimp, want_imp, "impressions consumed");
    cr_assert_eq((long long)nact, want_act, "actions consumed");
    for (size_t i = 0; i < nact; i++) {
        int64_t *ts = set_slot(&set, act_h[i], false);
        cr_assert_not_null(ts, "action %zu names no shown (request, item)", i);
        cr_assert_eq(act_ts[i], *ts + delay_ms);
    }
    /* nothing more arrives (but messages again after a rebalance) */
    size_t more = mt_kafka_consumer_poll(c, m, 512, 1000);
    for (size_t i = 0; i < more; i++) {
        int t = strcmp(m[i].topic, "features") == 0 ? 0 : 1;
        cr_assert_lt(m[i].offset, parts[t][m[i].partition].next_offset, "%s/%d@%lld: more",
                     m[i].topic, m[i].partition, (long long)m[i].offset);
    }
    free(act_h);
    free(act_ts);
    free(set.keys);
    free(set.ts);
    mt_kafka_consumer_destroy(c);
}

TestSuite(replay_e2e, .init = setup, .fini = cleanup, .timeout = 300);

Test(replay_e2e, trivago_as_fast_as_possible) {
    cr_assert(MT_KCAT_BIN[0] && access(MT_KCAT_BIN, X_OK) == 0,
              "kcat not found: install the Debian package kcat (scripts/setup.sh does)");
    char sample[1024];
    mt_test_data_path(sample, sizeof(sample), TRIVAGO_SAMPLE_REL);
    mt_test_need_data(sample);
    char bs[512], out[256];
    start_kafka(bs, sizeof(bs));
    snprintf(out, sizeof(out), "%s/summary.json", root);
    char *argv[] = {MT_CLI_BIN, "replay", "--dataset",
                    "trivago",  "--path", sample,
                    "--kafka",  bs,       "--as-fast-as-possible",
                    NULL};
    double t0 = now_s();
    cr_assert_eq(run(argv, out), 0, "monolith replay failed");
    cr_log_info("trivago replayed in %.2f s", now_s() - t0);
    long long imp = json_num(out, "impressions"), act = json_num(out, "actions");
    cr_assert_gt(imp, 300000);
    cr_assert_eq(act, 13596);
    cr_assert_eq(json_num(out, "delivered"), imp + act);
    cr_assert_eq(json_num(out, "bad_rows"), 0);
    cr_assert_eq(kcat_count(bs, "features"), imp, "kcat sees another number of impressions");
    cr_assert_eq(kcat_count(bs, "actions"), act);
    consume_and_check(bs, imp, act, 5000);
}

Test(replay_e2e, gen_paced) {
    char bs[512], out[256];
    start_kafka(bs, sizeof(bs));
    snprintf(out, sizeof(out), "%s/summary.json", root);
    /* 3,000 impressions at 1,000/s of event time, clicks 1 s later: ~4 s of event time,
     * 2 s of wall time at 2x */
    char *argv[] = {MT_CLI_BIN,         "replay", "--dataset", "gen", "--limit",        "3000",
                    "--seed",           "11",     "--ctr",     "0.2", "--events-per-s", "1000",
                    "--action-delay-s", "1",      "--speed",   "2",   "--kafka",        bs,
                    "--progress-s",     "0.5",    NULL};
    double t0 = now_s();
    cr_assert_eq(run(argv, out), 0, "monolith replay failed");
    double took = now_s() - t0;
    long long imp = json_num(out, "impressions"), act = json_num(out, "actions");
    long long span_ms = json_num(out, "last_event_ms") - json_num(out, "first_event_ms");
    cr_assert_eq(imp, 3000);
    cr_assert_gt(act, 100);
    cr_assert_geq(took, (double)span_ms / 1000.0 / 2 - 0.05, "%.2f s for %lld ms at 2x", took,
                  span_ms);
    cr_assert_eq(kcat_count(bs, "features"), imp);
    cr_assert_eq(kcat_count(bs, "actions"), act);
    consume_and_check(bs, imp, act, 1000);
}

Test(replay_e2e, exit_codes) {
    char *bad_usage[] = {MT_CLI_BIN, "replay", "--dataset", "nope", NULL};
    cr_assert_eq(run(bad_usage, "/dev/null"), 2);
    char *both[] = {
        MT_CLI_BIN, "replay", "--dataset", "gen", "--speed", "2", "--as-fast-as-possible", NULL};
    cr_assert_eq(run(both, "/dev/null"), 2);
    char *missing[] = {MT_CLI_BIN, "replay", "--dataset",
                       "trivago",  "--path", "/nonexistent/trivago.csv.gz",
                       NULL};
    cr_assert_eq(run(missing, "/dev/null"), 1);
    char *help[] = {MT_CLI_BIN, "replay", "--help", NULL};
    cr_assert_eq(run(help, "/dev/null"), 0);
}
