/*
 * test_loadgen.c - the closed loop's users as a library (mt/loadgen.h), in process: the exact
 * AUC against a brute-force count over every pair (ties half); the flags (defaults, targets,
 * refusals); and a run against two fake serving targets on loopback, an oracle that scores
 * each candidate with the generator's own true probability and one that scores at random,
 * as four targets: the oracle as the primary and again as a shadow, the random one, and one
 * that never appears. Both oracles' AUC must equal the truth's in every window (the same
 * pages, the same clicks), the random one's must not, and the absent one counts no window. The loop with real serving nodes: tests/e2e (loop_sync, loop_models).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "monolith/v1/serving.pb-c.h"
#include "mt/gen.h"
#include "mt/loadgen.h"
#include "mt/rpc.h"

static uint64_t rng(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 17;
}

/* AUC by definition: P(score of a positive > score of a negative), ties counted half. */
static double brute_auc(const mt_loadgen_scored_t *v, size_t n) {
    double num = 0, pairs = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++)
            if (v[i].label > 0.5f && v[j].label < 0.5f) {
                pairs++;
                num += v[i].score > v[j].score ? 1.0 : v[i].score == v[j].score ? 0.5 : 0.0;
            }
    return pairs ? num / pairs : NAN;
}

Test(loadgen, auc_exact) {
    uint64_t s = 7;
    for (int rep = 0; rep < 20; rep++) {
        size_t n = 1 + (size_t)(rng(&s) % 300);
        mt_loadgen_scored_t v[300], w[300];
        double pos = 0, sum = 0;
        for (size_t i = 0; i < n; i++) {
            v[i].score = (float)(rng(&s) % 17) / 16.0f; /* many ties, 0 and 1 included */
            v[i].label = (float)(rng(&s) % 3 == 0);
            pos += v[i].label;
            sum += v[i].score;
        }
        memcpy(w, v, sizeof(v));
        double ll, mean, ctr, want = brute_auc(v, n);
        double got = mt_loadgen_auc(w, n, &ll, &mean, &ctr);
        if (isnan(want))
            cr_assert(isnan(got), "n %zu: one class must give NAN, got %g", n, got);
        else
            cr_assert_float_eq(got, want, 1e-9, "n %zu: %g against %g", n, got, want);
        cr_assert_float_eq(ctr, pos / (double)n, 1e-12);
        cr_assert_float_eq(mean, sum / (double)n, 1e-6);
        cr_assert(ll > 0 && isfinite(ll), "log loss %g (scores 0 and 1 are clamped)", ll);
    }
    double ll, mean, ctr;
    cr_assert(isnan(mt_loadgen_auc(NULL, 0, &ll, &mean, &ctr)));
    cr_assert(isnan(ll) && isnan(mean) && isnan(ctr));
}

static int parse(mt_loadgen_opts_t *o, const char *const *args, int n) {
    char *argv[64];
    argv[0] = (char *)"monolith-loadgen";
    for (int i = 0; i < n; i++)
        argv[i + 1] = (char *)args[i];
    return mt_loadgen_parse_args(o, n + 1, argv);
}

Test(loadgen, flags) {
    static mt_loadgen_opts_t o;
    const char *ok[] = {"--serving", "127.0.0.1:1", "--serving", "b=@/tmp/x.port", "--rate", "50"};
    cr_assert_eq(parse(&o, ok, 6), 0);
    cr_assert_eq(o.ntargets, 2);
    cr_assert_str_eq(o.targets[0].name, "serving");
    cr_assert_str_eq(o.targets[0].addr, "127.0.0.1:1");
    cr_assert_str_eq(o.targets[1].name, "b");
    cr_assert_str_eq(o.targets[1].port_file, "/tmp/x.port");
    cr_assert_eq(o.rate, 50);
    cr_assert_eq(o.k, 10);
    cr_assert_eq(o.window_s, 10);
    cr_assert_str_eq(o.actions_topic, "actions");

    const char *none[] = {"--rate", "50"};
    cr_assert_eq(parse(&o, none, 2), -1, "no --serving");
    const char *unknown[] = {"--serving", "a:1", "--colour", "red"};
    cr_assert_eq(parse(&o, unknown, 4), -1);
    const char *range[] = {"--serving", "a:1", "--window-s", "0.1"};
    cr_assert_eq(parse(&o, range, 4), -1);
    const char *k[] = {"--serving", "a:1", "--items", "5", "--candidates", "6"};
    cr_assert_eq(parse(&o, k, 6), -1, "more candidates than items");
    const char *tls[] = {"--serving", "a:1", "--tls-cert", "/nonexistent.pem"};
    cr_assert_eq(parse(&o, tls, 4), -1, "TLS without a CA");
    const char *many[] = {"--serving", "a:1", "--serving", "a:2", "--serving", "a:3",
                          "--serving", "a:4", "--serving", "a:5", "--serving", "a:6",
                          "--serving", "a:7", "--serving", "a:8", "--serving", "a:9"};
    cr_assert_eq(parse(&o, many, 18), -1, "more than 8 targets");
}

/* ---- fake serving targets ---- */

#define USERS 40

typedef struct fake {
    int oracle;
    mt_gen_t *gen; /* the loop's generator (the same configuration) */
    int64_t t;     /* its clock: --time-scale 0 keeps it at start_time_ms */
    uint64_t user_fid[USERS];
} fake_t;

static void predict(void *ud, mt_rpc_call_t *c, const uint8_t *req, size_t len) {
    fake_t *f = ud;
    Monolith__V1__PredictRequest *r = monolith__v1__predict_request__unpack(NULL, len, req);
    if (!r) {
        mt_rpc_fail(c, MT_RPC_INVALID_ARGUMENT, "bad request");
        return;
    }
    int64_t user = -1;
    for (size_t s = 0; s < r->n_user; s++)
        if (r->user[s]->slot == MT_GEN_SLOT_USER && r->user[s]->n_fids == 1)
            for (int u = 0; u < USERS; u++)
                if (r->user[s]->fids[0] == f->user_fid[u]) user = u;
    float *scores = calloc(r->n_candidates, sizeof(float));
    for (size_t j = 0; j < r->n_candidates; j++) {
        double p = 0;
        uint64_t item = r->candidates[j]->item_id;
        if (f->oracle && user >= 0) {
            mt_gen_true_p(f->gen, (uint64_t)user, item, f->t, &p);
        } else { /* a hash of request and item: no information */
            uint64_t h = item * 0x9E3779B97F4A7C15ull;
            for (const char *q = r->request_id; *q; q++)
                h = (h ^ (uint8_t)*q) * 0x100000001B3ull;
            p = (double)(h >> 11) / 9007199254740992.0;
        }
        scores[j] = (float)p;
    }
    Monolith__V1__PredictResponse resp = MONOLITH__V1__PREDICT_RESPONSE__INIT;
    resp.n_scores = r->n_candidates;
    resp.scores = scores;
    size_t n = monolith__v1__predict_response__get_packed_size(&resp);
    uint8_t *buf = malloc(n + 1);
    monolith__v1__predict_response__pack(&resp, buf);
    mt_rpc_reply(c, buf, n);
    free(buf);
    free(scores);
    monolith__v1__predict_request__free_unpacked(r, NULL);
}

static mt_rpc_server_t *start_fake(fake_t *f, int *port) {
    mt_rpc_server_config_t sc;
    mt_rpc_server_config_init(&sc);
    mt_rpc_server_t *s = NULL;
    cr_assert_eq(mt_rpc_server_create(&sc, &s), MT_OK);
    cr_assert_eq(mt_rpc_server_add(s, "/monolith.v1.Serving/Predict", 0, predict, f), MT_OK);
    cr_assert_eq(mt_rpc_server_start(s, port), MT_OK);
    return s;
}

/* The number after "key": in the report's part that starts at @p from; NAN for null. */
static double num(const char *from, const char *key) {
    char k[64];
    snprintf(k, sizeof(k), "\"%s\": ", key);
    const char *p = strstr(from, k);
    cr_assert_not_null(p, "no %s in %s", key, from);
    p += strlen(k);
    return strncmp(p, "null", 4) ? strtod(p, NULL) : NAN;
}

Test(loadgen, run_against_fakes, .timeout = 120) {
    char dir[] = "/tmp/mt_test_loadgen_XXXXXX", report[128], port_file[128], a1[64], a2[64];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(report, sizeof(report), "%s/report.json", dir);
    snprintf(port_file, sizeof(port_file), "absent=@%s/never.port", dir);
    const char *args[] = {"--serving",
                          a1,
                          "--serving",
                          "shadow=127.0.0.1:1",
                          "--serving",
                          a2,
                          "--serving",
                          port_file,
                          "--duration-s",
                          "3",
                          "--window-s",
                          "0.5",
                          "--rate",
                          "200",
                          "--candidates",
                          "8",
                          "--inflight",
                          "2",
                          "--users",
                          "40",
                          "--items",
                          "60",
                          "--users-born-per-s",
                          "0",
                          "--items-born-per-s",
                          "0",
                          "--time-scale",
                          "0",
                          "--ctr",
                          "0.2",
                          "--progress-s",
                          "0",
                          "--deadline-ms",
                          "10000",
                          "--report",
                          report};
    static mt_loadgen_opts_t o;
    snprintf(a1, sizeof(a1), "oracle=127.0.0.1:1"); /* ports set below, after parsing */
    snprintf(a2, sizeof(a2), "random=127.0.0.1:1");
    cr_assert_eq(parse(&o, args, (int)(sizeof(args) / sizeof(args[0]))), 0);

    fake_t oracle = {.oracle = 1}, random = {.oracle = 0};
    cr_assert_eq(mt_gen_create(&o.gen, &oracle.gen), MT_OK);
    oracle.t = o.gen.start_time_ms;
    for (int u = 0; u < USERS; u++) {
        uint64_t f[MT_GEN_USER_FIDS];
        mt_gen_user_fids(oracle.gen, (uint64_t)u, oracle.t, f);
        oracle.user_fid[u] = f[0];
    }
    int p1 = 0, p2 = 0;
    mt_rpc_server_t *s1 = start_fake(&oracle, &p1), *s2 = start_fake(&random, &p2);
    snprintf(o.targets[0].addr, sizeof(o.targets[0].addr), "127.0.0.1:%d", p1);
    snprintf(o.targets[1].addr, sizeof(o.targets[1].addr), "127.0.0.1:%d", p1);
    snprintf(o.targets[2].addr, sizeof(o.targets[2].addr), "127.0.0.1:%d", p2);

    cr_assert_eq(mt_loadgen_run(&o, NULL), 0);
    mt_rpc_server_destroy(s1);
    mt_rpc_server_destroy(s2);
    mt_gen_destroy(oracle.gen);

    FILE *in = fopen(report, "r");
    cr_assert_not_null(in);
    static char rep[8192];
    rep[fread(rep, 1, sizeof(rep) - 1, in)] = '\0';
    fclose(in);
    unlink(report);
    rmdir(dir);
    double requests = num(rep, "requests"), truth = num(rep, "truth_auc");
    /* how many is the machine's speed (sanitizers, other tenants): no count is asserted */
    cr_assert_gt(requests, 0, "%s", rep);
    cr_assert_gt(num(rep, "clicks"), 0, "%s", rep);
    cr_assert(truth > 0.5 && truth < 1, "%s", rep);
    const char *po = strstr(rep, "\"oracle\":"), *pr = strstr(rep, "\"random\":"),
               *pa = strstr(rep, "\"absent\":"), *ps = strstr(rep, "\"shadow\":");
    cr_assert(po && pr && pa && ps, "%s", rep);
    cr_assert_eq(num(po, "ok"), requests, "%s", rep);
    cr_assert_eq(num(pr, "ok"), requests, "%s", rep);
    cr_assert_eq(num(po, "errors"), 0, "%s", rep);
    cr_assert_geq(num(po, "windows"), 1, "%s", rep);
    cr_assert_eq(num(po, "windows"), num(pr, "windows"), "%s", rep);
    /* the oracle scores every page as the truth does: the same AUC, window by window */
    cr_assert_float_eq(num(po, "mean_auc"), truth, 1e-4, "%s", rep);
    /* and so does the same scorer as a shadow: its scores paired with the primary's clicks */
    cr_assert_eq(num(ps, "ok"), requests, "%s", rep);
    cr_assert_float_eq(num(ps, "mean_auc"), truth, 1e-4, "%s", rep);
    cr_assert(fabs(num(pr, "mean_auc") - truth) > 0.05, "%s", rep);
    cr_assert_eq(num(pa, "ok"), 0, "%s", rep);
    cr_assert_eq(num(pa, "windows"), 0, "%s", rep);
    cr_assert_eq(num(rep, "paired_windows"), 0, "a target absent: no window is paired");
}
