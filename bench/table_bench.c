/*
 * table_bench.c - throughput and memory of the embedding table.
 *
 * Prints one JSON object per line: {"bench":"table","metric":...,"value":...,"unit":...,
 * plus parameters}. Never asserts on time. What it measures (issue #2):
 *   - the floor: random gather of 64-byte rows from a 640 MB array (1 and 2 threads);
 *   - inserts/s while growing from empty (training lookups admitting new ids), 1 and 2
 *     threads, and pre-sized;
 *   - batched read-only lookups/s with uniform and Zipf(1.05) keys, 1 and 2 threads;
 *   - training lookups/s of ids that have a row (MT_TABLE_TRAIN: count, touch, copy) and
 *     gradient applies/s (Adagrad), uniform and Zipf keys, 1 and 2 threads: the two table
 *     calls of a training step;
 *   - a 90% lookup / 10% gradient-update mix, 1 and 2 threads;
 *   - bytes per row against the payload (key + embedding + optimizer state + metadata).
 *
 * Usage: table_bench [--rows N] [--dim D] [--batch B] [--ops N] [--reps R] [--quick]
 * Each figure is the median of R runs (default 3), with min and max beside it.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "mt/clock.h"
#include "mt/jemalloc_conf.h"
#include "mt/table.h"
#include "mt/zipf.h"

typedef struct opts {
    uint64_t rows;
    uint32_t dim;
    uint32_t batch;
    uint64_t ops; /* lookups per measurement per thread */
    uint64_t gather_bytes;
    int reps; /* each figure is the median of this many runs (min and max printed too) */
} opts_t;

/* Resident memory of this process, bytes (Linux /proc/self/statm). */
static double rss_bytes(void) {
    long pages = 0, res = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    if (fscanf(f, "%ld %ld", &pages, &res) != 2) res = 0;
    fclose(f);
    return (double)res * 4096.0;
}

static void emit(const char *metric, double value, const char *unit, const char *extra) {
    mt_bench_emit("table", metric, value, unit, extra);
}

/* ---------------- threads ---------------- */

typedef struct job {
    const opts_t *o;
    mt_table_t *t;
    const uint64_t *keys; /* inserted ids */
    const uint64_t *queries;
    uint64_t nqueries;
    int kind;           /* JOB_* */
    const char *gather; /* kind 3 */
    uint64_t seed;
    double sink;
    uint64_t done;
} job_t;

enum { JOB_INSERT, JOB_LOOKUP, JOB_MIX, JOB_GATHER, JOB_TRAIN, JOB_APPLY };

static void *job_run(void *arg) {
    job_t *j = arg;
    const opts_t *o = j->o;
    uint32_t B = o->batch;
    float *out = malloc((size_t)B * o->dim * sizeof(float));
    float *grads = malloc((size_t)B * o->dim * sizeof(float));
    for (size_t i = 0; i < (size_t)B * o->dim; i++)
        grads[i] = 0.001f * (float)(i % 7);
    double sink = 0;
    if (j->kind == JOB_INSERT) {
        for (uint64_t i = 0; i < j->nqueries; i += B) {
            uint32_t m = (uint32_t)(j->nqueries - i < B ? j->nqueries - i : B);
            mt_err_t err = mt_table_lookup(j->t, j->queries + i, m, out, (size_t)m * o->dim, NULL,
                                           MT_TABLE_TRAIN, 1000, NULL);
            if (err) {
                fprintf(stderr, "insert: %s\n", mt_strerror(err));
                exit(1);
            }
            sink += out[0];
        }
    } else if (j->kind == JOB_LOOKUP) {
        for (uint64_t i = 0; i < j->nqueries; i += B) {
            uint32_t m = (uint32_t)(j->nqueries - i < B ? j->nqueries - i : B);
            mt_table_lookup(j->t, j->queries + i, m, out, (size_t)m * o->dim, NULL, 0, 0, NULL);
            sink += out[(m - 1) * o->dim];
        }
    } else if (j->kind == JOB_TRAIN) {
        for (uint64_t i = 0; i < j->nqueries; i += B) {
            uint32_t m = (uint32_t)(j->nqueries - i < B ? j->nqueries - i : B);
            mt_table_lookup(j->t, j->queries + i, m, out, (size_t)m * o->dim, NULL, MT_TABLE_TRAIN,
                            1002, NULL);
            sink += out[(m - 1) * o->dim];
        }
    } else if (j->kind == JOB_APPLY) {
        for (uint64_t i = 0; i < j->nqueries; i += B) {
            uint32_t m = (uint32_t)(j->nqueries - i < B ? j->nqueries - i : B);
            mt_table_apply(j->t, j->queries + i, m, grads, (size_t)m * o->dim, 1002, NULL);
        }
    } else if (j->kind == JOB_MIX) {
        /* Per batch: 90% of B ids looked up, 10% updated with Adagrad. */
        uint32_t nu = B / 10, nl = B - nu;
        for (uint64_t i = 0; i + B <= j->nqueries; i += B) {
            mt_table_lookup(j->t, j->queries + i, nl, out, (size_t)nl * o->dim, NULL, 0, 0, NULL);
            mt_table_apply(j->t, j->queries + i + nl, nu, grads, (size_t)nu * o->dim, 1001, NULL);
            sink += out[0];
        }
    } else {
        /* Independent loads (no division, one add per row) so that only memory limits it. */
        uint64_t rows = o->gather_bytes / 64, x = j->seed;
        float acc = 0;
        for (uint64_t i = 0; i < j->nqueries; i++) {
            uint64_t r = ((mt_bench_splitmix64(&x) & 0xFFFFFFFFu) * rows) >> 32;
            const float *row = (const float *)(const void *)(j->gather + r * 64);
            acc += row[0] + row[15];
        }
        sink = acc;
    }
    j->sink = sink;
    j->done = j->nqueries;
    free(out);
    free(grads);
    return NULL;
}

/* Runs nthreads copies of a job; each gets its own slice or stream. @returns seconds. */
static double run_threads(job_t *jobs, int nthreads) {
    pthread_t th[8];
    double t0 = mt_mono_s();
    for (int i = 0; i < nthreads; i++)
        pthread_create(&th[i], NULL, job_run, &jobs[i]);
    for (int i = 0; i < nthreads; i++)
        pthread_join(th[i], NULL);
    return mt_mono_s() - t0;
}

/* A table of one slot of o->dim Adagrad floats; shards_log2 0: the default parts. */
static mt_table_t *new_table(const opts_t *o, uint64_t initial_rows, uint32_t shards_log2) {
    mt_table_slot_config_t s;
    mt_table_slot_config_init(&s, 1, o->dim);
    s.opt = MT_OPT_ADAGRAD;
    mt_table_config_t c;
    mt_table_config_init(&c);
    c.slots = &s;
    c.nslots = 1;
    c.initial_rows = initial_rows;
    if (shards_log2) c.shards_log2 = shards_log2;
    mt_table_t *t;
    mt_err_t err = mt_table_create(&c, &t);
    if (err) {
        fprintf(stderr, "create: %s\n", mt_strerror(err));
        exit(1);
    }
    return t;
}

/* out[i]: query stream in[i] with each batch's ids grouped by their part of @p t
 * (mt_table_part_order(), per batch). */
static void order_batches(const mt_table_t *t, uint64_t *const in[2], uint64_t *out[2],
                          const opts_t *o) {
    uint32_t *to = malloc(o->batch * sizeof(uint32_t));
    if (!to) {
        fprintf(stderr, "order_batches: out of memory\n");
        exit(1);
    }
    for (int k = 0; k < 2; k++) {
        if (!(out[k] = malloc(o->ops * sizeof(uint64_t)))) {
            fprintf(stderr, "order_batches: out of memory\n");
            exit(1);
        }
        for (uint64_t i = 0; i < o->ops; i += o->batch) {
            size_t m = o->ops - i < o->batch ? (size_t)(o->ops - i) : o->batch;
            mt_err_t err = mt_table_part_order(t, in[k] + i, m, to, NULL);
            if (err) {
                fprintf(stderr, "order_batches: %s\n", mt_strerror(err));
                exit(1);
            }
            for (size_t j = 0; j < m; j++)
                out[k][i + to[j]] = in[k][i + j];
        }
    }
    free(to);
}

static void usage(void) {
    fprintf(stderr,
            "usage: table_bench [--rows N] [--dim D] [--batch B] [--ops N] [--reps R] [--quick]\n");
    exit(2);
}

int main(int argc, char **argv) {
    opts_t o = {.rows = 10000000,
                .dim = 16,
                .batch = 1000,
                .ops = 20000000,
                .gather_bytes = 640ull << 20,
                .reps = 3};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            o.rows = 200000;
            o.ops = 1000000;
            o.gather_bytes = 64ull << 20;
        } else if (i + 1 < argc && !strcmp(argv[i], "--rows")) {
            o.rows = strtoull(argv[++i], NULL, 10);
        } else if (i + 1 < argc && !strcmp(argv[i], "--dim")) {
            o.dim = (uint32_t)strtoul(argv[++i], NULL, 10);
        } else if (i + 1 < argc && !strcmp(argv[i], "--batch")) {
            o.batch = (uint32_t)strtoul(argv[++i], NULL, 10);
        } else if (i + 1 < argc && !strcmp(argv[i], "--reps")) {
            o.reps = atoi(argv[++i]);
        } else if (i + 1 < argc && !strcmp(argv[i], "--ops")) {
            o.ops = strtoull(argv[++i], NULL, 10);
        } else {
            usage();
        }
    }
    if (o.reps < 1 || o.reps > 16 || o.rows < 1000 || o.dim < 1 || o.dim > MT_TABLE_MAX_DIM ||
        o.batch < 10 || o.ops < o.batch)
        usage();
    char extra[512];
    double floor_rate[2] = {0, 0};
    job_t jobs[2];
    memset(jobs, 0, sizeof(jobs));

    mt_bench_cond_t cond;
    mt_bench_run_conditions("table");

    /* Floor: random 64-byte gathers from a big array on the same kind of pages as the
     * table's (huge pages asked for), mapped from the kernel and given back to it after: the
     * table below grows in a fresh heap. */
    mt_bench_cond_start(&cond);
    char *arr = mt_bench_alloc_huge(o.gather_bytes);
    if (!arr) {
        fprintf(stderr, "table_bench: out of memory\n");
        return 1;
    }
    {
        memset(arr, 1, o.gather_bytes);
        for (int nt = 1; nt <= 2; nt++) {
            mt_bench_rates_t r = {.n = 0};
            for (int rep = 0; rep <= o.reps; rep++) { /* pass 0 warms TLB and caches */
                for (int i = 0; i < nt; i++)
                    jobs[i] = (job_t){.o = &o,
                                      .kind = JOB_GATHER,
                                      .gather = arr,
                                      .nqueries = o.ops,
                                      .seed = 77 + (uint64_t)i};
                double sec = run_threads(jobs, nt);
                if (rep) r.v[r.n++] = (double)o.ops * nt / sec;
            }
            floor_rate[nt - 1] = mt_bench_rates_median(&r);
            snprintf(extra, sizeof(extra), "\"threads\":%d,\"array_mb\":%llu", nt,
                     (unsigned long long)(o.gather_bytes >> 20));
            mt_bench_rates_append(&r, extra, sizeof(extra));
            emit("gather_floor_rows_per_s", floor_rate[nt - 1], "rows/s", extra);
        }
    }
    mt_bench_cond_emit("table", "floor", &cond);
    mt_bench_free_huge(arr, o.gather_bytes);

    /* Keys and query streams. */
    uint64_t *keys = malloc(o.rows * sizeof(uint64_t));
    uint64_t rng = 12345;
    for (uint64_t i = 0; i < o.rows; i++)
        keys[i] = MT_FID_MAKE(1, mt_bench_splitmix64(&rng));
    uint64_t *uq[2], *zq[2];
    mt_zipf_t z;
    mt_zipf_init(&z, o.rows, 1.05);
    for (int t = 0; t < 2; t++) {
        uq[t] = malloc(o.ops * sizeof(uint64_t));
        zq[t] = malloc(o.ops * sizeof(uint64_t));
        uint64_t r = 999 + (uint64_t)t;
        for (uint64_t i = 0; i < o.ops; i++) {
            uq[t][i] = keys[mt_bench_splitmix64(&r) % o.rows];
            zq[t][i] = keys[mt_zipf_next(&z, mt_bench_rand01_cb, &r)];
        }
    }

    /* The table read by the lookup and mix figures, grown from empty like in production,
     * in a fresh heap: a table built from memory that earlier tables gave back to the
     * allocator sits partly on 4 KiB pages and reads slower (its TLB misses). */
    mt_bench_cond_start(&cond);
    double rss0 = rss_bytes();
    mt_table_t *t = new_table(&o, 0, 0);
    jobs[0] = (job_t){.o = &o, .t = t, .kind = JOB_INSERT, .queries = keys, .nqueries = o.rows};
    run_threads(jobs, 1);
    mt_table_stats_t st;
    mt_table_stats(t, &st);
    uint32_t row_bytes;
    mt_table_row_bytes(t, keys[0], &row_bytes);
    double payload = 8.0 + 4.0 * o.dim + 4.0 * o.dim + 16.0; /* key, emb, adagrad, metadata */
    double per_row = (double)st.bytes_total / (double)st.rows;
    double rss_rows = (rss_bytes() - rss0) / (double)st.rows; /* what the OS sees */
    /* The share of the table's own bytes on huge pages (its row blocks and bucket blocks are
     * the hinted mappings): a table whose arrays miss the huge pages reads slower for it. */
    uint64_t hr, hh, an, ah;
    double on_huge = mt_bench_thp(0, &hr, &hh, &an, &ah) == 0 && st.bytes_total
                         ? (double)hh / (double)st.bytes_total
                         : 0;
    snprintf(extra, sizeof(extra),
             "\"rows\":%llu,\"dim\":%u,\"payload_bytes\":%.0f,\"load_factor\":%.3f,"
             "\"bucket_bytes_per_row\":%.1f,\"slab_bytes_per_row\":%.1f,\"row_bytes\":%u,"
             "\"rss_bytes_per_row\":%.1f,\"table_on_huge_pages_share\":%.3f",
             (unsigned long long)st.rows, o.dim, payload, st.load_factor,
             (double)st.bytes_buckets / (double)st.rows, (double)st.bytes_rows / (double)st.rows,
             row_bytes, rss_rows, on_huge);
    emit("bytes_per_row", per_row, "bytes", extra);
    emit("bytes_per_row_over_payload", per_row / payload, "ratio", extra);
    emit("rss_bytes_per_row_over_payload", rss_rows / payload, "ratio", extra);
    mt_bench_cond_emit("table", "grow", &cond);

    /* Lookups (read-only, batched). */
    mt_bench_cond_start(&cond);
    const char *names[2] = {"uniform", "zipf1.05"};
    for (int d = 0; d < 2; d++) {
        for (int nt = 1; nt <= 2; nt++) {
            mt_bench_rates_t r = {.n = 0};
            for (int rep = 0; rep < o.reps; rep++) {
                for (int i = 0; i < nt; i++)
                    jobs[i] = (job_t){.o = &o,
                                      .t = t,
                                      .kind = JOB_LOOKUP,
                                      .queries = d ? zq[i] : uq[i],
                                      .nqueries = o.ops};
                r.v[r.n++] = (double)o.ops * nt / run_threads(jobs, nt);
            }
            double med = mt_bench_rates_median(&r);
            snprintf(extra, sizeof(extra),
                     "\"threads\":%d,\"keys\":\"%s\",\"rows\":%llu,\"dim\":%u,\"batch\":%u,"
                     "\"vs_gather_floor\":%.3f",
                     nt, names[d], (unsigned long long)o.rows, o.dim, o.batch,
                     med / floor_rate[nt - 1]);
            mt_bench_rates_append(&r, extra, sizeof(extra));
            emit("lookup_rate", med, "ids/s", extra);
        }
    }

    mt_bench_cond_emit("table", "lookup", &cond);

    /* The training step's calls on rows that exist: training lookups, then applies. Then the
     * same uniform stream on a table of 64 parts (a trainer's own: a batch holds many ids of
     * each part) in arrival order, and with each batch's ids grouped by part, as a trainer
     * sends them (a lock taken once a run of ids, one part's memory at a time). */
    mt_table_t *t64 = new_table(&o, 0, 6);
    jobs[0] = (job_t){.o = &o, .t = t64, .kind = JOB_INSERT, .queries = keys, .nqueries = o.rows};
    run_threads(jobs, 1);
    uint64_t *oq[2];
    order_batches(t64, uq, oq, &o);
    mt_bench_cond_start(&cond);
    const char *wnames[2] = {"train_lookup_rate", "apply_rate"};
    const char *wkeys[4] = {"uniform", "zipf1.05", "uniform", "uniform, each batch in part order"};
    const uint32_t pt = mt_table_parts_of(t, NULL, 0, NULL),
                   p64 = mt_table_parts_of(t64, NULL, 0, NULL);
    const uint32_t wparts[4] = {pt, pt, p64, p64};
    for (int kind = 0; kind < 2; kind++) {
        double arrival[2] = {0, 0};
        for (int d = 0; d < 4; d++) {
            for (int nt = 1; nt <= 2; nt++) {
                mt_bench_rates_t r = {.n = 0};
                uint64_t nq = o.ops / 2;
                for (int rep = 0; rep < o.reps; rep++) {
                    for (int i = 0; i < nt; i++)
                        jobs[i] = (job_t){.o = &o,
                                          .t = d >= 2 ? t64 : t,
                                          .kind = kind ? JOB_APPLY : JOB_TRAIN,
                                          .queries = d == 3   ? oq[i]
                                                     : d == 1 ? zq[i]
                                                              : uq[i],
                                          .nqueries = nq};
                    r.v[r.n++] = (double)nq * nt / run_threads(jobs, nt);
                }
                double med = mt_bench_rates_median(&r);
                if (d == 2) arrival[nt - 1] = med;
                int len =
                    snprintf(extra, sizeof(extra),
                             "\"threads\":%d,\"keys\":\"%s\",\"rows\":%llu,\"dim\":%u,\"batch\":%u,"
                             "\"parts\":%u",
                             nt, wkeys[d], (unsigned long long)o.rows, o.dim, o.batch, wparts[d]);
                if (d == 3 && len > 0 && (size_t)len < sizeof(extra))
                    snprintf(extra + len, sizeof(extra) - (size_t)len, ",\"vs_arrival_order\":%.3f",
                             med / arrival[nt - 1]);
                mt_bench_rates_append(&r, extra, sizeof(extra));
                emit(wnames[kind], med, "ids/s", extra);
            }
        }
    }

    mt_bench_cond_emit("table", "train_apply", &cond);
    mt_table_destroy(t64);

    /* 90% lookup / 10% update. */
    mt_bench_cond_start(&cond);
    for (int d = 0; d < 2; d++) {
        for (int nt = 1; nt <= 2; nt++) {
            mt_bench_rates_t r = {.n = 0};
            uint64_t done = (o.ops / 2 / o.batch) * o.batch;
            for (int rep = 0; rep < o.reps; rep++) {
                for (int i = 0; i < nt; i++)
                    jobs[i] = (job_t){.o = &o,
                                      .t = t,
                                      .kind = JOB_MIX,
                                      .queries = d ? zq[i] : uq[i],
                                      .nqueries = o.ops / 2};
                r.v[r.n++] = (double)done * nt / run_threads(jobs, nt);
            }
            double med = mt_bench_rates_median(&r);
            snprintf(extra, sizeof(extra),
                     "\"threads\":%d,\"keys\":\"%s\",\"rows\":%llu,\"dim\":%u,\"batch\":%u,"
                     "\"update_share\":0.1",
                     nt, names[d], (unsigned long long)o.rows, o.dim, o.batch);
            mt_bench_rates_append(&r, extra, sizeof(extra));
            emit("mix_rate", med, "ops/s", extra);
        }
    }

    mt_bench_cond_emit("table", "mix", &cond);

    /* Inserts while growing from empty, 1 and 2 threads; then pre-sized. */
    mt_table_destroy(t);
    t = NULL;
    for (int mode = 0; mode < 3; mode++) {
        mt_bench_cond_start(&cond);
        int nt = mode == 1 ? 2 : 1;
        int presized = mode == 2;
        mt_bench_rates_t r = {.n = 0};
        for (int rep = 0; rep < o.reps; rep++) {
            mt_table_destroy(t);
            t = new_table(&o, presized ? o.rows : 0, 0);
            uint64_t per = o.rows / (uint64_t)nt;
            for (int i = 0; i < nt; i++)
                jobs[i] = (job_t){.o = &o,
                                  .t = t,
                                  .kind = JOB_INSERT,
                                  .queries = keys + per * (uint64_t)i,
                                  .nqueries = i == nt - 1 ? o.rows - per * (uint64_t)i : per};
            r.v[r.n++] = (double)o.rows / run_threads(jobs, nt);
        }
        double med = mt_bench_rates_median(&r);
        snprintf(extra, sizeof(extra), "\"threads\":%d,\"rows\":%llu,\"dim\":%u,\"presized\":%s",
                 nt, (unsigned long long)o.rows, o.dim, presized ? "true" : "false");
        mt_bench_rates_append(&r, extra, sizeof(extra));
        emit("insert_rate", med, "ids/s", extra);
        mt_bench_cond_emit(
            "table", (const char *[]){"insert_1t", "insert_2t", "insert_presized"}[mode], &cond);
    }

    mt_table_destroy(t);
    free(keys);
    for (int i = 0; i < 2; i++) {
        free(uq[i]);
        free(zq[i]);
        free(oq[i]);
    }
    return 0;
}
