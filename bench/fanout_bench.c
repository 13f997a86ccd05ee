/*
 * fanout_bench - the parameters' fan-out to serving replicas: following the shards directly
 * (a Sync stream per replica) against following the parameters topic (docs/serving.md,
 * "Parameter fan-out through Kafka").
 *
 * Starts monolith-kafka-dev, one monolith-ps shard publishing every 100 ms (ps.publish_ms;
 * sync_max_followers high enough that every direct replica follows) and fills it by training
 * (an in-process trainer: 8 slots, dim 16). Then, for each mode (direct, kafka) and each
 * count of replicas N (1, 4, 8; --quick: 1, 2), it starts N monolith-serving processes,
 * waits until they are ready, keeps a trainer thread pushing updates, and measures:
 *
 *   - ps_cpu_cores: the shard's CPU (user + system seconds per second, /proc) over a window,
 *     and its growth per replica against the same load with no replica (the baseline,
 *     measured first: the publisher and the trainer's calls);
 *   - sync lag: a probe creates a fresh row on the shard (a training lookup of a new id) and
 *     polls every replica's Lookup until the row is there; the time in between, p50/p99 over
 *     the probes and the replicas.
 *
 *   fanout_bench [--quick] [--probes P] [--window S]
 *
 * Targets (the issue's): lag p99 < 500 ms with 8 replicas through Kafka, the shard's CPU
 * flat in the number of replicas. On 2 cores the replicas, the trainer and the shard share
 * the machine: the lag includes that contention. Never asserts on time.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_serving.h"
#include "bench_util.h"
#include "mt/batch.h"
#include "mt/clock.h"
#include "mt/psclient.h"
#include "mt/rpc.h"
#include "mt/trainer.h"

#define NSLOTS       8
#define DIM          16
#define MAX_REPLICAS 8

static void emit(const char *metric, double v, const char *unit, const char *extra) {
    mt_bench_emit("fanout", metric, v, unit, extra);
}

static uint64_t fid(uint32_t slot, uint64_t v) {
    return ((uint64_t)slot << 48) | (v & 0xFFFFFFFFFFFFull);
}

static const uint16_t g_slots[NSLOTS] = {1, 2, 3, 4, 5, 6, 7, 8};

/* ---------------- the trainer ---------------- */

typedef struct trainer_ctx {
    mt_trainer_t *tr;
    mt_trainer_dense_sync_t *ds;
    uint64_t ids, steps, next;
    _Atomic int stop;
    int failed;
    pthread_t th;
} trainer_ctx_t;

/* Batch b: example e has id (b * n + e) mod ids in every slot. */
static int train_batch(trainer_ctx_t *t, mt_batch_t *bt, uint64_t b, size_t n) {
    if (bt->nslots == 0 && mt_batch_init(bt, g_slots, NSLOTS) != MT_OK) return -1;
    mt_batch_clear(bt);
    for (size_t e = 0; e < n; e++) {
        uint64_t v[NSLOTS];
        const uint64_t *per[NSLOTS];
        uint32_t counts[NSLOTS];
        for (uint32_t s = 0; s < NSLOTS; s++) {
            v[s] = fid(s + 1, (b * n + e + s * 7) % t->ids);
            per[s] = &v[s];
            counts[s] = 1;
        }
        float label = (mt_bench_mix64(b * 100003 + e) % 100) < 5 ? 1.0f : 0.0f;
        if (mt_batch_add(bt, label, 0, 1.0f, per, counts) != MT_OK) return -1;
    }
    char err[256];
    if (mt_trainer_train(t->tr, bt, (uint32_t)time(NULL), NULL, NULL) != MT_OK ||
        mt_trainer_dense_sync_step(t->ds, NULL, err, sizeof(err)) != MT_OK)
        return -1;
    t->steps++;
    return 0;
}

/* The load during a measurement: batches of 256 as fast as the shard takes them, with a
 * pause of 20 ms between them (a steady stream of changes, not a saturated shard). */
static void *trainer_main(void *arg) {
    trainer_ctx_t *t = arg;
    mt_batch_t bt;
    memset(&bt, 0, sizeof(bt));
    while (!atomic_load(&t->stop)) {
        if (train_batch(t, &bt, t->next++, 256)) {
            t->failed = 1;
            break;
        }
        mt_bench_sleep_s(0.02);
    }
    mt_batch_free(&bt);
    return NULL;
}

/* ---------------- replicas ---------------- */

typedef struct fleet {
    int n;
    pid_t pid[MAX_REPLICAS];
    mt_rpc_channel_t *ch[MAX_REPLICAS];
} fleet_t;

/* Starts @p n replicas following as @p source says and waits until all are ready.
 * @returns 0, or -1 (and prints the log of the one that failed). */
static int fleet_start(fleet_t *f, int n, const char *conf, const char *cluster,
                       const char *source) {
    memset(f, 0, sizeof(*f));
    for (int k = 0; k < n; k++) {
        char path[512], log[512], src[64];
        snprintf(path, sizeof(path), "%s/%s%d.port", mt_bench_root(), source, k);
        snprintf(log, sizeof(log), "%s/%s%d.log", mt_bench_root(), source, k);
        snprintf(src, sizeof(src), "serving.sync_source=%s", source);
        unlink(path);
        char *av[] = {MT_SERVING_BIN, "--config",    (char *)conf, "--set",       (char *)cluster,
                      "--set",        src,           "--listen",   "127.0.0.1:0", "--port-file",
                      path,           "--log-level", "warn",       NULL};
        pid_t pid = mt_bench_spawn(av, log);
        int port = pid < 0 ? -1 : mt_bench_wait_port(path, pid, 30, NULL);
        if (port < 0) {
            mt_bench_log_tail(log);
            return -1;
        }
        char addr[64];
        snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
        mt_rpc_client_config_t cc;
        mt_rpc_client_config_init(&cc);
        f->pid[k] = pid;
        if (mt_rpc_channel_create(addr, &cc, &f->ch[k]) != MT_OK) return -1;
        f->n = k + 1;
    }
    double t0 = mt_mono_s();
    for (int k = 0; k < n; k++)
        while (!mt_rpc_serving(f->ch[k], 1000)) {
            if (mt_mono_s() - t0 > 120) {
                fprintf(stderr, "fanout_bench: a %s replica not ready after 120 s\n", source);
                return -1;
            }
            mt_bench_sleep_s(0.05);
        }
    return 0;
}

static void fleet_stop(fleet_t *f) {
    for (int k = 0; k < f->n; k++) {
        mt_rpc_channel_destroy(f->ch[k]);
        mt_bench_child_stop(f->pid[k], SIGTERM);
    }
    f->n = 0;
}

/* ---------------- one measurement ---------------- */

typedef struct result {
    double cpu, p50, p99;
    int probes, lost;
} result_t;

/* With @p f (NULL: no replica) following and the trainer running: the shard's CPU over
 * @p window seconds, then @p probes lag probes. */
static int measure(trainer_ctx_t *t, mt_psc_t *psc, pid_t ps_pid, fleet_t *f, double window,
                   int probes, result_t *out) {
    memset(out, 0, sizeof(*out));
    atomic_store(&t->stop, 0);
    if (pthread_create(&t->th, NULL, trainer_main, t)) return -1;
    mt_bench_sleep_s(1.0); /* the replicas' streams and the trainer at their pace */
    double c0 = mt_bench_pid_cpu_s(ps_pid), w0 = mt_mono_s();
    mt_bench_sleep_s(window);
    out->cpu = (mt_bench_pid_cpu_s(ps_pid) - c0) / (mt_mono_s() - w0);
    int n = f ? f->n : 0;
    double *lag = calloc((size_t)probes * (n ? n : 1), sizeof(double));
    if (!lag) return -1;
    size_t nl = 0;
    for (int p = 0; p < probes && n; p++) {
        mt_bench_sleep_s((double)(mt_bench_mix64((uint64_t)p) % 100) / 1000.0);
        uint64_t probe = fid(1, (1ull << 40) + (uint64_t)p * 977 + (uint64_t)mt_mono_s() * 1000);
        float emb[DIM + 1]; /* a row: the embedding, then the first-order weight */
        mt_rpc_status_t st;
        double c = mt_mono_s();
        if (mt_psc_lookup(psc, &probe, 1, 1, 0, emb, DIM + 1, NULL, &st) != MT_OK) {
            out->lost++;
            continue;
        }
        int seen[MAX_REPLICAS] = {0}, left = n;
        while (left && mt_mono_s() - c < 10) {
            for (int k = 0; k < n; k++)
                if (!seen[k] && mt_bench_serving_served(f->ch[k], probe) == 1) {
                    seen[k] = 1;
                    left--;
                    lag[nl++] = (mt_mono_s() - c) * 1000;
                }
            if (left) mt_bench_sleep_s(0.002);
        }
        out->lost += left;
    }
    atomic_store(&t->stop, 1);
    pthread_join(t->th, NULL);
    out->probes = (int)nl;
    out->p50 = mt_bench_pct(lag, nl, 0.5);
    out->p99 = mt_bench_pct(lag, nl, 0.99);
    free(lag);
    return t->failed ? -1 : 0;
}

/* Waits up to 30 s for monolith-kafka-dev's bootstrap file; @returns 0 with it in @p bs. */
static int wait_bootstrap(const char *path, pid_t pid, char *bs, size_t len) {
    double t0 = mt_mono_s();
    while (mt_mono_s() - t0 < 30) {
        FILE *f = fopen(path, "r");
        if (f) {
            int ok = fgets(bs, (int)len, f) != NULL;
            fclose(f);
            bs[strcspn(bs, "\r\n")] = 0;
            if (ok && *bs) return 0;
        }
        if (mt_bench_child_exited(pid, NULL)) return -1;
        mt_bench_sleep_s(0.05);
    }
    return -1;
}

int main(int argc, char **argv) {
    int quick = 0, probes = 20;
    double window = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--probes") && i + 1 < argc)
            probes = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--window") && i + 1 < argc)
            window = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: fanout_bench [--quick] [--probes P] [--window S]\n");
            return 2;
        }
    }
    if (quick) {
        probes = 4;
        window = 1;
    }
    const int counts_full[] = {1, 4, 8}, counts_quick[] = {1, 2};
    const int *counts = quick ? counts_quick : counts_full;
    int ncounts = quick ? 2 : 3;
    mt_bench_cleanup_install();
    mt_bench_run_conditions("fanout");
    const char *root = mt_bench_root_create("mt-fanout-bench");
    if (!root) return 1;

    char path[512], log[512], bs[4096], conf[512];
    snprintf(path, sizeof(path), "%s/bootstrap", root);
    snprintf(log, sizeof(log), "%s/kafka.log", root);
    char *kv[] = {MT_KAFKA_BIN, "--topics", "params:1", "--bootstrap-file", path, NULL};
    pid_t kpid = mt_bench_spawn(kv, log);
    if (kpid < 0 || wait_bootstrap(path, kpid, bs, sizeof(bs))) {
        mt_bench_log_tail(log);
        return 1;
    }
    snprintf(conf, sizeof(conf), "%s/bench.conf", root);
    FILE *f = fopen(conf, "w");
    if (!f) return 1;
    fprintf(f,
            "[trainer]\nslots = 1, 2, 3, 4, 5, 6, 7, 8\ndim = %d\nhidden = 32\n\n"
            "[ps]\nthreads = 2\nmax_streams = 12\nsync_max_followers = %d\npublish_ms = 100\n"
            "snapshot_dir =\nexpire_interval_ms = 0\n\n"
            "[serving]\nthreads = 2\nsync_interval_ms = 1000\nsync_stream_ms = 100\n"
            "dense_sync_interval_ms = 1000\nlog_sample_rate = 0\n\n"
            "[kafka]\nbootstrap = %s\nfetch_wait_ms = 20\n",
            DIM, MAX_REPLICAS + 1, bs);
    fclose(f);

    snprintf(path, sizeof(path), "%s/ps.port", root);
    snprintf(log, sizeof(log), "%s/ps.log", root);
    char *pv[] = {MT_PS_BIN,     "--config", conf,          "--listen", "127.0.0.1:0",
                  "--port-file", path,       "--log-level", "warn",     NULL};
    pid_t ps_pid = mt_bench_spawn(pv, log);
    int port = ps_pid < 0 ? -1 : mt_bench_wait_port(path, ps_pid, 30, NULL);
    if (port < 0) {
        mt_bench_log_tail(log);
        return 1;
    }
    char addr[64], cluster[96];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    snprintf(cluster, sizeof(cluster), "cluster.ps=%s", addr);

    const char *pa[1] = {addr};
    mt_psc_config_t pc;
    mt_psc_config_init(&pc);
    pc.addrs = pa;
    pc.num_shards = 1;
    mt_psc_t *psc = NULL;
    if (mt_psc_create(&pc, &psc) != MT_OK) return 1;
    mt_trainer_config_t tc;
    mt_trainer_config_init(&tc);
    tc.nslots = NSLOTS;
    memcpy(tc.slot_ids, g_slots, sizeof(g_slots));
    tc.dim = DIM;
    tc.nhidden = 1;
    tc.hidden[0] = 32;
    mt_trainer_backend_t be;
    mt_trainer_backend_psc(psc, &be);
    tc.backend = &be;
    trainer_ctx_t T;
    memset(&T, 0, sizeof(T));
    T.ids = quick ? 5000 : 50000;
    char err[256] = "";
    if (mt_trainer_create(&tc, &T.tr) != MT_OK ||
        mt_trainer_dense_sync_create(T.tr, psc, 1, &T.ds, err, sizeof(err)) != MT_OK) {
        fprintf(stderr, "fanout_bench: trainer: %s\n", err);
        return 1;
    }
    mt_batch_t bt;
    memset(&bt, 0, sizeof(bt));
    for (uint64_t b = 0; b < (T.ids + 1023) / 1024; b++)
        if (train_batch(&T, &bt, b, 1024)) {
            fprintf(stderr, "fanout_bench: filling the shard failed\n");
            return 1;
        }
    mt_batch_free(&bt);
    T.next = 1000000;

    char extra[1024];
    result_t base;
    if (measure(&T, psc, ps_pid, NULL, window, 0, &base)) return 1;
    snprintf(extra, sizeof(extra),
             "\"mode\":\"none\",\"replicas\":0,\"window_s\":%.1f,\"ids_per_slot\":%llu,"
             "\"slots\":%d,\"dim\":%d,\"publish_ms\":100,\"stream_ms\":100",
             window, (unsigned long long)T.ids, NSLOTS, DIM);
    emit("ps_cpu_cores", base.cpu, "cores", extra);

    const char *modes[2] = {"direct", "kafka"};
    double cpu[2][3] = {{0}}, p99[2][3] = {{0}};
    int failed = 0;
    for (int m = 0; m < 2; m++)
        for (int c = 0; c < ncounts; c++) {
            fleet_t fl;
            result_t r;
            if (fleet_start(&fl, counts[c], conf, cluster, modes[m]) ||
                measure(&T, psc, ps_pid, &fl, window, probes, &r)) {
                fprintf(stderr, "fanout_bench: %s with %d replicas failed\n", modes[m], counts[c]);
                fleet_stop(&fl);
                failed = 1;
                continue;
            }
            fleet_stop(&fl);
            cpu[m][c] = r.cpu;
            p99[m][c] = r.p99;
            snprintf(extra, sizeof(extra),
                     "\"mode\":\"%s\",\"replicas\":%d,\"p50_ms\":%.1f,\"p99_ms\":%.1f,"
                     "\"samples\":%d,\"lost\":%d,\"trainer_steps\":%llu",
                     modes[m], counts[c], r.p50, r.p99, r.probes, r.lost,
                     (unsigned long long)T.steps);
            emit("sync_lag_p99_ms", r.p99, "ms", extra);
            snprintf(extra, sizeof(extra),
                     "\"mode\":\"%s\",\"replicas\":%d,\"baseline_cores\":%.4f,"
                     "\"per_replica_cores\":%.4f,\"window_s\":%.1f",
                     modes[m], counts[c], base.cpu, (r.cpu - base.cpu) / counts[c], window);
            emit("ps_cpu_cores", r.cpu, "cores", extra);
        }
    /* the growth of the shard's CPU from the fewest to the most replicas, per replica added */
    int lo = 0, hi = ncounts - 1;
    for (int m = 0; m < 2 && !failed; m++) {
        snprintf(extra, sizeof(extra),
                 "\"mode\":\"%s\",\"from_replicas\":%d,\"to_replicas\":%d,\"cores_from\":%.4f,"
                 "\"cores_to\":%.4f,\"lag_p99_ms_at_most\":%.1f%s",
                 modes[m], counts[lo], counts[hi], cpu[m][lo], cpu[m][hi], p99[m][hi],
                 m ? ",\"target\":\"flat; lag p99 < 500 ms with 8 replicas\"" : "");
        emit("ps_cpu_per_added_replica_cores",
             (cpu[m][hi] - cpu[m][lo]) / (counts[hi] - counts[lo]), "cores", extra);
    }
    mt_trainer_dense_sync_destroy(T.ds);
    mt_trainer_destroy(T.tr);
    mt_psc_destroy(psc);
    return failed;
}
