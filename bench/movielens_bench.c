/*
 * movielens_bench.c - the Monolith paper's collisionless-vs-hashed comparison in miniature
 * (issue #4): the same DeepFM-style model trained on MovieLens with exact embeddings and with
 * the user and movie ids hashed into fewer rows, at the paper's collision rates (7.73% of
 * user ids, 2.86% of movie ids), AUC of each over several seeds.
 *
 * Data: the largest MovieLens the readers support, ml-latest-small (100,836 ratings, 610
 * users, 9,724 rated movies, 1996-2018; side slot: genres), or ml-100k with --variant 100k
 * (100,000 ratings; side slots age, gender, occupation, genres). Read in place from the
 * shared data folder (research / non-commercial terms: never copied into the repository).
 * A rating >= 4 is a positive (48% of latest-small, 55% of 100k).
 *
 * Split by time: all ratings sorted by timestamp; the first 80% train, the last 20% are the
 * test set (AUC and log loss, no training on them). Most test events come from users the
 * training period never saw (90% on latest-small, 85% on 100k: MovieLens users rate in
 * bursts), whose embeddings are all zero in the collisionless table and someone else's in
 * the hashed one; the movies are mostly known (85% / 99% of test events).
 *
 * Collision rate of a slot = the fraction of its distinct ids (over the whole file, or the
 * subset with --quick) that share their bucket with at least one other id of the slot. The
 * trainer reduces a fid's 48-bit value modulo the slot's bucket count
 * (mt_trainer_config_t.slot_hash_buckets). The MovieLens reader's user and movie values are
 * the raw integer ids (mt_fid_of_int), and value % B of sequential ids is no hash: it pairs
 * the oldest ids with the newest. So by default (--ids hashed) the bench first replaces the
 * user and movie values by a salted 48-bit hash (a new salt, hence a new collision pattern,
 * per seed; checked to merge no ids), as a hashed embedding table would; --ids raw keeps the
 * raw ids. Either way the rate is computed exactly on the values the trainer reduces: B is
 * found by bisection (smallest B at or under the target) and then the closest rate in a
 * window of B around it. Side slots stay collisionless in both runs.
 *
 * Per seed (1..S): a collisionless and a hashed run, identical otherwise (the seed sets the
 * model init, the embedding init, the shuffle and the id hash; both modes see the same).
 *
 * Hyperparameters (defaults), chosen by a small sweep on a validation split that never
 * touches the test period (--holdout valid: train on the first 64% by time, evaluate on
 * 64-80%), 3 seeds, judged on the collisionless AUC only (0.687-0.689 on latest-small,
 * 0.709-0.710 on 100k for every setting below: the choice matters little):
 *   dim 8, MLP 64-32: dim 8 edged dim 16 by 0.001 on both sets; 64-32 fits 100k events.
 *   Adagrad sparse lr 0.05 (the trainer's default at the time; docs/trainer.md says why it
 *   is FTRL now); 0.01, 0.02 and 0.1 were no better.
 *   Adam dense lr 0.001 (the default; 0.0003 and 0.003 no better), batch 256 (128 / 512 same).
 *   1 epoch: the 2nd and 3rd lowered validation AUC and raised log loss (the ids overfit).
 *   training order shuffled (seeded); time order gave the same AUC.
 * Literature-typical AUC for such models on these sets with random splits is about
 * 0.75-0.82 (the --quick subset, 1996-97 events, gives 0.77); the time split of the whole
 * set, with mostly unseen test users, gives about 0.68 (latest-small) and 0.70 (100k).
 *
 * One JSON object per line: one per run, then a summary. Never asserts on time.
 * Usage: movielens_bench [--seeds N] [--epochs N] [--data DIR] [--variant latest|100k]
 *                        [--quick] [--holdout test|valid] [--dim D] [--sparse-lr X]
 *                        [--dense-lr X] [--batch B] [--order shuffle|time] [--ids hashed|raw]
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "bench_util.h"
#include "mt/clock.h"
#include "mt/jemalloc_conf.h"
#include "mt/readers.h"
#include "mt/trainer.h"

#ifndef MT_SHARED_DATA
#define MT_SHARED_DATA "../shared/data"
#endif

#define USER_RATE     0.0773 /* the paper's collision rates */
#define ITEM_RATE     0.0286
#define QUICK_EVENTS  20000 /* --quick: the first events by time */
#define MAX_SEEDS     100
#define SEARCH_WINDOW 256 /* buckets scanned on each side of the bisection's answer */

typedef struct opts {
    int seeds, epochs, quick, valid, shuffle, mix;
    const char *data, *variant;
    uint32_t dim;
    float sparse_lr, dense_lr;
    size_t batch;
} opts_t;

typedef struct slot_ids {
    uint64_t *v; /* distinct values, sorted */
    size_t n;
    uint64_t buckets; /* B at the target rate */
    double rate;      /* achieved collision rate at B */
} slot_ids_t;

typedef struct result {
    double auc, logloss, examples_per_s;
    uint64_t rows;
} result_t;

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static void skip(const char *why) {
    fprintf(stderr, "movielens_bench: skipped: %s\n", why);
    printf("{\"bench\":\"movielens\",\"skipped\":\"%s\"}\n", why);
}

/* ---------------------------------------------------------------------------------------- */
/* Data: read everything, order by time                                                     */
/* ---------------------------------------------------------------------------------------- */

static const mt_batch_t *g_all; /* for the qsort comparator only */

static int by_time(const void *a, const void *b) {
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    int64_t ti = g_all->timestamps_ms[i], tj = g_all->timestamps_ms[j];
    if (ti != tj) return ti < tj ? -1 : 1;
    return i < j ? -1 : i > j; /* stable: file order among equal times */
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The distinct values (low 48 bits of the fids) of slot index @p s over examples @p idx. */
static int distinct_values(const mt_batch_t *all, const size_t *idx, size_t n, uint32_t s,
                           slot_ids_t *out) {
    out->v = malloc((n ? n : 1) * sizeof(uint64_t));
    if (!out->v) return -1;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        size_t c;
        const uint64_t *f = mt_batch_fids(all, idx[i], s, &c);
        for (size_t j = 0; j < c; j++)
            out->v[k++] = f[j] & 0xFFFFFFFFFFFFull;
    }
    qsort(out->v, k, sizeof(uint64_t), cmp_u64);
    size_t u = 0;
    for (size_t i = 0; i < k; i++)
        if (u == 0 || out->v[u - 1] != out->v[i]) out->v[u++] = out->v[i];
    out->n = u;
    return 0;
}

/* The fraction of the distinct values @p v whose bucket value % B holds another one too
 * (@p scratch: n values). */
static double collision_rate(const uint64_t *v, size_t n, uint64_t B, uint64_t *scratch) {
    for (size_t i = 0; i < n; i++)
        scratch[i] = v[i] % B;
    qsort(scratch, n, sizeof(uint64_t), cmp_u64);
    size_t shared = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        while (j < n && scratch[j] == scratch[i])
            j++;
        if (j - i > 1) shared += j - i;
        i = j;
    }
    return n ? (double)shared / (double)n : 0.0;
}

/* Finds B whose collision rate is closest to @p target: bisection for the smallest B at or
 * under it (the rate falls with B, though not strictly), then a scan of a window around. */
static int find_buckets(slot_ids_t *s, double target) {
    uint64_t top = s->v[s->n - 1] + 1, hi = top; /* every value its own bucket: rate 0 */
    uint64_t *scratch = malloc(s->n * sizeof(uint64_t));
    if (!scratch) return -1;
    uint64_t lo = 1;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (collision_rate(s->v, s->n, mid, scratch) <= target)
            hi = mid;
        else
            lo = mid + 1;
    }
    uint64_t from = lo > SEARCH_WINDOW ? lo - SEARCH_WINDOW : 1;
    uint64_t to = top - lo > SEARCH_WINDOW ? lo + SEARCH_WINDOW : top;
    s->buckets = lo;
    s->rate = collision_rate(s->v, s->n, lo, scratch);
    for (uint64_t B = from; B <= to; B++) {
        double r = collision_rate(s->v, s->n, B, scratch);
        if (fabs(r - target) < fabs(s->rate - target)) {
            s->buckets = B;
            s->rate = r;
        }
    }
    free(scratch);
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* One run                                                                                  */
/* ---------------------------------------------------------------------------------------- */

static mt_err_t run(const opts_t *o, const mt_batch_t *all, const size_t *train, size_t ntrain,
                    const size_t *test, size_t ntest, uint64_t seed, uint64_t user_buckets,
                    uint64_t item_buckets, result_t *res) {
    mt_trainer_config_t tc;
    mt_trainer_config_init(&tc);
    tc.nslots = all->nslots;
    memcpy(tc.slot_ids, all->slot_ids, all->nslots * sizeof(uint16_t));
    tc.dim = o->dim;
    tc.nhidden = 2;
    tc.hidden[0] = 64;
    tc.hidden[1] = 32;
    tc.seed = seed;
    tc.sparse_opt = MT_OPT_ADAGRAD; /* as tuned above */
    tc.sparse_lr = o->sparse_lr;
    tc.dense_lr = o->dense_lr;
    tc.table_shards_log2 = 2;
    tc.slot_hash_buckets[0] = user_buckets; /* the reader's slot order: user, item, side */
    tc.slot_hash_buckets[1] = item_buckets;
    mt_trainer_t *tr = NULL;
    mt_batch_t b = {0};
    size_t *order = malloc(ntrain * sizeof(size_t));
    float *probs = malloc(ntest * sizeof(float)), *labels = malloc(ntest * sizeof(float));
    mt_err_t err = MT_NOMEM;
    if (!order || !probs || !labels) goto out;
    if ((err = mt_trainer_create(&tc, &tr)) != MT_OK) goto out;
    if ((err = mt_batch_init(&b, all->slot_ids, all->nslots)) != MT_OK) goto out;
    memcpy(order, train, ntrain * sizeof(size_t));
    uint64_t rng = seed * 0x2545F4914F6CDD1Dull; /* the same order for both modes */
    double train_s = 0;
    for (int e = 0; e < o->epochs; e++) {
        if (o->shuffle)
            for (size_t i = ntrain - 1; i > 0; i--) {
                size_t j = (size_t)(mt_bench_splitmix64(&rng) % (i + 1)), t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
        for (size_t i = 0; i < ntrain; i += o->batch) {
            size_t m = ntrain - i < o->batch ? ntrain - i : o->batch;
            if ((err = mt_batch_gather(all, order + i, m, &b)) != MT_OK) goto out;
            uint32_t t_s = (uint32_t)(b.timestamps_ms[m - 1] / 1000);
            double t0 = mt_mono_s();
            err = mt_trainer_train(tr, &b, t_s, NULL, NULL);
            train_s += mt_mono_s() - t0;
            if (err) goto out;
        }
    }
    double ll = 0;
    for (size_t i = 0; i < ntest; i += o->batch) {
        size_t m = ntest - i < o->batch ? ntest - i : o->batch;
        if ((err = mt_batch_gather(all, test + i, m, &b)) != MT_OK) goto out;
        if ((err = mt_trainer_predict(tr, &b, probs + i)) != MT_OK) goto out;
        for (size_t j = 0; j < m; j++) {
            float y = b.labels[j];
            double p = fmin(fmax(probs[i + j], 1e-7), 1 - 1e-7);
            labels[i + j] = y;
            ll -= y > 0.5f ? log(p) : log(1 - p);
        }
    }
    if ((err = mt_model_auc(probs, labels, ntest, &res->auc)) != MT_OK) goto out;
    res->logloss = ll / (double)ntest;
    res->examples_per_s = (double)ntrain * o->epochs / train_s;
    mt_table_stats_t st;
    mt_table_stats(mt_trainer_table(tr), &st);
    res->rows = st.rows; /* one row per id: embedding and first-order weight */
out:
    mt_batch_free(&b);
    mt_trainer_destroy(tr);
    free(order);
    free(probs);
    free(labels);
    return err;
}

static void mean_std(const double *x, int n, double *mean, double *sd) {
    double s = 0, q = 0;
    for (int i = 0; i < n; i++)
        s += x[i];
    *mean = s / n;
    for (int i = 0; i < n; i++)
        q += (x[i] - *mean) * (x[i] - *mean);
    *sd = n > 1 ? sqrt(q / (n - 1)) : 0.0;
}

/* A salted bijection of 64-bit values (the splitmix64 finalizer), truncated to a fid's 48
 * bits: what hashing an id before a fixed-size table does; each salt a new hash function. */
static uint64_t mix48(uint64_t v, uint64_t salt) {
    return mt_bench_mix64(v ^ salt * MT_BENCH_GOLDEN64) & 0xFFFFFFFFFFFFull;
}

/* Replaces the values of slot index @p s by mix48() of them, in place. */
static void mix_slot(mt_batch_t *all, uint32_t s, uint64_t salt) {
    for (size_t i = 0; i < all->n; i++) {
        size_t c;
        uint64_t *f = (uint64_t *)mt_batch_fids(all, i, s, &c);
        for (size_t j = 0; j < c; j++)
            f[j] = (f[j] & 0xFFFF000000000000ull) | mix48(f[j] & 0xFFFFFFFFFFFFull, salt);
    }
}

static int usage(void) {
    fprintf(stderr, "usage: movielens_bench [--seeds N] [--epochs N] [--data DIR] "
                    "[--variant latest|100k] [--quick] [--holdout test|valid] [--dim D] "
                    "[--sparse-lr X] [--dense-lr X] [--batch B] [--order shuffle|time] "
                    "[--ids hashed|raw]\n");
    return 2;
}

int main(int argc, char **argv) {
    mt_bench_run_conditions("movielens");
    opts_t o = {.seeds = 5,
                .epochs = 1,
                .shuffle = 1,
                .mix = 1,
                .data = MT_SHARED_DATA,
                .variant = NULL,
                .dim = 8,
                .sparse_lr = 0.05f,
                .dense_lr = 0.001f,
                .batch = 256};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick"))
            o.quick = 1;
        else if (!v)
            return usage();
        else if (!strcmp(a, "--seeds"))
            o.seeds = atoi(argv[++i]);
        else if (!strcmp(a, "--epochs"))
            o.epochs = atoi(argv[++i]);
        else if (!strcmp(a, "--data"))
            o.data = argv[++i];
        else if (!strcmp(a, "--variant"))
            o.variant = argv[++i];
        else if (!strcmp(a, "--holdout"))
            o.valid = !strcmp(argv[++i], "valid");
        else if (!strcmp(a, "--dim"))
            o.dim = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(a, "--sparse-lr"))
            o.sparse_lr = strtof(argv[++i], NULL);
        else if (!strcmp(a, "--dense-lr"))
            o.dense_lr = strtof(argv[++i], NULL);
        else if (!strcmp(a, "--batch"))
            o.batch = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(a, "--ids"))
            o.mix = strcmp(argv[++i], "raw") != 0;
        else if (!strcmp(a, "--order"))
            o.shuffle = strcmp(argv[++i], "time") != 0;
        else
            return usage();
    }
    if (o.quick) {
        o.seeds = 1;
        o.epochs = 1;
    }
    if (o.seeds < 1 || o.seeds > MAX_SEEDS || o.epochs < 1 || o.batch < 1 || o.dim < 1 ||
        o.dim > 64)
        return usage();
    openblas_set_num_threads(1);

    /* Which MovieLens: latest-small (the larger) unless told or absent. */
    char ratings[4096], users[4096], items[4096];
    const char *name;
    mt_movielens_config_t mc;
    mt_movielens_config_init(&mc);
    snprintf(ratings, sizeof(ratings), "%s/movielens-latest-small/ratings.csv", o.data);
    int latest = o.variant ? !strcmp(o.variant, "latest") : exists(ratings);
    if (o.variant && !latest && strcmp(o.variant, "100k")) return usage();
    if (latest) {
        name = "ml-latest-small";
        mc.format = MT_MOVIELENS_LATEST;
        snprintf(items, sizeof(items), "%s/movielens-latest-small/movies.csv", o.data);
        mc.items_path = items;
    } else {
        name = "ml-100k";
        snprintf(ratings, sizeof(ratings), "%s/movielens-100k/u.data", o.data);
        snprintf(users, sizeof(users), "%s/movielens-100k/u.user", o.data);
        snprintf(items, sizeof(items), "%s/movielens-100k/u.item", o.data);
        mc.users_path = users;
        mc.items_path = items;
    }
    if (!exists(ratings) || !exists(items) || (mc.users_path && !exists(users))) {
        char why[4200];
        snprintf(why, sizeof(why), "no MovieLens data under %s (want %s)", o.data, ratings);
        for (char *p = why; *p; p++)
            if (*p == '"' || *p == '\\') *p = '\'';
        skip(why);
        return 0;
    }

    mt_reader_t *r = NULL;
    mt_batch_t all = {0};
    mt_err_t err = mt_reader_movielens_open(&mc, ratings, NULL, &r);
    if (!err) err = mt_reader_batch_init(r, &all);
    while (!err && (err = mt_reader_next(r, &all, 65536)) == MT_OK) {
    }
    if (err != MT_NOT_FOUND || all.n < 100) {
        fprintf(stderr, "movielens_bench: cannot read %s (%s, %zu examples)\n", ratings,
                mt_err_name(err), all.n);
        return 1;
    }
    uint64_t bad = mt_reader_stats(r)->bad_lines;
    mt_reader_destroy(r);

    size_t n = all.n, *idx = malloc(n * sizeof(size_t));
    if (!idx) return 1;
    for (size_t i = 0; i < n; i++)
        idx[i] = i;
    g_all = &all;
    qsort(idx, n, sizeof(size_t), by_time);
    if (o.quick && n > QUICK_EVENTS) n = QUICK_EVENTS;
    size_t ntrain = n * 8 / 10, ntest = n - ntrain;
    const size_t *test = idx + ntrain;
    if (o.valid) { /* tuning: the test period is not looked at */
        ntest = ntrain - ntrain * 8 / 10;
        ntrain = ntrain * 8 / 10;
        test = idx + ntrain;
    }
    double positives = 0;
    for (size_t i = 0; i < ntest; i++)
        positives += all.labels[test[i]];

    printf(
        "{\"bench\":\"movielens\",\"dataset\":\"%s\",\"events\":%zu,\"bad_lines\":%llu,"
        "\"positive\":\"rating>=4\",\"split\":\"time\",\"holdout\":\"%s\",\"train\":%zu,"
        "\"eval\":%zu,\"eval_positive_rate\":%.4f,\"ids\":\"%s\",\"target_rates\":[%.4f,%.4f]}\n",
        name, n, (unsigned long long)bad, o.valid ? "valid" : "test", ntrain, ntest,
        positives / (double)ntest, o.mix ? "hashed" : "raw", USER_RATE, ITEM_RATE);
    fflush(stdout);
    uint64_t *raw = malloc(all.nfids * sizeof(uint64_t));
    if (!raw) return 1;
    memcpy(raw, all.fids, all.nfids * sizeof(uint64_t));

    double auc[2][MAX_SEEDS], ll[2][MAX_SEEDS], eps[2][MAX_SEEDS], diff[MAX_SEEDS];
    double urate[MAX_SEEDS], irate[MAX_SEEDS];
    int wins = 0;
    slot_ids_t su = {0}, si = {0};
    for (int k = 0; k < o.seeds; k++) {
        uint64_t seed = (uint64_t)k + 1;
        /* Bucket counts at the paper's rates, on the ids of the events used, as the trainer
         * will reduce them: the raw ids, or this seed's hash of them (which must merge no
         * two ids: checked). */
        memcpy(all.fids, raw, all.nfids * sizeof(uint64_t));
        if (distinct_values(&all, idx, n, 0, &su) || distinct_values(&all, idx, n, 1, &si))
            return 1;
        if (o.mix) {
            size_t nu = su.n, ni = si.n;
            free(su.v);
            free(si.v);
            mix_slot(&all, 0, seed);
            mix_slot(&all, 1, seed);
            if (distinct_values(&all, idx, n, 0, &su) || distinct_values(&all, idx, n, 1, &si))
                return 1;
            if (su.n != nu || si.n != ni) {
                fprintf(stderr, "movielens_bench: the id hash merged ids\n");
                return 1;
            }
        }
        if (find_buckets(&su, USER_RATE) || find_buckets(&si, ITEM_RATE)) return 1;
        urate[k] = su.rate;
        irate[k] = si.rate;
        for (int mode = 0; mode < 2; mode++) {
            result_t res;
            err = run(&o, &all, idx, ntrain, test, ntest, seed, mode ? su.buckets : 0,
                      mode ? si.buckets : 0, &res);
            if (err) {
                fprintf(stderr, "movielens_bench: run failed: %s\n", mt_err_name(err));
                return 1;
            }
            auc[mode][k] = res.auc;
            ll[mode][k] = res.logloss;
            eps[mode][k] = res.examples_per_s;
            printf(
                "{\"bench\":\"movielens\",\"dataset\":\"%s\",\"mode\":\"%s\",\"seed\":%llu,"
                "\"epochs\":%d,\"dim\":%u,\"mlp\":\"64-32\",\"batch\":%zu,\"sparse_lr\":%g,"
                "\"dense_lr\":%g,\"order\":\"%s\",\"holdout\":\"%s\",\"auc\":%.4f,"
                "\"logloss\":%.4f,\"embedding_rows\":%llu,\"user_ids\":%zu,\"user_buckets\":%llu,"
                "\"user_collision_rate\":%.4f,\"item_ids\":%zu,\"item_buckets\":%llu,"
                "\"item_collision_rate\":%.4f,\"train_examples_per_s\":%.0f}\n",
                name, mode ? "hashed" : "collisionless", (unsigned long long)seed, o.epochs, o.dim,
                o.batch, (double)o.sparse_lr, (double)o.dense_lr, o.shuffle ? "shuffle" : "time",
                o.valid ? "valid" : "test", res.auc, res.logloss, (unsigned long long)res.rows,
                su.n, (unsigned long long)(mode ? su.buckets : 0), mode ? su.rate : 0.0, si.n,
                (unsigned long long)(mode ? si.buckets : 0), mode ? si.rate : 0.0,
                res.examples_per_s);
            fflush(stdout);
        }
        diff[k] = auc[0][k] - auc[1][k];
        wins += diff[k] > 0;
        free(su.v);
        free(si.v);
    }
    double m[2], sd[2], lm[2], lsd[2], em[2], esd[2], dm, dsd;
    for (int mode = 0; mode < 2; mode++) {
        mean_std(auc[mode], o.seeds, &m[mode], &sd[mode]);
        mean_std(ll[mode], o.seeds, &lm[mode], &lsd[mode]);
        mean_std(eps[mode], o.seeds, &em[mode], &esd[mode]);
    }
    mean_std(diff, o.seeds, &dm, &dsd);
    double um, usd, im, isd;
    mean_std(urate, o.seeds, &um, &usd);
    mean_std(irate, o.seeds, &im, &isd);
    printf("{\"bench\":\"movielens\",\"summary\":true,\"dataset\":\"%s\",\"holdout\":\"%s\","
           "\"seeds\":%d,\"epochs\":%d,\"auc_collisionless_mean\":%.4f,"
           "\"auc_collisionless_std\":%.4f,\"auc_hashed_mean\":%.4f,\"auc_hashed_std\":%.4f,"
           "\"auc_diff_mean\":%.4f,\"auc_diff_std\":%.4f,\"collisionless_wins\":%d,"
           "\"logloss_collisionless_mean\":%.4f,\"logloss_hashed_mean\":%.4f,"
           "\"ids\":\"%s\",\"user_collision_rate_mean\":%.4f,\"item_collision_rate_mean\":%.4f,"
           "\"train_examples_per_s\":%.0f}\n",
           name, o.valid ? "valid" : "test", o.seeds, o.epochs, m[0], sd[0], m[1], sd[1], dm, dsd,
           wins, lm[0], lm[1], o.mix ? "hashed" : "raw", um, im, (em[0] + em[1]) / 2);
    free(raw);
    free(idx);
    mt_batch_free(&all);
    return 0;
}
