/*
 * ps_bench.c - the parameter server over loopback against Redis, and snapshot/restore
 * through the store (issue #3).
 *
 * Prints one JSON object per line: {"bench":"ps","metric":...,"value":...,"unit":...,
 * plus parameters}. Never asserts on time; exits 1 only on a real failure (a call that
 * fails, a process that does not start, values that differ between the systems, a restore
 * that loses rows). What it measures:
 *   1. Lookups of B ids (default 1,000, dim 16 fp32) over gRPC on 127.0.0.1 through the
 *      client library (mt_psc_lookup: routing, dedup, fan-out to the shards with
 *      mt_rpc_call_many, merge), with 1, 4 and 8 client threads each keeping one call in
 *      flight, against monolith-ps clusters of 1 and 2 shards. The shards are real
 *      monolith-ps processes started by this program ("servers":"processes"), each table
 *      pre-filled with --rows ids (training lookups) before the measurement.
 *      Figures: embeddings/s (median of the reps, min and max), calls/s, and p50/p99
 *      latency per call (pooled over the reps).
 *   2. What a user would deploy instead: one redis-server started here (127.0.0.1, a free
 *      port, no persistence) holding the same embeddings as 64-byte binary values under the
 *      8-byte fids, read with MGET of the same B keys by the same number of client threads
 *      (one hiredis connection each). Figures as above, and monolith/redis ratios per
 *      thread count (target of the issue: at least 3x).
 *   3. Snapshot and restore of --snapshot-rows rows (default 10M, dim 16, Adagrad) through
 *      mt_store in this process: save seconds and rows/s (streaming, fsync and ingestion
 *      included); then a gradient on 1 row in 100 and an incremental snapshot of those
 *      changes on top of it (seconds, and its ratio to the whole one of the same run: the
 *      pause a shard's applies take, ps.snapshot_full_every); then load seconds and rows/s
 *      of the chain (whole + incremental) from a cold page cache (the store's files are
 *      dropped from the cache with posix_fadvise first, best effort). The restored table is
 *      checked (row count, and embedding, optimizer state and metadata of a sample of rows,
 *      all of them changed by the incremental one). The issue asks for each under a minute.
 * The systems of part 1 and 2 run side by side and their reps are interleaved, so that the
 * noise of this shared machine falls on all of them alike. Client, servers and Redis share
 * the machine's cores: figures are for loopback on one box, not for a network.
 *
 * Reading the figures (2 vCPU): Redis is bound by its one server thread, and with keys
 * drawn at random from 1M it spends ~1 us per key on cache misses (redis-benchmark's own
 * client gets the same ~1,000 MGET/s there; with 1,000 hot keys it gets ~3,700/s). With
 * 2 shards each call fans out into two half-size calls whose fixed costs (gRPC, the
 * client's plan and merge) compete with a second server process for the same 2 cores, so
 * 2 shards read slower than 1 here; shards pay off when they have cores (machines) of
 * their own.
 *
 * Clean-up: every process started here is stopped at exit (normal, error, or SIGINT /
 * SIGTERM / SIGHUP; PR_SET_PDEATHSIG kills them if this program is killed with SIGKILL),
 * and the temporary directory is removed.
 *
 * Usage: ps_bench [--rows N] [--batch B] [--threads 1,4,8] [--seconds S] [--reps R]
 *                 [--ps-threads T] [--snapshot-rows N (0: skip)] [--no-redis] [--snapshot-only]
 *                 [--redis-server PATH] [--quick]
 * --quick: 50k rows, 0.2 s per measurement, 1 rep, 200k snapshot rows (a CI smoke test).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "bench_util.h"
#include "mt/clock.h"
#include "mt/jemalloc_conf.h"
#include "mt/psclient.h"
#include "mt/store.h"
#include "mt/table.h"

#ifndef MT_PS_BIN
#error "MT_PS_BIN must name the monolith-ps binary"
#endif

#define SLOT        1
#define MAX_THREADS 16

typedef struct opts {
    uint64_t rows;  /* ids in each cluster and in Redis */
    uint32_t dim;   /* fixed: 16 fp32 = 64-byte Redis values */
    uint32_t batch; /* ids per lookup call */
    int threads[8]; /* client thread counts measured */
    int nthreads;
    double seconds;         /* length of one measurement */
    int reps;               /* each figure: median of this many measurements */
    uint32_t ps_threads;    /* rpc worker threads per monolith-ps */
    uint64_t snapshot_rows; /* 0: skip part 3 */
    int snapshot_only;      /* --snapshot-only: part 3 alone */
    int redis;              /* 0: skip part 2 */
    const char *redis_bin;
} opts_t;

/* ============================== helpers ============================== */

/* The i-th id of a key set: random-looking, computable from its index, and distinct for
 * distinct i (a bijection on the 48 value bits: xorshifts and odd multipliers mod 2^48;
 * truncating a 64-bit hash would collide about once in 5 sets of 10M ids). */
static uint64_t key_of(uint64_t i, uint64_t seed) {
    const uint64_t m = (1ull << 48) - 1;
    uint64_t x = (i + seed) & m;
    x ^= x >> 24;
    x = (x * 0x9E3779B97F4Bull) & m;
    x ^= x >> 21;
    x = (x * 0xBF58476D1CE5ull) & m;
    x ^= x >> 24;
    return MT_FID_MAKE(SLOT, x);
}

static void emit(const char *metric, double value, const char *unit, const char *extra) {
    mt_bench_emit("ps", metric, value, unit, extra);
}

/* Percentile of latency samples sorted ascending: v[floor(p * n)]. */
static double samples_pct(const mt_bench_samples_t *s, double p) {
    if (!s->n) return 0;
    size_t i = (size_t)(p * (double)s->n);
    return s->v[i < s->n ? i : s->n - 1];
}

/* ============================== processes ============================== */

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof(a);
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &al) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* ============================== monolith-ps clusters ============================== */

typedef struct cluster {
    uint32_t n;
    pid_t pid[2];
    int port[2];
    char log[2][200];
    mt_psc_t *psc;
} cluster_t;

static int cluster_start(const opts_t *o, uint32_t n, cluster_t *cl) {
    memset(cl, 0, sizeof(*cl));
    cl->n = n;
    char conf[200];
    snprintf(conf, sizeof(conf), "%s/ps%u.conf", mt_bench_root(), n);
    FILE *f = fopen(conf, "w");
    if (!f) {
        fprintf(stderr, "ps_bench: %s: %s\n", conf, strerror(errno));
        return -1;
    }
    fprintf(f,
            "[cluster]\nnum_shards = %u\n"
            "[ps]\nlisten = 127.0.0.1:0\nthreads = %u\nsnapshot_interval_s = 0\n"
            "expire_interval_ms = 0\n"
            "[slot.%d]\ndim = %u\noptimizer = adagrad\n",
            n, o->ps_threads, SLOT, o->dim);
    if (fclose(f) != 0) return -1;
    char portf[2][200];
    for (uint32_t i = 0; i < n; i++) {
        char shard[16];
        snprintf(shard, sizeof(shard), "%u", i);
        snprintf(portf[i], sizeof(portf[i]), "%s/ps%u-%u.port", mt_bench_root(), n, i);
        snprintf(cl->log[i], sizeof(cl->log[i]), "%s/ps%u-%u.log", mt_bench_root(), n, i);
        char *argv[] = {MT_PS_BIN,     "--config", conf,          "--shard", shard,
                        "--port-file", portf[i],   "--log-level", "warn",    NULL};
        cl->pid[i] = mt_bench_spawn(argv, cl->log[i]);
        if (cl->pid[i] < 0) {
            fprintf(stderr, "ps_bench: cannot start %s: %s\n", MT_PS_BIN, strerror(errno));
            return -1;
        }
    }
    for (uint32_t i = 0; i < n; i++) {
        int ws = 0;
        if ((cl->port[i] = mt_bench_wait_port(portf[i], cl->pid[i], 30, &ws)) < 0) {
            fprintf(stderr, "ps_bench: shard %u of %u did not start (status %d); %s:\n", i, n, ws,
                    cl->log[i]);
            mt_bench_log_tail(cl->log[i]);
            return -1;
        }
    }
    char addr[2][32];
    const char *addrs[2];
    for (uint32_t i = 0; i < n; i++) {
        snprintf(addr[i], sizeof(addr[i]), "127.0.0.1:%d", cl->port[i]);
        addrs[i] = addr[i];
    }
    mt_psc_config_t cc;
    mt_psc_config_init(&cc);
    cc.addrs = addrs;
    cc.num_shards = n;
    mt_err_t err = mt_psc_create(&cc, &cl->psc);
    if (err) {
        fprintf(stderr, "ps_bench: client: %s\n", mt_strerror(err));
        return -1;
    }
    return 0;
}

/* Stops the shards with SIGTERM (graceful); @returns -1 if one did not exit 0. */
static int cluster_stop(cluster_t *cl) {
    int rc = 0;
    mt_psc_destroy(cl->psc);
    cl->psc = NULL;
    for (uint32_t i = 0; i < cl->n; i++) {
        if (cl->pid[i] <= 0) continue;
        int ws = mt_bench_child_stop(cl->pid[i], SIGTERM);
        if (ws == -1 || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
            fprintf(stderr, "ps_bench: shard %u of %u ended badly (status %d); %s:\n", i, cl->n, ws,
                    cl->log[i]);
            mt_bench_log_tail(cl->log[i]);
            rc = -1;
        }
        cl->pid[i] = 0;
    }
    return rc;
}

/* Creates the rows of keys[0..rows) with training lookups. @returns seconds, -1 on error. */
static double cluster_fill(const opts_t *o, cluster_t *cl, const uint64_t *keys) {
    uint32_t B = o->batch;
    float *out = malloc((size_t)B * o->dim * sizeof(float));
    uint8_t *found = malloc(B);
    double t0 = mt_mono_s(), sec = -1;
    if (!out || !found) goto out;
    for (uint64_t i = 0; i < o->rows; i += B) {
        uint32_t m = (uint32_t)(o->rows - i < B ? o->rows - i : B);
        mt_rpc_status_t st;
        mt_err_t err =
            mt_psc_lookup(cl->psc, keys + i, m, 1, 0, out, (size_t)m * o->dim, found, &st);
        if (err) {
            fprintf(stderr, "ps_bench: fill of %u shard(s): %s (%s)\n", cl->n, mt_strerror(err),
                    st.message);
            goto out;
        }
        for (uint32_t k = 0; k < m; k++) {
            if (!found[k]) {
                fprintf(stderr, "ps_bench: fill: id %llu got no row\n",
                        (unsigned long long)keys[i + k]);
                goto out;
            }
        }
    }
    sec = mt_mono_s() - t0;
out:
    free(out);
    free(found);
    return sec;
}

/* ============================== redis ============================== */

typedef struct redis {
    pid_t pid;
    int port;
    char log[200];
    char version[32];
} redis_t;

static redisContext *redis_connect(int port, char *err, size_t errlen) {
    struct timeval tv = {2, 0};
    redisContext *rc = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (!rc || rc->err) {
        snprintf(err, errlen, "%s", rc ? rc->errstr : "out of memory");
        redisFree(rc);
        return NULL;
    }
    struct timeval io = {30, 0};
    redisSetTimeout(rc, io);
    return rc;
}

/* Starts redis-server on a free port; waits until it answers PING. */
static int redis_start(const opts_t *o, redis_t *r) {
    memset(r, 0, sizeof(*r));
    snprintf(r->log, sizeof(r->log), "%s/redis.log", mt_bench_root());
    for (int attempt = 0; attempt < 3; attempt++) { /* the free port may be taken meanwhile */
        r->port = free_port();
        if (r->port <= 0) break;
        char port[16];
        snprintf(port, sizeof(port), "%d", r->port);
        char *dir = (char *)mt_bench_root(); /* execvp's argv is not const */
        char *argv[] = {
            (char *)o->redis_bin, "--port", port,          "--bind", "127.0.0.1", "--save", "",
            "--appendonly",       "no",     "--daemonize", "no",     "--dir",     dir,      NULL};
        r->pid = mt_bench_spawn(argv, r->log);
        if (r->pid < 0) break;
        double t0 = mt_mono_s();
        int ws = 0;
        while (mt_mono_s() - t0 < 10) {
            if (mt_bench_child_exited(r->pid, &ws)) {
                r->pid = 0;
                break;
            }
            char err[128];
            redisContext *rc = redis_connect(r->port, err, sizeof(err));
            if (rc) {
                redisReply *rep = redisCommand(rc, "PING");
                int ok = rep && rep->type == REDIS_REPLY_STATUS && !strcmp(rep->str, "PONG");
                freeReplyObject(rep);
                if (ok) {
                    rep = redisCommand(rc, "INFO server");
                    const char *v = rep && rep->type == REDIS_REPLY_STRING
                                        ? strstr(rep->str, "redis_version:")
                                        : NULL;
                    if (v) sscanf(v + 14, "%31[0-9.]", r->version);
                    freeReplyObject(rep);
                    redisFree(rc);
                    return 0;
                }
                redisFree(rc);
            }
            mt_bench_sleep_s(0.02);
        }
        if (r->pid > 0) {
            mt_bench_child_stop(r->pid, SIGKILL);
            r->pid = 0;
        }
        if (WIFEXITED(ws) && WEXITSTATUS(ws) == 127) break; /* not installed */
    }
    fprintf(stderr,
            "ps_bench: redis-server (%s) did not start; install it with scripts/setup.sh or "
            "pass --no-redis. %s:\n",
            o->redis_bin, r->log);
    mt_bench_log_tail(r->log);
    return -1;
}

static void redis_stop(redis_t *r) {
    if (r->pid > 0) mt_bench_child_stop(r->pid, SIGKILL); /* nothing to keep */
    r->pid = 0;
}

/* MGET of @p n fids into @p out (n * dim floats). argv/lens: n + 1 entries of scratch. */
static int redis_mget(redisContext *rc, const uint64_t *fids, uint32_t n, uint32_t dim, float *out,
                      const char **argv, size_t *lens, char *err, size_t errlen) {
    argv[0] = "MGET";
    lens[0] = 4;
    for (uint32_t i = 0; i < n; i++) {
        argv[i + 1] = (const char *)&fids[i];
        lens[i + 1] = sizeof(uint64_t);
    }
    redisReply *r = redisCommandArgv(rc, (int)n + 1, argv, lens);
    if (!r) {
        snprintf(err, errlen, "redis MGET: %s", rc->errstr);
        return -1;
    }
    int rc_ = 0;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != n) {
        snprintf(err, errlen, "redis MGET: unexpected reply type %d (%zu elements)", r->type,
                 r->type == REDIS_REPLY_ARRAY ? r->elements : 0);
        rc_ = -1;
    } else {
        for (uint32_t i = 0; i < n && !rc_; i++) {
            const redisReply *e = r->element[i];
            if (e->type != REDIS_REPLY_STRING || e->len != (size_t)dim * sizeof(float)) {
                snprintf(err, errlen, "redis MGET: key %u: type %d, %zu bytes", i, e->type,
                         e->type == REDIS_REPLY_STRING ? e->len : 0);
                rc_ = -1;
            } else {
                memcpy(out + (size_t)i * dim, e->str, e->len);
            }
        }
    }
    freeReplyObject(r);
    return rc_;
}

/* Copies every row of the monolith cluster into Redis (MSET of B keys per command). */
static int redis_fill(const opts_t *o, int port, cluster_t *cl, const uint64_t *keys, double *sec) {
    uint32_t B = o->batch;
    char err[512] = "";
    float *vals = malloc((size_t)B * o->dim * sizeof(float));
    const char **argv = malloc((2 * (size_t)B + 1) * sizeof(char *));
    size_t *lens = malloc((2 * (size_t)B + 1) * sizeof(size_t));
    redisContext *rc = redis_connect(port, err, sizeof(err));
    int ret = -1;
    double t0 = mt_mono_s();
    if (!vals || !argv || !lens || !rc) goto out;
    for (uint64_t i = 0; i < o->rows; i += B) {
        uint32_t m = (uint32_t)(o->rows - i < B ? o->rows - i : B);
        mt_rpc_status_t st;
        mt_err_t e = mt_psc_lookup(cl->psc, keys + i, m, 0, 0, vals, (size_t)m * o->dim, NULL, &st);
        if (e) {
            snprintf(err, sizeof(err), "lookup: %s (%s)", mt_strerror(e), st.message);
            goto out;
        }
        argv[0] = "MSET";
        lens[0] = 4;
        for (uint32_t k = 0; k < m; k++) {
            argv[1 + 2 * k] = (const char *)&keys[i + k];
            lens[1 + 2 * k] = sizeof(uint64_t);
            argv[2 + 2 * k] = (const char *)(vals + (size_t)k * o->dim);
            lens[2 + 2 * k] = (size_t)o->dim * sizeof(float);
        }
        redisReply *r = redisCommandArgv(rc, 1 + 2 * (int)m, argv, lens);
        int ok = r && r->type == REDIS_REPLY_STATUS;
        if (!ok) snprintf(err, sizeof(err), "MSET: %s", r ? (r->str ? r->str : "?") : rc->errstr);
        freeReplyObject(r);
        if (!ok) goto out;
    }
    redisReply *r = redisCommand(rc, "DBSIZE");
    if (!r || r->type != REDIS_REPLY_INTEGER || (uint64_t)r->integer != o->rows) {
        snprintf(err, sizeof(err), "DBSIZE is %lld, not %llu", r ? r->integer : -1LL,
                 (unsigned long long)o->rows);
        freeReplyObject(r);
        goto out;
    }
    freeReplyObject(r);
    *sec = mt_mono_s() - t0;
    ret = 0;
out:
    if (ret) fprintf(stderr, "ps_bench: filling redis: %s\n", err);
    redisFree(rc);
    free(vals);
    free(argv);
    free(lens);
    return ret;
}

/* ============================== lookup measurement ============================== */

enum { SYS_PS1, SYS_PS2, SYS_REDIS, NSYS };
static const char *const sys_name[NSYS] = {"monolith", "monolith", "redis"};
static const uint32_t sys_shards[NSYS] = {1, 2, 1};

typedef struct bench {
    opts_t o;
    uint64_t *keys; /* [rows] */
    uint64_t *pool; /* [nbatch * batch]: query batches, distinct ids within a batch */
    size_t nbatch;
    cluster_t cl[2]; /* 1 shard, 2 shards */
    redis_t redis;
    redisContext *rcs[MAX_THREADS]; /* one connection per client thread */
    size_t next_batch;              /* where the next measurement starts in the pool */
} bench_t;

typedef struct worker {
    const bench_t *b;
    int sys;
    mt_psc_t *psc;
    redisContext *rc;
    atomic_int *stop;
    size_t next; /* batch index */
    mt_bench_samples_t *lat;
    uint64_t calls;
    int failed;
    char err[320];
} worker_t;

static void *worker_run(void *arg) {
    worker_t *w = arg;
    const opts_t *o = &w->b->o;
    uint32_t B = o->batch;
    float *out = malloc((size_t)B * o->dim * sizeof(float));
    const char **argv = malloc(((size_t)B + 1) * sizeof(char *));
    size_t *lens = malloc(((size_t)B + 1) * sizeof(size_t));
    if (!out || !argv || !lens) {
        w->failed = 1;
        snprintf(w->err, sizeof(w->err), "out of memory");
        goto out;
    }
    while (!atomic_load_explicit(w->stop, memory_order_relaxed)) {
        const uint64_t *fids = w->b->pool + (w->next % w->b->nbatch) * B;
        w->next++;
        double t0 = mt_mono_s();
        if (w->sys == SYS_REDIS) {
            if (redis_mget(w->rc, fids, B, o->dim, out, argv, lens, w->err, sizeof(w->err))) {
                w->failed = 1;
                break;
            }
        } else {
            mt_rpc_status_t st;
            mt_err_t err = mt_psc_lookup(w->psc, fids, B, 0, 0, out, (size_t)B * o->dim, NULL, &st);
            if (err) {
                snprintf(w->err, sizeof(w->err), "lookup: %s (status %d: %s)", mt_strerror(err),
                         st.code, st.message);
                w->failed = 1;
                break;
            }
        }
        double us = (mt_mono_s() - t0) * 1e6;
        if (w->lat && mt_bench_samples_push(w->lat, us)) {
            w->failed = 1;
            snprintf(w->err, sizeof(w->err), "out of memory");
            break;
        }
        w->calls++;
    }
out:
    free(out);
    free(argv);
    free(lens);
    return NULL;
}

/* One measurement: @p nthreads clients for o.seconds. Appends latencies to @p lat (NULL:
 * warm-up). @returns embeddings/s, or -1 on a failed call. */
static double measure(bench_t *b, int sys, int nthreads, double seconds, mt_bench_samples_t *lat) {
    worker_t w[MAX_THREADS];
    mt_bench_samples_t wl[MAX_THREADS];
    pthread_t th[MAX_THREADS];
    atomic_int stop;
    atomic_init(&stop, 0);
    memset(wl, 0, sizeof(wl));
    for (int i = 0; i < nthreads; i++) {
        w[i] = (worker_t){.b = b,
                          .sys = sys,
                          .psc = sys == SYS_REDIS ? NULL : b->cl[sys == SYS_PS2].psc,
                          .rc = sys == SYS_REDIS ? b->rcs[i] : NULL,
                          .stop = &stop,
                          .next = b->next_batch + (size_t)i * (b->nbatch / (size_t)nthreads),
                          .lat = lat ? &wl[i] : NULL};
    }
    double t0 = mt_mono_s();
    int started = 0;
    for (int i = 0; i < nthreads; i++) {
        if (pthread_create(&th[i], NULL, worker_run, &w[i]) != 0) break;
        started++;
    }
    if (started == nthreads) mt_bench_sleep_s(seconds);
    atomic_store(&stop, 1);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    double sec = mt_mono_s() - t0;
    b->next_batch += 37; /* each measurement starts elsewhere in the pool */
    uint64_t calls = 0;
    int failed = started != nthreads;
    for (int i = 0; i < started; i++) {
        calls += w[i].calls;
        if (w[i].failed) {
            fprintf(stderr, "ps_bench: %s (%u shard(s)), thread %d: %s\n", sys_name[sys],
                    sys_shards[sys], i, w[i].err);
            failed = 1;
        }
        if (lat)
            for (size_t k = 0; k < wl[i].n && !failed; k++)
                if (mt_bench_samples_push(lat, wl[i].v[k])) failed = 1;
        free(wl[i].v);
    }
    if (failed) return -1;
    return (double)calls * b->o.batch / sec;
}

/* Checks that both clusters and Redis answer the same embeddings for a few batches. */
static int check_same_values(bench_t *b) {
    const opts_t *o = &b->o;
    size_t nf = (size_t)o->batch * o->dim;
    float *v[NSYS];
    const char **argv = malloc(((size_t)o->batch + 1) * sizeof(char *));
    size_t *lens = malloc(((size_t)o->batch + 1) * sizeof(size_t));
    int ret = -1;
    for (int s = 0; s < NSYS; s++)
        v[s] = malloc(nf * sizeof(float));
    if (!argv || !lens || !v[0] || !v[1] || !v[2]) goto out;
    for (size_t k = 0; k < 4 && k < b->nbatch; k++) {
        const uint64_t *fids = b->pool + k * (b->nbatch / 4) * o->batch;
        for (int s = 0; s < NSYS; s++) {
            char err[512] = "";
            if (s == SYS_REDIS) {
                if (!o->redis) continue;
                if (redis_mget(b->rcs[0], fids, o->batch, o->dim, v[s], argv, lens, err,
                               sizeof(err))) {
                    fprintf(stderr, "ps_bench: check: %s\n", err);
                    goto out;
                }
            } else {
                mt_rpc_status_t st;
                mt_err_t e = mt_psc_lookup(b->cl[s].psc, fids, o->batch, 0, 0, v[s], nf, NULL, &st);
                if (e) {
                    fprintf(stderr, "ps_bench: check: lookup: %s (%s)\n", mt_strerror(e),
                            st.message);
                    goto out;
                }
            }
            if (s && memcmp(v[0], v[s], nf * sizeof(float))) {
                fprintf(stderr,
                        "ps_bench: %s with %u shard(s) answers other embeddings than "
                        "monolith with 1 shard\n",
                        sys_name[s], sys_shards[s]);
                goto out;
            }
        }
    }
    ret = 0;
out:
    for (int s = 0; s < NSYS; s++)
        free(v[s]);
    free(argv);
    free(lens);
    return ret;
}

static int lookup_bench(bench_t *b) {
    opts_t *o = &b->o;
    char extra[768];
    int nsys = o->redis ? NSYS : SYS_REDIS;

    /* Keys, and query batches: consecutive slices of a shuffled copy of the keys. */
    b->keys = malloc(o->rows * sizeof(uint64_t));
    b->nbatch = o->rows / o->batch < 256 ? o->rows / o->batch : 256;
    b->pool = malloc(b->nbatch * o->batch * sizeof(uint64_t));
    uint64_t *perm = malloc(o->rows * sizeof(uint64_t));
    if (!b->keys || !b->pool || !perm) {
        free(perm);
        fprintf(stderr, "ps_bench: out of memory\n");
        return -1;
    }
    for (uint64_t i = 0; i < o->rows; i++)
        perm[i] = b->keys[i] = key_of(i, 0x5eed);
    uint64_t rng = 42;
    for (uint64_t i = o->rows - 1; i > 0; i--) {
        uint64_t j = mt_bench_mix64(rng++ + MT_BENCH_GOLDEN64) % (i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    memcpy(b->pool, perm, b->nbatch * o->batch * sizeof(uint64_t));
    free(perm);

    /* The systems, side by side. */
    for (uint32_t n = 1; n <= 2; n++) {
        cluster_t *cl = &b->cl[n - 1];
        double t0 = mt_mono_s();
        if (cluster_start(o, n, cl)) return -1;
        double start_s = mt_mono_s() - t0;
        double fill_s = cluster_fill(o, cl, b->keys);
        if (fill_s < 0) return -1;
        snprintf(extra, sizeof(extra),
                 "\"system\":\"monolith\",\"servers\":\"processes\",\"shards\":%u,\"rows\":%llu,"
                 "\"dim\":%u,\"batch\":%u,\"how\":\"training lookups, one thread\","
                 "\"start_s\":%.3f",
                 n, (unsigned long long)o->rows, o->dim, o->batch, start_s);
        emit("fill_rows_per_s", (double)o->rows / fill_s, "rows/s", extra);
    }
    if (o->redis) {
        if (redis_start(o, &b->redis)) return -1;
        double fill_s = 0;
        if (redis_fill(o, b->redis.port, &b->cl[0], b->keys, &fill_s)) return -1;
        snprintf(extra, sizeof(extra),
                 "\"system\":\"redis\",\"redis\":\"%s\",\"rows\":%llu,\"value_bytes\":%u,"
                 "\"how\":\"lookup from monolith + MSET of %u keys, one client\"",
                 b->redis.version, (unsigned long long)o->rows, o->dim * 4, o->batch);
        emit("fill_rows_per_s", (double)o->rows / fill_s, "rows/s", extra);
        int maxt = 0;
        for (int i = 0; i < o->nthreads; i++)
            if (o->threads[i] > maxt) maxt = o->threads[i];
        for (int i = 0; i < maxt; i++) {
            char err[128];
            if (!(b->rcs[i] = redis_connect(b->redis.port, err, sizeof(err)))) {
                fprintf(stderr, "ps_bench: redis connect: %s\n", err);
                return -1;
            }
        }
    }
    if (check_same_values(b)) return -1;

    /* Warm-up (connections, caches), then the reps interleaved over systems. */
    mt_bench_rates_t rate[8][NSYS];
    mt_bench_samples_t lat[8][NSYS];
    memset(rate, 0, sizeof(rate));
    memset(lat, 0, sizeof(lat));
    int ret = -1;
    for (int s = 0; s < nsys; s++)
        if (measure(b, s, o->threads[o->nthreads - 1], o->seconds / 2, NULL) < 0) goto out;
    for (int rep = 0; rep < o->reps; rep++) {
        for (int ti = 0; ti < o->nthreads; ti++) {
            for (int s = 0; s < nsys; s++) {
                double r = measure(b, s, o->threads[ti], o->seconds, &lat[ti][s]);
                if (r < 0) goto out;
                rate[ti][s].v[rate[ti][s].n++] = r;
            }
        }
    }
    double med[8][NSYS];
    for (int ti = 0; ti < o->nthreads; ti++) {
        for (int s = 0; s < nsys; s++) {
            mt_bench_rates_t *r = &rate[ti][s];
            mt_bench_samples_t *l = &lat[ti][s];
            med[ti][s] = mt_bench_rates_median(r);
            mt_bench_sort(l->v, l->n);
            extra[0] = 0;
            mt_bench_appendf(extra, sizeof(extra), "\"system\":\"%s\",", sys_name[s]);
            if (s == SYS_REDIS)
                mt_bench_appendf(
                    extra, sizeof(extra),
                    "\"servers\":\"redis-server %s, one process\",\"client\":\"hiredis MGET\",",
                    b->redis.version);
            else
                mt_bench_appendf(extra, sizeof(extra),
                                 "\"servers\":\"processes\",\"client\":\"mt_psc_lookup\","
                                 "\"ps_threads\":%u,",
                                 o->ps_threads);
            mt_bench_appendf(extra, sizeof(extra),
                             "\"shards\":%u,\"threads\":%d,\"in_flight_per_thread\":1,\"batch\":%u,"
                             "\"dim\":%u,\"rows\":%llu",
                             sys_shards[s], o->threads[ti], o->batch, o->dim,
                             (unsigned long long)o->rows);
            size_t base = strlen(extra);
            mt_bench_appendf(extra, sizeof(extra),
                             ",\"calls_per_s\":%.6g,\"p50_us\":%.1f,\"p99_us\":%.1f,\"min\":%.6g,"
                             "\"max\":%.6g,\"reps\":%d,\"seconds\":%.3g",
                             med[ti][s] / o->batch, samples_pct(l, 0.5), samples_pct(l, 0.99),
                             r->v[0], r->v[r->n - 1], r->n, o->seconds);
            emit("lookup_embeddings_per_s", med[ti][s], "embeddings/s", extra);
            extra[base] = 0;
            mt_bench_appendf(extra, sizeof(extra), ",\"calls\":%zu", l->n);
            emit("lookup_latency_p50", samples_pct(l, 0.5), "us", extra);
            emit("lookup_latency_p99", samples_pct(l, 0.99), "us", extra);
        }
    }
    if (o->redis) {
        for (int ti = 0; ti < o->nthreads; ti++) {
            for (int s = SYS_PS1; s <= SYS_PS2; s++) {
                snprintf(extra, sizeof(extra),
                         "\"shards\":%u,\"threads\":%d,\"batch\":%u,\"dim\":%u,\"rows\":%llu,"
                         "\"monolith\":%.6g,\"redis\":%.6g,\"target\":3",
                         sys_shards[s], o->threads[ti], o->batch, o->dim,
                         (unsigned long long)o->rows, med[ti][s], med[ti][SYS_REDIS]);
                emit("monolith_over_redis", med[ti][s] / med[ti][SYS_REDIS], "ratio", extra);
            }
        }
    }
    ret = 0;
out:
    for (int ti = 0; ti < 8; ti++)
        for (int s = 0; s < NSYS; s++)
            free(lat[ti][s].v);
    return ret;
}

static int lookup_teardown(bench_t *b) {
    int rc = 0;
    for (int i = 0; i < MAX_THREADS; i++) {
        redisFree(b->rcs[i]);
        b->rcs[i] = NULL;
    }
    redis_stop(&b->redis);
    for (int i = 0; i < 2; i++)
        if (b->cl[i].n && cluster_stop(&b->cl[i])) rc = -1;
    free(b->keys);
    free(b->pool);
    b->keys = b->pool = NULL;
    return rc;
}

/* ============================== snapshot and restore ============================== */

typedef struct fill_job {
    mt_table_t *t;
    uint64_t from, to;
    uint32_t dim;
    mt_err_t err;
} fill_job_t;

static void *fill_run(void *arg) {
    fill_job_t *j = arg;
    enum { FB = 1000 };
    uint64_t fids[FB];
    float *out = malloc((size_t)FB * j->dim * sizeof(float));
    if (!out) {
        j->err = MT_NOMEM;
        return NULL;
    }
    for (uint64_t i = j->from; i < j->to && !j->err; i += FB) {
        uint32_t m = (uint32_t)(j->to - i < FB ? j->to - i : FB);
        for (uint32_t k = 0; k < m; k++)
            fids[k] = key_of(i + k, 0x5a7e);
        j->err = mt_table_lookup(j->t, fids, m, out, (size_t)m * j->dim, NULL, MT_TABLE_TRAIN, 1000,
                                 NULL);
    }
    free(out);
    return NULL;
}

/* The process's peak resident memory so far (VmHWM), in MiB; 0 if unknown. */
static double peak_rss_mb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = 0;
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, "VmHWM:", 6)) kb = atof(line + 6);
    if (f) fclose(f);
    return kb / 1024;
}

static uint64_t g_du_bytes; /* nftw callbacks take no user data */

static int du_cb(const char *path, const struct stat *sb, int type, struct FTW *ftw) {
    (void)ftw;
    if (type != FTW_F) return 0;
    g_du_bytes += (uint64_t)sb->st_size;
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        /* Clean pages only (the store fsynced its files): drop them, so that the load reads
         * the disk as a restart would. Best effort: the kernel may keep some. */
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
    return 0;
}

typedef struct sample_row {
    uint64_t fid;
    float emb[16], state[16];
    uint32_t touch, count;
    uint64_t version;
} sample_row_t;

enum { NSAMPLE = 1000 };

static int snapshot_bench(const opts_t *o) {
    char err[512] = "", extra[512], dir[200];
    int ret = -1;
    mt_table_t *t = NULL;
    mt_store_t *s = NULL;
    sample_row_t *sample = calloc(NSAMPLE, sizeof(*sample));
    uint64_t rows = o->snapshot_rows;
    snprintf(dir, sizeof(dir), "%s/store", mt_bench_root());

    mt_table_slot_config_t sc;
    mt_table_slot_config_init(&sc, SLOT, o->dim);
    sc.opt = MT_OPT_ADAGRAD;
    mt_table_config_t tc;
    mt_table_config_init(&tc);
    tc.slots = &sc;
    tc.nslots = 1;
    tc.initial_rows = rows;
    mt_err_t e = sample ? mt_table_create(&tc, &t) : MT_NOMEM;
    if (e) {
        snprintf(err, sizeof(err), "create: %s", mt_strerror(e));
        goto out;
    }

    /* Rows: training lookups on 2 threads; then a gradient on the sample rows, so their
     * optimizer state is not the initial one. */
    fill_job_t jobs[2];
    pthread_t th[2];
    double t0 = mt_mono_s();
    for (int i = 0; i < 2; i++) {
        jobs[i] = (fill_job_t){.t = t,
                               .from = rows * (uint64_t)i / 2,
                               .to = rows * (uint64_t)(i + 1) / 2,
                               .dim = o->dim};
        pthread_create(&th[i], NULL, fill_run, &jobs[i]);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    double fill_s = mt_mono_s() - t0;
    for (int i = 0; i < 2; i++) {
        if (jobs[i].err) {
            snprintf(err, sizeof(err), "fill: %s", mt_strerror(jobs[i].err));
            goto out;
        }
    }
    uint64_t sfids[NSAMPLE];
    float grads[NSAMPLE * 16];
    for (int i = 0; i < NSAMPLE; i++) {
        sfids[i] = key_of((uint64_t)i * (rows / NSAMPLE), 0x5a7e);
        for (uint32_t d = 0; d < o->dim; d++)
            grads[i * o->dim + d] = 0.01f * (float)((i + (int)d) % 13) - 0.06f;
    }
    mt_table_op_stats_t ops = {0};
    e = mt_table_apply(t, sfids, NSAMPLE, grads, (size_t)NSAMPLE * o->dim, 2000, &ops);
    if (e || ops.found != NSAMPLE) {
        snprintf(err, sizeof(err), "apply: %s, %llu of %d rows found", mt_strerror(e),
                 (unsigned long long)ops.found, NSAMPLE);
        goto out;
    }
    uint32_t nstate = 0;
    mt_table_state_floats(t, sfids[0], &nstate);
    if (nstate > 16 || o->dim > 16) {
        snprintf(err, sizeof(err), "the sample holds 16 floats, not %u", nstate);
        goto out;
    }
    for (int i = 0; i < NSAMPLE; i++) {
        sample[i].fid = sfids[i];
        e = mt_table_get_row(t, sfids[i], sample[i].emb, sample[i].state, nstate, &sample[i].touch,
                             &sample[i].count, &sample[i].version);
        if (e) {
            snprintf(err, sizeof(err), "get_row: %s", mt_strerror(e));
            goto out;
        }
    }
    mt_table_stats_t ts;
    mt_table_stats(t, &ts);
    if (ts.rows != rows) {
        snprintf(err, sizeof(err), "table has %llu rows, not %llu", (unsigned long long)ts.rows,
                 (unsigned long long)rows);
        goto out;
    }
    snprintf(extra, sizeof(extra),
             "\"rows\":%llu,\"dim\":%u,\"optimizer\":\"adagrad\",\"threads\":2,"
             "\"how\":\"training lookups, presized, in process\",\"table_bytes\":%llu,"
             "\"peak_rss_mb\":%.0f",
             (unsigned long long)rows, o->dim, (unsigned long long)ts.bytes_total, peak_rss_mb());
    emit("snapshot_table_fill_rows_per_s", (double)rows / fill_s, "rows/s", extra);

    /* Save. */
    mt_bench_cond_t cond;
    mt_bench_cond_start(&cond);
    mt_store_config_t stc;
    mt_store_config_init(&stc);
    stc.keep = 1;
    if ((e = mt_store_open(dir, &stc, &s, err, sizeof(err))) != MT_OK) goto out;
    mt_store_table_t st = {.name = "sparse", .table = t};
    mt_store_result_t res;
    memset(&res, 0, sizeof(res));
    uint64_t v1 = mt_table_changes_cursor(t);
    if ((e = mt_store_save(s, 1, &st, 1, NULL, 0, &res, err, sizeof(err))) != MT_OK) goto out;
    g_du_bytes = 0;
    nftw(dir, du_cb, 16, FTW_PHYS);
    snprintf(extra, sizeof(extra),
             "\"rows\":%llu,\"dim\":%u,\"optimizer\":\"adagrad\",\"rows_per_s\":%.6g,"
             "\"stream_bytes\":%llu,\"disk_bytes\":%llu,\"chunks\":%llu,\"stream_s\":%.3f,"
             "\"durable_s\":%.3f,\"prune_s\":%.3f,\"peak_rss_mb\":%.0f,\"limit_s\":60",
             (unsigned long long)res.rows, o->dim, (double)res.rows / res.seconds,
             (unsigned long long)res.bytes, (unsigned long long)g_du_bytes,
             (unsigned long long)res.chunks, res.stream_s, res.durable_s, res.prune_s,
             peak_rss_mb());
    emit("snapshot_save_s", res.seconds, "s", extra);
    mt_bench_cond_emit("ps", "snapshot_save", &cond);

    /* Incremental: a gradient on 1 row in CHURN (the sample rows among them), then a
     * snapshot of the changes only, on top of the whole one. */
    enum { CHURN = 100 };
    uint64_t nchurn = 0;
    {
        enum { CB = 1000 };
        uint64_t cf[CB];
        float *cg = malloc((size_t)CB * o->dim * sizeof(float));
        if (!cg) {
            e = MT_NOMEM;
            goto out;
        }
        for (uint64_t i = 0; i < rows && !e; i += (uint64_t)CB * CHURN) {
            uint32_t m = 0;
            for (uint64_t r = i; r < rows && m < CB; r += CHURN)
                cf[m++] = key_of(r, 0x5a7e);
            for (size_t k = 0; k < (size_t)m * o->dim; k++)
                cg[k] = 0.001f * (float)(k % 17) - 0.008f;
            e = mt_table_apply(t, cf, m, cg, (size_t)m * o->dim, 3000, NULL);
            nchurn += m;
        }
        free(cg);
        if (e) {
            snprintf(err, sizeof(err), "churn: %s", mt_strerror(e));
            goto out;
        }
    }
    for (int i = 0; i < NSAMPLE; i++) { /* the rows as the restore must give them back */
        e = mt_table_get_row(t, sfids[i], sample[i].emb, sample[i].state, nstate, &sample[i].touch,
                             &sample[i].count, &sample[i].version);
        if (e) {
            snprintf(err, sizeof(err), "get_row: %s", mt_strerror(e));
            goto out;
        }
    }
    mt_bench_cond_start(&cond);
    mt_store_table_t sti = {.name = "sparse", .table = t, .since = v1};
    mt_store_result_t ires;
    memset(&ires, 0, sizeof(ires));
    if ((e = mt_store_save(s, 2, &sti, 1, NULL, 0, &ires, err, sizeof(err))) != MT_OK) goto out;
    snprintf(extra, sizeof(extra),
             "\"rows\":%llu,\"changed_rows\":%llu,\"dim\":%u,\"stream_bytes\":%llu,"
             "\"stream_s\":%.3f,\"durable_s\":%.3f,\"whole_s\":%.4f,\"ratio_to_whole\":%.4f,"
             "\"floor\":\"the whole snapshot of the same table in this run\"",
             (unsigned long long)rows, (unsigned long long)nchurn, o->dim,
             (unsigned long long)ires.bytes, ires.stream_s, ires.durable_s, res.seconds,
             ires.seconds / res.seconds);
    emit("snapshot_incremental_save_s", ires.seconds, "s", extra);
    mt_bench_cond_emit("ps", "snapshot_incremental_save", &cond);
    mt_store_close(s);
    s = NULL;
    mt_table_destroy(t); /* free the memory: the restore builds a table of its own */
    t = NULL;

    /* Restore (cold page cache, best effort: du_cb dropped the files' pages). */
    mt_bench_cond_start(&cond);
    t0 = mt_mono_s();
    stc.create_if_missing = 0;
    if ((e = mt_store_open(dir, &stc, &s, err, sizeof(err))) != MT_OK) goto out;
    double open_s = mt_mono_s() - t0;
    uint64_t id = 0;
    if ((e = mt_store_load_latest(s, "sparse", &tc, &t, &id, err, sizeof(err))) != MT_OK) goto out;
    double load_s = mt_mono_s() - t0;
    mt_table_stats(t, &ts);
    if (ts.rows != rows || id != 2) {
        snprintf(err, sizeof(err), "restored %llu rows of checkpoint %llu, want %llu of 2",
                 (unsigned long long)ts.rows, (unsigned long long)id, (unsigned long long)rows);
        e = MT_CORRUPT;
        goto out;
    }
    for (int i = 0; i < NSAMPLE; i++) {
        sample_row_t got;
        memset(&got, 0, sizeof(got));
        e = mt_table_get_row(t, sample[i].fid, got.emb, got.state, nstate, &got.touch, &got.count,
                             &got.version);
        if (e || memcmp(got.emb, sample[i].emb, sizeof(got.emb)) ||
            memcmp(got.state, sample[i].state, sizeof(got.state)) || got.touch != sample[i].touch ||
            got.count != sample[i].count || got.version != sample[i].version) {
            snprintf(err, sizeof(err), "restored row %llu differs (%s)",
                     (unsigned long long)sample[i].fid, mt_strerror(e));
            e = MT_CORRUPT;
            goto out;
        }
    }
    snprintf(extra, sizeof(extra),
             "\"rows\":%llu,\"dim\":%u,\"optimizer\":\"adagrad\",\"rows_per_s\":%.6g,"
             "\"open_s\":%.3f,\"page_cache\":\"dropped (posix_fadvise)\",\"verified_rows\":%d,"
             "\"chain\":\"whole + 1 incremental\","
             "\"peak_rss_mb\":%.0f,\"limit_s\":60",
             (unsigned long long)rows, o->dim, (double)rows / load_s, open_s, NSAMPLE,
             peak_rss_mb());
    emit("restore_load_s", load_s, "s", extra);
    mt_bench_cond_emit("ps", "restore", &cond);
    ret = 0;
out:
    if (ret) fprintf(stderr, "ps_bench: snapshot: %s\n", err[0] ? err : mt_strerror(e));
    mt_store_close(s);
    mt_table_destroy(t);
    free(sample);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    int rc = system(cmd);
    (void)rc;
    return ret;
}

/* ============================== main ============================== */

static void usage(void) {
    fprintf(stderr, "usage: ps_bench [--rows N] [--batch B] [--threads 1,4,8] [--seconds S] "
                    "[--reps R]\n"
                    "                [--ps-threads T] [--snapshot-rows N (0: skip)] "
                    "[--no-redis] [--snapshot-only]\n"
                    "                [--redis-server PATH] [--quick]\n");
    exit(2);
}

static int parse_threads(opts_t *o, const char *s) {
    o->nthreads = 0;
    char *end;
    while (*s && o->nthreads < 8) {
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > MAX_THREADS) return -1;
        o->threads[o->nthreads++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return o->nthreads ? 0 : -1;
}

int main(int argc, char **argv) {
    static bench_t b; /* large; zeroed */
    opts_t *o = &b.o;
    *o = (opts_t){.rows = 1000000,
                  .dim = 16,
                  .batch = 1000,
                  .threads = {1, 4, 8},
                  .nthreads = 3,
                  .seconds = 2.0,
                  .reps = 3,
                  .ps_threads = 4,
                  .snapshot_rows = 10000000,
                  .redis = 1,
                  .redis_bin = "redis-server"};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            o->rows = 50000;
            o->seconds = 0.2;
            o->reps = 1;
            o->snapshot_rows = 200000;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick")) continue;
        if (!strcmp(a, "--no-redis")) {
            o->redis = 0;
            continue;
        }
        if (!strcmp(a, "--snapshot-only")) {
            o->snapshot_only = 1;
            continue;
        }
        if (!v) usage();
        i++;
        if (!strcmp(a, "--rows"))
            o->rows = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--batch"))
            o->batch = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--threads")) {
            if (parse_threads(o, v)) usage();
        } else if (!strcmp(a, "--seconds"))
            o->seconds = atof(v);
        else if (!strcmp(a, "--reps"))
            o->reps = atoi(v);
        else if (!strcmp(a, "--ps-threads"))
            o->ps_threads = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--snapshot-rows"))
            o->snapshot_rows = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--redis-server"))
            o->redis_bin = v;
        else
            usage();
    }
    if (o->reps < 1 || o->reps > 32 || o->batch < 1 || o->batch > 100000 || o->rows < o->batch ||
        o->seconds <= 0 || o->seconds > 600 || o->ps_threads < 1 || o->ps_threads > 64 ||
        (o->snapshot_rows && o->snapshot_rows < NSAMPLE))
        usage();

    if (!mt_bench_root_create("mt-ps-bench")) {
        fprintf(stderr, "ps_bench: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    /* Stops what is left and removes the directory at exit and on a signal; SIGPIPE
     * ignored: a dead redis is an error from hiredis, not a signal. */
    mt_bench_cleanup_install();
    mt_bench_run_conditions("ps");

    double t0 = mt_mono_s();
    int rc = 0;
    if (!o->snapshot_only) {
        rc = lookup_bench(&b);
        if (lookup_teardown(&b)) rc = -1;
    }
    if (rc == 0 && o->snapshot_rows) rc = snapshot_bench(o);
    fprintf(stderr, "ps_bench: %s in %.1f s\n", rc ? "FAILED" : "done", mt_mono_s() - t0);
    return rc ? 1 : 0; /* the atexit hook stops what is left and removes the directory */
}
