/*
 * serving_bench - monolith-serving's Predict and sync against its floors (issue #6).
 *
 * Starts monolith-ps shard(s) and one monolith-serving (processes on 127.0.0.1: MT_PS_BIN,
 * MT_SERVING_BIN) for a model of 26 slots (13 user-side, 13 item-side), dim 16, MLP 256-128;
 * fills the PS by training on batches that cover every id (an in-process trainer against
 * the shards, which also creates the dense parameters on shard 0), waits for serving to be
 * ready, then prints one JSON object per line:
 *
 *   - predict: requests of 100 candidates (1 user fid and 13 item fids each, 1 + 13 x 100
 *     fids), with 1, 4 and 8 calls in flight (one client thread per call): requests/s,
 *     p50/p99 latency;
 *   - empty_call: grpc.health.v1.Health/Check against serving, one at a time: p50/p99, the
 *     price of a gRPC round trip on this machine;
 *   - sgemm_gflops: single-thread cblas_sgemm on the MLP's first layer shape (100 x 416 by
 *     416 x 256), measured here, in this run;
 *   - compute_floor: the model's FLOPs per request (2 x 100 x (416 x 256 + 256 x 128 +
 *     128 x 1), the MLP; FM and first order are O(100 x 26 x 16) and left out) divided by
 *     that GFLOP/s;
 *   - predict_vs_floor: Predict's p50 at 1 in flight / (compute floor + empty call p50); the
 *     target is 2 or less;
 *   - sync_lag: while a trainer thread keeps pushing updates to the PS, a probe creates a
 *     new row on the PS (a training lookup of a fresh id) and polls two replicas' Lookup
 *     until the row is there: the time in between, p50/p99 over the probes, each started at
 *     a random phase of a second. Both replicas have sync_interval_ms = 1000; the measured
 *     one follows the shards' change streams (sync_stream_ms = 100: expected about one round,
 *     p99 near 100 ms + a round's transfer), the second polls (sync_stream_ms = 0: uniform
 *     over the interval plus a sync's duration, p50 about 500 ms, p99 just over 1 s).
 *
 *   serving_bench [--quick] [--shards N] [--seconds S] [--probes P]
 *
 * --quick (CI smoke): fewer ids, 1 s per concurrency level, 6 probes. Never asserts on time.
 * The client threads share the machine's cores with the daemons: on 2 cores, 8 in flight
 * measures contention as much as serving.
 */
#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_serving.h"
#include "bench_util.h"
#include "monolith/v1/ps.pb-c.h"
#include "monolith/v1/serving.pb-c.h"
#include "mt/clock.h"
#include "mt/batch.h"
#include "mt/psclient.h"
#include "mt/rpc.h"
#include "mt/trainer.h"

#define NSLOTS          26
#define USER_SLOTS      13
#define DIM             16
#define CANDIDATES      100
#define SYNC_INTERVAL_S 1.0 /* serving.sync_interval_ms of the sync-lag run */
#define MAX_SHARDS      4
#define PREDICT         "/monolith.v1.Serving/Predict"

/* ============================== helpers ============================== */

static void emit(const char *metric, double v, const char *unit, const char *extra) {
    mt_bench_emit("serving", metric, v, unit, extra);
}

static uint64_t fid(uint32_t slot, uint64_t v) {
    return ((uint64_t)slot << 48) | (v & 0xFFFFFFFFFFFFull);
}

/* Starts a daemon and waits up to 30 s for its port file; @returns the port or -1 (and
 * prints the log). */
static int start_daemon(char *const argv[], const char *port_path, const char *log) {
    pid_t pid = mt_bench_spawn(argv, log);
    if (pid < 0) return -1;
    int port = mt_bench_wait_port(port_path, pid, 30, NULL);
    if (port < 0) mt_bench_log_tail(log);
    return port;
}

/* ============================== requests ============================== */

typedef struct env {
    uint64_t users, items;     /* ids per slot */
    mt_rpc_channel_t *serving; /* following the shards (sync_stream_ms = 100) */
    mt_rpc_channel_t *poller;  /* a second replica polling every second (sync_stream_ms = 0) */
    mt_psc_t *psc;
    double seconds;
    _Atomic int stop;
} env_t;

static env_t E;

/* Encodes a Predict of CANDIDATES candidates for request @p r into *buf (malloc'd). */
static size_t encode_predict(uint64_t r, uint8_t **buf) {
    uint64_t ufids[USER_SLOTS], ifids[CANDIDATES][NSLOTS - USER_SLOTS];
    Monolith__V1__SlotFids us[USER_SLOTS], is[CANDIDATES][NSLOTS - USER_SLOTS];
    Monolith__V1__SlotFids *up[USER_SLOTS], *ip[CANDIDATES][NSLOTS - USER_SLOTS];
    Monolith__V1__Candidate cs[CANDIDATES], *cp[CANDIDATES];
    for (uint32_t s = 0; s < USER_SLOTS; s++) {
        ufids[s] = fid(s + 1, mt_bench_mix64(r * 31 + s) % E.users);
        monolith__v1__slot_fids__init(&us[s]);
        us[s].slot = s + 1;
        us[s].n_fids = 1;
        us[s].fids = &ufids[s];
        up[s] = &us[s];
    }
    for (uint32_t c = 0; c < CANDIDATES; c++) {
        monolith__v1__candidate__init(&cs[c]);
        cs[c].item_id = mt_bench_mix64(r * 1000 + c) % E.items;
        for (uint32_t s = 0; s < NSLOTS - USER_SLOTS; s++) {
            ifids[c][s] = fid(USER_SLOTS + 1 + s, mt_bench_mix64(r * 7919 + c * 31 + s) % E.items);
            monolith__v1__slot_fids__init(&is[c][s]);
            is[c][s].slot = USER_SLOTS + 1 + s;
            is[c][s].n_fids = 1;
            is[c][s].fids = &ifids[c][s];
            ip[c][s] = &is[c][s];
        }
        cs[c].n_item = NSLOTS - USER_SLOTS;
        cs[c].item = ip[c];
        cp[c] = &cs[c];
    }
    char rid[32];
    snprintf(rid, sizeof(rid), "bench-%llu", (unsigned long long)r);
    Monolith__V1__PredictRequest q = MONOLITH__V1__PREDICT_REQUEST__INIT;
    q.request_id = rid;
    q.n_user = USER_SLOTS;
    q.user = up;
    q.n_candidates = CANDIDATES;
    q.candidates = cp;
    size_t len = monolith__v1__predict_request__get_packed_size(&q);
    *buf = malloc(len);
    if (!*buf) return 0;
    monolith__v1__predict_request__pack(&q, *buf);
    return len;
}

typedef struct load {
    pthread_t th;
    uint32_t id;
    mt_rpc_channel_t *ch;   /* NULL: E.serving */
    mt_bench_samples_t lat; /* ms */
    uint64_t errors;
} load_t;

#define NREQ 64 /* distinct encoded requests, reused */
static uint8_t *g_req[NREQ];
static size_t g_req_len[NREQ];

static void *load_main(void *arg) {
    load_t *l = arg;
    double end = mt_mono_s() + E.seconds;
    uint64_t i = l->id;
    while (mt_mono_s() < end) {
        uint8_t *resp = NULL;
        size_t rlen = 0;
        mt_rpc_status_t st;
        size_t k = (size_t)(i++ % NREQ);
        double t0 = mt_mono_s();
        mt_err_t err = mt_rpc_call(l->ch ? l->ch : E.serving, PREDICT, g_req[k], g_req_len[k], 5000,
                                   &resp, &rlen, &st);
        double dt = mt_mono_s() - t0;
        int ok = err == MT_OK && st.code == MT_RPC_OK;
        if (ok) {
            Monolith__V1__PredictResponse *pr =
                monolith__v1__predict_response__unpack(NULL, rlen, resp);
            ok = pr && pr->n_scores == CANDIDATES;
            if (pr) monolith__v1__predict_response__free_unpacked(pr, NULL);
        }
        free(resp);
        if (!ok) {
            l->errors++;
            continue;
        }
        if (mt_bench_samples_push(&l->lat, dt * 1000)) break;
    }
    return NULL;
}

/* Waits up to 60 s for the replica behind @p ch to answer SERVING. @returns 0, or -1 (and
 * says so, naming it @p what). */
static int wait_healthy(mt_rpc_channel_t *ch, const char *what) {
    double t0 = mt_mono_s();
    while (!mt_rpc_serving(ch, 1000)) {
        if (mt_mono_s() - t0 > 60) {
            fprintf(stderr, "serving_bench: %s not ready after 60 s\n", what);
            return -1;
        }
        mt_bench_sleep_s(0.05);
    }
    return 0;
}

/* Predict one call at a time on @p ch for E.seconds: p50 and p99 (ms). @returns 0 or -1. */
static int predict_one_in_flight(mt_rpc_channel_t *ch, double *p50, double *p99, size_t *n,
                                 uint64_t *errors) {
    load_t l = {.id = 3, .ch = ch};
    load_main(&l);
    *n = l.lat.n;
    *errors = l.errors;
    *p50 = mt_bench_pct(l.lat.v, l.lat.n, 0.5);
    *p99 = mt_bench_pct(l.lat.v, l.lat.n, 0.99);
    free(l.lat.v);
    return l.lat.n ? 0 : -1;
}

/* ============================== training ============================== */

static const uint16_t g_slots[NSLOTS] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13,
                                         14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26};

/* Batch b: example e has id (b * n + e) mod ids in every slot (a fill covers every id). */
static int make_batch(mt_batch_t *bt, uint64_t b, size_t n) {
    if (bt->nslots == 0 && mt_batch_init(bt, g_slots, NSLOTS) != MT_OK) return -1;
    mt_batch_clear(bt);
    for (size_t e = 0; e < n; e++) {
        uint64_t v[NSLOTS];
        const uint64_t *per[NSLOTS];
        uint32_t counts[NSLOTS];
        for (uint32_t s = 0; s < NSLOTS; s++) {
            uint64_t ids = s < USER_SLOTS ? E.users : E.items;
            v[s] = fid(s + 1, (b * n + e + s * 7) % ids);
            per[s] = &v[s];
            counts[s] = 1;
        }
        float label = (mt_bench_mix64(b * 100003 + e) % 100) < 5 ? 1.0f : 0.0f;
        if (mt_batch_add(bt, label, 0, 1.0f, per, counts) != MT_OK) return -1;
    }
    return 0;
}

typedef struct trainer_ctx {
    mt_trainer_t *tr;
    mt_trainer_dense_sync_t *ds;
    uint64_t steps;
    int failed;
} trainer_ctx_t;

static int train_steps(trainer_ctx_t *t, uint64_t from, uint64_t n, size_t batch, int until_stop) {
    mt_batch_t bt;
    memset(&bt, 0, sizeof(bt));
    int rc = 0;
    char err[256];
    for (uint64_t b = from; until_stop ? !atomic_load(&E.stop) : b < from + n; b++) {
        if (make_batch(&bt, b, batch) ||
            mt_trainer_train(t->tr, &bt, (uint32_t)time(NULL), NULL, NULL) != MT_OK ||
            mt_trainer_dense_sync_step(t->ds, NULL, err, sizeof(err)) != MT_OK) {
            rc = -1;
            break;
        }
        t->steps++;
    }
    mt_batch_free(&bt);
    return rc;
}

static void *trainer_main(void *arg) {
    trainer_ctx_t *t = arg;
    if (train_steps(t, 1000000, 0, 256, 1)) t->failed = 1;
    return NULL;
}

/* ============================== floors ============================== */

static double sgemm_gflops(void) {
    const int m = CANDIDATES, k = NSLOTS * DIM, n = 256;
    float *A = calloc((size_t)m * k, sizeof(float)), *W = calloc((size_t)k * n, sizeof(float)),
          *C = calloc((size_t)m * n, sizeof(float));
    double r[5];
    for (int i = 0; i < m * k; i++)
        A[i] = (float)(i % 7) * 0.1f;
    for (int i = 0; i < k * n; i++)
        W[i] = (float)(i % 5) * 0.1f;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = mt_mono_s();
        int iters = 200;
        for (int it = 0; it < iters; it++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, A, k, W, n, 0.0f,
                        C, n);
        r[rep] = 2.0 * m * n * k * iters / (mt_mono_s() - t0) / 1e9;
    }
    free(A);
    free(W);
    free(C);
    mt_bench_sort(r, 5);
    return r[4]; /* the best of 5: what the core reaches when nothing else runs */
}

/* ============================== main ============================== */

int main(int argc, char **argv) {
    int quick = 0, shards = 1, probes = 30;
    double seconds = 8;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--shards") && i + 1 < argc)
            shards = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
            seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--probes") && i + 1 < argc)
            probes = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: serving_bench [--quick] [--shards N] [--seconds S] "
                            "[--probes P]\n");
            return 2;
        }
    }
    if (shards < 1 || shards > MAX_SHARDS) shards = 1;
    if (quick) {
        seconds = 1;
        probes = 6;
    }
    E.users = quick ? 2000 : 20000;
    E.items = quick ? 2000 : 20000;
    E.seconds = seconds;
    openblas_set_num_threads(1);
    /* stops the daemons and removes the directory at exit and on a signal */
    mt_bench_cleanup_install();
    mt_bench_run_conditions("serving");

    const char *root = mt_bench_root_create("mt-serving-bench");
    if (!root) return 1;
    char conf[256], path[256], log[256];
    snprintf(conf, sizeof(conf), "%s/bench.conf", root);
    FILE *f = fopen(conf, "w");
    if (!f) return 1;
    fprintf(f, "[trainer]\nslots = ");
    for (int s = 1; s <= NSLOTS; s++)
        fprintf(f, "%s%d", s > 1 ? ", " : "", s);
    fprintf(f,
            "\ndim = %d\nhidden = 256, 128\ndense_sync_batches = 1\n\n"
            "[ps]\nthreads = 2\nsnapshot_dir =\n\n"
            "[serving]\nthreads = 4\nsync_interval_ms = 1000\nsync_stream_ms = 100\n"
            "dense_sync_interval_ms = 1000\n"
            "log_sample_rate = 0\n",
            DIM);
    fclose(f);

    /* the PS shards */
    char addrs[MAX_SHARDS][64], cluster[MAX_SHARDS * 64 + 32] = "cluster.ps=";
    char nsh[16];
    snprintf(nsh, sizeof(nsh), "%d", shards);
    for (int i = 0; i < shards; i++) {
        char shard[16];
        snprintf(shard, sizeof(shard), "%d", i);
        snprintf(path, sizeof(path), "%s/ps%d.port", root, i);
        snprintf(log, sizeof(log), "%s/ps%d.log", root, i);
        char *av[] = {MT_PS_BIN,      "--config",    conf,       "--shard",     shard,
                      "--num-shards", nsh,           "--listen", "127.0.0.1:0", "--port-file",
                      path,           "--log-level", "warn",     NULL};
        int port = start_daemon(av, path, log);
        if (port < 0) return 1;
        snprintf(addrs[i], sizeof(addrs[i]), "127.0.0.1:%d", port);
        snprintf(cluster + strlen(cluster), sizeof(cluster) - strlen(cluster), "%s%s", i ? "," : "",
                 addrs[i]);
    }

    /* fill: a trainer covers every id of every slot (rows of embedding and first-order weight) */
    const char *pa[MAX_SHARDS];
    for (int i = 0; i < shards; i++)
        pa[i] = addrs[i];
    mt_psc_config_t pc;
    mt_psc_config_init(&pc);
    pc.addrs = pa;
    pc.num_shards = (uint32_t)shards;
    if (mt_psc_create(&pc, &E.psc) != MT_OK) return 1;
    mt_trainer_config_t tc;
    mt_trainer_config_init(&tc);
    tc.nslots = NSLOTS;
    memcpy(tc.slot_ids, g_slots, sizeof(g_slots));
    tc.dim = DIM;
    mt_trainer_backend_t be;
    mt_trainer_backend_psc(E.psc, &be);
    tc.backend = &be;
    trainer_ctx_t T = {0};
    char err[256];
    if (mt_trainer_create(&tc, &T.tr) != MT_OK ||
        mt_trainer_dense_sync_create(T.tr, E.psc, 1, &T.ds, err, sizeof(err)) != MT_OK) {
        fprintf(stderr, "serving_bench: trainer: %s\n", err);
        return 1;
    }
    double t0 = mt_mono_s();
    uint64_t ids = E.users > E.items ? E.users : E.items;
    if (train_steps(&T, 0, (ids + 1023) / 1024, 1024, 0)) {
        fprintf(stderr, "serving_bench: filling the PS failed\n");
        return 1;
    }
    char extra[512];
    snprintf(extra, sizeof(extra), "\"shards\":%d,\"ids_per_slot\":%llu,\"slots\":%d,\"dim\":%d",
             shards, (unsigned long long)ids, NSLOTS, DIM);
    emit("fill_seconds", mt_mono_s() - t0, "s", extra);

    /* serving */
    snprintf(path, sizeof(path), "%s/serving.port", root);
    snprintf(log, sizeof(log), "%s/serving.log", root);
    char *sv[] = {MT_SERVING_BIN, "--config",    conf, "--set",       cluster, "--listen",
                  "127.0.0.1:0",  "--port-file", path, "--log-level", "warn",  NULL};
    int sport = start_daemon(sv, path, log);
    if (sport < 0) return 1;
    char saddr[64];
    snprintf(saddr, sizeof(saddr), "127.0.0.1:%d", sport);
    mt_rpc_client_config_t cc;
    mt_rpc_client_config_init(&cc);
    if (mt_rpc_channel_create(saddr, &cc, &E.serving) != MT_OK) return 1;
    t0 = mt_mono_s();
    if (wait_healthy(E.serving, "serving")) return 1;
    emit("ready_seconds", mt_mono_s() - t0, "s", extra);

    for (uint64_t r = 0; r < NREQ; r++)
        if (!(g_req_len[r] = encode_predict(r, &g_req[r]))) return 1;

    /* the empty call */
    size_t ne = quick ? 300 : 3000;
    double *el = calloc(ne, sizeof(double));
    if (!el) return 1;
    for (size_t i = 0; i < ne + 50; i++) {
        double c0 = mt_mono_s();
        if (!mt_rpc_serving(E.serving, 1000)) return 1;
        if (i >= 50) el[i - 50] = (mt_mono_s() - c0) * 1000;
    }
    double e50 = mt_bench_pct(el, ne, 0.5), e99 = mt_bench_pct(el, ne, 0.99);
    snprintf(extra, sizeof(extra),
             "\"p50_ms\":%.4f,\"p99_ms\":%.4f,\"calls\":%zu,"
             "\"call\":\"grpc.health.v1.Health/Check\"",
             e50, e99, ne);
    emit("empty_call_p50_ms", e50, "ms", extra);
    free(el);

    /* the compute floor */
    double gf = sgemm_gflops();
    double flops = 2.0 * CANDIDATES * ((double)NSLOTS * DIM * 256 + 256 * 128 + 128);
    double floor_ms = flops / (gf * 1e9) * 1000;
    snprintf(extra, sizeof(extra), "\"m\":%d,\"n\":256,\"k\":%d,\"threads\":1", CANDIDATES,
             NSLOTS * DIM);
    emit("sgemm_gflops", gf, "GFLOP/s", extra);
    snprintf(extra, sizeof(extra), "\"flops_per_request\":%.0f,\"sgemm_gflops\":%.2f", flops, gf);
    emit("compute_floor_ms", floor_ms, "ms", extra);

    /* Predict at 1, 4, 8 in flight */
    double p50_1 = NAN;
    const uint32_t levels[] = {1, 4, 8};
    for (size_t li = 0; li < 3; li++) {
        uint32_t nl = levels[li];
        load_t *ls = calloc(nl, sizeof(*ls));
        if (!ls) return 1;
        double w0 = mt_mono_s();
        for (uint32_t i = 0; i < nl; i++) {
            ls[i].id = i * 7;
            if (pthread_create(&ls[i].th, NULL, load_main, &ls[i])) return 1;
        }
        size_t total = 0;
        uint64_t errors = 0;
        for (uint32_t i = 0; i < nl; i++) {
            pthread_join(ls[i].th, NULL);
            total += ls[i].lat.n;
            errors += ls[i].errors;
        }
        double wall = mt_mono_s() - w0;
        double *all = malloc((total ? total : 1) * sizeof(double));
        if (!all) return 1;
        size_t k = 0;
        for (uint32_t i = 0; i < nl; i++) {
            memcpy(all + k, ls[i].lat.v, ls[i].lat.n * sizeof(double));
            k += ls[i].lat.n;
            free(ls[i].lat.v);
        }
        double p50 = mt_bench_pct(all, total, 0.5), p99 = mt_bench_pct(all, total, 0.99);
        if (nl == 1) p50_1 = p50;
        snprintf(extra, sizeof(extra),
                 "\"inflight\":%u,\"candidates\":%d,\"slots\":%d,\"dim\":%d,\"mlp\":\"256-128\","
                 "\"p50_ms\":%.4f,\"p99_ms\":%.4f,\"requests\":%zu,\"errors\":%llu,"
                 "\"candidates_per_s\":%.0f",
                 nl, CANDIDATES, NSLOTS, DIM, p50, p99, total, (unsigned long long)errors,
                 (double)total * CANDIDATES / wall);
        emit("predict_requests_per_s", (double)total / wall, "requests/s", extra);
        free(all);
        free(ls);
    }
    snprintf(extra, sizeof(extra),
             "\"predict_p50_ms\":%.4f,\"compute_floor_ms\":%.4f,\"empty_call_p50_ms\":%.4f,"
             "\"target\":\"<= 1.5\"",
             p50_1, floor_ms, e50);
    emit("predict_vs_floor", p50_1 / (floor_ms + e50), "x", extra);

    /* Sharded serving (shards >= 2): a node holding shard 0 only, reading the other shards'
     * rows from a peer that holds them (one Lookup per request), against the node holding
     * every shard; the two measured one after the other, each for E.seconds, twice
     * (full, half, full, half) so that a drift of the machine shows. */
    if (shards >= 2) {
        char rest[64] = "serving.shards=", peers[128];
        for (int i = 1; i < shards; i++)
            snprintf(rest + strlen(rest), sizeof(rest) - strlen(rest), "%s%d", i > 1 ? "," : "", i);
        snprintf(peers, sizeof(peers), "serving.peers=127.0.0.1:%d", sport);
        snprintf(path, sizeof(path), "%s/rest.port", root);
        snprintf(log, sizeof(log), "%s/rest.log", root);
        char *rv[] = {MT_SERVING_BIN, "--config",    conf,          "--set",
                      cluster,        "--set",       rest,          "--set",
                      peers,          "--listen",    "127.0.0.1:0", "--port-file",
                      path,           "--log-level", "warn",        NULL};
        int rport = start_daemon(rv, path, log);
        if (rport < 0) return 1;
        snprintf(peers, sizeof(peers), "serving.peers=127.0.0.1:%d", rport);
        snprintf(path, sizeof(path), "%s/half.port", root);
        snprintf(log, sizeof(log), "%s/half.log", root);
        char *hv[] = {MT_SERVING_BIN,
                      "--config",
                      conf,
                      "--set",
                      cluster,
                      "--set",
                      "serving.shards=0",
                      "--set",
                      peers,
                      "--listen",
                      "127.0.0.1:0",
                      "--port-file",
                      path,
                      "--log-level",
                      "warn",
                      NULL};
        int hport = start_daemon(hv, path, log);
        if (hport < 0) return 1;
        mt_rpc_channel_t *rest_ch = NULL, *half = NULL;
        snprintf(saddr, sizeof(saddr), "127.0.0.1:%d", rport);
        if (mt_rpc_channel_create(saddr, &cc, &rest_ch) != MT_OK) return 1;
        snprintf(saddr, sizeof(saddr), "127.0.0.1:%d", hport);
        if (mt_rpc_channel_create(saddr, &cc, &half) != MT_OK) return 1;
        if (wait_healthy(rest_ch, "the node of shards 1..") || wait_healthy(half, "the half node"))
            return 1;
        double f50[2], f99[2], h50[2], h99[2];
        size_t fn[2], hn[2];
        uint64_t fe[2], he[2];
        for (int r = 0; r < 2; r++)
            if (predict_one_in_flight(E.serving, &f50[r], &f99[r], &fn[r], &fe[r]) ||
                predict_one_in_flight(half, &h50[r], &h99[r], &hn[r], &he[r])) {
                fprintf(stderr, "serving_bench: sharded Predicts failed (see %s)\n", log);
                return 1;
            }
        double full50 = (f50[0] + f50[1]) / 2, half50 = (h50[0] + h50[1]) / 2;
        snprintf(extra, sizeof(extra),
                 "\"shards_held\":1,\"shards\":%d,\"peers\":1,\"inflight\":1,"
                 "\"full_p50_ms\":[%.4f,%.4f],\"full_p99_ms\":[%.4f,%.4f],"
                 "\"half_p50_ms\":[%.4f,%.4f],\"half_p99_ms\":[%.4f,%.4f],"
                 "\"requests\":%zu,\"errors\":%llu,\"target\":\"< 0.5 ms at p50\"",
                 shards, f50[0], f50[1], f99[0], f99[1], h50[0], h50[1], h99[0], h99[1],
                 fn[0] + fn[1] + hn[0] + hn[1],
                 (unsigned long long)(fe[0] + fe[1] + he[0] + he[1]));
        emit("predict_sharded_extra_p50_ms", half50 - full50, "ms", extra);
        snprintf(extra, sizeof(extra), "\"full_p50_ms\":%.4f,\"half_p50_ms\":%.4f", full50, half50);
        emit("predict_sharded_vs_full", half50 / full50, "x", extra);
        mt_rpc_channel_destroy(rest_ch);
        mt_rpc_channel_destroy(half);
    }

    /* sync lag under training load: the following replica and a polling one */
    snprintf(path, sizeof(path), "%s/poller.port", root);
    snprintf(log, sizeof(log), "%s/poller.log", root);
    char *pv[] = {MT_SERVING_BIN,
                  "--config",
                  conf,
                  "--set",
                  cluster,
                  "--set",
                  "serving.sync_stream_ms=0",
                  "--listen",
                  "127.0.0.1:0",
                  "--port-file",
                  path,
                  "--log-level",
                  "warn",
                  NULL};
    int pport = start_daemon(pv, path, log);
    if (pport < 0) return 1;
    snprintf(saddr, sizeof(saddr), "127.0.0.1:%d", pport);
    if (mt_rpc_channel_create(saddr, &cc, &E.poller) != MT_OK) return 1;
    if (wait_healthy(E.poller, "the polling replica")) return 1;
    pthread_t trth;
    if (pthread_create(&trth, NULL, trainer_main, &T)) return 1;
    double *lag = calloc((size_t)probes, sizeof(double));
    double *plag = calloc((size_t)probes, sizeof(double));
    int nlag = 0, nplag = 0, lost = 0;
    if (!lag || !plag) return 1;
    for (int p = 0; p < probes; p++) {
        /* a phase uniform over the interval: a probe right after the last one was seen would
         * start just after a sync and measure nearly a whole interval every time */
        mt_bench_sleep_s((double)(mt_bench_mix64((uint64_t)p) % 1000) / 1000.0 * SYNC_INTERVAL_S);
        uint64_t probe =
            fid(1, (1ull << 40) + (uint64_t)p * 977 + (uint64_t)time(NULL) % 1000 * 100000);
        float emb[DIM + 1]; /* a row: the embedding, then the first-order weight */
        mt_rpc_status_t st;
        double c0 = mt_mono_s();
        if (mt_psc_lookup(E.psc, &probe, 1, 1, 0, emb, DIM + 1, NULL, &st) != MT_OK) {
            lost++;
            continue;
        }
        int seen = 0, pseen = 0;
        while (mt_mono_s() - c0 < 10 && !(seen && pseen)) {
            if (!seen && mt_bench_serving_served(E.serving, probe) == 1) {
                seen = 1;
                lag[nlag++] = (mt_mono_s() - c0) * 1000;
            }
            if (!pseen && mt_bench_serving_served(E.poller, probe) == 1) {
                pseen = 1;
                plag[nplag++] = (mt_mono_s() - c0) * 1000;
            }
            if (!(seen && pseen)) mt_bench_sleep_s(0.002);
        }
        if (!seen || !pseen) lost++;
    }
    atomic_store(&E.stop, 1);
    pthread_join(trth, NULL);
    double l50 = mt_bench_pct(lag, (size_t)nlag, 0.5), l99 = mt_bench_pct(lag, (size_t)nlag, 0.99);
    double p50 = mt_bench_pct(plag, (size_t)nplag, 0.5),
           p99 = mt_bench_pct(plag, (size_t)nplag, 0.99);
    snprintf(extra, sizeof(extra),
             "\"mode\":\"follow\",\"sync_interval_ms\":1000,\"sync_stream_ms\":100,"
             "\"p50_ms\":%.1f,\"p99_ms\":%.1f,\"probes\":%d,\"lost\":%d,\"trainer_steps\":%llu,"
             "\"trainer_failed\":%d,\"target\":\"p99 < 1000 ms\"",
             l50, l99, nlag, lost, (unsigned long long)T.steps, T.failed);
    emit("sync_lag_p99_ms", l99, "ms", extra);
    snprintf(extra, sizeof(extra),
             "\"mode\":\"poll\",\"sync_interval_ms\":1000,\"sync_stream_ms\":0,"
             "\"p50_ms\":%.1f,\"p99_ms\":%.1f,\"probes\":%d,\"lost\":%d",
             p50, p99, nplag, lost);
    emit("sync_lag_poll_p99_ms", p99, "ms", extra);
    free(lag);
    free(plag);

    for (int r = 0; r < NREQ; r++)
        free(g_req[r]);
    mt_trainer_dense_sync_destroy(T.ds);
    mt_trainer_destroy(T.tr);
    mt_rpc_channel_destroy(E.serving);
    mt_rpc_channel_destroy(E.poller);
    mt_psc_destroy(E.psc);
    return T.failed || lost > probes / 2 ? 1 : 0;
}
