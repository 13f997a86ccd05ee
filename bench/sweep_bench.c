/*
 * sweep_bench.c - which trainer defaults train well (docs/trainer.md, "Choosing the
 * defaults"): a grid of sparse optimizers, sparse learning rates, embedding dims, batch sizes
 * and dense learning rates, trained with the real trainer library (mt/trainer.h over its own
 * local table: the code path of `monolith-trainer --train FILE --eval FILE`), each scored by
 * eval AUC and log loss on four data sets, next to the floor any CTR model should clear: a
 * one-pass FTRL-Proximal logistic regression on the same feature ids and the same split.
 *
 * Data (read in place from the shared data folder: --data DIR, else the environment's
 * MT_SHARED_DATA, else the build's; never copied into the repository). A missing set is
 * skipped with a line saying which file is missing; the program still exits 0.
 *   criteo     criteo-kaggle-sample/train_head10k.txt: the first 8,000 rows train, rows
 *              8,000-9,999 are the eval set, file order (the Criteo reader, 39 slots).
 *   ml-100k    movielens-100k (u.data, u.user, u.item) and
 *   ml-latest  movielens-latest-small (ratings.csv, movies.csv): every rating sorted by
 *              time (stable), the first 80% train in time order, the last 20% are the eval
 *              set (as bench/movielens_bench.c splits them); rating >= 4 is a positive.
 *   synthetic  the generator (mt/gen.h) with tests/unit/trainer's stream (20k Zipf users, 5k
 *              items, no births, CTR 0.1, seed 42): 200,000 examples train, the next 50,000
 *              are the eval set, whose true click probabilities give the ground-truth AUC
 *              (the best any model can reach on them).
 *
 * Every run starts from the shipped configuration (mt_config_init(): [trainer] dim, hidden,
 * batch_size, sparse_optimizer, sparse_lr, init_scale, dense_lr, seed; mapped to the trainer
 * as monolith-trainer maps it), changes only the swept keys, trains one epoch in batches of
 * the batch size in the order above, then scores the eval set with mt_trainer_predict().
 * On Criteo this gives monolith-trainer's eval AUC to the digit. AUC is exact
 * (mt_model_auc()); a run whose scores turn NaN counts as AUC 0.5 ("diverged").
 *
 * Stages:
 *  1. the floor: FTRL-Proximal LR (McMahan et al., KDD 2013, Algorithm 1: per-coordinate
 *     z and n, w = 0 while |z| <= l1), binary features = the example's fids plus a bias,
 *     one pass in training order; alpha x l1 x l2 over a small grid (beta 1), the best on
 *     the eval set is the floor (tuned on the eval set like the trainer's grid: a strong
 *     floor);
 *  2. the shipped defaults, and "defaults_vs_ftrl" (AUC difference and ratio);
 *  3. optimizer (all four of the table) x sparse_lr x dim x batch (256, 1024) at the
 *     default dense_lr, seed 1;
 *  4. a ranking by regret (per data set: the best AUC of the grid minus the
 *     configuration's), mean over the data sets and worst;
 *  5. around the top 3: dense_lr 0.0003, 0.003, 0.01 and batches of 128 and 512; ranked
 *     again ("rank_mean_regret"), and the best of each data set ("best_auc");
 *  6. the top 5, the shipped defaults and the old ones (Adagrad 0.05, dim 16, batch 1024)
 *     again with seeds 2..S (--seeds, default 3): mean AUC over the seeds and the ranking
 *     of those ("final_mean_regret", "final_auc_mean"; rank 1 is the winner).
 * 8 to 10 minutes on 2 loaded cores.
 *
 * --quick (the test command's smoke step): Criteo as above, the first 20,000 MovieLens
 * events by time, 20,000 + 5,000 synthetic examples; stages 1 and 2 only (a few seconds).
 *
 * One JSON object per line (bench_util.h); never asserts on time or AUC.
 * Usage: sweep_bench [--quick] [--data DIR] [--dataset NAME] [--seeds S]
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bench_util.h"
#include "mt/clock.h"
#include "mt/config.h"
#include "mt/gen.h"
#include "mt/jemalloc_conf.h"
#include "mt/readers.h"
#include "mt/trainer.h"

#ifndef MT_SHARED_DATA
#define MT_SHARED_DATA "../shared/data"
#endif

#define BENCH       "sweep"
#define MAX_DATA    4
#define MAX_CONFIGS 256
#define MAX_SEEDS   10
#define TOP_K       5

/* ---------------------------------------------------------------------------------------- */
/* Types                                                                                    */
/* ---------------------------------------------------------------------------------------- */

/* A data set: every example in memory, the training and eval orders as indices into it. */
typedef struct dataset {
    const char *name;
    mt_batch_t all;
    size_t *train, *eval; /* indices into all, in training / eval order */
    size_t ntrain, neval;
    float *eval_labels;   /* [neval], in eval order */
    double truth_auc;     /* synthetic: AUC of the true probabilities on the eval set; NaN */
    double floor_auc;     /* stage 1 */
    double floor_logloss; /* of the floor */
} dataset_t;

/* The swept keys of one run. */
typedef struct params {
    mt_table_opt_t opt;
    float sparse_lr, dense_lr;
    uint32_t dim;
    size_t batch; /* trainer.batch_size */
} params_t;

/* A configuration and what it scored on each data set (seed 1; then the mean over seeds). */
typedef struct entry {
    params_t p;
    double auc[MAX_DATA], logloss[MAX_DATA];
    double mean_regret, max_regret;
} entry_t;

typedef struct opts {
    int quick, seeds;
    const char *data, *only;
} opts_t;

static const char *const g_opt_names[] = {"sgd", "adagrad", "ftrl", "adam"};

/* ---------------------------------------------------------------------------------------- */
/* Data                                                                                     */
/* ---------------------------------------------------------------------------------------- */

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* A skipped data set: a line on stderr and one on stdout, so a clone without the data shows
 * what it did not measure. */
static void skip(const char *dataset, const char *missing) {
    fprintf(stderr, "sweep_bench: skipped %s: %s is missing\n", dataset, missing);
    char extra[4300];
    snprintf(extra, sizeof(extra), "\"dataset\":\"%s\",\"skipped\":\"missing ", dataset);
    size_t len = strlen(extra);
    for (const char *p = missing; *p && len + 3 < sizeof(extra); p++)
        extra[len++] = (*p == '"' || *p == '\\') ? '\'' : *p;
    extra[len] = '\0';
    mt_bench_appendf(extra, sizeof(extra), "\"");
    mt_bench_emit(BENCH, "skipped", 1, "dataset", extra);
}

/* Fills @p ds, taking over @p all and @p idx (even on error: dataset_free() frees them):
 * train = idx[0..ntrain), eval = the next neval. */
static mt_err_t dataset_make(dataset_t *ds, const char *name, mt_batch_t *all, size_t *idx,
                             size_t ntrain, size_t neval) {
    ds->name = name;
    ds->all = *all;
    memset(all, 0, sizeof(*all));
    ds->train = idx;
    ds->eval = idx + ntrain;
    ds->ntrain = ntrain;
    ds->neval = neval;
    ds->truth_auc = NAN;
    ds->eval_labels = malloc((neval ? neval : 1) * sizeof(float));
    if (!ds->eval_labels) return MT_NOMEM;
    for (size_t i = 0; i < neval; i++)
        ds->eval_labels[i] = ds->all.labels[ds->eval[i]];
    return MT_OK;
}

static void dataset_free(dataset_t *ds) {
    mt_batch_free(&ds->all);
    free(ds->train);
    free(ds->eval_labels);
}

static size_t *identity(size_t n) {
    size_t *idx = malloc((n ? n : 1) * sizeof(size_t));
    for (size_t i = 0; idx && i < n; i++)
        idx[i] = i;
    return idx;
}

/* Reads up to @p max examples (0: all) of reader @p r into @p all. */
static mt_err_t read_all(mt_reader_t *r, mt_batch_t *all, size_t max) {
    mt_err_t err = mt_reader_batch_init(r, all);
    while (!err && (!max || all->n < max))
        err = mt_reader_next(r, all, max ? max - all->n : 65536);
    return err == MT_NOT_FOUND || (!err && max && all->n >= max) ? MT_OK : err;
}

/* 1 loaded, 0 skipped (absent), -1 error. */
static int load_criteo(const opts_t *o, dataset_t *ds) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/criteo-kaggle-sample/train_head10k.txt", o->data);
    if (!exists(path)) {
        skip("criteo", path);
        return 0;
    }
    size_t ntrain = 8000, neval = 2000; /* small enough for --quick too */
    mt_reader_t *r = NULL;
    mt_batch_t all = {0};
    size_t *idx = NULL;
    mt_err_t err = mt_reader_criteo_open(NULL, path, NULL, &r);
    if (!err) err = read_all(r, &all, ntrain + neval);
    if (!err && all.n < ntrain + neval) err = MT_TRUNCATED;
    if (!err && !(idx = identity(all.n))) err = MT_NOMEM;
    if (!err) {
        err = dataset_make(ds, "criteo", &all, idx, ntrain, neval);
        idx = NULL;
    }
    mt_reader_destroy(r);
    mt_batch_free(&all);
    free(idx);
    if (err) fprintf(stderr, "sweep_bench: %s: %s\n", path, mt_err_name(err));
    return err ? -1 : 1;
}

static const mt_batch_t *g_all; /* for the qsort comparator only */

static int by_time(const void *a, const void *b) {
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    int64_t ti = g_all->timestamps_ms[i], tj = g_all->timestamps_ms[j];
    if (ti != tj) return ti < tj ? -1 : 1;
    return i < j ? -1 : i > j; /* stable: file order among equal times */
}

static int load_movielens(const opts_t *o, int latest, dataset_t *ds) {
    char ratings[4096], users[4096], items[4096];
    const char *name = latest ? "ml-latest" : "ml-100k";
    mt_movielens_config_t mc;
    mt_movielens_config_init(&mc);
    if (latest) {
        mc.format = MT_MOVIELENS_LATEST;
        snprintf(ratings, sizeof(ratings), "%s/movielens-latest-small/ratings.csv", o->data);
        snprintf(items, sizeof(items), "%s/movielens-latest-small/movies.csv", o->data);
    } else {
        snprintf(ratings, sizeof(ratings), "%s/movielens-100k/u.data", o->data);
        snprintf(users, sizeof(users), "%s/movielens-100k/u.user", o->data);
        snprintf(items, sizeof(items), "%s/movielens-100k/u.item", o->data);
        mc.users_path = users;
    }
    mc.items_path = items;
    const char *missing = !exists(ratings)                  ? ratings
                          : !exists(items)                  ? items
                          : mc.users_path && !exists(users) ? users
                                                            : NULL;
    if (missing) {
        skip(name, missing);
        return 0;
    }
    mt_reader_t *r = NULL;
    mt_batch_t all = {0};
    size_t *idx = NULL;
    mt_err_t err = mt_reader_movielens_open(&mc, ratings, NULL, &r);
    if (!err) err = read_all(r, &all, 0);
    if (!err && all.n < 100) err = MT_TRUNCATED;
    if (!err && !(idx = identity(all.n))) err = MT_NOMEM;
    if (!err) {
        g_all = &all;
        qsort(idx, all.n, sizeof(size_t), by_time);
        size_t n = o->quick && all.n > 20000 ? 20000 : all.n, ntrain = n * 8 / 10;
        err = dataset_make(ds, name, &all, idx, ntrain, n - ntrain);
        idx = NULL;
    }
    mt_reader_destroy(r);
    mt_batch_free(&all);
    free(idx);
    if (err) fprintf(stderr, "sweep_bench: %s: %s\n", ratings, mt_err_name(err));
    return err ? -1 : 1;
}

static int load_synthetic(const opts_t *o, dataset_t *ds) {
    mt_gen_config_t gc;
    mt_gen_config_init(&gc);
    gc.seed = 42;
    gc.num_users = 20000;
    gc.num_items = 5000;
    gc.users_born_per_s = 0;
    gc.items_born_per_s = 0;
    gc.user_half_life_s = 0;
    gc.item_half_life_s = 0;
    gc.target_ctr = 0.1;
    size_t ntrain = o->quick ? 20000 : 200000, neval = o->quick ? 5000 : 50000;
    mt_gen_t *g = NULL;
    mt_batch_t all = {0};
    size_t *idx = NULL;
    float *truth = malloc((ntrain + neval) * sizeof(float));
    mt_err_t err = truth ? mt_gen_create(&gc, &g) : MT_NOMEM;
    if (!err) err = mt_gen_next(g, &all, ntrain + neval, truth);
    if (!err && !(idx = identity(all.n))) err = MT_NOMEM;
    if (!err) {
        err = dataset_make(ds, "synthetic", &all, idx, ntrain, neval);
        idx = NULL;
    }
    if (!err) err = mt_model_auc(truth + ntrain, ds->eval_labels, neval, &ds->truth_auc);
    mt_gen_destroy(g);
    mt_batch_free(&all);
    free(idx);
    free(truth);
    if (err) fprintf(stderr, "sweep_bench: the generator: %s\n", mt_err_name(err));
    return err ? -1 : 1;
}

/* ---------------------------------------------------------------------------------------- */
/* The floor: one-pass FTRL-Proximal logistic regression                                    */
/* ---------------------------------------------------------------------------------------- */

/* Per-coordinate state keyed by fid in an open-addressing map (no collisions: the LR sees
 * exactly the trainer's ids), doubled at half load. */
typedef struct ftrl {
    double alpha, beta, l1, l2;
    uint64_t *keys; /* fid + 1; 0 = empty */
    double *z, *n;
    size_t cap, used;
} ftrl_t;

static size_t ftrl_find(const ftrl_t *f, uint64_t key) {
    size_t h = (size_t)(mt_bench_mix64(key) & (f->cap - 1));
    while (f->keys[h] && f->keys[h] != key)
        h = (h + 1) & (f->cap - 1);
    return h;
}

static int ftrl_grow(ftrl_t *f) {
    ftrl_t g = *f;
    g.cap = f->cap ? f->cap * 2 : 1 << 16;
    g.keys = calloc(g.cap, sizeof(uint64_t));
    g.z = calloc(g.cap, sizeof(double));
    g.n = calloc(g.cap, sizeof(double));
    if (!g.keys || !g.z || !g.n) {
        free(g.keys), free(g.z), free(g.n);
        return -1;
    }
    for (size_t i = 0; i < f->cap; i++)
        if (f->keys[i]) {
            size_t h = ftrl_find(&g, f->keys[i]);
            g.keys[h] = f->keys[i], g.z[h] = f->z[i], g.n[h] = f->n[i];
        }
    free(f->keys), free(f->z), free(f->n);
    *f = g;
    return 0;
}

/* The coordinate of @p fid (created at z = n = 0 when @p create), or SIZE_MAX. Never grows
 * the map (an index stays valid until the next ftrl_grow()): room is made beforehand. */
static size_t ftrl_coord(ftrl_t *f, uint64_t fid, int create) {
    size_t h = ftrl_find(f, fid + 1);
    if (f->keys[h]) return h;
    if (!create) return SIZE_MAX;
    f->keys[h] = fid + 1;
    f->used++;
    return h;
}

/* Algorithm 1's lazy weight of coordinate @p i. */
static double ftrl_w(const ftrl_t *f, size_t i) {
    double z = f->z[i];
    if (fabs(z) <= f->l1) return 0.0;
    return -(z - (z < 0 ? -f->l1 : f->l1)) / ((f->beta + sqrt(f->n[i])) / f->alpha + f->l2);
}

#define BIAS_FID (UINT64_MAX - 1) /* slot 0xFFFF: no reader makes it */

/* p(click) of example @p i of @p b before the update; with @p y >= 0 (training) also the
 * update on it; sets *oom when the map cannot grow. An example's first 1,023 fids count. */
static double ftrl_step(ftrl_t *f, const mt_batch_t *b, size_t i, double y, int *oom) {
    size_t coords[1024], nc = 0;
    int train = y >= 0;
    size_t nfids = b->offsets[(i + 1) * b->nslots] - b->offsets[i * b->nslots];
    while (train && 2 * (f->used + nfids + 1) > f->cap)
        if (ftrl_grow(f)) {
            *oom = 1;
            return 0.5;
        }
    size_t c = ftrl_coord(f, BIAS_FID, train);
    if (c != SIZE_MAX) coords[nc++] = c;
    for (uint32_t s = 0; s < b->nslots; s++) {
        size_t cnt;
        const uint64_t *fids = mt_batch_fids(b, i, s, &cnt);
        for (size_t k = 0; k < cnt && nc < 1024; k++) {
            c = ftrl_coord(f, fids[k], train);
            if (c != SIZE_MAX) coords[nc++] = c; /* SIZE_MAX: unseen in training, w = 0 */
        }
    }
    double logit = 0;
    for (size_t k = 0; k < nc; k++)
        logit += ftrl_w(f, coords[k]);
    double p = 1.0 / (1.0 + exp(-fmax(fmin(logit, 35), -35)));
    if (train) {
        double g = p - y; /* d logloss / d w_i for x_i = 1 */
        for (size_t k = 0; k < nc; k++) {
            size_t j = coords[k];
            double w = ftrl_w(f, j), sigma = (sqrt(f->n[j] + g * g) - sqrt(f->n[j])) / f->alpha;
            f->z[j] += g - sigma * w;
            f->n[j] += g * g;
        }
    }
    return p;
}

/* One pass over the training batches, then the eval set. @returns MT_OK or MT_NOMEM. */
static mt_err_t ftrl_run(const dataset_t *ds, double alpha, double l1, double l2, double *auc,
                         double *logloss) {
    ftrl_t f = {.alpha = alpha, .beta = 1.0, .l1 = l1, .l2 = l2};
    float *probs = malloc(ds->neval * sizeof(float));
    int oom = probs ? ftrl_grow(&f) : 1;
    for (size_t i = 0; !oom && i < ds->ntrain; i++)
        ftrl_step(&f, &ds->all, ds->train[i], ds->all.labels[ds->train[i]], &oom);
    double ll = 0;
    for (size_t i = 0; !oom && i < ds->neval; i++) {
        double p = fmin(fmax(ftrl_step(&f, &ds->all, ds->eval[i], -1, &oom), 1e-7), 1 - 1e-7);
        probs[i] = (float)p;
        ll -= ds->eval_labels[i] > 0.5f ? log(p) : log(1 - p);
    }
    mt_err_t err = oom ? MT_NOMEM : mt_model_auc(probs, ds->eval_labels, ds->neval, auc);
    *logloss = ll / (double)ds->neval;
    free(f.keys), free(f.z), free(f.n);
    free(probs);
    return err;
}

/* Stage 1: the best of a small grid (beta 1). */
static mt_err_t floor_of(dataset_t *ds) {
    static const double alphas[] = {0.01, 0.02, 0.05, 0.1, 0.2, 0.5};
    static const double l1s[] = {0, 1, 3}, l2s[] = {0, 1};
    double best = -1, ba = 0, bl1 = 0, bl2 = 0, bll = 0;
    for (size_t a = 0; a < sizeof(alphas) / sizeof(*alphas); a++)
        for (size_t i = 0; i < sizeof(l1s) / sizeof(*l1s); i++)
            for (size_t j = 0; j < sizeof(l2s) / sizeof(*l2s); j++) {
                double auc, ll;
                mt_err_t err = ftrl_run(ds, alphas[a], l1s[i], l2s[j], &auc, &ll);
                if (err) return err;
                if (auc > best) best = auc, ba = alphas[a], bl1 = l1s[i], bl2 = l2s[j], bll = ll;
            }
    ds->floor_auc = best;
    ds->floor_logloss = bll;
    char extra[512];
    snprintf(extra, sizeof(extra),
             "\"dataset\":\"%s\",\"model\":\"ftrl_lr\",\"alpha\":%g,\"beta\":1,\"l1\":%g,"
             "\"l2\":%g,\"grid\":%zu,\"logloss\":%.4f,\"train\":%zu,\"eval\":%zu",
             ds->name, ba, bl1, bl2,
             sizeof(alphas) / sizeof(*alphas) * (sizeof(l1s) / sizeof(*l1s)) *
                 (sizeof(l2s) / sizeof(*l2s)),
             bll, ds->ntrain, ds->neval);
    if (!isnan(ds->truth_auc))
        mt_bench_appendf(extra, sizeof(extra), ",\"truth_auc\":%.4f", ds->truth_auc);
    mt_bench_emit(BENCH, "floor_auc", best, "auc", extra);
    return MT_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* The trainer                                                                              */
/* ---------------------------------------------------------------------------------------- */

/* The trainer configuration monolith-trainer builds from @p c (trainer/main.c,
 * setup_trainer(), local table), for @p nslots slots. @returns 0 or -1 (bad hidden list). */
static int trainer_config_of(const mt_config_t *c, const mt_batch_t *b, mt_trainer_config_t *tc) {
    const mt_config_trainer_t *t = &c->trainer;
    mt_trainer_config_init(tc);
    tc->nslots = b->nslots;
    memcpy(tc->slot_ids, b->slot_ids, b->nslots * sizeof(uint16_t));
    tc->dim = t->dim;
    uint64_t hidden[8];
    size_t nh = 0;
    char err[256];
    if (mt_config_parse_uint_list(t->hidden, 1, 65536, hidden, 8, &nh, err, sizeof(err))) return -1;
    tc->nhidden = (uint32_t)nh;
    for (size_t i = 0; i < nh; i++)
        tc->hidden[i] = (uint32_t)hidden[i];
    tc->seed = t->seed;
    tc->sparse_opt = t->sparse_opt;
    tc->sparse_lr = t->sparse_lr;
    tc->init_scale = t->init_scale;
    tc->min_count = t->min_count;
    tc->dense_lr = t->dense_lr;
    tc->hash_buckets = t->hash_buckets;
    tc->table_initial_rows = t->table_initial_rows;
    return 0;
}

/* What one run scored. A diverged run (NaN scores) counts as a coin: AUC 0.5. */
typedef struct score {
    double auc, logloss, seconds;
    double train_s; /* in mt_trainer_train() only */
    int diverged;
} score_t;

/* One epoch over the training examples with @p p (and @p seed), in batches of p->batch,
 * then the eval set. */
static mt_err_t train_eval(const mt_config_t *c, const dataset_t *ds, const params_t *p,
                           uint64_t seed, score_t *sc) {
    mt_trainer_config_t tc;
    if (trainer_config_of(c, &ds->all, &tc)) return MT_CONFIG;
    tc.sparse_opt = p->opt;
    tc.sparse_lr = p->sparse_lr;
    tc.dense_lr = p->dense_lr;
    tc.dim = p->dim;
    tc.seed = seed;
    tc.table_shards_log2 = 2; /* a small table: the runs are short */
    mt_trainer_t *tr = NULL;
    mt_batch_t b = {0};
    float *probs = malloc((ds->neval + p->batch) * sizeof(float));
    if (!probs) return MT_NOMEM;
    double t0 = mt_mono_s();
    sc->train_s = 0;
    mt_err_t err = mt_trainer_create(&tc, &tr);
    if (!err) err = mt_batch_init(&b, ds->all.slot_ids, ds->all.nslots);
    for (size_t i = 0; !err && i < ds->ntrain; i += p->batch) {
        size_t m = ds->ntrain - i < p->batch ? ds->ntrain - i : p->batch;
        err = mt_batch_gather(&ds->all, ds->train + i, m, &b);
        double t1 = mt_mono_s();
        if (!err) err = mt_trainer_train(tr, &b, (uint32_t)(i / p->batch + 1), probs, NULL);
        sc->train_s += mt_mono_s() - t1;
    }
    for (size_t i = 0; !err && i < ds->neval; i += p->batch) {
        size_t m = ds->neval - i < p->batch ? ds->neval - i : p->batch;
        err = mt_batch_gather(&ds->all, ds->eval + i, m, &b);
        if (!err) err = mt_trainer_predict(tr, &b, probs + i);
    }
    double ll = 0;
    sc->diverged = 0;
    for (size_t i = 0; !err && i < ds->neval; i++) {
        sc->diverged |= isnan(probs[i]);
        double q = fmin(fmax(probs[i], 1e-7), 1 - 1e-7);
        ll -= ds->eval_labels[i] > 0.5f ? log(q) : log(1 - q);
    }
    sc->auc = 0.5;
    sc->logloss = sc->diverged ? NAN : ll / (double)ds->neval;
    if (!err && !sc->diverged) err = mt_model_auc(probs, ds->eval_labels, ds->neval, &sc->auc);
    sc->seconds = mt_mono_s() - t0;
    mt_batch_free(&b);
    mt_trainer_destroy(tr);
    free(probs);
    return err;
}

/* "key":value with 4 decimals, or null when not finite (JSON has no NaN). */
static void append_num(char *buf, size_t len, const char *key, double v) {
    if (isfinite(v))
        mt_bench_appendf(buf, len, ",\"%s\":%.4f", key, v);
    else
        mt_bench_appendf(buf, len, ",\"%s\":null", key);
}

static void append_params(char *buf, size_t len, const params_t *p) {
    mt_bench_appendf(buf, len,
                     ",\"optimizer\":\"%s\",\"sparse_lr\":%g,\"dim\":%u,\"dense_lr\":%g,"
                     "\"batch\":%zu",
                     g_opt_names[p->opt], (double)p->sparse_lr, p->dim, (double)p->dense_lr,
                     p->batch);
}

/* Trains @p e on every data set with @p seed, one line each named @p metric. */
static mt_err_t run_entry(const mt_config_t *c, const dataset_t *ds, int nds, entry_t *e,
                          uint64_t seed, const char *metric) {
    for (int d = 0; d < nds; d++) {
        score_t sc;
        mt_err_t err = train_eval(c, &ds[d], &e->p, seed, &sc);
        if (err) {
            fprintf(stderr, "sweep_bench: %s: %s\n", ds[d].name, mt_err_name(err));
            return err;
        }
        e->auc[d] = sc.auc;
        e->logloss[d] = sc.logloss;
        char extra[512];
        snprintf(extra, sizeof(extra), "\"dataset\":\"%s\"", ds[d].name);
        append_params(extra, sizeof(extra), &e->p);
        mt_bench_appendf(extra, sizeof(extra), ",\"seed\":%llu", (unsigned long long)seed);
        append_num(extra, sizeof(extra), "logloss", sc.logloss);
        append_num(extra, sizeof(extra), "vs_floor", sc.auc - ds[d].floor_auc);
        mt_bench_appendf(extra, sizeof(extra), ",\"run_s\":%.2f,\"train_examples_per_s\":%.0f%s",
                         sc.seconds, (double)ds[d].ntrain / sc.train_s,
                         sc.diverged ? ",\"diverged\":true" : "");
        mt_bench_emit(BENCH, metric, sc.auc, "auc", extra);
    }
    return MT_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Ranking                                                                                  */
/* ---------------------------------------------------------------------------------------- */

static void regrets(entry_t *v, int n, int nds) {
    for (int d = 0; d < nds; d++) {
        double best = 0;
        for (int i = 0; i < n; i++)
            best = fmax(best, v[i].auc[d]);
        for (int i = 0; i < n; i++) {
            double r = best - v[i].auc[d];
            if (d == 0) v[i].mean_regret = v[i].max_regret = 0;
            v[i].mean_regret += r / nds;
            v[i].max_regret = fmax(v[i].max_regret, r);
        }
    }
}

static int by_regret(const void *a, const void *b) {
    const entry_t *x = a, *y = b;
    return x->mean_regret < y->mean_regret ? -1 : x->mean_regret > y->mean_regret;
}

static int same(const params_t *a, const params_t *b) {
    return a->opt == b->opt && a->sparse_lr == b->sparse_lr && a->dim == b->dim &&
           a->dense_lr == b->dense_lr && a->batch == b->batch;
}

/* One line per configuration: its mean regret, worst regret and AUC per data set. */
static void emit_ranked(const char *metric, const entry_t *e, int rank, const dataset_t *ds,
                        int nds, int seeds, const char *tag) {
    char extra[1024];
    snprintf(extra, sizeof(extra), "\"rank\":%d", rank);
    append_params(extra, sizeof(extra), &e->p);
    mt_bench_appendf(extra, sizeof(extra), ",\"seeds\":%d", seeds);
    append_num(extra, sizeof(extra), "max_regret", e->max_regret);
    for (int d = 0; d < nds; d++)
        append_num(extra, sizeof(extra), ds[d].name, e->auc[d]);
    if (tag) mt_bench_appendf(extra, sizeof(extra), ",\"tag\":\"%s\"", tag);
    mt_bench_emit(BENCH, metric, e->mean_regret, "auc", extra);
}

/* The best entry of data set @p d among v[0..n). */
static const entry_t *best_of(const entry_t *v, int n, int d) {
    const entry_t *b = v;
    for (int i = 1; i < n; i++)
        if (v[i].auc[d] > b->auc[d]) b = &v[i];
    return b;
}

/* Adds @p p to v[0..*n) (of MAX_CONFIGS) unless it is there; @returns its index. */
static int add_unique(entry_t *v, int *n, const params_t *p) {
    for (int i = 0; i < *n; i++)
        if (same(&v[i].p, p)) return i;
    if (*n == MAX_CONFIGS) { /* the grids above are smaller: a programming error */
        fprintf(stderr, "sweep_bench: more than %d configurations\n", MAX_CONFIGS);
        exit(1);
    }
    memset(&v[*n], 0, sizeof(v[*n]));
    v[*n].p = *p;
    return (*n)++;
}

/* ---------------------------------------------------------------------------------------- */
/* main                                                                                     */
/* ---------------------------------------------------------------------------------------- */

static int usage(void) {
    fprintf(stderr, "usage: sweep_bench [--quick] [--data DIR] "
                    "[--dataset criteo|ml-100k|ml-latest|synthetic] [--seeds S (1..10)]\n");
    return 2;
}

int main(int argc, char **argv) {
    mt_bench_run_conditions("sweep");
    const char *env = getenv("MT_SHARED_DATA");
    opts_t o = {.seeds = 3, .data = env && *env ? env : MT_SHARED_DATA};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick"))
            o.quick = 1;
        else if (!v)
            return usage();
        else if (!strcmp(a, "--data"))
            o.data = argv[++i];
        else if (!strcmp(a, "--dataset"))
            o.only = argv[++i];
        else if (!strcmp(a, "--seeds"))
            o.seeds = atoi(argv[++i]);
        else
            return usage();
    }
    if (o.seeds < 1 || o.seeds > MAX_SEEDS) return usage();
    static const char *const names[MAX_DATA] = {"criteo", "ml-100k", "ml-latest", "synthetic"};
    int known = !o.only;
    for (int k = 0; k < MAX_DATA; k++)
        known |= o.only && !strcmp(o.only, names[k]);
    if (!known) return usage();
    openblas_set_num_threads(1); /* one core per trainer, as the daemon runs */
    double t_start = mt_mono_s();

    mt_config_t cfg;
    if (mt_config_init(&cfg) != MT_OK) return 1;
    int rc = 1;
    dataset_t ds[MAX_DATA];
    memset(ds, 0, sizeof(ds));
    static entry_t grid[MAX_CONFIGS], fin[MAX_CONFIGS];
    int nds = 0, n = 0, nf = 0;
    for (int k = 0; k < MAX_DATA; k++) {
        if (o.only && strcmp(o.only, names[k])) continue;
        int got = k == 0   ? load_criteo(&o, &ds[nds])
                  : k == 1 ? load_movielens(&o, 0, &ds[nds])
                  : k == 2 ? load_movielens(&o, 1, &ds[nds])
                           : load_synthetic(&o, &ds[nds]);
        if (got < 0) goto out;
        if (got > 0) nds++;
    }

    /* Stage 1: the floor of every data set. */
    for (int d = 0; d < nds; d++) {
        char extra[256];
        snprintf(extra, sizeof(extra), "\"dataset\":\"%s\",\"train\":%zu,\"eval\":%zu", ds[d].name,
                 ds[d].ntrain, ds[d].neval);
        mt_bench_emit(BENCH, "examples", (double)(ds[d].ntrain + ds[d].neval), "examples", extra);
        if (floor_of(&ds[d]) != MT_OK) goto out;
    }

    /* Stage 2: the shipped defaults against the floor. */
    const params_t shipped = {cfg.trainer.sparse_opt, cfg.trainer.sparse_lr, cfg.trainer.dense_lr,
                              cfg.trainer.dim, cfg.trainer.batch_size};
    const params_t old = {MT_OPT_ADAGRAD, 0.05f, 0.001f, 16, 1024}; /* before the sweep */
    entry_t def = {.p = shipped};
    if (nds && run_entry(&cfg, ds, nds, &def, cfg.trainer.seed, "defaults_auc")) goto out;
    for (int d = 0; d < nds; d++) {
        char extra[512];
        snprintf(extra, sizeof(extra), "\"dataset\":\"%s\"", ds[d].name);
        append_num(extra, sizeof(extra), "defaults_auc", def.auc[d]);
        append_num(extra, sizeof(extra), "ftrl_auc", ds[d].floor_auc);
        append_num(extra, sizeof(extra), "ratio", def.auc[d] / ds[d].floor_auc);
        append_params(extra, sizeof(extra), &def.p);
        mt_bench_emit(BENCH, "defaults_vs_ftrl", def.auc[d] - ds[d].floor_auc, "auc", extra);
    }
    if (o.quick || nds == 0) {
        rc = 0;
        goto out;
    }

    /* Stage 3: optimizer x sparse_lr x dim x batch at the default dense_lr, seed 1. */
    static const mt_table_opt_t optims[] = {MT_OPT_ADAGRAD, MT_OPT_FTRL, MT_OPT_ADAM, MT_OPT_SGD};
    static const float lrs[] = {0.001f, 0.002f, 0.005f, 0.01f, 0.02f, 0.05f, 0.1f, 0.2f};
    static const uint32_t dims[] = {4, 8, 16};
    static const size_t batches[] = {256, 1024};
    for (size_t a = 0; a < sizeof(optims) / sizeof(*optims); a++)
        for (size_t b = 0; b < sizeof(dims) / sizeof(*dims); b++)
            for (size_t z = 0; z < sizeof(batches) / sizeof(*batches); z++)
                for (size_t l = 0; l < sizeof(lrs) / sizeof(*lrs); l++) {
                    params_t p = {optims[a], lrs[l], cfg.trainer.dense_lr, dims[b], batches[z]};
                    int before = n, i = add_unique(grid, &n, &p);
                    if (n > before && run_entry(&cfg, ds, nds, &grid[i], 1, "eval_auc")) goto out;
                }

    /* Stages 4 and 5: rank; dense_lr and more batch sizes around the top 3. */
    regrets(grid, n, nds);
    qsort(grid, (size_t)n, sizeof(entry_t), by_regret);
    static const float dense_lrs[] = {0.0003f, 0.003f, 0.01f};
    static const size_t more_batches[] = {128, 512};
    int top = n < 3 ? n : 3;
    for (int t = 0; t < top; t++) {
        params_t vary[5];
        for (int k = 0; k < 5; k++)
            vary[k] = grid[t].p;
        for (int k = 0; k < 3; k++)
            vary[k].dense_lr = dense_lrs[k];
        vary[3].batch = more_batches[0];
        vary[4].batch = more_batches[1];
        for (int k = 0; k < 5; k++) {
            int before = n, i = add_unique(grid, &n, &vary[k]);
            if (n > before && run_entry(&cfg, ds, nds, &grid[i], 1, "eval_auc")) goto out;
        }
    }
    regrets(grid, n, nds);
    qsort(grid, (size_t)n, sizeof(entry_t), by_regret);
    for (int i = 0; i < n; i++)
        emit_ranked("rank_mean_regret", &grid[i], i + 1, ds, nds, 1, NULL);
    for (int d = 0; d < nds; d++) {
        const entry_t *b = best_of(grid, n, d);
        char extra[512];
        snprintf(extra, sizeof(extra), "\"dataset\":\"%s\"", ds[d].name);
        append_params(extra, sizeof(extra), &b->p);
        append_num(extra, sizeof(extra), "logloss", b->logloss[d]);
        append_num(extra, sizeof(extra), "ftrl_auc", ds[d].floor_auc);
        if (!isnan(ds[d].truth_auc)) append_num(extra, sizeof(extra), "truth_auc", ds[d].truth_auc);
        mt_bench_emit(BENCH, "best_auc", b->auc[d], "auc", extra);
    }

    /* Stage 6: the top 5, the shipped and the old defaults over seeds 1..S. */
    for (int i = 0; i < n && nf < TOP_K; i++)
        fin[add_unique(fin, &nf, &grid[i].p)] = grid[i];
    const params_t *also[2] = {&shipped, &old};
    for (int k = 0; k < 2; k++) {
        int before = nf, i = add_unique(fin, &nf, also[k]);
        if (nf == before) continue;
        int in_grid = n, j = add_unique(grid, &n, also[k]); /* seed 1: the grid's, or now */
        if (n > in_grid && run_entry(&cfg, ds, nds, &grid[j], 1, "eval_auc")) goto out;
        fin[i] = grid[j];
    }
    for (int i = 0; i < nf; i++) {
        double sum[MAX_DATA], lsum[MAX_DATA];
        for (int d = 0; d < nds; d++)
            sum[d] = fin[i].auc[d], lsum[d] = fin[i].logloss[d];
        for (int s = 2; s <= o.seeds; s++) {
            entry_t e = {.p = fin[i].p};
            if (run_entry(&cfg, ds, nds, &e, (uint64_t)s, "eval_auc_seed")) goto out;
            for (int d = 0; d < nds; d++)
                sum[d] += e.auc[d], lsum[d] += e.logloss[d];
        }
        for (int d = 0; d < nds; d++) {
            fin[i].auc[d] = sum[d] / o.seeds;
            fin[i].logloss[d] = lsum[d] / o.seeds;
        }
    }
    regrets(fin, nf, nds);
    qsort(fin, (size_t)nf, sizeof(entry_t), by_regret);
    for (int i = 0; i < nf; i++) {
        const char *tag = same(&fin[i].p, &shipped) ? "shipped"
                          : same(&fin[i].p, &old)   ? "old_default"
                                                    : NULL;
        emit_ranked("final_mean_regret", &fin[i], i + 1, ds, nds, o.seeds, tag);
        for (int d = 0; d < nds; d++) {
            char extra[512];
            snprintf(extra, sizeof(extra), "\"dataset\":\"%s\",\"rank\":%d", ds[d].name, i + 1);
            append_params(extra, sizeof(extra), &fin[i].p);
            mt_bench_appendf(extra, sizeof(extra), ",\"seeds\":%d", o.seeds);
            append_num(extra, sizeof(extra), "logloss_mean", fin[i].logloss[d]);
            append_num(extra, sizeof(extra), "ftrl_auc", ds[d].floor_auc);
            append_num(extra, sizeof(extra), "vs_floor", fin[i].auc[d] - ds[d].floor_auc);
            if (!isnan(ds[d].truth_auc))
                append_num(extra, sizeof(extra), "truth_auc", ds[d].truth_auc);
            if (tag) mt_bench_appendf(extra, sizeof(extra), ",\"tag\":\"%s\"", tag);
            mt_bench_emit(BENCH, "final_auc_mean", fin[i].auc[d], "auc", extra);
        }
    }
    rc = 0;
out:
    if (rc == 0) mt_bench_emit(BENCH, "wall_s", mt_mono_s() - t_start, "s", NULL);
    for (int d = 0; d < MAX_DATA; d++)
        dataset_free(&ds[d]);
    mt_config_free(&cfg);
    return rc;
}
