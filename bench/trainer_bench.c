/*
 * trainer_bench.c - training throughput of the DeepFM step: 26 slots, dim 16,
 * MLP 256-128, one id per slot and example, batches of 512. Figures, one JSON object per
 * line (never asserts on time):
 *   - sgemm_gflops and compute_floor_examples_per_s: what OpenBLAS reaches on the MLP's
 *     largest shape on one core, measured first; every rate also says vs_compute_floor
 *     (per thread) so the gap stays visible on a noisy machine; both also by the threads'
 *     CPU time (cpu_gflops, per_thread_cpu, vs_compute_floor_cpu: a core shared with other
 *     processes slows the wall clock, much less the CPU-time figures);
 *   - train_examples_per_s, phase "cold": a stream over 1M ids per slot whose ids are
 *     mostly new (new_row_share says how many lookups create a row): measures row creation
 *     (page faults of fresh memory, slab and bucket growth) as much as training;
 *   - train_examples_per_s, phase "warm": Zipf(1.05) over 1M ids per slot after an
 *     untimed warm-up pass of as many examples: most ids have a row, as in a steady stream;
 *   - each with 1 thread (a trainer and its own table) and 2 threads (two trainers, each
 *     its dense model, on one shared table: hogwild on the sparse part);
 *   - the warm one-thread step again with the table pre-sized (backend "local table,
 *     pre-sized": bucket arrays and rows' memory taken at create for the rows the grown run
 *     ended with and a quarter more, as PyTorch's table is made whole before it trains;
 *     vs_grown), unless --initial-rows pre-sized every run; then the same pipelined
 *     (threads 2, pipelined and prefetch true: the trainer's pipeline thread looks the next
 *     batch up and applies this step's gradients while the step computes, one step stale,
 *     as trainer.pipelined does; vs_unpipelined);
 *   - model "dcnv2" (3 cross layers, full rank and rank 64; --quick: rank 64 only), "mmoe" (2
 *     tasks, 4 experts of 64, towers 256-128; labels of two tasks) and "din" (a 27th slot of
 *     20 behaviours, Zipf ids of the item slot 2, attended by slot 2 with width 32), warm,
 *     1 thread, each with its own compute floor (its sgemm FLOPs: the MLP's plus the cross
 *     layers', the experts', gates' and towers', or the attention layer's per behaviour)
 *     and vs_deepfm;
  *   - pytorch_examples_per_s: a plain PyTorch DeepFM of the same shapes and optimizers on
 *     the warm stream (bench/pytorch_deepfm.py, one thread, run by /usr/bin/python3 when
 *     Debian's python3-torch is installed; otherwise a line saying why it is missing), one
 *     run after each of our pre-sized runs (alternating, so that a drift of the machine's
 *     speed moves both sides of a pair alike; after all of ours with --initial-rows), and
 *     vs_pytorch: the median of the pairs' ratios, ours pre-sized over PyTorch (both tables
 *     pre-sized; pair_min, pair_max and ratio_of_medians beside it), with grown_vs_pytorch
 *     (ours grown from empty); then the two cores each side: PyTorch on two intra-op
 *     threads (its BLAS on one; threads 2), one run after each of our pipelined runs, and
 *     vs_pytorch with threads 2: the pairs' median of our pipelined figure over the better
 *     of PyTorch's one- and two-thread runs of the pair (vs_pytorch_two_threads beside it);
 *   - the cold stream with one PS shard over loopback (a monolith-ps process), one
 *     thread: steps one after another, then pipelined (mt_trainer_set_pipelined: the
 *     apply of a step in flight while the next one computes), then with prefetched
 *     lookups, each on a fresh shard, with its ratio to the local table's cold figure (by
 *     the wall clock, and by CPU time per example: the trainer's own, and the trainer's
 *     plus the shard's).
 * Batches are made before the clock starts. OpenBLAS runs one thread per caller.
 * --initial-rows N pre-sizes the local table's bucket arrays (mt_trainer_config_t
 * table_initial_rows) so that a run measures no bucket-array growth; each figure says the
 * table's rows at its end ("rows"), the size to pass (default 0: grown from empty).
 *
 * Usage: trainer_bench [--examples N] [--batch B] [--reps R] [--threads 1|2]
  *                      [--phase cold|warm] [--initial-rows N] [--no-ps] [--no-pytorch]
 *                      [--deepfm-only] [--quick]
 * --deepfm-only leaves out the other model families (dcnv2, mmoe, din).
 * A figure is the median of R runs (default 1); examples are per thread.
 */
#include <cblas.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "mt/clock.h"
#include "mt/jemalloc_conf.h"
#include "mt/psclient.h"
#include "mt/trainer.h"
#include "mt/zipf.h"

#define NSLOTS 26
#define DIM    16

/* CPU time of the calling thread: on a shared machine the share of a core another process
 * takes does not count against us (caches and memory bandwidth still do). */
static double process_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double thread_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A skewed id in [0, n): the product of two uniforms favours small ids. */
static uint64_t skewed(uint64_t *x, uint64_t n) {
    double a = mt_bench_rand01(x);
    double b = mt_bench_rand01(x);
    return (uint64_t)(a * b * (double)n);
}

static void emit(const char *metric, double v, const char *unit, const char *extra) {
    mt_bench_emit("trainer", metric, v, unit, extra);
}

/* ---------------- id streams ---------------- */

/* cold: the skewed stream above over 1M ids per slot; most ids of a run are new, so the
 *       step mostly creates rows (page faults, slab and bucket growth);
 * warm: Zipf(1.05) ranks over 1M ids per slot, measured after a warm-up pass of as many
 *       examples: most ids have a row, new ones keep arriving from the tail, as in a
 *       steady stream. */
enum { PHASE_COLD, PHASE_WARM };
static const char *phase_name[2] = {"cold", "warm"};

#define SEQ_SLOT 27 /* din: the behaviours' slot (its ids are the item slot 2's) */
#define SEQ_LEN  20

typedef struct stream {
    int phase;
    uint64_t x; /* rng state */
    mt_zipf_t z;
    uint32_t ntasks; /* labels per example (mmoe: 2) */
    uint32_t seq;    /* din: behaviours per example in slot SEQ_SLOT, 0: none */
} stream_t;

/* The stream of phase for a trainer of config @p tc (its tasks; din: its behaviours). */
static void stream_init(stream_t *s, int phase, uint64_t seed, const mt_trainer_config_t *tc) {
    s->phase = phase;
    s->x = seed;
    mt_zipf_init(&s->z, 1000000, 1.05);
    s->ntasks = tc->family.type == MT_MODEL_MMOE ? tc->family.ntasks : 1;
    s->seq = tc->family.type == MT_MODEL_DIN ? tc->family.seq_len : 0;
}

static uint64_t draw(stream_t *sm) {
    return sm->phase == PHASE_COLD ? skewed(&sm->x, 1000000)
                                   : mt_zipf_next(&sm->z, mt_bench_rand01_cb, &sm->x);
}

static void fill(mt_batch_t *b, size_t n, stream_t *sm) {
    mt_batch_clear(b);
    uint64_t fids[NSLOTS + 1], seq[MT_MODEL_MAX_SEQ];
    const uint64_t *fp[NSLOTS + 1];
    uint32_t counts[NSLOTS + 1];
    for (size_t i = 0; i < n; i++) {
        uint64_t h = 0;
        for (int s = 0; s < NSLOTS; s++) {
            uint64_t v = draw(sm);
            fids[s] = mt_fid_of_int((uint16_t)(s + 1), v);
            fp[s] = &fids[s];
            counts[s] = 1;
            h ^= v * (uint64_t)(s + 1);
        }
        for (uint32_t j = 0; j < sm->seq; j++)
            seq[j] = mt_fid_of_int(SEQ_SLOT, draw(sm));
        fp[NSLOTS] = seq;
        counts[NSLOTS] = sm->seq;
        const float y[2] = {(float)((h % 10) == 0), (float)((h % 7) == 0)};
        mt_batch_add_labels(b, y, 0, 1.0f, fp, counts);
    }
}

/* Pre-made batches, so that a timed run (and each thread of it) does nothing but train. */
typedef struct batches {
    mt_batch_t *b;
    size_t n;
} batches_t;

static int batches_make(batches_t *bs, size_t count, size_t batch, stream_t *sm) {
    uint16_t ids[NSLOTS + 1];
    for (int s = 0; s <= NSLOTS; s++)
        ids[s] = (uint16_t)(s + 1);
    bs->b = calloc(count, sizeof(mt_batch_t));
    if (!bs->b) return -1;
    bs->n = count;
    for (size_t i = 0; i < count; i++) {
        if (mt_batch_init(&bs->b[i], ids, NSLOTS + (sm->seq > 0)) != MT_OK ||
            mt_batch_set_tasks(&bs->b[i], sm->ntasks) != MT_OK)
            return -1;
        fill(&bs->b[i], batch, sm);
    }
    return 0;
}

static void batches_free(batches_t *bs) {
    for (size_t i = 0; i < bs->n; i++)
        mt_batch_free(&bs->b[i]);
    free(bs->b);
    bs->b = NULL;
    bs->n = 0;
}

/* ---------------- a table shared by several trainers (hogwild on the sparse part) ---------------- */

static mt_err_t shared_lookup(void *ud, const uint64_t *fids, size_t n, int train, uint32_t now_s,
                              float *out, size_t out_len) {
    return mt_table_lookup(ud, fids, n, out, out_len, NULL, train ? MT_TABLE_TRAIN : 0, now_s,
                           NULL);
}

static mt_err_t shared_apply(void *ud, const uint64_t *fids, size_t n, const float *grads,
                             size_t len, uint32_t now_s, uint64_t examples) {
    (void)examples;
    return mt_table_apply(ud, fids, n, grads, len, now_s, NULL);
}

/* The same table a local trainer makes for itself (mt_trainer_create). */
static mt_table_t *shared_table(const mt_trainer_config_t *tc) {
    mt_table_slot_config_t slots[NSLOTS];
    size_t nslots = 0;
    mt_trainer_slot_configs(tc, slots, NSLOTS, &nslots);
    mt_table_config_t c;
    mt_table_config_init(&c);
    c.slots = slots;
    c.nslots = nslots;
    c.shards_log2 = tc->table_shards_log2;
    c.initial_rows = tc->table_initial_rows;
    c.reserve_rows = 1;
    c.changelog_entries = 0;
    c.filter_bytes = 0;
    mt_table_t *t;
    return mt_table_create(&c, &t) == MT_OK ? t : NULL;
}

typedef struct worker {
    mt_trainer_t *tr;
    const batches_t *bs;
    float *probs;
    double sec, cpu_sec;
    double phase_s[MT_TRAINER_NPHASES]; /* the steps' time in each phase (mt_trainer_step_t) */
    int pipelined; /* the trainer's pipeline: the next batch's lookup and this step's apply
                      beside the step (mt_trainer_set_pipelined, mt_trainer_prefetch) */
    int err;
} worker_t;

static void *worker_run(void *arg) {
    worker_t *w = arg;
    double t0 = mt_mono_s(), c0 = thread_cpu_s();
    memset(w->phase_s, 0, sizeof(w->phase_s));
    if (w->pipelined && mt_trainer_set_pipelined(w->tr, 1) != MT_OK) w->err = 1;
    for (size_t i = 0; i < w->bs->n && !w->err; i++) {
        mt_trainer_step_t st;
        if (w->pipelined && i + 1 < w->bs->n &&
            mt_trainer_prefetch(w->tr, &w->bs->b[i + 1], 2) != MT_OK)
            w->err = 1;
        if (!w->err) w->err = mt_trainer_train(w->tr, &w->bs->b[i], 2, w->probs, &st) != MT_OK;
        for (int p = 0; p < MT_TRAINER_NPHASES && !w->err; p++)
            w->phase_s[p] += st.seconds[p];
    }
    if (w->pipelined &&
        (mt_trainer_wait(w->tr, NULL) != MT_OK || mt_trainer_set_pipelined(w->tr, 0) != MT_OK))
        w->err = 1;
    w->sec = mt_mono_s() - t0;
    w->cpu_sec = thread_cpu_s() - c0;
    return NULL;
}

typedef struct run_result {
    double rate;          /* examples/s over all threads (wall clock) */
    double new_row_share; /* rows created per table lookup of an id during the run */
    double rows;          /* rows of the table at the end */
    double cpu_rate;      /* examples per CPU second of a training thread (mean of threads) */
    double phase_us[MT_TRAINER_NPHASES]; /* microseconds an example in each phase of the step
                                            (the first thread's) */
} run_result_t;

/* One measurement: nt trainers (1: its own local table; 2: one shared table through a
 * backend) on phase's stream; a warm phase first trains `warm_batches` untimed. @p pipelined:
 * the timed pass's steps pipelined (one trainer). */
static int run_local(const mt_trainer_config_t *tc0, int phase, int nt, size_t nbatches,
                     size_t warm_batches, size_t batch, uint64_t seed, int pipelined,
                     run_result_t *res) {
    mt_trainer_config_t tc = *tc0;
    mt_trainer_t *tr[2] = {NULL, NULL};
    mt_table_t *shared = NULL;
    mt_trainer_backend_t be;
    int rc = -1;
    batches_t bs[2] = {{0}, {0}}, wb = {0};
    worker_t w[2];
    memset(w, 0, sizeof(w));
    if (nt > 1) {
        if (!(shared = shared_table(&tc))) goto out;
        be = (mt_trainer_backend_t){.ud = shared, .lookup = shared_lookup, .apply = shared_apply};
        tc.backend = &be;
    }
    for (int i = 0; i < nt; i++)
        if (mt_trainer_create(&tc, &tr[i]) != MT_OK) goto out;
    mt_table_t *t = shared ? shared : mt_trainer_table(tr[0]);
    /* Warm-up (untimed): the warm phase's long pass, or one batch (the first rows). */
    stream_t sm;
    stream_init(&sm, phase, seed, &tc);
    if (batches_make(&wb, phase == PHASE_WARM ? warm_batches : 1, batch, &sm)) goto out;
    /* probs: [batch x T] (mmoe: 2 tasks) */
    w[0] = (worker_t){.tr = tr[0], .bs = &wb, .probs = malloc(2 * batch * sizeof(float))};
    w[1].probs = malloc(2 * batch * sizeof(float));
    if (!w[0].probs || !w[1].probs) goto out;
    worker_run(&w[0]);
    if (w[0].err) goto out;
    for (int i = 0; i < nt; i++) {
        stream_t si;
        stream_init(&si, phase, seed * 1000 + 7 + (uint64_t)i, &tc);
        if (batches_make(&bs[i], nbatches, batch, &si)) goto out;
        w[i].tr = tr[i];
        w[i].bs = &bs[i];
        w[i].pipelined = pipelined && nt == 1;
    }
    mt_table_stats_t s0, s1;
    mt_table_stats(t, &s0);
    pthread_t th[2];
    double t0 = mt_mono_s();
    for (int i = 0; i < nt; i++)
        if (pthread_create(&th[i], NULL, worker_run, &w[i]) != 0) goto out;
    for (int i = 0; i < nt; i++)
        pthread_join(th[i], NULL);
    double sec = mt_mono_s() - t0;
    mt_table_stats(t, &s1);
    for (int i = 0; i < nt; i++)
        if (w[i].err) goto out;
    double ids = (double)nt * (double)nbatches * (double)batch * NSLOTS; /* one row per id */
    res->rate = (double)nt * (double)nbatches * (double)batch / sec;
    res->new_row_share = (double)(s1.rows - s0.rows) / ids;
    res->rows = (double)s1.rows;
    res->cpu_rate = 0;
    for (int i = 0; i < nt; i++)
        res->cpu_rate += (double)nbatches * (double)batch / w[i].cpu_sec / nt;
    for (int p = 0; p < MT_TRAINER_NPHASES; p++)
        res->phase_us[p] = w[0].phase_s[p] * 1e6 / ((double)nbatches * (double)batch);
    rc = 0;
out:
    for (int i = 0; i < 2; i++) {
        batches_free(&bs[i]);
        free(w[i].probs);
        mt_trainer_destroy(tr[i]);
    }
    batches_free(&wb);
    mt_table_destroy(shared);
    return rc;
}

/* Called after each run of warm_reps() with its rates (by the wall clock and CPU time);
 * returns nonzero to be called no more. */
typedef int (*between_fn)(void *ud, double rate, double cpu_rate);

/* @p reps warm one-thread runs of a trainer of @p tc (the pre-sized and the other model
 * families' figures): their rates
 * in r[] (r[0] and r[reps - 1] the extremes once the median is taken), the medians of the
 * rates and of the CPU-time rates, and (@p phase_us, optional) the mean over the runs of each
 * phase's microseconds an example; @p between (optional) runs after each. @returns 0, or -1
 * (a run failed, said on stderr). */
static int warm_reps(const mt_trainer_config_t *tc, const char *name, int reps, size_t nbatches,
                     size_t batch, int pipelined, double *r, double *med, double *med_cpu,
                     double *phase_us, between_fn between, void *ud) {
    double rc[15];
    if (phase_us) memset(phase_us, 0, MT_TRAINER_NPHASES * sizeof(double));
    for (int k = 0; k < reps; k++) {
        run_result_t res = {0};
        if (run_local(tc, PHASE_WARM, 1, nbatches, nbatches, batch, 1 + (uint64_t)k, pipelined,
                      &res)) {
            fprintf(stderr, "trainer_bench: %s run failed\n", name);
            return -1;
        }
        r[k] = res.rate;
        rc[k] = res.cpu_rate;
        for (int p = 0; p < MT_TRAINER_NPHASES && phase_us; p++)
            phase_us[p] += res.phase_us[p] / reps;
        if (between && between(ud, res.rate, res.cpu_rate)) between = NULL;
    }
    *med = mt_bench_median(r, (size_t)reps);
    *med_cpu = mt_bench_median(rc, (size_t)reps);
    return 0;
}

/* The MLP's first (largest) layer shape through sgemm: GFLOP/s, median of 3, by the wall
 * clock and (@p cpu) by the thread's CPU time. */
static double sgemm_gflops(size_t batch, double *cpu) {
    size_t in = NSLOTS * DIM;
    float *A = calloc(batch * in, sizeof(float)), *W = calloc(in * 256, sizeof(float)),
          *C = calloc(batch * 256, sizeof(float));
    double r[3], rc[3];
    for (int k = 0; k < 3; k++) {
        double flops = 0, f0 = mt_mono_s(), c0 = thread_cpu_s();
        for (int rep = 0; rep < 50; rep++) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)batch, 256, (int)in, 1.0f,
                        A, (int)in, W, 256, 0.0f, C, 256);
            flops += 2.0 * (double)batch * 256 * (double)in;
        }
        r[k] = flops / (mt_mono_s() - f0) / 1e9;
        rc[k] = flops / (thread_cpu_s() - c0) / 1e9;
    }
    free(A);
    free(W);
    free(C);
    *cpu = mt_bench_median(rc, 3);
    return mt_bench_median(r, 3);
}

/* ---------------- the shard: a monolith-ps process ---------------- */

#ifndef MT_PS_BIN
#error "MT_PS_BIN must name the monolith-ps binary"
#endif

typedef struct shard_proc {
    pid_t pid;
    int port;
    char log[256];
} shard_proc_t;

/* Starts a monolith-ps holding @p slots (the trainer's: each feature slot's row, embedding
 * and first-order weight) with no frequency filter, snapshots or expiry, 2 rpc workers, and the
 * daemon's defaults otherwise (1,024 parts, a change log of 1 Mi entries: what a shard that
 * serving replicas follow keeps). @returns 0 or -1 (said on stderr). */
static int shard_start(const mt_table_slot_config_t *slots, size_t nslots, uint64_t initial_rows,
                       int k, shard_proc_t *sp) {
    char conf[256], portf[256];
    snprintf(conf, sizeof(conf), "%s/ps%d.conf", mt_bench_root(), k);
    snprintf(portf, sizeof(portf), "%s/ps%d.port", mt_bench_root(), k);
    snprintf(sp->log, sizeof(sp->log), "%s/ps%d.log", mt_bench_root(), k);
    FILE *f = fopen(conf, "w");
    if (!f) {
        perror(conf);
        return -1;
    }
    fprintf(f,
            "[cluster]\nnum_shards = 1\n"
            "[ps]\nlisten = 127.0.0.1:0\nthreads = 2\nsnapshot_interval_s = 0\n"
            "expire_interval_ms = 0\n"
            "[table]\nfilter_bytes = 0\ninitial_rows = %llu\n",
            (unsigned long long)initial_rows);
    for (size_t i = 0; i < nslots; i++)
        fprintf(f,
                "[slot.%u]\ndim = %u\nzero_tail = %u\ninit = %s\ninit_scale = %g\noptimizer = "
                "%s\nlr = %g\n",
                slots[i].slot, slots[i].dim, slots[i].zero_tail,
                slots[i].init == MT_INIT_ZEROS ? "zeros" : "uniform",
                slots[i].init_scale > 0 ? slots[i].init_scale : 0.01,
                slots[i].opt == MT_OPT_ADAGRAD ? "adagrad" : "sgd", slots[i].lr);
    if (fclose(f) != 0) return -1;
    char *argv[] = {MT_PS_BIN, "--config", conf, "--port-file", portf, "--log-level", "warn", NULL};
    if ((sp->pid = mt_bench_spawn(argv, sp->log)) < 0) {
        fprintf(stderr, "trainer_bench: cannot start %s\n", MT_PS_BIN);
        return -1;
    }
    int ws = 0;
    if ((sp->port = mt_bench_wait_port(portf, sp->pid, 30, &ws)) < 0) {
        fprintf(stderr, "trainer_bench: the shard did not start (status %d); %s:\n", ws, sp->log);
        mt_bench_log_tail(sp->log);
        return -1;
    }
    return 0;
}

/* The PyTorch baseline's figures (bench/pytorch_deepfm.py's JSON object). */
typedef struct torch_result {
    double rate, cpu_rate, min, max;
    char version[32];
} torch_result_t;

/* Reads the number after "key": in @p json. @returns 0 or -1. */
static int json_number(const char *json, const char *key, double *out) {
    char pat[48];
    snprintf(pat, sizeof(pat), "\"%s\": ", key);
    const char *p = strstr(json, pat);
    if (!p) return -1;
    char *end;
    *out = strtod(p + strlen(pat), &end);
    return end == p + strlen(pat) ? -1 : 0;
}

/* Runs the PyTorch baseline (warm stream, @p examples timed per rep). @returns 0 with *res
 * filled, or -1 with @p why saying what is missing or what failed. */
static int run_pytorch(size_t examples, size_t batch, int reps, int threads, torch_result_t *res,
                       char *why, size_t whylen) {
    if (access(MT_PYTHON, X_OK) != 0) {
        snprintf(why, whylen, "%s not found (Debian: python3, python3-torch)", MT_PYTHON);
        return -1;
    }
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "%s %s --examples %zu --batch %zu --reps %d --threads %d 2>&1",
             MT_PYTHON, MT_PYTORCH_BENCH, examples, batch, reps, threads);
    FILE *p = popen(cmd, "r");
    if (!p) {
        snprintf(why, whylen, "cannot run %s: %s", MT_PYTORCH_BENCH, strerror(errno));
        return -1;
    }
    /* Its JSON object is a line of its own (warnings may come before it); on failure the
     * last line says why. */
    char out[2048] = "", last[2048] = "", line[2048];
    while (fgets(line, sizeof(line), p)) {
        line[strcspn(line, "\n")] = '\0';
        if (!*line) continue;
        snprintf(last, sizeof(last), "%s", line);
        if (*line == '{') snprintf(out, sizeof(out), "%s", line);
    }
    int ws = pclose(p);
    for (char *q = last; *q; q++) /* it goes into a JSON string */
        if (*q == '"' || *q == '\\' || (unsigned char)*q < 0x20) *q = '\'';
    if (ws == -1 || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
        snprintf(why, whylen, "%s (exit status %d)", last,
                 ws != -1 && WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
        return -1;
    }
    if (json_number(out, "examples_per_s", &res->rate) ||
        json_number(out, "cpu_examples_per_s", &res->cpu_rate) ||
        json_number(out, "min", &res->min) || json_number(out, "max", &res->max)) {
        snprintf(why, whylen, "unreadable output: %.200s", last);
        return -1;
    }
    const char *v = strstr(out, "\"torch\": \"");
    snprintf(res->version, sizeof(res->version), "%.*s", v ? (int)strcspn(v + 10, "\"") : 1,
             v ? v + 10 : "?");
    return 0;
}

/* PyTorch runs alternating with ours (warm_reps' between): one PyTorch run after each of
 * ours, so that a machine whose speed drifts during the bench moves both sides of each pair
 * alike; the pairs' ratios are what vs_pytorch reports. */
typedef struct torch_pairs {
    size_t examples, batch;
    int threads;                                           /* PyTorch's intra-op threads */
    int n;                                                 /* pairs made */
    double ours[15], ours_cpu[15], rate[15], cpu_rate[15]; /* per pair */
    torch_result_t last;
    int failed; /* a run failed: why says so */
    char why[512];
} torch_pairs_t;

static int torch_pair(void *ud, double rate, double cpu_rate) {
    torch_pairs_t *tp = ud;
    if (tp->n >= 15) return 1;
    if (run_pytorch(tp->examples, tp->batch, 1, tp->threads, &tp->last, tp->why, sizeof(tp->why))) {
        tp->failed = 1;
        return 1;
    }
    tp->ours[tp->n] = rate;
    tp->ours_cpu[tp->n] = cpu_rate;
    tp->rate[tp->n] = tp->last.rate;
    tp->cpu_rate[tp->n] = tp->last.cpu_rate;
    tp->n++;
    return 0;
}

/* Stops the shard (SIGTERM). @returns 0, or -1 if it did not exit 0 (its log on stderr). */
static int shard_stop(shard_proc_t *sp) {
    int ws = mt_bench_child_stop(sp->pid, SIGTERM);
    if (ws == -1 || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
        fprintf(stderr, "trainer_bench: the shard ended badly (status %d); %s:\n", ws, sp->log);
        mt_bench_log_tail(sp->log);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv) {
    mt_bench_run_conditions("trainer");
    size_t total = 300000, batch = 512;
    uint64_t initial_rows = 0;
    int reps = 1, with_ps = 1, with_torch = 1, with_families = 1, quick = 0, max_threads = 2,
        phase_lo = PHASE_COLD, phase_hi = PHASE_WARM;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            total = 20000;
            quick = 1;
        } else if (!strcmp(argv[i], "--examples") && i + 1 < argc)
            total = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            batch = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--initial-rows") && i + 1 < argc)
            initial_rows = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            max_threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--phase") && i + 1 < argc) {
            i++;
            phase_lo = phase_hi = !strcmp(argv[i], "warm") ? PHASE_WARM : PHASE_COLD;
        } else if (!strcmp(argv[i], "--no-ps"))
            with_ps = 0;
        else if (!strcmp(argv[i], "--no-pytorch"))
            with_torch = 0;
        else if (!strcmp(argv[i], "--deepfm-only"))
            with_families = 0;
        else {
            fprintf(stderr, "usage: trainer_bench [--examples N] [--batch B] [--reps R] "
                            "[--threads 1|2] [--phase cold|warm] [--initial-rows N] [--no-ps] "
                            "[--no-pytorch] [--deepfm-only] [--quick]\n");
            return 2;
        }
    }
    if (batch < 1 || total < batch || reps < 1 || reps > 15 || max_threads < 1 || max_threads > 2)
        return 2;
    /* Per-core figures: OpenBLAS must not spread one trainer's sgemm over other cores. */
    openblas_set_num_threads(1);
    mt_trainer_config_t tc;
    mt_trainer_config_init(&tc);
    tc.nslots = NSLOTS;
    for (int s = 0; s < NSLOTS; s++)
        tc.slot_ids[s] = (uint16_t)(s + 1);
    tc.dim = DIM;
    tc.hidden[0] = 256;
    tc.hidden[1] = 128;
    tc.sparse_opt = MT_OPT_ADAGRAD; /* the figures of docs/trainer.md (the default is FTRL) */
    tc.table_initial_rows = initial_rows;
    char extra[640];
    size_t nbatches = total / batch;

    /* The compute floor first: the MLP's sgemm shapes, forward and backward (about 3x
     * forward). Every rate below is also given as a share of it. */
    double gf_cpu, gf = sgemm_gflops(batch, &gf_cpu);
    size_t in = NSLOTS * DIM;
    snprintf(extra, sizeof(extra),
             "\"threads\":1,\"m\":%zu,\"n\":256,\"k\":%zu,\"cpu_gflops\":%.4g", batch, in, gf_cpu);
    emit("sgemm_gflops", gf, "GFLOP/s", extra);
    /* FLOPs per example forward: the MLP layers (2*in*256 + 2*256*128 + 2*128). */
    double fwd = 2.0 * (double)in * 256 + 2.0 * 256 * 128 + 2.0 * 128;
    double floor_rate = gf * 1e9 / (3 * fwd), floor_cpu = gf_cpu * 1e9 / (3 * fwd);
    snprintf(extra, sizeof(extra), "\"flops_per_example\":%.0f,\"cpu\":%.6g", 3 * fwd, floor_cpu);
    emit("compute_floor_examples_per_s", floor_rate, "examples/s", extra);

    /* Local table: cold and warm streams, 1 and 2 threads. */
    /* examples/s, cold, 1 thread (by the wall clock and by CPU time): the PS figures'
     * reference */
    double local_cold = 0, local_cold_cpu = 0, local_warm = 0, local_warm_cpu = 0, warm_rows = 0;
    /* the warm one-thread figure with a pre-sized table (PyTorch's is), by the wall clock and
     * CPU time: the run above when --initial-rows was given, else one more below */
    double presized = 0, presized_cpu = 0;
    /* PyTorch's runs, alternating with the pre-sized ones when those are made below */
    torch_pairs_t tp;
    memset(&tp, 0, sizeof(tp));
    tp.examples = nbatches * batch;
    tp.batch = batch;
    tp.threads = 1;
    /* PyTorch on two threads, alternating with our pipelined runs (two threads) */
    torch_pairs_t tp2 = tp;
    tp2.threads = 2;
    double pipelined_rate = 0; /* those runs' median */
    for (int phase = phase_lo; phase <= phase_hi; phase++) {
        for (int nt = 1; nt <= max_threads; nt++) {
            double r[15], rc[15], share = 0, rows = 0;
            for (int k = 0; k < reps; k++) {
                run_result_t res = {0};
                if (run_local(&tc, phase, nt, nbatches, nbatches, batch, 1 + (uint64_t)k, 0,
                              &res)) {
                    fprintf(stderr, "trainer_bench: local run failed\n");
                    return 1;
                }
                r[k] = res.rate;
                rc[k] = res.cpu_rate;
                share += res.new_row_share / reps;
                rows += res.rows / reps;
            }
            double med = mt_bench_median(r, (size_t)reps),
                   med_cpu = mt_bench_median(rc, (size_t)reps);
            if (phase == PHASE_COLD && nt == 1) {
                local_cold = med;
                local_cold_cpu = med_cpu;
            } else if (nt == 1) {
                local_warm = med;
                local_warm_cpu = med_cpu;
                warm_rows = rows;
            }
            snprintf(extra, sizeof(extra),
                     "\"phase\":\"%s\",\"ids\":\"%s\",\"threads\":%d,\"per_thread\":%.6g,"
                     "\"new_row_share\":%.4f,\"vs_compute_floor\":%.3f,\"min\":%.6g,\"max\":%.6g,"
                     "\"per_thread_cpu\":%.6g,\"vs_compute_floor_cpu\":%.3f,\"reps\":%d,\"slots\":%"
                     "d,\"dim\":%d,\"mlp\":\"256-128\",\"batch\":%zu,"
                     "\"backend\":\"%s\",\"examples\":%zu,\"rows\":%.0f,\"initial_rows\":%llu",
                     phase_name[phase],
                     phase == PHASE_COLD ? "skewed over 1M per slot, mostly new"
                                         : "zipf1.05 over 1M per slot, after a warm-up pass",
                     nt, med / nt, share, med / nt / floor_rate, r[0], r[reps - 1], med_cpu,
                     med_cpu / floor_cpu, reps, NSLOTS, DIM, batch,
                     nt > 1 ? "local table shared by the threads" : "local table",
                     nbatches * batch * (size_t)nt, rows, (unsigned long long)initial_rows);
            emit("train_examples_per_s", med, "examples/s", extra);
        }
    }
    if (phase_hi == PHASE_WARM && initial_rows) {
        presized = local_warm;
        presized_cpu = local_warm_cpu;
    } else if (phase_hi == PHASE_WARM) {
        /* pre-sized for the rows the grown run ended with and a quarter more: bucket arrays
         * and the rows' memory taken at create (mt_trainer_config_t table_initial_rows) */
        mt_trainer_config_t pc = tc;
        pc.table_initial_rows = (uint64_t)(warm_rows * 1.25);
        double r[15], med, med_cpu, ph[MT_TRAINER_NPHASES];
        if (warm_reps(&pc, "pre-sized", reps, nbatches, batch, 0, r, &med, &med_cpu, ph,
                      with_torch ? torch_pair : NULL, &tp))
            return 1;
        presized = med;
        presized_cpu = med_cpu;
        snprintf(extra, sizeof(extra),
                 "\"phase\":\"warm\",\"threads\":1,\"initial_rows\":%llu,\"vs_compute_floor\":%.3f,"
                 "\"min\":%.6g,\"max\":%.6g,\"per_thread_cpu\":%.6g,\"vs_compute_floor_cpu\":%.3f,"
                 "\"vs_grown\":%.3f,\"reps\":%d,\"slots\":%d,\"dim\":%d,\"mlp\":\"256-128\","
                 "\"batch\":%zu,\"backend\":\"local table, pre-sized\"",
                 (unsigned long long)pc.table_initial_rows, med / floor_rate, r[0], r[reps - 1],
                 med_cpu, med_cpu / floor_cpu, local_warm > 0 ? med / local_warm : 0, reps, NSLOTS,
                 DIM, batch);
        emit("train_examples_per_s", med, "examples/s", extra);
        /* where those steps' time went: the model phase against the compute floor, the table's
         * in lookup and apply */
        double step_us = 0;
        for (int p = 0; p < MT_TRAINER_NPHASES; p++)
            step_us += ph[p];
        size_t o = (size_t)snprintf(extra, sizeof(extra),
                                    "\"phase\":\"warm\",\"threads\":1,"
                                    "\"backend\":\"local table, pre-sized\"");
        for (int p = 0; p < MT_TRAINER_NPHASES && o < sizeof(extra); p++)
            o += (size_t)snprintf(extra + o, sizeof(extra) - o, ",\"%s_us\":%.3f,\"%s_share\":%.3f",
                                  mt_trainer_phase_name((mt_trainer_phase_t)p), ph[p],
                                  mt_trainer_phase_name((mt_trainer_phase_t)p),
                                  step_us > 0 ? ph[p] / step_us : 0);
        if (o < sizeof(extra))
            snprintf(extra + o, sizeof(extra) - o, ",\"floor_us\":%.3f,\"reps\":%d",
                     1e6 / floor_rate, reps);
        emit("step_us_per_example", step_us, "us/example", extra);
        /* The same pre-sized steps pipelined (trainer.pipelined): the next batch's lookup and
         * this step's apply on the trainer's pipeline thread while the step computes, one
         * step stale; two threads, so not the one-thread comparison above. */
        double pmed, pmed_cpu;
        if (warm_reps(&pc, "pipelined", reps, nbatches, batch, 1, r, &pmed, &pmed_cpu, NULL,
                      with_torch ? torch_pair : NULL, &tp2))
            return 1;
        pipelined_rate = pmed;
        snprintf(extra, sizeof(extra),
                 "\"phase\":\"warm\",\"threads\":2,\"pipelined\":true,\"prefetch\":true,"
                 "\"vs_unpipelined\":%.3f,\"vs_compute_floor\":%.3f,\"min\":%.6g,\"max\":%.6g,"
                 "\"reps\":%d,\"slots\":%d,\"dim\":%d,\"mlp\":\"256-128\",\"batch\":%zu,"
                 "\"backend\":\"local table, pre-sized; the trainer's pipeline thread beside the "
                 "step's\"",
                 med > 0 ? pmed / med : 0, pmed / floor_rate, r[0], r[reps - 1], reps, NSLOTS, DIM,
                 batch);
        emit("train_examples_per_s", pmed, "examples/s", extra);
    }
    /* The other model families (model.h), warm, one thread: each against its own floor (the
     * MLP's FLOPs and its cross layers': full rank 2 D^2 per layer and example forward, low
     * rank 4 D r; the element-wise parts not counted). */
    if (with_families && phase_hi == PHASE_WARM) {
        static const struct { uint32_t ncross, rank; } fam[] = {{3, 0}, {3, 64}};
        /* quick (a smoke run): the low-rank one only */
        for (size_t f = quick ? 1 : 0; f < sizeof(fam) / sizeof(fam[0]); f++) {
            mt_trainer_config_t dc = tc;
            dc.family.type = MT_MODEL_DCNV2;
            dc.family.ncross = fam[f].ncross;
            dc.family.cross_rank = fam[f].rank;
            double D = (double)in, per_layer = fam[f].rank ? 4.0 * D * fam[f].rank : 2.0 * D * D;
            double dfwd = fwd + fam[f].ncross * per_layer;
            double dfloor = gf * 1e9 / (3 * dfwd);
            double r[15], med, med_cpu;
            if (warm_reps(&dc, "dcnv2", reps, nbatches, batch, 0, r, &med, &med_cpu, NULL, NULL,
                          NULL))
                return 1;
            snprintf(extra, sizeof(extra),
                     "\"phase\":\"warm\",\"threads\":1,\"model\":\"dcnv2\",\"cross_layers\":%u,"
                     "\"cross_rank\":%u,\"compute_floor\":%.6g,\"flops_per_example\":%.0f,"
                     "\"vs_compute_floor\":%.3f,\"vs_deepfm\":%.3f,\"min\":%.6g,\"max\":%.6g,"
                     "\"per_thread_cpu\":%.6g,\"reps\":%d,\"slots\":%d,\"dim\":%d,"
                     "\"mlp\":\"256-128\",\"batch\":%zu",
                     fam[f].ncross, fam[f].rank, dfloor, 3 * dfwd, med / dfloor,
                     local_warm > 0 ? med / local_warm : 0, r[0], r[reps - 1], med_cpu, reps,
                     NSLOTS, DIM, batch);
            emit("train_examples_per_s", med, "examples/s", extra);
        }
    }
    /* mmoe and din, warm, one thread, against their own floors: mmoe's experts D x K h_e,
     * gates D x T K and T towers (h_e x 256, 256 x 128, 128); din's MLP as deepfm's (x' is
     * 26 cells of 16) plus the attention layer (4d x H, H) for each of its 20 behaviours. */
    if (with_families && phase_hi == PHASE_WARM) {
        for (int f = 0; f < 2; f++) {
            mt_trainer_config_t mc = tc;
            double mfwd;
            const char *name = f ? "din" : "mmoe";
            if (f == 0) {
                mc.family.type = MT_MODEL_MMOE;
                mc.family.ntasks = 2;
                mc.family.nexperts = 4;
                mc.family.expert_width = 64;
                double D = (double)in, K = 4, he = 64, T = 2;
                mfwd = 2.0 * D * K * he + 2.0 * D * T * K +
                       T * (2.0 * he * 256 + 2.0 * 256 * 128 + 2.0 * 128);
            } else {
                mc.family.type = MT_MODEL_DIN;
                mc.nslots = NSLOTS + 1;
                mc.slot_ids[NSLOTS] = SEQ_SLOT;
                mc.family.seq_slot = NSLOTS;
                mc.family.seq_query = 1; /* slot 2, "the item" */
                mc.family.seq_len = SEQ_LEN;
                mc.family.attention_width = 32;
                mfwd = fwd + SEQ_LEN * (2.0 * 4 * DIM * 32 + 2.0 * 32);
            }
            double mfloor = gf * 1e9 / (3 * mfwd);
            double r[15], med, med_cpu;
            if (warm_reps(&mc, name, reps, nbatches, batch, 0, r, &med, &med_cpu, NULL, NULL, NULL))
                return 1;
            snprintf(extra, sizeof(extra),
                     "\"phase\":\"warm\",\"threads\":1,\"model\":\"%s\",\"shape\":\"%s\","
                     "\"compute_floor\":%.6g,\"flops_per_example\":%.0f,"
                     "\"vs_compute_floor\":%.3f,\"vs_deepfm\":%.3f,\"min\":%.6g,\"max\":%.6g,"
                     "\"per_thread_cpu\":%.6g,\"reps\":%d,\"slots\":%d,\"dim\":%d,"
                     "\"mlp\":\"256-128\",\"batch\":%zu",
                     name,
                     f ? "20 behaviours of slot 2's ids, attention width 32"
                       : "2 tasks, 4 experts of 64, towers 256-128",
                     mfloor, 3 * mfwd, med / mfloor, local_warm > 0 ? med / local_warm : 0, r[0],
                     r[reps - 1], med_cpu, reps, (int)mc.nslots, DIM, batch);
            emit("train_examples_per_s", med, "examples/s", extra);
        }
    }
    /* The PyTorch baseline beside our warm one-thread figure. */
    if (with_torch && phase_hi == PHASE_WARM) {
        torch_result_t tres;
        double ratio = 0, ratio_cpu = 0, pair_min = 0, pair_max = 0;
        int ok = 0, paired = tp.n == reps;
        double rate1[15]; /* PyTorch's one-thread runs in pair order (the medians sort) */
        memcpy(rate1, tp.rate, sizeof(rate1));
        if (paired) { /* alternating with the pre-sized runs: the pairs' ratios */
            double q[15], qc[15];
            for (int k = 0; k < reps; k++) {
                q[k] = tp.ours[k] / tp.rate[k];
                qc[k] = tp.cpu_rate[k] > 0 ? tp.ours_cpu[k] / tp.cpu_rate[k] : 0;
            }
            ratio = mt_bench_median(q, (size_t)reps);
            ratio_cpu = mt_bench_median(qc, (size_t)reps);
            pair_min = q[0];
            pair_max = q[reps - 1];
            tres = tp.last;
            tres.rate = mt_bench_median(tp.rate, (size_t)reps);
            tres.cpu_rate = mt_bench_median(tp.cpu_rate, (size_t)reps);
            tres.min = tp.rate[0];
            tres.max = tp.rate[reps - 1];
            ok = 1;
        } else if (!tp.failed) { /* --initial-rows: its runs after ours */
            ok = run_pytorch(nbatches * batch, batch, reps, 1, &tres, tp.why, sizeof(tp.why)) == 0;
            ratio = ok && tres.rate > 0 ? presized / tres.rate : 0;
            ratio_cpu = ok && tres.cpu_rate > 0 ? presized_cpu / tres.cpu_rate : 0;
            pair_min = pair_max = ratio;
        }
        if (ok) {
            snprintf(extra, sizeof(extra),
                     "\"phase\":\"warm\",\"threads\":1,\"min\":%.6g,\"max\":%.6g,"
                     "\"cpu\":%.6g,\"vs_compute_floor\":%.3f,\"reps\":%d,\"alternating\":%s,"
                     "\"torch\":\"%s\",\"model\":\"DeepFM, one pre-sized table of 26 x 1M rows "
                     "of dim 17, sparse Adagrad + dense Adam\"",
                     tres.min, tres.max, tres.cpu_rate, tres.rate / floor_rate, reps,
                     paired ? "true" : "false", tres.version);
            emit("pytorch_examples_per_s", tres.rate, "examples/s", extra);
            /* like for like: both tables pre-sized; grown: ours from empty. Alternating: the
             * median of the pairs' ratios (pair_min, pair_max), ratio_of_medians beside it. */
            snprintf(extra, sizeof(extra),
                     "\"phase\":\"warm\",\"threads\":1,\"ours\":%.6g,\"pytorch\":%.6g,"
                     "\"pair_min\":%.3f,\"pair_max\":%.3f,\"ratio_of_medians\":%.3f,"
                     "\"vs_pytorch_cpu\":%.3f,\"tables\":\"both pre-sized\",\"ours_grown\":%.6g,"
                     "\"grown_vs_pytorch\":%.3f,\"target\":1.8",
                     presized, tres.rate, pair_min, pair_max,
                     tres.rate > 0 ? presized / tres.rate : 0, ratio_cpu, local_warm,
                     tres.rate > 0 ? local_warm / tres.rate : 0);
            emit("vs_pytorch", ratio, "x", extra);
            /* The machine's two cores each side: our pipelined step (the step's thread and
             * the pipeline thread) against PyTorch on two intra-op threads, alternating, and
             * against the better of PyTorch's one- and two-thread runs of the same pair. */
            if (paired && tp2.n == reps && pipelined_rate > 0) {
                double q2[15], qb[15], best[15];
                for (int k = 0; k < reps; k++) {
                    best[k] = tp2.rate[k] > rate1[k] ? tp2.rate[k] : rate1[k];
                    q2[k] = tp2.ours[k] / tp2.rate[k];
                    qb[k] = tp2.ours[k] / best[k];
                }
                double t2 = mt_bench_median(tp2.rate, (size_t)reps);
                double vb = mt_bench_median(qb, (size_t)reps);
                snprintf(extra, sizeof(extra),
                         "\"phase\":\"warm\",\"threads\":2,\"min\":%.6g,\"max\":%.6g,"
                         "\"cpu\":%.6g,\"vs_one_thread\":%.3f,\"reps\":%d,\"alternating\":true,"
                         "\"blas_threads\":1,\"torch\":\"%s\"",
                         tp2.rate[0], tp2.rate[reps - 1],
                         mt_bench_median(tp2.cpu_rate, (size_t)reps),
                         tres.rate > 0 ? t2 / tres.rate : 0, reps, tp2.last.version);
                emit("pytorch_examples_per_s", t2, "examples/s", extra);
                snprintf(extra, sizeof(extra),
                         "\"phase\":\"warm\",\"threads\":2,\"ours\":%.6g,\"ours_pipelined\":true,"
                         "\"pytorch\":%.6g,\"vs_pytorch_two_threads\":%.3f,"
                         "\"pytorch_best\":%.6g,\"pair_min\":%.3f,\"pair_max\":%.3f,"
                         "\"tables\":\"both pre-sized\",\"against\":\"the better of PyTorch's "
                         "one- and two-thread runs, per pair\",\"target\":1.8",
                         pipelined_rate, t2, mt_bench_median(q2, (size_t)reps),
                         mt_bench_median(best, (size_t)reps), qb[0], qb[reps - 1]);
                emit("vs_pytorch", vb, "x", extra);
            } else if (tp2.failed) {
                snprintf(extra, sizeof(extra), "\"threads\":2,\"skipped\":\"%s\"", tp2.why);
                emit("pytorch_examples_per_s", 0, "examples/s", extra);
            }
        } else {
            snprintf(extra, sizeof(extra), "\"skipped\":\"%s\"", tp.why);
            emit("pytorch_examples_per_s", 0, "examples/s", extra);
        }
    }
    if (!with_ps) return 0;

    /* One PS shard, a monolith-ps process on loopback holding the same slots (cold stream,
     * one thread), a fresh shard for each of: steps one after another, pipelined steps (the
     * apply of one in flight while the next one looks up and computes), and pipelined with
     * prefetch (the next batch's lookup also in flight while this one computes). vs_local:
     * against the local table's cold 1-thread figure of this run, by the wall clock;
     * trainer_cpu_us_per_example: this process (the trainer: its step, pipeline and gRPC
     * threads), shard_cpu_us_per_example: the shard's process, cpu_us_per_example: both (on
     * this machine they share the cores); vs_local_cpu: the local table's CPU time per
     * example over the trainer's, vs_local_cpu_total over both. */
    mt_table_slot_config_t slots[NSLOTS];
    size_t nslots = 0;
    mt_trainer_slot_configs(&tc, slots, NSLOTS, &nslots);
    stream_t sm;
    stream_init(&sm, PHASE_COLD, 1, &tc);
    batches_t bs = {0};
    if (batches_make(&bs, nbatches + 1, batch, &sm)) return 1;
    float *probs = malloc(batch * sizeof(float));
    mt_bench_cleanup_install();
    if (!mt_bench_root_create("trainer_bench")) {
        perror("trainer_bench: temporary directory");
        return 1;
    }
    for (int mode = 0; mode <= 2; mode++) { /* unpipelined, pipelined, with prefetch */
        int pipelined = mode >= 1, prefetch = mode == 2;
        shard_proc_t sp;
        if (shard_start(slots, nslots, initial_rows, mode, &sp)) return 1;
        char addr[64];
        snprintf(addr, sizeof(addr), "127.0.0.1:%d", sp.port);
        const char *addrs[1] = {addr};
        mt_psc_config_t cc;
        mt_psc_config_init(&cc);
        cc.addrs = addrs;
        cc.num_shards = 1;
        mt_psc_t *client;
        if (mt_psc_create(&cc, &client) != MT_OK) return 1;
        mt_trainer_backend_t be;
        mt_trainer_backend_psc(client, &be);
        tc.backend = &be;
        mt_trainer_t *tr;
        if (mt_trainer_create(&tc, &tr) != MT_OK) return 1;
        if (pipelined && mt_trainer_set_pipelined(tr, 1) != MT_OK) return 1;
        if (mt_trainer_train(tr, &bs.b[0], 1, probs, NULL) != MT_OK) return 1; /* first rows */
        if (mt_trainer_wait(tr, NULL) != MT_OK) return 1;
        double t0 = mt_mono_s(), c0 = process_cpu_s(), s0 = mt_bench_pid_cpu_s(sp.pid);
        for (size_t i = 1; i <= nbatches; i++) {
            if (prefetch && i < nbatches && mt_trainer_prefetch(tr, &bs.b[i + 1], 2) != MT_OK)
                return 1;
            if (mt_trainer_train(tr, &bs.b[i], 2, probs, NULL) != MT_OK) return 1;
        }
        if (mt_trainer_wait(tr, NULL) != MT_OK) return 1;
        double secs = mt_mono_s() - t0, cpu = process_cpu_s() - c0,
               scpu = mt_bench_pid_cpu_s(sp.pid) - s0;
        if (s0 < 0 || scpu < 0) {
            fprintf(stderr, "trainer_bench: cannot read the shard's CPU time\n");
            return 1;
        }
        double ne = (double)(nbatches * batch), rate = ne / secs;
        double tus = cpu * 1e6 / ne, sus = scpu * 1e6 / ne,
               lus = local_cold_cpu > 0 ? 1e6 / local_cold_cpu : 0;
        snprintf(extra, sizeof(extra),
                 "\"phase\":\"cold\",\"threads\":1,\"pipelined\":%s,\"prefetch\":%s,"
                 "\"vs_local\":%.3f,\"local\":%.6g,\"vs_local_cpu\":%.3f,"
                 "\"vs_local_cpu_total\":%.3f,\"local_cpu_us_per_example\":%.2f,"
                 "\"trainer_cpu_us_per_example\":%.2f,\"shard_cpu_us_per_example\":%.2f,"
                 "\"cpu_us_per_example\":%.2f,\"vs_compute_floor\":%.3f,"
                 "\"slots\":%d,\"dim\":%d,\"mlp\":\"256-128\",\"batch\":%zu,"
                 "\"backend\":\"1 PS process over loopback\",\"examples\":%zu",
                 pipelined ? "true" : "false", prefetch ? "true" : "false",
                 local_cold > 0 ? rate / local_cold : 0, local_cold, tus > 0 ? lus / tus : 0,
                 tus + sus > 0 ? lus / (tus + sus) : 0, lus, tus, sus, tus + sus, rate / floor_rate,
                 NSLOTS, DIM, batch, nbatches * batch);
        emit("train_examples_per_s", rate, "examples/s", extra);
        mt_trainer_destroy(tr);
        mt_psc_destroy(client);
        if (shard_stop(&sp)) return 1;
    }
    batches_free(&bs);
    free(probs);
    return 0;
}
